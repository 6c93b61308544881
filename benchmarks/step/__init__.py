"""``python -m benchmarks step NAME``: one target step (AR decoding against transformers, where a
step's time goes, its products, cache writes and what it compiles to). ``profile`` holds the
jitted-step helpers the others reuse (``profile_shape``, ``step_inputs``, ``timed``)."""
