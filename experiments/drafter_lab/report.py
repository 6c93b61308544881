"""Plot learning curves.

``python -m experiments.drafter_lab report RUN_DIR PNG``: one run's training curves.
``python -m experiments.drafter_lab report --heldout PNG RUN_DIR [RUN_DIR ...]``: the held-out
curves (``heldout_curve.jsonl``: chain τ and cross-entropy against training labels seen) of
several runs in one figure, labelled by run directory name. ``RUN_DIR@N`` shifts a run's curve by
``N`` labels: a warm-started run continues the curve of the run it started from.
``python -m experiments.drafter_lab report --depths PNG RUN_DIR``: one run's held-out accuracy per
draft depth, base head (the DFlash distribution) and corrected head side by side, against
training labels seen: how a curriculum moves the two heads.
"""

from __future__ import annotations

import csv
import json
import os

import numpy as np


def _smooth(x, k=25):
    x = np.asarray(x, float)
    if len(x) < k:
        return x
    c = np.cumsum(np.insert(x, 0, 0.0))
    out = (c[k:] - c[:-k]) / k
    return np.concatenate([x[:k - 1] * 0 + out[0], out])


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend (imported only when plotting)."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("plots need matplotlib: pip install 'dominotree-jax[lab]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot(run_dir: str, png: str) -> None:
    plt = _pyplot()
    with open(f"{run_dir}/train_log.csv") as f:
        rows = list(csv.DictReader(f))
    col = {k: np.array([float(r[k]) for r in rows]) for k in rows[0]}
    step = col["step"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    a1.plot(step, _smooth(col["base_loss"]), label="CE base")
    a1.plot(step, _smooth(col["corr_loss"]), label="CE corrected")
    a1.plot(step, _smooth(col["loss"]), label="curriculum loss", alpha=0.7)
    a1.set_xlabel("step")
    a1.set_ylabel("cross-entropy (train softmax subset, nats)")
    a1.set_yscale("log")
    a1.grid(alpha=0.3)
    ax = a1.twinx()
    ax.plot(step, col["lam"], "k:", label="λ")
    ax.set_ylabel("λ")
    a1.legend(loc="upper right")
    a2.plot(step, _smooth(col["base_acc0"]), label="base acc, depth 0")
    a2.plot(step, _smooth(col["base_acc_mean"]), label="base acc, mean over depths")
    a2.plot(step, _smooth(col["corr_acc_mean"]), label="corrected acc, mean over depths")
    a2.plot(step, _smooth(col["tau_corr"]) - 1, label="chain τ − 1 (Domino, teacher-forced)")
    a2.set_xlabel("step")
    a2.set_ylim(0, None)
    a2.grid(alpha=0.3)
    a2.legend(loc="upper left", fontsize=8)
    fig.suptitle("Domino drafter for SmolLM2-135M-Instruct: training curves (25-step means)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def _heldout_points(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "heldout_curve.jsonl")
    with open(path) as f:
        pts = [json.loads(line) for line in f if line.strip()]
    if not pts:
        raise ValueError(f"{path}: no held-out evaluations yet (train with --eval-every N)")
    return pts


def per_depth_series(pts: list[dict], head: str) -> np.ndarray:
    """``[evaluations, depths]`` accuracies of ``head`` ('base' or 'corr') from curve points."""
    key = f"{head}_acc_d"
    missing = [p.get("step") for p in pts if key not in p]
    if missing:
        raise ValueError(f"held-out points at steps {missing} have no {key!r} (older curve "
                         "format): per-depth plots need curves written by this trainer")
    widths = {len(p[key]) for p in pts}
    if len(widths) != 1:
        raise ValueError(f"{key!r} has {sorted(widths)} depths across evaluations: one run "
                         "has one block size")
    return np.array([p[key] for p in pts], float)


def plot_depths(run_dir: str, png: str) -> None:
    plt = _pyplot()
    pts = _heldout_points(run_dir)
    labels = np.array([p["labels_seen"] for p in pts], float) / 1e3
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, head, title in ((axes[0], "base", "base head (DFlash backbone)"),
                            (axes[1], "corr", "corrected head (Domino)")):
        acc_ED = per_depth_series(pts, head)
        colors = plt.cm.viridis(np.linspace(0, 0.9, acc_ED.shape[1]))
        for d in range(acc_ED.shape[1]):
            ax.plot(labels, acc_ED[:, d], "o-", ms=3, color=colors[d], label=f"depth {d}")
        ax.set_title(title)
        ax.set_xlabel("training labels seen (thousands)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out top-1 accuracy (teacher-forced)")
    axes[1].legend(fontsize=8, ncol=2)
    name = os.path.basename(os.path.normpath(run_dir))
    fig.suptitle(f"{name}: held-out accuracy per draft depth")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def _run_and_offset(spec: str) -> tuple[str, int]:
    """``"runs/x@477000"`` -> ``("runs/x", 477000)``; a plain directory has offset 0."""
    run, sep, offset = spec.rpartition("@")
    if not sep:
        return spec, 0
    if not offset.isdigit():
        raise ValueError(f"{spec!r}: the part after '@' must be a count of labels, got {offset!r}")
    return run, int(offset)


def plot_heldout(run_dirs: list[str], png: str) -> None:
    plt = _pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for spec in run_dirs:
        run, offset = _run_and_offset(spec)
        pts = _heldout_points(run)
        labels = [(offset + p["labels_seen"]) / 1e3 for p in pts]
        name = os.path.basename(os.path.normpath(run))
        if offset:
            name += f" (from {offset / 1e3:.0f}k)"
        a1.plot(labels, [p["tau_corr"] for p in pts], "o-", label=name)
        a2.plot(labels, [p["corr_loss"] for p in pts], "o-", label=name)
    a1.set_ylabel("held-out chain τ (corrected head, teacher-forced)")
    a2.set_ylabel("held-out cross-entropy (full vocabulary, nats)")
    for a in (a1, a2):
        a.set_xlabel("training labels seen (thousands)")
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.suptitle("Domino drafter for SmolLM2-135M-Instruct: held-out learning curves")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m experiments.drafter_lab report",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--heldout", metavar="PNG", help="held-out curves of the runs given")
    g.add_argument("--depths", metavar="PNG", help="per-depth accuracies of one run")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="RUN_DIR PNG (training curves); RUN_DIR[@LABELS] ... with --heldout; "
                        "RUN_DIR with --depths")
    args = p.parse_args(argv)
    if args.heldout:
        plot_heldout(args.paths, args.heldout)
    elif args.depths:
        if len(args.paths) != 1:
            p.error("--depths PNG takes one RUN_DIR")
        plot_depths(args.paths[0], args.depths)
    else:
        if len(args.paths) != 2:
            p.error("give RUN_DIR PNG (or --heldout / --depths PNG RUN_DIR ...)")
        plot(*args.paths)
    return 0
