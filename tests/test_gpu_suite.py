"""The GPU suite (benchmarks/gpu/) at tiny sizes on a CPU (the Pallas kernel in interpret mode)
through every one-shot path: per-method isolation, the deadline, the switches, merging reports;
and the real-size round lowered for ``cuda`` from this host (no conditional, the Triton kernel in
it)."""

from __future__ import annotations

import datetime
import json
import math
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import pallas_kernels.topm_expand as topm
from benchmarks.gpu import configs, control, measure, rounds, suite
from benchmarks.gpu import kernel as gpu_kernel
from benchmarks.gpu import report as gpu_report
from benchmarks.gpu import weights as gpu_weights
from dominotree_jax.model.cache import value_dtype
from dominotree_jax.model.target import target_graphdef

REPO = Path(__file__).resolve().parents[1]
DEVICE_RUN = REPO / "benchmarks" / "gpu_device_run.sh"
TABLE_ROWS = ("AR step (timed beside the round)", "round (one jitted function)", "draft",
              "build", "verify", "accept/commit", "**round / AR step (ours)**",
              "paper round / AR step (tau / speedup)", "published tau", "published speedup",
              "our speedup at the published tau (tau x AR / round)",
              "build share of the round (paper, DominoTree: 14%)",
              "round programs compiled (at most 1)", "compile s (round)")
FAST = ["--tiny", "--skip-kernel", "--repeats", "1", "--inner", "1", "--context", "8",
        "--max-new-tokens", "8"]


def _table_after(text: str, title: str) -> dict[str, list[str]]:
    """Rows (label -> cells) of the first markdown table at or after the text ``title``."""
    lines = text[text.index(title):].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = {}
    for line in lines[first + 2:]:  # past the header and the separator
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def _report(out: Path) -> dict:
    return json.loads(out.with_suffix(".json").read_text())


def test_one_failing_method_is_recorded_and_the_rest_run(monkeypatch, tmp_path, capsys):
    real = measure.measure_round

    def measure_round(run, method):
        if method == "domino":
            raise RuntimeError("injected failure in domino")
        return real(run, method)

    monkeypatch.setattr(measure, "measure_round", measure_round)
    jax.clear_caches()  # so that each round compiles here: one program each
    out = tmp_path / "r.md"
    code = suite.main(FAST + ["--pairs", "qwen3-4b-domino", "--methods", "dflash,domino,ddtree",
                              "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 1 and printed.rstrip().endswith("OVERALL: FAIL")
    methods = _report(out)["pairs"]["qwen3-4b-domino"]["methods"]
    assert methods["domino"]["round"]["error"] == "RuntimeError: injected failure in domino"
    assert "measure_round" in methods["domino"]["round"]["traceback"]
    assert methods["domino"]["stages"] == {"skipped": "the round failed"}
    for m in ("dflash", "ddtree"):  # before and after the failure
        r = methods[m]["round"]
        assert r["round_ms"] > 0 and r["ar_ms"] > 0 and r["round_programs"] == 1
        assert methods[m]["stages"]["build_ms"] > 0
    text = out.read_text()
    rows = _table_after(text, "## tiny Qwen3-4B-like + Domino-b16")
    assert rows["round (one jitted function)"][1] == "FAILED"
    assert "FAILED qwen3-4b-domino domino round: `RuntimeError: injected failure" in text
    assert "Traceback (most recent call last)" in text


def test_report_is_rewritten_after_each_method(monkeypatch, tmp_path):
    out = tmp_path / "r.md"
    seen = []
    real = measure.measure_round

    def measure_round(run, method):
        seen.append(set(_report(out)["pairs"]["qwen3-4b-domino"]["methods"]["dflash"]))
        return real(run, method)

    monkeypatch.setattr(measure, "measure_round", measure_round)
    assert suite.main(FAST + ["--pairs", "qwen3-4b-domino", "--methods", "dflash,ddtree",
                              "--stages", "round", "--out", str(out)]) == 0
    assert seen == [set(), {"round"}]  # ddtree started with dflash already on disk


def test_deadline_stops_new_compiles_and_keeps_what_exists(monkeypatch, tmp_path,
                                                           capsys):
    clock = {"t": 1000.0}
    monkeypatch.setattr(control, "now", lambda: clock["t"])
    real = measure.measure_round

    def measure_round(run, method):
        result = real(run, method)
        clock["t"] += 100.0  # this method "took" 100 s: the next one would pass the deadline
        return result

    monkeypatch.setattr(measure, "measure_round", measure_round)
    out = tmp_path / "r.md"
    code = suite.main(FAST + ["--pairs", "qwen3-4b-domino", "--methods", "dflash,ddtree",
                              "--out", str(out), "--deadline", "150", "--reserve", "60"])
    assert code == 0 and capsys.readouterr().out.rstrip().endswith("OVERALL: PARTIAL (deadline)")
    report = _report(out)
    methods = report["pairs"]["qwen3-4b-domino"]["methods"]
    assert methods["dflash"]["round"]["round_ms"] > 0
    assert methods["ddtree"]["round"] == {"skipped": "deadline"}
    assert methods["dflash"]["stages"] == {"skipped": "deadline"}
    assert report["environment"]["deadline_utc"].startswith("1970-01-01T00:19:10")
    assert "skipped" in _table_after(out.read_text(), "## tiny")["round (one jitted function)"]


def test_deadline_zero_runs_nothing_but_writes_the_report(tmp_path, capsys):
    out = tmp_path / "r.md"
    assert suite.main(["--tiny", "--out", str(out), "--deadline", "0"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("OVERALL: PARTIAL (deadline)")
    report = _report(out)
    assert report["kernel"] == {}
    for entry in report["pairs"].values():
        assert entry["setup"] == {"skipped": "deadline"}
        assert all(m["round"] == {"skipped": "deadline"} for m in entry["methods"].values())


def test_parse_deadline():
    start = datetime.datetime(2026, 12, 1, 10, 0, tzinfo=datetime.timezone.utc).timestamp()
    assert control.parse_deadline("540", start) == start + 540
    assert control.parse_deadline("10:09", start) == start + 540
    assert control.parse_deadline("10:09:30", start) == start + 570
    assert control.parse_deadline("2026-12-01T10:09:00Z", start) == start + 540
    for bad, message in (("09:59", "not in the future"), ("-5", ">= 0"), ("soon", "give")):
        with pytest.raises(ValueError, match=message):
            control.parse_deadline(bad, start)
    d = control.Deadline(None, 60)
    assert d.allows_new_work() and d.left() == math.inf


def test_switches_reach_the_round(tmp_path, monkeypatch):
    """--tree-kernel pallas (interpret mode on a CPU) and --attention dense/bucket reach the
    compiled round: the configs carry them and the rounds run."""
    seen = []
    real = measure.prepare_pair

    def prepare_pair(spec, **kwargs):
        run = real(spec, **kwargs)
        seen.append((spec.target.attention_impl, run.configs["dominotree"].use_pallas))
        return run

    monkeypatch.setattr(measure, "prepare_pair", prepare_pair)
    for attention, kernel, expected in (("dense", "pallas", "interpret"),
                                        ("bucket", "jnp", False)):
        out = tmp_path / f"{attention}.md"
        assert suite.main(FAST + ["--pairs", "qwen3-4b-domino", "--methods", "dominotree",
                                  "--stages", "round", "--attention", attention,
                                  "--tree-kernel", kernel, "--out", str(out)]) == 0
        report = _report(out)
        entry = report["pairs"]["qwen3-4b-domino"]
        assert entry["attention"] == attention == report["environment"]["attention"]
        assert report["environment"]["tree_kernel"] == kernel
        assert entry["methods"]["dominotree"]["round"]["round_ms"] > 0
        assert seen[-1] == (attention, expected)
        assert f"attention `{attention}`" in out.read_text()


def test_tree_kernel_choice(monkeypatch):
    choice = gpu_kernel.tree_kernel_choice
    assert choice("jnp", on_gpu=True, kernel_broken=False)[0] is False
    assert choice("pallas", on_gpu=True, kernel_broken=True)[0] is True
    assert choice("pallas", on_gpu=False, kernel_broken=False)[0] == "interpret"
    assert choice("auto", on_gpu=True, kernel_broken=True)[0] is False
    # "auto" is the jnp twin even where the kernel compiles (slower on an H200: docs/gpu.md)
    monkeypatch.setattr(topm, "default_device_compiles_kernel", lambda: True)
    assert choice("auto", on_gpu=True, kernel_broken=False) == (
        "auto", "jnp twin (auto)")


def test_merge_keeps_the_other_methods(tmp_path, capsys):
    out = tmp_path / "r.md"
    base = FAST + ["--pairs", "qwen3-4b-domino", "--stages", "round", "--out", str(out)]
    assert suite.main(base + ["--methods", "dflash"]) == 0
    first = _report(out)["pairs"]["qwen3-4b-domino"]["methods"]["dflash"]["round"]
    assert suite.main(base + ["--methods", "ddtree", "--merge"]) == 0
    report = _report(out)
    methods = report["pairs"]["qwen3-4b-domino"]["methods"]
    assert methods["dflash"]["round"] == first and methods["ddtree"]["round"]["round_ms"] > 0
    assert report["command"].count("python -m benchmarks gpu suite") == 2
    rows = _table_after(out.read_text(), "## tiny")
    assert rows["round (one jitted function)"][0] != "–" != rows["round (one jitted function)"][1]
    # a merge of a deadline-skipped rerun keeps the measured method
    assert suite.main(base + ["--methods", "dflash", "--merge", "--deadline", "0"]) == 0
    assert _report(out)["pairs"]["qwen3-4b-domino"]["methods"]["dflash"]["round"] == first
    capsys.readouterr()


def test_merge_refuses_another_device(tmp_path, capsys):
    out = tmp_path / "r.md"
    report = {"environment": {"jax": "0", "jaxlib": "0", "flax": "0", "backend": "gpu",
                              "device_count": 1, "device_kind": "NVIDIA H200"},
              "kernel": {}, "pairs": {}}
    out.with_suffix(".json").write_text(json.dumps(report))
    with pytest.raises(SystemExit):
        suite.main(FAST + ["--merge", "--out", str(out)])
    assert "--merge" in capsys.readouterr().err


def test_stages_and_kernel_variants(tmp_path, capsys):
    """The stage timings and the kernel check with two launch variants (interpret mode)."""
    out = tmp_path / "r.md"
    argv = ["--tiny", "--repeats", "1", "--inner", "1", "--context", "8", "--max-new-tokens",
            "8", "--pairs", "qwen3-4b-domino", "--methods", "dominotree",
            "--kernel-variants", "4x1,2x2", "--out", str(out)]
    assert suite.main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.rstrip().endswith("OVERALL: PASS")
    report = _report(out)
    (kernel,) = report["kernel"].values()
    assert kernel["kernel_ok"] and kernel["trees_equal"] and kernel["mode"] == "interpret"
    assert set(kernel["variants"]) == {"4x1", "2x2"}
    assert set(kernel["pop_kernels_us"]) == {"grid", "single"}   # both kernels timed
    assert all(us > 0 for us in kernel["pop_kernels_us"].values())
    assert all(v["pop_us"] > 0 for v in kernel["variants"].values())
    stages = report["pairs"]["qwen3-4b-domino"]["methods"]["dominotree"]["stages"]
    assert all(stages[f"{s}_ms"] > 0 for s in ("ar", "round", "draft", "build", "verify",
                                               "accept_commit"))
    rows = _table_after(out.read_text(), "## tiny Qwen3-4B-like + Domino-b16")
    assert tuple(rows) == TABLE_ROWS
    # a share of two separately timed programs (one repeat, tiny sizes): timing noise can
    # put it past 100 %, so only its form and sign are checked
    assert 0 < float(rows["build share of the round (paper, DominoTree: 14%)"][0][:-1])
    assert rows["round programs compiled (at most 1)"] == ["1"]
    assert "pop us, 2x2 (warps x stages, grid kernel)" in out.read_text()


def test_environment_is_recorded(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/nowhere")
    out = tmp_path / "r.md"
    assert suite.main(FAST + ["--out", str(out), "--deadline", "0"]) == 0
    env = _report(out)["environment"]
    import flax
    import jaxlib
    assert (env["jax"], env["jaxlib"], env["flax"]) == (jax.__version__, jaxlib.__version__,
                                                        flax.__version__)
    assert env["xla_flags"] == "--xla_dump_to=/nowhere" == env["env"]["XLA_FLAGS"]
    assert env["device_kind"] and env["backend"] == jax.default_backend()
    if jax.default_backend() != "gpu":
        assert env["pallas_kernel_compiles"] is False and env["compute_capability"] is None
    text = out.read_text()
    assert f"jax {jax.__version__}" in text and "--xla_dump_to=/nowhere" in text
    capsys.readouterr()


def test_table_puts_ours_next_to_the_paper():
    env = {"peak_bandwidth": 4.8e12}
    entry = dict(title="t", published="Qwen3-4B", context=512, ar_bytes=8.0e9, methods={
        "dflash": {"round": dict(ar_ms=2.0, round_ms=3.0, round_programs=1, compile_s=1.0,
                                 verify_rows=16),
                   "stages": dict(build_ms=0.3, round_ms=3.0, draft_ms=1, verify_ms=1,
                                  accept_commit_ms=1, ar_ms=2.0)},
        "dominotree": {"round": {"error": "X: y", "traceback": "tb"}},
        "ddtree": {"round": {"skipped": "deadline"}}})
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")[1:]]
            for line in gpu_report.pair_table(entry, env)[2:]}
    assert tuple(rows) == TABLE_ROWS
    assert rows["**round / AR step (ours)**"] == ["**1.50**", "–", "–"]
    assert rows["paper round / AR step (tau / speedup)"] == ["1.52", "1.66", "1.56"]
    assert rows["published tau"] == ["6.25", "7.98", "7.03"]
    assert rows["published speedup"] == ["4.11x", "4.81x", "4.51x"]
    assert rows["our speedup at the published tau (tau x AR / round)"][0] == "4.17x"
    assert rows["build share of the round (paper, DominoTree: 14%)"][0] == "10.0%"
    assert rows["round (one jitted function)"] == ["3.000", "FAILED", "skipped"]
    line = gpu_report.bandwidth_line(entry, env)
    assert "4000 GB/s achieved, 83% of the device's 4.80 TB/s" in line
    entry["published"] = None
    rows = {line.split("|")[1].strip(): line for line in gpu_report.pair_table(entry, env)[2:]}
    assert "| – | – | – |" in rows["published tau"]  # no other target's figures reused


def test_published_figures():
    pub = configs.PUBLISHED["Qwen3-4B"]
    assert {m: (p.tau, p.round_per_ar) for m, p in pub.items()} == {
        "dflash": (6.25, 1.52), "domino": (7.17, 1.62), "ddtree": (7.03, 1.56),
        "dominotree": (7.98, 1.66)}
    assert pub["dominotree"].speedup == pytest.approx(4.81, abs=0.01)
    pairs = configs.real_pairs()
    assert list(pairs)[0] == "qwen3-4b-domino" and configs.DEFAULT_PAIRS.startswith(
        "qwen3-4b-domino,")
    assert pairs["qwen3-4b-domino"].published == "Qwen3-4B"
    assert pairs["qwen3-8b-domino"].published is None


def test_ar_bytes_and_peak_bandwidth():
    spec = configs.real_pairs()["qwen3-4b-domino"]
    t = spec.target
    weights = gpu_weights.num_params(target_graphdef(t, "bfloat16")[1])
    kv = 2 * 36 * 8 * 128 * 512
    assert measure.ar_bytes(spec, 512) == 2 * (weights + kv)
    assert 4.0e9 * 2 < measure.ar_bytes(spec, 512) < 4.5e9 * 2  # ~4.0 B parameters in bf16
    untied = configs.real_pairs()["qwen3-8b-domino"]
    w8 = gpu_weights.num_params(target_graphdef(untied.target, "bfloat16")[1])
    assert measure.ar_bytes(untied, 0) == 2 * (w8 - (151936 - 1) * 4096)
    assert configs.peak_bandwidth("NVIDIA H200") == 4.8e12
    assert configs.peak_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    assert configs.peak_bandwidth("Tesla T4") == 0.32e12
    assert configs.peak_bandwidth("cpu") is None


def test_random_params_match_the_model_layout():
    from dominotree_jax.model.drafter import init_drafter_params
    from dominotree_jax.model.target import init_target_params
    spec = configs.tiny_pairs()["qwen3-8b-domino"]
    params = gpu_weights.pair_params(spec, seed=0)
    for got, ref in ((params["target"], init_target_params(spec.target, 0, jnp.bfloat16)),
                     (params["drafter"], init_drafter_params(spec.drafter, 0, jnp.bfloat16))):
        assert jax.tree.structure(got) == jax.tree.structure(ref)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
            assert a.shape == b.shape and a.dtype == b.dtype == jnp.bfloat16
            if a.ndim == 1:
                assert bool(jnp.all(a == 1))  # norm scales
            else:
                assert 0.5 < float(jnp.std(a.astype(jnp.float32))) * a.shape[-1] ** 0.5 < 1.5


def test_real_pair_configs():
    pairs = configs.real_pairs()
    t4, d4 = pairs["qwen3-4b-dflash"].target, pairs["qwen3-4b-dflash"].drafter
    t8, d8 = pairs["qwen3-8b-domino"].target, pairs["qwen3-8b-domino"].drafter
    dd4 = pairs["qwen3-4b-domino"].drafter
    assert (t4.hidden_size, t4.intermediate_size, t4.tie_word_embeddings) == (2560, 9728, True)
    assert (t8.hidden_size, t8.intermediate_size, t8.tie_word_embeddings) == (4096, 12288, False)
    for t, d in ((t4, d4), (t8, d8), (t4, dd4)):
        assert (t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads,
                t.head_dim, t.vocab_size) == (36, 32, 8, 128, 151936)
        assert (d.num_hidden_layers, d.block_size, d.mask_token_id) == (5, 16, 151669)
        assert d.target_layer_ids == (1, 9, 17, 25, 33)
    assert not d4.is_domino and dd4.is_domino
    for d in (d8, dd4):
        assert (d.emb_dim, d.gru_hidden_dim, d.pure_draft_prefix_len) == (256, 1024, 1)


@pytest.mark.parametrize("argv,message", [
    ([], "real sizes need a GPU"),
    (["--tiny", "--pairs", "qwen3-70b"], "unknown --pairs"),
    (["--tiny", "--methods", "medusa"], "unknown --methods"),
    (["--tiny", "--pairs", "qwen3-4b-dflash", "--methods", "domino"], "leaves nothing to run"),
    (["--tiny", "--deadline", "yesterday"], "--deadline"),
    (["--tiny", "--kernel-variants", "4"], "--kernel-variants"),
    (["--tiny", "--attention", "flash"], "--attention"),
    (["--tiny", "--tree-kernel", "cuda"], "--tree-kernel"),
])
def test_bad_arguments(argv, message, capsys):
    if not argv and jax.default_backend() == "gpu":
        pytest.skip("real sizes run on a GPU: no error to check")
    with pytest.raises(SystemExit) as err:
        suite.main(argv)
    assert err.value.code == 2
    assert re.search(re.escape(message), capsys.readouterr().err)


def test_kernel_failure_is_reported_not_fatal(monkeypatch, tmp_path, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("triton says no")

    monkeypatch.setattr(gpu_kernel, "check_kernel", broken)
    out = tmp_path / "report.md"
    assert suite.main(["--tiny", "--skip-stages", "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "| FAIL (0 inputs) |" in printed and printed.rstrip().endswith("OVERALL: FAIL")
    text = out.read_text()
    assert "RuntimeError: triton says no" in text and "Traceback" in text
    assert _report(out)["kernel"]


# ----------------------------------------------------------------------------- lowered for cuda

def _lowered_round_hlo(pair, method, *, use_pallas=True, attention="auto",
                       platform="cuda"):
    import dataclasses
    spec = configs.real_pairs()[pair]
    spec = dataclasses.replace(spec, target=dataclasses.replace(spec.target,
                                                                attention_impl=attention))
    config = rounds.decode_configs(spec, max_new_tokens=512, use_pallas=use_pallas)[method]
    args = rounds.abstract_round_args(spec, config, context=512, max_new_tokens=512)
    traced = rounds.round_stage.trace(*args, config=config)
    cache, _, _, tau = traced.out_info
    for kv in jax.tree.leaves(cache):  # sized for the pair's largest verify (17 rows); bf16
        # values, stored as their bits (model/cache.py: in-place writes on XLA:CPU)
        assert 512 + 512 + 17 in kv.shape and value_dtype(kv.dtype) == jnp.bfloat16
    assert tau.shape == (1,)
    return traced.lower(lowering_platforms=(platform,)).as_text(dialect="hlo")


def _conditionals(hlo: str) -> int:
    return len(re.findall(r"\sconditional\(", hlo))


@pytest.mark.parametrize("pair,method", [
    ("qwen3-4b-domino", "ar"), ("qwen3-4b-domino", "dflash"), ("qwen3-4b-domino", "ddtree"),
    ("qwen3-4b-domino", "domino"), ("qwen3-4b-domino", "dominotree"),
])
def test_real_size_round_for_cuda_has_no_conditional(pair, method):
    """The whole jitted round at real size (abstract bf16 weights: no memory), lowered for a
    GPU from this host: one module, no conditional anywhere (36 dense attention passes, no
    bucket switch), DominoTree's carries the Triton top-M kernel (root + pop loop, two launches
    each: the grid kernel), and no sort spans the vocabulary (two-stage top-M)."""
    hlo = _lowered_round_hlo(pair, method)
    assert hlo.count("HloModule ") == 1
    assert _conditionals(hlo) == 0
    assert hlo.count('custom_call_target="__gpu$xla.gpu.triton"') == (
        4 if method == "dominotree" else 0)
    selections = _selection_operand_types(hlo)
    assert bool(selections) == (method in ("ddtree", "dominotree"))  # chains: argmax only
    assert not [t for t in selections if "151936]" in t], selections


def _selection_operand_types(hlo: str) -> list[str]:
    """The type of the first operand of every ``topk`` / ``sort`` in an HLO text (an operand
    is printed by name only: its type is on the line that defines it)."""
    types = {}
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?(\S+) = (\S+) ", line)
        if m:
            types[m.group(1)] = m.group(2)
    out = []
    for line in hlo.splitlines():
        m = re.search(r"\s(?:topk|sort)\(([^,)]+)", line)
        if m:
            out.append(types.get(m.group(1).strip().lstrip("%"), "?"))
    return out


def test_cpu_lowering_keeps_the_bucket_switch():
    """The same round for the host platform: ``auto`` attention is the bucket switch there (one
    conditional per target layer), and ``dense`` removes it."""
    hlo = _lowered_round_hlo("qwen3-4b-domino", "dflash", platform="cpu")
    assert _conditionals(hlo) == 36
    dense = _lowered_round_hlo("qwen3-4b-domino", "dflash", platform="cpu",
                               attention="dense")
    assert _conditionals(dense) == 0


def test_one_compiled_program_per_round_shape():
    """Rounds at other start positions and contents reuse the compiled round."""
    spec = configs.tiny_pairs()["qwen3-4b-domino"]
    params = gpu_weights.pair_params(spec)
    run = measure.PairRun(spec, params, rounds.decode_configs(spec, max_new_tokens=8,
                                                           use_pallas=False),
                        8, 8, 1, 1, jnp.full((1,), 3, jnp.int32), jnp.full((1,), 8, jnp.int32),
                        jnp.ones((1,), jnp.int32))
    call = measure._round_caller(run, run.configs["dominotree"])
    jax.block_until_ready(call())
    before = rounds.round_stage._cache_size()
    for start in (9, 11):
        run.start_B = jnp.full((1,), start, jnp.int32)
        jax.block_until_ready(measure._round_caller(run, run.configs["dominotree"])())
    assert rounds.round_stage._cache_size() == before


def test_runs_as_a_module_from_the_repository_root(tmp_path):
    """As gpu_device_run.sh runs it: ``python -m benchmarks gpu suite`` in the repository root."""
    import subprocess
    out = tmp_path / "r.md"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "gpu", "suite"] + FAST + [
        "--pairs", "qwen3-4b-domino", "--methods", "dflash", "--stages", "round",
        "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("OVERALL: PASS")
    assert _report(out)["pairs"]["qwen3-4b-domino"]["methods"]["dflash"]["round"]["round_ms"] > 0


def test_prepared_device_command(tmp_path, capsys):
    """The suite call in benchmarks/gpu_device_run.sh parses, runs the 4B Domino pair first,
    and with the script's other files stays within the 8 files a device call returns."""
    import shlex
    text = DEVICE_RUN.read_text()
    call = text[text.index('"$PY" -m benchmarks gpu suite'):].split(">")[0]
    argv = shlex.split(call.replace("\\\n", " "))[5:]  # past "$PY" -m benchmarks gpu suite
    argv = [a.replace('"$SUITE_SECONDS"', "500").replace("$SUITE_SECONDS", "500")
            .replace("$OUT", str(tmp_path)) for a in argv]
    assert argv[argv.index("--pairs") + 1].split(",")[0] == "qwen3-4b-domino"
    assert int(argv[argv.index("--deadline") + 1]) + 50 < 600
    assert suite.main(argv + ["--tiny", "--deadline", "0"]) == 0
    report = _report(tmp_path / "gpu_suite.md")
    assert list(report["pairs"]) == ["qwen3-4b-domino", "qwen3-8b-domino"]
    written = set(re.findall(r'\$OUT/([A-Za-z0-9_.-]+)"', text))
    written |= {"gpu_suite.md", "gpu_suite.json"}
    assert len(written) <= 8, written
    capsys.readouterr()


def test_prepared_targets_command(tmp_path, capsys):
    """benchmarks/gpu_targets_run.sh: its suite call parses and runs both of today's pairs
    (Qwen3.5-4B hybrid, Qwen3-Coder-30B-A3B MoE) at tiny size, within 8 returned files."""
    import shlex
    text = (REPO / "benchmarks" / "gpu_targets_run.sh").read_text()
    call = text[text.index('"$PY" -m benchmarks gpu suite'):].split(">")[0]
    argv = shlex.split(call.replace("\\\n", " "))[5:]
    argv = [a.replace('"$SUITE_SECONDS"', "520").replace("$SUITE_SECONDS", "520")
            .replace("$OUT", str(tmp_path)) for a in argv]
    assert int(argv[argv.index("--deadline") + 1]) + 50 < 600
    assert suite.main(argv + FAST[1:] + ["--tiny", "--deadline", "0", "--methods", "dflash"]) == 0
    report = _report(tmp_path / "gpu_suite.md")
    assert list(report["pairs"]) == ["qwen3.5-4b-dflash", "qwen3-coder-30b-a3b-dflash"]
    written = set(re.findall(r'\$OUT/([A-Za-z0-9_.-]+)"', text)) | {"gpu_suite.json"}
    assert len(written) <= 8, written
    capsys.readouterr()
