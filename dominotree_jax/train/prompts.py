"""Prompt sources for drafter training data: packaged corpora and templates.

Corpora are files inside the ``evals`` wheel, read as files (the package is never imported):
OpenWebText and Wikipedia passages (``schelling_point``) turned into summarise / continue /
explain requests, and maths word problems. Templates make arithmetic and algebra questions,
small coding tasks and general chat / writing requests. Prompts the target writes itself are
in ``self_prompts``. Every prompt passes ``overlap.BenchmarkFilter`` before it is used; nothing
is read from the benchmark packages here.

A prompt is a dict ``{"source": str, "kind": "code"|"math"|"chat"|"passage", "text": str}``.
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import random


def dist_data_dir(dist: str, sub: str) -> str | None:
    try:
        d = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = str(d.locate_file(sub))
    return path if os.path.isdir(path) else None


def _read_jsonl(path: str, limit: int) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
            if len(out) >= limit:
                break
    return out


def _clip_words(text: str, max_words: int) -> str:
    words = text.split()
    return " ".join(words[:max_words])


PASSAGE_TEMPLATES = [
    "Summarize the following text in a few sentences:\n\n{p}",
    "Continue the following text:\n\n{p}",
    "Explain the main idea of this passage to a high-school student:\n\n{p}",
    "What are the key points of the following passage? Answer with a bulleted list.\n\n{p}",
    "Rewrite the following paragraph in simpler words:\n\n{p}",
    "Write three questions a reader might ask after reading this, and answer them:\n\n{p}",
    "Give this text a title and a one-paragraph summary:\n\n{p}",
    "{p}\n\nWhat is this text about?",
    "Read the passage and explain what happens next.\n\n{p}",
    "Write a short opinion about the following text:\n\n{p}",
]


def passage_prompts(rng: random.Random, limit: int) -> list[str]:
    base = dist_data_dir("evals", "evals/registry/data/schelling_point")
    if base is None:
        return []
    passages = []
    for name in ("owt_5.jsonl", "wikipedia_5.jsonl"):
        path = os.path.join(base, name)
        if not os.path.exists(path):
            continue
        for row in _read_jsonl(path, limit):
            passages += [v for v in row.values() if isinstance(v, str) and len(v.split()) > 30]
    rng.shuffle(passages)
    out = []
    for p in passages[:limit]:
        out.append(rng.choice(PASSAGE_TEMPLATES).format(p=_clip_words(p, rng.randint(40, 90))))
    return out


WORD_PROBLEM_PREFIXES = ["", "Solve step by step: ", "Solve: ", "Answer the question and show "
                         "your reasoning.\n\n", "Math problem: ", "Please solve this problem. "]


def word_problem_prompts(rng: random.Random, limit: int) -> list[str]:
    base = dist_data_dir("evals", "evals/registry/data")
    if base is None:
        return []
    out = []
    for sub in ("algebra_word_problems", "multistep-word-problems", "math_for_5th-grader",
                "linear_equations", "arithmetic-expression"):
        for path in sorted(glob.glob(os.path.join(base, sub, "*.jsonl"))):
            for row in _read_jsonl(path, 2000):
                msgs = row.get("input")
                if isinstance(msgs, list):
                    users = [m.get("content", "") for m in msgs
                             if isinstance(m, dict) and m.get("role") == "user"]
                    text = users[-1] if users else ""
                elif isinstance(msgs, str):
                    text = msgs
                else:
                    continue
                if 10 < len(text) < 700:
                    out.append(rng.choice(WORD_PROBLEM_PREFIXES) + text.strip())
    rng.shuffle(out)
    return out[:limit]


NAMES = ["Alice", "Bob", "Carlos", "Dana", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jamal",
         "Kim", "Lena", "Maya", "Noah", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tara"]
ITEMS = ["apples", "books", "marbles", "pencils", "stickers", "cookies", "cards", "coins",
         "flowers", "toy cars", "eggs", "shirts", "tickets", "bottles", "stamps"]


def competition_prompt(rng: random.Random) -> str:
    """A short competition-style maths question (LaTeX, like contest problem sets)."""
    a, b, c, d = rng.randint(2, 30), rng.randint(2, 30), rng.randint(3, 17), rng.randint(1, 9)
    questions = (
        f"Find the remainder when ${a}^{{{b}}}$ is divided by ${c}$.",
        f"How many positive divisors does ${a * b * c}$ have?",
        f"Compute $\\dbinom{{{a + c}}}{{{d}}}$.",
        f"Find the sum of the roots of $x^2 - {a + b}x + {a * b} = 0$.",
        f"Let $f(x) = {a}x^2 - {b}x + {c}$. Evaluate $f({d})$.",
        f"Find the least common multiple of ${a * d}$ and ${b * d}$.",
        f"Simplify $\\sqrt{{{a * a * c}}}$.",
        f"Find the distance between the points $({a}, {b})$ and $({c}, {d})$.",
        f"Solve for $x$: $\\frac{{x + {a}}}{{{c}}} = {b}$.",
        f"What is the sum of the first ${a + b}$ positive odd integers?",
    )
    return questions[rng.randrange(len(questions))]


def arithmetic_prompts(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        if rng.random() < 0.35:
            out.append(competition_prompt(rng))
            continue
        kind = rng.randrange(12)
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 20)
        name, name2, item = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS)
        questions = (
            f"What is {a} times {b}?",
            f"Calculate {a * c} + {b} - {c}. Show your work.",
            f"Solve for x: {c}x + {a} = {c * b + a}",
            f"{name} has {a} {item}. {name} gives {min(a, b) // 2} {item} to {name2} "
            f"and then buys {c} more. How many {item} does {name} have now?",
            f"What is {c * 5}% of {a * 10}?",
            f"A train travels {a * 3} km in {c} hours. What is its average speed? "
            "Explain step by step.",
            f"Simplify the fraction {a * c}/{b * c}.",
            f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
            f"Find the value of {a}^2 - {b}^2 and explain how you got it.",
            f"{name} saves ${c} every week. How many weeks does {name} need to save "
            f"${c * a}?",
            f"Is {a * b + 1} a prime number? Explain your reasoning.",
            f"Solve the system of equations: x + y = {a + b}, x - y = {a - b}.",
        )
        out.append(questions[kind])
    return out


CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "computes the factorial of n", "counts the vowels in a string",
    "returns the largest element of a list", "removes duplicates from a list while keeping order",
    "checks whether a string is a palindrome", "merges two sorted lists into one sorted list",
    "computes the greatest common divisor of two integers", "flattens a nested list",
    "counts how often each word appears in a text", "converts Celsius to Fahrenheit",
    "returns the sum of the digits of an integer", "sorts a list of tuples by their second item",
    "finds the second smallest number in a list", "checks whether two strings are anagrams",
    "transposes a matrix given as a list of lists", "computes the mean and median of a list",
    "returns all prime numbers below n", "implements binary search on a sorted list",
    "capitalizes the first letter of every word", "converts a decimal number to binary",
    "finds the longest word in a sentence", "rotates a list by k positions",
    "returns the intersection of two lists", "validates a simple email address",
    "computes the running sum of a list", "groups a list of words by their first letter",
    "parses a CSV line into a list of fields", "computes the dot product of two vectors",
    "returns the indices of two numbers that add up to a target", "implements bubble sort",
    "counts the number of uppercase letters in a string", "checks if a year is a leap year",
    "computes the power set of a list", "returns the n largest elements of a list",
    "converts a Roman numeral to an integer", "checks whether brackets in a string are balanced",
    "chunks a list into pieces of size n", "computes the Levenshtein distance of two strings",
    "returns the most common element of a list", "implements a simple stack class",
    "reads a text file and returns the number of lines", "computes compound interest",
    "replaces every vowel in a string with '*'", "returns the product of all odd numbers in a list",
    "finds the missing number in a list containing 1..n", "computes the area of a circle",
]
CODE_TEMPLATES = [
    "Write a Python function that {t}.",
    "Write a Python function that {t}. Include a docstring and an example.",
    "Implement a function in Python which {t}, and explain how it works.",
    "Can you write Python code that {t}?",
    "def solution(...):\n    \"\"\"Write this function: it {t}.\"\"\"\n\nComplete the function.",
    "Write a JavaScript function that {t}.",
    "Explain, with a short Python example, how to write code that {t}.",
    "Write a function `f` that {t}. Add a few test cases.",
]

TOPICS = ["photosynthesis", "the water cycle", "black holes", "inflation", "machine learning",
          "the French Revolution", "vaccines", "climate change", "the stock market",
          "recursion in programming", "the theory of evolution", "gravity", "democracy",
          "the internet", "plate tectonics", "the immune system", "blockchain", "nuclear energy",
          "the Roman Empire", "probability", "supply and demand", "DNA", "electric cars",
          "the Renaissance", "sleep", "meditation", "volcanoes", "renewable energy",
          "compound interest", "the human heart", "operating systems", "databases",
          "artificial intelligence", "the moon landing", "ocean tides", "rainbows"]
QUESTION_TEMPLATES = [
    "Explain {t} in simple terms.", "What is {t}? Give a short answer.",
    "Write a short essay about {t}.", "Give me three interesting facts about {t}.",
    "How would you explain {t} to a child?", "What are the pros and cons of {t}?",
    "Write a blog post introduction about {t}.", "Why is {t} important?",
    "Write a short poem about {t}.", "Create a quiz with three questions about {t}.",
]
ADVICE = ["How can I improve my sleep?", "Give me tips for learning a new language.",
          "How do I prepare for a job interview?", "Plan a three-day trip to Paris.",
          "Write an email to my manager asking for a day off.",
          "Suggest a healthy breakfast recipe.", "How do I start running as a beginner?",
          "Write a polite message declining an invitation.", "How can I save more money?",
          "Write a short story about a robot who learns to paint.",
          "What should I consider when buying a laptop?", "Help me write a birthday card.",
          "Describe a sunset at the beach.", "Write a product description for a water bottle.",
          "Give me ideas for a science fair project.", "How do I make a good first impression?"]


LANGUAGES = ["Python", "JavaScript", "TypeScript", "Java", "C", "C++", "Go", "Rust", "Ruby",
             "Bash"]
LANGUAGE_TEMPLATES = [
    "Write a {lang} function that {t}.",
    "How do I write {lang} code that {t}?",
    "Show me a {lang} program that {t}, with comments.",
]
STUB_ARGS = ["data", "items", "s", "n", "values", "text", "nums, k", "a, b"]


def code_stub(task: str, rng: random.Random) -> str:
    """A Python stub to complete: a made-up function name, arguments and a docstring."""
    verb, *rest = task.split()
    name = "_".join(w.strip("'.,") for w in [verb.rstrip("s")] + rest[:3]
                    if w.strip("'.,").isidentifier()).lower() or "solve"
    doc = task[0].upper() + task[1:]
    return (f"Complete this Python function:\n```python\ndef {name}({rng.choice(STUB_ARGS)}):\n"
            f'    """{doc}."""\n```')


def code_prompts(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        t, r = rng.choice(CODE_TASKS), rng.random()
        if r < 0.35:
            out.append(rng.choice(CODE_TEMPLATES).format(t=t))
        elif r < 0.7:
            out.append(rng.choice(LANGUAGE_TEMPLATES).format(lang=rng.choice(LANGUAGES), t=t))
        else:
            out.append(code_stub(t, rng))
    return out


def general_prompts(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        if rng.random() < 0.7:
            out.append(rng.choice(QUESTION_TEMPLATES).format(t=rng.choice(TOPICS)))
        else:
            out.append(rng.choice(ADVICE))
    return out


def build_prompts(num: int, seed: int) -> list[dict]:
    """``num`` distinct prompts, shuffled: ~30% code, ~30% maths, ~25% passage tasks, the rest
    general chat and writing. The same ``(num, seed)`` always gives the same list."""
    rng = random.Random(seed)
    n_code, n_math, n_pass = int(0.3 * num), int(0.3 * num), int(0.25 * num)
    wp = word_problem_prompts(rng, n_math // 2)
    items = ([("template:code", "code", p) for p in code_prompts(rng, n_code)]
             + [("evals:word_problems", "math", p) for p in wp]
             + [("template:math", "math", p) for p in arithmetic_prompts(rng, n_math - len(wp))]
             + [("evals:passages", "passage", p) for p in passage_prompts(rng, n_pass)])
    items += [("template:chat", "chat", p) for p in general_prompts(rng, num - len(items))]
    rng.shuffle(items)
    seen, out = set(), []
    for s, k, t in items:
        if t not in seen:
            seen.add(t)
            out.append({"source": s, "kind": k, "text": t})
    return out
