"""The GRPO comparison report (``grpo_report``) from hand-written arm and speed CSVs:
the table's figures, the skipped arms, the plot and ``table.md``."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from experiments.grpo.grpo_report import moving_mean, read_arm_csv, write_report
from experiments.grpo.grpo_run import ARM_CSV_FIELDS


def _arm_csv(path, arm, n, refresh):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, ARM_CSV_FIELDS)
        w.writeheader()
        for s in range(n):
            w.writerow({"arm": arm, "step": s, "reward_mean": s / n, "rollout_s": 10 + s,
                        "tokens_per_s": 100 + 10 * s, "tau": 1 + s / 10,
                        "refresh_s": 0.5 * s if refresh else "", "loadavg_1m": 2.0,
                        "time_utc": "2025-01-01T00:00:00Z"})


def test_report_tables_and_plots_the_arms_and_the_speed_rows(tmp_path):
    _arm_csv(tmp_path / "ar.csv", "ar", 12, refresh=False)
    _arm_csv(tmp_path / "auto+refresh.csv", "auto+refresh", 3, refresh=True)
    (tmp_path / "auto.csv").write_text(",".join(ARM_CSV_FIELDS) + "\n")   # no rows: left out
    with open(tmp_path / "speed.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["policy", "arm", "rep", "batch", "tokens_per_s", "tau",
                               "reward_mean", "first_used_sizes"])
        w.writeheader()
        w.writerows([dict(policy="initial", arm="ar", rep=1, batch=4, tokens_per_s=10, tau=1,
                          reward_mean=0.5),
                     dict(policy="initial", arm="auto", rep=1, batch=4, tokens_per_s=14,
                          tau=1.5, reward_mean=0.25, first_used_sizes="2 4"),
                     dict(policy="initial", arm="ar", rep=2, batch=4, tokens_per_s=20, tau=1,
                          reward_mean=0.0)])
    rows = read_arm_csv(str(tmp_path / "ar.csv"))
    assert rows[3]["tokens_per_s"] == 130.0 and rows[3]["refresh_s"] == ""
    assert rows[3]["arm"] == "ar" and rows[3]["time_utc"] == "2025-01-01T00:00:00Z"
    table = write_report(str(tmp_path), ("ar", "auto", "auto+refresh", "missing"))
    assert table.splitlines() == [
        "| arm | steps | reward first 10 → last 10 | τ first 10 → last 10 | rollout tok/s "
        "(median, steps ≥ 1) | rollout s/step (median) | refresh s/step (median) | load "
        "(median) |",
        "|---|---|---|---|---|---|---|---|",
        # ar: rewards s/12, τ 1 + s/10; steps 1..11: tok/s 110..210, seconds 11..21
        "| ar | 12 | 0.38 → 0.54 | 1.45 → 1.65 | 160.0 | 16.0 | nan | 2.00 |",
        "| auto+refresh | 3 | 0.33 → 0.33 | 1.10 → 1.10 | 115.0 | 11.5 | 0.75 | 2.00 |",
        "",
        "| policy | arm | decode batch | timed calls | tokens/s (median) | τ | reward | calls "
        "with a first-used draft size |",
        "|---|---|---|---|---|---|---|---|",
        "| initial | ar | 4 | 2 | 15.0 | 1.00 | 0.25 | 0 |",
        "| initial | auto | 4 | 1 | 14.0 | 1.50 | 0.25 | 1 |"]
    assert (tmp_path / "table.md").read_text() == table + "\n"
    assert (tmp_path / "grpo.png").read_bytes()[:4] == b"\x89PNG"


def test_report_needs_an_arm_with_rows(tmp_path):
    (tmp_path / "ar.csv").write_text(",".join(ARM_CSV_FIELDS) + "\n")
    with pytest.raises(FileNotFoundError, match="no arm CSVs"):
        write_report(str(tmp_path), ("ar", "auto"))


def test_moving_mean_averages_each_value_with_the_ones_before():
    np.testing.assert_allclose(moving_mean([1, 2, 3, 4, 5, 6], window=3),
                               [1, 1.5, 2, 3, 4, 5])
    assert moving_mean([]).shape == (0,)
