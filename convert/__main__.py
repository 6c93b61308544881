"""Command line: ``python -m convert {inspect,target,drafter} ...``.

    python -m convert inspect PATH [--target T] [--tokens N] [--batch B] [--precision P]
        # layout recognised, settings inferred, abstract shapes and decode memory
    python -m convert target SRC OUT [--precision P]   # HF dir or .gguf → orbax directory
    python -m convert drafter SRC OUT [--precision P]  # DFlash/Domino dir → orbax directory

``--precision`` (alias ``--dtype``): float32, bfloat16 or float16 (docs/precision.md).

An orbax directory loads back with ``dominotree_jax.load_target(OUT)`` /
``dominotree_jax.load_pair(OUT_TARGET, OUT_DRAFTER)``.
"""

from __future__ import annotations

import argparse
import sys

import jax

from convert.drafter import load_drafter
from convert.errors import CheckpointError
from convert.inspect_checkpoint import inspect
from convert.orbax_io import save_params
from convert.target import load_target_checkpoint
from dominotree_jax.precision import add_precision_argument


def _summary(cfg, params) -> str:
    leaves = jax.tree.leaves(params)
    n = sum(x.size for x in leaves)
    return f"{cfg}\n{len(leaves)} tensors, {n / 1e6:.1f}M parameters, dtype {leaves[0].dtype}"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m convert", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("inspect", help="layout, inferred settings, shapes and decode memory")
    p.add_argument("path")
    p.add_argument("--target", help="target checkpoint a drafter is checked against")
    p.add_argument("--tokens", type=int, default=4096, help="cache rows of the decode sized")
    p.add_argument("--batch", type=int, default=1)
    add_precision_argument(p, default="bfloat16", pairs=False,
                           help="the weights' precision the decode memory is sized in")
    for name in ("target", "drafter"):
        p = sub.add_parser(name, help=f"convert a {name} checkpoint to an orbax directory")
        p.add_argument("src")
        p.add_argument("out")
        add_precision_argument(p, pairs=False, help="the precision the weights are saved in")
    return ap


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    name = args.precision.target   # one model's precision (pairs=False)
    try:
        if args.cmd == "inspect":
            print(inspect(args.path, target_path=args.target, tokens=args.tokens,
                          batch=args.batch, dtype=name))
        elif args.cmd == "target":
            cfg, params, tokenizer_source = load_target_checkpoint(args.src, name)
            save_params(args.out, "target", cfg, params, tokenizer_source=tokenizer_source)
            print(_summary(cfg, params), f"\nsaved to {args.out}")
        else:
            cfg, params = load_drafter(args.src, dtype=name)
            save_params(args.out, "drafter", cfg, params)
            print(_summary(cfg, params), f"\nsaved to {args.out}")
    except (CheckpointError, ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
