"""``lookup_sources`` on the tiny task: every arm decodes the same batches each epoch, rows per
epoch and arm, ``ar`` the reference of the ratios; bad arms refused."""

from __future__ import annotations

import json

import pytest

from experiments.grpo import lookup_sources


def test_rows_per_epoch_and_arm(tmp_path):
    out = tmp_path / "sources.json"
    assert lookup_sources.main(["--model", "tiny", "--epochs", "2", "--steps", "1",
                                "--prompts", "2", "--group", "2", "--new", "6",
                                "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [(r["epoch"], r["arm"]) for r in rows] == [
        (e, a) for e in range(2) for a in lookup_sources.ARMS]
    assert all(r["tau"] >= 1.0 and r["seconds"] > 0 for r in rows)
    assert all(r["over_ar"] == 1.0 for r in rows if r["arm"] == "ar")
    assert result["settings"]["cpu"] and result["settings"]["model"] == "tiny"
    with pytest.raises(SystemExit):
        lookup_sources.main(["--arms", "lookup"])   # no ar to compare with
