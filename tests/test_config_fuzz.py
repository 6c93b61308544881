"""Damaged configs and file headers, as a new user's mistakes make them: every one is refused
by a ``ValueError`` (``ConfigError`` / ``CheckpointError``) naming the file or the field, or
loads and runs a forward with finite outputs. Never a raw ``TypeError`` from deep inside, never
a silent load of a value that cannot be right.

The mutations are enumerated (every field x every kind of damage), header bytes are flipped by
a seeded generator: the run is the same every time. Forwards run eagerly (``jax.disable_jit``)
so each loaded variant costs no compilation.
"""

from __future__ import annotations

import copy
import json
import os
import shutil

import jax
import numpy as np
import pytest

import dominotree_jax as dj
from dominotree_jax.config import DrafterConfig, TargetConfig
from dominotree_jax.model.drafter import bind_drafter
from dominotree_jax.model.target import target_graphdef

import released_layouts as rl
from test_damaged_files import write_tiny_gguf

V, H, L = 64, 32, 2
TARGET = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": V,
          "hidden_size": H, "intermediate_size": 48, "num_hidden_layers": L,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
          "rms_norm_eps": 1e-6, "rope_theta": 1000000, "rope_scaling": None,
          "max_position_embeddings": 512, "tie_word_embeddings": True, "attention_bias": False,
          "use_sliding_window": False, "sliding_window": None, "torch_dtype": "float32"}
DRAFTER = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": V,
           "hidden_size": H, "intermediate_size": 48, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
           "rms_norm_eps": 1e-6, "rope_theta": 1000000, "max_position_embeddings": 512,
           "block_size": 4, "num_target_layers": L,
           "dflash_config": {"mask_token_id": V - 1, "target_layer_ids": [1],
                             "projector_type": "domino", "gru_hidden_dim": 16, "emb_dim": 8,
                             "pure_draft_prefix_len": 1, "shift_label": True}}
MISSING = object()
# kinds of damage for a number field, and for a true/false one
DAMAGE = {"text": "7", "list": [7], "fraction": 2.5, "bool": True, "negative": -3, "zero": 0,
          "huge": 10 ** 12, "null": None, "missing": MISSING}
FLAG_DAMAGE = {"text": "false", "int": 1, "list": [True], "null": None, "missing": MISSING}
REAL_DAMAGE = {"text": "1e6", "list": [1.0], "bool": True, "negative": -3.0, "zero": 0.0,
               "nan": float("nan"), "inf": float("inf"), "huge": 1e30, "null": None,
               "missing": MISSING}
TARGET_INTS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim",
               "max_position_embeddings")
DRAFTER_INTS = TARGET_INTS + ("block_size", "num_target_layers", "dflash_config.mask_token_id",
                              "dflash_config.gru_hidden_dim", "dflash_config.emb_dim",
                              "dflash_config.pure_draft_prefix_len")
FLAGS = {"target": ("tie_word_embeddings", "attention_bias", "use_sliding_window"),
         "drafter": ("dflash_config.shift_label",)}
REALS = ("rope_theta", "rms_norm_eps")
# values other than a number's kinds of damage, per field
EXTRA = {"dflash_config.target_layer_ids": {"out of range": [5], "negative": [-1],
                                            "text": "1", "floats": [1.5], "empty": [],
                                            "nested": [[1]], "null": None},
         "architectures": {"text": "Qwen3ForCausalLM", "unknown": ["GPT2LMHeadModel"],
                           "number": [3]},
         "rope_scaling": {"text": "linear", "list": [2.0],
                          "bad factor": {"rope_type": "linear", "factor": "2"},
                          "negative factor": {"rope_type": "linear", "factor": -2.0},
                          "unknown type": {"rope_type": "ntk-magic", "factor": 2.0},
                          "linear": {"rope_type": "linear", "factor": 2.0}},
         "dflash_config.projector_type": {"number": 3, "unknown": "mlp"},
         "dflash_config": {"text": "domino", "list": [1]}}


def _mutations(what: str):
    fields = {f: DAMAGE for f in (TARGET_INTS if what == "target" else DRAFTER_INTS)}
    fields.update({f: FLAG_DAMAGE for f in FLAGS[what]})
    fields.update({f: REAL_DAMAGE for f in REALS})
    base = TARGET if what == "target" else DRAFTER
    fields.update({f: d for f, d in EXTRA.items() if f.split(".")[0] in base})
    if what == "target":
        fields.pop("rope_scaling", None)
        fields["rope_scaling"] = EXTRA["rope_scaling"]
    return [(f, kind, value) for f, damage in fields.items() for kind, value in damage.items()]


def _mutated(cfg: dict, field: str, value) -> dict:
    out = copy.deepcopy(cfg)
    *parents, name = field.split(".")
    d = out
    for p in parents:
        d = d[p]
    if value is MISSING:
        d.pop(name, None)
    else:
        d[name] = value
    return out


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    target = rl._write(str(root / "target"), TARGET, _tensors(
        target_graphdef(TargetConfig.from_hf_dict(TARGET), "float32")[1], "model."))
    from dominotree_jax.model.drafter import drafter_graphdef
    drafter = rl._write(str(root / "drafter"), DRAFTER, _tensors(
        drafter_graphdef(DrafterConfig.from_hf_dict(DRAFTER), "float32")[1], ""))
    return {"root": root, "target": target, "drafter": drafter,
            "gguf": write_tiny_gguf(str(root / "tiny.gguf"))}


def _tensors(abstract, prefix):
    return {prefix + n: a for n, a in rl._random_tensors(abstract, 0).items()}


def _forward_target(target):
    with jax.disable_jit():
        logits = dj.target_logits(target, np.array([[1, 2, 3, 4]], np.int32))
    assert logits.shape == (1, 4, target.config.vocab_size)
    assert np.isfinite(np.asarray(logits)).all()


def _forward_drafter(pair):
    cfg = pair.drafter_config
    feats = np.random.default_rng(0).standard_normal((1, 3, cfg.num_taps * cfg.hidden_size))
    with jax.disable_jit():
        rows = bind_drafter(cfg, pair.drafter_params).context_rows(
            np.asarray(feats, np.float32), np.arange(3, dtype=np.int32)[None])
    assert all(np.isfinite(np.asarray(r)).all() for r in jax.tree.leaves(rows))


class Tally:
    """Outcomes by kind: a named refusal, or a load whose forward ran."""

    def __init__(self):
        self.refused, self.loaded, self.failures = 0, 0, []

    def attempt(self, label: str, load, forward, names: tuple[str, ...]):
        try:
            loaded = load()
        except ValueError as e:   # ConfigError, CheckpointError, StateFileError, ...
            msg = str(e)
            if not any(n in msg for n in names):
                self.failures.append(f"{label}: refused without naming {names}: {msg[:300]}")
            self.refused += 1
            return
        except Exception as e:   # noqa: BLE001 - a raw error from deep inside is the failure
            self.failures.append(f"{label}: raw {type(e).__name__}: {str(e)[:300]}")
            return
        try:
            forward(loaded)
        except Exception as e:   # noqa: BLE001
            self.failures.append(f"{label}: loaded, but the forward failed: "
                                 f"{type(e).__name__}: {str(e)[:300]}")
            return
        self.loaded += 1


def _write_config(src: str, dst: str, cfg: dict) -> str:
    if not os.path.exists(dst):
        shutil.copytree(src, dst)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    return dst


def test_damaged_configs_are_refused_by_name_or_load_and_work(dirs):
    tally = Tally()
    root = dirs["root"]
    _forward_target(dj.load_target(dirs["target"], tokenizer=False))   # the positive controls
    _forward_drafter(dj.load_pair(dirs["target"], dirs["drafter"]))
    for what in ("target", "drafter"):
        base = TARGET if what == "target" else DRAFTER
        for i, (field, kind, value) in enumerate(_mutations(what)):
            d = _write_config(dirs[what], str(root / f"{what}_{i}"), _mutated(base, field, value))
            if what == "target":
                load = lambda d=d: dj.load_target(d, tokenizer=False)  # noqa: E731
                forward = _forward_target
            else:
                load = lambda d=d: dj.load_pair(dirs["target"], d)  # noqa: E731
                forward = _forward_drafter
            name = field.split(".")[-1]
            tally.attempt(f"{what} {field} {kind} ({value!r})", load, forward,
                          (name, name.replace("_", " "), d))
            shutil.rmtree(d)
    extra = _write_config(dirs["target"], str(root / "extra"),
                          {**TARGET, "my_unknown_key": [1, 2], "quantization": None})
    tally.attempt("target with unknown keys", lambda: dj.load_target(extra, tokenizer=False),
                  _forward_target, ("my_unknown_key",))
    print(f"\nconfig mutations: {tally.refused + tally.loaded + len(tally.failures)} tried, "
          f"{tally.refused} refused by name, {tally.loaded} loaded and ran a forward, "
          f"{len(tally.failures)} failed")
    assert not tally.failures, "\n".join(tally.failures)
    assert tally.refused > 100 and tally.loaded > 10


def _header(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write_raw(path, header_bytes: bytes, data: bytes, length: int | None = None):
    with open(path, "wb") as f:
        f.write((len(header_bytes) if length is None else length).to_bytes(8, "little"))
        f.write(header_bytes + data)


def test_damaged_safetensors_headers_are_refused_by_name(dirs, tmp_path):
    tally = Tally()
    d = shutil.copytree(dirs["drafter"], tmp_path / "d")
    st = os.path.join(d, "model.safetensors")
    named = (str(d),)   # the file, or its checkpoint directory and the tensor
    with open(st, "rb") as f:
        original = f.read()
    header, data = _header(st)
    name = sorted(k for k in header if k != "__metadata__")[0]
    entry = header[name]
    edits = {"dtype": ["F64", "Q4", 7, None, "I32"],
             "shape": [[-1, 32], ["a"], [], [10 ** 12, 32], None, list(reversed(entry["shape"])),
                       entry["shape"] + [1]],
             "data_offsets": [[0], [5, 3], ["x", 0], [-8, 0], [0, 10 ** 15], None]}
    _write_raw(st, json.dumps(header).encode(), data)   # the header rewritten: the control
    _forward_drafter(dj.load_pair(dirs["target"], d))
    cases = [(f"{name}.{k} = {v!r}", {**header, name: {**entry, k: v}})
             for k, vs in edits.items() for v in vs]
    cases += [(f"{name}.{k} missing", {**header, name: {x: y for x, y in entry.items()
                                                        if x != k}}) for k in edits]
    cases += [(f"{name} = {v!r}", {**header, name: v}) for v in ("x", [1, 2], None, 3)]
    cases += [(f"{name} removed", {k: v for k, v in header.items() if k != name})]
    for label, h in cases:
        _write_raw(st, json.dumps(h).encode(), data)
        tally.attempt(label, lambda: dj.load_pair(dirs["target"], d), _forward_drafter, named)
    text = json.dumps(header).encode()
    for label, length in (("header length 0", 0), ("header length huge", 2 ** 40),
                          ("header length short", len(text) // 2)):
        _write_raw(st, text, data, length)
        tally.attempt(label, lambda: dj.load_pair(dirs["target"], d), _forward_drafter, named)
    rng = np.random.default_rng(0)   # bytes of the header JSON flipped, a fixed sequence
    for i in range(40):
        flipped = bytearray(text)
        for at in rng.integers(0, len(text), size=int(rng.integers(1, 4))):
            flipped[at] = int(rng.integers(0, 256))
        _write_raw(st, bytes(flipped), data)
        tally.attempt(f"header bytes flipped ({i})", lambda: dj.load_pair(dirs["target"], d),
                      _forward_drafter, named)
    for keep in (0, 5, 8 + len(text) // 2, len(original) - 7):
        with open(st, "wb") as f:
            f.write(original[:keep])
        tally.attempt(f"file cut at byte {keep}", lambda: dj.load_pair(dirs["target"], d),
                      _forward_drafter, named)
    print(f"\nheader mutations: {tally.refused + tally.loaded + len(tally.failures)} tried, "
          f"{tally.refused} refused by name, {tally.loaded} loaded and ran a forward, "
          f"{len(tally.failures)} failed")
    assert not tally.failures, "\n".join(tally.failures)
    assert tally.refused > 40


def _gguf_with(path: str, key: str, value) -> str:
    """The tiny GGUF with metadata ``llama.<key>`` replaced by ``value`` (MISSING: absent;
    ints as int32 so negatives can be written)."""
    import gguf

    from convert.gguf import read_gguf
    src = read_gguf(path)
    w = gguf.GGUFWriter(path + f".{key}.gguf", "llama")
    for name, field in src.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == f"llama.{key}":
            continue
        w.add_key_value(name, field.contents(), field.types[0],
                        field.types[-1] if len(field.types) > 1 else None)
    if value is not MISSING:
        if isinstance(value, str):
            w.add_string(f"llama.{key}", value)
        elif isinstance(value, float):
            w.add_float32(f"llama.{key}", value)
        else:
            w.add_int32(f"llama.{key}", value)
    for t in src.tensors:
        w.add_tensor(t.name, np.asarray(t.data).reshape(tuple(reversed(
            [int(x) for x in t.shape]))), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path + f".{key}.gguf"


def test_damaged_gguf_metadata_is_refused_by_name(dirs):
    tally = Tally()
    control = _gguf_with(dirs["gguf"], "block_count", L)   # rewritten as it was: it loads
    _forward_target(dj.load_target(control, tokenizer=False))
    damage = {"block_count": ("2", 2.5, 0, -3, 10 ** 9, MISSING),
              "embedding_length": ("32", 0, -1, MISSING),
              "attention.head_count": (0, -4, "4"),
              "attention.head_count_kv": (0, 3, "2"),
              "rope.freq_base": (-3.0, 0.0, "1e4", 1e30),
              "attention.layer_norm_rms_epsilon": (-1e-5, 0.0, "x"),
              "context_length": (0, -1, "256", 10 ** 9)}
    for key, values in damage.items():
        for value in values:
            g = _gguf_with(dirs["gguf"], key, value)
            tally.attempt(f"gguf llama.{key} = {value!r}",
                          lambda g=g: dj.load_target(g, tokenizer=False), _forward_target,
                          (g,))
            os.remove(g)
    print(f"\nGGUF mutations: {tally.refused + tally.loaded + len(tally.failures)} tried, "
          f"{tally.refused} refused by name, {tally.loaded} loaded and ran a forward, "
          f"{len(tally.failures)} failed")
    assert not tally.failures, "\n".join(tally.failures)
    assert tally.refused > 15 and tally.loaded >= 2
