"""What the benchmarks share: the table of entry points (``python -m benchmarks GROUP NAME``),
the repository's paths and the command line a result file records.

Standard library only: ``python -m benchmarks`` lists the entry points from here without
loading jax.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]     # the repository
RESULTS = ROOT / "benchmarks" / "results"      # the measured tables

# group -> (what the group measures, {name: one line}); NAME runs ``benchmarks/GROUP/NAME.py``
# ``main(argv)``, and ``NAME --help`` prints that module's docstring: what it measures and how.
GROUPS: dict[str, tuple[str, dict[str, str]]] = {
    "methods": ("decoding methods end to end on real prompts: tokens/s, tau, speedup over ar", {
        "bench": "every method on HumanEval / MT-Bench / MATH500, batch 1, fixed budget and "
                 "auto (make bench): results/bench.json, bench.md, plots",
        "batch": "tokens/s per method and batch size on MT-Bench prompts",
        "auto_overhead": "what budget='auto' costs over plain decoding (ar, auto forced "
                         "plain, auto)",
        "auto_view": "bf16 budget='auto' with and without the float32 view and the one-row "
                     "pad",
        "temperature_accept": "how far auto's acceptance model is off at T 0..1 (the "
                              "calibration factor it learns)",
        "auto_rows": "auto + lookup on mixed batches (copy-edit and chat rows): per-row "
                     "calibration vs one for the batch, and ar",
        "bf16_host": "auto and lookup auto on bf16 and float32 weights vs float32 ar, in "
                     "one process, per set incl. copyedit",
        "draft_window": "tau and tokens/s against prompt length, with and without a drafter "
                        "window",
        "draft_vocab_sweep": "the shipped drafter over 8k / 16k / 32k draft vocabularies vs "
                             "the full one",
        "lookup_table": "lookup drafting's acceptance per matched n-gram and depth "
                        "(results/lookup/)",
        "shared_prefill": "one prefill shared by a prompt's G samples vs one per row (tunix "
                          "rollout engine)",
        "plain_calls": "rollout calls auto does not draft in: ar, its drafting program, "
                       "plain calls, the lookup-only program (tunix rollout engine)",
    }),
    "step": ("one target step: ar vs transformers, its stages, products, cache writes, HLO", {
        "ar": "our jitted ar vs transformers generate, per precision and batch size",
        "layer_kinds": "one layer of each kind (Gated DeltaNet, gated attention) at real "
                       "width: 1-row step, 17-row tree verify, state bytes",
        "profile": "one target step per stage (projections, attention, cache writes, MLP, "
                   "head)",
        "long_prompt": "prefill, per-token decode and peak memory at 512..8k prompt tokens, "
                       "ours vs transformers",
        "long_context": "an ar step and a DominoTree round at a long context against a short "
                        "one, side by side in one process",
        "attention_layout": "the cache pass's score layout ([S, U] vs [U, S]), one layer and "
                            "the whole step",
        "cache_write": "the batch-16 cache write: float32, plain bf16 scatter, bf16 bits",
        "matvec_forms": "one-row products in every layout and bf16 form",
        "products": "float32 vs bf16 matrix products at the target's shapes (the precision "
                    "choice)",
        "xla_flags": "single-stream ar tokens/s under XLA:CPU flag sets",
        "sampling": "the verify's sampling: Gumbel categorical vs inverse-CDF draw, argmax "
                    "forms, alone and behind the LM head",
        "slot_step": "data collection's slot-refill AR step: cache pass as dots or fused, per "
                     "precision",
        "hlo_step_dots": "the products and weight upcasts one compiled step holds (no timing)",
        "hlo_weight_converts": "where a bf16 target's weights are upcast in the compiled "
                               "decode (no timing)",
    }),
    "round": ("the speculative round's parts: its stages, the drafter, the tree builder", {
        "stages": "per-round stage times of every method against one AR step",
        "inside": "stage times inside the one compiled decode program (profiler, named "
                  "scopes)",
        "in_loop": "a round's cost inside the decode loop (a difference of two decodes), per "
                   "method and precision, in float32 ar steps",
        "drafter_layers": "the draft stage of several drafters against one AR step",
        "tree_build": "per-tree build time: jitted builder vs the NumPy heap reference",
        "tree_precision": "the tree builder's products at HIGHEST vs DEFAULT: trees and time",
    }),
    "train": ("drafter training and RL: a training step, its features, checkpoints", {
        "step": "the drafter trainer's seconds per step under several settings (arms)",
        "mesh_step": "the trainer's step on 1, 2, 4, 8 host devices (data x model meshes)",
        "feature_precision": "the features stage's teacher-forced forward, float32 vs bf16",
        "checkpoint_save": "one orbax checkpoint of SmolLM2-135M's size (policy + AdamW)",
        "grpo_step": "where a GRPO training step's time goes (tunix, SmolLM2-135M)",
    }),
    "gpu": ("the prepared runs on a lent GPU (gpu_*.sh call these)", {
        "suite": "the Pallas kernel check and real-size round stages in one ~10-minute call",
        "ar_profile": "the AR step kernel by kernel (time, bytes, GB/s) against the roof",
        "round_profile": "a round's stages inside the one compiled round (device time, idle, wall)",
        "carry": "a file larger than one device call takes, split / staged / joined in parts",
    }),
}


def command_line(group: str, name: str, argv=None) -> str:
    """The command a result records: ``python -m benchmarks GROUP NAME ARGS`` (quoted)."""
    argv = sys.argv[1:] if argv is None else argv
    return " ".join(["python -m benchmarks", group, name] + [shlex.quote(a) for a in argv])


def python_m(group: str, name: str, *args: str) -> list[str]:
    """argv of a subprocess running ``GROUP NAME ARGS`` with this interpreter (run it with
    ``cwd=ROOT``)."""
    return [sys.executable, "-m", "benchmarks", group, name, *args]
