"""The reference MoE for every scheme x activation, and the derived bound: it never fails a correct
computation, and it catches one weight code moved by one step, for every scheme."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.backends.emulation import moe_emulation
from harness.inputs.mutations import rows_by_step_size, step_one_weight_code
from harness.core.tolerances import compare, moe_error_bound
from reference.activations import ACTIVATIONS
from reference.checkpoints import make_checkpoint
from reference.formats import E4M3FNUZ
from reference.moe import fused_moe
from reference.routing import RoutingConfig, route
from reference.schemes import SCHEMES

E, H, I, T, K = 4, 128, 128, 8, 2
SCHEME_IDS = sorted(SCHEMES)
ACT_IDS = sorted(ACTIVATIONS)


def _inputs(seed: int, tokens: int = T, experts: int = E, top_k: int = K):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, H, generator=g) * 2).to(torch.bfloat16)
    w, ids = route(torch.randn(tokens, experts, generator=g), RoutingConfig(top_k=top_k))
    return x, w, ids


def test_static_activation_scales_are_the_max_over_experts():
    for scheme in ("w_mxfp4_a_fp8", "w_fp8_a_fp8", "w_nvfp4_a_nvfp4"):
        ckpt = make_checkpoint(scheme, "SILU", E, H, I, seed=2)
        x, w, ids = _inputs(seed=2)
        _, trace = fused_moe(x, ckpt, w, ids, trace=True)
        assert trace.a1_scale == ckpt.w13_input_scale.max() and trace.a2_scale == ckpt.w2_input_scale.max()
        assert ckpt.w13_input_scale.min() < ckpt.w13_input_scale.max()  # the max is not any one expert's


TWINS = [("w_mxfp4", "w_mxfp4_a_mxfp4"), ("w_mxfp6_e3m2", "w_mxfp6_e3m2_a_mxfp6_e3m2"),
         ("w_mxfp6_e2m3", "w_mxfp6_e2m3_a_mxfp6_e2m3"), ("w_nvfp4", "w_nvfp4_a_nvfp4")]


@pytest.mark.parametrize("weight_only, w4a4", TWINS)
def test_weight_only_schemes_leave_activations_untouched_and_their_twins_do_not(weight_only, w4a4):
    x, w, ids = _inputs(seed=2)
    _, t16 = fused_moe(x, make_checkpoint(weight_only, "SILU", E, H, I, seed=0), w, ids, trace=True)
    assert torch.equal(t16.a1, x.double())  # a1 is the bf16 input, bit for bit
    assert torch.equal(t16.a2, t16.y)  # a2 is the bf16 activation output, bit for bit
    _, t4 = fused_moe(x, make_checkpoint(w4a4, "SILU", E, H, I, seed=0), w, ids, trace=True)
    assert not torch.equal(t4.a1, x.double())
    assert not torch.equal(t4.a2, t4.y)


def test_weight_only_checkpoint_run_as_w4a4_is_a_clear_error():
    ckpt = make_checkpoint("w_nvfp4", "SILU", E, H, I)
    from dataclasses import replace

    from reference.schemes import SCHEMES as S

    as_w4a4 = replace(ckpt, scheme=S["w_nvfp4_a_nvfp4"])  # same weights, no input scales
    x, w, ids = _inputs(seed=0)
    with pytest.raises(ValueError, match="no w13_input_scale"):
        fused_moe(x, as_w4a4, w, ids)


def test_nvfp4_global_scale_conventions_mean_the_same_weights():
    x, w, ids = _inputs(seed=4)
    dec = fused_moe(x, make_checkpoint("w_nvfp4_a_nvfp4", "SILU", E, H, I, seed=1, nvfp4_global_convention="decode"), w, ids)
    enc = fused_moe(x, make_checkpoint("w_nvfp4_a_nvfp4", "SILU", E, H, I, seed=1, nvfp4_global_convention="encode"), w, ids)
    # decode = fl(amax / 2688) and 1 / fl(2688 / amax) can differ in the last bit: compare within 1%
    rel = ((dec.double() - enc.double()).norm() / dec.double().norm()).item()
    assert rel < 2.0**-6, rel


def test_fp8_format_is_a_checkpoint_property():
    x, w, ids = _inputs(seed=6)
    fn = make_checkpoint("w_fp8_a_fp8", "SILU", E, H, I, seed=1)
    fnuz = make_checkpoint("w_fp8_a_fp8", "SILU", E, H, I, seed=1, fp8_format=E4M3FNUZ)
    assert fn.w13.data.dtype == fnuz.w13.data.dtype == torch.uint8
    assert not torch.equal(fn.w13.data, fnuz.w13.data)  # different code points for the same values
    a, b = fused_moe(x, fn, w, ids), fused_moe(x, fnuz, w, ids)
    assert ((a.double() - b.double()).norm() / a.double().norm()).item() < 0.1


def test_zero_tokens_give_an_empty_output():
    ckpt = make_checkpoint("w_mxfp4", "SILU", E, H, I)
    out = fused_moe(torch.zeros(0, H, dtype=torch.bfloat16), ckpt, torch.zeros(0, K), torch.zeros(0, K, dtype=torch.long))
    assert out.shape == (0, H)


BAD_MOE = {
    "hidden_fp32": (dict(x=torch.zeros(2, H)), TypeError, "hidden_states must be a bfloat16"),
    "hidden_wrong_width": (dict(x=torch.zeros(2, H + 32, dtype=torch.bfloat16)), ValueError, r"hidden_states must be \[tokens, 128\]"),
    "ids_out_of_range": (dict(ids=torch.tensor([[0, 4], [1, 2]])), ValueError, r"topk_ids must lie in \[0, 4\)"),
    "ids_negative": (dict(ids=torch.tensor([[0, -1], [1, 2]])), ValueError, r"topk_ids must lie in"),
    "ids_float": (dict(ids=torch.zeros(2, K)), TypeError, "topk_ids must be an int32/int64"),
    "topk_too_large": (dict(ids=torch.zeros(2, 5, dtype=torch.long), w=torch.zeros(2, 5)), ValueError, r"top_k must be in \[1, num_experts=4\]"),
    "weights_shape": (dict(w=torch.zeros(2, 3)), ValueError, "topk_weights must have topk_ids' shape"),
    "weights_bf16": (dict(w=torch.zeros(2, K, dtype=torch.bfloat16)), TypeError, "topk_weights must be a float32"),
    "hidden_nan": (dict(x=torch.full((2, H), float("nan"), dtype=torch.bfloat16)), ValueError, "hidden_states must be finite"),
}


@pytest.mark.parametrize("name", sorted(BAD_MOE))
def test_bad_moe_input_is_rejected(name):
    ckpt = make_checkpoint("w_mxfp4", "SILU", E, H, I)
    args = dict(x=torch.zeros(2, H, dtype=torch.bfloat16), w=torch.full((2, K), 0.5), ids=torch.tensor([[0, 1], [2, 3]]))
    override, exc, pattern = BAD_MOE[name]
    args.update(override)
    with pytest.raises(exc, match=pattern):
        fused_moe(args["x"], ckpt, args["w"], args["ids"])


def test_unknown_scheme_or_activation_is_an_error():
    with pytest.raises(ValueError, match="unknown scheme 'w_mxfp5'"):
        make_checkpoint("w_mxfp5", "SILU", E, H, I)
    with pytest.raises(ValueError, match="unknown activation 'SWISH'"):
        make_checkpoint("w_mxfp4", "SWISH", E, H, I)
    with pytest.raises(ValueError, match="hidden_size=100 must be a positive multiple of 32"):
        make_checkpoint("w_mxfp4", "SILU", E, 100, I)


def test_python_m_harness_schemes_lists_every_scheme():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "harness", "schemes"], capture_output=True, text=True, check=True).stdout
    lines = out.strip().splitlines()
    assert [line.split()[0] for line in lines] == list(SCHEMES)
    assert "weight=mxe2m1" in out and "act=bf16 (A16)" in out


def _most_exposed_pair(trace, values):
    """The (token, k) pair and input column whose input magnitude times routing weight is largest."""
    score = values.abs() * trace.pair_weight[:, None]
    flat = int(score.argmax())
    return flat // values.shape[1], flat % values.shape[1]


@pytest.mark.parametrize("weight", ["w2", "w13"])
@pytest.mark.parametrize("scheme", SCHEME_IDS)
def test_the_bound_catches_one_weight_code_moved_by_one_step(scheme, weight):
    act = "SILU"
    ckpt = make_checkpoint(scheme, act, E, H, I, seed=5)
    x, w, ids = _inputs(seed=11)
    out, trace = fused_moe(x, ckpt, w, ids, trace=True)
    if weight == "w2":
        pair, column = _most_exposed_pair(trace, trace.a2)
    else:
        a1 = trace.a1[trace.pair_token]
        pair, column = _most_exposed_pair(trace, a1)
    expert = int(trace.pair_expert[pair])
    bound = moe_error_bound(trace, ckpt)
    # Among the 48 codes of the most exposed column whose step moves the weight most, take the one whose
    # step moves the output most. (A w13 step can vanish when the activation is re-quantized, or move
    # the output by one rounding only; no comparison can tell those from a correct kernel.)
    candidates = []
    for row in rows_by_step_size(ckpt, weight, expert, column)[:48]:
        got = fused_moe(x, step_one_weight_code(ckpt, weight, expert, row, column), w, ids)
        candidates.append((float((got.double() - out.double()).abs().max()), row, got))
    moved, row, got = max(candidates, key=lambda c: c[0])
    assert moved > 0, f"no step of the 48 most exposed {weight} codes in column {column} changed the output"
    c = compare(out, got, bound, f"{scheme}/{act}: output")
    assert not c.ok, f"{weight}[{expert}, {row}, {column}] moved one step and passed: {c.message()}"
    assert scheme in c.what and "index" in c.message() and "ulp" in c.message()


@pytest.mark.parametrize("act", ACT_IDS)
@pytest.mark.parametrize("scheme", SCHEME_IDS)
def test_every_scheme_and_activation_runs_and_a_correct_emulation_passes_the_bound(scheme, act):
    ckpt = make_checkpoint(scheme, act, E, H, I, seed=3, with_bias=act == "SWIGLUOAI")
    x, w, ids = _inputs(seed=len(scheme) + len(act))
    out, trace = fused_moe(x, ckpt, w, ids, trace=True)
    assert out.dtype == torch.bfloat16 and out.shape == (T, H) and bool(torch.isfinite(out).all())
    exact = fused_moe(x, ckpt, w, ids, exact=True)
    assert exact.dtype == torch.float64
    for operand_dtype in (torch.float32, torch.bfloat16):
        bound = moe_error_bound(trace, ckpt, operand_dtype)
        for seed in (None, 1):
            got = moe_emulation(x, ckpt, w, ids, operand_dtype=operand_dtype, k_permutation_seed=seed)
            c = compare(out, got, bound, f"{scheme}/{act}/emulation[{operand_dtype}, order {seed}]: output")
            assert c.ok, c.message()


@settings(max_examples=25)
@given(
    scheme=st.sampled_from(SCHEME_IDS),
    act=st.sampled_from(ACT_IDS),
    seed=st.integers(0, 2**16),
    tokens=st.integers(1, 12),
    routing=st.sampled_from(["random", "all_to_one", "ties", "skip_experts"]),
    bias=st.booleans(),
    dequantize_all=st.booleans(),
)
def test_the_bound_never_fails_a_correct_computation(scheme, act, seed, tokens, routing, bias, dequantize_all):
    ckpt = make_checkpoint(scheme, act, E, H, I, seed=seed, with_bias=bias)
    x, w, ids = _inputs(seed, tokens)
    if routing == "all_to_one":  # one expert gets every token
        ids = torch.stack([torch.zeros(tokens, dtype=torch.long), torch.ones(tokens, dtype=torch.long)], 1)
    elif routing == "ties":  # tied logits: the documented tie-break (lower index) decides
        w, ids = route(torch.zeros(tokens, E), RoutingConfig(top_k=K))
    elif routing == "skip_experts":  # experts 1 and 2 get no token
        ids = torch.stack([torch.zeros(tokens, dtype=torch.long), torch.full((tokens,), 3)], 1)
    out, trace = fused_moe(x, ckpt, w, ids, trace=True)
    for operand_dtype in (torch.float32, torch.bfloat16):
        got = moe_emulation(x, ckpt, w, ids, operand_dtype=operand_dtype, k_permutation_seed=seed,
                            dequantize_all_experts=dequantize_all)
        c = compare(out, got, moe_error_bound(trace, ckpt, operand_dtype), f"{scheme}/{act}: output")
        assert c.ok, c.message()



def test_a_declared_narrow_accumulator_is_allowed_exactly_what_it_declares():
    """A kernel whose k-chunk sums keep only 12 significand bits (a narrow tensor-core adder, as on
    Hopper's FP8 path) passes every case once it declares accumulation_error = 2^-11, and the same kernel
    without the declaration is caught: the declaration is what lets it through, not slack in the bound."""
    caught = []
    for scheme in ("w_fp8_a_fp8", "w_mxfp4_a_fp8", "w_mxfp8", "w_nvfp4_a_nvfp4"):
        for act in ("SILU", "RELU2_NO_MUL", "GELU"):
            ckpt = make_checkpoint(scheme, act, E, H, I, seed=5)
            x, w, ids = _inputs(seed=5)
            out, trace = fused_moe(x, ckpt, w, ids, trace=True)
            bits = 12  # a chunk sum truncated to 12 significand bits errs by less than 2^(1 - bits) of sum|a||w|
            got = moe_emulation(x, ckpt, w, ids, operand_dtype=torch.float32, narrow_accumulator=(32, bits))
            bound = moe_error_bound(trace, ckpt, torch.float32, accumulation_error=2.0 ** (1 - bits))
            declared = compare(out, got, bound, f"{scheme}/{act}")
            assert declared.ok, declared.message()
            if not compare(out, got, moe_error_bound(trace, ckpt, torch.float32), f"{scheme}/{act}").ok:
                caught.append(f"{scheme}/{act}")
    assert len(caught) == 12, f"the undeclared narrow accumulator was caught only in {caught}"


def test_the_h200s_fp8_scaled_mm_output_of_run_5_is_within_the_sm90_bound():
    """The nightly search on the H200 (results/gpu-issue25/run-5) found torch._scaled_mm, a correct FP8 GEMM, at
    1.24x the bound under sm90's then FP8 accumulation declaration (2^-11 of sum|a||w|): at the shape class
    tokens_past_256_mixtral-8x7b, seed 2, output (121, 13) was 38.0 where the reference has 43.25 (exact: 38.83). A
    GEMM1 output 5.1e-4 of its sum|a||w| from a bf16 midpoint had rounded the other way, and the a2 code it feeds
    (y = 136 at the 432 / 0.3147 boundary) took the next FP8 step. The platform's declaration must cover it."""
    from harness.backends import backend_bound_declarations, backend_structure, load_backend
    from harness.core.conformance import case_checkpoint, case_inputs, routed_ids, shape_class_runs, shape_class_shape
    from harness.inputs.shape_classes import SHAPE_CLASSES
    from harness.platforms import PLATFORMS

    backend, sc, sm90 = load_backend("torch_fp8"), SHAPE_CLASSES["tokens_past_256_mixtral-8x7b"], PLATFORMS["sm90"]
    problem, act = shape_class_runs(backend, "w_fp8_a_fp8", sc, sm90)
    shape = shape_class_shape(backend, sc)
    ckpt = case_checkpoint("w_fp8_a_fp8", act, sm90.fp8_format.name, shape, 2, problem.has_bias)
    x, w, ids = case_inputs(shape, 2)
    out, trace = fused_moe(x, ckpt, w, routed_ids(sc.routing, ids, shape.num_experts),
                           structure=backend_structure(backend), trace=True)
    declarations = backend_bound_declarations(backend, "w_fp8_a_fp8")
    assert declarations["accumulation_error"] == sm90.fp8_mma_accumulation_error
    bound = moe_error_bound(trace, ckpt, **declarations).bound
    assert float(out[121, 13]) == 43.25
    assert float(bound[121, 13]) >= 43.25 - 38.0
    under_the_old = moe_error_bound(trace, ckpt, **{**declarations, "accumulation_error": 2.0**-11}).bound
    assert float(under_the_old[121, 13]) < 43.25 - 38.0


# ---- the probabilistic GEMM terms (issue 24 item 7) ------------------------------------------------------


def _round_toward_zero_fp32(x64: torch.Tensor) -> torch.Tensor:
    x32 = x64.float()
    return torch.where(x32.double().abs() > x64.abs(), torch.nextafter(x32, torch.zeros_like(x32)), x32).double()


@pytest.mark.parametrize("k", [64, 1024, 4096])
def test_probabilistic_gemm_term_holds_for_round_to_nearest_sums_and_is_tighter_than_the_worst_case(k):
    """fp32 inner products in three orders (sequential, pairwise, 16-blocks), of random-sign and of all-positive
    terms, stay inside gemm_relative_error * sum|x|, which is at most the worst case and, from K = 1024 on, under
    a third of it (it grows like sqrt(K))."""
    from harness.core.tolerances import gamma, gemm_relative_error

    g = torch.Generator().manual_seed(k)
    rel = gemm_relative_error(k, 0.0)
    assert rel <= gamma(k + 4) and (k < 1024 or rel < gamma(k + 4) / 3)
    for x in (torch.randn(64, k, generator=g), torch.randn(64, k, generator=g).abs()):
        exact, bound = x.double().sum(1), rel * x.double().abs().sum(1)
        for got in (_sequential_fp32(x), _pairwise_fp32(x), _sequential_fp32(x.reshape(64, -1, 16).sum(2))):
            assert bool(((got.double() - exact).abs() <= bound).all())


def _sequential_fp32(x: torch.Tensor) -> torch.Tensor:
    """acc = fl32(acc + x_j) along dim 1, one rounding per add (torch's CPU cumsum accumulates wider)."""
    acc = torch.zeros(x.shape[0], dtype=torch.float32)
    for j in range(x.shape[1]):
        acc = acc + x[:, j]
    return acc


def _pairwise_fp32(x: torch.Tensor) -> torch.Tensor:
    """A binary tree over contiguous halves (each node a contiguous K range), in fp32."""
    while x.shape[1] > 1:
        x = x[:, 0::2] + x[:, 1::2] if x.shape[1] % 2 == 0 else torch.cat([x[:, :-1:2] + x[:, 1::2], x[:, -1:]], 1)
    return x[:, 0]


def test_partial_sums_in_k_order_bound_every_contiguous_order_and_a_kernel_out_of_order_must_say_so():
    """gemm_error with k_order "ordered" (every partial sum a contiguous K range, give or take two aligned chunks)
    holds for fp32 sums in every such order - sequential, reversed, a contiguous tree, 16-wide tiles in order,
    split-K 4 added in order - on random-sign and all-positive terms, and is 5x or more tighter than the sum|x|
    form on random-sign terms. On terms that cancel in K order (+x, -x pairs) a kernel that adds all the positive
    terms first forms partial sums ~K/4 times a term: it breaks the ordered bound, and holds with k_order "any"
    (a backend that combines K partial sums out of order declares it)."""
    from harness.core.tolerances import gemm_error, gemm_magnitudes

    g = torch.Generator().manual_seed(7)
    k = 4096
    orders = {"sequential": _sequential_fp32, "reversed": lambda x: _sequential_fp32(x.flip(1)), "tree": _pairwise_fp32,
              "tiles of 16": lambda x: _sequential_fp32(_pairwise_fp32(x.reshape(-1, 16)).reshape(x.shape[0], -1)),
              "split-K 4": lambda x: _sequential_fp32(_sequential_fp32(x.reshape(-1, k // 4)).reshape(-1, 4))}
    for x in (torch.randn(64, k, generator=g), torch.rand(64, k, generator=g)):
        mags = gemm_magnitudes(torch.ones(1, k, dtype=torch.float64), x.double())
        bound = gemm_error(k, mags, 0.0)[:, 0]
        exact = x.double().sum(1)
        for name, add in orders.items():
            err = (add(x).double() - exact).abs()
            assert bool((err <= bound).all()), (name, float((err / bound).max()))
        if bool((x < 0).any()):
            anywhere = gemm_error(k, gemm_magnitudes(torch.ones(1, k, dtype=torch.float64), x.double(), k_order="any"),
                                  0.0)[:, 0]
            assert bool((5 * bound < anywhere).all())
    k = 16384
    x = torch.stack([torch.rand(64, k // 2, generator=g) + 1, -1 - torch.rand(64, k // 2, generator=g)], 2)
    x = x.reshape(64, k)  # +a_0, -b_0, +a_1, -b_1, ...: the K-order prefix sums stay near 0
    positives_first = _sequential_fp32(torch.cat([x[:, 0::2], x[:, 1::2]], 1)).double()
    err = (positives_first - x.double().sum(1)).abs()
    ones = torch.ones(1, k, dtype=torch.float64)
    assert bool((err > gemm_error(k, gemm_magnitudes(ones, x.double()), 0.0)[:, 0]).any())
    assert bool((err <= gemm_error(k, gemm_magnitudes(ones, x.double(), k_order="any"), 0.0)[:, 0]).all())


def test_a_truncating_accumulator_breaks_the_probabilistic_term_so_it_is_declared_in_full():
    """Rounding toward zero is not mean-zero: over 4096 positive terms its error grows like K u, past the
    probabilistic term. That is why a backend on such an accumulator declares accumulation_error, which the
    bound adds in full (here 2u K covers it)."""
    from harness.core.tolerances import U_FP32, gemm_relative_error

    x = torch.rand(32, 4096, generator=torch.Generator().manual_seed(1)).double()
    acc = torch.zeros(32, dtype=torch.float64)
    for j in range(x.shape[1]):
        acc = _round_toward_zero_fp32(acc + x[:, j])
    err, s1 = (acc - x.sum(1)).abs(), x.abs().sum(1)
    assert bool((err > gemm_relative_error(4096, 0.0) * s1).any())
    assert bool((err <= (gemm_relative_error(4096, 0.0) + 2 * U_FP32 * 4096) * s1).all())


def test_a_truncating_accumulator_breaks_the_ordered_bound_unless_it_declares_its_truncation():
    """With partial sums bounded in K order the probabilistic term is ~sqrt(K) tighter for random-sign terms, and a
    sum rounded toward zero at every add (2u of the running sum each) breaks it on random-sign terms as well as
    on all-positive ones. Declared as accumulation_truncation per 16-wide K step (16 adds: 2^-19), the bound adds
    it in full, times the largest partial sum, and holds (what Hopper's bf16 matrix units declare:
    harness.platforms.Platform.mma_truncation)."""
    from harness.core.tolerances import gemm_error, gemm_magnitudes

    g = torch.Generator().manual_seed(3)
    k = 4096
    for x in (torch.randn(32, k, generator=g).double(), torch.rand(32, k, generator=g).double()):
        x = x.float().double()
        acc = torch.zeros(32, dtype=torch.float64)
        for j in range(k):
            acc = _round_toward_zero_fp32(acc + x[:, j])
        err = (acc - x.sum(1)).abs()
        mags = gemm_magnitudes(torch.ones(1, k, dtype=torch.float64), x)
        assert bool((err > gemm_error(k, mags, 0.0)[:, 0]).any())
        assert bool((err <= 0.5 * gemm_error(k, mags, 0.0, truncation=2.0**-19)[:, 0]).all())


def test_at_real_sizes_the_fp8_bias_bug_fails_most_elements_and_a_correct_kernel_stays_far_inside():
    """vLLM's FP8 bias-before-dequantization bug (the catalog mutant) at H = I = 1024: the worst-case bound let it
    through on 44% of the elements (results/cpu-issue24/bound-growth.md), the probabilistic GEMM terms and the
    weighed re-quantization flips on 16%; with partial sums bounded in K order (gemm_magnitudes) it fails 95%,
    while the catalog's correct control stays at half the bound or less (it differs from the reference on 11 of
    8192 elements, by one bf16 ulp, where the bound allows two or more). The false-alarm probability is stated
    with the bound."""
    from harness.core.conformance import Shape, case_inputs
    from harness.detection.catalog import make_mutant
    from reference.structure import structure_by_name

    st = structure_by_name("vllm_triton")
    ckpt = make_checkpoint("w_fp8_a_fp8", "SILU", 8, 1024, 1024, seed=0, with_bias=True)
    x, w, ids = case_inputs(Shape(8, 1024, 1024, 8, 4), 0)
    out, trace = fused_moe(x, ckpt, w, ids, structure=st, trace=True)
    bound = moe_error_bound(trace, ckpt)
    assert 0 < bound.false_alarm < 2.0**-25
    bug, control = make_mutant("fp8_bias_before_dequantization", st), make_mutant("control", st)
    caught = compare(out, bug.forward(bug.prepare(ckpt), x, w, ids), bound, "bias bug")
    passed = compare(out, control.forward(control.prepare(ckpt), x, w, ids), bound, "control")
    assert caught.n_bad > 0.9 * caught.n_total, caught.message()
    assert passed.ok and passed.max_ratio <= 0.5, passed.message()


def test_a_nan_or_inf_output_is_named_as_such_not_as_nan_times_the_bound():
    """Issue 26: a kernel writing NaN or Inf where the reference is finite read "worst inf ulp = nanx its bound"."""
    from harness.core.tolerances import ErrorBound

    expected = torch.tensor([1.0, 2.0, 4.0], dtype=torch.bfloat16)
    for bad in (float("nan"), float("inf")):
        got = torch.tensor([1.0, bad, 4.0], dtype=torch.bfloat16)
        msg = compare(expected, got, ErrorBound(torch.full((3,), 0.01, dtype=torch.float64)), "case").message()
        assert f"got {bad!r} where 2.0 was expected" in msg and "nanx" not in msg and "inf ulp" not in msg, msg


@pytest.mark.parametrize("scheme, act", [("w_mxfp4", "SWIGLUOAI"), ("w_fp8_a_fp8", "SILU"), ("w_fp8_a_fp8_block", "SILU"),
                                         ("w_nvfp4_a_nvfp4", "GELU"), ("bf16", "RELU2_NO_MUL")])
def test_derived_experts_are_valid_distinct_and_cheap(scheme, act):
    """make_checkpoint(distinct_experts=B) quantizes B experts and derives the rest by rolling output rows by whole
    scale blocks (what lets a real model's 128-384 experts be built in seconds): its first B experts are the B-expert
    checkpoint's, bit for bit; every expert dequantizes to a different matrix; a derived expert is its base with
    rows rolled (w13 within its gate and up halves, or by pairs where they interleave, with the bias); the static
    input scales follow (a derived expert's activations are its base's, permuted); too few distinct experts for
    the shape is an error, never a silent repeat."""
    from reference.checkpoints import dequantize_weight

    c = make_checkpoint(scheme, act, 7, 512, 512, seed=1, with_bias=True, distinct_experts=3)
    few = make_checkpoint(scheme, act, 3, 512, 512, seed=1, with_bias=True)
    d13, d2 = (dequantize_weight(w, c.scheme.weight, c) for w in (c.w13, c.w2))
    assert torch.equal(d13[:3], dequantize_weight(few.w13, few.scheme.weight, few))
    flat = torch.cat([d13.flatten(1), d2.flatten(1)], 1)
    assert all(not torch.equal(flat[i], flat[j]) for i in range(7) for j in range(i))
    block = c.scheme.n_multiple()
    parts = 2 if c.activation.gated and not c.activation.interleaved else 1
    pair = 2 if c.activation.interleaved else 1
    rolled = torch.cat([torch.roll(h, block * pair, 0) for h in d13[1].chunk(parts)])  # expert 4: expert 1, shift 1
    assert torch.equal(d13[4], rolled) and torch.equal(d2[4], torch.roll(d2[1], block, 0))
    assert torch.equal(c.b13[4], torch.cat([torch.roll(h, block * pair, 0) for h in c.b13[1].chunk(parts)]))
    assert (c.w13_input_scale is None) == (few.w13_input_scale is None)
    with pytest.raises(ValueError, match="would repeat"):  # shifts wrap around both weights' rows
        make_checkpoint(scheme, act, 1 + 512 // block, 512, 512, seed=1, distinct_experts=1)


@pytest.mark.parametrize("scheme", ["bf16", "w_mxfp4", "w_nvfp4_a_nvfp4", "w_fp8_a_fp8", "w_fp8_a_fp8_block"])
def test_routed_experts_one_at_a_time_give_the_same_reference_and_bound(scheme, monkeypatch):
    """Beyond EAGER_WEIGHT_BYTES the reference dequantizes one routed expert at a time (RoutedWeights: Kimi-K2's
    ~300 routed experts at 64 tokens are 100 GB in float64); the output, every trace field and the bound are the
    eager ones bit for bit, for every structure."""
    import dataclasses

    import reference.moe
    from reference.moe import RoutedWeights
    from reference.structure import STRUCTURES, RouterWeight

    ckpt = make_checkpoint(scheme, "SWIGLUOAI", 8, H, I, seed=5, with_bias=True)
    x, w, ids = _inputs(seed=5, experts=8, top_k=4)
    for structure in STRUCTURES:
        if STRUCTURES[structure].router_weight is RouterWeight.GEMM1_EPILOGUE:  # defined for top_k 1 only
            continue
        eager_out, eager = fused_moe(x, ckpt, w, ids, structure=structure, trace=True)
        eager_bound = moe_error_bound(eager, ckpt).bound
        with monkeypatch.context() as m:
            m.setattr(reference.moe, "EAGER_WEIGHT_BYTES", 0)
            out, lazy = fused_moe(x, ckpt, w, ids, structure=structure, trace=True)
            assert isinstance(lazy.w13, RoutedWeights) and isinstance(lazy.w2, RoutedWeights)
            bound = moe_error_bound(lazy, ckpt).bound
        assert torch.equal(out, eager_out) and torch.equal(bound, eager_bound), structure
        assert lazy.w13.shape == eager.w13.shape and lazy.w2.shape == eager.w2.shape
        assert all(torch.equal(lazy.w13[i], eager.w13[i]) and torch.equal(lazy.w2[i, 3], eager.w2[i, 3])
                   for i in range(len(eager.experts)))
        for f in dataclasses.fields(eager):
            if f.name not in ("w13", "w2") and torch.is_tensor(getattr(eager, f.name)):
                assert torch.equal(getattr(lazy, f.name), getattr(eager, f.name)), (structure, f.name)
