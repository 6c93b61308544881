"""What measuring the engine needs, shared by the cost calibration (``dominotree_jax.calibrate``),
the training tools (``train/eval/``, ``train/data/overlap.py``), the experiments and the
benchmarks (``benchmarks/``):

- ``timing``: the interleaved timer and the machine facts named next to a timing (CPU model,
  bf16 matrix units);
- ``product_timing``: the float32 vs bf16 matrix-product timings behind the precision choice;
- ``default_pair``: the pair tools run by default (SmolLM2-135M-Instruct + the shipped drafter,
  a checkpoint, or a random-init drafter);
- ``eval_prompts``: the evaluation prompt sets (HumanEval, MT-Bench, MATH500, mmath), read from
  installed data packages.
"""
