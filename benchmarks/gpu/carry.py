"""Move a file larger than one device call takes, in parts: a call carries the working tree
plus named paths, 64 MiB in all (the tree is ~45 MB), and returns files of at most 16 MiB each.
The SmolLM2 GGUF (93.8 MiB) goes up in parts over consecutive calls on one warm machine, and
an exported drafter (~30 MB) comes back in parts. Every part is checked against the manifest
(sizes and the whole file's SHA-256) before anything is joined.

    python -m benchmarks gpu carry split FILE --out DIR [--part-mib 19]  # manifest + parts
    python -m benchmarks gpu carry join DIR --out FILE                   # checked reassembly
    python -m benchmarks gpu carry stage DIR --to CARRY                  # CARRY/pK: part K

``stage`` gives every part its own folder ``CARRY/pK`` (CARRY must be git-ignored): call ``K``
carries ``CARRY/pK`` alone and copies it to the device's ``/tmp``, where the later calls find it
while the machine stays warm; nothing has to change here between the calls.
``benchmarks/gpu_train_run.sh`` joins the target there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

MANIFEST = "manifest.json"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def split(path: Path, out: Path, part_bytes: int) -> dict:
    """Write ``out/<name>.partKK`` of at most ``part_bytes`` each and ``out/manifest.json``."""
    if part_bytes < 1:
        raise ValueError(f"part size must be positive, got {part_bytes}")
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    with open(path, "rb") as f:
        while block := f.read(part_bytes):
            name = f"{path.name}.part{len(parts):02d}"
            (out / name).write_bytes(block)
            parts.append({"name": name, "size": len(block)})
    manifest = {"name": path.name, "size": path.stat().st_size, "sha256": sha256(path),
                "parts": parts}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def join(folder: Path, out: Path) -> Path:
    """Reassemble the file the manifest in ``folder`` names into ``out``; every part must be
    there with its size, and the result must have the manifest's size and SHA-256."""
    manifest = json.loads((folder / MANIFEST).read_text())
    missing = [p["name"] for p in manifest["parts"] if not (folder / p["name"]).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder}: {len(missing)} of {len(manifest['parts'])} parts of "
                                f"{manifest['name']} missing: {', '.join(missing)}")
    for p in manifest["parts"]:
        size = (folder / p["name"]).stat().st_size
        if size != p["size"]:
            raise ValueError(f"{folder / p['name']}: {size} bytes, the manifest says {p['size']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".joining")
    with open(tmp, "wb") as dst:
        for p in manifest["parts"]:
            with open(folder / p["name"], "rb") as src:
                shutil.copyfileobj(src, dst)
    got = sha256(tmp)
    if got != manifest["sha256"]:
        tmp.unlink()
        raise ValueError(f"{manifest['name']}: SHA-256 {got} after joining, the manifest says "
                         f"{manifest['sha256']}")
    tmp.replace(out)
    return out


def stage(folder: Path, carry: Path) -> list[Path]:
    """Replace ``carry`` with one folder per part, ``carry/pK`` = the manifest + part ``K``."""
    manifest = json.loads((folder / MANIFEST).read_text())
    if carry.exists():
        shutil.rmtree(carry)
    made = []
    for k, part in enumerate(manifest["parts"]):
        dest = carry / f"p{k}"
        dest.mkdir(parents=True)
        shutil.copy2(folder / MANIFEST, dest / MANIFEST)
        shutil.copy2(folder / part["name"], dest / part["name"])
        made.append(dest)
    return made


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("split")
    a.add_argument("file", type=Path)
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--part-mib", type=float, default=19.0)
    b = sub.add_parser("join")
    b.add_argument("folder", type=Path)
    b.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("stage")
    c.add_argument("folder", type=Path)
    c.add_argument("--to", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "split":
            m = split(args.file, args.out, int(args.part_mib * (1 << 20)))
            print(f"{m['name']}: {m['size']} bytes in {len(m['parts'])} parts under {args.out}")
        elif args.cmd == "join":
            print(f"joined {join(args.folder, args.out)}")
        else:
            made = stage(args.folder, args.to)
            print(f"staged {len(made)} folders: {', '.join(str(m) for m in made)}")
    except (OSError, ValueError) as e:
        print(f"gpu carry {args.cmd}: {e}", file=sys.stderr)
        return 1
    return 0
