"""The HLO reader of benchmarks/step/hlo_step_dots.py on a fixed optimised-HLO text."""

from benchmarks.step.hlo_step_dots import product_kinds, weight_upcasts

HLO = """\
%wrapped_convert_computation (param_0: bf16[576,1536]) -> f32[576,1536] {
  %param_0 = bf16[576,1536]{1,0} parameter(0)
  ROOT %convert.1 = f32[576,1536]{1,0} convert(%param_0)
}

%fused_computation (param_0.1: bf16[17,576], param_1: bf16[576,1536]) -> f32[17,1536] {
  %param_0.1 = bf16[17,576]{1,0} parameter(0)
  %param_1 = bf16[576,1536]{1,0} parameter(1)
  ROOT %dot.9 = f32[17,1536]{1,0} dot(%param_0.1, %param_1), lhs_contracting_dims={1}
}

ENTRY %main.1 (x.1: f32[1,576], w.1: bf16[576,1536], y.1: bf16[17,576]) -> f32[1,1536] {
  %x.1 = f32[1,576]{1,0} parameter(0)
  %w.1 = bf16[576,1536]{1,0} parameter(1)
  %y.1 = bf16[17,576]{1,0} parameter(2)
  %wrapped_convert = f32[576,1536]{1,0} fusion(%w.1), kind=kLoop, calls=%wrapped_convert_computation
  %dot.1 = f32[1,1536]{1,0} dot(%x.1, %wrapped_convert), lhs_contracting_dims={1}
  %ynn_fusion = f32[17,1536]{1,0} fusion(%y.1, %w.1), kind=kCustom, calls=%fused_computation, \
backend_config={"fusion_config":{"kind":"__ynn_fusion"}}
  ROOT %t = f32[1,1536]{1,0} add(%dot.1, %dot.1)
}
"""


def test_products_and_upcasts_are_read_from_scheduled_computations_only():
    kinds = product_kinds(HLO)
    # the dot inside the ynn fusion's body is not counted again; operand dtypes come from the
    # instructions that produce them
    assert kinds == {"dot: f32 x f32 -> f32": 1, "ynn: bf16 x bf16 -> f32": 1}
    assert weight_upcasts(HLO) == 1   # the wrapped convert in ENTRY, not the one in its body
    no_upcast = HLO.replace("f32[576,1536]{1,0} fusion", "bf16[576,1536]{1,0} fusion")
    assert weight_upcasts(no_upcast) == 0
