"""Special values through backends (harness.inputs.special_values): NaN, 2^-127 and 2^127 E8M0 block scales, NVFP4
block scales 0 and 448, FP8 weight scales 2^-100 and 2^50, and NaN/Inf rows past the real tokens. The
comparison holds NaN and Inf outputs to the reference's places and signs. Each case is first shown to
fail the plausible wrong answer it names, so a pass means something."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from harness.backends import Declined, backend_known_failures, backend_structure, known_failure_for
from harness.core.conformance import (ConformanceCase, case_checkpoint, backend_shape, case_inputs, case_problem, compare_backend,
                                 default_shape, skip_reason)
from harness.backends.emulation import moe_emulation
from harness.platforms import detect_platform
from harness.inputs.special_values import SPECIAL_CASES, padded_rows_leak, poisoned_inputs
from harness.core.tolerances import compare, moe_error_bound
from reference.activations import activation_by_name
from reference.moe import fused_moe
from reference.schemes import scheme_by_name
from reference.structure import STRUCTURES

SPECIAL_IDS = [c.name for c in SPECIAL_CASES]
ACT = "SILU"


def _special_run(special, scheme: str, structure, shape, bias: bool):
    host = detect_platform()
    base = case_checkpoint(scheme, ACT, host.fp8_format.name, shape, 0, bias)
    ckpt = special.checkpoint(base) if special.checkpoint else base
    x, w, ids = case_inputs(shape, 5)
    if special.inputs:
        x, w, ids = special.inputs(x, w, ids)
    out, trace = fused_moe(x, ckpt, w, ids, structure=structure, trace=True)
    return ckpt, (x, w, ids), out, trace


@pytest.mark.parametrize("special", SPECIAL_CASES, ids=SPECIAL_IDS)
def test_a_plausible_wrong_answer_to_each_special_value_fails(special):
    """The correct emulation passes the special case and the named wrong answer fails it, under every
    declared structure."""
    shape = default_shape(detect_platform())
    for structure in STRUCTURES.values():
        sh = shape if structure.max_top_k is None else dataclasses.replace(shape, top_k=structure.max_top_k)
        for scheme in special.schemes:
            ckpt, (x, w, ids), out, trace = _special_run(special, scheme, structure, sh, special.biased)
            bound = moe_error_bound(trace, ckpt, torch.float32)
            what = f"{special.name}/{scheme}/{structure.name}"

            def emulate(c, st=structure):
                return moe_emulation(x, c, w, ids, structure=st, operand_dtype=torch.float32)

            right = compare(out, emulate(ckpt), bound, what)
            assert right.ok, right.message()
            if special.poison_padding:
                px, pw, pids = poisoned_inputs(x, w, ids)
                right = compare(out, moe_emulation(px, ckpt, pw, pids, structure=structure,
                                                   operand_dtype=torch.float32), bound, what)
                assert right.ok, right.message()
                wrong = padded_rows_leak(emulate(ckpt), px)
            elif special.wrong_structure:
                wrong = emulate(ckpt, special.wrong_structure(structure))
            else:
                wrong = emulate(special.wrong(ckpt))
            caught = compare(out, wrong, bound, what)
            assert not caught.ok, f"{what}: the wrong answer ({special.wrong_answer}) passed"
            if special.name in ("e8m0_nan_block", "e8m0_max_scale"):
                assert bool(torch.isnan(out.float()).any()), f"{what}: the special block reached no output"


@pytest.mark.parametrize("special", SPECIAL_CASES, ids=SPECIAL_IDS)
def test_special_values_through_backends(backend_name, backends, special):
    backend = backends[backend_name]
    known = backend_known_failures(backend).get(special.name)
    if known:  # run with the guard off: the failure is expected, a pass means the record must go
        backend = copy.copy(backend)
        backend.decline_known_failures = False
    host = detect_platform()
    shape = backend_shape(backend, default_shape(host))
    structure = backend_structure(backend)
    ran, declined, failed, expected = [], [], [], []
    for scheme in special.schemes:
        case = ConformanceCase(backend_name, host, scheme_by_name(scheme), activation_by_name(ACT))
        if skip_reason(backend, case, host):  # the suite's one decision
            continue
        problem, _, _ = case_problem(backend, case.scheme, case.activation, host, shape)
        has_bias = problem.has_bias and special.biased
        ckpt, inputs, out, trace = _special_run(special, scheme, structure, shape, has_bias)
        if special.poison_padding:
            inputs = poisoned_inputs(*inputs, device=getattr(backend, "device", "cpu"))
        what = f"{scheme}/{ACT}/{backend_name}/{host.name}/{special.name}"
        try:
            result = compare_backend(backend, ckpt, inputs, out, trace, what)
        except Declined as exc:  # a declared limitation, reported, never a wrong answer
            declined.append(f"{scheme}: {exc}")
            continue
        ran.append(scheme)
        record = known or known_failure_for(backend, scheme, has_bias)
        if record:
            expected.append((scheme, record, result))
        elif not result.ok:
            failed.append(result.message())
    assert not failed, "\n".join(failed)
    if expected:
        record = expected[0][1]
        if all(r.ok for _, _, r in expected):
            pytest.fail(f"{backend_name} passes {special.name} on {[s for s, _, _ in expected]}, declared a known "
                        f"failure ({record.reason}): either the upstream fix has landed ({record.upstream}) and the "
                        "record must go, or this case no longer catches the bug")
        pytest.xfail(f"known failure of {backend_name}: {record.reason} ({record.upstream})")
    if not ran:
        pytest.skip(f"{backend_name} runs none of {special.schemes} here" +
                    (f"; declined: {'; '.join(declined)}" if declined else ""))


def test_a_declared_known_failure_declines_in_use_and_is_run_with_the_guard_off():
    from harness.backends.triton_dot_scaled import TritonDotScaledBackend

    backend = TritonDotScaledBackend(device="cpu")
    assert set(backend_known_failures(backend)) == {"e8m0_min_scale"}
    ckpt = next(c for c in SPECIAL_CASES if c.name == "e8m0_min_scale").checkpoint(
        case_checkpoint("w_mxfp4", ACT, "e4m3fn", default_shape(detect_platform()), 0, False))
    with pytest.raises(NotImplementedError, match=r"scale 2\^-127 \(E8M0 code 0\) and nonzero codes"):
        backend.prepare(ckpt)
    off = copy.copy(backend)
    off.decline_known_failures = False
    off.prepare(ckpt)  # the guard off: it computes (and, on this Triton, gets it wrong)
