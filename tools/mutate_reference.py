"""Show that the reference suites can fail: apply one small bug at a time to a scratch copy of the
repository and run the suites there; every mutant must be caught (some test fails).

    .venv/bin/python tools/mutate_reference.py            # all mutants, about 5 minutes on 2 cores
    .venv/bin/python tools/mutate_reference.py log2_pitfall

Each mutant is (file, exact text, replacement, what it models[, the tests that catch it, run first]). The
optional last field only saves time (make test runs every mutant): those tests run alone first, and only if
they do not catch it does the whole suite list run. Exit status 1 if any survives.
Not a mutant: RCEIL computed as amax / max instead of amax * fl(1/max) is equivalent for every MX
element format (fl(1/max) * max rounds to exactly 1.0 in fp32 for 6, 7.5, 28, 448 and 57344, and a
search of 64 fp32 neighbours either side of max * 2^k found no amax where the two disagree).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MUTANTS = {
    "value_table_entry": (
        "reference/formats.py",
        "        v = unit * torch.pow(2.0, exp.double())\n",
        "        v = unit * torch.pow(2.0, exp.double())\n        if self.name == 'e2m1':\n            v[3] = 1.75\n",
        "one entry of the E2M1 value table wrong (1.5 -> 1.75)",
        "suites/test_formats_oracle.py::test_every_code_decodes_like_ml_dtypes[e2m1]",
    ),
    "subnormal_grid": (
        "reference/formats.py",
        "clamp_(_exp_field(emin), _exp_field(fmt.emax + 1))",
        "clamp_(_exp_field(emin + 1), _exp_field(fmt.emax + 1))",
        "rounding rule: subnormals rounded on a grid twice too coarse",
        "suites/test_corner_cases.py::test_corner_case_bytes[e2m1_ties]",
    ),
    "ties_away": (
        "reference/formats.py",
        "    rounded = (y + c).sub_(c)\n",
        "    rounded = torch.floor(y / (c * 2.0**-23) + 0.5) * (c * 2.0**-23)\n",
        "rounding rule: ties away from zero instead of to even (microxcaling's default)",
        "suites/test_corner_cases.py::test_corner_case_bytes[e2m1_ties]",
    ),
    "log2_pitfall": (
        "reference/mx.py",
        "    e = floor_log2(amax)\n",
        "    e = torch.where(amax > 0, torch.floor(torch.log2(amax)), torch.full_like(amax, -150.0)).int()\n",
        "MX shared exponent from floor(torch.log2(amax)) in fp32",
        "suites/test_corner_cases.py::test_corner_case_bytes[mx_e2m1_log2_pitfall]",
    ),
    "nibble_order": (
        "reference/packing.py",
        "    return codes[..., 0::2] | (codes[..., 1::2] << 4)\n",
        "    return codes[..., 1::2] | (codes[..., 0::2] << 4)\n",
        "FP4 nibble order swapped when packing",
        "suites/test_corner_cases.py::test_corner_case_bytes[nvfp4_block_at_tensor_amax]",
    ),
    "rceil_floor": (
        "reference/mx.py",
        "        shared = floor_log2(d) + (not_pow2 & (d > 0)).int()\n",
        "        shared = floor_log2(d)\n",
        "RCEIL rounds the scale down instead of up",
        "suites/test_corner_cases.py::test_corner_case_bytes[mx_e2m1_rceil]",
    ),
    "even_without_carry": (
        "reference/mx.py",
        "        shared = e + carry.int() - elem.emax\n",
        "        shared = e - elem.emax\n",
        "EVEN mode ignores the carry of rounding amax to the element's mantissa (EVEN == FLOOR)",
        "suites/test_corner_cases.py::test_corner_case_bytes[mx_e2m1_even_carries]",
    ),
    "ceil_is_floor_plus_one": (
        "reference/mx.py",
        "        shared = e + (not_pow2 & (amax > 0)).int() - elem.emax\n",
        "        shared = e + 1 - elem.emax\n",
        "CEIL as floor + 1, wrong for amax a power of two",
        "suites/test_corner_cases.py::test_corner_case_bytes[mx_e2m1_ceil_power_of_two]",
    ),
    "nvfp4_global_direction": (
        "reference/nvfp4.py",
        "    denom = decode(stored, E4M3FN) * s_dec_b if s_enc_b is None",
        "    denom = decode(stored, E4M3FN) / s_dec_b if s_enc_b is None",
        "NVFP4 element scale divides by the decode scale (wrong direction)",
        "suites/test_corner_cases.py::test_corner_case_bytes[nvfp4_block_at_tensor_amax]",
    ),
    "saturate_to_nan": (
        "reference/formats.py",
        "        code_mag.clamp_max_(fmt.max_code)\n",
        "        code_mag.clamp_max_(fmt.max_code + 1)\n",
        "saturation one code too high (E4M3FN would saturate into NaN)",
        "suites/test_corner_cases.py::test_corner_case_bytes[e2m1_above_tie_and_saturation]",
    ),
    "fp8_no_min_scale": (
        "reference/fp8.py",
        "    return torch.clamp_min(true_divide(amax, fmax), 1.0 / (fmax * _MIN_SCALE_DIVISOR))\n",
        "    return true_divide(amax, fmax)\n",
        "FP8 dynamic scale without the lower guard (zero group divides by zero)",
        "suites/test_corner_cases.py::test_corner_case_bytes[fp8_zero_tensor_dynamic_scale]",
    ),
    "moe_a2_qdq_dropped": (
        "reference/moe.py",
        "        a2[rows] = qdq(y[rows].float(), a2_scale).double() if aq is not None else y[rows]\n",
        "        a2[rows] = y[rows]\n",
        "reference MoE drops the a2 (GEMM2 input) quantization",
        "suites/test_moe_reference.py::test_weight_only_schemes_leave_activations_untouched_and_their_twins_do_not",
    ),
    "moe_static_scale_mean": (
        "reference/moe.py",
        "        scales.append(s.float().amax())\n",
        "        scales.append(s.float().mean())\n",
        "static activation scale is the mean, not the max, over experts",
        "suites/test_moe_reference.py::test_static_activation_scales_are_the_max_over_experts",
    ),
    "moe_swiglu_not_interleaved": (
        "reference/activations.py",
        "    if act.interleaved:\n",
        "    if False:\n",
        "SWIGLUOAI gate/up read as halves instead of interleaved",
        "suites/test_activations_routing.py::test_activation_matches_the_written_out_formula[SWIGLUOAI]",
    ),
    "moe_gate_not_rounded": (
        "reference/moe.py",
        "        phi = round_to(phi_pre, structure.act_out, keep).to(phi.dtype)\n",
        "        phi = phi_pre.to(phi.dtype)\n",
        "reference MoE skips the gate function's rounding that GATE_ROUNDED declares (vLLM's act_and_mul)",
        "suites/test_structures.py::test_an_independent_emulation_of_each_structure_passes[vllm_triton]",
    ),
    "moe_sequential_sum_unrounded": (
        "reference/moe.py",
        "            acc = round_to(acc_pre[:, j], st.gemm2_out, keep)\n",
        "            acc = acc_pre[:, j]\n",
        "reference MoE sums the top-k terms in float64 where SEQUENTIAL declares a rounding after each add",
        "suites/test_structures.py::test_an_independent_emulation_of_each_structure_passes[vllm_triton]",
    ),
    "moe_router_weight_twice": (
        "reference/moe.py",
        "    term = z * pair_weight[:, None] if st.router_weight is RouterWeight.AFTER_GEMM2_ROUNDING else z\n",
        "    term = z * pair_weight[:, None]\n",
        "reference MoE applies the router weight again in the sum after a GEMM epilogue applied it",
        "suites/test_structures.py::test_an_independent_emulation_of_each_structure_passes[vllm_triton]",
    ),
    "bound_sequential_sum_unrounded": (
        "harness/core/tolerances.py",
        "            d = _through_rounding(d + d_term[:, j] + product, trace.acc_pre[:, j], st.gemm2_out)\n",
        "            d = d + d_term[:, j] + product\n",
        "the bound forgets that a sequential bf16 sum rounds after every add (too tight: fails correct kernels)",
        "suites/test_moe_reference.py::test_every_scheme_and_activation_runs_and_a_correct_emulation_passes_the_bound"
        "[w_nvfp4-SITU_NO_MUL]",
    ),
    "bound_no_rounding_allowance": (
        "harness/core/tolerances.py",
        "    return torch.maximum(round_to(pre + d, precision) - r, r - round_to(pre - d, precision))\n",
        "    return torch.zeros_like(d)\n",
        "the bound forgets that both sides round to bf16 (too tight: fails correct kernels)",
        "suites/test_structures.py::test_an_independent_emulation_of_each_structure_passes[vllm_triton]",
    ),
    "bound_inflated": (
        "harness/core/tolerances.py",
        "    return ErrorBound(_through_rounding(d, trace.out_pre, Precision.BF16),\n",
        "    return ErrorBound(64 * _through_rounding(d, trace.out_pre, Precision.BF16) + 0.05 * trace.out.abs(),\n",
        "a bound 64x too loose plus 5% (passes wrong kernels)",
        "suites/test_structures.py::test_changing_any_field_of_a_structure_is_caught",
    ),
}


# The suites that prove the reference, fastest first (pytest -x stops at the first failure). The
# conformance suites compare backends with this same reference, so they cannot judge it.
SUITES = [
    "suites/test_corner_cases.py",
    "suites/test_activations_routing.py",
    "suites/test_bad_input.py",
    "suites/test_formats_oracle.py",
    "suites/test_structures.py",
    "suites/test_moe_reference.py",
    "suites/test_quantizer_properties.py",
]


# test_bad_input's command-line tests start a Python per case and judge argparse, not the reference: 15 s of
# every mutant's run that reaches them
CLI_TESTS = "not test_the_cli_answers_bad_arguments and not test_python_m_harness_backends"


def run(name: str) -> tuple[bool, float, str]:
    path, old, new, _, *first = MUTANTS[name]
    with tempfile.TemporaryDirectory() as tmp:
        dst = Path(tmp) / "repo"
        shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns(".venv", ".git", ".hypothesis", "report", "__pycache__",
                                                                 "results", "docs", ".whl", "bench",
                                                                 ".third_party"))
        src = (dst / path).read_text()
        if src.count(old) != 1:
            raise SystemExit(f"mutant {name}: the text to replace is not found exactly once in {path}")
        (dst / path).write_text(src.replace(old, new))
        t0 = time.perf_counter()
        for tests in ([*first], SUITES) if first else (SUITES,):  # the hinted tests alone, then everything
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--hypothesis-profile=ci",
                 "-k", CLI_TESTS, *tests],
                cwd=dst, capture_output=True, text=True,
            )
            if proc.returncode == 1:
                break
        dt = time.perf_counter() - t0
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
    return proc.returncode == 1, dt, failed[0][7:] if failed else proc.stdout.strip().splitlines()[-1]


def main(argv: list[str]) -> int:
    names = argv or list(MUTANTS)
    survivors = 0
    for name in names:
        caught, dt, by = run(name)
        survivors += not caught
        print(f"{'CAUGHT  ' if caught else 'SURVIVED'} {name:<24} {dt:5.1f}s  {MUTANTS[name][3]}\n         by {by}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
