"""Drafter training (SPEC §6) on a tiny random target: data, loss, exact resume, export."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dominotree_jax as dj
from convert.drafter import load_drafter, save_drafter
from dominotree_jax.config import DrafterConfig, TargetConfig
from dominotree_jax.model.target import init_target_params
from dominotree_jax.train import data as D
from dominotree_jax.train.loss import curriculum_lambda
from dominotree_jax.train.trainer import TrainConfig, Trainer, evaluate, fill_untrained_rows

TCFG = TargetConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    rope_theta=10000.0, architecture="LlamaForCausalLM")
TAPS = (0, 1)
DCFG = DrafterConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, block_size=4,
                     mask_token_id=127, num_target_layers=3, target_layer_ids=TAPS,
                     rope_theta=10000.0, shift_label=True, projector_type="domino",
                     gru_hidden_dim=16, emb_dim=16, pure_draft_prefix_len=1)
SEQ_LEN = 40


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    params = init_target_params(TCFG, seed=0)
    # Sharper random target so greedy continuations are not constant.
    params["embed_tokens"]["weight"][...] = params["embed_tokens"]["weight"][...] * 50.0
    target = dj.Target(TCFG, params, None)
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(1, 120, size=int(rng.integers(4, 20)))) for _ in range(24)]
    stats = D.generate_shards(target, prompts, str(root / "data"), taps=TAPS, max_new=20,
                              batch=8, log=lambda m: None)
    assert stats["gen_tokens"] > 0
    ds = D.ShardDataset(str(root / "data"), SEQ_LEN)
    train_ids, held_ids = D.split_indices(len(ds), 0.2, 0)
    return root, target, ds, train_ids, held_ids


def _trainer(setup, name, steps, vocab_ids=None, **kw):
    root, target, ds, train_ids, _ = setup
    tc = TrainConfig(steps=steps, batch=4, anchors=4, lr=kw.pop("lr", 3e-3), warmup=2, seed=0,
                     ckpt_every_s=1e9, **kw)
    return Trainer(DCFG, TCFG, target.params, ds, train_ids, tc, str(root / name / "ckpt"),
                   log_dir=str(root / name), progress=False, vocab_ids=vocab_ids)


def test_data_shards_and_features(setup):
    root, target, ds, _, _ = setup
    assert len(ds) == 24
    t, f, L, E = ds.get(0)
    assert f.shape == (SEQ_LEN, len(TAPS) * TCFG.hidden_size)
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
    # The answer is the target's greedy continuation.
    logits = m.logits(out.hidden[0])
    np.testing.assert_array_equal(np.asarray(jnp.argmax(logits[L - 1:E - 1], -1)), t[L:E])
    b = D.make_batch(ds, [0, 1], anchors=3, block=4, rng=np.random.default_rng(0))
    a = b["anchors"][0]
    np.testing.assert_array_equal(b["labels"][0, :, 0], b["tokens"][0, a])


def test_curriculum_lambda():
    assert float(curriculum_lambda(0, 100)) == 1.0
    assert float(curriculum_lambda(25, 100)) == pytest.approx(0.5)
    assert float(curriculum_lambda(50, 100)) == 0.0
    assert float(curriculum_lambda(99, 100)) == 0.0


def test_fill_untrained_rows():
    w2 = jnp.arange(12.0).reshape(6, 2)
    out = fill_untrained_rows({"embed_proj.2.weight": w2, "fc.weight": w2}, np.array([1, 3]))
    np.testing.assert_array_equal(out["embed_proj.2.weight"][jnp.array([1, 3])], w2[jnp.array([1, 3])])
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
