"""Token-id shards with a manifest: the drafter training data as it is kept in the repository.

A data directory (for example ``data/smollm2/``) holds ``manifest.json`` and shard files
``<kind>_<NNNNN>.npz``. A shard has one row per sequence:

- ``tokens``: ``uint16 [sum(lengths)]``, the rows concatenated (a 49,152 vocabulary fits);
- ``lengths``: ``int32 [rows]`` row lengths; ``prompt_lengths``: ``int32 [rows]`` (the prompt part,
  the chat-templated user turn; the rest of the row is the target's answer);
- ``source``: ``uint8 [rows]`` index into the manifest's ``sources`` list;
- optional (``answers`` shards written with ``collect --store-topk K``): ``topk_ids`` ``uint16
  [sum(lengths - prompt_lengths), K]`` and ``topk_logits`` ``float16 [same]``, the target's K
  largest next-token logits at every position that predicts an answer token (row by row,
  positions ``prompt_length - 1 … length - 2``, in descending order). Readers that do not know
  them ignore them (the manifest ``format`` stays 1); the shard's manifest entry says
  ``"topk": K``.

Kinds: ``answers`` (prompt + the target's answer, what training reads) and ``requests``
(prompts the target wrote itself, ``lengths == prompt_lengths``, waiting for answers).

``manifest.json`` records for every shard how it was produced (kind, sampling settings, seed,
UTC date, counts, generation seconds). A shard file is written to a temporary name and renamed,
then the manifest is replaced the same way, so a killed writer leaves at most an orphan file
that is not in the manifest (it is overwritten by the next shard of that name).
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
from typing import Iterator

import numpy as np

FORMAT = 1
KINDS = ("answers", "requests")


def atomic_write(path: str, write) -> None:
    """Write ``path`` through ``write(file)`` into a temporary file, synced, then renamed."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ShardStore:
    """Read and append shards of one data directory.

    ``vocab_size`` (and ``tokenizer``, a free-text description) are fixed by the first writer;
    opening a directory with a different vocabulary size is an error.
    """

    def __init__(self, root: str, vocab_size: int | None = None, tokenizer: str | None = None):
        self.root = root
        path = os.path.join(root, "manifest.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                self.manifest = json.load(f)
            if self.manifest.get("format") != FORMAT:
                raise ValueError(f"{path}: unknown format {self.manifest.get('format')!r}")
            have = self.manifest["vocab_size"]
            if vocab_size is not None and vocab_size != have:
                raise ValueError(f"{path} holds token ids of a {have}-token vocabulary, "
                                 f"not {vocab_size}")
        else:
            if vocab_size is None:
                raise FileNotFoundError(f"no manifest.json in {root!r} (give vocab_size to "
                                        "start a new data directory)")
            self.manifest = {"format": FORMAT, "vocab_size": int(vocab_size),
                             "tokenizer": tokenizer, "sources": [], "shards": []}
        if self.manifest["vocab_size"] > 65536:
            raise ValueError("uint16 shards need a vocabulary of at most 65,536 tokens")

    # ------------------------------------------------------------------ writing
    def lock(self):
        """An exclusive lock on the directory (one writer at a time); use as a context."""
        os.makedirs(self.root, exist_ok=True)
        f = open(os.path.join(self.root, ".lock"), "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise RuntimeError(f"another process is writing to {self.root}") from None
        return f

    def source_id(self, name: str) -> int:
        if name not in self.manifest["sources"]:
            self.manifest["sources"].append(name)
        i = self.manifest["sources"].index(name)
        if i > 255:
            raise ValueError("at most 256 distinct sources")
        return i

    def append(self, kind: str, rows: list[tuple[list[int], int, str]], info: dict,
               topk: tuple[np.ndarray, np.ndarray] | None = None) -> dict:
        """Write one shard of ``rows`` = ``(token ids, prompt length, source name)`` and record
        it in the manifest with ``info`` (sampling settings, seed, …). ``topk``: optional
        ``(ids [answer tokens, K], logits [answer tokens, K])`` (see the module docstring).
        Returns the entry."""
        if kind not in KINDS:
            raise ValueError(f"unknown shard kind {kind!r}; choose one of {KINDS}")
        if not rows:
            raise ValueError("a shard needs at least one row")
        V = self.manifest["vocab_size"]
        lengths = np.asarray([len(t) for t, _, _ in rows], np.int32)
        plen = np.asarray([p for _, p, _ in rows], np.int32)
        if np.any(plen < 0) or np.any(plen > lengths):
            raise ValueError("prompt lengths must lie in [0, row length]")
        flat = np.concatenate([np.asarray(t, np.int64) for t, _, _ in rows])
        if flat.size and (flat.min() < 0 or flat.max() >= V):
            raise ValueError(f"token ids outside [0, {V})")
        extra = {}
        if topk is not None:
            ids, vals = np.asarray(topk[0]), np.asarray(topk[1])
            n_ans = int((lengths - plen).sum())
            if ids.ndim != 2 or ids.shape != vals.shape or ids.shape[0] != n_ans:
                raise ValueError(f"top-k arrays must both be [answer tokens = {n_ans}, K], got "
                                 f"{ids.shape} and {vals.shape}")
            if ids.size and (ids.min() < 0 or ids.max() >= V):
                raise ValueError(f"top-k token ids outside [0, {V})")
            extra = {"topk_ids": ids.astype(np.uint16), "topk_logits": vals.astype(np.float16)}
            info = {**info, "topk": int(ids.shape[1])}
        src = np.asarray([self.source_id(s) for _, _, s in rows], np.uint8)
        index = sum(1 for s in self.manifest["shards"] if s["kind"] == kind)
        name = f"{kind}_{index:05d}.npz"
        os.makedirs(self.root, exist_ok=True)
        atomic_write(os.path.join(self.root, name), lambda f: np.savez_compressed(
            f, tokens=flat.astype(np.uint16), lengths=lengths, prompt_lengths=plen,
            source=src, **extra))
        entry = {"file": name, "kind": kind, "rows": int(len(rows)),
                 "prompt_tokens": int(plen.sum()), "answer_tokens": int((lengths - plen).sum()),
                 "created_utc": datetime.datetime.now(datetime.timezone.utc)
                 .strftime("%Y-%m-%dT%H:%M:%SZ"), **info}
        self.manifest["shards"].append(entry)
        self._write_manifest()
        return entry

    def _write_manifest(self):
        text = json.dumps(self.manifest, indent=1).encode()
        atomic_write(os.path.join(self.root, "manifest.json"), lambda f: f.write(text))

    # ------------------------------------------------------------------ reading
    def entries(self, kind: str = "answers") -> list[dict]:
        return [s for s in self.manifest["shards"] if s["kind"] == kind]

    def read(self, entry: dict) -> dict:
        """One shard as arrays (``tokens`` widened to int32, ``offsets [rows+1]`` added; with
        stored top-k logits also ``topk_ids`` int32, ``topk_logits`` float16 and
        ``answer_offsets [rows+1]``, where row ``r``'s entries start)."""
        with np.load(os.path.join(self.root, entry["file"])) as z:
            out = {k: z[k] for k in ("tokens", "lengths", "prompt_lengths", "source")}
            if "topk_ids" in z.files:
                out["topk_ids"] = z["topk_ids"].astype(np.int32)
                out["topk_logits"] = z["topk_logits"]
        out["tokens"] = out["tokens"].astype(np.int32)
        out["offsets"] = np.concatenate([[0], np.cumsum(out["lengths"])]).astype(np.int64)
        if out["offsets"][-1] != len(out["tokens"]) or len(out["lengths"]) != entry["rows"]:
            raise ValueError(f"{entry['file']}: rows do not match the manifest")
        if "topk_ids" in out:
            out["answer_offsets"] = np.concatenate(
                [[0], np.cumsum(out["lengths"] - out["prompt_lengths"])]).astype(np.int64)
            if len(out["topk_ids"]) != out["answer_offsets"][-1]:
                raise ValueError(f"{entry['file']}: top-k rows do not match the answers")
        return out

    def entry_rows(self, entry: dict) -> list[tuple[np.ndarray, int, str]]:
        """The rows of one shard: ``(token ids int32, prompt length, source name)``."""
        names = self.manifest["sources"]
        s = self.read(entry)
        return [(s["tokens"][s["offsets"][r]:s["offsets"][r + 1]], int(s["prompt_lengths"][r]),
                 names[int(s["source"][r])]) for r in range(len(s["lengths"]))]

    def rows(self, kind: str = "answers") -> Iterator[tuple[np.ndarray, int, str]]:
        """Every row of every ``kind`` shard: ``(token ids int32, prompt length, source)``."""
        for e in self.entries(kind):
            yield from self.entry_rows(e)

    def totals(self) -> dict:
        out = {}
        for kind in KINDS:
            es = self.entries(kind)
            out[kind] = {"shards": len(es), "rows": sum(e["rows"] for e in es),
                         "prompt_tokens": sum(e["prompt_tokens"] for e in es),
                         "answer_tokens": sum(e["answer_tokens"] for e in es)}
        out["bytes"] = sum(os.path.getsize(os.path.join(self.root, e["file"]))
                           for e in self.manifest["shards"])
        return out
