"""benchmarks/step/slot_step.py checks its positions against the cache before loading
anything."""

import pytest

from benchmarks.step.slot_step import main


def test_slot_step_bench_refuses_positions_past_the_cache():
    with pytest.raises(SystemExit, match="must fit 256 slots"):
        main(["--slots", "256", "--max-pos", "250", "--steps", "24"])


@pytest.mark.parametrize("dtypes", ["float16", "int8", "float32,float32", ","])
def test_slot_step_bench_refuses_unknown_or_repeated_dtypes(dtypes, capsys):
    with pytest.raises(SystemExit):
        main(["--dtypes", dtypes])
    err = capsys.readouterr().err   # argparse's error names the option and the choices
    assert "argument --dtypes" in err and "float32, bfloat16" in err
