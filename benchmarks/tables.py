"""The docs' measured tables, rendered from the results files so that they cannot drift.

    python -m benchmarks tables            # rewrite each table between its markers
    python -m benchmarks tables --check    # exit 1 (naming the tables) where a doc differs

A table sits in a doc between ``<!-- table:NAME -->`` and ``<!-- /table -->``; ``TABLES`` says
which results file(s) each is rendered from. Two kinds of file: ``bench.json`` of ``methods
bench`` (its ``cells``, one column per method) and the JSON of ``methods bf16_host --json`` (one
row per run, each cell × the reference run's tokens/s, and τ). Each table opens with the
command, machine and date its file records. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from benchmarks.common import RESULTS, ROOT

SETS = {"humaneval": "HumanEval", "mtbench": "MT-Bench", "math500": "MATH500",
        "copyedit": "copy-edit"}

# name -> (doc it sits in, kind of results file, results files relative to results/)
TABLES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "readme": ("README.md", "host", ("lookup/bf16_host_zen4.json",
                                     "lookup/bf16_host_zen4_copyedit.json")),
    "methods_v5": ("docs/results.md", "bench", ("drafter_v5/decoded_v5.json",)),
    "lookup": ("docs/results.md", "bench", ("lookup/bench.json",)),
}


def _read(rel: str) -> dict:
    with open(RESULTS / rel, encoding="utf-8") as f:
        return json.load(f)


def _source_line(rel: str, command: str, machine: str, date: str) -> str:
    return f"`{command}` — {machine}, {date} ([data](benchmarks/results/{rel}))"


def bench_table(rels: tuple[str, ...]) -> list[str]:
    """Rows: datasets; columns: methods; cells ``τ / tok/s / × ar``."""
    (rel,) = rels
    result = _read(rel)
    cells = result["cells"]
    methods = list(dict.fromkeys(c["method"] for c in cells))
    sets = list(dict.fromkeys(c["dataset"] for c in cells))
    by = {(c["dataset"], c["method"]): c for c in cells}
    machine = result["machine"]
    lines = [_source_line(rel, result["command"], machine["summary"], machine["date"]), "",
             "| set | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for s in sets:
        row = [f"{by[s, m]['tau']:.2f} / {by[s, m]['tok_s']:.1f} / {by[s, m]['speedup']:.2f}×"
               if (s, m) in by else "–" for m in methods]
        lines.append(f"| {SETS.get(s, s)} | " + " | ".join(row) + " |")
    return lines


def host_table(rels: tuple[str, ...]) -> list[str]:
    """Rows: runs; columns: the sets of every file; cells ``× reference (τ)``, the reference's
    own cells its tokens/s."""
    files = [_read(rel) for rel in rels]
    runs = [r for r in files[0]["runs"] if r not in HOST_RUNS_LEFT_OUT]
    first = files[0]
    if any(list(f["runs"]) != list(first["runs"]) or f["reference"] != first["reference"]
           for f in files):
        raise ValueError(f"{', '.join(rels)}: the files do not hold the same runs")
    columns = [(f, s) for f in files for s in next(iter(f["runs"].values()))]
    lines = [_source_line(rel, f["command"], f["machine"], f["date"]) + ";"
             for rel, f in zip(rels, files)]
    lines[-1] = lines[-1][:-1]
    lines += ["", "| run | " + " | ".join(SETS.get(s, s) for _, s in columns) + " |",
              "|---|" + "---:|" * len(columns)]
    for run in runs:
        row = []
        for f, s in columns:
            cell, ref = f["runs"][run][s], f["runs"][f["reference"]][s]
            x = cell["tok_s"] / ref["tok_s"]
            row.append(f"{x:.2f}× ({cell['tok_s']:.1f} tok/s)" if run == f["reference"]
                       else f"{x:.2f}× (τ {cell['tau']:.2f})")
        lines.append(f"| {run} | " + " | ".join(row) + " |")
    return lines


HOST_RUNS_LEFT_OUT = ("float32 dominotree+lookup auto", "bf16 lookup, budget 16")  # README size

RENDER = {"bench": bench_table, "host": host_table}


def render(name: str) -> str:
    doc, kind, rels = TABLES[name]
    lines = RENDER[kind](rels)
    if doc.startswith("docs/"):   # links relative to the doc
        lines = [line.replace("](benchmarks/", "](../benchmarks/") for line in lines]
    return "\n".join(lines)


def _block(name: str, doc: str, text: str) -> re.Match:
    """The ``<!-- table:NAME -->`` ... ``<!-- /table -->`` block of ``doc``; group 1: the
    table."""
    found = re.search(rf"<!-- table:{name} -->\n(.*?)\n?<!-- /table -->", text, re.S)
    if found is None:
        raise ValueError(f"{doc} has no <!-- table:{name} --> ... <!-- /table --> block")
    return found


def updated_docs() -> dict[str, tuple[str, str]]:
    """``{doc: (committed text, text with every table rendered afresh)}``."""
    docs: dict[str, tuple[str, str]] = {}
    for name, (doc, _, _) in TABLES.items():
        old, new = docs.get(doc) or ((ROOT / doc).read_text(encoding="utf-8"),) * 2
        found = _block(name, doc, new)
        block = f"<!-- table:{name} -->\n{render(name)}\n<!-- /table -->"
        docs[doc] = (old, new[:found.start()] + block + new[found.end():])
    return docs


def stale_tables() -> list[str]:
    """Names of the tables whose doc differs from what the results files render."""
    stale = []
    for name, (doc, _, _) in TABLES.items():
        text = (ROOT / doc).read_text(encoding="utf-8")
        if _block(name, doc, text)[1] != render(name):
            stale.append(name)
    return stale


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks tables",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare; change nothing")
    args = ap.parse_args(argv)
    if args.check:
        stale = stale_tables()
        if stale:
            print(f"stale tables: {', '.join(stale)} (run python -m benchmarks tables)",
                  file=sys.stderr)
        return 1 if stale else 0
    for doc, (old, new) in updated_docs().items():
        if new != old:
            (ROOT / doc).write_text(new, encoding="utf-8")
            print(f"rewrote {doc}")
    return 0
