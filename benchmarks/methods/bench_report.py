"""Benchmark outputs: per-cell summary, ``bench.json`` and ``bench.md``.

A cell is (dataset, temperature, method), aggregated over its prompts; a method label is the
method at the fixed ``--budget`` or ``<method>/auto`` (``budget="auto"``):
- ``tau``: mean accepted tokens per round, bonus included (sum of per-round τ over all rounds of
  all prompts / number of rounds; the prefill's first token is not a round);
- ``tok_s``: generated tokens / wall seconds, both summed over the prompts;
- ``speedup``: ``tok_s`` over ``ar``'s ``tok_s`` in the same dataset and temperature;
- ``mismatches``: prompts whose tokens differ from ``ar``'s (temperature 0 only, else None);
- ``sizes``: how many rounds verified each number of draft nodes (auto mode's choices).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import numpy as np


def summarize(records: list[dict]) -> list[dict]:
    """One summary dict per (dataset, temperature, method), in first-seen order."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[r["dataset"], r["temperature"], r["method"]].append(r)
    cells = []
    for (dataset, temp, method), rs in groups.items():
        rounds = sum(r["num_rounds"] for r in rs)
        tokens = sum(r["num_tokens"] for r in rs)
        wall = sum(r["wall_s"] for r in rs)
        cells.append({
            "dataset": dataset, "temperature": temp, "method": method, "prompts": len(rs),
            "tokens": tokens, "rounds": rounds, "wall_s": wall,
            "tau": sum(sum(r["taus"]) for r in rs) / rounds if rounds else float("nan"),
            "tok_s": tokens / wall if wall > 0 else float("nan"),
            "mismatches": (sum(r["mismatch"] is not None for r in rs) if temp == 0 else None),
            "sizes": size_histogram(r.get("sizes", []) for r in rs),
        })
    ar = {(c["dataset"], c["temperature"]): c["tok_s"] for c in cells if c["method"] == "ar"}
    for c in cells:
        ref = ar.get((c["dataset"], c["temperature"]))
        c["speedup"] = c["tok_s"] / ref if ref else float("nan")
    return cells


def size_histogram(size_lists) -> dict[str, int]:
    """``{draft nodes verified: rounds}`` over all rounds (keys as strings: JSON)."""
    counts: dict[int, int] = defaultdict(int)
    for sizes in size_lists:
        for n in sizes:
            counts[int(n)] += 1
    return {str(n): counts[n] for n in sorted(counts)}


def _strict(x):
    """NaN / inf → None, recursively (strict JSON)."""
    if isinstance(x, float) and not np.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    return x


def write_json(result: dict, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_strict(result), f, indent=1, allow_nan=False)
        f.write("\n")


def markdown(result: dict) -> str:
    """A table: rows dataset/temperature, one column per method (τ / tok/s / speedup)."""
    cells = result["cells"]
    s = result["settings"]
    methods = list(dict.fromkeys(c["method"] for c in cells))
    rows = list(dict.fromkeys((c["dataset"], c["temperature"]) for c in cells))
    by = {(c["dataset"], c["temperature"], c["method"]): c for c in cells}
    total_mm = len(result["mismatches"])
    lines = ["# Speculative decoding benchmark", ""]
    if total_mm:
        lines += [f"**WARNING: {total_mm} temperature-0 output(s) differ from `ar`** "
                  "(see the mismatch list below).", ""]
    lines += [f"- command: `{result['command']}`",
              f"- target: `{s['target']}`; drafter: `{s['drafter']}`",
              f"- methods {', '.join(s['methods'])}; {s['num_prompts']} prompt(s) per dataset; "
              f"max_new_tokens {s['max_new_tokens']}; budget {s['budget']} (and `auto`: "
              f"{'yes' if s.get('auto') else 'no'}), k {s['node_topk']}, "
              f"M {s['top_m']}; batch 1; seed {s['seed']}",
              f"- machine: {result['machine'].get('summary', '')}",
              f"- total wall time {result.get('total_s', float('nan')):.0f} s "
              f"(compiles {sum(c['compile_s'] for c in result['compiles']):.0f} s, untimed "
              f"warm-up runs {sum(c.get('warmup_s', 0) for c in result['compiles']):.0f} s)",
              "",
              "Cells: τ (mean accepted per round incl. bonus) / tokens per second / speedup "
              "over `ar`.", ""]
    head = ["dataset", "T"] + methods + ["T=0 mismatches"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for dataset, temp in rows:
        row = [dataset, f"{temp:g}"]
        mm = 0
        for m in methods:
            c = by.get((dataset, temp, m))
            if c is None:
                row.append("–")
                continue
            row.append(f"{c['tau']:.2f} / {c['tok_s']:.1f} / {c['speedup']:.2f}×")
            mm += c["mismatches"] or 0
        row.append("–" if temp != 0 else (f"**{mm}**" if mm else "0"))
        lines.append("| " + " | ".join(row) + " |")
    auto = [c for c in cells if c["method"].endswith("/auto") and c.get("sizes")]
    if auto:
        lines += ["", "Draft sizes chosen by `budget=\"auto\"` (nodes verified per round: share "
                  "of rounds; 0 = a plain AR step):", "",
                  "| dataset | T | method | sizes |", "|---|---|---|---|"]
        for c in auto:
            total = sum(c["sizes"].values())
            hist = ", ".join(f"{n}: {100 * k / total:.0f}%" for n, k in c["sizes"].items())
            lines.append(f"| {c['dataset']} | {c['temperature']:g} | {c['method']} | {hist} |")
    if total_mm:
        lines += ["", "## Mismatches at temperature 0", ""]
        for m in result["mismatches"]:
            lines.append(f"- {m['dataset']} prompt {m['prompt']}, {m['method']}: first "
                         f"difference at token {m['first_diff']} (ar {m['ref_token']}, "
                         f"{m['method']} {m['token']}; lengths {m['ref_len']} vs {m['len']})")
    return "\n".join(lines) + "\n"


def write_all(result: dict, out_dir: str) -> dict[str, str]:
    """Write ``bench.json`` and ``bench.md``; return their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {name: os.path.join(out_dir, name) for name in ("bench.json", "bench.md")}
    write_json(result, paths["bench.json"])
    with open(paths["bench.md"], "w", encoding="utf-8") as f:
        f.write(markdown(result))
    return paths
