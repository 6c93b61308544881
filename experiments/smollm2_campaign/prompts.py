"""The SmolLM2 drafter's prompt recipes: packaged corpora and templates (v3 and v4 mixes).

Corpora are files inside the ``evals`` wheel, read as files (the package is never imported):
OpenWebText and Wikipedia passages (``schelling_point``) turned into summarise / continue /
explain requests, and maths word problems. Templates make arithmetic and algebra questions,
small coding tasks and general chat / writing requests. Prompts the target writes itself are
in ``dominotree_jax.train.data.self_prompts``. Every prompt passes ``overlap.BenchmarkFilter``
before it is used; nothing is read from the benchmark packages here.

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
    return shuffled_unique(rng, items)


# ---------------------------------------------------------------------------- v4 mix
# More kinds of request, all self-written templates (the ``evals`` corpora are not installed
# everywhere): extraction from made-up records, multi-step word problems, debugging / SQL /
# regex / code-explanation tasks, writing tasks with explicit lengths, and chat. Follow-up
# turns on the target's own earlier answers (multi-turn) are built by ``collect``.

CITIES = ["Lisbon", "Nairobi", "Osaka", "Toronto", "Lima", "Oslo", "Hanoi", "Cairo", "Denver",
          "Krakow", "Perth", "Bogota", "Seville", "Tbilisi", "Accra", "Montreal"]
COMPANIES = ["Northwind", "Bluepeak", "Orbitex", "Greenleaf", "Quantix", "Riverstone",
             "Solaris", "Hexagon Labs", "Brightpath", "Ironwood"]
PRODUCTS = ["desk lamp", "backpack", "coffee grinder", "bike helmet", "wireless mouse",
            "rain jacket", "water filter", "notebook", "phone stand", "yoga mat"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]


def _record(rng: random.Random) -> str:
    """A short made-up business text with names, places, dates and amounts."""
    n1, n2 = rng.sample(NAMES, 2)
    c, city, prod = rng.choice(COMPANIES), rng.choice(CITIES), rng.choice(PRODUCTS)
    day, month, year = rng.randint(1, 28), rng.choice(MONTHS), rng.randint(2015, 2025)
    qty, price = rng.randint(2, 400), rng.randint(5, 900)
    forms = (
        f"On {month} {day}, {year}, {n1} from {c} ordered {qty} units of the {prod} at "
        f"${price} each, to be shipped to the {city} office. {n2} approved the order two days "
        "later and asked for delivery before the end of the month.",
        f"Meeting notes ({month} {day}): {n1} and {n2} met in {city} to discuss the {prod} "
        f"launch. Budget: ${price * 100}. Target: {qty} pre-orders by {rng.choice(MONTHS)}. "
        f"Next step: {n2} sends the draft contract to {c}.",
        f"Dear {n1}, thank you for your message of {day} {month}. We confirm your booking of "
        f"{rng.randint(1, 9)} rooms in {city} for {qty} guests. The total is ${price * 3}. "
        f"Kind regards, {n2}, {c}",
    )
    return forms[rng.randrange(len(forms))]


EXTRACTION_TEMPLATES = [
    "Extract every person, organisation, place, date and amount from the text below. Answer "
    "as JSON with those five keys.\n\n{r}",
    "From the following text, list the people mentioned and what each of them did.\n\n{r}",
    "Read the text and fill in this table in Markdown: | who | what | when | where |\n\n{r}",
    "What is the total amount of money mentioned in this text? Quote the sentence it comes "
    "from.\n\n{r}",
    "Turn this text into a YAML record with fields name, company, city, date, quantity.\n\n{r}",
    "Summarise the text below in one sentence, then list its dates.\n\n{r}",
]


def extraction_prompts(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(EXTRACTION_TEMPLATES).format(r=_record(rng)) for _ in range(n)]


def story_problem(rng: random.Random) -> str:
    """A multi-step word problem (several quantities, two or three operations)."""
    name, name2 = rng.sample(NAMES, 2)
    item, city = rng.choice(ITEMS), rng.choice(CITIES)
    a, b, c, d = rng.randint(3, 60), rng.randint(2, 12), rng.randint(2, 9), rng.randint(5, 95)
    forms = (
        f"{name} buys {b} boxes of {item} with {a} {item} in each box. {name} gives {c} {item} "
        f"to each of {b} friends and sells the rest for ${c} each. How much money does {name} "
        "make?",
        f"A bakery in {city} makes {a * 4} muffins in the morning and {a * 2} in the afternoon. "
        f"It sells {d}% of them and gives away {c} more. How many muffins are left?",
        f"{name} runs {b + c} km on Monday, twice as far on Tuesday and {c} km less than "
        f"Tuesday on Wednesday. How far does {name} run in the three days?",
        f"{name} and {name2} share ${a * 10} in the ratio {b}:{c}. {name2} then spends a "
        f"quarter of their share. How much does {name2} have left?",
        f"A shop sells a {rng.choice(PRODUCTS)} for ${a + 20}. During a sale the price drops by "
        f"{d % 50 + 5}%, and {name} pays with a ${(a + 20) * 2} note. How much change does "
        f"{name} get?",
        f"A tank holds {a * 10} litres. It loses {b} litres per hour and is refilled with {c} "
        f"litres every {b + 1} hours. How much water is in it after {c * 3} hours?",
    )
    return forms[rng.randrange(len(forms))]


BUGGY_CODE = [
    ("def average(xs):\n    return sum(xs) / len(xs) + 1", "returns the wrong average"),
    ("def last(xs):\n    return xs[len(xs)]", "raises an IndexError"),
    ("def is_even(n):\n    return n % 2 == 1", "gives the wrong answer"),
    ("def count(s, ch):\n    n = 0\n    for c in s:\n        if c == ch:\n            n =+ 1\n"
     "    return n", "always returns 0 or 1"),
    ("def fact(n):\n    return n * fact(n - 1)", "never stops"),
    ("for i in range(10):\nprint(i)", "does not run"),
    ("def add_item(item, items=[]):\n    items.append(item)\n    return items",
     "keeps items from earlier calls"),
    ("def reverse(s):\n    out = ''\n    for c in s:\n        out = out + c\n    return out",
     "does not reverse the string"),
]
SQL_TASKS = ["the ten customers with the highest total order value",
             "the number of orders per month in 2023", "products that were never ordered",
             "the average salary per department, highest first",
             "employees who earn more than their manager", "duplicate email addresses"]
REGEX_TASKS = ["a date like 2024-03-17", "a US phone number", "an email address",
               "a hexadecimal colour such as #1a2b3c", "a time in 24-hour format",
               "a word that starts and ends with the same letter"]


def code_prompts_v4(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.25:
            src, what = rng.choice(BUGGY_CODE)
            out.append(f"This Python code {what}. Find the bug and fix it:\n```python\n{src}\n```")
        elif r < 0.4:
            out.append(f"Write an SQL query that finds {rng.choice(SQL_TASKS)}. Assume tables "
                       "customers, orders, products and employees; state the columns you use.")
        elif r < 0.5:
            out.append(f"Write a regular expression that matches {rng.choice(REGEX_TASKS)}, "
                       "and explain each part of it.")
        elif r < 0.65:
            src, _ = rng.choice(BUGGY_CODE)
            out.append(f"Explain line by line what this code is meant to do:\n```python\n{src}\n"
                       "```")
        else:
            out += code_prompts(rng, 1)
    return out


WRITING_TASKS = ["a cover letter for a junior developer position", "a short mystery story",
                 "a speech for a friend's wedding", "a review of a restaurant in {city}",
                 "a travel guide for a weekend in {city}", "a product announcement for the {p}",
                 "a complaint letter about a broken {p}", "a motivational message for a team",
                 "a dialogue between a teacher and a student about homework",
                 "a news report about a festival in {city}", "a fairy tale about a clever fox",
                 "a LinkedIn post about finishing a marathon", "an FAQ for the {p}"]
LENGTHS = ["in about 100 words", "in about 200 words", "in about 300 words", "in 3 paragraphs",
           "in 5 bullet points", "in one paragraph", "in detail", "briefly"]
CHAT = ["Hi! Can you help me plan my week?", "I feel nervous before exams. Any advice?",
        "What's a good name for a grey kitten?", "Tell me a joke about computers.",
        "What should I cook tonight with rice, eggs and spinach?",
        "Can you recommend three classic novels and say why?",
        "I want to learn to draw. Where do I start?",
        "How do I politely tell a coworker they talk too loudly?",
        "Explain the difference between weather and climate.",
        "Give me a 20-minute workout I can do at home.",
        "My plant's leaves are turning yellow. What could be wrong?",
        "What are some good questions to ask at the end of an interview?"]


def writing_prompts(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        task = rng.choice(WRITING_TASKS).format(city=rng.choice(CITIES),
                                                p=rng.choice(PRODUCTS))
        out.append(f"Write {task} {rng.choice(LENGTHS)}.")
    return out


def chat_prompts(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        r = rng.random()
        out.append(rng.choice(CHAT) if r < 0.4 else general_prompts(rng, 1)[0])
    return out


FOLLOW_UPS = ["Can you make that shorter?", "Explain the second point in more detail.",
              "Can you give a concrete example?", "Now summarise your answer in one sentence.",
              "Are you sure? Please check your answer step by step.",
              "Rewrite your answer for a ten-year-old.", "What would be a good next step?",
              "Can you turn that into a numbered list?", "Thanks! What are common mistakes "
              "people make with this?", "Please add a short conclusion."]

MIXES = ("v3", "v4")
# Shares of the v4 mix (the rest: chat); multi-turn follow-ups come on top (collect).
V4_SHARES = (("code", 0.22), ("math", 0.25), ("extraction", 0.13), ("writing", 0.15))


def build_prompts_v4(num: int, seed: int) -> list[dict]:
    """``num`` distinct v4 prompts, shuffled: ~22% code (incl. debugging, SQL, regex), ~25%
    maths (multi-step word problems and the v3 templates), ~13% extraction, ~15% writing with
    explicit lengths, the rest chat. Deterministic in ``(num, seed)``."""
    rng = random.Random(seed)
    n = {k: int(f * num) for k, f in V4_SHARES}
    math = [story_problem(rng) for _ in range(n["math"] // 2)]
    math += arithmetic_prompts(rng, n["math"] - len(math))
    items = ([("template:code4", "code", p) for p in code_prompts_v4(rng, n["code"])]
             + [("template:math4", "math", p) for p in math]
             + [("template:extract", "extraction", p) for p in extraction_prompts(
                 rng, n["extraction"])]
             + [("template:writing", "writing", p) for p in writing_prompts(rng, n["writing"])])
    items += [("template:chat4", "chat", p) for p in chat_prompts(rng, num - len(items))]
    return shuffled_unique(rng, items)


def shuffled_unique(rng, items) -> list[dict]:
    """``(source, kind, text)`` items shuffled by ``rng``, each text once, as prompt records."""
    rng.shuffle(items)
    seen, out = set(), []
    for source, kind, text in items:
        if text not in seen:
            seen.add(text)
            out.append({"source": source, "kind": kind, "text": text})
    return out
