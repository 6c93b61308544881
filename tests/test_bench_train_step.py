"""benchmarks/train/step.py refuses run directories that already hold a run (their
run.json would fix other settings than the ones asked for)."""

import pytest

from benchmarks.train.step import main


def test_existing_run_directory_is_refused_by_name(tmp_path):
    (tmp_path / "bfloat16").mkdir()
    (tmp_path / "bfloat16" / "run.json").write_text("{}")
    with pytest.raises(SystemExit, match="bfloat16 already holds a run"):
        main(["--out-root", str(tmp_path), "--steps", "1"])


def test_arm_specs_are_checked_by_name():
    from benchmarks.train.step import parse_arms
    assert parse_arms(["full=", "tv=--train-vocab 8192"]) == {
        "full": [], "tv": ["--train-vocab", "8192"]}
    with pytest.raises(SystemExit, match="expected NAME=FLAGS"):
        parse_arms(["--train-vocab 8192", "full="])
    with pytest.raises(SystemExit, match="given twice"):
        parse_arms(["a=", "a=--dtype bfloat16"])
    with pytest.raises(SystemExit, match="at least two arms"):
        parse_arms(["a="])


def test_arms_that_would_see_other_batches_are_refused(tmp_path):
    with pytest.raises(SystemExit, match=r"arm b: its batches would differ.*'batch': \(8, 4\)"):
        main(["--out-root", str(tmp_path), "--steps", "1", "--arm", "a=",
              "--arm", "b=--batch 4", "--data", str(tmp_path / "nodata")])
    assert not (tmp_path / "a").exists()

