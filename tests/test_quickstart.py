"""examples/quickstart.ipynb runs headless, start to end, on the real SmolLM2 pair."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"
METHODS = ("ar", "dflash", "domino", "ddtree", "dominotree")
CELL_TIMEOUT_S = 600


def _text(outputs) -> str:
    parts = []
    for out in outputs:
        if out.get("output_type") == "stream":
            parts.append(out["text"])
        elif "data" in out and "text/plain" in out["data"]:
            parts.append(out["data"]["text/plain"])
    return "".join(parts)


@pytest.mark.slow
def test_quickstart_notebook_executes():
    why = "nbformat and nbclient come with the test extra (pip install -e '.[test]')"
    nbformat = pytest.importorskip("nbformat", reason=why)
    nbclient = pytest.importorskip("nbclient", reason=why)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    # the kernel inherits this environment (JAX_PLATFORMS=cpu from conftest) and interpreter
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()

    errors = [out for cell in nb.cells if cell.cell_type == "code"
              for out in cell.outputs if out.get("output_type") == "error"]
    assert not errors, errors
    text = "\n".join(_text(cell.outputs) for cell in nb.cells if cell.cell_type == "code")
    assert "dominotree_jax is installed" in text
    assert f"python: {sys.executable}" in text  # the kernel ran the test's interpreter
    for method in METHODS:
        m = re.search(rf"^\s*{method}: (\d+) tokens in (\d+) rounds, mean tau ([\d.]+), "
                      rf"([\d.]+) tok/s", text, re.M)
        assert m, f"no decode line for {method}"
        assert int(m.group(1)) == 32 and int(m.group(2)) >= 1 and float(m.group(4)) > 0
        if method != "ar":
            assert f"{method} identical to ar: True" in text
            assert re.search(rf"^\s*{method}: [\d.]+x ar", text, re.M)
    assert float(re.search(r"^\s*ar: \d+ tokens in \d+ rounds, mean tau ([\d.]+)", text,
                           re.M).group(1)) == 1.0
    images = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
              if "image/png" in out.get("data", {})]
    assert len(images) == 1  # the tau-per-round / tokens-per-second figure
