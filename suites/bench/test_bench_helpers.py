"""The benchmark's own arithmetic, on the CPU: the dequantize-all baseline dequantizes exactly as the
reference, bytes and FLOPs are what the shapes say, and the targets read the rows they are given."""

from __future__ import annotations

import json
import os

import pytest
import torch

from harness.backends.dequantize_all import DequantizeAllBaseline
from harness.bench import (CPU_SHAPE, MODEL_SHAPES, device_checkpoint, evaluate_targets, format_targets, moe_flops,
                           weight_bytes, write_bench_report)
from reference.checkpoints import check_checkpoint, dequantize_weight, make_checkpoint
from reference.schemes import SCHEMES


@pytest.mark.parametrize("scheme", ["w_mxfp4", "w_nvfp4", "w_fp8_a_fp8", "w_fp8_a_fp8_block", "w_mxfp6_e3m2", "w_mxfp8"])
def test_dequantize_all_baseline_matches_the_reference_bit_for_bit(scheme):
    ckpt = make_checkpoint(scheme, "SILU", 20, 256, 128, seed=1)  # 20 experts: more than one chunk
    b = DequantizeAllBaseline(device="cpu")
    prep = b.prepare(ckpt)
    for name, wq in (("w13", ckpt.w13), ("w2", ckpt.w2)):
        got = b._dequantize(prep.weights[name], ckpt, prep.luts)
        assert torch.equal(got, dequantize_weight(wq, ckpt.scheme.weight, ckpt).to(torch.bfloat16)), name


def test_weight_bytes_count_each_activated_expert_once():
    ckpt = make_checkpoint("w_mxfp4", "SILU", 4, 128, 64, seed=0)
    per_expert = (128 * 128 // 2 + 128 * 128 // 32) + (128 * 64 // 2 + 128 * 64 // 32)
    ids = torch.tensor([[0, 1], [1, 0], [3, 0]])
    assert weight_bytes(ckpt, ids) == 3 * per_expert


def test_flops_of_gpt_oss_at_one_token():
    s = MODEL_SHAPES["gpt-oss-120b"]
    assert moe_flops(s, 1) == 2 * 4 * (2 * 2880 * 2880 + 2880 * 2880)


def _row(model, scheme, tokens, backend, us):
    return dict(model=model, scheme=scheme, tokens=tokens, backend=backend, us=us, pct_copy=1000 / us,
                pct_dense=1000 / us, tb_s=1.0, tflops=1.0, flops=10, bytes=5)


def test_targets_are_judged_on_the_fastest_kernel_and_never_on_the_baseline(tmp_path):
    rows = [_row("gpt-oss-120b", "w_mxfp4", 8, "slow", 100.0), _row("gpt-oss-120b", "w_mxfp4", 8, "fast", 10.0),
            _row("gpt-oss-120b", "w_mxfp4", 8, "dequantize_all", 200.0), _row("gpt-oss-120b", "bf16", 8, "k", 30.0),
            _row("gpt-oss-120b", "w_nvfp4", 8, "k", 11.0)]
    t = {(x["target"], x["case"].split(" (")[0]): x for x in evaluate_targets(rows, {})}
    bw = t[("MXFP4 W4A16 decode: % of copy bandwidth", "gpt-oss-120b T=8")]
    assert bw["value"] == 100.0 and bw["met"]
    assert t[("decode: x faster than dequantize-all", "gpt-oss-120b w_mxfp4 T=8")]["value"] == 20.0
    slow_bf16 = t[("decode: x faster than bf16 unquantized", "gpt-oss-120b w_mxfp4 T=8")]
    assert slow_bf16["value"] == 3.0 and slow_bf16["met"]
    nv = t[("NVFP4 time / MXFP4 W4A16 time", "gpt-oss-120b w_nvfp4 T=8")]
    assert nv["value"] == pytest.approx(1.1) and nv["met"]
    assert "**no**" not in format_targets([x for x in t.values() if x["met"]])
    paths = write_bench_report(rows, dict(copy_tb_s=4.0, dense_bf16_tflops=800.0, device="test"), tmp_path)
    assert (tmp_path / "roofline.png").read_bytes()[:4] == b"\x89PNG" and paths["targets"].exists()


def test_the_report_names_the_switches_its_kernels_ran_with(tmp_path, monkeypatch):
    """The MOE_CONFORMANCE_* variables in force (A/B switches and overrides read at import) go into results.json and
    table.md's head, or the line says none was set: a run with another ring depth is not mistaken for the defaults'."""
    import json

    for k in [k for k in os.environ if k.startswith("MOE_CONFORMANCE_")]:
        monkeypatch.delenv(k)
    row = _row("gpt-oss-120b", "w_mxfp4", 8, "fast", 10.0)
    write_bench_report([row], dict(copy_tb_s=4.0, dense_bf16_tflops=800.0, device="test"), tmp_path)
    assert "Switches: none" in (tmp_path / "table.md").read_text()
    assert json.loads((tmp_path / "results.json").read_text())["switches"] == {}
    monkeypatch.setenv("MOE_CONFORMANCE_GLUON_STAGES", "5")
    monkeypatch.setenv("OTHER_VARIABLE", "1")
    monkeypatch.setenv("MOE_CONFORMANCE_COMMIT", "abc1234")  # the run's commit: no switch
    write_bench_report([row], dict(copy_tb_s=4.0, dense_bf16_tflops=800.0, device="test"), tmp_path)
    assert "Switches: `MOE_CONFORMANCE_GLUON_STAGES=5`" in (tmp_path / "table.md").read_text()
    assert json.loads((tmp_path / "results.json").read_text())["switches"] == {"MOE_CONFORMANCE_GLUON_STAGES": "5"}


def test_the_anchor_is_never_the_candidate_and_is_compared_by_its_gemm_time():
    """triton_kernels_ogs faster than ours must not meet our bandwidth target for us; the anchor target divides
    its GEMM kernels' time (not its whole forward, whose bitmatrix packing is vLLM's modular path) by ours."""
    ours = _row("gpt-oss-120b", "w_mxfp4", 8, "triton_bitplace", 20.0)
    anchor = dict(_row("gpt-oss-120b", "w_mxfp4", 8, "triton_kernels_ogs", 5.0), gemm_kernels_us=4.0)
    t = {x["target"]: x for x in evaluate_targets([ours, anchor], {})}
    assert "triton_bitplace" in t["MXFP4 W4A16 decode: % of copy bandwidth"]["case"]
    vs = t["MXFP4 W4A16 decode: x faster than triton_kernels' GEMMs"]
    assert vs["value"] == pytest.approx(0.2) and not vs["met"]
    faster = dict(anchor, us=100.0, gemm_kernels_us=30.0)
    vs = {x["target"]: x for x in evaluate_targets([ours, faster], {})}["MXFP4 W4A16 decode: x faster than triton_kernels' GEMMs"]
    assert vs["value"] == pytest.approx(1.5) and vs["met"]


def test_the_anchor_is_compared_on_kimi_k2_s_shape_with_the_activation_it_runs():
    """triton_kernels fuses SWIGLUOAI only, so Kimi-K2's anchor comparison runs on kimi-k2-swigluoai: Kimi-K2's
    experts, top-k and sizes exactly (the same weight bytes), gpt-oss's activation; ours is judged there too."""
    kimi, twin = MODEL_SHAPES["kimi-k2"], MODEL_SHAPES["kimi-k2-swigluoai"]
    assert (twin.num_experts, twin.top_k, twin.hidden_size, twin.intermediate_size, twin.biased) == (
        kimi.num_experts, kimi.top_k, kimi.hidden_size, kimi.intermediate_size, kimi.biased)
    assert twin.activation == MODEL_SHAPES["gpt-oss-120b"].activation == "SWIGLUOAI" and "w_mxfp4" in twin.schemes
    assert twin.tokens == (1, 8, 64)  # the anchor target's decode points only
    rows = [_row(m, "w_mxfp4", t, "triton_bitplace", 100.0) for m in ("kimi-k2", "kimi-k2-swigluoai") for t in (1, 8)]
    rows += [dict(_row("kimi-k2-swigluoai", "w_mxfp4", t, "triton_kernels_ogs", 150.0), gemm_kernels_us=120.0)
             for t in (1, 8)]
    vs = [x for x in evaluate_targets(rows, {}) if x["target"] == "MXFP4 W4A16 decode: x faster than triton_kernels' GEMMs"]
    assert [x["case"].split()[:2] for x in vs] == [["kimi-k2-swigluoai", "T=1"], ["kimi-k2-swigluoai", "T=8"]]
    assert all(x["value"] == pytest.approx(1.2) and x["met"] for x in vs)


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_device_checkpoints_hold_valid_finite_codes_of_their_scheme(scheme):
    """The benchmarks' model-size checkpoints are drawn in checkpoint layout without the reference
    quantizer: every code must be a finite code of the scheme's own format (MXFP6 once got 8-bit E4M3
    codes, out of range for E2M3/E3M2)."""
    ckpt = device_checkpoint(CPU_SHAPE, scheme, "cpu")
    check_checkpoint(ckpt)
    for w in (ckpt.w13, ckpt.w2):
        assert bool(torch.isfinite(dequantize_weight(w, ckpt.scheme.weight, ckpt)).all())


def test_occupancy_is_the_tightest_budget_as_nsight_compute_counted_it():
    """harness.bench.diagnosis.occupancy against the H200's Nsight Compute report of triton_bitplace's GEMM1
    (results/gpu-issue15-bitplace/run-ae6f326/ncu.txt: 125 registers, 42.5 KB of shared memory, 4 warps ->
    'Block Limit Registers 4') and GEMM2 (84 registers -> 5), and a shared-memory-bound bf16 tile."""
    from harness.bench.diagnosis import occupancy

    assert occupancy(125, 42496, 4) == dict(programs_per_sm=4, warps_per_sm=16, limited_by="registers")
    assert occupancy(84, 42496, 4)["programs_per_sm"] == 5
    assert occupancy(72, 61440, 4) == dict(programs_per_sm=3, warps_per_sm=12, limited_by="shared_memory")
    assert occupancy(16, 0, 32) == dict(programs_per_sm=2, warps_per_sm=64, limited_by="warps")


def test_a_missed_target_says_what_else_its_row_measured():
    """targets.md's last column: for a miss, the candidate row's kernel times, occupancy and bytes; for a hit,
    nothing; a failed diagnosis is said, not hidden."""
    gemm1 = dict(regs=125, shared_kb=41.5, programs_per_sm=4, limited_by="registers", waves=2.9)
    row = dict(model="gpt-oss-120b", scheme="w_mxfp4", tokens=8, backend="triton_bitplace", us=230.0, pct_copy=34.0,
               pct_dense=0.9, weight_bytes=331e6, gemm_kernels_us=154.0, other_kernels_us=40.0, gemm1=gemm1)
    fast = dict(row, tokens=64, pct_copy=80.0, us=700.0)
    broken = dict(row, tokens=1, pct_copy=10.0, diagnosis_error="RuntimeError: no profiler")
    t = {x["case"]: x for x in evaluate_targets([row, fast, broken], {}) if x["target"].startswith("MXFP4 W4A16")}
    miss = t["gpt-oss-120b T=8 (triton_bitplace)"]
    assert not miss["met"] and "GEMM kernels 154 us + other kernels 40 us of 230 us" in miss["why"]
    assert "125 regs" in miss["why"] and "4 programs/SM (registers)" in miss["why"] and "331 MB" in miss["why"]
    assert t["gpt-oss-120b T=64 (triton_bitplace)"]["why"] == ""
    assert "diagnosis failed: RuntimeError: no profiler" in t["gpt-oss-120b T=1 (triton_bitplace)"]["why"]
    assert "| 125 regs" not in format_targets([miss]) and "GEMM1 125 regs" in format_targets([miss])


def test_the_k_loop_is_the_innermost_backward_branch_holding_tensor_core_instructions():
    """diagnosis.k_loop on a hand-written SASS listing: an outer loop (tile loop) around an inner one (K loop,
    with the HGMMA) and a loop without tensor-core work (an epilogue copy): the K loop is picked, whole."""
    from harness.bench.diagnosis import k_loop

    listing = [(0x00, "MOV R1, c[0x0][0x28]"), (0x10, "LDG.E.128 R4, desc[UR4][R2.64]"),  # outer loop head
               (0x20, "LOP3.LUT R8, R4, 0xf, RZ, 0xc0, !PT"), (0x30, "HGMMA.64x16x16.F32.BF16 R24, R8, gdesc[UR4]"),
               (0x40, "ISETP.GE.AND P0, PT, R9, R10, PT"), (0x50, "@!P0 BRA `(.L_x_1)"),  # inner: 0x10..0x50
               (0x60, "FMUL R24, R24, R30"), (0x70, "@P1 BRA `(.L_x_0)"),  # outer: 0x00..0x70
               (0x80, "STG.E.U16 desc[UR4][R2.64], R24"), (0x90, "@P2 BRA `(.L_x_2)")]  # store loop, no MMA
    labels = {".L_x_0": 0x00, ".L_x_1": 0x10, ".L_x_2": 0x80}
    assert k_loop(listing, labels) == [ins for addr, ins in listing if 0x10 <= addr <= 0x50]
    with pytest.raises(RuntimeError, match="no loop with tensor-core"):
        k_loop(listing[-2:], labels)
    # a warp-specialised kernel: its partition loop holds one K step (a tail) and the epilogue's stores and is
    # shorter than the K loop (two steps an iteration): the K loop is the one without global stores
    ws = [(0x00, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2"), (0x10, "HGMMA.64x16x16.F32.BF16 R24, R8, gdesc[UR4]"),
          (0x20, "HMUL2.BF16_V2 R8, R8, R9"), (0x30, "HGMMA.64x16x16.F32.BF16 R24, R10, gdesc[UR6]"),
          (0x40, "LOP3.LUT R8, R4, 0xf, RZ, 0xc0, !PT"), (0x50, "@P0 BRA `(.L_x_3)"),  # K loop: 0x00..0x50
          (0x60, "BAR.SYNC.DEFER_BLOCKING 0x1"), (0x70, "HGMMA.64x16x16.F32.BF16 R24, R8, gdesc[UR4]"),
          (0x80, "STG.E desc[UR4][R2.64], R24"), (0x90, "@P1 BRA `(.L_x_4)")]  # partition loop: 0x60..0x90
    ws_labels = {".L_x_3": 0x00, ".L_x_4": 0x60}
    assert k_loop(ws, ws_labels) == [ins for addr, ins in ws if addr <= 0x50]


def test_weight_bytes_per_k_step_count_codes_and_block_scales_of_each_gated_tile():
    """The denominator of warp-instructions per byte: a 64x128 tile is 8 KB of FP4 codes, plus one E8M0 per 32
    (256 B) or one E4M3 per 16 (512 B) values; a gated GEMM1 reads the gate and the up tile per step."""
    from harness.bench.diagnosis import describe, weight_bytes_per_iteration

    assert weight_bytes_per_iteration("w_mxfp4", 64, 128, gated=False) == 4096 + 256
    assert weight_bytes_per_iteration("w_nvfp4_a_nvfp4", 64, 128, gated=True) == 2 * (4096 + 512)
    assert weight_bytes_per_iteration("bf16", 64, 64, gated=False) == 8192
    with pytest.raises(ValueError, match="w_fp8"):
        weight_bytes_per_iteration("w_fp8_a_fp8", 64, 128, gated=False)
    gemm1 = dict(regs=125, shared_kb=41.5, programs_per_sm=4, limited_by="registers", waves=2.9,
                 loop_instructions=460, warp_instructions_per_byte=460 * 4 / 8704)
    assert "K loop 460 SASS = 0.211 warp-instr/weight byte (budget 0.245)" in describe(dict(us=230.0, gemm1=gemm1))


def test_the_board_is_read_from_nvidia_smi_and_picked_by_torch_s_uuid():
    """anchors()['gpu']: which H200 a run had and its clocks (the same config measured 599-693 us across loans
    whose anchors agreed within 1%); the GPU that torch uses is picked from several by its uuid, else nothing."""
    from harness.bench.report import _board
    from harness.bench.timing import GPU_STATE_FIELDS, parse_gpu_state

    a = "GPU-1111-aaaa, 00000000:19:00.0, 580.159.04, 1980 MHz, 1980 MHz, 3201 MHz, 118.54 W, 700.00 W, 35, 0x0"
    b = "GPU-2222-bbbb, 00000000:3B:00.0, 580.159.04, 1755 MHz, 1980 MHz, 3201 MHz, 690.10 W, 700.00 W, 61, 0x4"
    assert len(a.split(",")) == len(GPU_STATE_FIELDS)
    assert parse_gpu_state(f"{a}\n{b}\n", uuid="2222-BBBB")["clocks.sm"] == "1755 MHz"
    assert parse_gpu_state(a)["uuid"] == "GPU-1111-aaaa"
    assert parse_gpu_state(f"{a}\n{b}") == {}  # two boards, no uuid to choose by: say nothing rather than guess
    assert parse_gpu_state("") == {} and parse_gpu_state("No devices were found") == {}
    line = _board(parse_gpu_state(b))
    assert "GPU-2222-bbbb" in line and "SM clock 1755 MHz (max 1980 MHz)" in line and "throttle reasons 0x4" in line
    assert _board({}) == ""


def test_every_gemm_kernel_we_launch_is_timed_as_a_gemm():
    """kernel_time_split's GEMM words against this project's launched kernels: the GEMMs and their split-K sums
    count as GEMM time, routing, quantizers and the top-k sum as the rest (run-8's targets.md had the Gluon decode
    GEMM under 'other kernels' until its name was in the list)."""
    from harness.backends.compile_check import LAUNCHED_KERNELS
    from harness.bench.diagnosis import GEMM_KERNEL_WORDS

    gemms = {"moe_gemm_kernel", "bitplace_partials_kernel", "splitk_epilogue_kernel", "splitk_topk_reduce_kernel"}
    timed = {name for name in LAUNCHED_KERNELS if any(word in name.lower() for word in GEMM_KERNEL_WORDS)}
    assert timed == gemms, (timed ^ gemms)


def test_warm_rounds_run_untimed_and_idle_rounds_start_after_a_pause(monkeypatch):
    """round_times_ms: warm_s runs the launch (after a flush each, as the timed ones) until that much of its GPU time
    has passed and discards those rounds; idle_s waits first (the board's clocks back at their boost)."""
    from harness.bench import median_ms, round_times_ms
    from harness.bench import timing

    order, slow = [], iter([5.0] * 4 + [1.0, 3.0, 2.0])  # 4 rounds of 5 ms warm it (20 ms >= 0.02 s), then 3 timed

    class FakeEvent:
        def __init__(self, enable_timing):
            pass

        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return order[-1]

    monkeypatch.setattr(timing.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(timing, "flush_l2", lambda: order.append("flush"))
    monkeypatch.setattr(timing, "has_gpu", lambda: True)
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(timing.time, "sleep", lambda s: order.append(f"idle {s}"))
    assert median_ms(lambda: order.append(next(slow)), rounds=3, warm_s=0.02) == 2.0
    assert order == ["flush", 5.0] * 4 + ["flush", 1.0, "flush", 3.0, "flush", 2.0]
    order.clear()
    assert round_times_ms(lambda: order.append(7.0), rounds=2, idle_s=1.5) == [7.0, 7.0]
    assert order == ["idle 1.5", "flush", 7.0, "flush", 7.0]


def test_rows_judged_against_the_dense_rate_take_the_lower_of_cold_and_sustained(monkeypatch, tmp_path):
    """An H200 runs a dense bf16 matmul at ~790 TFLOP/s cold and ~690 at its 700 W cap, where an FP4 prefill keeps
    ~1780 MHz and the matmul ~1550 (run-26's dense_states.log): the row and the dense matmul are each read cold
    (after an idle second, cold first) and sustained (after a second back to back), and a target judges the lower
    ratio; the row's time is the sustained one; table.md and a miss's line give both."""
    from harness.bench import DENSE_JUDGED_TOKENS, time_against_dense
    from harness.bench import timing

    assert DENSE_JUDGED_TOKENS == {8192}
    calls = []
    moe, dense = object(), object()
    ms = {(moe, "cold"): 4.0, (dense, "cold"): 1.0, (moe, "sustained"): 5.0, (dense, "sustained"): 1.25}

    def fake_median_ms(fn, rounds, warm_s=0.0, idle_s=0.0):
        regime = "sustained" if warm_s == timing.SUSTAIN_S and not idle_s else "cold" if idle_s == timing.IDLE_S \
            else "?"
        calls.append((fn is moe and "moe" or "dense", regime, rounds))
        return ms[(fn, regime)]

    monkeypatch.setattr(timing, "median_ms", fake_median_ms)
    # the row: twice the dense matmul's 1000 FLOPs in 4x its time cold, 5 / 1.25 = 4x sustained: 50% both ways
    got = time_against_dense(moe, 2000, 20, dense=(dense, 1000))
    assert calls == [("moe", "cold", timing.COLD_ROUNDS), ("dense", "cold", timing.COLD_ROUNDS),
                     ("moe", "sustained", 20), ("dense", "sustained", 20)]
    assert got["us"] == 5000.0 and got["pct_dense_cold"] == pytest.approx(50.0)
    assert got["pct_dense_sustained"] == pytest.approx(50.0)
    ms[(dense, "sustained")] = 2.0  # the matmul throttled more than the row: sustained 80%, cold 50% -> judged 50%
    got = time_against_dense(moe, 2000, 20, dense=(dense, 1000))
    assert got["pct_dense_sustained"] == pytest.approx(80.0) and got["pct_dense"] == pytest.approx(50.0)
    ms[(moe, "cold")] = 2.0  # and the other way round: cold 100%, sustained 80% -> 80%
    assert time_against_dense(moe, 2000, 20, dense=(dense, 1000))["pct_dense"] == pytest.approx(80.0)

    row = dict(model="gpt-oss-120b", scheme="bf16", tokens=8192, backend="triton_emulation", us=3500.0,
               pct_dense=55.0, pct_dense_cold=55.0, pct_dense_sustained=58.2, dense_cold_tflops=790.0,
               dense_sustained_tflops=690.0)
    miss = [x for x in evaluate_targets([row], {}) if "prefill" in x["target"]][0]
    assert not miss["met"] and miss["value"] == 55.0
    assert ("the row 55.0% of the dense bf16 matmul cold (790 TFLOP/s), 58.2% of it sustained (690 TFLOP/s)"
            in miss["why"])
    decode = {k: v for k, v in row.items() if not k.startswith(("pct_dense_", "dense_"))}
    decode.update(tokens=8, pct_dense=1.0, tb_s=2.0, pct_copy=50.0, tflops=5.0)
    write_bench_report([dict(row, tb_s=1.0, pct_copy=25.0, tflops=380.0), decode], dict(dense_bf16_tflops=790.0),
                       tmp_path)
    table = (tmp_path / "table.md").read_text()
    assert "| 380.0 | 55.0 (sustained 58.2, cold 55.0) |" in table and "| 5.0 | 1.0 |" in table


def test_a_prefill_k_step_s_issue_time_is_weighed_against_its_mma_time():
    """At prefill the tensor cores bound the time: NVFP4's K loop compiled for sm90 (Triton 3.6, 554 SASS, 4 warps, 64
    activation rows, gate and up tiles of 64 weight rows, 128-value K step) issues for 554 clocks against 512 of
    MMAs (64 x 128 x 128 bf16 multiply-adds at 2048 a clock: 989 TFLOP/s / 132 / 1.83 GHz = 4096 FLOP), 1.08; at 128
    rows 588 SASS against 1024, 0.57; FP8 MMAs go twice as fast. A missed prefill target shows it; a decode row (not
    judged by the tensor cores' rate) does not."""
    from harness.bench.diagnosis import describe, issue_over_mma

    assert issue_over_mma(554, 4, 64, 128, 128) == pytest.approx(554 / 512)
    assert issue_over_mma(588, 4, 128, 128, 128) == pytest.approx(588 / 1024)
    assert issue_over_mma(588, 4, 128, 128, 128, fp8=True) == pytest.approx(588 / 512)
    gemm1 = dict(regs=172, shared_kb=66.0, programs_per_sm=2, limited_by="registers", waves=98.2, loop_instructions=554,
                 warp_instructions_per_byte=0.240, issue_over_mma=554 / 512)
    row = dict(tokens=8192, us=5543.0, gemm1=gemm1, pct_dense_sustained=43.0, pct_dense_cold=38.0,
               dense_sustained_tflops=659.0, dense_cold_tflops=790.0)
    assert "K step issue / MMA time 1.08" in describe(row)
    decode = {k: v for k, v in row.items() if not k.startswith(("pct_dense_", "dense_"))}
    assert "issue / MMA" not in describe(decode)


def test_a_prefill_miss_says_how_near_its_weight_stream_is_to_the_copy_rate():
    """Kimi-K2's bf16 prefill at 8192 tokens moves 33.8 GB of weights (384 experts x 7168 x 6144 x 2 bytes): on an
    H100 (2.99 TB/s copy) that alone takes 11.3 ms, 89% of the 12.6 ms that 60% of a 761 TFLOP/s dense matmul allows
    for its 5.77 TFLOP. A dense-judged miss says so; a decode row (judged by the copy rate already) does not repeat it."""
    from harness.bench.diagnosis import describe

    row = dict(tokens=8192, us=16500.0, tb_s=2.05, pct_copy=68.6, pct_dense_sustained=46.0, pct_dense_cold=45.9,
               dense_sustained_tflops=700.0, dense_cold_tflops=761.0)
    assert "weights streamed at 2.05 TB/s = 69% of copy" in describe(row)
    decode = {k: v for k, v in row.items() if not k.startswith(("pct_dense_", "dense_"))}
    assert "streamed" not in describe(decode)


_CUT_SHORT_TESTS = '''
import time


def test_measured(bench_rows):
    bench_rows.append(dict(model="gpt-oss-120b", scheme="w_mxfp4", tokens=8, backend="triton_bitplace", us=150.0,
                           tb_s=2.3, pct_copy=77.0, tflops=1.0, pct_dense=0.1))


def test_never_ends(bench_rows):
    time.sleep(600)
'''


def test_a_bench_run_stopped_by_sigterm_still_writes_the_report_of_its_measured_rows(tmp_path):
    """A nightly step's time limit (`timeout`, a CI runner) ends make bench with SIGTERM: the session ends as on an
    interrupt, bench_rows' teardown writes table.md / targets.md / results.json from the rows measured, and each says
    the run was cut short (run-39: a make bench stopped at its 390 s limit left no table)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "test_cut.py").write_text(_CUT_SHORT_TESTS)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                             "-p", "conftest", "-p", "suites.bench.conftest", "--rootdir", str(root), "-c",
                             str(root / "pyproject.toml"), str(tmp_path / "test_cut.py"), "--bench-dir", str(out)],
                            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONPATH=str(root)))
    try:
        deadline = time.monotonic() + 240
        while not ((out / "rows.jsonl").exists() and (out / "rows.jsonl").read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-2000:]
            time.sleep(0.2)
        time.sleep(1.0)  # into the second test's sleep
        proc.send_signal(signal.SIGTERM)
        log = proc.communicate(timeout=120)[0].decode()
    finally:
        proc.kill()
    assert "_CutShort" in log, log[-2000:]
    table, targets = (out / "table.md").read_text(), (out / "targets.md").read_text()
    assert table.startswith("**Cut short** (SIGTERM) after 1 row:") and targets.startswith("**Cut short**")
    assert "| gpt-oss-120b | w_mxfp4 | 8 | triton_bitplace | 150.0 |" in table
    assert "gpt-oss-120b T=8 (triton_bitplace) | 77% | >= 75%" in targets
    assert json.loads((out / "results.json").read_text())["cut_short"] is True
