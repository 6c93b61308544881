"""``benchmarks round inside``: a real decode's profiled operations are attributed to the
round's stages (``decoding/stages.py`` named scopes), including the metadata-less ones
XLA:CPU makes late."""

from __future__ import annotations

import dominotree_jax as dj
from benchmarks.hlo_text import instruction_stages
from benchmarks.round.inside import profile_method
from spec_fixtures import tiny_pair

STAGES = ("stage_draft", "stage_verify")


def test_a_dominotree_round_is_split_into_its_stages():
    tcfg, dcfg, params = tiny_pair()
    pair = dj.Pair(dj.Target(tcfg, params["target"]), dcfg, params["drafter"])
    per_round, wall, tau = profile_method(pair, "dominotree", [[3, 9, 17, 4, 22]], tokens=12,
                                          budget=6)
    for stage in ("draft", "tree", "verify", "accept"):
        assert per_round.get(stage, 0.0) > 0, per_round
    assert "prefill" not in per_round and wall > 0 and tau >= 1
    ar, _, ar_tau = profile_method(pair, "ar", [[3, 9, 17, 4, 22]], tokens=12, budget=6)
    assert ar.get("draft", 0.0) == 0 and ar.get("tree", 0.0) == 0 and ar["verify"] > 0
    assert 1.0 <= ar_tau < 1.2   # one token a step (the first comes with the prefill)


def test_metadata_less_instructions_take_a_neighbour_stage():
    hlo = "\n".join([
        '  %a = f32[4]{0} parameter(0)',
        '  %ynn_fusion.1 = f32[4]{0} fusion(%a), kind=kCustom, calls=%c.1',
        '  %b = f32[4]{0} exponential(%ynn_fusion.1), metadata={op_name="jit(f)/stage_verify/exp"}',
        '  %w = (f32[4]{0}) while(%t), condition=%c, body=%d',
        '  %c = f32[4]{0} add(%b, %b), metadata={op_name="jit(f)/add"}'])
    names = instruction_stages(hlo, STAGES)
    assert names["ynn_fusion.1"] == "verify" and names["b"] == "verify"
    assert names["w"] is None and names["c"] == "verify"   # a container; reads b
    assert names["a"] == "other"        # a parameter: no staged operand, its user has none
