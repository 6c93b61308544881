"""``python -m benchmarks gpu NAME``: the prepared runs on a lent GPU (``benchmarks/gpu_*.sh``).

``suite``, the one-shot GPU suite, in parts with one job each:

- ``configs``: the pairs measured (real and tiny sizes), the published figures, device peaks;
- ``weights``: random weights drawn on the device by one jitted program;
- ``kernel``: the Pallas top-M kernel against its jnp twin, and its launch variants;
- ``rounds``: the jitted round and its stages, the decode configs and buffers they run on;
- ``measure``: one pair's rounds and stages timed beside the AR step, each method isolated;
- ``control``: the deadline and the isolation of each part;
- ``report``: the environment record, the markdown and JSON report, the verdict;
- ``suite``: the command line, running the parts in order.

``carry`` moves files larger than one device call takes, in parts.
"""
