"""A drafter campaign resumes across windows and hosts from its committed files: a run stopped,
its committed state copied to a fresh directory (nothing else) and continued computes exactly
what an unbroken run computes when that run passes its state through the same compact form at
the same step; against a fully unbroken float32 run the difference is the compact form's
rounding, bounded here. Also: the compact form's quantizers and the draft vocabulary fixed at
start. (The batch stream and per-batch features: tests/test_batch_stream.py.)"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest

from experiments.smollm2_campaign import campaign as C
from experiments.smollm2_campaign import compact_state
from dominotree_jax.train.draft_vocab import frequent_answer_tokens
from dominotree_jax.train.trainer import TrainConfig
from train_fixtures import TCFG, tiny_target_and_answers

@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("campaign")
    target, _, _ = tiny_target_and_answers(str(root / "data"))
    plan = C.CampaignPlan(
        name="tiny", data=str(root / "data"), trim_loops=0, seq_len=40, draft_vocab=48,
        feature_precision="float32", layers=1, intermediate=96, taps=(0, 1), block_size=4,
        gru=16, emb=16, mask_token_id=127, eval_every=0, heldout_pct=20,
        source_weights=(("test", 1.5),),
        train=TrainConfig(steps=8, batch=4, anchors=4, lr=3e-3, warmup=2, seed=0,
                          ckpt_every_s=1e9, anchor_mode="all"))
    home = str(root / "home")
    plan = C.start(home, plan, target, log=lambda m: None)
    return root, target, plan, home


def _params(tr):
    return {k: np.asarray(v) for k, v in tr.flat.items()}


def _window(setup, home: str, steps: int, ckpt: str) -> None:
    """One work window: a copy of the campaign in ``home`` trains ``steps`` steps and writes
    its committed state."""
    _, target, plan, src = setup
    shutil.copytree(src, home)
    tr = C.make_trainer(home, plan, target, ckpt_dir=ckpt)
    tr.fit(num_steps=steps)
    C.save_committed(home, tr)
    tr.close()


def test_quantizers_bound_their_error():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 70)).astype(np.float32)
    y = compact_state.dequantize_int8(compact_state.quantize_int8(x), x.shape)
    blocks = np.abs(np.concatenate([x.reshape(-1), np.zeros(-x.size % 64)])).reshape(-1, 64)
    bound = np.repeat(blocks.max(1) / 127 / 2, 64)[:x.size].reshape(x.shape)
    assert (np.abs(y - x) <= bound * 1.0001 + 1e-12).all()
    v = np.exp(rng.normal(size=(300, 70)) - 8).astype(np.float32)
    v[0, :7] = 0.0
    w = compact_state.dequantize_log4(compact_state.quantize_log4(v), v.shape)
    assert (w[0, :7] == 0).all() and (w[v > 0] > 0).all()
    # half a code step on a block's log range
    assert np.abs(np.log(w[v > 0] / v[v > 0])).max() < 0.5 * 9.0 / 14


def test_the_campaigns_draft_vocabulary_is_fixed_at_start(setup):
    _, target, plan, home = setup
    ds = C.dataset(plan, target)
    ids, _ = ds.split(plan.heldout_pct)
    d2t = np.load(os.path.join(home, "d2t.npy"))
    np.testing.assert_array_equal(d2t, frequent_answer_tokens(ds, ids, 48, TCFG.vocab_size))
    with pytest.raises(FileExistsError):
        C.start(home, plan, target)


def test_resume_from_committed_files_in_a_fresh_directory(setup, tmp_path):
    root, target, plan, home = setup
    # unbroken, with the compact form applied at step 3 as a window's end would
    a = C.make_trainer(home, plan, target, ckpt_dir=str(tmp_path / "a_ckpt"))
    a.log_dir = None
    a.fit(num_steps=3)
    exact_mid = (dict(a.flat), a.opt_state)
    a.flat, a.opt_state = compact_state.roundtrip(a.flat, a.opt_state)
    a.fit()
    # unbroken in float32 throughout
    u = C.make_trainer(home, plan, target, ckpt_dir=str(tmp_path / "u_ckpt"))
    u.log_dir = None
    u.flat, u.opt_state = exact_mid
    u.step = 3
    u.fit()
    # window 1 in one home; only its committed files go to a fresh home (another host)
    w1 = str(tmp_path / "w1")
    _window(setup, w1, 3, str(tmp_path / "b_ckpt"))
    w2 = str(tmp_path / "w2")
    os.makedirs(w2)
    state_files = [f for f, _ in C.STATE_PARTS]
    assert sorted(json.load(open(os.path.join(w1, "state.json")))["files"]) == sorted(state_files)
    assert not os.path.exists(os.path.join(w1, "state.npz"))
    for name in ("campaign.json", "d2t.npy", "state.json", "train_log.csv", *state_files):
        shutil.copy(os.path.join(w1, name), w2)
    assert C.load_plan(w2) == plan
    c = C.make_trainer(w2, plan, target, ckpt_dir=str(tmp_path / "c_ckpt"))   # fresh ckpt
    assert c.step == 3
    c.fit()
    assert c.step == a.step == 8
    for k, v in _params(a).items():
        np.testing.assert_array_equal(v, np.asarray(c.flat[k]), err_msg=k)
    # the compact form's cost: parameters within bf16 rounding plus a few steps of drift
    for k, v in _params(u).items():
        scale = np.abs(v).max() + 1e-6
        assert np.abs(v - np.asarray(c.flat[k])).max() <= 0.05 * scale, k
    with open(os.path.join(w2, "train_log.csv")) as f:
        assert len(f.read().strip().splitlines()) == 1 + 8   # the curve accumulates
    c.close()
    a.close()
    u.close()


def test_a_campaign_refuses_what_it_cannot_continue(setup, tmp_path):
    _, target, plan, home = setup
    with pytest.raises(FileNotFoundError, match="no campaign"):
        C.load_plan(str(tmp_path))
    bad = str(tmp_path / "bad")
    _window(setup, bad, 1, str(tmp_path / "ck"))
    params_file = os.path.join(bad, "state_params.npz")
    with np.load(params_file) as z:
        arrays = {k: z[k] for k in z.files}
    np.savez(params_file, **{k: v for k, v in arrays.items() if k != "p/fc.weight"})
    with pytest.raises(KeyError, match="lacks p/fc.weight"):
        C.make_trainer(bad, plan, target, ckpt_dir=str(tmp_path / "ck2"))
    os.remove(params_file)              # a state file left out of the commit is named
    with pytest.raises(FileNotFoundError, match="state_params.npz"):
        C.make_trainer(bad, plan, target, ckpt_dir=str(tmp_path / "ck3"))
    # a state committed in the one-file form before the split still loads
    np.savez(os.path.join(bad, "state.npz"), **arrays,
             **dict(np.load(os.path.join(bad, "state_moments.npz"))))
    meta = json.load(open(os.path.join(bad, "state.json")))
    json.dump({k: v for k, v in meta.items() if k != "files"},
              open(os.path.join(bad, "state.json"), "w"))
    assert C.make_trainer(bad, plan, target, ckpt_dir=str(tmp_path / "ck4")).step == 1
    meta = json.load(open(os.path.join(bad, "state.json")))
    assert meta["step"] == 1 and meta["bytes"] > 0
    with pytest.raises(ValueError, match="draft vocabulary size"):
        frequent_answer_tokens(None, [], 0, 128)
    assert dataclasses.replace(plan, name="x").name == "x"


def test_a_plan_is_a_runs_settings_and_plans_saved_with_dtype_still_load(tmp_path):
    from dominotree_jax.precision import Precision
    from dominotree_jax.train.run import RunSettings
    plan = C.CampaignPlan(name="p", train=TrainConfig(steps=4))
    assert isinstance(plan, RunSettings) and plan.draft_vocab == 16384 and plan.layers == 2
    assert dataclasses.replace(plan, layers=1).layers == 1
    with pytest.raises(ValueError, match="no warm_start"):
        C.CampaignPlan(name="p", train=TrainConfig(), warm_start="shipped", draft_vocab=0)
    plan = C.CampaignPlan(name="p", train=TrainConfig(steps=4, precision="bfloat16"))
    saved = plan.to_json()
    assert saved["train"]["precision"] == "bfloat16" and "dtype" not in saved["train"]
    old = {**saved, "train": {**{k: v for k, v in saved["train"].items() if k != "precision"},
                              "dtype": "bfloat16"}}
    (tmp_path / "campaign.json").write_text(json.dumps(old))
    assert C.load_plan(str(tmp_path)) == plan
    v5 = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "v5")
    assert C.load_plan(v5).train.precision == Precision("bfloat16")   # written with "dtype"
