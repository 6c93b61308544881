"""``benchmarks.train.feature_precision``: its shape list is read strictly (the run itself
loads the real target and is a benchmark, not a test)."""

import pytest

from benchmarks.train.feature_precision import main, parse_shapes


def test_shapes_parse_and_bad_ones_are_refused_by_name():
    assert parse_shapes("8x256,4X1024") == [(8, 256), (4, 1024)]
    with pytest.raises(SystemExit, match="'8by256' is not BATCHxWIDTH"):
        parse_shapes("8x256,8by256")
    with pytest.raises(SystemExit, match="'0x256' needs a positive batch"):
        parse_shapes("0x256")
    with pytest.raises(SystemExit, match="at least one"):
        main(["--shapes", ","])
