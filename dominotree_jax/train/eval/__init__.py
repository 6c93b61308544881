"""Measuring drafters and data: teacher-forced chain acceptance on benchmark prompts and held-out
data (``acceptance``, also the campaign's gate), draft trees against chains (``tree``), recipe
ablations (``ablate``), the collector's agreement with the target's argmax (``agreement``) and
learning-curve plots (``report``). ``python -m dominotree_jax.train.eval`` is their command
line."""
