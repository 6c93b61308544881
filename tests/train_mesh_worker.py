"""Run by ``test_train_mesh.py`` in a subprocess with 8 host CPU devices: the drafter trainer on
a mesh of 8 devices (the batch split over the ``data`` axis) computes the losses and
parameters of 1 device, and a run checkpointed on 8 devices resumes on 1 as the unbroken run.

Prints one ``ok`` line per check; exits non-zero (an AssertionError) on any mismatch.
"""

from __future__ import annotations

import sys
import tempfile

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from dominotree_jax.sharding import make_mesh
from dominotree_jax.train.dataset import SequenceDataset
from dominotree_jax.train.features import FeatureCache
from dominotree_jax.train.trainer import TrainConfig, Trainer
from train_fixtures import DCFG, TCFG, tiny_target_and_answers

TC = TrainConfig(steps=4, batch=8, anchors=4, lr=3e-3, warmup=2, seed=0, ckpt_every_s=1e9)
RTOL, ATOL = 2e-4, 2e-5


def same_run(got, got_history, want, want_history):
    """``got`` trained as ``want`` did: the same losses and parameters within tolerance."""
    np.testing.assert_allclose([h["loss"] for h in got_history],
                               [h["loss"] for h in want_history], rtol=RTOL)
    for k, v in want.flat.items():
        np.testing.assert_allclose(np.asarray(got.flat[k]), np.asarray(v), rtol=RTOL,
                                   atol=ATOL, err_msg=k)


def main() -> int:
    assert len(jax.devices()) == 8, jax.devices()
    root = tempfile.mkdtemp()
    target, store, _ = tiny_target_and_answers(f"{root}/data")
    ds = SequenceDataset(store, FeatureCache(f"{root}/f", TCFG, target.params, (0, 1)), 40)
    ids, _ = ds.split(10)

    def trainer(name, mesh):
        return Trainer(DCFG, TCFG, target.params, ds, ids, TC, f"{root}/{name}",
                       progress=False, mesh=mesh)

    one = trainer("one", make_mesh(1, 1, devices=jax.devices()[:1]))
    h1 = one.fit()
    eight = trainer("eight", make_mesh(8, 1))
    assert eight.mesh.shape["data"] == 8
    same_run(eight, eight.fit(), one, h1)
    print("ok 8 devices = 1 device over", TC.steps, "steps")
    # data 4 x model 2: the drafter, its moments and the target split over "model"
    split = trainer("split", make_mesh(4, 2))
    q = split.flat["layers.0.self_attn.q_proj.weight"]
    assert q.sharding.spec == P("model", None), q.sharding
    assert split.flat["layers.0.mlp.down_proj.weight"].sharding.spec == P(None, "model")
    assert split.flat["fc.weight"].sharding.spec == P()
    moments = [x for path, x in jax.tree_util.tree_flatten_with_path(split.opt_state)[0]
               if "layers.0.self_attn.q_proj.weight" in jax.tree_util.keystr(path)]
    assert len(moments) == 2 and all(m.sharding.spec == P("model", None) for m in moments)
    tq = split.train_tparams["layers"][0]["self_attn"]["q_proj"]["weight"][...]
    assert tq.sharding.spec == P("model", None), tq.sharding
    same_run(split, split.fit(), one, h1)
    print("ok a 4 x 2 data x model mesh = 1 device over", TC.steps, "steps")
    # a run checkpointed on 8 devices, resumed on 1
    a = trainer("moved", make_mesh(8, 1))
    a.fit(num_steps=2)
    a.close()
    b = trainer("moved", make_mesh(1, 1, devices=jax.devices()[:1]))
    assert b.step == 2
    b.fit()
    for k, v in one.flat.items():
        np.testing.assert_allclose(np.asarray(b.flat[k]), np.asarray(v), rtol=RTOL, atol=ATOL,
                                   err_msg=k)
    print("ok resumed on 1 device after 2 steps on 8 = the unbroken run")
    try:
        trainer("odd", make_mesh(3, 1, devices=jax.devices()[:3]))
    except ValueError as e:
        assert "does not split over the 3 devices" in str(e), e
        print("ok a batch the data axis does not divide is refused")
    for t in (one, eight, split, b):
        t.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
