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
from dominotree_jax.train.data.loops import loop_end
from dominotree_jax.train.data.shards import ShardStore


def heldout_bucket(prompt_ids) -> int:
    """0..99, a stable hash of a prompt's token ids."""
    h = hashlib.sha1(np.asarray(prompt_ids, np.uint16).tobytes()).digest()
    return int.from_bytes(h[:4], "little") % 100


class SequenceDataset:
    """Every answered sequence of the answer shards ``first_shard .. max_shards - 1`` (default:
    all); ``get(j)`` crops to the last ``seq_len`` tokens. ``trim_loops = W > 0``: each answer
    ends at its repetition loop's point (``loops.loop_end(answer, W)``: the onset, twice, is
    kept), for training and evaluation without the loop's continuation. The features are
    causal, so a trimmed sequence's are the first rows of the stored ones."""

    def __init__(self, store: ShardStore, features: FeatureCache, seq_len: int,
                 max_shards: int | None = None, first_shard: int = 0, trim_loops: int = 0):
        entries = store.entries("answers")
        if first_shard and not 0 < first_shard < len(entries[:max_shards]):
            raise ValueError(f"first_shard {first_shard} leaves no answer shard of "
                             f"{len(entries[:max_shards])} in {store.root}")
        if trim_loops < 0:
            raise ValueError(f"trim_loops must be >= 0 (0: keep loops), got {trim_loops}")
        self.store, self.features, self.seq_len = store, features, seq_len
        self.shards, self.index, self.sources, self.files = [], [], [], []
        self.ends: list[int] = []    # each sequence's length in use (trimmed at its loop)
        self.trimmed_tokens = 0      # answer tokens left out by trim_loops
        self.topk_k = 0   # K of the stored top-k target logits (0: no shard has them)
        names = store.manifest["sources"]
        for entry in entries[first_shard:max_shards]:
            shard = store.read(entry)
            if "topk_ids" in shard:
                k = shard["topk_ids"].shape[1]
                if self.topk_k and k != self.topk_k:
                    raise ValueError(f"{entry['file']} stores top-{k} logits, earlier shards "
                                     f"top-{self.topk_k}: one K per data set")
                self.topk_k = k
            s = len(self.shards)
            self.shards.append((shard, features.get(entry, shard)))
            self.files.append(entry["file"])
            for r in range(len(shard["lengths"])):
                E, L = int(shard["lengths"][r]), int(shard["prompt_lengths"][r])
                if trim_loops:
                    lo = int(shard["offsets"][r])
                    cut = loop_end(shard["tokens"][lo + L:lo + E], trim_loops)
                    if cut is not None:
                        self.trimmed_tokens += E - L - cut
                        E = L + cut
                if E - L >= 2:
                    self.index.append((s, r))
                    self.sources.append(names[shard["source"][r]])
                    self.ends.append(E)
        self.hidden_dim = features.tcfg.hidden_size
        self.feat_dim = features.width - self.hidden_dim

    def __len__(self):
        return len(self.index)

    def prefetch(self, seq_ids) -> None:
        """Features computed per batch (``features.OnTheFlyFeatures``): compute those of
        ``seq_ids`` now, in one batched forward; a no-op for stored features."""
        if not hasattr(self.features, "prefetch"):
            return
        rows = []
        for j in seq_ids:
            s, r = self.index[int(j)]
            off = int(self.shards[s][0]["offsets"][r])
            rows.append((self.files[s], off, self.row(int(j))[0]))
        self.features.prefetch(rows)

    def row(self, j: int) -> tuple[np.ndarray, int]:
        """(all token ids of sequence ``j``, its prompt length)."""
        s, r = self.index[j]
        shard = self.shards[s][0]
        lo = int(shard["offsets"][r])
        return shard["tokens"][lo:lo + self.ends[j]], int(shard["prompt_lengths"][r])

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
        E, L = self.ends[j], int(shard["prompt_lengths"][r])
        W = self.seq_len
        lo = max(0, E - W)
        t = np.full((W,), -1, np.int32)
        f = np.zeros((W, self.features.width), np.float16)
        t[:E - lo] = shard["tokens"][off + lo:off + E]
        f[:E - lo] = feats[off + lo:off + E]
        return t, f[:, :self.feat_dim], f[:, self.feat_dim:], L - lo, E - lo


    def get_topk(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """The stored top-k target logits of sequence ``j``, aligned with ``get(j)``: ``(ids
        [W, k] int32, logits [W, k] float32)``; row ``p`` is the target's top-k at position
        ``p`` (predicting token ``p + 1``), ids ``-1`` where nothing is stored (prompt
        positions, the last token, shards without top-k, padding)."""
        K, W = self.topk_k, self.seq_len
        ids = np.full((W, K), -1, np.int32)
        vals = np.zeros((W, K), np.float32)
        s, r = self.index[j]
        shard = self.shards[s][0]
        if K == 0 or "topk_ids" not in shard:
            return ids, vals
        E, L = self.ends[j], int(shard["prompt_lengths"][r])
        lo = max(0, E - W)
        a0 = int(shard["answer_offsets"][r])
        # Entry i of the row is position L - 1 + i; keep the positions inside the crop.
        p = np.arange(L - 1, E - 1)
        keep = p >= lo
        ids[p[keep] - lo] = shard["topk_ids"][a0:a0 + E - L][keep]
        vals[p[keep] - lo] = shard["topk_logits"][a0:a0 + E - L][keep]
        return ids, vals


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


ANCHOR_MODES = ("sample", "all")


def all_anchors(L: int, E: int, cap: int, rng: np.random.Generator) -> np.ndarray:
    """Every valid anchor of a sequence (``1 <= a <= E - 2``) when there are at most ``cap``;
    otherwise ``cap`` of them: the answer positions (``a >= L - 1``) first, a random subset of
    them when they alone exceed ``cap``, the rest drawn at random among prompt positions.
    Sorted; fewer than ``cap`` when the sequence is short."""
    lo_ans = max(L - 1, 1)
    ans, pro = np.arange(lo_ans, E - 1), np.arange(1, min(lo_ans, E - 1))
    if len(ans) + len(pro) <= cap:
        return np.concatenate([pro, ans]).astype(np.int32)
    if len(ans) >= cap:
        return np.sort(rng.choice(ans, cap, replace=False)).astype(np.int32)
    return np.sort(np.concatenate([ans, rng.choice(pro, cap - len(ans), replace=False)])
                   ).astype(np.int32)


def make_batch(ds: SequenceDataset, seq_ids, *, anchors: int, block: int,
               rng: np.random.Generator, answer_frac: float = 0.85,
               anchor_mode: str = "sample") -> dict:
    """A training batch: ``tokens [B, W]``, ``feats [B, W, F]``, ``hidden [B, W, H]``,
    ``anchors [B, A]``, ``labels [B, A, block+1]`` (``x_a … x_{a+block}``; ``-1`` past the
    end) and ``soft_pos [B, A, block]`` (the position whose target distribution predicts each
    label, ``a + d``; ``-1`` where the label is missing); with stored top-k logits
    (``ds.topk_k > 0``) also ``topk_ids``/``topk_logits [B, W, k]`` (``get_topk``).

    ``rng``: one generator drawn from row after row, or a sequence of generators, one per row
    (a row's anchors then do not depend on which other rows the batch holds: what lets each
    process of a run build only its own rows, ``batch_stream(rows=...)``).

    ``anchor_mode="sample"``: ``anchors`` positions drawn without replacement among positions
    ``a`` with at least one label (``a + 1 < total``), ``answer_frac`` of them in the answer
    part when it is long enough (short sequences repeat anchors). ``"all"``: every valid
    position, ``anchors`` being the cap per sequence (``all_anchors``); unused anchor slots of
    a short sequence get all labels ``-1`` (they weigh nothing).
    """
    if anchor_mode not in ANCHOR_MODES:
        raise ValueError(f"anchor_mode must be one of {ANCHOR_MODES}, got {anchor_mode!r}")
    B, W = len(seq_ids), ds.seq_len
    rngs = [rng] * B if isinstance(rng, np.random.Generator) else list(rng)
    if len(rngs) != B:
        raise ValueError(f"{len(rngs)} generators for a batch of {B} rows")
    ds.prefetch(seq_ids)
    tokens = np.full((B, W), -1, np.int32)
    feats = np.zeros((B, W, ds.feat_dim), np.float16)
    hidden = np.zeros((B, W, ds.hidden_dim), np.float16)
    anc = np.zeros((B, anchors), np.int32)
    unused = np.zeros((B, anchors), bool)
    for i, j in enumerate(seq_ids):
        rng = rngs[i]
        t, f, h, L, E = ds.get(int(j))
        tokens[i], feats[i], hidden[i] = t, f, h
        if anchor_mode == "all":
            a = all_anchors(L, E, anchors, rng)
            anc[i, :len(a)] = a
            unused[i, len(a):] = True
            continue
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
    labels = np.where((idx < W) & ~unused[:, :, None], labels, -1).astype(np.int32)
    soft_pos = np.where(labels[:, :, 1:] >= 0, idx[:, :, :block], -1).astype(np.int32)
    out = {"tokens": tokens, "feats": feats, "hidden": hidden, "anchors": anc,
           "labels": labels, "soft_pos": soft_pos}
    if ds.topk_k:
        both = [ds.get_topk(int(j)) for j in seq_ids]
        out["topk_ids"] = np.stack([b[0] for b in both])
        out["topk_logits"] = np.stack([b[1] for b in both])
    return out


def epoch_order(ids: np.ndarray, seed: int, epoch: int, weights=None) -> np.ndarray:
    """The sequences of one epoch in training order, a pure function of ``(seed, epoch)``.
    ``weights`` (one per id, >= 0): each id appears ``floor(w)`` times plus once more with
    probability ``w - floor(w)`` (a mix that leans toward some kinds of data)."""
    ids = np.asarray(ids)
    if weights is not None:
        w = np.asarray(weights, np.float64)
        if w.shape != ids.shape or (w < 0).any():
            raise ValueError(f"weights must be {ids.shape} non-negative values, got {w.shape}")
        extra = np.random.default_rng((seed, epoch, 7)).random(len(ids)) < w - np.floor(w)
        ids = np.repeat(ids, np.floor(w).astype(np.int64) + extra)
    return np.random.default_rng((seed, epoch)).permutation(ids)


def batch_stream(ds: SequenceDataset, ids: np.ndarray, *, batch: int, anchors: int, block: int,
                 seed: int, start_step: int = 0, anchor_mode: str = "sample",
                 weights=None, rows=None) -> Iterator[dict]:
    """Deterministic infinite stream of batches; batch ``k`` depends only on (seed, k) (and
    the per-sequence ``weights`` of ``epoch_order``), each row's anchors only on (seed, k, row).
    ``rows`` (sorted indices into the batch; default all): only those rows are built — their
    tokens read and their features computed — so a process of a multi-process run pays for
    its own devices' rows alone; they equal the same rows of the whole batch."""
    rows = np.arange(batch) if rows is None else np.asarray(rows, np.int64)
    if rows.ndim != 1 or len(rows) == 0 or (np.diff(rows) <= 0).any() or rows[0] < 0 \
            or rows[-1] >= batch:
        raise ValueError(f"rows must be increasing indices into a batch of {batch}, got {rows}")
    epoch, first = 0, 0   # the epoch holding start_step, and its first step
    while True:
        perm = epoch_order(ids, seed, epoch, weights)
        per_epoch = max(1, len(perm) // batch)
        if first + per_epoch > start_step:
            break
        epoch, first = epoch + 1, first + per_epoch
    step = start_step
    while True:
        k = step - first
        if k >= per_epoch:
            epoch, first = epoch + 1, first + per_epoch
            perm = epoch_order(ids, seed, epoch, weights)
            per_epoch = max(1, len(perm) // batch)
            k = 0
        seq = perm[k * batch:(k + 1) * batch]
        if len(seq) < batch:
            seq = np.resize(perm, batch)
        rngs = [np.random.default_rng((seed, 1_000_003, step, int(r))) for r in rows]
        yield make_batch(ds, seq[rows], anchors=anchors, block=block, rng=rngs,
                         anchor_mode=anchor_mode)
        step += 1
