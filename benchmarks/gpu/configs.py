"""The pairs the GPU suite measures (real sizes, and tiny ones with every structural feature for
the CPU tests), the published figures it compares with, and the devices' peak bandwidths."""

from __future__ import annotations

import dataclasses

from dominotree_jax.config import (DrafterConfig, LinearAttentionShape, MoeShape, TargetConfig,
                                   default_tap_layers)

METHODS = ("dflash", "domino", "ddtree", "dominotree")
TOP_M, NODE_TOPK, BUDGET = 64, 8, 16  # the drafting settings every round uses


@dataclasses.dataclass(frozen=True)
class Published:
    """One method's published figures for one target (temperature 0, one GPU)."""
    tau: float            # mean acceptance length over eight benchmarks
    round_per_ar: float   # the paper-implied round cost in AR steps: tau / speedup

    @property
    def speedup(self) -> float:
        return self.tau / self.round_per_ar


# Published reference per target (docs/algorithm.md §7; the implied round / AR step of issue 24:
# tau / speedup). Only Qwen3-4B figures are known to this repository: other targets show "–".
PUBLISHED = {
    "Qwen3-4B": {"dflash": Published(6.25, 1.52), "domino": Published(7.17, 1.62),
                 "ddtree": Published(7.03, 1.56), "dominotree": Published(7.98, 1.66)},
}
PAPER_ROUND = {"build": 3.67, "round": 26.54, "speedup": 4.81}  # DominoTree, Qwen3-4B, ms

# Peak memory bandwidth (bytes/s) by device kind (first matching substring): the AR step's
# achieved share. Vendor figures; ``--peak-gbps`` overrides.
PEAK_BANDWIDTH = (("H200", 4.8e12), ("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12),
                  ("H100", 3.35e12), ("GH200", 4.0e12), ("A100-SXM4-80GB", 2.039e12),
                  ("A100 80GB PCIe", 1.935e12), ("A100", 1.555e12), ("L40S", 0.864e12),
                  ("L4", 0.3e12), ("A10G", 0.6e12), ("T4", 0.32e12))


def peak_bandwidth(device_kind: str) -> float | None:
    """The vendor's peak memory bandwidth (bytes/s) of a known device kind, else None."""
    for name, bandwidth in PEAK_BANDWIDTH:
        if name.lower() in device_kind.lower():
            return bandwidth
    return None


def qwen3_target(hidden, layers, heads, kv_heads, head_dim, intermediate, vocab, tied):
    return TargetConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, rms_norm_eps=1e-6, rope_theta=1_000_000.0, tie_word_embeddings=tied,
        qk_norm=True, attention_bias=False, max_position_embeddings=40960,
        architecture="Qwen3ForCausalLM")


def qwen3_5_target(hidden, layers, heads, kv_heads, head_dim, intermediate, vocab, tied,
                   linear: LinearAttentionShape):
    """A Qwen3.5 hybrid: three Gated DeltaNet layers, then a gated full-attention one."""
    return TargetConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, rms_norm_eps=1e-6, rope_theta=10_000_000.0, tie_word_embeddings=tied,
        qk_norm=True, max_position_embeddings=262144, architecture="Qwen3_5ForCausalLM",
        layer_types=tuple("full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                          for i in range(layers)),
        linear_attention=linear, attn_output_gate=True, partial_rotary_factor=0.25,
        norm_offset=1.0)


def qwen3_moe_target(hidden, layers, heads, kv_heads, head_dim, vocab, moe: MoeShape):
    return TargetConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=moe.intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, rms_norm_eps=1e-6, rope_theta=10_000_000.0, qk_norm=True,
        max_position_embeddings=262144, architecture="Qwen3MoeForCausalLM", moe=moe)


def dflash_drafter(target: TargetConfig, *, layers, block, taps, mask_id, domino=False,
                   gru_hidden=1024, emb_dim=256, heads=None):
    """A DFlash drafter for ``target`` (its hidden/head sizes, or ``heads`` = (query heads,
    kv heads, head dim) of its own); ``domino`` adds the Domino head."""
    extra = (dict(projector_type="domino", gru_hidden_dim=gru_hidden, emb_dim=emb_dim,
                  pure_draft_prefix_len=1) if domino else {})
    q, kv, d = heads or (target.num_attention_heads, target.num_key_value_heads,
                         target.head_dim)
    return DrafterConfig(
        vocab_size=target.vocab_size, hidden_size=target.hidden_size,
        intermediate_size=target.intermediate_size, num_hidden_layers=layers,
        num_attention_heads=q, num_key_value_heads=kv, head_dim=d,
        block_size=block, mask_token_id=mask_id, num_target_layers=target.num_hidden_layers,
        target_layer_ids=tuple(taps), rms_norm_eps=1e-6, rope_theta=1_000_000.0, **extra)


@dataclasses.dataclass(frozen=True)
class PairSpec:
    name: str            # table title
    target: TargetConfig
    drafter: DrafterConfig
    methods: tuple[str, ...]
    kernel_head: tuple[int, int] = (1024, 256)  # (G, E) of the kernel check without a Domino head
    published: str | None = None  # key into PUBLISHED: the target's own published figures


ALL_DOMINO = ("dflash", "domino", "ddtree", "dominotree")


def real_pairs() -> dict[str, PairSpec]:
    qwen3_4b = qwen3_target(2560, 36, 32, 8, 128, 9728, 151936, tied=True)
    qwen3_8b = qwen3_target(4096, 36, 32, 8, 128, 12288, 151936, tied=False)
    b16 = dict(layers=5, block=16, taps=(1, 9, 17, 25, 33), mask_id=151669)
    return {
        "qwen3-4b-domino": PairSpec("Qwen3-4B + Domino-b16", qwen3_4b,
                                    dflash_drafter(qwen3_4b, **b16, domino=True), ALL_DOMINO,
                                    published="Qwen3-4B"),
        "qwen3-8b-domino": PairSpec("Qwen3-8B + Domino-b16", qwen3_8b,
                                    dflash_drafter(qwen3_8b, **b16, domino=True), ALL_DOMINO),
        "qwen3-4b-dflash": PairSpec("Qwen3-4B + DFlash-b16", qwen3_4b,
                                    dflash_drafter(qwen3_4b, **b16), ("dflash", "ddtree"),
                                    published="Qwen3-4B"),
        **today_pairs(tiny=False),
    }


def today_pairs(tiny: bool) -> dict[str, PairSpec]:
    """Qwen3.5-4B (Gated DeltaNet hybrid) and Qwen3-Coder-30B-A3B (128 experts, top 8), each
    with a 5-layer DFlash-b16 drafter at its width (the drafters' own head shapes and mask id
    as we read the released configs; random weights: speed, not acceptance)."""
    if tiny:
        q35 = qwen3_5_target(64, 4, 4, 2, 16, 128, 512, True, LinearAttentionShape(
            4, 2, 4, 8, 8))
        coder = qwen3_moe_target(64, 3, 4, 2, 16, 512, MoeShape(8, 2, 32, (0, 1, 2)))
        b16 = dict(layers=1, block=16, mask_id=511, heads=(4, 2, 16))
    else:
        q35 = qwen3_5_target(2560, 32, 16, 4, 256, 9216, 248320, True, LinearAttentionShape(
            4, 16, 32, 128, 128))
        coder = qwen3_moe_target(2048, 48, 32, 4, 128, 151936,
                                 MoeShape(128, 8, 768, tuple(range(48))))
        b16 = dict(layers=5, block=16, mask_id=151669, heads=(32, 8, 128))
    q35_drafter = dflash_drafter(q35, **{**b16, "mask_id": min(b16["mask_id"],
                                                                q35.vocab_size - 1)},
                                 taps=default_tap_layers(q35.num_hidden_layers, b16["layers"]))
    coder_drafter = dflash_drafter(
        coder.__class__(**{**coder.__dict__, "intermediate_size": 6144 if not tiny else 128}),
        **b16, taps=default_tap_layers(coder.num_hidden_layers, b16["layers"]))
    prefix = "tiny " if tiny else ""
    return {
        "qwen3.5-4b-dflash": PairSpec(f"{prefix}Qwen3.5-4B + DFlash-b16", q35, q35_drafter,
                                      ("dflash", "ddtree")),
        "qwen3-coder-30b-a3b-dflash": PairSpec(f"{prefix}Qwen3-Coder-30B-A3B + DFlash-b16",
                                               coder, coder_drafter, ("dflash", "ddtree")),
    }


def tiny_pairs() -> dict[str, PairSpec]:
    """The same pairs, shrunk (every structural feature kept: tied/untied head, 5 taps, block
    16, a Domino head) so that the suite runs on a CPU in a minute or two."""
    tiny_4b = qwen3_target(64, 5, 4, 2, 16, 128, 512, tied=True)
    tiny_8b = qwen3_target(64, 5, 4, 2, 16, 192, 512, tied=False)
    b16 = dict(layers=1, block=16, taps=(0, 1, 2, 3, 4), mask_id=511)
    head = dict(domino=True, gru_hidden=32, emb_dim=24)
    return {
        "qwen3-4b-domino": PairSpec("tiny Qwen3-4B-like + Domino-b16", tiny_4b,
                                    dflash_drafter(tiny_4b, **b16, **head), ALL_DOMINO,
                                    published="Qwen3-4B"),
        "qwen3-8b-domino": PairSpec("tiny Qwen3-8B-like + Domino-b16", tiny_8b,
                                    dflash_drafter(tiny_8b, **b16, **head), ALL_DOMINO),
        "qwen3-4b-dflash": PairSpec("tiny Qwen3-4B-like + DFlash-b16", tiny_4b,
                                    dflash_drafter(tiny_4b, **b16), ("dflash", "ddtree"),
                                    kernel_head=(32, 24), published="Qwen3-4B"),
        **today_pairs(tiny=True),
    }


DEFAULT_PAIRS = "qwen3-4b-domino,qwen3-8b-domino"


def add_pair_arguments(ap, default_out) -> None:
    """The profiles' shared options: ``--pair``, ``--context``, ``--tiny``, ``--out``."""
    ap.add_argument("--pair", default="qwen3-4b-domino")
    ap.add_argument("--context", type=int, default=None, help="committed slots (512; tiny 32)")
    ap.add_argument("--tiny", action="store_true", help="the tiny pairs, on any backend")
    ap.add_argument("--out", default=str(default_out))


def chosen_pair(ap, args) -> tuple[PairSpec, int]:
    """``(spec, context)`` of ``add_pair_arguments``' options; an error (``ap.error``) for an
    unknown pair or real sizes without a GPU."""
    import jax
    pairs = tiny_pairs() if args.tiny else real_pairs()
    if args.pair not in pairs:
        ap.error(f"--pair must be one of {sorted(pairs)}")
    if not (args.tiny or jax.default_backend() == "gpu"):
        ap.error(f"real sizes need a GPU (backend is {jax.default_backend()!r}); use --tiny")
    return pairs[args.pair], args.context or (32 if args.tiny else 512)
