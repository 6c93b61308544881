"""Drafter training on a tiny random target: features, loss (hard and soft), exact resume,
warm start, export."""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from convert.drafter import load_drafter, save_drafter
from dominotree_jax.model.state import state_to_flat
from dominotree_jax.train import dataset as D
from dominotree_jax.train.features import FeatureCache
from dominotree_jax.train.loss import loss_and_metrics, target_soft_logits
from dominotree_jax.train.loss import curriculum_lambda
from dominotree_jax.train.trainer import TrainConfig, Trainer, evaluate, fill_untrained_rows
from train_fixtures import DCFG, HYBRID_TCFG, TAPS, TCFG, tiny_target_and_answers

SEQ_LEN = 40


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    target, store, stats = tiny_target_and_answers(str(root / "data"))
    assert stats["answer_tokens"] > 0 and stats["batches"] == 3
    feats = FeatureCache(str(root / "features"), TCFG, target.params, TAPS, batch=8)
    ds = D.SequenceDataset(store, feats, SEQ_LEN)
    train_ids, held_ids = ds.split(20)
    assert len(held_ids) >= 2 and len(train_ids) >= 8
    return root, target, ds, train_ids, held_ids


def _trainer(setup, name, steps, vocab_ids=None, **kw):
    root, target, ds, train_ids, _ = setup
    init_flat = kw.pop("init_flat", None)
    tc = TrainConfig(steps=steps, batch=4, anchors=4, lr=kw.pop("lr", 3e-3), warmup=2, seed=0,
                     ckpt_every_s=kw.pop("ckpt_every_s", 1e9), **kw)
    return Trainer(DCFG, TCFG, target.params, ds, train_ids, tc, str(root / name / "ckpt"),
                   log_dir=str(root / name), progress=False, vocab_ids=vocab_ids,
                   init_flat=init_flat)


def test_data_shards_and_features(setup):
    root, target, ds, _, _ = setup
    assert len(ds) == 24
    t, f, h, L, E = ds.get(0)
    assert f.shape == (SEQ_LEN, len(TAPS) * TCFG.hidden_size)
    assert h.shape == (SEQ_LEN, TCFG.hidden_size)
    # Stored features equal a plain forward's taps over prompt + answer.
    from dominotree_jax.model.cache import KVCache
    from dominotree_jax.model.target import bind_target, causal_mask
    m = bind_target(TCFG, target.params)
    x = jnp.asarray(t[None, :E])
    out = m(x, jnp.arange(E)[None], causal_mask(1, E, E),
            KVCache.zeros(TCFG.num_hidden_layers, 1, E, 2, 16), jnp.zeros(1, jnp.int32),
            tap_layers=TAPS)
    np.testing.assert_allclose(f[:E].astype(np.float32), np.asarray(out.taps[0]), rtol=2e-2,
                               atol=2e-2)
    np.testing.assert_allclose(h[:E].astype(np.float32), np.asarray(out.hidden[0]), rtol=2e-2,
                               atol=2e-2)
    # The answer is the target's greedy continuation.
    logits = m.logits(out.hidden[0])
    np.testing.assert_array_equal(np.asarray(jnp.argmax(logits[L - 1:E - 1], -1)), t[L:E])
    b = D.make_batch(ds, [0, 1], anchors=3, block=4, rng=np.random.default_rng(0))
    a = b["anchors"][0]
    np.testing.assert_array_equal(b["labels"][0, :, 0], b["tokens"][0, a])
    # Soft targets: the target's distribution at position a + d predicts label d + 1.
    soft = np.asarray(target_soft_logits(TCFG, target.params, jax.tree.map(jnp.asarray, b)))
    full = np.asarray(m.logits(out.hidden[0]))
    t1, _, _, _, E1 = ds.get(0)
    for i in range(3):
        for d in range(4):
            p = int(b["soft_pos"][0, i, d])
            if p >= 0:
                assert b["labels"][0, i, d + 1] == t1[p + 1]
                np.testing.assert_allclose(soft[i, d], full[p], rtol=3e-2, atol=3e-2)


def test_curriculum_lambda():
    assert float(curriculum_lambda(0, 100)) == 1.0
    assert float(curriculum_lambda(25, 100)) == pytest.approx(0.5)
    assert float(curriculum_lambda(50, 100)) == 0.0
    assert float(curriculum_lambda(99, 100)) == 0.0


def test_fill_untrained_rows():
    w2 = jnp.arange(12.0).reshape(6, 2)
    out = fill_untrained_rows({"embed_proj.2.weight": w2, "fc.weight": w2}, np.array([1, 3]))
    kept = jnp.array([1, 3])
    np.testing.assert_array_equal(out["embed_proj.2.weight"][kept], w2[kept])
    np.testing.assert_array_equal(out["embed_proj.2.weight"][0], (w2[1] + w2[3]) / 2)
    assert out["fc.weight"] is w2


def test_loss_decreases(setup):
    root, target, ds, train_ids, _ = setup
    # The training softmax over the data's tokens only (the CPU recipe); eval: full vocab.
    vocab = D.active_vocab(ds, TCFG.vocab_size, first=0, multiple=8)
    assert len(vocab) % 8 == 0 and np.all(np.diff(vocab) > 0)
    tr = _trainer(setup, "decrease", 24, vocab_ids=vocab, lr=1e-2)
    fixed = D.make_batch(ds, train_ids[:8], anchors=6, block=4, rng=np.random.default_rng(1))

    def fixed_loss():
        m = evaluate(DCFG, tr.params, TCFG, target.params, ds, train_ids[:8], anchors=6,
                     batch=8, seed=1)
        return m["corr_loss"], m["base_loss"]

    c0, b0 = fixed_loss()
    hist = tr.fit()
    c1, b1 = fixed_loss()
    assert len(hist) == 24 and np.isfinite([h["loss"] for h in hist]).all()
    assert c1 < c0 - 0.5, (c0, c1)
    assert b1 < b0, (b0, b1)
    assert os.path.exists(os.path.join(tr.log_dir, "train_log.csv"))
    del fixed
    tr.close()


def test_resume_is_exact_and_export_loads(setup):
    a = _trainer(setup, "full", 6)
    full = a.fit()
    a.close()
    b = _trainer(setup, "killed", 6)
    b.fit(num_steps=3)                      # checkpoints at the end of fit
    mid = jax.tree.map(np.asarray, (b.flat, b.opt_state))
    del b                                   # "kill": the object and its state are gone
    c = _trainer(setup, "killed", 6)        # resumes from the checkpoint
    assert c.step == 3
    for x, y in zip(jax.tree.leaves(mid), jax.tree.leaves((c.flat, c.opt_state))):
        np.testing.assert_array_equal(x, np.asarray(y))
    rest = c.fit()
    assert [h["loss"] for h in rest] == [h["loss"] for h in full[3:]]
    for x, y in zip(jax.tree.leaves(a.flat), jax.tree.leaves(c.flat)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # Export in the released layout, load it back, evaluate.
    root, target, ds, _, held = setup
    out = str(root / "export")
    save_drafter(out, DCFG, c.params, dtype="bfloat16")
    cfg, params = load_drafter(out, target_cfg=TCFG)
    assert cfg == DCFG
    m = evaluate(cfg, params, TCFG, target.params, ds, held, anchors=4, batch=2)
    assert len(m["base_acc_d"]) == DCFG.num_draft_positions
    assert m["tau_corr"] >= 1.0
    c.close()


def test_soft_targets_and_warm_start(setup):
    root, target, ds, train_ids, _ = setup
    b = jax.tree.map(jnp.asarray, D.make_batch(ds, train_ids[:4], anchors=4, block=4,
                                               rng=np.random.default_rng(2)))
    a = _trainer(setup, "soft_a", 4, soft=0.5)
    state = a.params
    hard = loss_and_metrics(DCFG, TCFG, state, target.params, b, 0.0, None)[0]
    mixed = loss_and_metrics(DCFG, TCFG, state, target.params, b, 0.0, None, soft=0.5)[0]
    soft = loss_and_metrics(DCFG, TCFG, state, target.params, b, 0.0, None, soft=1.0)[0]
    # The loss is linear in the soft weight, and soft targets are a different loss.
    np.testing.assert_allclose(float(mixed), 0.5 * float(hard) + 0.5 * float(soft), rtol=1e-4)
    assert abs(float(soft) - float(hard)) > 1e-3
    hist = a.fit()
    assert len(hist) == 4 and np.isfinite([h["loss"] for h in hist]).all()
    a.close()
    # Warm start: a new run starts from the given parameters (not from a random init).
    w = _trainer(setup, "warm", 2, init_flat=a.flat)
    for k in a.flat:
        np.testing.assert_array_equal(np.asarray(w.flat[k]), np.asarray(a.flat[k]))
    w.close()


def test_tv_term_is_the_l1_to_the_target_distribution(setup):
    """``tv``: each head's term is ``(1-tv)·CE + tv·‖softmax(head) − p_target‖₁``; at ``tv =
    1`` and λ = 0 the loss is the depth-weighted mean of the corrected head's L1 (NumPy)."""
    from dominotree_jax.train.loss import block_logits, depth_weights
    root, target, ds, train_ids, _ = setup
    b = jax.tree.map(jnp.asarray, D.make_batch(ds, train_ids[:4], anchors=4, block=4,
                                               rng=np.random.default_rng(5)))
    a = _trainer(setup, "tv", 1)
    state = a.params
    a.close()
    hard = loss_and_metrics(DCFG, TCFG, state, target.params, b, 0.0, 4.0)[0]
    mixed = loss_and_metrics(DCFG, TCFG, state, target.params, b, 0.0, 4.0, tv=0.9)[0]
    tv = loss_and_metrics(DCFG, TCFG, state, target.params, b, 0.0, 4.0, tv=1.0)[0]
    np.testing.assert_allclose(float(mixed), 0.1 * float(hard) + 0.9 * float(tv), rtol=1e-4)
    blocks = block_logits(DCFG, TCFG, state, target.params, b)
    corr = np.asarray(blocks.corr, np.float64)
    q = np.exp(corr - corr.max(-1, keepdims=True))
    q /= q.sum(-1, keepdims=True)
    p_t = np.asarray(jax.nn.softmax(target_soft_logits(TCFG, target.params, b), -1), np.float64)
    l1 = np.abs(q - p_t).sum(-1)
    w = np.asarray(depth_weights(corr.shape[1], 4.0))[None, :] * (np.asarray(blocks.targets) >= 0)
    np.testing.assert_allclose(float(tv), (w * l1).sum() / w.sum(), rtol=1e-4)
    assert 0.0 < float(tv) < 2.0 and abs(float(tv) - float(hard)) > 1e-3
    with pytest.raises(ValueError, match="tv must lie in"):
        Trainer(DCFG, TCFG, target.params, ds, train_ids, TrainConfig(tv=1.5), str(root / "x"))


def test_heldout_curve_logged(setup):
    root, target, ds, _, held = setup
    tr = _trainer(setup, "curve", 4)

    def heldout(t):
        return evaluate(t.dcfg, t.params, TCFG, target.params, ds, held[:2], anchors=4,
                        batch=2, answer_frac=1.0)

    tr.fit(eval_fn=heldout, eval_every=2)
    tr.close()
    import json
    rows = [json.loads(x) for x in open(root / "curve" / "heldout_curve.jsonl")]
    assert [r["step"] for r in rows] == [0, 2, 4]
    assert rows[0]["labels_seen"] == 0 and rows[2]["labels_seen"] > rows[1]["labels_seen"] > 0
    assert len(rows[-1]["corr_acc_d"]) == DCFG.num_draft_positions


def test_checkpoint_every_step_then_final_save(setup):
    tr = _trainer(setup, "ckpt_each", 2, ckpt_every_s=0.0)
    assert len(tr.fit()) == 2            # the periodic checkpoint at the last step is reused
    assert tr._mgr.latest_step() == 2
    tr.close()


def test_grown_drafter_starts_as_the_original(setup):
    """Added layers copy the last one with zero output projections: identical draft logits."""
    from dominotree_jax.train.grow import grow_layers
    root, target, ds, train_ids, _ = setup
    a = _trainer(setup, "grow_src", 2)
    a.fit()
    b = jax.tree.map(jnp.asarray, D.make_batch(ds, train_ids[:4], anchors=4, block=4,
                                               rng=np.random.default_rng(3)))
    cfg3, flat3 = grow_layers(DCFG, {k: np.asarray(v) for k, v in a.flat.items()}, 3)
    assert cfg3.num_hidden_layers == 3 and "layers.2.mlp.up_proj.weight" in flat3
    assert not np.any(flat3["layers.1.self_attn.o_proj.weight"])
    root, target = setup[0], setup[1]
    tc = TrainConfig(steps=1, batch=4, anchors=4, warmup=1, seed=0, ckpt_every_s=1e9)
    g = Trainer(cfg3, TCFG, target.params, ds, train_ids, tc, str(root / "grown" / "ckpt"),
                log_dir=str(root / "grown"), progress=False, init_flat=flat3)
    one = loss_and_metrics(DCFG, TCFG, a.params, target.params, b, 0.0, None)
    three = loss_and_metrics(cfg3, TCFG, g.params, target.params, b, 0.0, None)
    np.testing.assert_allclose(float(three[0]), float(one[0]), rtol=1e-6)
    with pytest.raises(ValueError, match="only adds layers"):
        grow_layers(cfg3, flat3, 2)
    a.close()
    g.close()


def test_feature_cache_root_is_shared_by_data_set_name():
    from dominotree_jax.train.features import cache_root
    want = os.path.join("runs/features", "smollm2")
    assert cache_root("runs/features", "data/smollm2/") == want
    assert cache_root("runs/features", "data/smollm2") == want


def test_bf16_feature_cache_keeps_its_own_files_close_to_float32(setup):
    root, target, ds, _, _ = setup
    store = ds.store
    entry = store.entries("answers")[0]
    shard = store.read(entry)
    f32 = FeatureCache(str(root / "features"), TCFG, target.params, TAPS, batch=8)
    b16 = FeatureCache(str(root / "features"), TCFG, target.params, TAPS, batch=8,
                       precision="bfloat16")
    assert f32.path(entry) != b16.path(entry) and b16.path(entry).endswith("_bfloat16.npy")
    assert f32.path(entry).endswith(f"{entry['file'][:-4]}_taps0-1.npy")   # name kept
    a = f32.get(entry, shard).astype(np.float32)
    b = b16.get(entry, shard).astype(np.float32)
    assert os.path.exists(b16.path(entry)) and a.shape == b.shape
    rel = np.linalg.norm(a - b) / np.linalg.norm(a)
    assert 0 < rel < 0.05, rel          # bf16 weights round, but stay close
    from dominotree_jax.precision import PrecisionError
    with pytest.raises(PrecisionError, match="unknown feature precision 'int8'"):
        FeatureCache(str(root / "features"), TCFG, target.params, TAPS, precision="int8")


def test_dataset_from_a_later_shard(setup):
    root, target, ds, _, _ = setup
    store, feats = ds.store, ds.features
    later = D.SequenceDataset(store, feats, SEQ_LEN, first_shard=1)
    assert len(later) == 16               # shards 1 and 2 of 8 rows each
    np.testing.assert_array_equal(later.get(0)[0], ds.get(8)[0])
    np.testing.assert_array_equal(later.get(0)[1], ds.get(8)[1])
    only = D.SequenceDataset(store, feats, SEQ_LEN, max_shards=2, first_shard=1)
    assert len(only) == 8
    with pytest.raises(ValueError, match="first_shard 3 leaves no answer shard of 3"):
        D.SequenceDataset(store, feats, SEQ_LEN, first_shard=3)


def test_dataset_trims_answers_at_their_loop(setup):
    from dominotree_jax.train.data.loops import loop_end
    _, _, ds, _, _ = setup
    trimmed = D.SequenceDataset(ds.store, ds.features, SEQ_LEN, trim_loops=2)
    assert len(trimmed) == len(ds)                        # a cut keeps >= 2 answer tokens
    cut = 0
    for j in range(len(trimmed)):
        (t, L), (full, L0) = trimmed.row(j), ds.row(j)   # the same rows: each keeps >= 2 tokens
        assert L == L0
        end = loop_end(full[L:], 2)
        assert t.tolist() == full[:L + (len(full) - L if end is None else end)].tolist()
        cut += len(full) - len(t)
        tok, f, h, L1, E1 = trimmed.get(j)
        tok0, f0, h0, _, E0 = ds.get(j)
        if E0 == len(full):                                 # not cropped: same first rows
            assert E1 == len(t) and (tok[E1:] == -1).all()
            np.testing.assert_array_equal(tok[:E1], tok0[:E1])
            np.testing.assert_array_equal(f[:E1], f0[:E1])
    assert cut == trimmed.trimmed_tokens > 0             # the tiny target's answers do loop
    assert trimmed.num_tokens()[1] == ds.num_tokens()[1] - cut
    with pytest.raises(ValueError, match="trim_loops must be >= 0"):
        D.SequenceDataset(ds.store, ds.features, SEQ_LEN, trim_loops=-1)


def test_best_drafter_exports_only_what_beats_the_reference_and_earlier_exports(setup, tmp_path):
    from dominotree_jax.train.best import BestDrafter, recorded_reference_tau
    a = _trainer(setup, "best_src", 2)
    params = a.params
    a.close()
    best = BestDrafter(str(tmp_path), DCFG, reference_tau=1.5, reference="shipped")
    assert recorded_reference_tau(str(tmp_path), "shipped") == 1.5
    assert recorded_reference_tau(str(tmp_path), "other") is None
    assert not best.offer(params, {"tau_corr": 1.4}, step=10)
    assert not best.offer(params, {"tau_corr": 1.5}, step=11)     # a tie is no improvement
    assert not os.path.exists(best.dir)
    assert best.offer(params, {"tau_corr": 1.6, "tau_base": 1.2}, step=12)
    cfg, loaded = load_drafter(best.dir, target_cfg=TCFG)
    assert cfg == DCFG
    want = {k: np.asarray(v, np.float32) for k, v in state_to_flat(params).items()}
    got = state_to_flat(loaded)
    for k in want:   # the bf16 export of exactly these parameters
        np.testing.assert_allclose(np.asarray(got[k], np.float32), want[k], rtol=1e-2, atol=1e-2)
    assert not best.offer(params, {"tau_corr": 1.55}, step=13)     # below its own best
    # A resumed run keeps the record: the bar stays at its best export.
    again = BestDrafter(str(tmp_path), DCFG, reference_tau=1.5, reference="shipped")
    assert again.bar == 1.6 and again.record["step"] == 12
    assert again.record["metrics"] == {"tau_corr": 1.6, "tau_base": 1.2}
    # Against another reference the run starts a fresh record.
    other = BestDrafter(str(tmp_path), DCFG, reference_tau=1.1, reference="other")
    assert other.bar == 1.1 and other.record["step"] is None


def test_keep_best_measures_the_reference_once(setup, tmp_path):
    import dataclasses
    import types

    from dominotree_jax.train.run import keep_best
    root, target, ds, _, held = setup
    a = _trainer(setup, "keep_best", 2)
    ref_dir = str(tmp_path / "ref")
    save_drafter(ref_dir, DCFG, a.params, dtype="float32")
    calls = []

    def curve(cfg, params):
        calls.append(cfg)
        return evaluate(cfg, params, TCFG, target.params, ds, held[:2], anchors=4, batch=2,
                        answer_frac=1.0)

    args = types.SimpleNamespace(out=str(tmp_path / "run"), eval_every=2, keep_best=ref_dir)
    os.makedirs(args.out)
    best = keep_best(args, a, curve)
    want = curve(DCFG, a.params)["tau_corr"]
    assert best.bar == pytest.approx(want) and len(calls) == 2
    keep_best(args, a, curve)            # resumed: the recorded reference, no new evaluation
    assert len(calls) == 2
    other = str(tmp_path / "other_taps")
    save_drafter(other, dataclasses.replace(DCFG, target_layer_ids=(0, 2)), a.params,
                 dtype="float32")
    with pytest.raises(SystemExit, match=r"target_layer_ids \(0, 2\)"):
        keep_best(types.SimpleNamespace(out=str(tmp_path / "run2"), eval_every=2,
                                        keep_best=other), a, curve)
    with pytest.raises(SystemExit, match="--eval-every"):
        keep_best(types.SimpleNamespace(out=args.out, eval_every=0, keep_best=ref_dir), a, curve)
    a.close()


def test_run_settings_fix_the_feature_precision_and_default_old_runs(tmp_path):
    from dominotree_jax.train.run import RunSettings, parse_args
    new = str(tmp_path / "new")
    args = parse_args(["--shards", "2", "--feature-precision", "bfloat16"])
    assert RunSettings.from_args(args).resolve(new).feature_precision == "bfloat16"
    again = RunSettings.from_args(parse_args(["--feature-precision", "float32",
                                              "--ckpt-minutes", "1"]))
    fixed = again.resolve(new)
    assert fixed.feature_precision == "bfloat16"    # fixed by the first call
    assert fixed.train.ckpt_every_s == 60            # ... but the interval is this call's
    old = tmp_path / "old"
    old.mkdir()
    (old / "run.json").write_text(json.dumps({"data": "d", "shards": 3}))
    assert RunSettings().resolve(str(old)).feature_precision == "float32"


def test_run_settings_from_the_command_line_and_from_code_alike(tmp_path):
    """One settings object: the command line's defaults are ``RunSettings()``; its options map
    by name onto the settings and ``TrainConfig``; ``to_json`` round-trips; a run.json of v3
    (flat, taps as text, no recipe options) loads with the recipe of that time."""
    from dominotree_jax.train.run import RunSettings, parse_args
    assert RunSettings.from_args(parse_args([])) == RunSettings()
    cli = RunSettings.from_args(parse_args(
        ["--layers", "2", "--taps", "0,1", "--lr", "6e-4", "--anchor-mode", "all",
         "--draft-vocab", "64", "--no-curriculum", "--dtype", "bfloat16"]))
    code = RunSettings(layers=2, taps=(0, 1), draft_vocab=64, train=TrainConfig(
        steps=2000, lr=6e-4, anchor_mode="all", curriculum=False, precision="bfloat16"))
    assert cli == code
    assert RunSettings.from_json(json.loads(json.dumps(code.to_json()))) == code
    v3 = {"data": "data/smollm2", "shards": 175, "layers": 2, "intermediate": 1536,
          "taps": "1,15,27", "block_size": 8, "gru": 256, "emb": 128, "mask_token_id": 16,
          "steps": 3000, "batch": 8, "anchors": 12, "seq_len": 320, "lr": 0.0006,
          "warmup": 30, "gamma": 7.0, "soft": 0.0, "curriculum": False, "train_vocab": 8192,
          "heldout_pct": 5, "warm_start": "runs/v2/drafter", "grow_layers": None, "seed": 0}
    (tmp_path / "run.json").write_text(json.dumps(v3))
    got = RunSettings().resolve(str(tmp_path))
    assert got.taps == (1, 15, 27) and got.warm_start == "runs/v2/drafter"
    assert (got.shard_from, got.trim_loops, got.draft_vocab) == (0, 0, 0)
    assert got.train == TrainConfig(steps=3000, lr=0.0006, warmup=30, curriculum=False)
    with pytest.raises(ValueError, match="unknown run settings"):
        RunSettings.from_json({**v3, "colour": "red"})
    with pytest.raises(ValueError, match="drop --warm-start"):
        RunSettings(warm_start="shipped", train=TrainConfig(layer_init="target"))
    with pytest.raises(ValueError, match="--grow-layers needs --warm-start"):
        RunSettings(grow_layers=3)


def test_make_trainer_from_code_fixes_and_resumes_the_run(setup, tmp_path):
    """``make_trainer(RunSettings(...))``: the same trainer a command line builds, its settings
    fixed in run.json by the first call, a later call resuming the checkpoint with them."""
    from dominotree_jax.train.run import RunSettings, make_trainer
    root, target, ds, _, _ = setup
    settings = RunSettings(data=str(root / "data"), seq_len=SEQ_LEN, heldout_pct=20,
                           intermediate=96, taps=TAPS, block_size=4, gru=16, emb=16,
                           mask_token_id=127, draft_vocab=48,
                           train=TrainConfig(steps=2, batch=4, anchors=4, warmup=1))
    out = str(tmp_path / "run")
    tr, held = make_trainer(settings, target, out=out, features=str(tmp_path / "f"))
    assert tr.dcfg == settings.drafter_config(TCFG) and len(held) >= 2
    assert (tr.dcfg.target_layer_ids, tr.dcfg.draft_vocab_size) == (TAPS, 48)
    assert tr.tc == settings.train and len(ds) == len(tr.ds)
    tr.fit(num_steps=1)
    tr.save()
    tr.close()
    fixed = json.loads((tmp_path / "run" / "run.json").read_text())
    assert fixed["shards"] == 3 and fixed["train"]["steps"] == 2 and fixed["draft_vocab"] == 48
    other = dataclasses.replace(settings, layers=2, train=dataclasses.replace(
        settings.train, steps=5, ckpt_every_s=7.0))     # a later call's flags do not count
    again, _ = make_trainer(other, target, out=out, features=str(tmp_path / "f"))
    assert again.step == 1 and again.dcfg.num_hidden_layers == 1
    assert again.tc == dataclasses.replace(settings.train, ckpt_every_s=7.0)
    again.close()


def test_a_drafter_trains_against_a_hybrid_target(tmp_path):
    """Data, teacher-forced features (taps from Gated DeltaNet and attention layers) and
    training against a Qwen3.5-style hybrid target: the held-out loss falls."""
    target, store, stats = tiny_target_and_answers(str(tmp_path / "data"), prompts=16,
                                                   tcfg=HYBRID_TCFG)
    assert stats["answer_tokens"] > 0
    feats = FeatureCache(str(tmp_path / "features"), HYBRID_TCFG, target.params, TAPS, batch=8)
    ds = D.SequenceDataset(store, feats, SEQ_LEN)
    train_ids, held_ids = ds.split(20)
    tr = Trainer(DCFG, HYBRID_TCFG, target.params, ds, train_ids,
                 TrainConfig(steps=16, batch=4, anchors=4, lr=1e-2, warmup=2, seed=0,
                             ckpt_every_s=1e9), str(tmp_path / "run" / "ckpt"),
                 log_dir=str(tmp_path / "run"), progress=False)

    def held_loss():
        m = evaluate(DCFG, tr.params, HYBRID_TCFG, target.params, ds, train_ids[:8],
                     anchors=6, batch=8, seed=1)
        return m["corr_loss"]

    before = held_loss()
    hist = tr.fit()
    after = held_loss()
    tr.close()
    assert np.isfinite([h["loss"] for h in hist]).all()
    assert after < before - 0.1, (before, after)


def test_dspark_drafter_trains_its_heads_with_the_published_loss_mix(setup):
    """A trained drafter given DSpark's heads (``with_dspark_heads``) drafts as before at step 0;
    its loss is DeepSpec's mix (checked against NumPy on one batch); with ``backbone_lr=0``
    training moves the heads only and lowers the loss."""
    from dominotree_jax.train.grow import with_dspark_heads
    from dominotree_jax.train.loss import DSparkLoss, block_logits
    from dominotree_jax.model.state import flat_to_state
    root, target, ds, train_ids, _ = setup
    src = _trainer(setup, "dspark_src", 2)
    src.fit()
    cfg, flat = with_dspark_heads(DCFG, {k: np.asarray(v) for k, v in src.flat.items()}, 4)
    assert cfg.is_dspark and not cfg.is_domino and cfg.confidence_head
    assert not any(k.startswith(("prefix_gru.", "embed_proj.")) for k in flat)
    b = jax.tree.map(jnp.asarray, D.make_batch(ds, train_ids[:4], anchors=4, block=4,
                                               rng=np.random.default_rng(4)))
    flat["markov_head.markov_w2.weight"] = np.random.default_rng(5).normal(
        size=flat["markov_head.markov_w2.weight"].shape).astype(np.float32)
    flat["confidence_head.proj.weight"] = np.random.default_rng(6).normal(
        size=flat["confidence_head.proj.weight"].shape).astype(np.float32) * 0.1
    state = flat_to_state(cfg, {k: jnp.asarray(v) for k, v in flat.items()})
    weights = DSparkLoss(ce=0.3, l1=0.5, confidence=2.0)
    loss, m = loss_and_metrics(cfg, TCFG, state, target.params, b, 0.0, 4.0, dspark=weights)
    # NumPy: per depth 0.3 CE + 0.5 L1 + 2.0 BCE(conf, 1 - L1/2), weights exp(-d/4)
    blocks = block_logits(cfg, TCFG, state, target.params, b)
    corr, tgt = np.asarray(blocks.corr, np.float64), np.asarray(blocks.targets)
    p_t = np.asarray(jax.nn.softmax(target_soft_logits(TCFG, target.params, b), -1), np.float64)
    q = np.exp(corr - corr.max(-1, keepdims=True))
    q /= q.sum(-1, keepdims=True)
    l1 = np.abs(q - p_t).sum(-1)
    alpha = np.clip(1 - l1 / 2, 0, 1)
    lse = np.log(np.exp(corr - corr.max(-1, keepdims=True)).sum(-1)) + corr.max(-1)
    ce = lse - np.take_along_axis(corr, np.maximum(tgt, 0)[..., None], -1)[..., 0]
    w1 = np.asarray(flat["markov_head.markov_w1.weight"], np.float64)
    feats = np.concatenate([np.asarray(blocks.z, np.float64), w1[np.asarray(blocks.prev)]], -1)
    conf = feats @ np.asarray(flat["confidence_head.proj.weight"], np.float64)[0] \
        + float(flat["confidence_head.proj.bias"][0])
    bce = np.log1p(np.exp(conf)) - alpha * conf
    wd = np.exp(-np.arange(tgt.shape[1]) / 4.0)[None] * (tgt >= 0)
    want = (wd * (0.3 * ce + 0.5 * l1 + 2.0 * bce)).sum() / wd.sum()
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    assert np.isfinite(float(m["conf_mae"])) and 0 <= float(m["alpha"]) <= 1
    with pytest.raises(ValueError, match="DSpark drafter trains with its own loss mix"):
        loss_and_metrics(cfg, TCFG, state, target.params, b, 0.0, None, soft=0.5)
    # a frozen backbone: only the heads move, and the loss falls
    tc = TrainConfig(steps=12, batch=4, anchors=4, lr=1e-2, warmup=1, seed=0, ckpt_every_s=1e9,
                     backbone_lr=0.0, curriculum=False)
    tr = Trainer(cfg, TCFG, target.params, ds, train_ids, tc, str(root / "dspark" / "ckpt"),
                 log_dir=str(root / "dspark"), progress=False, init_flat=flat)
    before = {k: np.asarray(v) for k, v in tr.flat.items()}
    hist = tr.fit()
    for k, v in tr.flat.items():
        moved = not np.array_equal(before[k], np.asarray(v))
        assert moved == k.startswith(("markov_head.", "confidence_head.")), k
    assert np.mean([h["loss"] for h in hist[-3:]]) < np.mean([h["loss"] for h in hist[:3]])
    tr.close()
    src.close()


def test_dflash2_drafter_trains_its_selector(setup):
    """A DFlash2 drafter's loss is CE(base) + w · CE(selector over the base's candidates after
    the true previous token), checked against NumPy; training lowers it."""
    from dominotree_jax.model.drafter import init_drafter_params
    from dominotree_jax.model.state import flat_to_state
    from dominotree_jax.train.loss import block_logits
    root, target, ds, train_ids, _ = setup
    cfg = dataclasses.replace(DCFG, projector_type=None, gru_hidden_dim=0, emb_dim=0,
                              shift_label=False, conv_kernel=2, conv_group=8, selector_rank=4,
                              selector_top_k=5)
    flat = state_to_flat(init_drafter_params(cfg, 2))
    rng = np.random.default_rng(7)
    for name in ("candidate_selector.successor_codebook",
                 "candidate_selector.predecessor_codebook"):
        flat[name] = rng.normal(size=np.shape(flat[name])).astype(np.float32)
    state = flat_to_state(cfg, {k: jnp.asarray(v) for k, v in flat.items()})
    b = jax.tree.map(jnp.asarray, D.make_batch(ds, train_ids[:4], anchors=4, block=3,
                                               rng=np.random.default_rng(8)))
    loss, m = loss_and_metrics(cfg, TCFG, state, target.params, b, 0.0, None,
                               selector_weight=0.7)
    blocks = block_logits(cfg, TCFG, state, target.params, b)
    base, tgt = np.asarray(blocks.base, np.float64), np.asarray(blocks.targets)
    z, prev = np.asarray(blocks.z, np.float64), np.asarray(blocks.prev)
    pred = np.asarray(flat["candidate_selector.predecessor_codebook"], np.float64)
    succ = np.asarray(flat["candidate_selector.successor_codebook"], np.float64)
    proj = np.asarray(flat["candidate_selector.hidden_projection.weight"], np.float64)
    total = weights = 0.0
    for a in range(base.shape[0]):
        for d in range(base.shape[1]):
            if tgt[a, d] < 0:
                continue
            row = base[a, d]
            ce_b = np.log(np.exp(row - row.max()).sum()) + row.max() - row[tgt[a, d]]
            cand = np.argsort(-row, kind="stable")[:5]
            sc = row[cand] + (succ[cand] * (proj @ z[a, d])) @ pred[prev[a, d]]
            sel = 0.0
            if tgt[a, d] in cand:
                sel = np.log(np.exp(sc - sc.max()).sum()) + sc.max() \
                    - sc[list(cand).index(tgt[a, d])]
            total += ce_b + 0.7 * sel
            weights += 1.0
    np.testing.assert_allclose(float(loss), total / weights, rtol=1e-5)
    tc = TrainConfig(steps=10, batch=4, anchors=4, lr=1e-2, warmup=1, seed=0, ckpt_every_s=1e9,
                     curriculum=False, gamma=None)
    tr = Trainer(cfg, TCFG, target.params, ds, train_ids, tc, str(root / "dflash2" / "ckpt"),
                 log_dir=str(root / "dflash2"), progress=False, init_flat=flat)
    hist = tr.fit()
    assert np.mean([h["loss"] for h in hist[-3:]]) < np.mean([h["loss"] for h in hist[:3]])
    tr.close()
