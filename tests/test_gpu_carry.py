"""benchmarks/gpu/carry.py: a file split for device calls comes back byte for byte, and a
missing, short or altered part is refused by name before anything is joined."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.gpu import carry as gpu_carry


@pytest.fixture
def blob(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 10_000, np.uint8).tobytes())
    return path


def test_split_stage_join_round_trip(blob, tmp_path):
    m = gpu_carry.split(blob, tmp_path / "parts", 3_000)
    assert [p["size"] for p in m["parts"]] == [3_000, 3_000, 3_000, 1_000]
    made = gpu_carry.stage(tmp_path / "parts", tmp_path / "carry")
    assert [d.name for d in made] == ["p0", "p1", "p2", "p3"]
    assert all(sorted(f.name for f in d.iterdir()) == sorted([gpu_carry.MANIFEST,
               m["parts"][k]["name"]]) for k, d in enumerate(made))
    device = tmp_path / "device"          # what the calls copy to the device's /tmp
    device.mkdir()
    for d in made:
        for f in d.iterdir():
            (device / f.name).write_bytes(f.read_bytes())
    out = gpu_carry.join(device, tmp_path / "joined.gguf")
    assert out.read_bytes() == blob.read_bytes()


def test_join_refuses_missing_short_and_altered_parts(blob, tmp_path):
    parts = tmp_path / "parts"
    m = gpu_carry.split(blob, parts, 4_000)
    last = parts / m["parts"][-1]["name"]
    data = last.read_bytes()
    last.unlink()
    with pytest.raises(FileNotFoundError, match="1 of 3 parts .* missing: model.gguf.part02"):
        gpu_carry.join(parts, tmp_path / "x")
    last.write_bytes(data[:-1])
    with pytest.raises(ValueError, match="bytes, the manifest says"):
        gpu_carry.join(parts, tmp_path / "x")
    last.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    with pytest.raises(ValueError, match="SHA-256"):
        gpu_carry.join(parts, tmp_path / "x")
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob("x.*"))
    assert json.loads((parts / gpu_carry.MANIFEST).read_text())["size"] == 10_000


def test_cli_reports_errors_in_one_line(tmp_path, capsys):
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / gpu_carry.MANIFEST).write_text(json.dumps(
        {"name": "m", "size": 1, "sha256": "0", "parts": [{"name": "m.part00", "size": 1}]}))
    assert gpu_carry.main(["join", str(tmp_path / "parts"), "--out", str(tmp_path / "m")]) == 1
    assert "missing: m.part00" in capsys.readouterr().err
