"""The AR step's kernel-by-kernel profile (``benchmarks/gpu/ar_profile.py``): the HLO reading,
the trace matching, and the whole command on the tiny pair (the CPU's own operations)."""

from __future__ import annotations

import re

import pytest

from benchmarks import profile_trace
from benchmarks.gpu import ar_profile

HLO = """\
HloModule m, entry_computation_layout={(f32[4,8]{1,0}, bf16[8]{0})->f32[4]{0}}

%fused (p: f32[4,8]) -> f32[4] {
  %p = f32[4,8]{1,0} parameter(0)
  ROOT %r = f32[4]{0} reduce(%p, %c), dimensions={1}, to_apply=%add
}

ENTRY %main (a: f32[4,8], b: bf16[8]) -> f32[4] {
  %a = f32[4,8]{1,0} parameter(0)
  %b = bf16[8]{0} parameter(1)
  %fusion.1 = f32[4]{0} fusion(%a), kind=kLoop, calls=%fused, metadata={op_name="x"}
  %cc = (f32[4]{0}, s32[]) custom-call(%fusion.1, %b), custom_call_target="__cublas$gemm"
  %w = (f32[4]{0}, s32[]) while(%cc), condition=%cond, body=%body
  ROOT %gte = f32[4]{0} get-tuple-element(%w), index=0
}
"""


def test_shape_bytes():
    assert ar_profile.shape_bytes("f32[3,4]{1,0}") == 48
    assert ar_profile.shape_bytes("(bf16[2]{0}, s32[])") == 8
    assert ar_profile.shape_bytes("pred[5]{0}") == 5
    assert ar_profile.shape_bytes("f8e4m3fn[16]{0}") == 16


def test_instructions_name_their_bytes_and_kind():
    known = ar_profile.instructions(HLO)
    assert known["fusion.1"] == dict(opcode="fusion", kind="fusion", bytes=16 + 128)
    assert known["cc"]["kind"] == "__cublas$gemm"
    assert known["cc"]["bytes"] == (16 + 4) + 16 + 16   # result tuple + fusion.1 + b
    assert known["w"]["opcode"] == "while"


def test_operation_times_prefer_device_events_and_skip_containers():
    known = ar_profile.instructions(HLO)
    cpu = [dict(ph="X", name="fusion.1", dur=5.0), dict(ph="X", name="w", dur=50.0),
           dict(ph="X", name="ThunkExecutor::Execute", dur=90.0),
           dict(ph="X", name="cc", dur=2.0), dict(ph="X", name="cc", dur=3.0)]
    assert profile_trace.operation_times(cpu, known) == {"fusion.1": [5.0], "cc": [2.0, 3.0]}
    gpu = cpu + [dict(ph="X", name="gemm_kernel_xyz", dur=7.0, args={"hlo_op": "cc"})]
    assert profile_trace.operation_times(gpu, known) == {"cc": [7.0]}   # host events dropped
    assert profile_trace.matched_by(gpu) == "events' hlo_op"
    assert profile_trace.matched_by(cpu) == "event names"
    # a trace with device streams: only their events count (the host's launches are dropped)
    named = [dict(ph="M", name="process_name", pid=1, args={"name": "/host:CPU"}),
             dict(ph="M", name="process_name", pid=2, args={"name": "/device:GPU:0"}),
             dict(ph="X", pid=1, name="launch", dur=1.0, args={"hlo_op": "cc"}),
             dict(ph="X", pid=2, name="gemm", dur=4.0, args={"hlo_op": "cc"})]
    assert profile_trace.operation_times(named, known) == {"cc": [4.0]}
    assert profile_trace.matched_share(named, known) == 1.0
    # kernels run from a command buffer name the buffer, not an instruction: the share says so
    graph = named + [dict(ph="X", pid=2, name="k", dur=12.0, args={"hlo_op": "command_buffer"})]
    assert profile_trace.matched_share(graph, known) == 0.25
    assert profile_trace.matched_share(cpu, known) == 10.0 / 100.0   # the loop's span left out
    assert profile_trace.matched_share([], known) is None
    rows = ar_profile.profile_rows({"cc": [7.0, 7.0]}, known, steps=2)
    assert rows[0]["calls"] == 1 and rows[0]["us"] == 7.0
    assert rows[0]["gbps"] == known["cc"]["bytes"] / 7e3


def test_tiny_ar_step_profile(tmp_path, capsys):
    out = tmp_path / "p.md"
    ar_profile.main(["--tiny", "--steps", "3", "--repeats", "3", "--out", str(out)])
    text = out.read_text()
    assert "# The AR step, kernel by kernel: tiny Qwen3-4B-like + Domino-b16" in text
    step_ms, ops_ms, count = re.search(
        r"step \(wall, unprofiled, median\): ([\d.]+) ms; profiled operations: ([\d.]+) ms a "
        r"step in (\d+) instructions", text).groups()
    assert float(step_ms) > 0 and float(ops_ms) > 0 and int(count) > 5
    rows = [line for line in text.splitlines() if line.startswith("| ") and " | " in line
            and not line.startswith("| instruction")]
    assert len(rows) >= 5 and "By kind:" in text and "matched by events' hlo_op" in text
    capsys.readouterr()


def test_trace_events_read_the_xplane_where_no_json_trace_was_written(tmp_path):
    """A jax that writes only ``*.xplane.pb`` (no ``*.trace.json.gz``) gives the same
    operations, by instruction, as the JSON trace of the same profile."""
    import glob
    import os

    import jax
    import jax.numpy as jnp
    f = jax.jit(lambda x: jnp.sin(x) @ x + 1.0)
    x = jnp.ones((64, 64))
    known = {ins.name: {"opcode": ins.opcode}
             for ins in ar_profile.hlo_text_instructions(f.lower(x).compile().as_text())}
    f(x).block_until_ready()
    with jax.profiler.trace(str(tmp_path)):
        for _ in range(3):
            f(x).block_until_ready()
    from_json = profile_trace.operation_times(profile_trace.trace_events(str(tmp_path)), known)
    for path in glob.glob(f"{tmp_path}/**/*.trace.json.gz", recursive=True):
        os.remove(path)
    events = profile_trace.trace_events(str(tmp_path))
    assert any(e.get("name") == "process_name" for e in events)
    from_xplane = profile_trace.operation_times(events, known)
    assert from_json and {k: len(v) for k, v in from_xplane.items()} == {
        k: len(v) for k, v in from_json.items()}
    for name, durs in from_json.items():
        assert sum(from_xplane[name]) == pytest.approx(sum(durs), rel=1e-3, abs=1e-3)
