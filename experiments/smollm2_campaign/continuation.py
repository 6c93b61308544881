"""A short training run on the SmolLM2 data from given starting parameters (a continuation of
the shipped v5 drafter): the campaign's data, loop trimming and source weights, features
computed per batch as v5 trained. Used by ``experiments.dspark_heads`` and
``experiments.drafter_v6``."""

from __future__ import annotations

import os

import numpy as np


def continuation_trainer(target, dcfg, flat: dict, tc, out: str, vocab_ids):
    """A ``Trainer`` of ``dcfg`` from ``flat`` (``{name: array}``) under ``tc``, checkpoints in
    ``out/ckpt`` and logs in ``out`` (it resumes from them), on ``data/smollm2``'s training split
    weighted by ``DEFAULT_SOURCE_WEIGHTS``; ``vocab_ids``: the draft vocabulary's ``d2t``."""
    from dominotree_jax.train.features import OnTheFlyFeatures
    from dominotree_jax.train.run import RunSettings
    from dominotree_jax.train.trainer import Trainer
    from experiments.smollm2_campaign.campaign import DEFAULT_SOURCE_WEIGHTS

    settings = RunSettings(train=tc, trim_loops=16, feature_precision="bfloat16",
                           taps=dcfg.target_layer_ids)
    ds = settings.dataset(target, OnTheFlyFeatures(target.config, target.params,
                                                   dcfg.target_layer_ids, precision="bfloat16"))
    train_ids, _ = ds.split(settings.heldout_pct)
    weights = dict(DEFAULT_SOURCE_WEIGHTS)
    seq_w = np.asarray([weights.get(ds.sources[int(j)], 1.0) for j in train_ids])
    return Trainer(dcfg, target.config, target.params, ds, train_ids, tc,
                   os.path.join(out, "ckpt"), log_dir=out, progress=False,
                   vocab_ids=np.asarray(vocab_ids), init_flat=flat, seq_weights=seq_w)
