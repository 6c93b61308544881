"""Damaged files and wrong inputs are named (file, tensor, what is wrong) before any compute."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import dominotree_jax as dj
from convert.errors import CheckpointError

import released_layouts as rl

V, H, I, L, HEADS, KV = 64, 32, 48, 2, 4, 2


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    root = tmp_path_factory.mktemp("good")
    return {"target": rl.write_target(str(root / "target")),
            "drafter": rl.write_drafter(str(root / "drafter"), "domino_8b"),
            "gguf": write_tiny_gguf(str(root / "tiny.gguf"))}


def write_tiny_gguf(path: str) -> str:
    """A two-layer Llama GGUF with F32 tensors (a positive control for the damaged ones)."""
    import gguf

    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(L)
    w.add_context_length(256)
    w.add_embedding_length(H)
    w.add_feed_forward_length(I)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(V)
    D = H // HEADS
    shapes = {"token_embd.weight": (V, H), "output_norm.weight": (H,),
              "output.weight": (V, H)}
    for i in range(L):
        shapes.update({f"blk.{i}.attn_norm.weight": (H,), f"blk.{i}.ffn_norm.weight": (H,),
                       f"blk.{i}.attn_q.weight": (HEADS * D, H),
                       f"blk.{i}.attn_k.weight": (KV * D, H),
                       f"blk.{i}.attn_v.weight": (KV * D, H),
                       f"blk.{i}.attn_output.weight": (H, HEADS * D),
                       f"blk.{i}.ffn_gate.weight": (I, H), f"blk.{i}.ffn_up.weight": (I, H),
                       f"blk.{i}.ffn_down.weight": (H, I)})
    for name, shape in shapes.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _copy(src, dst):
    (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, dst)
    return str(dst)


def _cut(path, keep_fraction=None, keep_bytes=None):
    size = os.path.getsize(path)
    keep = keep_bytes if keep_bytes is not None else int(size * keep_fraction)
    with open(path, "r+b") as f:
        f.truncate(keep)


def test_the_good_files_load(good):
    pair = dj.load_pair(good["target"], good["drafter"])
    assert pair.drafter_config.is_domino
    assert dj.load_target(good["gguf"], tokenizer=False).config.num_hidden_layers == L


def test_truncated_safetensors_names_the_file_and_a_tensor(good, tmp_path):
    d = _copy(good["drafter"], tmp_path / "d")
    st = os.path.join(d, "model.safetensors")
    _cut(st, 0.5)
    with pytest.raises(CheckpointError) as e:
        dj.load_pair(good["target"], d)
    msg = str(e.value)
    assert st in msg and "truncated file" in msg and "tensor " in msg


def test_safetensors_header_cut_or_lying(good, tmp_path):
    d = _copy(good["drafter"], tmp_path / "d")
    st = os.path.join(d, "model.safetensors")
    with open(st, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    name = sorted(k for k in header if k != "__metadata__")[0]
    header[name]["shape"] = [header[name]["shape"][0] * 2] + header[name]["shape"][1:]
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(st, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + raw[8 + n:])
    with pytest.raises(CheckpointError, match=f"tensor {name}: header offsets .* needs"):
        dj.load_pair(good["target"], d)
    _cut(st, keep_bytes=40)
    with pytest.raises(CheckpointError, match="truncated safetensors file: the header claims"):
        dj.load_pair(good["target"], d)


def test_malformed_config_json_names_the_file(good, tmp_path):
    d = _copy(good["drafter"], tmp_path / "d")
    cfg = os.path.join(d, "config.json")
    with open(cfg, "w") as f:
        f.write('{"architectures": ["DFlashDraftModel"], "block_size": 16,')
    with pytest.raises(CheckpointError, match="malformed JSON in config.json") as e:
        dj.load_pair(good["target"], d)
    assert cfg in str(e.value)
    t = _copy(good["target"], tmp_path / "t")
    with open(os.path.join(t, "config.json"), "w") as f:
        f.write("[1, 2]")
    with pytest.raises(CheckpointError, match="config.json holds a list, not a JSON object"):
        dj.load_target(t)


def test_missing_path_says_it_does_not_exist(good, tmp_path):
    gone = str(tmp_path / "no-such-model")
    for load in (lambda: dj.load_target(gone), lambda: dj.load_pair(good["target"], gone),
                 lambda: dj.load_target(gone + ".gguf")):
        with pytest.raises(CheckpointError, match="the path does not exist") as e:
            load()
        assert "no-such-model" in str(e.value)


def test_prompt_of_floats_is_refused(good):
    target = dj.load_target(good["target"], tokenizer=False)
    with pytest.raises(ValueError, match="integer token ids, got dtype float64"):
        dj.generate(target, [[1.5, 2.0]], max_new_tokens=2)
    with pytest.raises(ValueError, match="integer token ids, got dtype bool"):
        dj.target_logits(target, [[True, False]])
    config = dj.DecodeConfig(target=target.config, max_new_tokens=2)
    with pytest.raises(ValueError, match="integer token ids, got dtype float32"):
        dj.decode({"target": target.params, "drafter": None}, np.array([[1.5, 2.0]], np.float32),
                  config=config)


def test_gguf_wrong_magic(good, tmp_path):
    g = _copy(good["gguf"], tmp_path / "m.gguf")
    with open(g, "r+b") as f:
        f.write(b"GGML")
    with pytest.raises(CheckpointError, match="not a GGUF file: it starts with b'GGML'") as e:
        dj.load_target(g, tokenizer=False)
    assert g in str(e.value)


def test_gguf_truncated_header(good, tmp_path):
    g = _copy(good["gguf"], tmp_path / "h.gguf")
    _cut(g, keep_bytes=100)
    with pytest.raises(CheckpointError, match="GGUF header ends early: .* the file holds 100") as e:
        dj.load_target(g, tokenizer=False)
    assert g in str(e.value)


def test_gguf_header_promises_more_data_than_the_file_holds(good, tmp_path):
    g = _copy(good["gguf"], tmp_path / "d.gguf")
    _cut(g, keep_bytes=os.path.getsize(g) - 1000)
    with pytest.raises(CheckpointError, match="tensor .*: the header places it at bytes") as e:
        dj.load_target(g, tokenizer=False)
    assert g in str(e.value) and "truncated" in str(e.value)


@pytest.fixture(scope="module")
def orbax_target(good, tmp_path_factory):
    from convert.__main__ import main
    out = str(tmp_path_factory.mktemp("orbax") / "t")
    assert main(["target", good["target"], out]) == 0
    return out


def test_orbax_round_trip_is_the_positive_control(good, orbax_target):
    assert dj.load_target(orbax_target, tokenizer=False).config == \
        dj.load_target(good["target"], tokenizer=False).config


def test_orbax_malformed_config_names_the_file(orbax_target, tmp_path):
    o = _copy(orbax_target, tmp_path / "o")
    with open(os.path.join(o, "model_config.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(CheckpointError, match="malformed JSON in model_config.json"):
        dj.load_target(o)


def test_orbax_missing_or_damaged_arrays(orbax_target, tmp_path):
    o = _copy(orbax_target, tmp_path / "o")
    params = os.path.join(o, "params")
    chunks = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(params, "ocdbt.process_0"))
              for f in fs if os.path.getsize(os.path.join(r, f)) > 10_000]
    assert chunks, "expected array data chunks under params/ocdbt.process_0"
    for f in chunks:
        _cut(f, 0.3)
    # The failing restore runs in its own process: tensorstore may report its abandoned reads to
    # the garbage collector long after the error, and such a late report must not land inside a
    # later test's compile (it once did, as a SystemError from the AST constructor).
    script = ("import dominotree_jax as dj\n"
              "from convert.errors import CheckpointError\n"
              "try:\n"
              f"    dj.load_target({o!r})\n"
              "except CheckpointError as e:\n"
              "    print('CheckpointError:', e, flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert proc.stdout.startswith("CheckpointError:"), proc.stdout + proc.stderr
    assert "damaged orbax array data" in proc.stdout and params in proc.stdout, proc.stdout
    _cut(os.path.join(params, "_METADATA"), 0.5)
    with pytest.raises(CheckpointError, match="damaged orbax metadata"):
        dj.load_target(o)
    shutil.rmtree(params)
    with pytest.raises(CheckpointError, match="no params directory"):
        dj.load_target(o)


def test_orbax_drafter_round_trip_and_kind_check(good, orbax_target, tmp_path):
    from convert.__main__ import main
    out = str(tmp_path / "d")
    assert main(["drafter", good["drafter"], out]) == 0
    a, b = dj.load_pair(orbax_target, out), dj.load_pair(good["target"], good["drafter"])
    assert a.drafter_config == b.drafter_config
    with pytest.raises(CheckpointError, match="holds a 'drafter', not a target"):
        dj.load_target(out)
