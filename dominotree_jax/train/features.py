"""The target's teacher-forced features of stored sequences, computed (not stored in the repo).

Training needs, for every token of a sequence, the target's tapped layer outputs (the drafter's
context) and its final-normed hidden state (the target's next-token distribution through the
shared LM head, for soft targets). Both come from one batched causal forward over prompt +
answer. ``FeatureCache`` computes them once per shard and keeps them as float16 ``.npy`` files
next to a training run (``<run>/features/``, not in the repository): features at a position
depend only on the tokens before it, so cropping a sequence later needs no recomputation.

``precision="bfloat16"`` runs that forward on bf16 weights (float32 activations and
accumulation, as a bf16 decode verifies): 1.5-1.6x faster on a CPU with bf16 dot units, final
hidden states within ~0.7 % (relative norm) of float32's (docs/training.md). Its files carry the
precision in their name, so the two never mix.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.config import TargetConfig
from dominotree_jax.model.target import bind_target, causal_mask, teacher_forced_forward
from dominotree_jax.precision import cast_params, params_precision, precision_name

WIDTHS = (128, 256, 384, 512, 768, 1024, 2048)


# XLA's constant folding evaluates the empty cache's reductions in its interpreter at compile
# time (17-47 s per instruction for SmolLM2 at batch 8, every width of WIDTHS; Intel Xeon,
# 2026-12-07); without the pass they run with the program, in microseconds
@functools.partial(jax.jit, static_argnames=("cfg", "taps"),
                   compiler_options={"xla_disable_hlo_passes": "constant_folding"})
def teacher_forced(tparams, tokens_BT, *, cfg: TargetConfig, taps: tuple[int, ...]):
    """``(taps [B, T, len(taps)·H], hidden [B, T, H])`` of a causal forward at positions
    ``0..T-1`` (right padding only affects the padded positions themselves)."""
    B, T = tokens_BT.shape
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    out = teacher_forced_forward(bind_target(cfg, tparams), tokens_BT, pos,
                                 causal_mask(B, T, T), taps)
    return out.taps, out.hidden


def padded_batches(rows: list[np.ndarray], batch: int):
    """``(indices, tokens [batch, W])`` for the ``rows`` of token ids, shortest first, ``batch``
    at a time, right-padded with 0 to the smallest of ``WIDTHS`` that holds the longest (one
    compiled forward per width)."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    for k in range(0, len(order), batch):
        idx = order[k:k + batch]
        longest = max(len(rows[i]) for i in idx)
        W = next((w for w in WIDTHS if w >= longest), longest)
        toks = np.zeros((batch, W), np.int32)
        for r, i in enumerate(idx):
            toks[r, :len(rows[i])] = rows[i]
        yield idx, toks


def sequence_features(tcfg: TargetConfig, tparams, rows: list[np.ndarray], taps: tuple[int, ...],
                      batch: int = 8) -> list[np.ndarray]:
    """float16 ``[len(row), F + H]`` (taps, then final hidden) for each row of token ids."""
    out: list[np.ndarray | None] = [None] * len(rows)
    for idx, toks in padded_batches(rows, batch):
        t, h = jax.device_get(teacher_forced(tparams, jnp.asarray(toks), cfg=tcfg, taps=taps))
        both = np.concatenate([np.asarray(t, np.float16), np.asarray(h, np.float16)], -1)
        for r, i in enumerate(idx):
            out[i] = both[r, :len(rows[i])]
    return out  # type: ignore[return-value]


def cache_root(features_dir: str, data_dir: str) -> str:
    """Where one data directory's features live: ``<features_dir>/<data_dir's name>``.

    Training and the acceptance tool share it, so features are computed once per data set.
    """
    return os.path.join(features_dir, os.path.basename(os.path.normpath(data_dir)))


class FeatureCache:
    """Per-shard feature files under ``root``: ``<shard>.npy`` float16 ``[tokens, F + H]``,
    rows concatenated as in the shard. ``get(entry, shard)`` computes a missing file.

    ``precision``: the weights' precision in the features forward (``tparams`` are cast to it
    once); float32 files keep their original names, others end in ``_<precision>``."""

    def __init__(self, root: str, tcfg: TargetConfig, tparams, taps: tuple[int, ...],
                 batch: int = 8, log=None, precision: str = "float32"):
        self.precision = precision_name(precision, "feature precision")
        if params_precision(tparams, "target parameters") != self.precision:
            tparams = cast_params(tparams, self.precision)
        self.root, self.tcfg, self.tparams = root, tcfg, tparams
        self.taps, self.batch, self.log = tuple(taps), batch, log
        os.makedirs(root, exist_ok=True)
        self.width = (len(self.taps) + 1) * tcfg.hidden_size

    def path(self, entry: dict) -> str:
        taps = "-".join(str(t) for t in self.taps)
        suffix = "" if self.precision == "float32" else f"_{self.precision}"
        return os.path.join(self.root, f"{entry['file'][:-4]}_taps{taps}{suffix}.npy")

    def get(self, entry: dict, shard: dict) -> np.ndarray:
        path = self.path(entry)
        if not os.path.exists(path):
            rows = [shard["tokens"][shard["offsets"][r]:shard["offsets"][r + 1]]
                    for r in range(len(shard["lengths"]))]
            feats = sequence_features(self.tcfg, self.tparams, rows, self.taps, self.batch)
            tmp = f"{path}.{os.getpid()}.tmp.npy"   # (processes of one run share the cache)
            np.save(tmp, np.concatenate(feats, 0))
            os.replace(tmp, path)
            if self.log:
                self.log(f"features of {entry['file']}: {sum(map(len, rows))} tokens "
                         f"({self.precision})")
        arr = np.load(path, mmap_mode="r")
        if arr.shape != (int(shard["offsets"][-1]), self.width):
            raise ValueError(f"{path}: shape {arr.shape} does not match the shard")
        return arr


class OnTheFlyFeatures:
    """The same features as ``FeatureCache``, computed for each batch when it is drawn and never
    stored: what a training run that moves between hosts uses (a cache of every shard is tens of
    GB; a campaign commits its state, not its features). ``SequenceDataset.prefetch`` hands it
    the batch's rows (one batched forward); ``get`` returns per-shard views that read them."""

    def __init__(self, tcfg: TargetConfig, tparams, taps: tuple[int, ...], batch: int = 8,
                 precision: str = "float32"):
        self.precision = precision_name(precision, "feature precision")
        if params_precision(tparams, "target parameters") != self.precision:
            tparams = cast_params(tparams, self.precision)
        self.tcfg, self.tparams, self.taps, self.batch = tcfg, tparams, tuple(taps), batch
        self.width = (len(self.taps) + 1) * tcfg.hidden_size
        self._rows: dict[tuple[str, int], np.ndarray] = {}

    def get(self, entry: dict, shard: dict) -> "_PrefetchedShard":
        return _PrefetchedShard(self, entry["file"], np.asarray(shard["offsets"]))

    def prefetch(self, rows: list[tuple[str, int, np.ndarray]]) -> None:
        """Compute the features of ``rows`` = ``(shard file, row offset, token ids)``; they
        replace the previous batch's."""
        feats = sequence_features(self.tcfg, self.tparams, [t for _, _, t in rows], self.taps,
                                  self.batch)
        self._rows = {(f, off): x for (f, off, _), x in zip(rows, feats)}


class _PrefetchedShard:
    """One shard's features as ``SequenceDataset.get`` slices them, ``[off + lo : off + end]``
    within one row, served from the rows ``OnTheFlyFeatures.prefetch`` computed."""

    def __init__(self, source: OnTheFlyFeatures, file: str, offsets: np.ndarray):
        self.source, self.file, self.offsets = source, file, offsets

    def __getitem__(self, sl: slice) -> np.ndarray:
        r = int(np.searchsorted(self.offsets, sl.start, side="right")) - 1
        off = int(self.offsets[r])
        try:
            row = self.source._rows[(self.file, off)]
        except KeyError:
            raise KeyError(f"features of {self.file} row {r} were not prefetched "
                           "(SequenceDataset.prefetch before get)") from None
        if sl.stop - off > len(row):
            raise ValueError(f"{self.file} row {r}: {sl.stop - off} positions asked, "
                             f"{len(row)} prefetched")
        return row[sl.start - off:sl.stop - off]


class TokensOnly:
    """No features (width 0): a ``SequenceDataset`` for readers of token ids alone (token
    frequencies, lookup statistics), with no target forward."""

    width = 0

    def __init__(self):
        import types
        self.tcfg = types.SimpleNamespace(hidden_size=0)

    def get(self, entry: dict, shard: dict) -> None:
        return None
