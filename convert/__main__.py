"""Command line: ``python -m convert {inspect,target,drafter} ...``.

    python -m convert inspect PATH                 # config and tensor summary of a checkpoint
    python -m convert target SRC OUT [--dtype D]   # HF dir or .gguf → orbax directory
    python -m convert drafter SRC OUT [--dtype D]  # DFlash/Domino dir → orbax directory

An orbax directory loads back with ``dominotree_jax.load_target(OUT)`` /
``dominotree_jax.load_pair(OUT_TARGET, OUT_DRAFTER)``.
"""

from __future__ import annotations

import argparse
import sys

import jax


def _summary(cfg, params) -> str:
    leaves = jax.tree.leaves(params)
    n = sum(x.size for x in leaves)
    return f"{cfg}\n{len(leaves)} tensors, {n / 1e6:.1f}M parameters, dtype {leaves[0].dtype}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m convert", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("inspect", help="print a checkpoint's config and tensor summary")
    p.add_argument("path")
    for name in ("target", "drafter"):
        p = sub.add_parser(name, help=f"convert a {name} checkpoint to an orbax directory")
        p.add_argument("src")
        p.add_argument("out")
        p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = ap.parse_args(argv)

    from convert.errors import CheckpointError
    from convert.orbax_io import save_params
    try:
        if args.cmd == "inspect":
            import os
            if os.path.isfile(os.path.join(args.path, "config.json")):
                import json
                with open(os.path.join(args.path, "config.json")) as f:
                    is_drafter = "block_size" in json.load(f)
            else:
                is_drafter = False
            if is_drafter:
                from convert.drafter import load_drafter
                cfg, params = load_drafter(args.path)
            else:
                from dominotree_jax.api import load_target
                t = load_target(args.path, tokenizer=False)
                cfg, params = t.config, t.params
            print(_summary(cfg, params))
        elif args.cmd == "target":
            from dominotree_jax.api import load_target
            t = load_target(args.src, dtype=args.dtype, tokenizer=False)
            save_params(args.out, "target", t.config, t.params, tokenizer_source=args.src)
            print(_summary(t.config, t.params), f"\nsaved to {args.out}")
        else:
            from convert.drafter import load_drafter
            cfg, params = load_drafter(args.src, dtype=args.dtype)
            save_params(args.out, "drafter", cfg, params)
            print(_summary(cfg, params), f"\nsaved to {args.out}")
    except (CheckpointError, ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
