"""Timing helpers: the interleaved medians every benchmark uses, and the machine facts named
next to every timing (the CPU model, its bf16 matrix units)."""

import time

from dominotree_jax.measure.timing import bf16_units, cpu_model

EPYC = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n"
SAPPHIRE = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480C\n"
            "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n")


def test_cpu_model_reads_the_model_name_line():
    assert cpu_model(EPYC) == "AMD EPYC"
    assert cpu_model(SAPPHIRE) == "Intel(R) Xeon(R) Platinum 8480C"


def test_cpu_model_without_a_model_name_falls_back_to_a_nonempty_name():
    assert cpu_model("processor\t: 0\n")
    assert cpu_model()   # this machine


def test_bf16_units_names_the_flags_it_finds():
    assert bf16_units(SAPPHIRE) == "amx_bf16, avx512_bf16"
    assert bf16_units(EPYC) == "none (no amx_bf16, no avx512_bf16)"
    # a flag name inside another word does not count
    assert bf16_units("flags\t: xamx_bf16y\n").startswith("none")


def test_interleaved_medians_gives_no_function_a_fixed_predecessor():
    """A call that is slow only right after one other function (a cache evicted, a clock
    ramped) must not set its median: with one fixed order, ``a`` always followed ``f``."""
    from dominotree_jax.measure.timing import interleaved_medians

    last = [None]

    def make(name):
        def fn():
            if name == "a" and last[0] == "f":
                time.sleep(0.02)
            last[0] = name
        return fn

    fns = {n: make(n) for n in "abcdef"}
    med = interleaved_medians(fns, repeats=31, warmup=1)
    assert set(med) == set(fns)
    assert med["a"] < 5.0, med
