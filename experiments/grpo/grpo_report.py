"""The report of a GRPO arm comparison directory (``grpo_run``): a markdown table of the arms'
CSVs, the arms timed beside an ``ar`` engine (``beside_ar`` columns) and the side-by-side speed
rows (``grpo_speed``'s ``speed.csv``) as further tables when present, written to ``table.md``,
and ``grpo.png`` (reward, τ, rollout tokens/s per step)."""

from __future__ import annotations

import csv
import os

import numpy as np

from experiments.grpo.grpo_run import arm_csv_path, csv_rows

TEXT_FIELDS = ("arm", "time_utc")   # the arm CSV's columns that are not numbers


def read_arm_csv(path: str) -> list[dict]:
    """An arm's CSV rows, numbers as floats (an empty cell stays ``""``)."""
    with open(path) as f:
        return [{k: (float(v) if k not in TEXT_FIELDS and v != "" else v) for k, v in r.items()}
                for r in csv.DictReader(f)]


def moving_mean(x, window: int = 5) -> np.ndarray:
    """The mean of each value and the ``window - 1`` before it (fewer at the start)."""
    x = np.asarray(x, float)
    return np.array([x[max(0, i - window + 1):i + 1].mean() for i in range(len(x))])


def arm_table(runs: dict[str, list[dict]]) -> list[str]:
    """Markdown lines: per arm, reward and τ over the first and last 10 steps, medians of
    rollout tokens/s and seconds (from step 1: step 0 compiles), refresh seconds and load."""
    lines = ["| arm | steps | reward first 10 → last 10 | τ first 10 → last 10 | "
             "rollout tok/s (median, steps ≥ 1) | rollout s/step (median) | refresh s/step "
             "(median) | load (median) |", "|---|---|---|---|---|---|---|---|"]
    first, last = slice(0, 10), slice(-10, None)
    for arm, rows in runs.items():
        def m(key, sl):
            return float(np.mean([r[key] for r in rows[sl]]))
        ref = [r["refresh_s"] for r in rows[1:] if r["refresh_s"] != ""]
        lines.append(
            f"| {arm} | {len(rows)} | {m('reward_mean', first):.2f} → "
            f"{m('reward_mean', last):.2f} | {m('tau', first):.2f} → {m('tau', last):.2f} | "
            f"{np.median([r['tokens_per_s'] for r in rows[1:]]):.1f} | "
            f"{np.median([r['rollout_s'] for r in rows[1:]]):.1f} | "
            f"{np.median(ref) if ref else float('nan'):.2f} | "
            f"{np.median([r['loadavg_1m'] for r in rows]):.2f} |")
    return lines


def speed_table(path: str) -> list[str]:
    """Markdown lines: per (policy, arm) of ``speed.csv``, in first-seen order, with how many
    timed calls ran a draft size for the first time (``grpo_speed.FIRST_USE``)."""
    rows = csv_rows(path)
    lines = ["| policy | arm | decode batch | timed calls | tokens/s (median) | τ | reward | "
             "calls with a first-used draft size |", "|---|---|---|---|---|---|---|---|"]
    for key in dict.fromkeys((r["policy"], r["arm"]) for r in rows):
        rs = [r for r in rows if (r["policy"], r["arm"]) == key]
        lines.append(f"| {key[0]} | {key[1]} | {rs[0]['batch']} | {len(rs)} | "
                     f"{np.median([float(r['tokens_per_s']) for r in rs]):.1f} | "
                     f"{np.mean([float(r['tau']) for r in rs]):.2f} | "
                     f"{np.mean([float(r['reward_mean']) for r in rs]):.2f} | "
                     f"{sum(bool(r.get('first_used_sizes')) for r in rs)} |")
    return lines


def beside_table(runs: dict[str, list[dict]], last: int = 20) -> list[str]:
    """Markdown lines for the arms whose CSV has ``beside_ar`` columns (``grpo_run``): the
    arm's rollout tokens/s against the ``ar`` engine's on the same calls, over the last
    ``last`` steps: the median of the per-step ratios and the ratio of the sums (tokens over
    seconds), without and with the refresh's seconds. Empty when no arm has them."""
    lines = []
    for arm, rows in runs.items():
        rs = [r for r in rows[1:] if r.get("beside_ar_tokens_per_s", "") != ""][-last:]
        if not rs:
            continue
        if not lines:
            lines = [f"| arm | steps (last {last}, of those timed beside `ar`) | rollout tok/s "
                     "| `ar` beside tok/s | arm / `ar` (median per step; sums) | with the "
                     "refresh (median; sums) |", "|---|---|---:|---:|---|---|"]
        ar_s = [r["beside_ar_tokens"] / r["beside_ar_tokens_per_s"] for r in rs]
        own = [r["tokens_per_s"] / r["beside_ar_tokens_per_s"] for r in rs]
        refresh = [r["refresh_s"] or 0.0 for r in rs]
        with_refresh = [(r["rollout_tokens"] / (r["rollout_s"] + f)) / r["beside_ar_tokens_per_s"]
                        for r, f in zip(rs, refresh)]
        tokens = sum(r["rollout_tokens"] for r in rs)
        seconds = sum(r["rollout_s"] for r in rs)
        ar_rate = sum(r["beside_ar_tokens"] for r in rs) / sum(ar_s)
        lines.append(f"| {arm} | {int(rs[0]['step'])}-{int(rs[-1]['step'])} | "
                     f"{tokens / seconds:.1f} | {ar_rate:.1f} | {np.median(own):.2f} "
                     f"({tokens / seconds / ar_rate:.2f}) | {np.median(with_refresh):.2f} "
                     f"({tokens / (seconds + sum(refresh)) / ar_rate:.2f}) |")
    return lines


def plot_arms(runs: dict[str, list[dict]], path: str) -> None:
    """Reward (moving mean of 5), τ and rollout tokens/s (from step 1, moving mean of 5) per
    step, one line per arm, saved as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    for arm, rows in runs.items():
        steps = [r["step"] for r in rows]
        ax[0].plot(steps, moving_mean([r["reward_mean"] for r in rows]), label=arm)
        ax[1].plot(steps, [r["tau"] for r in rows], label=arm)
        ax[2].plot(steps[1:], moving_mean([r["tokens_per_s"] for r in rows[1:]]), label=arm)
    for a, title in zip(ax, ("reward mean (moving mean of 5)", "τ: tokens per target forward",
                             "rollout tokens/s (moving mean of 5; shared CPU)")):
        a.set_title(title)
        a.set_xlabel("GRPO step")
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out: str, arms) -> str:
    """``<out>/table.md`` and ``<out>/grpo.png`` from the CSVs of ``arms`` found in ``out``
    (and ``speed.csv``); returns the table."""
    runs = {arm: read_arm_csv(arm_csv_path(out, arm)) for arm in arms
            if os.path.exists(arm_csv_path(out, arm))}
    runs = {arm: rows for arm, rows in runs.items() if rows}
    if not runs:
        raise FileNotFoundError(f"no arm CSVs in {out}")
    lines = arm_table(runs)
    beside = beside_table(runs)
    if beside:   # each drafting arm against an ar engine on its own calls (grpo_run)
        lines += [""] + beside
    speed = os.path.join(out, "speed.csv")
    if os.path.exists(speed):   # the exclusive side-by-side measurement (grpo_speed)
        lines += [""] + speed_table(speed)
    table = "\n".join(lines)
    plot_arms(runs, os.path.join(out, "grpo.png"))
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table + "\n")
    return table
