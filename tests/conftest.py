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
