"""benchmarks/bench_train_step.py refuses run directories that already hold a run (their
run.json would fix other settings than the ones asked for)."""

import pytest

from benchmarks.bench_train_step import main


def test_existing_run_directory_is_refused_by_name(tmp_path):
    (tmp_path / "bfloat16").mkdir()
    (tmp_path / "bfloat16" / "run.json").write_text("{}")
    with pytest.raises(SystemExit, match="bfloat16 already holds a run"):
        main(["--out-root", str(tmp_path), "--steps", "1"])
