"""``python -m benchmarks train NAME``: drafter training (a trainer step per setting, the
features forward per precision) and RL training (a GRPO step, a checkpoint save)."""
