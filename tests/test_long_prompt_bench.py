"""``python -m benchmarks step long_prompt --prefill-only --side-by-side``: both engines'
prefills in one subprocess, their calls alternated, on the real SmolLM2 pair (a short prompt)."""

from __future__ import annotations

import pytest

from benchmarks.step import long_prompt


def test_side_by_side_prefill_rows(tmp_path, capsys):
    out = tmp_path / "lp.md"
    long_prompt.main(["--lengths", "48", "--runs", "2", "--prefill-only", "--side-by-side",
                      "--out", str(out)])
    text = out.read_text()
    assert "both in one process, calls alternated run by run" in text
    row = next(line for line in text.splitlines() if line.startswith("| 48 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    ours, theirs, ratio = float(cells[1]), float(cells[2]), cells[3]
    assert ours > 0 and theirs > 0
    assert ratio.endswith("x") and float(ratio[:-1]) > 0   # of the unrounded seconds
    assert cells[4:] == ["–", "–"]      # no peak memory when one process holds both
    capsys.readouterr()


def test_side_by_side_needs_prefill_only(tmp_path):
    with pytest.raises(SystemExit):
        long_prompt.main(["--lengths", "48", "--side-by-side", "--out", str(tmp_path / "x")])
