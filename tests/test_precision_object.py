"""``precision.Precision``: the one typed precision value, chosen at load, carried by the target
and the pair, read by decode, the trainer, the rollout engine and every command line (through
``add_precision_argument``); ``load_target`` honours or refuses every precision for every
checkpoint kind (HF directory, GGUF file, orbax directory)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import dominotree_jax as dj
from convert.safetensors_io import read_safetensors, write_safetensors
from dominotree_jax import DecodeConfig, decode
from dominotree_jax.precision import (BENCHMARKED_PRECISIONS, PAIRINGS, PRECISIONS, Precision,
                                      PrecisionError, add_precision_argument, cast_params,
                                      parse_precision, precision_name)

import released_layouts as rl
from spec_fixtures import tiny_pair
from test_damaged_files import write_tiny_gguf

SUPPORTED = "supported precisions: float32, bfloat16, float16"


def _dtypes(tree) -> set[str]:
    return {jnp.dtype(x.dtype).name for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.floating)}


# ------------------------------------------------------------------ the value itself

def test_precision_parses_names_dtypes_and_pair_texts_to_canonical_names():
    assert Precision.of(None) == Precision() == Precision("float32", "float32")
    assert Precision.of("bfloat16") == Precision("bfloat16", "bfloat16")
    assert Precision.of(jnp.bfloat16).target == "bfloat16"
    assert Precision.of(np.dtype("float16")) == Precision("float16")
    assert Precision.of(" float32 + bfloat16 ") == Precision("float32", "bfloat16")
    p = Precision("float32", "bfloat16")
    assert Precision.of(p) is p
    assert (p.target_dtype, p.drafter_dtype) == (jnp.dtype("float32"), jnp.dtype("bfloat16"))
    assert p.mixed and p.exact and p.only_target == Precision("float32")
    assert not Precision("bfloat16").mixed and not Precision("bfloat16").exact
    assert not Precision().exact


def test_precision_text_round_trips_for_every_pairing():
    for target, drafter in PAIRINGS:
        p = Precision(target, drafter)
        assert Precision.of(str(p)) == p
        assert str(p) == (target if target == drafter else f"{target}+{drafter}")
    assert str(Precision("bfloat16")) == "bfloat16"
    assert str(Precision("float32", "bfloat16")) == "float32+bfloat16"


def test_unknown_names_and_impossible_pairings_cannot_be_built():
    for bad in ("int8", "fp8", "float64", "bf16x"):
        with pytest.raises(PrecisionError, match=f"unknown target dtype '{bad}'; {SUPPORTED}"):
            Precision.of(bad)
    with pytest.raises(PrecisionError, match=f"unknown drafter dtype 'int8'; {SUPPORTED}"):
        Precision.of("float32+int8")
    for target, drafter in (("bfloat16", "float32"), ("float16", "bfloat16"),
                            ("bfloat16", "float16"), ("float16", "float32")):
        with pytest.raises(PrecisionError, match=f"a {drafter} drafter cannot be paired with "
                                                 f"a {target} target"):
            Precision(target, drafter)
        with pytest.raises(PrecisionError, match="supported target\\+drafter pairs"):
            Precision.of(f"{target}+{drafter}")


def test_precision_is_frozen_and_hashable_a_static_jit_argument():
    p = Precision("float32", "bfloat16")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.target = "bfloat16"
    assert len({p, Precision.of("float32+bfloat16"), Precision(), Precision("float32")}) == 2
    tcfg, dcfg, _ = tiny_pair()
    a = DecodeConfig(target=tcfg, precision="bfloat16")
    assert a.precision == Precision("bfloat16")          # canonicalised from its text
    assert hash(a) == hash(DecodeConfig(target=tcfg, precision=Precision("bfloat16")))
    assert a != DecodeConfig(target=tcfg, precision="float32")
    assert DecodeConfig(target=tcfg).precision is None
    with pytest.raises(PrecisionError, match="unknown target dtype 'fp8'"):
        DecodeConfig(target=tcfg, precision="fp8")


def test_one_model_precision_reads_as_its_name_and_a_pair_is_refused_there():
    assert precision_name(Precision("bfloat16")) == "bfloat16"
    tree = {"w": jnp.ones((2, 2)), "ids": jnp.arange(3)}
    assert _dtypes(cast_params(tree, Precision("float16"))) == {"float16"}
    assert cast_params(tree, Precision("float16"))["ids"].dtype == jnp.int32
    with pytest.raises(PrecisionError, match="names two precisions"):
        precision_name(Precision("float32", "bfloat16"), "feature precision")


def test_precision_of_params_reads_the_leaves_and_refuses_bad_pairs():
    _, _, params = tiny_pair()
    t16 = cast_params(params["target"], "bfloat16")
    d16 = cast_params(params["drafter"], "bfloat16")
    assert Precision.of_params(params["target"]) == Precision()
    assert Precision.of_params(params["target"], d16) == Precision("float32", "bfloat16")
    assert Precision.of_params(t16, d16) == Precision("bfloat16")
    with pytest.raises(PrecisionError, match="float32 drafter cannot be paired with a bfloat16"):
        Precision.of_params(t16, params["drafter"])


# ------------------------------------------------------------------ the command-line helper

def _parser(**kw):
    ap = argparse.ArgumentParser(prog="cmd")
    add_precision_argument(ap, **kw)
    return ap


def test_precision_argument_parses_to_a_precision_under_both_spellings():
    ap = _parser()
    assert ap.parse_args([]).precision == Precision()
    assert ap.parse_args(["--dtype", "bfloat16"]).precision == Precision("bfloat16")
    assert ap.parse_args(["--precision", "float32+bfloat16"]).precision.exact
    auto = _parser(aliases=(), default="auto", auto=True, pairs=False)
    assert auto.parse_args([]).precision is None
    assert auto.parse_args(["--precision", "auto"]).precision is None
    assert auto.parse_args(["--precision", "float16"]).precision == Precision("float16")
    assert parse_precision("auto", auto=True) is None
    with pytest.raises(argparse.ArgumentTypeError, match="invalid precision 'auto'"):
        parse_precision("auto")
    many = _parser(flag="--dtypes", aliases=(), many=True, default="float32")
    assert many.parse_args([]).dtypes == (Precision(),)
    assert many.parse_args(["--dtypes", "float32,bfloat16"]).dtypes == (
        Precision(), Precision("bfloat16"))


@pytest.mark.parametrize("kw, value, named", [
    ({}, "int8", "float32, bfloat16, float16, float32+bfloat16"),
    ({}, "fp8", "float32, bfloat16, float16, float32+bfloat16"),
    ({}, "bfloat16+float32", "a float32 drafter cannot be paired with a bfloat16 target"),
    ({"pairs": False}, "float32+bfloat16", "this command runs one model"),
    ({"auto": True, "pairs": False}, "int8", "float32, bfloat16, float16, auto"),
    ({"choices": BENCHMARKED_PRECISIONS}, "float16", "choose one of: float32, bfloat16"),
    ({"many": True}, "float32,float32", "give distinct names"),
])
def test_a_bad_precision_is_an_argparse_error_naming_the_choices(kw, value, named, capsys):
    with pytest.raises(SystemExit) as e:
        _parser(**kw).parse_args(["--precision", value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --precision/--dtype: invalid precision" in err and named in err


def _entry_points():
    """``(name, argv -> parse or run)`` of every command line that takes a precision."""
    from benchmarks.methods import bench
    from convert.__main__ import _parser as convert_parser
    from dominotree_jax import __main__ as demo, calibrate
    from dominotree_jax.train import run
    from dominotree_jax.train.data import collect
    from dominotree_jax.train.eval import acceptance
    from experiments.drafter_lab import agreement
    return {
        "demo": (demo.main, "--precision"), "calibrate": (calibrate.main, "--precision"),
        "train": (run.parse_args, "--dtype"), "train-features": (run.parse_args,
                                                                 "--feature-precision"),
        "collect": (collect.parse_args, "--dtype"), "agreement": (agreement.main, "--dtype"),
        "acceptance": (acceptance.parse_args, "--feature-precision"),
        "convert": (lambda a: convert_parser().parse_args(["target", "s", "o"] + a), "--dtype"),
        "methods bench": (bench.parse_args, "--dtype")}


@pytest.mark.parametrize("name", sorted(_entry_points()))
def test_every_command_line_refuses_a_bad_precision_through_the_helper(name, capsys):
    """Each command line's precision option is the shared one: an unknown name stops argparse
    (exit 2, before anything loads) with the helper's message naming the choices."""
    fn, flag = _entry_points()[name]
    with pytest.raises(SystemExit) as e:
        fn([flag, "int8"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "invalid precision 'int8'; choose one of: float32, bfloat16" in err, err


def test_command_lines_read_a_precision_value():
    from convert.__main__ import _parser as convert_parser
    from dominotree_jax.train import run
    from dominotree_jax.train.data import collect
    from dominotree_jax.train.eval import acceptance
    args = run.parse_args(["--dtype", "bfloat16", "--feature-precision", "bfloat16"])
    assert args.precision == args.feature_precision == Precision("bfloat16")
    assert collect.parse_args(["--data", "d", "--precision", "bfloat16"]).precision == \
        Precision("bfloat16")
    assert acceptance.parse_args(["--drafter", "d"]).feature_precision == Precision()
    assert convert_parser().parse_args(["inspect", "p"]).precision == Precision("bfloat16")
    from benchmarks.methods import bench
    assert bench.parse_args(["--dtype", "float32+bfloat16"]).precision.exact


# ------------------------------------------------------------------ decode reads it

def test_decode_refuses_parameters_in_another_precision_naming_both():
    tcfg, dcfg, params = tiny_pair()
    kw = dict(target=tcfg, drafter=dcfg, method="dominotree", max_new_tokens=4, budget=4,
              node_topk=2, top_m=8)
    prompt = jnp.array([1, 2, 3])
    bf16_target = {"target": cast_params(params["target"], "bfloat16"),
                   "drafter": cast_params(params["drafter"], "bfloat16")}
    with pytest.raises(PrecisionError, match="the target parameters are bfloat16 but the "
                                             "decode config's precision is float32"):
        decode(bf16_target, prompt, config=DecodeConfig(precision="float32", **kw))
    with pytest.raises(PrecisionError, match="the drafter parameters are float32 but the "
                                             "decode config's precision is float32\\+bfloat16"):
        decode(params, prompt, config=DecodeConfig(precision="float32+bfloat16", **kw))
    ar = DecodeConfig(target=tcfg, method="ar", max_new_tokens=2, precision="bfloat16")
    with pytest.raises(PrecisionError, match="target parameters are float32 but the decode "
                                             "config's precision is bfloat16"):
        decode({"target": params["target"], "drafter": None}, prompt, config=ar)
    # matching precision: decodes (the drafter is not read by "ar")
    out = decode({"target": params["target"], "drafter": None}, prompt,
                 config=ar.replace(precision="float32"))
    assert int(out.num_tokens[0]) == 2


def test_target_and_pair_carry_their_precision_into_the_config():
    tcfg, dcfg, params = tiny_pair()
    target = dj.Target(tcfg, params["target"])
    assert target.precision == Precision()
    with pytest.raises(PrecisionError, match="target parameters are float32 but the target's "
                                             "precision is bfloat16"):
        dj.Target(tcfg, params["target"], precision="bfloat16")
    pair = dj.Pair(target, dcfg, params["drafter"])
    assert pair.precision == Precision() and pair.config("dominotree").precision == Precision()
    exact = pair.with_precision("float32+bfloat16")
    assert exact.precision.exact and exact.target.precision == Precision()
    assert _dtypes(exact.drafter_params) == {"bfloat16"}
    assert exact.config("ddtree", budget=4).precision == Precision("float32", "bfloat16")
    half = pair.with_precision("bfloat16")
    assert half.target.precision == Precision("bfloat16") and _dtypes(half.params) == {
        "bfloat16"}


def test_the_rollout_engine_reads_the_precision_of_its_parameters():
    from dominotree_jax.rollout.tunix_engine import DominoTreeRollout
    tcfg, dcfg, params = tiny_pair()
    half = dj.Target(tcfg, cast_params(params["target"], "bfloat16"))
    engine = DominoTreeRollout(rollout_actor=half, method="ar")
    assert engine.precision == Precision("bfloat16")
    with pytest.raises(PrecisionError, match="target parameters are bfloat16 but the "
                                             "rollout's precision is float32"):
        DominoTreeRollout(rollout_actor=half, method="ar", precision="float32")
    # a float32 master copy rolls out from a copy cast to the 16-bit precision asked for
    full = dj.Target(tcfg, params["target"])
    engine = DominoTreeRollout(rollout_actor=full, method="ar", precision="bfloat16",
                               drafter_config=dcfg, drafter_params=params["drafter"])
    assert engine.precision == Precision("bfloat16")
    assert _dtypes(engine.params) == {"bfloat16"} and _dtypes(params) == {"float32"}
    exact = DominoTreeRollout(rollout_actor=full, method="ar", precision="float32+bfloat16",
                              drafter_config=dcfg, drafter_params=params["drafter"])
    assert _dtypes(exact.params["target"]) == {"float32"}
    assert _dtypes(exact.params["drafter"]) == {"bfloat16"}


# ------------------------------------------------------------------ the trainer reads it

def test_train_config_precision_and_its_saved_forms():
    from dominotree_jax.train.trainer import TrainConfig
    tc = TrainConfig(precision="bfloat16")
    assert tc.precision == Precision("bfloat16") and TrainConfig().precision == Precision()
    assert json.loads(json.dumps(tc.to_json()))["precision"] == "bfloat16"
    assert TrainConfig.from_json(tc.to_json()) == tc
    assert TrainConfig.from_json({"steps": 3, "dtype": "bfloat16"}).precision == tc.precision
    with pytest.raises(ValueError, match="both 'dtype' and 'precision'"):
        TrainConfig.from_json({"dtype": "bfloat16", "precision": "float32"})
    with pytest.raises(PrecisionError, match="unknown training precision 'int8'"):
        TrainConfig(precision="int8")
    with pytest.raises(PrecisionError, match="names two precisions"):
        TrainConfig(precision="float32+bfloat16")


def test_run_settings_store_the_precision_text_and_read_old_dtype_runs(tmp_path):
    from dominotree_jax.train.run import RunSettings, parse_args
    new = tmp_path / "new"
    run = RunSettings.from_args(parse_args(["--shards", "2", "--dtype", "bfloat16"]))
    run = run.resolve(str(new))
    assert run.train.precision == Precision("bfloat16")
    saved = json.loads((new / "run.json").read_text())
    assert saved["train"]["precision"] == "bfloat16" and "dtype" not in saved["train"]
    old = tmp_path / "old"
    old.mkdir()
    (old / "run.json").write_text(json.dumps({"data": "d", "shards": 3, "dtype": "bfloat16"}))
    again = RunSettings().resolve(str(old))
    assert again.train.precision == Precision("bfloat16")


# ------------------------------------------------------------------ load_target, every kind

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One tiny target of each kind: an HF directory (float32 tensors), a GGUF file (F32) and
    an orbax directory saved in bfloat16 (through ``python -m convert target``)."""
    from convert.__main__ import main as convert_main
    root = tmp_path_factory.mktemp("kinds")
    hf = rl.write_target(str(root / "hf"))
    orbax = str(root / "orbax")
    assert convert_main(["target", hf, orbax, "--precision", "bfloat16"]) == 0
    return {"hf": hf, "gguf": write_tiny_gguf(str(root / "tiny.gguf")), "orbax": orbax}


STORED = {"hf": "float32", "gguf": "float32", "orbax": "bfloat16"}


@pytest.mark.parametrize("kind", sorted(STORED))
@pytest.mark.parametrize("name", PRECISIONS)
def test_load_target_honours_every_precision_for_every_checkpoint_kind(checkpoints, kind,
                                                                        name):
    t = dj.load_target(checkpoints[kind], precision=name, tokenizer=False)
    assert _dtypes(t.params) == {name}, (kind, name)
    assert t.precision == Precision(name)
    alias = dj.load_target(checkpoints[kind], dtype=Precision(name), tokenizer=False)
    assert _dtypes(alias.params) == {name} and alias.precision == t.precision


@pytest.mark.parametrize("kind", sorted(STORED))
def test_load_target_keeps_the_stored_precision_when_asked(checkpoints, kind):
    t = dj.load_target(checkpoints[kind], precision=None, tokenizer=False)
    assert _dtypes(t.params) == {STORED[kind]} and t.precision == Precision(STORED[kind])


@pytest.mark.parametrize("kind", sorted(STORED))
@pytest.mark.parametrize("bad", ["int8", "fp8", "float64"])
def test_load_target_refuses_unknown_precisions_before_anything_loads(checkpoints, kind, bad,
                                                                      monkeypatch):
    import convert.target

    def no_load(*a, **k):
        raise AssertionError("a checkpoint was read before the precision was checked")
    monkeypatch.setattr(convert.target, "load_target_checkpoint", no_load)
    with pytest.raises(PrecisionError, match=f"unknown target dtype '{bad}'; {SUPPORTED}"):
        dj.load_target(checkpoints[kind], precision=bad, tokenizer=False)
    with pytest.raises(PrecisionError, match=f"unknown target dtype '{bad}'"):
        dj.load_target(checkpoints[kind], dtype=bad, tokenizer=False)


def test_load_target_takes_precision_or_its_dtype_alias_not_both(checkpoints):
    with pytest.raises(TypeError, match="not both"):
        dj.load_target(checkpoints["hf"], precision="float32", dtype="float32")


def test_a_bf16_hf_checkpoint_is_honoured_in_float32(tmp_path):
    d = rl.write_target(str(tmp_path / "hf16"))
    path = os.path.join(d, "model.safetensors")
    tensors = {k: np.asarray(v).astype(ml_dtypes.bfloat16)
               for k, v in read_safetensors(path).items()}
    write_safetensors(path, tensors, {"format": "pt"})
    assert dj.load_target(d, precision=None, tokenizer=False).precision == Precision("bfloat16")
    t = dj.load_target(d, tokenizer=False)   # the default: float32, whatever is stored
    assert _dtypes(t.params) == {"float32"} and t.precision == Precision()


# ------------------------------------------------------------------ load_pair

def test_load_pair_takes_one_precision_and_the_older_keywords(tmp_path):
    target = rl.write_target(str(tmp_path / "t"))
    drafter = rl.write_drafter(str(tmp_path / "d"), "domino_8b")
    exact = dj.load_pair(target, drafter, precision="float32+bfloat16")
    assert exact.precision == Precision("float32", "bfloat16")
    assert _dtypes(exact.target.params) == {"float32"}
    assert _dtypes(exact.drafter_params) == {"bfloat16"}
    assert exact.config("dominotree").precision == exact.precision
    old = dj.load_pair(target, drafter, dtype="float32", drafter_dtype="bfloat16")
    assert old.precision == exact.precision
    assert dj.load_pair(target, drafter, dtype="bfloat16").precision == Precision("bfloat16")
    assert dj.load_pair(target, drafter).precision == Precision()
    with pytest.raises(TypeError, match="not both"):
        dj.load_pair(target, drafter, precision="bfloat16", dtype="bfloat16")
    with pytest.raises(PrecisionError, match="a float32 drafter cannot be paired with a "
                                             "bfloat16 target"):
        dj.load_pair("/nonexistent/t.gguf", "/nonexistent/d", precision="bfloat16+float32")
    with pytest.raises(PrecisionError, match="unknown drafter dtype 'fp8'"):
        dj.load_pair("/nonexistent/t.gguf", "/nonexistent/d", precision="float32+fp8")
