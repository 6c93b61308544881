"""A round's stages inside the compiled round (``benchmarks/gpu/round_profile.py``): the sums
by stage, and the whole command on the tiny pair (the CPU's own operations)."""

from __future__ import annotations

import re

import pytest

from benchmarks import profile_trace
from benchmarks.gpu import round_profile
from benchmarks.hlo_text import instruction_stages


def test_stage_totals_sum_by_stage_per_round():
    times = {"fusion.1": [4.0, 6.0], "dot.2": [10.0, 10.0], "copy.3": [1.0, 1.0],
             "while.4": [99.0, 99.0]}
    stage_of = {"fusion.1": "draft", "dot.2": "verify", "copy.3": "verify", "while.4": None}
    assert profile_trace.stage_totals(times, stage_of, rounds=2) == {"draft": 5.0,
                                                                     "verify": 11.0}


def test_tiny_round_profile(tmp_path, capsys):
    out = tmp_path / "r.md"
    round_profile.main(["--tiny", "--rounds", "3", "--repeats", "3", "--methods", "dominotree",
                        "--out", str(out)])
    text = out.read_text()
    assert "# A round's stages inside the compiled round: tiny Qwen3-4B-like" in text
    header = next(line for line in text.splitlines() if line.startswith("| method"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    rows = {}
    for line in text.splitlines():
        if re.match(r"\| (ar|dominotree) \|", line):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = dict(zip(cols, cells))
    assert set(rows) == {"ar", "dominotree"}          # ar always runs, first
    ar, tree = rows["ar"], rows["dominotree"]
    assert ar["rows"] == "1" and tree["rows"] == "17"
    assert float(ar["draft"]) == 0.0 and float(ar["verify"]) > 0
    for stage in ("draft", "tree", "verify"):
        assert float(tree[stage]) > 0, stage
    for r in (ar, tree):   # each row adds up: stages + idle = wall
        stages = sum(float(r[c]) for c in cols[2:cols.index("sum")])
        assert float(r["sum"]) == pytest.approx(stages, abs=0.01)
        assert float(r["sum"]) + float(r["idle"]) == pytest.approx(float(r["wall"]), abs=0.01)
    assert float(ar["x AR"]) == 1.0
    capsys.readouterr()


def test_round_profile_rejects_a_method_the_pair_lacks(tmp_path):
    with pytest.raises(SystemExit):
        round_profile.main(["--tiny", "--pair", "qwen3-4b-dflash", "--methods", "dominotree",
                            "--out", str(tmp_path / "r.md")])


def test_prepared_profile_script(tmp_path, capsys):
    """benchmarks/gpu_profile_run.sh: both calls parse and run (at tiny sizes here), their time
    limits fit the call's, and its files stay within the 8 a device call returns."""
    import shlex

    from benchmarks.common import ROOT
    from benchmarks.gpu import ar_profile
    text = (ROOT / "benchmarks" / "gpu_profile_run.sh").read_text()
    limits = [int(t) for t in re.findall(r"^timeout (\d+) ", text, re.M)]
    assert len(limits) == 2 and sum(limits) + 30 <= 450 < 600
    for name, module in (("ar_profile", ar_profile), ("round_profile", round_profile)):
        call = text[text.index(f'"$PY" -m benchmarks gpu {name}'):].split(" > ")[0]
        argv = shlex.split(call.replace("\\\n", " "))[5:]
        argv = [a.replace("$OUT", str(tmp_path)) for a in argv]
        assert argv[argv.index("--pair") + 1] == "qwen3-4b-domino"
        extra = ["--steps", "2"] if name == "ar_profile" else ["--rounds", "2"]
        module.main(argv + ["--tiny", "--repeats", "2"] + extra)
    assert "| dominotree | 17 |" in (tmp_path / "round_profile.md").read_text()
    assert "| ddtree | 17 |" in (tmp_path / "round_profile.md").read_text()
    # both profiles run with XLA's command buffers off (kernels then name their instruction)
    assert 'export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer="' in text
    device_run = (ROOT / "benchmarks" / "gpu_device_run.sh").read_text()
    profile_call = device_run[device_run.index("gpu ar_profile") - 300:]
    assert "--xla_gpu_enable_command_buffer=" in profile_call
    written = set(re.findall(r'\$OUT/([A-Za-z0-9_.-]+)"', text))
    assert written == {"versions.txt", "ar_profile.md", "ar_profile_log.txt",
                       "round_profile.md", "round_profile_log.txt"}
    capsys.readouterr()


def test_metadata_less_instructions_take_a_neighbour_stage():
    hlo = "\n".join([
        '  %a = f32[4]{0} parameter(0)',
        '  %ynn_fusion.1 = f32[4]{0} fusion(%a), kind=kCustom, calls=%c.1',
        '  %b = f32[4]{0} exponential(%ynn_fusion.1), metadata={op_name="jit(f)/stage_verify/exp"}',
        '  %w = (f32[4]{0}) while(%t), condition=%c, body=%d',
        '  %c = f32[4]{0} add(%b, %b), metadata={op_name="jit(f)/add"}'])
    names = instruction_stages(hlo, ("stage_draft", "stage_verify"))
    assert names["ynn_fusion.1"] == "verify" and names["b"] == "verify"
    assert names["w"] is None and names["c"] == "verify"   # a container; reads b
    assert names["a"] == "other"        # a parameter: no staged operand, its user has none
