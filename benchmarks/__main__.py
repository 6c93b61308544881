"""The one entry point of the benchmarks, run from the repository root:

    python -m benchmarks                      # the groups and their benchmarks
    python -m benchmarks GROUP                # GROUP's benchmarks, one line each
    python -m benchmarks GROUP NAME --help    # what NAME measures, and its options
    python -m benchmarks GROUP NAME [ARGS]    # runs benchmarks/GROUP/NAME.py's main(ARGS)
    python -m benchmarks tables [--check]     # the docs' tables from results/ (tables.py)

The table of entry points is ``benchmarks.common.GROUPS``.
"""

from __future__ import annotations

import importlib
import sys

from benchmarks.common import GROUPS

USAGE = ("usage: python -m benchmarks GROUP NAME [ARGS]   (NAME --help: what it measures)\n"
         "       python -m benchmarks tables [--check]   (the docs' tables from results/)")


def listing(group: str | None = None) -> str:
    """Every group (with its benchmarks' names), or one group's benchmarks one line each."""
    if group is None:
        lines = [USAGE, ""]
        for g, (what, names) in GROUPS.items():
            lines += [f"{g:<8} {what}", f"{'':<8}   {', '.join(names)}"]
        return "\n".join(lines)
    what, names = GROUPS[group]
    width = max(map(len, names))
    return "\n".join([f"python -m benchmarks {group} NAME [ARGS]: {what}", ""]
                     + [f"  {n:<{width}}  {line}" for n, line in names.items()])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(listing())
        return 0
    group = argv[0]
    if group == "tables":
        from benchmarks import tables
        return tables.main(argv[1:])
    if group not in GROUPS:
        print(f"unknown group {group!r}\n\n{listing()}", file=sys.stderr)
        return 2
    if len(argv) == 1 or argv[1] in ("-h", "--help"):
        print(listing(group))
        return 0
    name = argv[1].replace("-", "_")
    if name not in GROUPS[group][1]:
        print(f"unknown benchmark {argv[1]!r} in {group!r}\n\n{listing(group)}",
              file=sys.stderr)
        return 2
    module = importlib.import_module(f"benchmarks.{group}.{name}")
    sys.argv = [f"python -m benchmarks {group} {name}"] + argv[2:]  # argparse's prog
    code = module.main(argv[2:])
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
