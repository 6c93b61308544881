import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

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
