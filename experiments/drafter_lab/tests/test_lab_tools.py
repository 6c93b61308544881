"""The drafter lab's tools on toy inputs: the tree walk of ``tree``, the plots of ``report``, and
``backfill_topk`` against what ``collect --store-topk`` stores."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import dominotree_jax as dj
from dominotree_jax.train.data.collect import collect
from dominotree_jax.train.data.shards import ShardStore
from test_collect import toy_pool
from test_data_pipeline import TCFG, _CharTokenizer, target  # noqa: F401 (fixture)


def test_every_lab_command_is_a_main_of_argv_behind_the_dispatcher(capsys):
    import importlib

    from dominotree_jax.train.cli import dispatch
    from experiments.drafter_lab import COMMANDS
    prog = "python -m experiments.drafter_lab"
    assert dispatch(prog, COMMANDS, []) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in COMMANDS)
    for name, (module, _) in COMMANDS.items():
        assert callable(importlib.import_module(module).main), name
        with pytest.raises(SystemExit) as e:
            dispatch(prog, COMMANDS, [name, "--help"])
        assert e.value.code == 0
        assert capsys.readouterr().out.startswith(f"usage: {prog} {name}")


def test_tree_acceptance_walk():
    """The offline walk of ``tree``: the longest root path spelling the labels."""
    from experiments.drafter_lab.tree import parse_config, tree_accepted
    tokens = np.array([[5, 7, 9, 7, 2, 0]])
    parents = np.array([[-1, -1, 0, 1, 3, -1]])
    valid = np.array([[1, 1, 1, 1, 1, 0]], bool)
    assert tree_accepted(tokens, parents, valid, np.array([[7, 7, 2, 4]]))[0] == 3
    assert tree_accepted(tokens, parents, valid, np.array([[5, 9, 1, 1]]))[0] == 2
    assert tree_accepted(tokens, parents, valid, np.array([[5, 9, -1, -1]]))[0] == 2
    assert tree_accepted(tokens, parents, valid, np.array([[0, 5, 5, 5]]))[0] == 0  # invalid
    assert parse_config("condstatic:16:4") == ("condstatic", 16, 4)
    with pytest.raises(ValueError, match="bad configuration"):
        parse_config("dominotree:16")


def test_heldout_plot_shifts_a_continued_run(tmp_path):
    from experiments.drafter_lab import report
    assert report._run_and_offset("runs/v3@477000") == ("runs/v3", 477000)
    assert report._run_and_offset("runs/v2") == ("runs/v2", 0)
    with pytest.raises(ValueError, match="count of labels"):
        report._run_and_offset("runs/v3@lots")
    for name, labels in (("v2", (0, 100)), ("v3", (0, 50))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "heldout_curve.jsonl").write_text("".join(
            f'{{"labels_seen": {n}, "tau_corr": 2.0, "corr_loss": 3.0}}\n' for n in labels))
    png = tmp_path / "curves.png"
    report.plot_heldout([str(tmp_path / "v2"), f"{tmp_path / 'v3'}@100"], str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_per_depth_plot_reads_both_heads_and_refuses_old_curves(tmp_path):
    from experiments.drafter_lab import report
    run = tmp_path / "v4c"
    run.mkdir()
    pts = [{"step": s, "labels_seen": 1000 * s, "base_acc_d": [0.5, 0.1 * s],
            "corr_acc_d": [0.5, 0.2 * s]} for s in (1, 2)]
    (run / "heldout_curve.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pts))
    np.testing.assert_allclose(report.per_depth_series(pts, "corr"), [[0.5, 0.2], [0.5, 0.4]])
    png = tmp_path / "depths.png"
    report.plot_depths(str(run), str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no 'base_acc_d'"):
        report.per_depth_series([{"step": 3, "labels_seen": 0}], "base")
    with pytest.raises(ValueError, match="one block size"):
        report.per_depth_series(pts + [{"step": 3, "base_acc_d": [0.1]}], "base")
    (run / "heldout_curve.jsonl").write_text("")
    with pytest.raises(ValueError, match="no held-out evaluations"):
        report.plot_depths(str(run), str(png))


def test_backfilled_topk_equals_what_collect_stores(tmp_path, target):  # noqa: F811
    """``backfill_topk`` adds to shards collected without top-k the logits ``collect
    --store-topk`` stores for the same rows; the source stays as it was; resumable."""

    from experiments.drafter_lab.backfill_topk import backfill
    t = dj.Target(TCFG, target.params, _CharTokenizer())
    kw = dict(seed=3, prompts=toy_pool(40), batch=4, max_new=8, deadline=None,
              request_every=0, request_share=0.0, max_batches=2)
    with_topk, plain, out = (str(tmp_path / d) for d in ("with_topk", "plain", "out"))
    collect(t, with_topk, store_topk=3, **kw)
    collect(t, plain, **kw)
    before = open(os.path.join(plain, "manifest.json")).read()
    src = ShardStore(plain)
    assert backfill(t, src, ShardStore(out, vocab_size=TCFG.vocab_size), shards=1, k=3,
                    rows_per_forward=3, log=lambda m: None) == 1
    dst = ShardStore(out)   # resumed: the first shard is kept, the second added
    assert backfill(t, src, dst, shards=2, k=3, log=lambda m: None) == 1
    assert open(os.path.join(plain, "manifest.json")).read() == before
    ref = ShardStore(with_topk)
    for e_ref, e_out in zip(ref.entries(), dst.entries(), strict=True):
        a, b = ref.read(e_ref), dst.read(e_out)
        np.testing.assert_array_equal(a["tokens"], b["tokens"])
        np.testing.assert_array_equal(a["topk_ids"][:, 0], b["topk_ids"][:, 0])
        np.testing.assert_allclose(a["topk_logits"].astype(np.float32),
                                   b["topk_logits"].astype(np.float32), atol=2e-2, rtol=1e-2)
        assert e_out["topk"] == 3 and e_out["temperature"] == e_ref["temperature"]
    with pytest.raises(ValueError, match="answer shards"):
        backfill(t, src, dst, shards=9, k=3)
    with pytest.raises(ValueError, match="not a backfill"):
        backfill(t, ShardStore(with_topk), ShardStore(plain), shards=1, k=3)
