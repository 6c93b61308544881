"""GRPO with DominoTree rollouts: SmolLM2-135M-Instruct learns to answer additions exactly,
and its drafter either stays frozen or follows the policy.

Each step draws ``--prompts`` addition questions ("What is 37 + 18? Reply with only the
number."), samples ``--group`` completions of each at temperature 1 with the tunix rollout
engine (``DominoTreeRollout``: speculative decoding, lossless, so the samples are exactly the
policy's), rewards 1 when a completion's answer (the integer after its last "=", else its
first integer) is exactly the sum, normalises rewards within each group (advantages), and
takes one AdamW step on the clipped policy-gradient objective with log-probs from a
differentiable teacher-forced forward. The rollout's own log-probs are the old-policy
log-probs (the printed gap to the teacher-forced ones is ~1e-6).

Drafter: ``--drafter frozen`` keeps the shipped drafter. ``--drafter refresh`` takes one
drafter step per RL step on the rollout's own tapped target features (``decode(...,
return_features=True)``: no extra target forward; the offline training loss) and loads the
new drafter into the engine every ``--refresh-every`` steps. Both runs log, per step: reward,
live acceptance τ (tokens per target forward), rollout tokens/s and compile counts; the refresh
run also logs the teacher-forced chain τ of the frozen and of the current drafter on each step's
fresh rollouts (before the step trains on them).

    nice -n 10 python examples/grpo_smollm2.py --drafter frozen  --out benchmarks/results/grpo
    nice -n 10 python examples/grpo_smollm2.py --drafter refresh --out benchmarks/results/grpo
    python examples/grpo_smollm2.py --report benchmarks/results/grpo   # table + plot

``--model tiny`` runs the same loop on a tiny random model with a character tokenizer
(``tests/test_rl_example.py``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dominotree_jax.rollout import DominoTreeRollout, RolloutConfig, completion_logprobs
from dominotree_jax.rollout.drafter_refresh import DrafterRefresher

FIELDS = ("step", "reward", "tau", "tok_s", "rollout_s", "update_s", "tokens", "chain_tau_frozen",
          "chain_tau_current", "drafter_loss", "logprob_gap", "rollout_compiles",
          "update_compiles", "refresh_compiles")
QUESTION = "What is {a} + {b}? Reply with only the number."
FAST_XLA = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


# ---------------------------------------------------------------------------- task
def questions(rng: random.Random, n: int, lo: int, hi: int) -> list[tuple[int, int]]:
    return [(rng.randint(lo, hi), rng.randint(lo, hi)) for _ in range(n)]


def answer(text: str) -> int | None:
    """The completion's answer: the integer after its last "=", else its first integer."""
    tail = text.rsplit("=", 1)[1] if "=" in text else text
    m = re.search(r"-?\d+", tail)
    return int(m.group()) if m else None


def reward(text: str, a: int, b: int) -> float:
    """1 when the answer is exactly ``a + b``, else 0."""
    return float(answer(text) == a + b)


def group_advantages(r_B: np.ndarray, group: int) -> np.ndarray:
    r_PG = r_B.reshape(-1, group)
    return ((r_PG - r_PG.mean(1, keepdims=True)) / (r_PG.std(1, keepdims=True) + 1e-4)).ravel()


# ---------------------------------------------------------------------------- models
class CharTokenizer:
    """Characters of the task text as ids 2.. (0 pad, 1 end): for the tiny random model."""
    CHARS = "0123456789+-=?. abcdefghijklmnopqrstuvwxyzWR"

    def encode(self, text, **kw):
        return [2 + self.CHARS.index(c) for c in text if c in self.CHARS]

    def decode(self, ids, **kw):
        return "".join(self.CHARS[i - 2] for i in ids if 2 <= i < 2 + len(self.CHARS))

    def bos_id(self):
        return None

    def eos_id(self):
        return 1

    def pad_id(self):
        return 0


class Task:
    """Models, tokenizer and prompt encoding for ``--model smollm2`` or ``tiny``."""

    def __init__(self, kind: str):
        if kind == "smollm2":
            import dominotree_jax as dj
            from dominotree_jax.assets import smollm2_drafter_path, smollm2_gguf_path
            pair = dj.load_pair(smollm2_gguf_path(), smollm2_drafter_path())
            self.target, self.tokenizer = pair.target, pair.target.tokenizer
            self.tcfg, self.tparams = pair.target.config, pair.target.params
            self.dcfg, self.dparams = pair.drafter_config, pair.drafter_params
            self.stop_ids = list(pair.target.eos_ids)
            self.encode = pair.target.chat_prompt
            self.operands, self.compiler_options = (1, 9), None
        elif kind == "tiny":
            from dominotree_jax.config import DrafterConfig, TargetConfig
            from dominotree_jax.model.drafter import init_drafter_params
            from dominotree_jax.model.target import init_target_params
            self.tcfg = TargetConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=8, rope_theta=1e4)
            self.dcfg = DrafterConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=8, block_size=4,
                                      mask_token_id=63, num_target_layers=2,
                                      target_layer_ids=(0, 1), projector_type="domino",
                                      gru_hidden_dim=16, emb_dim=8)
            self.tparams = init_target_params(self.tcfg, 0)
            self.dparams = init_drafter_params(self.dcfg, 1)
            self.tokenizer = CharTokenizer()
            self.target = None
            self.stop_ids = [1]
            self.encode = self.tokenizer.encode
            self.operands, self.compiler_options = (1, 9), FAST_XLA
        else:
            raise ValueError(f"unknown model {kind!r}: smollm2 or tiny")


# ---------------------------------------------------------------------------- GRPO step
def make_update(tcfg, opt, clip_eps: float, traces: list):
    """Jitted ``update(params, opt_state, prompt_BT, lengths_B, tokens_BN, num_B, old_BN,
    adv_B)``: one step on the clipped objective, sequence-mean over tokens, batch mean."""

    def update(params, opt_state, prompt_BT, lengths_B, tokens_BN, num_B, old_BN, adv_B):
        traces.append(tokens_BN.shape)   # once per compilation
        T = prompt_BT.shape[1]
        prompt_valid_BT = jnp.arange(T)[None] < lengths_B[:, None]
        valid_BN = jnp.arange(tokens_BN.shape[1])[None] < num_B[:, None]
        toks_BN = jnp.maximum(tokens_BN, 0)

        def loss_fn(p):
            logp_BN = completion_logprobs(p, tcfg, prompt_BT, toks_BN, prompt_valid_BT,
                                          valid_BN)
            ratio_BN = jnp.exp(logp_BN - old_BN)
            obj_BN = jnp.minimum(ratio_BN * adv_B[:, None],
                                 jnp.clip(ratio_BN, 1 - clip_eps, 1 + clip_eps) * adv_B[:, None])
            per_row = jnp.sum(jnp.where(valid_BN, obj_BN, 0), 1) / jnp.maximum(num_B, 1)
            return -jnp.mean(per_row), logp_BN

        (loss, logp_BN), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        gap = jnp.max(jnp.where(valid_BN, jnp.abs(logp_BN - old_BN), 0))
        return optax.apply_updates(params, updates), opt_state, loss, gap

    return jax.jit(update, donate_argnums=(1,))   # (the engine holds the parameters)


# ---------------------------------------------------------------------------- the loop
def main(model: str = "smollm2", steps: int = 30, prompts: int = 4, group: int = 4,
         max_new: int = 12, lr: float = 2e-5, drafter: str = "frozen", refresh_every: int = 4,
         drafter_lr: float = 3e-4, seed: int = 0, budget: int = 16, node_topk: int = 4,
         top_m: int = 32, out: str | None = None, verbose: bool = True) -> dict:
    if drafter not in ("frozen", "refresh"):
        raise ValueError(f"--drafter must be frozen or refresh, got {drafter!r}")
    task = Task(model)
    eng = DominoTreeRollout(rollout_actor=task.target or _Bundle(task.tcfg, task.tparams),
                            tokenizer=task.tokenizer, drafter_config=task.dcfg,
                            drafter_params=task.dparams, method="dominotree", budget=budget,
                            node_topk=node_topk, top_m=top_m, seed=seed,
                            return_features=drafter == "refresh",
                            compiler_options=task.compiler_options)
    rc = RolloutConfig(max_tokens_to_generate=max_new, temperature=1.0, top_p=1.0, top_k=None,
                       max_prompt_length=48 if model == "smollm2" else 24,
                       eos_tokens=task.stop_ids, return_logprobs=True, seed=None)
    opt = optax.adamw(lr, b1=0.9, b2=0.99, weight_decay=0.0)
    params = eng.params["target"]
    opt_state = opt.init(params)
    update_traces: list = []
    update = make_update(task.tcfg, opt, 0.2, update_traces)
    refresher = frozen_flat = None
    if drafter == "refresh":
        refresher = DrafterRefresher(task.dcfg, task.tcfg, task.dparams, lr=drafter_lr,
                                     compiler_options=task.compiler_options)
        frozen_flat = jax.tree.map(jnp.copy, refresher.flat)
    settings = dict(model=model, steps=steps, prompts=prompts, group=group, max_new=max_new,
                    lr=lr, drafter=drafter, refresh_every=refresh_every, drafter_lr=drafter_lr,
                    seed=seed, budget=budget, node_topk=node_topk, top_m=top_m)
    rng = random.Random(seed)
    key = jax.random.key(seed + 1)
    rows = []
    for step in range(steps):
        qs = questions(rng, prompts, *task.operands)
        ids = [task.encode(QUESTION.format(a=a, b=b)) for a, b in qs for _ in range(group)]
        res = eng.generate(ids, rc)
        last = eng.last
        r_B = np.array([reward(t, a, b) for t, (a, b) in
                        zip(res.text, [q for q in qs for _ in range(group)])])
        adv_B = jnp.asarray(group_advantages(r_B, group), jnp.float32)
        t0 = time.perf_counter()
        params, opt_state, loss, gap = update(params, opt_state, last.prompt_BT, last.lengths_B,
                                              last.out.tokens, last.out.num_tokens,
                                              last.out.logprobs, adv_B)
        jax.block_until_ready(params)
        update_s = time.perf_counter() - t0
        eng.update_params(params)
        # drafter: acceptance of the frozen and the current drafter on these fresh rollouts
        key, k_eval, k_step = jax.random.split(key, 3)
        tau_frozen = tau_current = d_loss = float("nan")   # (a frozen run has no features)
        if drafter == "refresh":
            tau_frozen = refresher.chain_tau(params, last, k_eval, flat=frozen_flat)
            tau_current = refresher.chain_tau(params, last, k_eval)
            d_loss = refresher.step(params, last, k_step)["loss"]
            if (step + 1) % refresh_every == 0:
                eng.update_drafter_params(refresher.state)
        row = {"step": step, "reward": float(r_B.mean()), "tau": last.tau,
               "tok_s": last.num_tokens / last.seconds, "rollout_s": last.seconds,
               "update_s": update_s, "tokens": last.num_tokens,
               "chain_tau_frozen": tau_frozen, "chain_tau_current": tau_current,
               "drafter_loss": d_loss, "logprob_gap": float(gap),
               "rollout_compiles": eng.num_compilations, "update_compiles": len(update_traces),
               "refresh_compiles": len(refresher.traces) if refresher else 0}
        rows.append(row)
        if out:   # after every step, so a run cut short still leaves its table
            write_run(out, drafter, rows, settings)
        if verbose:
            print(f"step {step:3d} reward {row['reward']:.3f} tau {row['tau']:.2f} "
                  f"({row['tok_s']:.1f} tok/s, rollout {last.seconds:.1f}s, update "
                  f"{update_s:.1f}s) chain tau frozen {tau_frozen:.2f} current "
                  f"{tau_current:.2f} |logp gap| {row['logprob_gap']:.1e} compiles "
                  f"rollout/update/refresh {row['rollout_compiles']}/"
                  f"{row['update_compiles']}/{row['refresh_compiles']}", flush=True)
    return {"rows": rows, "compiles": {"rollout": eng.num_compilations,
                                       "update": len(update_traces),
                                       "refresh": len(refresher.traces) if refresher else 0}}


class _Bundle:
    """A ``dj.Target``-like pair of config and parameters (what the engine accepts)."""

    def __init__(self, config, params):
        self.config, self.params = config, params


# ---------------------------------------------------------------------------- results
def write_run(out: str, name: str, rows: list[dict], settings: dict):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump({"settings": settings, "rows": rows}, f, indent=1)


def report(out: str) -> str:
    """Markdown table + ``grpo.png`` from ``frozen.csv`` and ``refresh.csv`` in ``out``."""
    runs = {}
    for name in ("frozen", "refresh"):
        path = os.path.join(out, f"{name}.csv")
        if os.path.exists(path):
            with open(path) as f:
                runs[name] = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    if not runs:
        raise FileNotFoundError(f"no frozen.csv / refresh.csv in {out}")
    common = min(len(rows) for rows in runs.values())   # compare the steps both runs reached
    runs = {name: rows[:common] for name, rows in runs.items()}
    lines = ["| drafter | steps | reward first 5 → last 5 | live τ first 5 → last 5 | "
             "chain τ frozen (last 5) | chain τ current (last 5) | rollout tok/s (median) | "
             "compiles rollout/update/refresh |", "|---|---|---|---|---|---|---|---|"]
    for name, rows in runs.items():
        def m(key, sl):
            return float(np.mean([r[key] for r in rows[sl]]))

        def chain(key):   # a frozen run measures no chain τ
            v = m(key, slice(-5, None))
            return "—" if np.isnan(v) else f"{v:.2f}"
        first, tail = slice(0, 5), slice(-5, None)
        lines.append(
            f"| {name} | {len(rows)} | {m('reward', first):.2f} → {m('reward', tail):.2f} | "
            f"{m('tau', first):.2f} → {m('tau', tail):.2f} | {chain('chain_tau_frozen')} | "
            f"{chain('chain_tau_current')} | "
            f"{np.median([r['tok_s'] for r in rows[1:]]):.1f} | "
            f"{int(rows[-1]['rollout_compiles'])}/{int(rows[-1]['update_compiles'])}/"
            f"{int(rows[-1]['refresh_compiles'])} |")
    table = "\n".join(lines)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(14, 3.8))
    for name, rows in runs.items():
        s = [r["step"] for r in rows]
        ax[0].plot(s, _smooth([r["reward"] for r in rows]), label=name)
        ax[1].plot(s, _smooth([r["tau"] for r in rows]), label=f"{name}: live τ")
        if name == "refresh":
            ax[2].plot(s, _smooth([r["chain_tau_current"] for r in rows]), label="refreshed")
            ax[2].plot(s, _smooth([r["chain_tau_frozen"] for r in rows]), "--",
                       label="frozen (same batches)")
    for a, t in zip(ax, ("reward (moving mean of 5)", "live τ, T=1 (moving mean of 5)",
                         "chain τ on each step's fresh rollouts")):
        a.set_title(t)
        a.set_xlabel("RL step")
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "grpo.png"), dpi=110)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table + "\n")
    return table


def _smooth(x, w: int = 5):
    x = np.asarray(x, float)
    return np.array([x[max(0, i - w + 1):i + 1].mean() for i in range(len(x))])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=12)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--drafter", default="frozen", choices=("frozen", "refresh"))
    ap.add_argument("--refresh-every", type=int, default=4)
    ap.add_argument("--drafter-lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--report", default=None, help="write the table and plot of a results dir")
    args = ap.parse_args()
    if args.report:
        print(report(args.report))
    else:
        main(args.model, args.steps, args.prompts, args.group, args.max_new, args.lr,
             args.drafter, args.refresh_every, args.drafter_lr, args.seed, out=args.out)
