"""The benchmark driver: decode every prompt with every method, batch size 1, and time it.

Compilation. ``decode`` compiles once per ``DecodeConfig`` and prompt shape. Prompts are
right-padded to a few fixed bucket widths (``prompt_lengths`` hides the padding), so one
ahead-of-time compile per (method, temperature, width) serves every prompt of that width; the
compile happens before the first timed call and is recorded separately.

Timing. One prompt at a time: wall time of the compiled call up to ``block_until_ready``
(prefill included, compile excluded). Prompts are the outer loop and methods the inner one, so
the machine's load drifts over all methods alike.

Identity. At temperature 0 every method must emit exactly ``ar``'s tokens
(docs/algorithm.md §5: lossless);
``check_identity`` compares them per prompt and each mismatch is printed and recorded.
At temperature > 0 every method gets the same fixed key per prompt (``seed`` folded with the
prompt index); outputs then differ between methods and are not compared.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.decoding.auto_size import initial_state
from dominotree_jax.decoding.decode import decode
from dominotree_jax.decoding.config import METHODS

DEFAULT_BUCKETS = (128, 256, 512, 1024, 2048)


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    methods: tuple[str, ...] = METHODS
    temperatures: tuple[float, ...] = (0.0, 0.5, 1.0)
    max_new_tokens: int = 80
    budget: int = 16
    node_topk: int = 8
    top_m: int = 0
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    seed: int = 0
    stop_ids: tuple[int, ...] | None = None  # None: the pair's default (the tokenizer's eos ids)
    # also run every drafting method with budget="auto" (labelled "<method>/auto"); auto_only:
    # run only those (and ar)
    auto: bool = True
    auto_only: bool = False
    # lookup drafting: K > 0 also runs every drafting method with lookup=K ("<method>+lookup",
    # and "<method>+lookup/auto" with auto); method "lookup" (no drafter) takes K (or 4)
    lookup: int = 0

    def __post_init__(self):
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise ValueError(f"unknown method(s) {bad}; choose from {METHODS}")
        if any(t < 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be >= 0, got {self.temperatures}")
        if not self.buckets or any(b < 1 for b in self.buckets):
            raise ValueError(f"bucket widths must be positive, got {self.buckets}")
        # ``ar`` runs first: it is the speed reference and the identity reference.
        object.__setattr__(self, "methods",
                           ("ar",) + tuple(dict.fromkeys(m for m in self.methods if m != "ar")))
        object.__setattr__(self, "buckets", tuple(sorted(set(self.buckets))))

    @property
    def variants(self) -> tuple[tuple[str, str, int | str, int], ...]:
        """``(label, method, budget, lookup)`` of every decode run per prompt, ``ar`` first."""
        out = [("ar", "ar", self.budget, 0)]
        for m in self.methods[1:]:
            if m == "lookup":
                out.append(("lookup", "lookup", self.budget, self.lookup or 4))
                continue
            for suffix, k in (("", 0),) + (((("+lookup", self.lookup),) if self.lookup
                                            else ())):
                if not self.auto_only:
                    out.append((m + suffix, m, self.budget, k))
                if self.auto or self.auto_only:
                    out.append((f"{m}{suffix}/auto", m, "auto", k))
        return tuple(out)


def bucket_width(prompt_len: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds ``prompt_len`` tokens (past the largest: its multiples)."""
    for b in buckets:
        if prompt_len <= b:
            return b
    top = buckets[-1]
    return -(-prompt_len // top) * top


def pad_prompt(ids: list[int], width: int) -> np.ndarray:
    """``[1, width]`` int32, right-padded with zeros."""
    out_1T = np.zeros((1, width), np.int32)
    out_1T[0, :len(ids)] = ids
    return out_1T


def check_identity(reference: list[int], tokens: list[int]) -> dict | None:
    """None when ``tokens == reference``, else where and how they first differ."""
    reference, tokens = list(reference), list(tokens)
    if reference == tokens:
        return None
    n = min(len(reference), len(tokens))
    first = next((i for i in range(n) if reference[i] != tokens[i]), n)
    return {"first_diff": first, "ref_len": len(reference), "len": len(tokens),
            "ref_token": reference[first] if first < len(reference) else None,
            "token": tokens[first] if first < len(tokens) else None}


class CompiledDecoders:
    """Ahead-of-time compiled ``decode`` programs, one per (config, prompt width).

    A program's first execution is slower (XLA:CPU finishes preparing its kernels then: ~0.6 s
    on SmolLM2 here), so each new program runs once untimed on the prompt that first needs it.
    """

    def __init__(self, params, *, compiler_options=None):
        self.params = params
        # compiler_options: XLA options for every program (None: XLA's defaults, what the
        # benchmark times; the tests pass cheaper-to-compile ones)
        self._jit = jax.jit(decode, static_argnames="config", compiler_options=compiler_options)
        self._cache: dict[tuple[Any, int], Any] = {}
        # budget="auto": the policy state is carried from call to call of a config (what a
        # server or an RL loop does: the first prompt starts optimistic, the next ones from
        # what the previous rounds measured)
        self.auto_states: dict[Any, Any] = {}
        self.compile_s: dict[tuple[Any, int], float] = {}
        self.warmup_s: dict[tuple[Any, int], float] = {}

    def _compile(self, config, width: int):
        t0 = time.perf_counter()
        state = None
        if config.is_auto:
            state = initial_state(config, 1)
        fn = self._jit.lower(
            self.params, jax.ShapeDtypeStruct((1, width), jnp.int32), config=config,
            key=jax.random.key(0), prompt_lengths=jax.ShapeDtypeStruct((1,), jnp.int32),
            auto_state=state).compile()
        self.compile_s[config, width] = time.perf_counter() - t0
        return fn

    def __call__(self, config, prompt_1T, length: int, key):
        """(DecodeOutput, wall seconds) of one timed call (compiling and warming up first)."""
        prompt_1T = jnp.asarray(prompt_1T)
        lengths_1 = jnp.asarray([length], jnp.int32)
        jax.block_until_ready((prompt_1T, lengths_1, key))
        cache_key = (config, prompt_1T.shape[1])
        state = None
        if config.is_auto:
            state = self.auto_states.get(config) or initial_state(config, 1)
        fn = self._cache.get(cache_key)
        if fn is None:
            fn = self._cache[cache_key] = self._compile(*cache_key)
            t0 = time.perf_counter()
            jax.block_until_ready(fn(self.params, prompt_1T, key=key, prompt_lengths=lengths_1,
                                     auto_state=state))
            self.warmup_s[cache_key] = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(self.params, prompt_1T, key=key, prompt_lengths=lengths_1,
                                       auto_state=state))
        if config.is_auto:
            self.auto_states[config] = out.auto_state
        return out, time.perf_counter() - t0


def _prompt_key(seed: int, dataset_index: int, prompt_index: int):
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), dataset_index),
                              prompt_index)


def _record(out, wall_s: float) -> dict:
    n = int(out.num_tokens[0])
    rounds = int(out.num_rounds[0])
    taus = np.asarray(out.accept_lengths[0, :rounds]).tolist()
    sizes = np.asarray(out.draft_sizes[0, :rounds]).tolist()   # draft nodes verified per round
    return {"num_tokens": n, "num_rounds": rounds, "taus": taus, "sizes": sizes,
            "wall_s": wall_s,
            "tokens": np.asarray(out.tokens[0, :n]).tolist()}


def run_benchmark(pair, prompts: dict[str, list[list[int]]], settings: BenchSettings, *,
                  progress: bool = True, log: Callable[[str], None] | None = None) -> dict:
    """Decode ``prompts`` (dataset → token-id lists) with every method and temperature.

    ``pair``: a ``dominotree_jax.Pair``. Returns ``{"records": [...], "mismatches": [...],
    "compiles": [...]}``: one record per (dataset, temperature, prompt, method).
    """
    from tqdm.auto import tqdm

    decoders = CompiledDecoders(pair.params)
    configs = {}
    for label, method, budget, lookup in settings.variants:
        for temp in settings.temperatures:
            kw = dict(max_new_tokens=settings.max_new_tokens, temperature=float(temp),
                      budget=budget, node_topk=settings.node_topk, top_m=settings.top_m,
                      lookup=lookup)
            if settings.stop_ids is not None:
                kw["stop_ids"] = tuple(settings.stop_ids)
            configs[label, temp] = pair.config(method, **kw)
    labels = [v[0] for v in settings.variants]

    total = (sum(len(p) for p in prompts.values()) * len(settings.temperatures)
             * len(labels))
    bar = tqdm(total=total, disable=not progress, desc="bench", unit="run", file=sys.stderr,
               dynamic_ncols=True)
    say = log or (lambda msg: tqdm.write(msg, file=sys.stderr))
    records, mismatches = [], []
    for d_idx, (dataset, plist) in enumerate(prompts.items()):
        for temp in settings.temperatures:
            for p_idx, ids in enumerate(plist):
                width = bucket_width(len(ids), settings.buckets)
                prompt_1T = pad_prompt(ids, width)
                key = _prompt_key(settings.seed, d_idx, p_idx)
                reference = None
                for method in labels:
                    cfg = configs[method, temp]
                    if (cfg, width) not in decoders.compile_s:
                        bar.set_postfix_str(f"compiling + warm-up: {method} T={temp:g} "
                                            f"width={width}")
                    out, wall_s = decoders(cfg, prompt_1T, len(ids), key)
                    rec = {"dataset": dataset, "temperature": float(temp), "prompt": p_idx,
                           "prompt_tokens": len(ids), "width": width, "method": method,
                           "budget": cfg.budget if cfg.method != "ar" else 0,
                           **_record(out, wall_s), "mismatch": None}
                    if method == "ar":
                        reference = rec["tokens"]
                    elif temp == 0:
                        rec["mismatch"] = check_identity(reference, rec["tokens"])
                        if rec["mismatch"] is not None:
                            mm = {"dataset": dataset, "prompt": p_idx, "method": method,
                                  **rec["mismatch"]}
                            mismatches.append(mm)
                            say(f"!!! MISMATCH at T=0: {method} differs from ar on {dataset} "
                                f"prompt {p_idx}: first difference at token {mm['first_diff']} "
                                f"(ar {mm['ref_token']}, {method} {mm['token']})")
                    records.append(rec)
                    bar.set_postfix_str(f"{dataset} T={temp:g} {method} "
                                        f"{rec['num_tokens'] / wall_s:.1f} tok/s")
                    bar.update()
    bar.close()
    compiles = [{"method": cfg.method, "budget": cfg.budget, "temperature": cfg.temperature,
                 "width": w,
                 "compile_s": s, "warmup_s": decoders.warmup_s[cfg, w]}
                for (cfg, w), s in decoders.compile_s.items()]
    auto_costs = {label: [t.to_json() for t in cfg.auto_costs]   # the tables auto mode used
                  for (label, temp), cfg in configs.items() if cfg.is_auto}
    return {"records": records, "mismatches": mismatches, "compiles": compiles,
            "auto_costs": auto_costs}


def machine_info() -> dict:
    """Where the numbers come from: CPU, cores, load, library versions, JAX devices."""
    import datetime
    import os
    import platform

    from dominotree_jax.measure.timing import cpu_model

    cpu = cpu_model()
    devices = [str(d) for d in jax.devices()]
    info = {"cpu": cpu, "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "jax": jax.__version__,
            "jaxlib": getattr(jax.lib, "__version__", None) or _dist_version("jaxlib"),
            "backend": jax.default_backend(), "devices": devices,
            "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    info["summary"] = (f"{cpu}, {info['cpu_count']} cores, {info['backend']} "
                       f"({len(devices)} device(s)), jax {info['jax']}")
    info["date"] = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}"
    return info


def _dist_version(name: str):
    import importlib.metadata
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def run_and_report(pair, prompts: dict[str, list[list[int]]], settings: BenchSettings,
                   out_dir: str | None, *, target_name: str, drafter_name: str, command: str,
                   progress: bool = True, extra_settings: dict | None = None) -> dict:
    """``run_benchmark`` + summary + machine info; writes the outputs when ``out_dir`` is set."""
    import os

    from benchmarks.methods import bench_report as report

    machine = machine_info()
    t0 = time.perf_counter()
    raw = run_benchmark(pair, prompts, settings, progress=progress)
    total_s = time.perf_counter() - t0
    if hasattr(os, "getloadavg"):
        machine["loadavg_end"] = list(os.getloadavg())
    result = {
        "command": command,
        "settings": {**dataclasses.asdict(settings), "datasets": list(prompts),
                     "num_prompts": max((len(p) for p in prompts.values()), default=0),
                     "target": target_name, "drafter": drafter_name, "batch_size": 1,
                     **(extra_settings or {})},
        "machine": machine, "total_s": total_s,
        "cells": report.summarize(raw["records"]), **raw,
    }
    if out_dir is not None:
        result["outputs"] = report.write_all(result, out_dir)
    return result
