"""Drafter v4 recipe options on a tiny random target (docs/training.md): target-layer init,
every-position anchors, accept-until-fail weighting, soft targets from stored top-k logits, the
curriculum schedule, and the two porting bugs to guard against (label alignment, tied LM
head)."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dominotree_jax as dj
from dominotree_jax.model.state import state_to_flat
from dominotree_jax.model.drafter import DrafterContext, bind_drafter
from dominotree_jax.model.target import bind_target, init_target_params
from dominotree_jax.train import dataset as D
from dominotree_jax.train.features import FeatureCache
from dominotree_jax.train.data.generate import generate_answers
from dominotree_jax.model.state import flat_to_state
from dominotree_jax.train.loss import (_ce, block_logits, curriculum_lambda,
                                       loss_and_metrics, topk_targets, until_fail_mask)
from dominotree_jax.train.data.shards import ShardStore
from dominotree_jax.train.target_init import target_layer_init
from dominotree_jax.train.trainer import TrainConfig, Trainer, evaluate, init_params
from dominotree_jax.tree.reference import gru_step_numpy
import train_fixtures

# Tied embeddings, as SmolLM2: the LM head is the embedding matrix.
TCFG = dataclasses.replace(train_fixtures.TCFG, vocab_size=96, tie_word_embeddings=True)
TAPS = train_fixtures.TAPS
DCFG = dataclasses.replace(train_fixtures.DCFG, vocab_size=96, num_hidden_layers=2,
                           mask_token_id=95)
SEQ_LEN = 40
TOPK = 6


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipe")
    params = init_target_params(TCFG, seed=1)
    assert "lm_head" not in state_to_flat(params) and not any(
        k.startswith("lm_head") for k in state_to_flat(params))
    params["embed_tokens"]["weight"][...] = params["embed_tokens"]["weight"][...] * 50.0
    target = dj.Target(TCFG, params, None)
    rng = np.random.default_rng(1)
    prompts = [list(rng.integers(1, 90, size=int(rng.integers(4, 16)))) for _ in range(16)]
    store = ShardStore(str(root / "data"), vocab_size=TCFG.vocab_size)
    # Half the shards with stored top-k logits, half without (mixed data sets are allowed).
    generate_answers(target, store, [(p, "a") for p in prompts[:8]], batch=8, max_new=16,
                     seed=0, store_topk=TOPK, log=lambda m: None)
    generate_answers(target, store, [(p, "b") for p in prompts[8:]], batch=8, max_new=16,
                     seed=0, log=lambda m: None)
    feats = FeatureCache(str(root / "features"), TCFG, target.params, TAPS, batch=8)
    ds = D.SequenceDataset(store, feats, SEQ_LEN)
    return root, target, store, ds


def _batch(ds, ids, **kw):
    kw.setdefault("anchors", 4)
    return jax.tree.map(jnp.asarray, D.make_batch(ds, ids, block=4,
                                                  rng=np.random.default_rng(0), **kw))


def _trainer(setup, name, steps, dcfg=DCFG, **kw):
    root, target, _, ds = setup
    tc = TrainConfig(steps=steps, batch=4, anchors=kw.pop("anchors", 4), lr=3e-3, warmup=1,
                     seed=0, ckpt_every_s=1e9, **kw)
    return Trainer(dcfg, TCFG, target.params, ds, np.arange(len(ds)), tc,
                   str(root / name / "ckpt"), log_dir=str(root / name), progress=False)


# ------------------------------------------------------------------ porting bugs

def test_label_alignment_matches_inference(setup):
    """Depth d of a block anchored at a predicts x_{a+d+1}; the block sees exactly the context
    rows < a (as decode after committing x_0..x_{a-1} with bonus x_a); the correction at depth
    d uses the GRU state after x_a..x_{a+d} (the NumPy reference GRU)."""
    _, target, _, ds = setup
    flat = init_params(DCFG, 0, target.params)
    flat["embed_proj.2.weight"] = 0.3 * jax.random.normal(
        jax.random.key(5), flat["embed_proj.2.weight"].shape)
    dparams = flat_to_state(DCFG, flat)
    b = _batch(ds, [0, 1])
    base, corr, tgt = block_logits(DCFG, TCFG, dparams, target.params, b)[:3]
    toks, anc = np.asarray(b["tokens"]), np.asarray(b["anchors"])
    drafter, tmod = bind_drafter(DCFG, dparams), bind_target(TCFG, target.params)
    head = drafter.head_weights(tmod)
    emb, wih, whh = (np.asarray(x, np.float32) for x in (head.embed, head.gru_w_ih,
                                                          head.gru_w_hh))
    w1, w2 = np.asarray(head.proj_w1, np.float32), np.asarray(head.proj_w2, np.float32)
    E = [ds.get(j)[4] for j in (0, 1)]
    for bi in range(2):
        for ai in range(4):
            n, a = bi * 4 + ai, int(anc[bi, ai])
            for d in range(4):   # labels: the token d + 1 after the anchor (or missing)
                want = toks[bi, a + d + 1] if a + d + 1 < E[bi] else -1
                assert int(tgt[n, d]) == want
            # Inference: a context holding positions < a only, t0 = x_a at position a.
            ctx = DrafterContext.zeros(DCFG, 1, SEQ_LEN)
            ctx = drafter.extend_context(ctx, b["feats"][bi:bi + 1, :a],
                                         jnp.arange(a)[None], jnp.zeros((1,), jnp.int32),
                                         jnp.full((1,), a, jnp.int32))
            z, ref = drafter.draft(tmod, ctx, b["tokens"][bi:bi + 1, a], jnp.array([a]))
            np.testing.assert_allclose(np.asarray(base[n]), np.asarray(ref[0]), rtol=1e-4,
                                       atol=1e-4)
            # Corrected depth d >= 1: state after x_a .. x_{a+d}.
            s = np.zeros(16, np.float32)
            for d in range(4):
                s = gru_step_numpy(emb[max(int(toks[bi, a + d]), 0)], s, wih, whh)
                if d < DCFG.pure_draft_prefix_len or a + d >= E[bi]:
                    continue
                zs = np.concatenate([np.asarray(z[0, d]), s])
                h = w1 @ zs
                want = np.asarray(ref[0, d]) + w2 @ (h / (1 + np.exp(-h)))
                np.testing.assert_allclose(np.asarray(corr[n, d]), want, rtol=1e-3, atol=1e-3)
    # The labels are the target's own greedy tokens: its argmax at position a + d is label d.
    t, _, h, L, E0 = ds.get(0)
    greedy = np.argmax(np.asarray(tmod.logits(jnp.asarray(h[:E0], jnp.float32))), -1)
    np.testing.assert_array_equal(greedy[L - 1:E0 - 1], t[L:E0])


def test_lm_head_honours_tied_embeddings(setup):
    """With tie_word_embeddings the drafter's base logits are z · embedᵀ (the target has no
    lm_head), also through the training vocabulary subset."""
    _, target, _, ds = setup
    dparams = flat_to_state(DCFG, init_params(DCFG, 0, target.params))
    b = _batch(ds, [2, 3])
    drafter, tmod = bind_drafter(DCFG, dparams), bind_target(TCFG, target.params)
    assert tmod.lm_head is None
    emb = np.asarray(target.params["embed_tokens"]["weight"][...], np.float32)
    np.testing.assert_array_equal(np.asarray(tmod.head_weight_VH), emb)
    base = block_logits(DCFG, TCFG, dparams, target.params, b).base
    ctx = DrafterContext.zeros(DCFG, 1, SEQ_LEN)
    a = int(b["anchors"][0, 0])
    ctx = drafter.extend_context(ctx, b["feats"][:1, :a], jnp.arange(a)[None],
                                 jnp.zeros((1,), jnp.int32), jnp.full((1,), a, jnp.int32))
    z, _ = drafter.draft(tmod, ctx, b["tokens"][:1, a], jnp.array([a]))
    np.testing.assert_allclose(np.asarray(base[0]), np.asarray(z[0]) @ emb.T, rtol=1e-4,
                               atol=1e-3)
    vocab = np.arange(0, 96, 2, dtype=np.int32)
    sub = block_logits(DCFG, TCFG, dparams, target.params, b, jnp.asarray(vocab)).base
    np.testing.assert_allclose(np.asarray(sub), np.asarray(base)[..., vocab], rtol=1e-5,
                               atol=1e-4)
    # An untied config reads lm_head instead: different logits from the same z.
    untied = dataclasses.replace(TCFG, tie_word_embeddings=False)
    up = init_target_params(untied, seed=1)
    assert not np.allclose(np.asarray(bind_target(untied, up).head_weight_VH),
                           np.asarray(bind_target(untied, up).embed_tokens.weight[...]))


# ------------------------------------------------------------------ a. target-layer init

def test_target_layer_init_copies_the_last_layers(setup):
    _, target, _, _ = setup
    tflat = state_to_flat(target.params)
    tr = _trainer(setup, "tinit", 2, layer_init="target")
    for i, src in ((0, 1), (1, 2)):     # 2 drafter layers <- target layers 1, 2
        for name in ("self_attn.q_proj.weight", "self_attn.o_proj.weight",
                     "mlp.down_proj.weight", "input_layernorm.weight",
                     "post_attention_layernorm.weight"):
            np.testing.assert_array_equal(np.asarray(tr.flat[f"layers.{i}.{name}"]),
                                          tflat[f"layers.{src}.{name}"])
    # Llama targets have no q/k norms: the drafter's stay at ones; the rest is untouched.
    np.testing.assert_array_equal(np.asarray(tr.flat["layers.0.self_attn.q_norm.weight"]), 1.0)
    rnd = init_params(DCFG, 0, target.params)
    np.testing.assert_array_equal(np.asarray(tr.flat["fc.weight"]), np.asarray(rnd["fc.weight"]))
    assert not np.array_equal(np.asarray(rnd["layers.0.mlp.up_proj.weight"]),
                              np.asarray(tr.flat["layers.0.mlp.up_proj.weight"]))
    hist = tr.fit()
    assert np.isfinite([h["loss"] for h in hist]).all()
    tr.close()
    bad = dataclasses.replace(DCFG, intermediate_size=80)
    with pytest.raises(ValueError, match="shape mismatch.*mlp.gate_proj"):
        target_layer_init(bad, TCFG, init_params(bad, 0), target.params)
    with pytest.raises(ValueError, match="cannot initialise 4 drafter layers"):
        four = dataclasses.replace(DCFG, num_hidden_layers=4)
        target_layer_init(four, TCFG, init_params(four, 0), target.params)
    with pytest.raises(ValueError, match="layer_init"):
        _trainer(setup, "tinit_bad", 1, layer_init="last")


# ------------------------------------------------------------------ b. every-position anchors

def test_all_anchors_cover_every_valid_position(setup):
    _, _, _, ds = setup
    b = D.make_batch(ds, [0, 1], anchors=SEQ_LEN, block=4, rng=np.random.default_rng(0),
                     anchor_mode="all")
    for i in range(2):
        _, _, _, L, E = ds.get(i)
        used = b["labels"][i, :, 0] >= 0
        np.testing.assert_array_equal(b["anchors"][i][used], np.arange(1, E - 1))
        assert not np.any(b["labels"][i][~used] >= 0)      # unused slots weigh nothing
    # A cap smaller than the answer keeps answer positions only, without repeats.
    L, E = ds.get(0)[3:]
    cap = 5
    c = D.make_batch(ds, [0], anchors=cap, block=4, rng=np.random.default_rng(0),
                     anchor_mode="all")
    a = c["anchors"][0]
    assert len(set(a.tolist())) == cap and np.all(a >= L - 1) and np.all(a <= E - 2)
    # Labels counted by the loss: one per existing label of every real anchor.
    tr = _trainer(setup, "allanc", 1, anchor_mode="all", anchors=SEQ_LEN)
    hist = tr.fit()
    tr.close()
    assert hist[0]["labels"] > 4 * 4 * 4   # more than the 4 sampled anchors x 4 depths x 4 rows
    with pytest.raises(ValueError, match="anchor_mode"):
        D.make_batch(ds, [0], anchors=2, block=4, rng=np.random.default_rng(0),
                     anchor_mode="every")


# ------------------------------------------------------------------ c. accept-until-fail

def test_until_fail_mask():
    c = jnp.array([[1, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1], [1, 1, 0, 0]], bool)
    v = jnp.array([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]], bool)
    np.testing.assert_array_equal(np.asarray(until_fail_mask(c, v)),
                                  [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]])
    np.testing.assert_allclose(np.asarray(until_fail_mask(c, v, 0.25))[0], [1, 1, .25, .25])


def test_until_fail_loss_weights_each_head_by_its_own_chain(setup):
    _, target, _, ds = setup
    flat = init_params(DCFG, 0, target.params)
    flat["embed_proj.2.weight"] = 0.3 * jax.random.normal(
        jax.random.key(5), flat["embed_proj.2.weight"].shape)
    dparams = flat_to_state(DCFG, flat)
    b = _batch(ds, [0, 1, 2, 3], anchors=6)
    base, corr, tgt = block_logits(DCFG, TCFG, dparams, target.params, b)[:3]
    valid = tgt >= 0
    w = jnp.exp(-jnp.arange(4) / 7.0)[None] * valid
    mb = until_fail_mask((jnp.argmax(base, -1) == tgt) & valid, valid)
    mc = until_fail_mask((jnp.argmax(corr, -1) == tgt) & valid, valid)
    for lam in (0.0, 0.3, 1.0):
        want = jnp.sum(w * ((1 - lam) * mc * _ce(corr, tgt) + lam * mb * _ce(base, tgt)))
        want = want / jnp.sum(w)
        got = loss_and_metrics(DCFG, TCFG, dparams, target.params, b, lam, 7.0,
                               until_fail=True)[0]
        np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
    plain = loss_and_metrics(DCFG, TCFG, dparams, target.params, b, 0.0, 7.0)[0]
    floor1 = loss_and_metrics(DCFG, TCFG, dparams, target.params, b, 0.0, 7.0,
                              until_fail=True, until_fail_floor=1.0)[0]
    np.testing.assert_allclose(float(floor1), float(plain), rtol=1e-6)
    assert float(jnp.sum(mc)) < float(jnp.sum(valid))    # the mask did cut something
    tr = _trainer(setup, "uaf", 2, until_fail=True)
    assert np.isfinite([h["loss"] for h in tr.fit()]).all()
    tr.close()


# ------------------------------------------------------------------ d. top-k soft targets

def test_collect_stores_topk_logits_aligned_with_answers(setup):
    _, target, store, ds = setup
    es = store.entries("answers")
    assert es[0]["topk"] == TOPK and "topk" not in es[1]
    shard = store.read(es[0])
    assert shard["topk_ids"].shape == (es[0]["answer_tokens"], TOPK)
    tmod = bind_target(TCFG, target.params)
    assert ds.topk_k == TOPK
    for j in range(3):
        t, _, h, L, E = ds.get(j)
        ids, vals = ds.get_topk(j)
        logits = np.asarray(tmod.logits(jnp.asarray(h[:E], jnp.float32)))
        # Position p holds the top-k predicting token p + 1; greedy answers: top-1 = next.
        np.testing.assert_array_equal(ids[L - 1:E - 1, 0], t[L:E])
        want = np.take_along_axis(logits[L - 1:E - 1], ids[L - 1:E - 1], -1)
        np.testing.assert_allclose(vals[L - 1:E - 1], want, rtol=3e-2, atol=0.3)
        assert np.all(np.diff(vals[L - 1:E - 1], axis=-1) <= 0)
        assert np.all(ids[:L - 1] == -1) and np.all(ids[E - 1:] == -1)
    # The second shard has none.
    j = next(j for j in range(len(ds)) if ds.index[j][0] == 1)
    assert np.all(ds.get_topk(j)[0] == -1)


def test_soft_topk_loss(setup):
    _, target, _, ds = setup
    dparams = flat_to_state(DCFG, init_params(DCFG, 0, target.params))
    rows = [j for j in range(len(ds)) if ds.index[j][0] == 0][:4]
    b = _batch(ds, rows, anchors=6)
    # This target is very sharp (top-1 ~ one-hot: KL = CE); soften the stored logits.
    b["topk_logits"] = b["topk_logits"] / 100.0
    cols, p, has = topk_targets(b)
    assert bool(jnp.any(has)) and np.allclose(np.asarray(jnp.sum(p, -1))[np.asarray(has)], 1.0)
    hard = loss_and_metrics(DCFG, TCFG, dparams, target.params, b, 0.0, None)[0]
    half = loss_and_metrics(DCFG, TCFG, dparams, target.params, b, 0.0, None, soft_topk=.5)[0]
    one = loss_and_metrics(DCFG, TCFG, dparams, target.params, b, 0.0, None, soft_topk=1.)[0]
    np.testing.assert_allclose(float(half), 0.5 * float(hard) + 0.5 * float(one), rtol=1e-4)
    assert abs(float(one) - float(hard)) > 1e-3
    # KL is >= 0 and 0 when the head's distribution is the renormalised top-k.
    from dominotree_jax.train.loss import _topk_kl
    logits = jnp.full(p.shape[:2] + (96,), -1e9).at[
        jnp.arange(p.shape[0])[:, None, None], jnp.arange(p.shape[1])[None, :, None],
        cols].set(jnp.log(jnp.maximum(p, 1e-30)))
    kl = _topk_kl(logits, cols, p, has)
    np.testing.assert_allclose(np.asarray(kl), 0.0, atol=1e-4)
    # Through a vocabulary subset: ids outside it are dropped and the rest renormalised.
    vocab = np.arange(0, 96, 2, dtype=np.int32)
    index = np.full(96, -1, np.int32)
    index[vocab] = np.arange(len(vocab))
    cs, ps, hs = topk_targets(b, jnp.asarray(index))
    assert np.all(np.asarray(ps)[np.asarray(hs)].sum(-1) > 0.999)
    ids = np.asarray(b["topk_ids"])
    assert np.any(ids % 2 == 1) and np.all((np.asarray(ps) == 0) | (np.asarray(cs) >= 0))
    tr = _trainer(setup, "softk", 2, soft_topk=0.5)
    assert np.isfinite([h["loss"] for h in tr.fit()]).all()
    tr.close()
    with pytest.raises(ValueError, match="one kind of soft"):
        loss_and_metrics(DCFG, TCFG, dparams, target.params, b, 0.0, None, soft=.5,
                         soft_topk=.5)


# ------------------------------------------------------------------ e. curriculum

def test_curriculum_schedule_and_heldout_curves(setup):
    lam = [float(curriculum_lambda(s, 100, hold=0.2, ramp=0.4, end=0.1)) for s in
           (0, 20, 40, 60, 99)]
    np.testing.assert_allclose(lam, [1.0, 1.0, 0.55, 0.1, 0.1], rtol=1e-6)
    assert float(curriculum_lambda(25, 100)) == pytest.approx(0.5)   # the default schedule
    root, target, _, ds = setup
    tr = _trainer(setup, "curric", 4, lam_hold=0.5, lam_ramp=0.25, lam_end=0.2)

    def heldout(t):
        return evaluate(t.dcfg, t.params, TCFG, target.params, ds, [0, 1], anchors=4,
                        batch=2, answer_frac=1.0)

    hist = tr.fit(eval_fn=heldout, eval_every=2)
    tr.close()
    np.testing.assert_allclose([h["lam"] for h in hist], [1.0, 1.0, 1.0, 0.2], rtol=1e-6)
    rows = [json.loads(x) for x in open(root / "curric" / "heldout_curve.jsonl")]
    for r in rows:   # per-depth base AND corrected accuracy in the held-out curve
        assert len(r["base_acc_d"]) == len(r["corr_acc_d"]) == DCFG.num_draft_positions


# ------------------------------------------------------------------ precision of the step

def test_bf16_training_step_keeps_float32_master_weights(setup):
    """``TrainConfig(precision="bfloat16")``: the forward runs on bf16 copies (target and
    drafter), the trained parameters stay float32 and take a step close to, but not the same
    as, the float32 step's; an unknown precision is refused by name."""
    steps = {}
    for dtype in ("float32", "bfloat16"):
        tr = _trainer(setup, f"prec_{dtype}", 2, precision=dtype)   # (step 0: lr 0, warm-up)
        before = {k: np.array(v, copy=True) for k, v in tr.flat.items()}
        assert all(v.dtype == jnp.float32 for v in jax.tree.leaves(tr.train_tparams)) == (
            dtype == "float32")
        hist = tr.fit()
        assert np.isfinite(hist[-1]["loss"]) and hist[-1]["grad_norm"] > 0
        assert all(v.dtype == jnp.float32 for v in tr.flat.values())
        steps[dtype] = {k: np.asarray(tr.flat[k]) - before[k] for k in before}
        tr.close()
    names = [k for k in steps["float32"] if np.abs(steps["float32"][k]).max() > 0]
    assert names
    for k in names:
        a, b = steps["float32"][k], steps["bfloat16"][k]
        # Adam's first step is ~lr * sign(grad): the two agree on almost every element's sign
        assert np.mean(np.sign(a) == np.sign(b)) > 0.9, k
    assert any(not np.array_equal(steps["float32"][k], steps["bfloat16"][k]) for k in names)
    with pytest.raises(ValueError, match="unknown training precision 'float64'"):
        _trainer(setup, "prec_bad", 1, precision="float64")


def test_collect_in_bf16_records_the_precision(setup):
    """Generation on a bf16 target (``collect --dtype bfloat16``) answers the prompts and the
    shard's manifest entry names the precision it was generated in."""
    from dominotree_jax.precision import cast_params
    root, target, _, _ = setup
    for dtype in ("float32", "bfloat16"):
        store = ShardStore(str(root / f"prec_data_{dtype}"), vocab_size=TCFG.vocab_size)
        t = dj.Target(TCFG, cast_params(target.params, dtype), None)
        s = generate_answers(t, store, [([5, 6, 7, 8], "a"), ([9, 10], "b")], batch=2,
                             max_new=6, seed=0, log=lambda m: None)
        assert s["rows"] == 2 and s["answer_tokens"] > 0
        assert store.entries("answers")[0]["dtype"] == dtype
