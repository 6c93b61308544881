"""Command line: ``python -m convert {inspect,target,drafter} ...``.

    python -m convert inspect PATH [--target T] [--tokens N] [--batch B] [--dtype D]
        # layout recognised, settings inferred, abstract shapes and decode memory
    python -m convert target SRC OUT [--dtype D]   # HF dir or .gguf → orbax directory
    python -m convert drafter SRC OUT [--dtype D]  # DFlash/Domino dir → orbax directory

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

DTYPES = ["float32", "bfloat16", "float16"]


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
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    for name in ("target", "drafter"):
        p = sub.add_parser(name, help=f"convert a {name} checkpoint to an orbax directory")
        p.add_argument("src")
        p.add_argument("out")
        p.add_argument("--dtype", default="float32", choices=DTYPES)
    return ap


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "inspect":
            print(inspect(args.path, target_path=args.target, tokens=args.tokens,
                          batch=args.batch, dtype=args.dtype))
        elif args.cmd == "target":
            cfg, params, tokenizer_source = load_target_checkpoint(args.src, args.dtype)
            save_params(args.out, "target", cfg, params, tokenizer_source=tokenizer_source)
            print(_summary(cfg, params), f"\nsaved to {args.out}")
        else:
            cfg, params = load_drafter(args.src, dtype=args.dtype)
            save_params(args.out, "drafter", cfg, params)
            print(_summary(cfg, params), f"\nsaved to {args.out}")
    except (CheckpointError, ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
