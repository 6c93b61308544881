"""The drafter's training data: prompts the target writes itself (``self_prompts``), the
benchmark filter (``overlap``), the target's answers (``generate``: one batch at a time with
``decode``; ``slots``: a refilling pool on a kept KV cache), the shard store (``shards``),
repetition loops (``loops``), and the collection loop (``collect``: any target, prompts passed in).
``python -m dominotree_jax.train.data`` is their command line (top-k backfill of old shards:
``python -m experiments.drafter_lab backfill-topk``)."""
