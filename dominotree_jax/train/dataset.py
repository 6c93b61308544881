"""Training sequences and batches: stored token shards + the target's computed features.

``SequenceDataset`` reads every ``answers`` shard of a data directory (``shards.ShardStore``)
and pairs each sequence with its teacher-forced target features (``features.FeatureCache``).
The held-out split is by prompt (a hash of its token ids), so it stays the same as the data
grows and no held-out prompt is ever trained on. ``batch_stream`` makes batch ``k`` a pure
function of ``(seed, k)``: a resumed run continues with exactly the batches it would have seen.
"""

from __future__ import annotations

import hashlib
from typing import Iterator

import numpy as np

from dominotree_jax.train.features import FeatureCache
from dominotree_jax.train.shards import ShardStore


def heldout_bucket(prompt_ids) -> int:
    """0..99, a stable hash of a prompt's token ids."""
    h = hashlib.sha1(np.asarray(prompt_ids, np.uint16).tobytes()).digest()
    return int.from_bytes(h[:4], "little") % 100


class SequenceDataset:
    """Every answered sequence; ``get(j)`` crops to the last ``seq_len`` tokens."""

    def __init__(self, store: ShardStore, features: FeatureCache, seq_len: int,
                 max_shards: int | None = None):
        self.store, self.features, self.seq_len = store, features, seq_len
        self.shards, self.index, self.sources = [], [], []
        names = store.manifest["sources"]
        for entry in store.entries("answers")[:max_shards]:
            shard = store.read(entry)
            s = len(self.shards)
            self.shards.append((shard, features.get(entry, shard)))
            for r in range(len(shard["lengths"])):
                if shard["lengths"][r] - shard["prompt_lengths"][r] >= 2:
                    self.index.append((s, r))
                    self.sources.append(names[shard["source"][r]])
        self.hidden_dim = features.tcfg.hidden_size
        self.feat_dim = features.width - self.hidden_dim

    def __len__(self):
        return len(self.index)

    def row(self, j: int) -> tuple[np.ndarray, int]:
        """(all token ids of sequence ``j``, its prompt length)."""
        s, r = self.index[j]
        shard = self.shards[s][0]
        lo, hi = shard["offsets"][r], shard["offsets"][r + 1]
        return shard["tokens"][lo:hi], int(shard["prompt_lengths"][r])

    def num_tokens(self, which=None) -> tuple[int, int]:
        """(prompt tokens, answer tokens) over ``which`` (sequence indices; default all)."""
        p = a = 0
        for j in (range(len(self)) if which is None else which):
            t, L = self.row(int(j))
            p, a = p + L, a + len(t) - L
        return p, a

    def split(self, heldout_pct: int) -> tuple[np.ndarray, np.ndarray]:
        """(train, held-out) sequence indices; held out: prompts with ``heldout_bucket <
        heldout_pct``."""
        held = np.asarray([heldout_bucket(self.row(j)[0][:self.row(j)[1]]) < heldout_pct
                           for j in range(len(self))], bool)
        return np.flatnonzero(~held), np.flatnonzero(held)

    def get(self, j: int):
        """``(tokens [W] int32 (-1 pad), feats [W, F] f16, hidden [W, H] f16, prompt_len,
        total_len)`` with ``W = seq_len``, cropped to the last ``W`` tokens when longer."""
        s, r = self.index[j]
        shard, feats = self.shards[s]
        off = int(shard["offsets"][r])
        E, L = int(shard["lengths"][r]), int(shard["prompt_lengths"][r])
        W = self.seq_len
        lo = max(0, E - W)
        t = np.full((W,), -1, np.int32)
        f = np.zeros((W, self.features.width), np.float16)
        t[:E - lo] = shard["tokens"][off + lo:off + E]
        f[:E - lo] = feats[off + lo:off + E]
        return t, f[:, :self.feat_dim], f[:, self.feat_dim:], L - lo, E - lo


def active_vocab(ds: SequenceDataset, vocab_size: int, first: int = 8192,
                 multiple: int = 512) -> np.ndarray:
    """Sorted token ids a subset softmax runs over: every token of the data plus the
    ``first`` ids (BPE ids are roughly in frequency order), padded with the next unused ids to
    a multiple of ``multiple``."""
    seen = np.zeros((vocab_size,), bool)
    seen[:min(first, vocab_size)] = True
    for shard, _ in ds.shards:
        seen[shard["tokens"]] = True
    n = int(seen.sum())
    target_n = min(vocab_size, -(-n // multiple) * multiple)
    seen[np.flatnonzero(~seen)[:target_n - n]] = True
    return np.flatnonzero(seen).astype(np.int32)


def make_batch(ds: SequenceDataset, seq_ids, *, anchors: int, block: int,
               rng: np.random.Generator, answer_frac: float = 0.85) -> dict:
    """A training batch: ``tokens [B, W]``, ``feats [B, W, F]``, ``hidden [B, W, H]``,
    ``anchors [B, A]``, ``labels [B, A, block+1]`` (``x_a … x_{a+block}``; ``-1`` past the
    end) and ``soft_pos [B, A, block]`` (the position whose target distribution predicts each
    label, ``a + d``; ``-1`` where the label is missing).

    Anchors are drawn without replacement among positions ``a`` with at least one label
    (``a + 1 < total``), ``answer_frac`` of them in the answer part when it is long enough.
    """
    B, W = len(seq_ids), ds.seq_len
    tokens = np.full((B, W), -1, np.int32)
    feats = np.zeros((B, W, ds.feat_dim), np.float16)
    hidden = np.zeros((B, W, ds.hidden_dim), np.float16)
    anc = np.zeros((B, anchors), np.int32)
    for i, j in enumerate(seq_ids):
        t, f, h, L, E = ds.get(int(j))
        tokens[i], feats[i], hidden[i] = t, f, h
        lo_ans = max(L - 1, 1)
        ans = np.arange(lo_ans, E - 1)
        pro = np.arange(1, min(lo_ans, E - 1))
        n_ans = min(len(ans), int(round(anchors * answer_frac)) if len(pro) else anchors)
        pick = list(rng.choice(ans, n_ans, replace=False)) if n_ans else []
        pool = np.setdiff1d(np.arange(1, E - 1), np.asarray(pick, np.int64))
        rest = anchors - len(pick)
        if rest and len(pool):
            pick += list(rng.choice(pool, min(rest, len(pool)), replace=False))
        while len(pick) < anchors:  # very short sequences: repeat anchors
            pick.append(pick[len(pick) % max(1, len(pick))] if pick else 0)
        anc[i] = np.sort(np.asarray(pick[:anchors], np.int32))
    idx = anc[:, :, None] + np.arange(block + 1)[None, None, :]
    labels = np.take_along_axis(tokens[:, None, :].repeat(anchors, 1),
                                np.minimum(idx, W - 1), axis=2)
    labels = np.where(idx < W, labels, -1).astype(np.int32)
    soft_pos = np.where(labels[:, :, 1:] >= 0, idx[:, :, :block], -1).astype(np.int32)
    return {"tokens": tokens, "feats": feats, "hidden": hidden, "anchors": anc,
            "labels": labels, "soft_pos": soft_pos}


def batch_stream(ds: SequenceDataset, ids: np.ndarray, *, batch: int, anchors: int, block: int,
                 seed: int, start_step: int = 0) -> Iterator[dict]:
    """Deterministic infinite stream of batches; batch ``k`` depends only on (seed, k)."""
    per_epoch = max(1, len(ids) // batch)
    step = start_step
    while True:
        epoch, k = divmod(step, per_epoch)
        perm = np.random.default_rng((seed, epoch)).permutation(ids)
        seq = perm[k * batch:(k + 1) * batch]
        if len(seq) < batch:
            seq = np.resize(perm, batch)
        rng = np.random.default_rng((seed, 1_000_003, step))
        yield make_batch(ds, seq, anchors=anchors, block=block, rng=rng)
        step += 1
