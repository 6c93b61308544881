"""Drafter training loop: AdamW + warm-up + cosine, global-norm clipping, frozen target,
orbax checkpoints that resume exactly, tqdm progress and a CSV learning curve.

The trainable state is ``{"params": {dotted.name: array}, "opt_state": …, "step": int,
"key": uint32[2]}``. Batch ``k`` of the data stream is a pure function of ``(seed, k)``
(``dataset.batch_stream``), so the step counter is the data-iterator position: a run killed at
any point and restarted from its last checkpoint replays the same batches and produces the
same parameters bit for bit.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

from dominotree_jax.model.state import flat_to_state, state_to_flat, trainable
from dominotree_jax.config import DrafterConfig, TargetConfig
from dominotree_jax.model.drafter import init_drafter_params
from dominotree_jax.precision import Precision, cast_params, precision_name
from dominotree_jax.train.dataset import batch_stream, make_batch
from dominotree_jax.train.loss import DSparkLoss, curriculum_lambda, loss_and_metrics

CSV_FIELDS = ("step", "loss", "base_loss", "corr_loss", "base_acc0", "base_acc_mean",
              "corr_acc_mean", "tau_base", "tau_corr", "lam", "lr", "grad_norm", "tok_s",
              "wall_s", "labels")


# settings saved (run.json, campaign.json's "train") under an older name: old -> new
RENAMED_SETTINGS = {"dtype": "precision"}


def writes_logs() -> bool:
    """Whether this process writes a run's logs: the only one, or process 0 of a
    ``jax.distributed`` run (every process computes the same rows; one file each)."""
    return jax.process_index() == 0


def agreed(*flags: bool) -> tuple[bool, ...]:
    """Process 0's ``flags`` in every process: decisions all processes must take together (a
    checkpoint is a collective; a stop leaves the others waiting) though each reads its own
    clock; ``flags`` themselves in a single process."""
    if jax.process_count() == 1:
        return tuple(bool(f) for f in flags)
    from jax.experimental import multihost_utils
    return tuple(bool(f) for f in multihost_utils.broadcast_one_to_all(np.asarray(flags)))


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    batch: int = 8            # sequences per step
    anchors: int = 12         # blocks per sequence
    lr: float = 1e-3
    warmup: int = 100
    min_lr_frac: float = 0.1
    weight_decay: float = 0.01
    clip: float = 1.0
    gamma: float | None = 7.0
    soft: float = 0.0         # weight of the soft (target-distribution) targets
    curriculum: bool = True   # lambda 1 -> 0 over the first half; False: lambda = 0
    # Recipe options (docs/training.md). Defaults reproduce the v3 recipe.
    lam_hold: float = 0.0     # fraction of the steps at lambda = 1 (base / backbone only)
    lam_ramp: float = 0.5     # then lambda falls linearly over this fraction of the steps
    lam_end: float = 0.0      # ... to this value, kept to the end
    layer_init: str = "random"   # "target": drafter layers = the target's last layers
    anchor_mode: str = "sample"  # "all": every valid position, `anchors` = cap per sequence
    until_fail: bool = False     # accept-until-fail weighting per head
    until_fail_floor: float = 0.0
    soft_topk: float = 0.0    # weight of KL to the stored, renormalised top-k target logits
    tv: float = 0.0           # weight of the L1 to the target's distribution (train/loss.py)
    # a DSpark drafter's loss terms (train/loss.py ``DSparkLoss``; DeepSpec's defaults)
    dspark_ce: float = 0.1
    dspark_l1: float = 0.9
    dspark_confidence: float = 1.0
    selector_loss: float = 1.0    # a DFlash2 drafter's selector term (train/loss.py)
    # the backbone's learning rate as a fraction of ``lr`` (0: frozen); the heads (Domino,
    # Markov, confidence) keep ``lr``
    backbone_lr: float = 1.0
    # the training forward's precision (a ``Precision`` or its name; docs/precision.md): the
    # float32 master weights and the frozen target are cast to it inside the step
    precision: Precision = Precision()
    seed: int = 0
    ckpt_every_s: float = 240.0
    keep: int = 2

    def __post_init__(self):   # one model's precision, refused by name otherwise
        object.__setattr__(self, "precision",
                           Precision(precision_name(self.precision, "training precision")))

    @property
    def dspark_loss(self) -> DSparkLoss:
        return DSparkLoss(self.dspark_ce, self.dspark_l1, self.dspark_confidence)

    def to_json(self) -> dict:
        """The fields as JSON values (the precision as its name)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**d, "precision": str(self.precision)}

    @classmethod
    def from_json(cls, d: dict) -> "TrainConfig":
        """``to_json``'s inverse; also reads settings saved before a field was renamed
        (``"dtype"``: the precision)."""
        d = dict(d)
        for old, new in RENAMED_SETTINGS.items():
            if old in d:
                if new in d:
                    raise ValueError(f"saved training settings hold both {old!r} and {new!r}")
                d[new] = d.pop(old)
        return cls(**d)


LAYER_INITS = ("random", "target")


def check_train_config(tc: TrainConfig) -> None:
    """Reject recipe settings that make no sense, naming the setting."""
    from dominotree_jax.train.dataset import ANCHOR_MODES
    if tc.layer_init not in LAYER_INITS:
        raise ValueError(f"layer_init must be one of {LAYER_INITS}, got {tc.layer_init!r}")
    if tc.anchor_mode not in ANCHOR_MODES:
        raise ValueError(f"anchor_mode must be one of {ANCHOR_MODES}, got {tc.anchor_mode!r}")
    for name in ("lam_hold", "lam_ramp", "lam_end", "until_fail_floor", "soft", "soft_topk",
                 "tv", "backbone_lr"):
        v = getattr(tc, name)
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {v}")
    if tc.soft and tc.soft_topk:
        raise ValueError("choose one kind of soft targets: soft or soft_topk")
    for name in ("dspark_ce", "dspark_l1", "dspark_confidence", "selector_loss"):
        if getattr(tc, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(tc, name)}")
    if tc.anchors < 1:
        raise ValueError(f"anchors must be >= 1, got {tc.anchors}")


HEAD_PREFIXES = ("prefix_gru.", "embed_proj.", "markov_head.", "confidence_head.",
                 "candidate_selector.")


def is_head(name: str) -> bool:
    """A parameter of a head (Domino, Markov, confidence), not of the backbone."""
    return name.startswith(HEAD_PREFIXES)


def make_optimizer(tc: TrainConfig):
    """``(optimizer, schedule)`` over a flat ``{name: array}``: AdamW on the warmup-cosine
    schedule after global-norm clipping; with ``backbone_lr < 1`` the backbone's updates are
    scaled by it (0: frozen, its moments never kept)."""
    sched = optax.warmup_cosine_decay_schedule(
        0.0, tc.lr, warmup_steps=max(1, min(tc.warmup, tc.steps - 1)),
        decay_steps=max(tc.steps, 2), end_value=tc.lr * tc.min_lr_frac)
    adamw = optax.adamw(sched, b1=0.9, b2=0.95, weight_decay=tc.weight_decay)
    if tc.backbone_lr == 1.0:
        return optax.chain(optax.clip_by_global_norm(tc.clip), adamw), sched
    backbone = (optax.set_to_zero() if tc.backbone_lr == 0.0 else
                optax.chain(optax.adamw(sched, b1=0.9, b2=0.95, weight_decay=tc.weight_decay),
                            optax.scale(tc.backbone_lr)))

    def labels(flat):
        return {n: "head" if is_head(n) else "backbone" for n in flat}
    return optax.chain(optax.clip_by_global_norm(tc.clip),
                       optax.multi_transform({"head": adamw, "backbone": backbone},
                                             labels)), sched


def init_params(dcfg: DrafterConfig, seed: int, tparams=None) -> dict:
    """Random drafter parameters as ``{name: float32 array}``. The correction's output layer
    starts at zero so the corrected logits start equal to the base logits, and the final
    norm starts as the target's (``z`` then has the scale the shared LM head expects)."""
    flat = trainable(state_to_flat(init_drafter_params(dcfg, seed)))
    if tparams is not None:
        flat["norm.weight"] = jnp.array(tparams["norm"]["weight"][...], jnp.float32, copy=True)
    if dcfg.is_domino:
        flat["embed_proj.2.weight"] = jnp.zeros_like(flat["embed_proj.2.weight"])
    return start_heads_neutral(dcfg, flat)


def start_heads_neutral(dcfg: DrafterConfig, flat: dict) -> dict:
    """A new DSpark drafter's heads as training starts them: the Markov correction's output
    ``W2`` at zero (the corrected logits equal the base ones) and the confidence head at zero
    (it predicts 1/2 everywhere)."""
    flat = dict(flat)
    for name in ("markov_head.markov_w2.weight", "confidence_head.proj.weight",
                 "confidence_head.proj.bias"):
        if name in flat:
            flat[name] = jnp.zeros_like(flat[name])
    return flat


def fill_untrained_rows(flat: dict, vocab_ids) -> dict:
    """Correction-output rows (``embed_proj.2.weight``) of tokens outside the training softmax
    subset get the mean of the trained rows.

    A softmax over a subset is invariant to a common offset of all its logits, and the
    correction uses that freedom: most of each trained row is a shared component (a large
    common offset). Untrained rows are zero, so over the full vocabulary those tokens would
    beat every trained one. Giving them the mean row gives them the same shared offset (the
    mean of the token-specific parts), which restores the ranking.
    """
    if "embed_proj.2.weight" not in flat:
        return flat
    w2 = flat["embed_proj.2.weight"]
    ids = jnp.asarray(vocab_ids, jnp.int32)
    inside = jnp.zeros((w2.shape[0],), bool).at[ids].set(True)
    mean = jnp.mean(jnp.take(w2, ids, axis=0), axis=0)
    out = dict(flat)
    out["embed_proj.2.weight"] = jnp.where(inside[:, None], w2, mean[None, :])
    return out


def _train_step_impl(flat, opt_state, batch, step, tparams, vocab_ids, vocab_index, *, dcfg,
                     tcfg, tc: TrainConfig):
    opt, sched = make_optimizer(tc)
    lam = (curriculum_lambda(step, tc.steps, tc.lam_hold, tc.lam_ramp, tc.lam_end)
           if tc.curriculum else jnp.float32(0.0))

    if dcfg.draft_vocab_size is not None:   # the drafter's fixed d2t, not a trained leaf
        fixed, vocab_ids, vocab_index = {"d2t": vocab_ids}, None, None
    else:
        fixed = {}

    def f(p):
        if tc.backbone_lr == 0.0:   # a frozen backbone: no gradient computed through it
            p = {k: v if is_head(k) else jax.lax.stop_gradient(v) for k, v in p.items()}
        p = cast_params(p, tc.precision)   # float32 master weights; gradients flow through it
        return loss_and_metrics(dcfg, tcfg, flat_to_state(dcfg, {**p, **fixed}), tparams, batch,
                                lam,
                                tc.gamma, vocab_ids, vocab_index, tc.soft,
                                soft_topk=tc.soft_topk, until_fail=tc.until_fail,
                                until_fail_floor=tc.until_fail_floor, dspark=tc.dspark_loss,
                                selector_weight=tc.selector_loss, tv=tc.tv)

    (loss, m), grads = jax.value_and_grad(f, has_aux=True)(flat)
    updates, opt_state = opt.update(grads, opt_state, flat)
    flat = optax.apply_updates(flat, updates)
    m = dict(m, lam=lam, lr=sched(step), grad_norm=optax.tree.norm(grads))
    return flat, opt_state, m


_train_step = jax.jit(_train_step_impl, static_argnames=("dcfg", "tcfg", "tc"),
                      donate_argnums=(0, 1))


def _eval_impl(flat_or_state, tparams, batch, *, dcfg, tcfg):
    return loss_and_metrics(dcfg, tcfg, flat_or_state, tparams, batch, 0.0, None)[1]


_eval_step = jax.jit(_eval_impl, static_argnames=("dcfg", "tcfg"))


def _global_array(x, sharding):
    """``x`` (the same host value in every process) as one array laid out by ``sharding``, each
    process filling the shards of its own devices (a plain ``device_put`` in one process)."""
    if isinstance(x, jax.Array) and x.sharding == sharding:
        return x
    if jax.process_count() == 1:
        return jax.device_put(x, sharding)
    host = np.asarray(x) if not isinstance(x, jax.Array) or x.is_fully_addressable else \
        np.asarray(x.addressable_data(0))
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


class Trainer:
    """Owns the training state; ``fit`` runs steps, checkpoints and logs."""

    def __init__(self, dcfg: DrafterConfig, tcfg: TargetConfig, tparams, ds, train_ids,
                 tc: TrainConfig, ckpt_dir: str, log_dir: str | None = None,
                 progress: bool = True, vocab_ids=None, init_flat: dict | None = None,
                 seq_weights=None, mesh=None, rules=None):
        """``vocab_ids``: optional sorted token ids the training softmax is restricted to
        (``dataset.active_vocab``); evaluation always uses the full vocabulary. For a drafter
        with a draft vocabulary (``dcfg.draft_vocab_size``) they are its ``d2t`` map, required,
        and training and evaluation both run over it. ``init_flat``:
        starting parameters ``{name: array}`` (warm start, e.g. an exported drafter); a
        checkpoint in ``ckpt_dir`` takes precedence. ``tc.layer_init="target"`` copies the
        target's last layers into a new drafter's (``target_init``; not with ``init_flat``).
        ``mesh``: the devices (default: all, on ``"data"``); with a ``"model"`` axis the drafter,
        its optimizer state and the frozen target are split over it by their declared logical
        axes and ``rules`` (a ``sharding.ShardingRules``; default the decoding rules)."""
        check_train_config(tc)
        # the device mesh: every visible device on the "data" axis unless given; the global
        # batch (tc.batch) is split over it, so 1 and N devices compute the same step
        from dominotree_jax.sharding import DATA, ShardingRules, make_mesh
        self.mesh = mesh if mesh is not None else make_mesh(len(jax.devices()), 1)
        self.rules = rules if rules is not None else ShardingRules()
        n_data = self.mesh.shape[DATA]
        if tc.batch % n_data:
            raise ValueError(f"the batch of {tc.batch} sequences does not split over the "
                             f"{n_data} devices of the mesh's data axis; choose a multiple")
        if tc.soft_topk and not getattr(ds, "topk_k", 0):
            raise ValueError("soft_topk needs a data set with stored top-k logits "
                             "(collect --store-topk K)")
        if tc.layer_init == "target" and init_flat is not None:
            raise ValueError("layer_init='target' initialises a new drafter; it cannot be "
                             "combined with a warm start")
        self.dcfg, self.tcfg, self.tparams = dcfg, tcfg, tparams
        # the frozen target in the training forward's precision (evaluation keeps ``tparams``)
        self.train_tparams = (tparams if tc.precision == Precision("float32")
                              else cast_params(tparams, tc.precision))
        if dcfg.draft_vocab_size is not None:
            from dominotree_jax.model.drafter import check_draft_vocab
            if vocab_ids is None:
                raise ValueError("a drafter with a draft vocabulary trains with its d2t map: "
                                 "give vocab_ids")
            vocab_ids = check_draft_vocab(vocab_ids, tcfg.vocab_size, dcfg.draft_vocab_size,
                                          "vocab_ids")
        if vocab_ids is None:
            self.vocab_ids = self.vocab_index = None
        else:
            self.vocab_ids = jnp.asarray(vocab_ids, jnp.int32)
            index = np.full((tcfg.vocab_size,), -1, np.int32)
            index[np.asarray(vocab_ids)] = np.arange(len(vocab_ids), dtype=np.int32)
            self.vocab_index = jnp.asarray(index)
        self.ds, self.train_ids, self.tc = ds, np.asarray(train_ids), tc
        self.local_rows = self._local_rows()
        self.seq_weights = seq_weights   # per train id: how often an epoch holds it

        self.ckpt_dir = os.path.abspath(ckpt_dir)
        self.log_dir = log_dir
        self.progress = progress
        if init_flat is None:
            self.flat = init_params(dcfg, tc.seed, tparams)
            if tc.layer_init == "target":
                from dominotree_jax.train.target_init import target_layer_init
                self.flat = {k: jnp.asarray(v, jnp.float32) for k, v in target_layer_init(
                    dcfg, tcfg, self.flat, tparams).items()}
        else:
            self.flat = trainable(init_flat)
        self.train_tparams = self._placed_target(self.train_tparams)
        if self.vocab_ids is not None:
            self.vocab_ids = self._replicated(self.vocab_ids)
            self.vocab_index = self._replicated(self.vocab_index)
        self.flat, self.opt_state = self.place_state(self.flat,
                                                     make_optimizer(tc)[0].init(self.flat))
        self.step = 0
        self.key = jax.random.key_data(jax.random.key(tc.seed))
        self.history: list[dict] = []
        self._mgr = ocp.CheckpointManager(
            self.ckpt_dir, options=ocp.CheckpointManagerOptions(max_to_keep=tc.keep,
                                                                 create=True))
        if self._mgr.latest_step() is not None:
            self.restore()

    # ------------------------------------------------------------------ placement
    def _replicated(self, tree):
        """``tree`` on every device of the mesh (parameters, optimizer state, the target);
        with several processes (``jax.distributed``) each supplies its own devices' copies."""
        from jax.sharding import NamedSharding, PartitionSpec
        rep = NamedSharding(self.mesh, PartitionSpec())
        return jax.tree.map(lambda x: _global_array(x, rep), tree)

    @property
    def model_size(self) -> int:
        """Devices on the mesh's ``"model"`` axis (1: the drafter and target replicated)."""
        from dominotree_jax.sharding import MODEL
        return int(self.mesh.shape.get(MODEL, 1))

    def _drafter_specs(self) -> dict:
        """``{flat name: PartitionSpec}`` of the drafter's trained parameters, from the axes its
        modules declare and ``self.rules`` (the placement decoding uses)."""
        from dominotree_jax.model.drafter import drafter_graphdef
        from dominotree_jax.sharding import flat_param_specs
        _, abstract = drafter_graphdef(self.dcfg, "float32")
        return flat_param_specs(abstract, self.model_size, self.rules)

    def place_state(self, flat: dict, opt_state):
        """The drafter's parameters and optimizer state on the mesh: replicated over ``"data"``,
        split over ``"model"`` by the drafter's declared logical axes (each moment like its
        parameter); with several processes each supplies its own devices' shards."""
        from jax.sharding import NamedSharding, PartitionSpec
        if self.model_size == 1:
            return self._replicated((flat, opt_state))
        specs = self._drafter_specs()

        def sharding(name, shape):
            spec = specs.get(name, PartitionSpec())
            return NamedSharding(self.mesh, spec if len(spec) <= len(shape) else PartitionSpec())
        flat = {k: _global_array(v, sharding(k, np.shape(v))) for k, v in flat.items()}

        def moment(path, x):   # a leaf under a parameter's name: that parameter's placement
            names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
            name = next((n for n in reversed(names) if n in specs), None)
            same = name is not None and np.shape(x) == np.shape(flat[name])
            return _global_array(x, sharding(name, np.shape(x)) if same
                                 else NamedSharding(self.mesh, PartitionSpec()))
        return flat, jax.tree_util.tree_map_with_path(moment, opt_state)

    def _placed_target(self, tparams):
        """The frozen target on the mesh: split over ``"model"`` by its declared axes (the
        decoding placement), else replicated."""
        if self.model_size == 1:
            return self._replicated(tparams)
        from dominotree_jax.sharding import place_params
        return place_params(tparams, self.mesh, self.rules, put=_global_array)

    def _data_sharding(self, ndim: int):
        from jax.sharding import NamedSharding, PartitionSpec

        from dominotree_jax.sharding import DATA
        return NamedSharding(self.mesh, PartitionSpec(DATA, *([None] * (ndim - 1))))

    def _local_rows(self) -> np.ndarray:
        """The rows of each global batch this process's devices hold (all of them in one
        process): the only rows it builds, so features are computed once per row in the run."""
        index = self._data_sharding(1).addressable_devices_indices_map((self.tc.batch,))
        return np.unique(np.concatenate([np.arange(self.tc.batch)[ix[0]]
                                         for ix in index.values()]))

    def _split_batch(self, batch: dict) -> dict:
        """A batch of this process's rows (``local_rows``; in one process the whole batch) as
        global arrays whose leading axis is split over the mesh's data axis."""
        rows = self.local_rows
        if jax.process_count() == 1 and len(rows) == self.tc.batch:
            return {k: jax.device_put(np.asarray(v), self._data_sharding(np.ndim(v)))
                    for k, v in batch.items()}

        def put(x):
            x = np.asarray(x)
            if len(x) != len(rows):
                raise ValueError(f"a batch of {len(x)} rows where this process holds "
                                 f"{len(rows)}")
            shape = (self.tc.batch,) + x.shape[1:]

            def local(index):   # global rows index[0] -> their positions in ``x``
                return x[(np.searchsorted(rows, np.arange(self.tc.batch)[index[0]]),)
                         + tuple(index[1:])]
            return jax.make_array_from_callback(shape, self._data_sharding(x.ndim), local)
        return {k: put(v) for k, v in batch.items()}

    # ------------------------------------------------------------------ state
    @property
    def params(self):
        """The inference-ready drafter parameters as an ``nnx.State`` (for ``save_drafter`` /
        decode): with a training vocabulary subset, see ``fill_untrained_rows``."""
        flat = self.flat
        if self.dcfg.draft_vocab_size is not None:
            flat = {**flat, "d2t": self.vocab_ids}
        elif self.vocab_ids is not None:
            flat = fill_untrained_rows(flat, self.vocab_ids)
        return flat_to_state(self.dcfg, flat)

    def _state(self):
        # the key as host data: every process holds the same one (orbax writes it once)
        return {"params": self.flat, "opt_state": self.opt_state,
                "step": np.asarray(self.step, np.int64), "key": np.asarray(self.key)}

    def save(self):
        if self._mgr.latest_step() == self.step:   # already saved (a periodic checkpoint)
            return
        self._mgr.save(self.step, args=ocp.args.StandardSave(self._state()), force=True)
        self._mgr.wait_until_finished()

    def restore(self, step: int | None = None):
        step = self._mgr.latest_step() if step is None else step
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, self._state())
        st = self._mgr.restore(step, args=ocp.args.StandardRestore(abstract))
        self.flat, self.opt_state = self.place_state(st["params"], st["opt_state"])
        self.step, self.key = int(st["step"]), np.asarray(st["key"])
        self._trim_csv()

    def close(self):
        self._mgr.wait_until_finished()
        self._mgr.close()

    # ------------------------------------------------------------------ logging
    def _csv_path(self):
        return os.path.join(self.log_dir, "train_log.csv") if self.log_dir else None

    def _trim_csv(self):
        """After a restore, drop learning-curve rows past the restored step."""
        path = self._csv_path()
        if not path or not os.path.exists(path) or not writes_logs():
            return
        with open(path) as f:
            rows = [r for r in csv.DictReader(f) if int(r["step"]) <= self.step]
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, CSV_FIELDS)
            w.writeheader()
            w.writerows(rows)

    def _append_csv(self, row):
        path = self._csv_path()
        if not path or not writes_logs():
            return
        new = not os.path.exists(path)
        with open(path, "a", newline="") as f:
            w = csv.DictWriter(f, CSV_FIELDS)
            if new:
                w.writeheader()
            w.writerow(row)

    # ------------------------------------------------------------------ loop
    def train_step(self, batch):
        """One step on ``batch``: the rows ``local_rows`` of the global batch (all of it in one
        process), as ``batch_stream(rows=trainer.local_rows)`` yields them."""
        self.key, _ = jax.random.split(jax.random.wrap_key_data(self.key))
        self.key = jax.random.key_data(self.key)
        self.flat, self.opt_state, m = _train_step(
            self.flat, self.opt_state, self._split_batch(batch),
            jnp.asarray(self.step, jnp.int32), self.train_tparams, self.vocab_ids,
            self.vocab_index, dcfg=self.dcfg, tcfg=self.tcfg, tc=self.tc)
        self.step += 1
        return jax.device_get(m)

    def _eval_row(self, eval_fn):
        """Held-out metrics of the current parameters, appended to ``heldout_curve.jsonl``."""
        m = dict(eval_fn(self), step=self.step,
                 labels_seen=sum(h["labels"] for h in self.history) + self._labels_before)
        if self.log_dir and writes_logs():
            import json
            with open(os.path.join(self.log_dir, "heldout_curve.jsonl"), "a") as f:
                f.write(json.dumps(m) + "\n")
        return m

    def fit(self, num_steps: int | None = None, deadline: float | None = None,
            eval_fn=None, eval_every: int = 0, on_checkpoint=None):
        """Train up to ``num_steps`` more steps (default: to ``tc.steps``), checkpointing every
        ``ckpt_every_s`` seconds and at the end (also when ``deadline`` (epoch s) passes);
        ``on_checkpoint(trainer)`` runs after each of those saves.
        ``eval_fn(trainer) -> dict``: held-out metrics, logged every ``eval_every`` steps (and
        at the start of a fresh run and at the end)."""
        tc = self.tc
        self._labels_before = self._csv_labels()
        if eval_fn is not None and self.step == 0:
            self._eval_row(eval_fn)
        end = tc.steps if num_steps is None else min(tc.steps, self.step + num_steps)
        if self.step >= end:
            return self.history
        stream = batch_stream(self.ds, self.train_ids, batch=tc.batch, anchors=tc.anchors,
                              block=self.dcfg.num_draft_positions, seed=tc.seed,
                              start_step=self.step, anchor_mode=tc.anchor_mode,
                              weights=self.seq_weights, rows=self.local_rows)
        bar = None
        if self.progress and writes_logs():
            try:
                from tqdm import tqdm   # the `lab` extra; without it, no progress bar
                bar = tqdm(total=tc.steps, initial=self.step, desc="train", dynamic_ncols=True)
            except ImportError:
                pass
        last_ckpt = t_start = time.time()
        try:
            while self.step < end:
                batch = next(stream)
                t0 = time.time()
                m = self.train_step(batch)
                dt = time.time() - t0
                row = {"step": self.step, "loss": float(m["loss"]),
                       "base_loss": float(m["base_loss"]), "corr_loss": float(m["corr_loss"]),
                       "base_acc0": float(m["base_acc_d"][0]),
                       "base_acc_mean": float(np.mean(m["base_acc_d"])),
                       "corr_acc_mean": float(np.mean(m["corr_acc_d"])),
                       "tau_base": float(m["tau_base"]), "tau_corr": float(m["tau_corr"]),
                       "lam": float(m["lam"]), "lr": float(m["lr"]),
                       "grad_norm": float(m["grad_norm"]),
                       "tok_s": float(m["num_labels"]) / dt, "wall_s": time.time() - t_start}
                row["labels"] = float(m["num_labels"])
                self.history.append(row)
                self._append_csv(row)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{row['loss']:.3f}", base=f"{row['base_loss']:.3f}",
                                    acc0=f"{row['base_acc0']:.3f}",
                                    acc=f"{row['corr_acc_mean']:.3f}", lam=f"{row['lam']:.2f}",
                                    tok_s=f"{row['tok_s']:.0f}")
                now = time.time()
                ckpt_due, past_deadline = agreed(now - last_ckpt > tc.ckpt_every_s,
                                                 deadline is not None and now > deadline)
                if ckpt_due:
                    self.save()
                    if on_checkpoint is not None:
                        on_checkpoint(self)
                    last_ckpt = now
                if eval_fn is not None and eval_every and self.step % eval_every == 0:
                    self._eval_row(eval_fn)
                if past_deadline:
                    break
        finally:
            if bar is not None:
                bar.close()
        self.save()
        if on_checkpoint is not None:
            on_checkpoint(self)
        if eval_fn is not None and not (eval_every and self.step % eval_every == 0):
            self._eval_row(eval_fn)
        return self.history

    def _csv_labels(self) -> float:
        """Labels trained on before this ``fit`` (from the learning-curve CSV; 0 in a process
        that does not write it: its rows only go to process 0's logs)."""
        path = self._csv_path()
        if not path or not os.path.exists(path) or not writes_logs():
            return 0.0
        with open(path) as f:
            return sum(float(r.get("labels") or 0.0) for r in csv.DictReader(f)) - sum(
                h["labels"] for h in self.history)


def evaluate(dcfg: DrafterConfig, dparams, tcfg: TargetConfig, tparams, ds, seq_ids, *,
             anchors: int = 16, batch: int = 4, seed: int = 0,
             answer_frac: float = 0.85) -> dict:
    """Held-out per-depth accuracies of the base and corrected heads and offline chain τ."""
    K = dcfg.num_draft_positions
    tot = {"base_acc_d": np.zeros(K), "corr_acc_d": np.zeros(K), "base_loss": 0.0,
           "corr_loss": 0.0, "tau_base": 0.0, "tau_corr": 0.0}
    n = 0.0
    rng = np.random.default_rng(seed)
    seq_ids = list(seq_ids)
    for i in range(0, len(seq_ids) - batch + 1, batch):
        b = make_batch(ds, seq_ids[i:i + batch], anchors=anchors, block=K, rng=rng,
                       answer_frac=answer_frac)
        m = jax.device_get(_eval_step(dparams, tparams, jax.tree.map(jnp.asarray, b),
                                      dcfg=dcfg, tcfg=tcfg))
        for k in tot:
            tot[k] = tot[k] + np.asarray(m[k], np.float64)
        n += 1
    out = {k: (v / max(n, 1)).tolist() for k, v in tot.items()}
    out["num_seqs"] = int(n * batch)
    out["num_blocks"] = int(n * batch * anchors)
    return out
