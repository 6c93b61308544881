import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One persistent XLA compilation cache for every pytest process of a `make test` run (and the
# subprocesses the tests start: they inherit the environment): a program compiled again (a
# fresh jit object, a rerun of an example or a trainer, a resumed run, another test file) is
# read back instead. Under .pytest_cache/ (`make clean` removes it); a size limit turns on
# jax's file lock, so the two pytest processes of `make test` never read a half-written entry.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".pytest_cache", "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))
# The suite compiles many programs of tiny models that run in milliseconds. XLA's CPU fusion
# emitters (its default) take about twice as long to compile a decode program as its loop
# emitters (ar 1.6 -> 0.8 s, dominotree 3.1 -> 1.6 s; Intel Xeon, 2026-12-07): the tests (and
# the subprocesses and notebook kernel they start, which inherit this) use the loop emitters
# unless XLA_FLAGS already chooses. The library leaves XLA's defaults alone.
if "xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(
        [os.environ.get("XLA_FLAGS", ""), "--xla_cpu_use_fusion_emitters=false"]).strip()

import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end-to-end tests on the real SmolLM2 model")


@pytest.fixture(scope="session")
def smollm2_path():
    from dominotree_jax.assets import smollm2_gguf_path
    return smollm2_gguf_path()


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    import dominotree_jax as dj
    return dj.load_target(smollm2_path)
