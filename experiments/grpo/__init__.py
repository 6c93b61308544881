"""GRPO arm comparisons through tunix's ``GRPOLearner`` with ``DominoTreeRollout``: the task a run
needs (``grpo_task``), arms with a CSV row per step and resume (``grpo_run``), rollout speed side
by side (``grpo_speed``), the report (``grpo_report``, needs matplotlib) and the SmolLM2 example
that drives them (``python -m experiments.grpo.grpo_smollm2``)."""
