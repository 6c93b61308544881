"""The suite's report: the environment a number depends on, the markdown tables (kernel check,
one per pair: ours next to the paper's), the failures with their tracebacks, the JSON beside it,
merging an earlier report, and the overall verdict."""

from __future__ import annotations

import collections
import datetime
import json
import os
import platform
import statistics
from pathlib import Path

import jax

from pallas_kernels.topm_expand import default_device_compiles_kernel, device_platform

from benchmarks.gpu.configs import PAPER_ROUND, PUBLISHED

def environment(args_summary: dict) -> dict:
    """Versions, device and flags: what a number measured here depends on."""
    import flax
    import jaxlib
    dev = jax.devices()[0]
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith(("XLA_", "JAX_", "TF_CPP", "CUDA_VISIBLE", "NVIDIA_"))}
    kind = getattr(dev, "device_kind", "") or dev.platform
    return dict(
        python=platform.python_version(), jax=jax.__version__,
        jaxlib=getattr(jaxlib, "__version__", None) or jax.lib.__version__,
        flax=flax.__version__, backend=jax.default_backend(), platform=device_platform(dev),
        device_kind=kind, device_count=jax.device_count(),
        compute_capability=getattr(dev, "compute_capability", None),
        platform_version=str(getattr(dev.client, "platform_version", "")),
        pallas_kernel_compiles=default_device_compiles_kernel(),
        xla_flags=os.environ.get("XLA_FLAGS", ""), env=env,
        jax_config={name: getattr(jax.config, name, None) for name in (
            "jax_default_matmul_precision", "jax_enable_x64", "jax_compilation_cache_dir")},
        host=platform.node(), cpu=platform.processor() or platform.machine(),
        started_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **args_summary)


def device_line(env: dict) -> str:
    return (f"jax {env['jax']} (jaxlib {env['jaxlib']}, flax {env['flax']}), backend "
            f"{env['backend']}, {env['device_count']} x {env['device_kind']}"
            + (f" (compute capability {env['compute_capability']})"
               if env.get("compute_capability") else ""))


def _cell(part: dict | None, key: str, fmt: str = "{:.3f}") -> str:
    if not part:
        return "–"
    if part.get("skipped"):
        return "skipped"
    if "error" in part:
        return "FAILED"
    return fmt.format(part[key]) if key in part else "–"


def pair_table(entry: dict, env: dict) -> list[str]:
    """One markdown table: rows of figures × methods, ours next to the paper's."""
    methods = list(entry["methods"])
    published = PUBLISHED.get(entry.get("published") or "", {})
    rounds = {m: entry["methods"][m].get("round") or {} for m in methods}
    stages = {m: entry["methods"][m].get("stages") or {} for m in methods}

    def ok(part):
        return bool(part) and "error" not in part and not part.get("skipped")

    def row(label, cells):
        return f"| {label} | " + " | ".join(cells) + " |"

    out = [row("ms (batch 1)", methods), "|---|" + "---|" * len(methods)]
    out.append(row("AR step (timed beside the round)", [_cell(rounds[m], "ar_ms")
                                                        for m in methods]))
    out.append(row("round (one jitted function)", [_cell(rounds[m], "round_ms")
                                                   for m in methods]))
    for stage, label in (("draft", "draft"), ("build", "build"), ("verify", "verify"),
                         ("accept_commit", "accept/commit")):
        out.append(row(label, [_cell(stages[m], f"{stage}_ms") for m in methods]))
    out.append(row("**round / AR step (ours)**", [
        f"**{rounds[m]['round_ms'] / rounds[m]['ar_ms']:.2f}**" if ok(rounds[m]) else "–"
        for m in methods]))
    out.append(row("paper round / AR step (tau / speedup)", [
        f"{published[m].round_per_ar:.2f}" if m in published else "–" for m in methods]))
    out.append(row("published tau", [f"{published[m].tau:.2f}" if m in published else "–"
                                     for m in methods]))
    out.append(row("published speedup", [f"{published[m].speedup:.2f}x" if m in published
                                         else "–" for m in methods]))
    out.append(row("our speedup at the published tau (tau x AR / round)", [
        f"{published[m].tau * rounds[m]['ar_ms'] / rounds[m]['round_ms']:.2f}x"
        if m in published and ok(rounds[m]) else "–" for m in methods]))
    out.append(row("build share of the round (paper, DominoTree: "
                   f"{100 * PAPER_ROUND['build'] / PAPER_ROUND['round']:.0f}%)", [
        f"{100 * stages[m]['build_ms'] / stages[m]['round_ms']:.1f}%" if ok(stages[m]) else "–"
        for m in methods]))
    out.append(row("round programs compiled (at most 1)", [
        str(rounds[m]["round_programs"]) if ok(rounds[m]) and rounds[m]["round_programs"]
        is not None else "–" for m in methods]))
    out.append(row("compile s (round)", [_cell(rounds[m], "compile_s", "{:.1f}")
                                         for m in methods]))
    return out


def bandwidth_line(entry: dict, env: dict) -> str:
    ars = [p["ar_ms"] for p in (entry["methods"][m].get("round") or {} for m in entry["methods"])
           if "ar_ms" in p]
    if not ars or not entry.get("ar_bytes"):
        return "AR step bandwidth: not measured."
    ar_ms = statistics.median(ars)
    achieved = entry["ar_bytes"] / (ar_ms * 1e-3)
    peak = env.get("peak_bandwidth")
    share = f", {100 * achieved / peak:.0f}% of the device's {peak / 1e12:.2f} TB/s" if peak \
        else " (device peak unknown: pass --peak-gbps)"
    return (f"AR step {ar_ms:.3f} ms (median over the methods' side-by-side runs) reads "
            f"{entry['ar_bytes'] / 1e9:.2f} GB (weights + {entry['context']} cached slots): "
            f"{achieved / 1e9:.0f} GB/s achieved{share}.")


def kernel_table(rows: dict[str, dict]) -> list[str]:
    out = ["| drafter | shapes | mode | kernels vs jnp | max abs dlp | pop jnp us | pop Pallas us "
           "(grid / single) | build_tree same | build jnp ms | build Pallas ms |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        # reports written before the grid kernel hold one Pallas pop, ``pop_pallas_us`` (the
        # single program)
        kernels = r.get("pop_kernels_us") or {"single": r["pop_pallas_us"]}
        pops = " / ".join(f"{kernels[k]:.1f}" if k in kernels else "-" for k in ("grid", "single"))
        out.append(f"| {name} | {r['shapes']} | {r['mode']} | {verdict(r['kernel_ok'])} "
                   f"({r['seeds']} inputs) | {r['max_abs_dlp']:.1e} | {r['pop_jnp_us']:.1f} "
                   f"| {pops} | {verdict(r['trees_equal'])} "
                   f"| {r['build_jnp_ms']:.3f} | {r['build_pallas_ms']:.3f} |")
    variant_rows = [(name, r["variants"]) for name, r in rows.items() if r.get("variants")]
    if variant_rows:
        names = list(variant_rows[0][1])
        out += ["", "| drafter | " + " | ".join(f"pop us, {v} (warps x stages, grid kernel)"
                                               for v in names)
                + " |", "|---|" + "---|" * len(names)]
        for name, variants in variant_rows:
            out.append(f"| {name} | " + " | ".join(
                f"{variants[v]['pop_us']:.1f}" if "pop_us" in variants.get(v, {})
                else f"FAILED {variants.get(v, {}).get('error', '')}" for v in names) + " |")
    return out


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def failures(report: dict) -> list[str]:
    """``"where: error"`` of every failed part, and its traceback, for the report's end."""
    out = []
    for name, r in report.get("kernel", {}).items():
        if r.get("error"):
            out.append((f"kernel check {name}", r["error"], r.get("traceback", "")))
    for pname, entry in report.get("pairs", {}).items():
        if (entry.get("setup") or {}).get("error"):
            out.append((f"{pname} setup", entry["setup"]["error"],
                        entry["setup"].get("traceback", "")))
        for m, parts in entry["methods"].items():
            for part, r in parts.items():
                if isinstance(r, dict) and r.get("error"):
                    out.append((f"{pname} {m} {part}", r["error"], r.get("traceback", "")))
                elif isinstance(r, dict) and r.get("round_programs") not in (None, 0, 1):
                    out.append((f"{pname} {m} {part}", f"{r['round_programs']} round programs "
                                "compiled for one round shape (at most 1)", ""))
    return out


def write_report(report: dict, out: Path) -> None:
    env = report["environment"]
    lines = ["# GPU suite: Pallas kernel check and round stages", "",
             f"`{report['command']}`", "", f"Device: {device_line(env)}.", "",
             f"Switches: tree kernel `{env['tree_kernel']}`, attention `{env['attention']}`; "
             f"XLA_FLAGS `{env['xla_flags'] or '(none)'}`. Random weights in bfloat16, batch 1; "
             f"each time is the median over {env['repeats']} interleaved samples of "
             f"{env['inner']} calls dispatched back to back (per call).", ""]
    if report.get("kernel"):
        lines += ["## Pallas top-M kernel vs its jnp twin", ""] + kernel_table(report["kernel"])
        lines += [""]
    for entry in report.get("pairs", {}).values():
        rows = ", ".join(f"{m} {p['round']['verify_rows']}" for m, p in entry["methods"].items()
                         if "verify_rows" in (p.get("round") or {}))
        lines += [f"## {entry['title']}", "",
                  f"Context {entry['context']} committed tokens, "
                  f"{entry.get('cache_slots', '?')} cache slots; verify rows: {rows or '–'}; "
                  f"tree expansions: {entry.get('tree_kernel', '?')}; attention "
                  f"`{entry.get('attention', '?')}`.", "", bandwidth_line(entry, env), ""]
        if not entry.get("published"):
            lines += ["No published figures for this target in this repository "
                      "(docs/algorithm.md §7 has Qwen3-4B's only).", ""]
        lines += pair_table(entry, env) + [""]
    failed = failures(report)
    if failed:
        lines += ["## Failures", ""]
        for where, error, tb in failed:
            lines += [f"FAILED {where}: `{error}`", ""]
            lines += ["```", tb.rstrip(), "```", ""] if tb else []
    lines += ["Paper-implied round / AR step = published tau / published speedup (Qwen3-4B, "
              "temperature 0, one GPU). Our speedup at the published tau = tau x AR step / "
              "round: what our measured round would give at the paper's acceptance lengths.", ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_md, tmp_json = out.with_suffix(".md.tmp"), out.with_suffix(".json.tmp")
    tmp_md.write_text("\n".join(lines))
    tmp_json.write_text(json.dumps(report, indent=1, default=str))
    tmp_md.replace(out)
    tmp_json.replace(out.with_suffix(".json"))


def merge_into(report: dict, old: dict) -> None:
    """Start ``report`` from an older one of the same device: its kernel rows and its pairs'
    methods stay unless this run measures them again (``run_isolated`` keeps an old result
    where this run only skips)."""
    report["kernel"].update(old.get("kernel", {}))
    for name, entry in old.get("pairs", {}).items():
        report["pairs"][name] = entry
    report["command"] = old.get("command", "") + "; " + report["command"]


def overall(outcomes: collections.Counter, kernel_ok: bool) -> str:
    if outcomes["error"] or not kernel_ok:
        return "FAIL"
    return "PARTIAL (deadline)" if outcomes["skipped"] else "PASS"
