"""One of two processes joined by ``jax.distributed.initialize`` on 127.0.0.1 (gloo CPU
collectives, 2 host devices each), run by ``test_rl_multidevice.py``:

- a ``decode`` sharded over the 4 global devices (batch on ``"data"``, parameters replicated,
  each process feeding its own rows) gives the tokens of a single-device ``decode`` of the
  whole batch;
- the rollout engine: each process calls ``DominoTreeRollout.generate`` with its own half of
  a step's prompts (parameters replicated over the global mesh); its completions and
  log-probs, and its ``get_per_token_logps``, equal those rows of a single-process engine
  given every prompt (same seed, temperature 0.9).

Usage: ``multihost_worker.py PROCESS_ID PORT``. Prints ``ok ...``; exits non-zero on a failure.
"""

from __future__ import annotations

import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from tunix.rl.rollout import base_rollout  # noqa: E402

from dominotree_jax import DecodeConfig  # noqa: E402
from dominotree_jax.rollout import DominoTreeRollout, TunixCausalLM  # noqa: E402
from dominotree_jax.sharding import DATA, make_mesh  # noqa: E402
from decode_helpers import FAST_XLA, jit_decode  # noqa: E402
from spec_fixtures import IntTokenizer, tiny_pair  # noqa: E402

PROMPT_BT = np.array([[3, 17, 5, 9, 33], [40, 1, 0, 0, 0], [7, 7, 21, 0, 0], [5, 60, 2, 8, 1]],
                     np.int32)
LENGTHS_B = np.array([5, 2, 3, 5], np.int32)


def main(process_id: int, port: int) -> int:
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=process_id)
    assert jax.process_count() == 2 and jax.device_count() == 4, jax.devices()
    tcfg, dcfg, params = tiny_pair()
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method="dominotree", max_new_tokens=12,
                       budget=6, node_topk=3, top_m=16, return_logprobs=True)
    run = jit_decode()
    # the single-process reference: this process's first device, the whole batch
    local = jax.local_devices()[0]
    ref = run(jax.device_put(params, local), jax.device_put(PROMPT_BT, local), config=cfg,
              prompt_lengths=jax.device_put(LENGTHS_B, local))
    ref_tokens = np.asarray(ref.tokens)

    mesh = make_mesh(data=4, model=1)          # over the 4 global devices
    replicated = NamedSharding(mesh, P())
    gparams = jax.tree.map(lambda x: jax.make_array_from_callback(
        np.shape(x), replicated, lambda idx, x=np.asarray(x): x[idx]), params)
    rows = slice(2 * process_id, 2 * process_id + 2)   # this process's share of the batch
    prompt = jax.make_array_from_process_local_data(NamedSharding(mesh, P(DATA, None)),
                                                    PROMPT_BT[rows], PROMPT_BT.shape)
    lengths = jax.make_array_from_process_local_data(NamedSharding(mesh, P(DATA)),
                                                     LENGTHS_B[rows], LENGTHS_B.shape)
    out = run(gparams, prompt, config=cfg, prompt_lengths=lengths)
    tokens = np.asarray(multihost_utils.process_allgather(out.tokens, tiled=True))
    logp = np.asarray(multihost_utils.process_allgather(out.logprobs, tiled=True))
    np.testing.assert_array_equal(tokens, ref_tokens)
    np.testing.assert_allclose(logp, np.asarray(ref.logprobs), atol=1e-4)
    print(f"ok process {process_id}: 2-process sharded decode {tokens.shape} equals the "
          f"single-process one", flush=True)
    check_engine(process_id, tcfg, dcfg, jax.device_put(params, local), gparams)
    jax.distributed.shutdown()
    return 0


PROMPTS = ["3 17 5 9", "40 1", "5 12 40 2 2 7", "7", "9 9 1", "21 30 11", "60", "2 8 1 4"]


def check_engine(process_id: int, tcfg, dcfg, local_params, global_params):
    """Each process generates its half of ``PROMPTS`` through the engine on the global mesh;
    the rows equal a single-process engine's over all of them."""
    rc = base_rollout.RolloutConfig(max_tokens_to_generate=8, max_prompt_length=8,
                                    temperature=0.9, top_p=None, seed=3, return_logprobs=True)

    def engine(params):
        return DominoTreeRollout(
            rollout_actor=TunixCausalLM.from_params(tcfg, params["target"], 0),
            tokenizer=IntTokenizer(), drafter_config=dcfg, drafter_params=params["drafter"],
            budget=6, node_topk=3, compiler_options=FAST_XLA)

    single, multi = engine(local_params), engine(global_params)
    ref = single.generate(PROMPTS, rc)
    half = len(PROMPTS) // 2
    rows = slice(half * process_id, half * (process_id + 1))
    out = multi.generate(PROMPTS[rows], rc)
    assert multi.last.prompt_BT.shape[0] == len(PROMPTS) and not \
        multi.last.prompt_BT.is_fully_addressable
    assert len(out.tokens) == half
    for a, b, x, y in zip(ref.tokens[rows], out.tokens, ref.logprobs[rows], out.logprobs):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(x, y, atol=1e-4)
    np.testing.assert_array_equal(out.left_padded_prompt_tokens,
                                  ref.left_padded_prompt_tokens[rows])
    assert any(len(t) > 1 for t in out.tokens)
    # the trainer's old-policy log-probs: this process's rows in, its rows out
    C = max(len(t) for t in ref.tokens)
    completion_BC = np.zeros((len(PROMPTS), C), np.int32)
    for b, t in enumerate(ref.tokens):
        completion_BC[b, :len(t)] = t
    want = np.asarray(single.get_per_token_logps(ref.left_padded_prompt_tokens, completion_BC))
    got = np.asarray(multi.get_per_token_logps(out.left_padded_prompt_tokens,
                                               completion_BC[rows]))
    np.testing.assert_allclose(got, want[rows], atol=1e-5)
    print(f"ok process {process_id}: engine rollouts of its {half} prompts (and their "
          f"log-probs) equal the single-process engine's rows {rows.start}..{rows.stop - 1}; "
          f"tau {multi.last.tau:.2f}", flush=True)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
