"""The log-probs ``DominoTreeRollout`` reports are the ones tunix's trainer computes for the same
tokens with the same weights (``tunix.rl.common.compute_per_token_logps`` at the rollout
temperature, through ``TunixCausalLM``), for any ``RolloutConfig`` and for prompts that hold the
pad id, under both readings of such pads (``prompt_pads``, docs/rl.md):

- ``"keep"``: the policy is ``TunixCausalLM(..., pad_id=PAD)``; a pad inside a prompt is a token
  the engine conditions on and the trainer scores with;
- ``"drop"``: a plain ``TunixCausalLM``; tunix's trainer skips every pad id, so the engine
  removes them from the prompt before decoding.

The two readings give different numbers on these prompts (so each comparison can fail), and a
last test runs the real SmolLM2 pair on multi-turn chat prompts (``<|im_end|>`` = pad inside).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("tunix", reason="google-tunix is not installed (make test installs it)")
from tunix.rl import common  # noqa: E402

from decode_helpers import FAST_XLA  # noqa: E402
from dominotree_jax.rollout import DominoTreeRollout, RolloutConfig, TunixCausalLM  # noqa: E402
from spec_fixtures import IntTokenizer, tiny_pair  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PAD = 0   # IntTokenizer: pad = eos = 0, as SmolLM2's <|im_end|>
PROMPTS = ["3 0 17 5", "40 1", "5 0 0 40 2 7", "7 9 0 9"]   # three hold the pad id inside
NEW = 10
CONFIGS = {"T0.7-p0.9-k20": dict(temperature=0.7, top_p=0.9, top_k=20),
           "T1.3-p0.8-k5": dict(temperature=1.3, top_p=0.8, top_k=5),
           "greedy": dict(temperature=0.0, top_p=None, top_k=None)}


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.fixture(scope="module")
def engines(pair):
    """``engines(reading, config name)``: one engine per pair of them, shared by the tests (an
    engine compiles its programs once; a new engine compiles them again)."""
    made = {}

    def get(reading, name):
        if (reading, name) not in made:
            made[reading, name] = engine(pair, reading, rollout_config(**CONFIGS[name]))
        return made[reading, name]
    return get


def rollout_config(**kw):
    base = dict(max_tokens_to_generate=NEW, max_prompt_length=8, eos_tokens=None,
                return_logprobs=True, seed=3)
    return RolloutConfig(**{**base, **kw})


def actor(pair, prompt_pads):
    tcfg, _, params = pair
    return TunixCausalLM.from_params(tcfg, params["target"],
                                     PAD if prompt_pads == "keep" else None)


def engine(pair, actor_reading, rc, **kw):
    """An engine on the actor of ``actor_reading`` (``actor``)."""
    _, dcfg, params = pair
    return DominoTreeRollout(rollout_actor=actor(pair, actor_reading), tokenizer=IntTokenizer(),
                             rollout_config=rc, drafter_config=dcfg,
                             drafter_params=params["drafter"], budget=6, node_topk=3,
                             top_m=16, compiler_options=FAST_XLA, **kw)


def trainer_inputs(out, width=NEW):
    """The arrays tunix's GRPO learner builds from a RolloutOutput."""
    comp = np.full((len(out.tokens), width), PAD, np.int32)
    for b, t in enumerate(out.tokens):
        comp[b, :len(t)] = t
    return np.asarray(out.left_padded_prompt_tokens), comp


def trainer_logps(model, prompt, completion, temperature):
    graphdef, state = nnx.split(model)
    return np.asarray(common.compute_per_token_logps(
        graphdef, state, prompt, completion, pad_id=PAD, eos_id=PAD,
        temperature=temperature))


@pytest.mark.parametrize("prompt_pads", ["keep", "drop"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_engine_logprobs_equal_tunix_trainer(pair, engines, prompt_pads, name):
    rc = rollout_config(**CONFIGS[name])
    eng = engines(prompt_pads, name)
    assert eng.prompt_pads == prompt_pads
    out = eng.generate(PROMPTS, rc)
    prompt, completion = trainer_inputs(out)
    assert (prompt[[0, 2, 3]] == PAD).sum() > 0 and all(PAD not in t for t in out.tokens)
    assert all(len(t) > 0 for t in out.tokens)
    theirs = trainer_logps(actor(pair, prompt_pads), prompt, completion, rc.temperature)
    mask = completion != PAD
    for b, lp in enumerate(out.logprobs):   # generate: the trainer's numbers, token by token
        np.testing.assert_allclose(lp, theirs[b, :len(lp)], atol=2e-5, rtol=1e-5)
    ours = np.asarray(eng.get_per_token_logps(prompt, completion))
    np.testing.assert_allclose(np.where(mask, ours, 0), np.where(mask, theirs, 0), atol=2e-5,
                               rtol=1e-5)
    # the other reading scores the same tokens differently (rows 0, 2, 3 hold inner pads)
    other = trainer_logps(actor(pair, {"keep": "drop", "drop": "keep"}[prompt_pads]), prompt,
                          completion, rc.temperature)
    assert np.abs(np.where(mask, other - theirs, 0)[[0, 2, 3]]).max() > 1e-2
    # filtered sampling: the reported log-probs are not those of the truncated distribution
    if rc.top_k:
        assert np.exp(np.concatenate(out.logprobs)).max() < 1.0


def test_drop_conditions_on_the_prompt_without_pads(engines):
    rc = rollout_config(**CONFIGS["greedy"])
    dropped = engines("drop", "greedy").generate(PROMPTS, rc)
    stripped = engines("drop", "greedy").generate(
        [" ".join(t for t in p.split() if t != "0") for p in PROMPTS], rc)
    kept = engines("keep", "greedy").generate(PROMPTS, rc)
    for a, b in zip(dropped.tokens, stripped.tokens):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(dropped.tokens, kept.tokens))
    # tunix's trainer still sees the prompts as given (it masks the pads itself)
    np.testing.assert_array_equal(trainer_inputs(dropped)[0], trainer_inputs(kept)[0])


def test_logp_temperature_is_the_rollout_configs(pair, engines):
    rc = rollout_config(**CONFIGS["T0.7-p0.9-k20"])
    eng = engines("keep", "T0.7-p0.9-k20")
    out = eng.generate(PROMPTS, rc)
    prompt, completion = trainer_inputs(out)
    at_rollout = np.asarray(eng.get_per_token_logps(prompt, completion))
    at_one = np.asarray(eng.get_per_token_logps(prompt, completion, temperature=1.0))
    np.testing.assert_allclose(
        at_one, trainer_logps(actor(pair, "keep"), prompt, completion, 1.0), atol=2e-5)
    assert np.abs(at_rollout - at_one).max() > 1e-2
    # without a rollout_config the engine uses the last generate's temperature
    bare = engine(pair, "keep", None)
    bare.generate(PROMPTS, rc)
    np.testing.assert_allclose(np.asarray(bare.get_per_token_logps(prompt, completion)),
                               at_rollout, atol=1e-6)


def test_conflicting_pad_readings_are_named(pair):
    rc = rollout_config()
    with pytest.raises(ValueError, match="prompt_pads='drop' disagrees"):
        engine(pair, "keep", rc, prompt_pads="drop")
    with pytest.raises(ValueError, match="prompt_pads='keep' disagrees"):
        engine(pair, "drop", rc, prompt_pads="keep")
    with pytest.raises(ValueError, match="prompt_pads must be one of"):
        engine(pair, "drop", rc, prompt_pads="strip")


@pytest.mark.slow
def test_real_smollm2_pair_multiturn_chat(smollm2_path):
    """SmolLM2-135M + its released drafter: multi-turn chat prompts (pad = eos = <|im_end|>
    after every turn), T = 0.7, top-p 0.9, top-k 20: generate's and get_per_token_logps' numbers
    equal tunix's trainer's through TunixCausalLM(pad_id=<|im_end|>)."""
    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_drafter_path
    p = dj.load_pair(smollm2_path, smollm2_drafter_path())
    tok = p.target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    assert pad == tok.convert_tokens_to_ids("<|im_end|>")
    chats = [[{"role": "user", "content": "Name a prime number."},
              {"role": "assistant", "content": "7."},
              {"role": "user", "content": "And one larger than 10?"}],
             [{"role": "system", "content": "You answer briefly."},
              {"role": "user", "content": "What is 3 + 4?"}]]
    texts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
             for c in chats]
    model = TunixCausalLM.from_params(p.target.config, p.target.params, pad)
    rc = RolloutConfig(max_tokens_to_generate=12, max_prompt_length=64, temperature=0.7,
                       top_p=0.9, top_k=20, seed=1, return_logprobs=True)
    eng = DominoTreeRollout(rollout_actor=model, tokenizer=tok, rollout_config=rc,
                            drafter_config=p.drafter_config, drafter_params=p.drafter_params,
                            budget=8, node_topk=4)
    assert eng.prompt_pads == "keep"
    out = eng.generate(texts, rc)
    prompt = np.asarray(out.left_padded_prompt_tokens)
    comp = np.full((len(texts), 12), pad, np.int32)
    for b, t in enumerate(out.tokens):
        comp[b, :len(t)] = t
    inner = [(row[np.argmax(row != pad):] == pad).sum() for row in prompt]
    assert min(inner) >= 2    # <|im_end|> after each turn, inside the prompt
    graphdef, state = nnx.split(model)
    theirs = np.asarray(common.compute_per_token_logps(
        graphdef, state, prompt, comp, pad_id=pad, eos_id=pad, temperature=0.7))
    for b, lp in enumerate(out.logprobs):
        np.testing.assert_allclose(lp, theirs[b, :len(lp)], atol=1e-4, rtol=1e-4)
    mask = comp != pad
    ours = np.asarray(eng.get_per_token_logps(prompt, comp))
    np.testing.assert_allclose(np.where(mask, ours, 0), np.where(mask, theirs, 0), atol=1e-4,
                               rtol=1e-4)
    # tunix's own reading (no pad_id) scores these tokens differently
    plain = TunixCausalLM.from_params(p.target.config, p.target.params)
    graphdef, state = nnx.split(plain)
    dropped = np.asarray(common.compute_per_token_logps(
        graphdef, state, prompt, comp, pad_id=pad, eos_id=pad, temperature=0.7))
    assert np.abs(np.where(mask, dropped - theirs, 0)).max() > 1e-2


@pytest.mark.parametrize("prompt_pads", ["keep", "drop"])
def test_trainer_logprobs_are_the_trainers_bits(pair, prompt_pads):
    """``trainer_logprobs=True``: generate's log-probs and get_per_token_logps equal tunix's
    compute_per_token_logps on the learner's arrays bit for bit (the default agrees to ~1e-5
    only, and differs in bits here); a narrowed rollout precision is refused."""
    rc = rollout_config(**CONFIGS["T0.7-p0.9-k20"])
    eng = engine(pair, prompt_pads, rc, trainer_logprobs=True)
    out = eng.generate(PROMPTS, rc)
    prompt, completion = trainer_inputs(out)
    theirs = trainer_logps(actor(pair, prompt_pads), prompt, completion, rc.temperature)
    for b, lp in enumerate(out.logprobs):
        np.testing.assert_array_equal(lp, theirs[b, :len(lp)])
    np.testing.assert_array_equal(np.asarray(eng.get_per_token_logps(prompt, completion)),
                                  theirs)
    plain = engine(pair, prompt_pads, rc).generate(PROMPTS, rc)
    for a, b in zip(plain.tokens, out.tokens):   # the same samples either way
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(plain.logprobs, out.logprobs))
    # after a policy update the trainer's program runs on the new parameters
    tcfg, dcfg, params = pair
    moved = jax.tree.map(lambda w: w * 1.01, params["target"])
    eng.update_params(moved)
    new = trainer_logps(actor((tcfg, dcfg, {**params, "target": moved}), prompt_pads), prompt,
                        completion, rc.temperature)
    np.testing.assert_array_equal(np.asarray(eng.get_per_token_logps(prompt, completion)), new)
    assert not np.array_equal(new, theirs)
    with pytest.raises(ValueError, match="trainer_logprobs computes the trainer's bits"):
        engine(pair, prompt_pads, rc, trainer_logprobs=True, precision="bfloat16")


@pytest.mark.slow
def test_real_smollm2_pair_trainer_logprobs_bit_for_bit(smollm2_path):
    """SmolLM2-135M + its released drafter, a GRPO-shaped batch (2 prompts x 2 samples, T 0.9):
    with ``trainer_logprobs=True`` the rollout's log-probs are tunix's trainer's, bit for bit."""
    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_drafter_path
    p = dj.load_pair(smollm2_path, smollm2_drafter_path())
    tok = p.target.tokenizer
    pad = tok.convert_tokens_to_ids("<|im_end|>")
    texts = [tok.apply_chat_template([{"role": "user", "content": q}],
                                     add_generation_prompt=True, tokenize=False)
             for q in ("What is 12 times 7?", "Name two rivers in Europe.") for _ in range(2)]
    model = TunixCausalLM.from_params(p.target.config, p.target.params, pad)
    rc = RolloutConfig(max_tokens_to_generate=16, max_prompt_length=64, temperature=0.9,
                       seed=5, return_logprobs=True)
    eng = DominoTreeRollout(rollout_actor=model, tokenizer=tok, rollout_config=rc,
                            drafter_config=p.drafter_config, drafter_params=p.drafter_params,
                            budget=8, node_topk=4, trainer_logprobs=True)
    out = eng.generate(texts, rc)
    prompt = np.asarray(out.left_padded_prompt_tokens)
    comp = np.full((len(texts), 16), pad, np.int32)
    for b, t in enumerate(out.tokens):
        comp[b, :len(t)] = t
    graphdef, state = nnx.split(model)
    theirs = np.asarray(common.compute_per_token_logps(
        graphdef, state, prompt, comp, pad_id=pad, eos_id=int(eng.eos_id()), temperature=0.9))
    assert sum(len(t) for t in out.tokens) > 20
    for b, lp in enumerate(out.logprobs):
        np.testing.assert_array_equal(lp, theirs[b, :len(lp)])
