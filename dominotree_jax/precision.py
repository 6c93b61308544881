"""The precision policy (docs/precision.md), in one place.

A *precision* names the dtype the weights are stored in; everything else follows from it:

- **weights** (target, drafter, Domino head) in the precision's dtype;
- **matrix products**: operands in the weights' dtype, accumulated and returned in float32
  (``product``: the activation is cast to the weight's dtype at the product's input only), and
  so are the products of their gradients (training in bf16);
- **float32 everywhere else**: the residual stream, RMSNorm, RoPE, softmax, logits, sampling,
  tree scores and the GRU state (``ACTIVATION_DTYPE``);
- **KV caches** (target and drafter context) stored in the weights' dtype (half the memory in
  bf16); the attention products read them with float32 accumulation.

With ``float32`` every step is the float32 computation the engine always ran (bit for bit).

Pairings (``check_pair``): a drafter runs in the target's precision, or in ``bfloat16`` under a
``float32`` target -- the *exact* mode: bf16 drafting, float32 verification, so every method
stays token-identical to float32 ``ar`` at T=0. A drafter more precise than its target buys
nothing and is refused, as is any mix of the two 16-bit formats.

``Precision`` is the one typed value for all of it: chosen at load (``load_target`` /
``load_pair``), carried by ``Target.precision`` and ``Pair.precision`` into
``DecodeConfig.precision`` (``decode`` refuses parameters held in another), read by the trainer
(``TrainConfig.precision``), ``calibrate`` and the rollout engine. Every command line takes it
through ``add_precision_argument`` (``--precision``, alias ``--dtype``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools

import jax
import jax.numpy as jnp

PRECISIONS = ("float32", "bfloat16", "float16")
# the precisions the engine's benchmarks time (measure/product_timing; `benchmarks step
# slot_step` @ 77bcb80): float16 runs under the policy, but no machine we measure on has a reason to
# prefer it to bfloat16
BENCHMARKED_PRECISIONS = ("float32", "bfloat16")
ACTIVATION_DTYPE = jnp.float32   # residual stream, norms, RoPE, softmax, logits, GRU state
ACCUMULATION_DTYPE = jnp.float32  # every matrix product accumulates and returns float32
# (target, drafter) precisions a pair may hold
PAIRINGS = frozenset({("float32", "float32"), ("bfloat16", "bfloat16"), ("float16", "float16"),
                      ("float32", "bfloat16")})
PAIR_SEPARATOR = "+"   # "float32+bfloat16": a target+drafter precision as text


class PrecisionError(ValueError):
    """An unknown precision, or a target/drafter pairing the policy cannot run."""


def precision_name(dtype, what: str = "dtype") -> str:
    """The canonical name (``"float32"``, ``"bfloat16"``, ``"float16"``) of a dtype, a name or
    a one-model ``Precision``; anything else (a target+drafter ``Precision`` included) is
    refused naming it and the supported ones."""
    if isinstance(dtype, str) and PAIR_SEPARATOR in dtype:   # "target+drafter" text
        dtype = Precision.of(dtype)
    if isinstance(dtype, Precision):
        if dtype.mixed:
            raise PrecisionError(f"{what} {str(dtype)!r} names two precisions (target+drafter); "
                                 f"one is needed here: {', '.join(PRECISIONS)}")
        return dtype.target
    try:
        name = jnp.dtype(dtype).name
    except TypeError:
        name = None
    if name not in PRECISIONS:
        raise PrecisionError(f"unknown {what} {dtype!r}; supported precisions: "
                             f"{', '.join(PRECISIONS)}")
    return name


def params_precision(params, what: str = "parameters") -> str:
    """The precision of a parameter pytree (all floating leaves must share one dtype)."""
    names = {jnp.dtype(x.dtype).name for x in jax.tree.leaves(params)
             if jnp.issubdtype(x.dtype, jnp.floating)}
    if not names:
        return "float32"
    if len(names) > 1:
        raise PrecisionError(f"{what} mix dtypes {sorted(names)}; one precision per model")
    return precision_name(names.pop(), f"{what} dtype")


def check_pair(target_dtype, drafter_dtype) -> tuple[str, str]:
    """``(target, drafter)`` precision names, or ``PrecisionError`` naming both."""
    t = precision_name(target_dtype, "target dtype")
    d = precision_name(drafter_dtype, "drafter dtype")
    if (t, d) not in PAIRINGS:
        allowed = ", ".join(f"{a}+{b}" for a, b in sorted(PAIRINGS))
        raise PrecisionError(f"a {d} drafter cannot be paired with a {t} target (the drafter "
                             f"runs in the target's precision, or in bfloat16 under a float32 "
                             f"target); supported target+drafter pairs: {allowed}")
    return t, d


@dataclasses.dataclass(frozen=True)
class Precision:
    """The precision of a model or a target+drafter pair: the one typed value that load,
    decode, calibration, the trainer, the rollout engine and every command line read.

    ``target``: the target's weights' precision; ``drafter``: the drafter's (``None``: the
    target's). Both are canonical names (``precision_name``) once built, and a pairing the
    policy cannot run (``check_pair``) cannot be built at all. Frozen and hashable, so it is a
    static jit argument (``DecodeConfig.precision``). ``str`` gives the text ``Precision.of``
    parses back: ``"bfloat16"``, or ``"float32+bfloat16"`` for the exact mode."""

    target: str = "float32"
    drafter: str | None = None

    def __post_init__(self):
        drafter = self.target if self.drafter is None else self.drafter
        target, drafter = check_pair(self.target, drafter)
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "drafter", drafter)

    @classmethod
    def of(cls, value=None) -> "Precision":
        """``value`` as a ``Precision``: a ``Precision`` (itself), a name or dtype (target and
        drafter alike), a ``"target+drafter"`` text (``"float32+bfloat16"``); ``None`` gives
        the default (float32). Unknown names and impossible pairings are refused by name."""
        if value is None:
            return cls()
        if isinstance(value, Precision):
            return value
        if isinstance(value, str):
            target, sep, drafter = value.strip().partition(PAIR_SEPARATOR)
            return cls(target.strip(), drafter.strip() if sep else None)
        return cls(value)

    @classmethod
    def of_params(cls, target_params, drafter_params=None) -> "Precision":
        """The precision parameter pytrees are held in (``params_precision`` of each; no
        drafter: the target's), refused by name when the two cannot be paired."""
        target = params_precision(target_params, "target parameters")
        drafter = (None if drafter_params is None
                   else params_precision(drafter_params, "drafter parameters"))
        return cls(target, drafter)

    @property
    def target_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.target)

    @property
    def drafter_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.drafter)

    @property
    def mixed(self) -> bool:
        """Whether target and drafter are held in different precisions."""
        return self.target != self.drafter

    @property
    def exact(self) -> bool:
        """The exact mode: a 16-bit drafter under a float32 target (float32 verification, so
        every method stays token-identical to float32 ``ar`` at T=0)."""
        return self.target == "float32" and self.drafter != "float32"

    @property
    def only_target(self) -> "Precision":
        """The target's precision alone (drafter = target), e.g. for ``load_target``."""
        return Precision(self.target)

    def narrowed(self, target_params, drafter_params=None):
        """``(target, drafter)`` parameters as this precision holds them: a model held in
        float32 (a trainer's master copy) cast down to a 16-bit precision asked for, any other
        model unchanged (``check_params`` refuses what still differs: a cast up would claim
        bits the weights do not have)."""
        def held(params, want):
            if params is None or want == "float32" or \
                    params_precision(params, "parameters") != "float32":
                return params
            return cast_params(params, want)
        return held(target_params, self.target), held(drafter_params, self.drafter)

    def check_params(self, target_params, drafter_params=None, what: str = "precision"):
        """Refuse, naming both, parameters whose dtypes are not this precision's (target, and
        drafter when given)."""
        checks = [("target", target_params, self.target)]
        if drafter_params is not None:
            checks.append(("drafter", drafter_params, self.drafter))
        for name, params, want in checks:
            got = params_precision(params, f"{name} parameters")
            if got != want:
                raise PrecisionError(f"the {name} parameters are {got} but the {what} is "
                                     f"{self}: cast them (precision.cast_params) or ask for "
                                     f"the precision they are held in")

    def __str__(self) -> str:
        return self.target if not self.mixed else f"{self.target}{PAIR_SEPARATOR}{self.drafter}"


def product(x: jax.Array, w: jax.Array, precision=None, operand_dtype=None) -> jax.Array:
    """``x @ w.T`` (``x [..., in]``, ``w [out, in]``) under the policy: operands in ``w``'s
    dtype, float32 accumulation and output.

    A float32 weight runs the plain float32 product (unchanged from the float32 engine).
    ``operand_dtype`` (a 16-bit precision, with a float32 ``w``): ``w`` is the float32 view of
    weights held in that precision (``float32_view``); ``x`` is rounded to it first, then the
    float32 product runs -- what XLA:CPU makes of the 16-bit product itself."""
    dims = (((x.ndim - 1,), (1,)), ((), ()))
    if operand_dtype is not None and jnp.dtype(operand_dtype) != w.dtype:
        if w.dtype != jnp.float32:
            raise PrecisionError(f"operand_dtype {operand_dtype!r} needs the float32 view of "
                                 f"the weights, got a {w.dtype} weight")
        x = x.astype(operand_dtype).astype(jnp.float32)
        return jax.lax.dot_general(x, w, dims, precision=precision)
    if w.dtype == jnp.float32:
        return jax.lax.dot_general(x.astype(jnp.float32), w, dims, precision=precision)
    return _product_16bit(x, w, precision)


# One-row 16-bit products on CPU run as two rows (the second zeros, dropped): XLA:CPU has no
# fast one-row 16-bit kernel (SmolLM2's 30 layers of products: bf16 30.7 ms for one row, 9.3 ms
# for two, float32 8.7 ms for one; AMD EPYC Zen 5, 2026-12-05), while its many-row bf16 kernel
# reads half float32's bytes (four rows: 10.2 against float32's 19.6 ms).
PAD_ONE_ROW_16BIT = True


def _dot_16bit(x, w, precision):
    dims = (((x.ndim - 1,), (1,)), ((), ()))
    x16 = x.astype(w.dtype)
    if PAD_ONE_ROW_16BIT and x.size == x.shape[-1] and jax.default_backend() == "cpu":
        two = jnp.concatenate([x16.reshape(1, -1), jnp.zeros_like(x16.reshape(1, -1))])
        y = jax.lax.dot_general(two, w, (((1,), (1,)), ((), ())), precision=precision,
                                preferred_element_type=ACCUMULATION_DTYPE)
        return y[:1].reshape(*x.shape[:-1], w.shape[0])
    return jax.lax.dot_general(x16, w, dims, precision=precision,
                               preferred_element_type=ACCUMULATION_DTYPE)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _product_16bit(x, w, precision):
    """``product`` on 16-bit weights. Its gradient products also take 16-bit operands (the
    float32 cotangent rounded to ``w``'s dtype) with float32 accumulation: left to autodiff,
    the transposed products mix a float32 cotangent with a 16-bit operand, which XLA runs as
    float32 products on upcast copies (the backward of the trainer's LM head, 2/3 of its
    products, ran so under ``--dtype bfloat16``)."""
    return _dot_16bit(x, w, precision)


def _product_16bit_fwd(x, w, precision):
    # residuals are arrays: an empty one carries x's dtype for its cotangent
    return _dot_16bit(x, w, precision), (x.astype(w.dtype), w, jnp.zeros((0,), x.dtype))


def _product_16bit_bwd(precision, res, g):
    x16, w, x_dtype = res
    g16 = g.astype(w.dtype)
    dx = jax.lax.dot_general(g16, w, (((g.ndim - 1,), (0,)), ((), ())), precision=precision,
                             preferred_element_type=ACCUMULATION_DTYPE)
    batch_axes = tuple(range(g.ndim - 1))
    dw = jax.lax.dot_general(g16, x16, ((batch_axes, batch_axes), ((), ())),
                             precision=precision, preferred_element_type=ACCUMULATION_DTYPE)
    return dx.astype(x_dtype.dtype), dw.astype(w.dtype)


_product_16bit.defvjp(_product_16bit_fwd, _product_16bit_bwd)


def cast_params(tree, precision):
    """``tree`` with its floating leaves in ``precision``'s dtype (other leaves unchanged);
    differentiable, so a float32 master copy can train through a bf16 forward."""
    dt = jnp.dtype(precision_name(precision))
    return jax.tree.map(lambda x: x.astype(dt) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                        tree)


def uses_float32_view(precision, backend: str, batch: int = 1) -> bool:
    """Whether ``budget="auto"``'s plain step and the Domino head on ``precision`` weights read
    their float32 view, made once per ``decode`` call before its loop, when the policy may
    draft over ``batch`` rows.

    On CPU, for the 16-bit precisions at batch 1: the plain step's one-row products run as
    float32 GEMVs on the view, ~7 % faster than the padded 16-bit ones (``PAD_ONE_ROW_16BIT``),
    and XLA hoists no convert out of the auto round's ``lax.switch`` branch or draft ``cond``
    (a 16-bit weight read by a float32 product there, the head's embedding rows, was upcast
    every round): bf16 DominoTree ``auto`` 0.94x float32 ``ar`` with the view, 0.86x without
    (``methods auto_view`` @
    b738145, Zen 5). At a larger batch the plain step has as many rows, and the
    16-bit many-row product is the fast one: at batch 4 (T 0.9) bf16 DominoTree ``auto`` ran
    0.60x float32 ``ar`` over the view and 1.23x without it. A ``lookup`` auto decode never
    drafts and makes no view. Elsewhere (GPU, TPU) the 16-bit product is the fast,
    bandwidth-bound one: no view."""
    return precision_name(precision) != "float32" and backend == "cpu" and batch == 1


def bind_view_if_needed(bind_view, cfg, params, what: str, batch: int = 1):
    """``bind_view(cfg, params)`` (a model over the float32 view of ``params``, e.g.
    ``model.target.bind_float32_view``) where the plain steps of ``batch`` rows on ``params``
    run on that view on this backend (``uses_float32_view``), else ``None``. ``what`` names the
    parameters in the error for an unknown precision."""
    if not uses_float32_view(params_precision(params, what), jax.default_backend(), batch):
        return None
    return bind_view(cfg, params)


def float32_view(tree):
    """``tree`` with its floating leaves upcast to float32: exact (bf16 and f16 values are
    float32 values), for products that take ``operand_dtype`` = the original precision."""
    return cast_params(tree, "float32")


def to_activation(x: jax.Array) -> jax.Array:
    """``x`` in the activation dtype (float32)."""
    return x.astype(ACTIVATION_DTYPE)


# ---------------------------------------------------------------------------- command lines

AUTO = "auto"   # a command line's "choose for me" (calibrate: the faster precision here)


def precision_choices(*, pairs: bool = True, auto: bool = False) -> tuple[str, ...]:
    """The texts a precision argument accepts: every precision, the target+drafter pairings
    that mix two (``pairs``), and ``"auto"`` (``auto``)."""
    mixed = tuple(str(Precision(t, d)) for t, d in sorted(PAIRINGS) if t != d)
    return PRECISIONS + (mixed if pairs else ()) + ((AUTO,) if auto else ())


def parse_precision(text: str, *, pairs: bool = True, auto: bool = False,
                    choices=None) -> Precision | None:
    """A command line's precision text as a ``Precision`` (``"auto"`` -> ``None`` where
    ``auto``); anything else is an ``argparse.ArgumentTypeError`` naming the choices.
    ``choices``: only these texts (a subset of ``precision_choices``, e.g.
    ``BENCHMARKED_PRECISIONS``)."""
    choices = tuple(choices) if choices is not None else precision_choices(pairs=pairs,
                                                                           auto=auto)
    refused = f"invalid precision {text!r}; choose one of: {', '.join(choices)}"
    if auto and text.strip() == AUTO:
        return None
    try:
        for name in text.split(PAIR_SEPARATOR):
            precision_name(name.strip())
    except PrecisionError:
        raise argparse.ArgumentTypeError(refused) from None
    try:
        value = Precision.of(text)
    except PrecisionError as e:   # a pairing the policy cannot run: say why
        raise argparse.ArgumentTypeError(f"{refused} ({e})") from None
    if value.mixed and not pairs:
        raise argparse.ArgumentTypeError(f"{refused} (this command runs one model)")
    if str(value) not in choices:
        raise argparse.ArgumentTypeError(refused)
    return value


def parse_precisions(text: str, *, pairs: bool = True, choices=None) -> tuple[Precision, ...]:
    """A comma-separated list of distinct precisions (``"float32,bfloat16"``)."""
    values = tuple(parse_precision(t, pairs=pairs, choices=choices)
                   for t in text.split(",") if t.strip())
    if not values or len(set(values)) != len(values):
        named = choices if choices is not None else precision_choices(pairs=pairs)
        raise argparse.ArgumentTypeError(f"invalid precisions {text!r}: give distinct names "
                                         f"among {', '.join(named)}")
    return values


def add_precision_argument(parser, flag: str = "--precision", *, aliases=("--dtype",),
                           default="float32", pairs: bool = True, auto: bool = False,
                           many: bool = False, choices=None, help: str = "", **kw):
    """Add the one precision option every command line takes: ``flag`` (and ``aliases``,
    ``--dtype`` by default, the older spelling), parsed to a ``Precision`` (``many``: a
    comma-separated tuple of distinct ones), refused by argparse naming the choices.
    ``pairs``: a ``"target+drafter"`` text is accepted (commands that load a pair); ``auto``:
    ``"auto"`` is accepted and parses to ``None`` (so does ``default="auto"``); ``choices``:
    only these texts (``BENCHMARKED_PRECISIONS``). Other keywords go to
    ``parser.add_argument`` (``dest``, ``nargs``, ...)."""
    if choices is None:
        choices = precision_choices(pairs=pairs, auto=auto)
    one = functools.partial(parse_precision, pairs=pairs, auto=auto, choices=choices)

    def parse(text):
        return parse_precisions(text, pairs=pairs, choices=choices) if many else one(text)

    parse.__name__ = "precision"   # argparse names the type in some of its errors
    if auto and default == AUTO:
        default = None
    elif isinstance(default, str):
        default = parse(default)
    elif isinstance(default, (list, tuple)):   # many=True or nargs: one Precision per item
        default = type(default)(one(d) if isinstance(d, str) else d for d in default)
    shown = AUTO if default is None and auto else (
        ",".join(map(str, default)) if isinstance(default, (tuple, list)) else default)
    text = f"{help}; " if help else ""
    return parser.add_argument(
        flag, *aliases, type=parse, default=default, metavar="PRECISION",
        help=f"{text}one of {', '.join(choices)} (default: {shown}; docs/precision.md)", **kw)
