"""Measuring drafters: teacher-forced chain acceptance on benchmark prompts and held-out data
(``acceptance``, also the campaign's gate). ``python -m dominotree_jax.train.eval`` is its
command line. The lab's drafter tools (tree-against-chain acceptance, recipe ablations, label
agreement, learning-curve plots) are ``python -m experiments.drafter_lab``."""
