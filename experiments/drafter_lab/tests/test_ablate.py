"""``python -m experiments.drafter_lab ablate``: arm names map to trainer options, unknown ones
are refused by name (the runs themselves train on the real target: benchmarks, not tests)."""

import pytest

from experiments.drafter_lab.ablate import arm_options, parse_args
from dominotree_jax.precision import Precision
from dominotree_jax.train.trainer import TrainConfig


def test_arms_join_options_that_the_trainer_takes():
    opts = arm_options("target+all_anchors+hold+bf16")
    assert opts == {"layer_init": "target", "anchor_mode": "all", "anchors": 32,
                    "lam_hold": 0.25, "lam_ramp": 0.5, "lam_end": 0.2, "precision": "bfloat16"}
    assert TrainConfig(**opts).precision == Precision("bfloat16")
    with pytest.raises(ValueError, match="unknown ablation option 'fp8'"):
        arm_options("target+fp8")


def test_shard_range_and_full_vocabulary_flags():
    args = parse_args(["--data", "d", "--shard-from", "404", "--shards", "412",
                       "--train-vocab", "0"])
    assert (args.shard_from, args.shards, args.train_vocab) == (404, 412, 0)
