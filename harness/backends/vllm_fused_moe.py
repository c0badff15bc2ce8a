"""vllm_fused_moe@<release>: vLLM's own Triton fused MoE, as that release shipped it.

The kernels are the release's: `fused_moe_kernel` (and the Triton functions it calls) from
`model_executor/layers/fused_moe/fused_moe.py`, the FP8 activation quantizer `_per_token_group_quant_fp8` from
`quantization/utils/fp8_utils.py`, SWIGLUSTEP's `_swiglustep_and_mul_kernel` from `layers/activation.py`, and
the default tile configs (`get_default_config`, run with stubs saying: CUDA, not ROCm, not batch-invariant).
They are cut out of the pinned wheel (harness.third_party) without importing vllm. The host glue between
them is written here from vLLM's semantics (fused_experts_impl), because vLLM's own glue calls its compiled
CUDA extension (torch.ops._C), which cannot run without vLLM's build:
  moe_align_block_size  the (token, k) pairs sorted by expert, padded per expert to BLOCK_SIZE_M with the
                        sentinel T*k; one expert id per block. 0.33's naive block assignment (one pair per
                        block, when T*k*4 <= E) as _prepare_expert_assignment decides it.
  activations           the CUDA kernels' arithmetic: act_and_mul (silu/gelu/gelu_tanh) rounds the gate
                        function to bf16 before the multiply; swigluoai and situ evaluate in fp32 and round
                        once; the *_NO_MUL ops are torch ops on the bf16 cache.
  scaled_fp8_quant      static per-tensor: x * fl(1 / scale), clamped to +-448, to E4M3 (RNE).
  moe_sum               top_k 2-4: a running bf16 sum in top-k order (moe_sum_kernel); otherwise fp32, one
                        rounding (at::sum_out).
On the CPU the kernels run under the Triton interpreter, where a bf16 dot multiplies bit patterns and
fp32 -> bf16/fp8 conversion truncates: the kernels get exact fp32 copies of their operands and write fp32
(the same values), and the glue rounds them to bf16 / E4M3 with torch, RNE, as the compiled kernels' single
conversion does. Compiled (a GPU), everything runs in bf16 / FP8 as vLLM runs it, with its sm90 SWAP_AB choice.
"""

from __future__ import annotations

import dataclasses
import math
import types

import torch

from harness import third_party
from harness.backends.base import KnownFailure
from harness.backends.triton_kernels import INTERPRET
from harness.platforms import default_device, detect_platform, has_gpu, matrix_unit_truncation
from reference.checkpoints import MoECheckpoint
from reference.formats import E4M3FN
from reference.fp8 import Granularity
from reference.moe import check_moe_inputs, static_activation_scales

import triton.language as tl  # noqa: E402  (after harness.backends.triton_kernels set TRITON_INTERPRET)

__all__ = ["VllmFusedMoE", "RELEASES", "make_release_0_33_0", "make_release_0_13_0"]

_FUSED_MOE = "vllm/model_executor/layers/fused_moe/fused_moe.py"
_FP8_UTILS = "vllm/model_executor/layers/quantization/utils/fp8_utils.py"
_ACTIVATION = "vllm/model_executor/layers/activation.py"


@dataclasses.dataclass(frozen=True)
class Release:
    version: str
    source: str  # harness.third_party.SOURCES key
    # the activations its fused_experts_impl dispatches (0.33: activation.py _APPLY_MOE_ACTIVATIONS; 0.13: the
    # if-chain after the first GEMM); suites/test_vllm_fused_moe.py checks this list against the fetched source
    activations: frozenset[str]
    known_failures: tuple = ()


RELEASES = {
    r.version: r
    for r in (
        Release("0.33.0", "vllm-0.33.0", frozenset({
            "SILU", "GELU", "GELU_TANH", "SITU", "SWIGLUOAI", "SWIGLUSTEP",
            "SILU_NO_MUL", "GELU_NO_MUL", "GELU_TANH_NO_MUL", "RELU2_NO_MUL"})),
        Release("0.13.0", "vllm-0.13.0", frozenset({
            "SILU", "GELU", "SWIGLUOAI", "SILU_NO_MUL", "GELU_NO_MUL", "RELU2_NO_MUL"}), (
            KnownFailure(None, "fused_moe_kernel adds the bias to the fp32 accumulator before multiplying it by the "
                               "per-tensor FP8 scales a_scale * b_scale: the bias is scaled as if it were quantized",
                         "vLLM PR 31676 (merged 2026-01-07, first released in 0.14.0)",
                         schemes=("w_fp8_a_fp8",), biased=True),)),
    )
}

_SCHEMES = {"bf16": None, "w_fp8_a_fp8": "fp8_w8a8", "w_fp8_a_fp8_block": "fp8_w8a8"}


class _Platform:
    """current_platform as get_default_config / enable_swap_ab ask it: CUDA (or the interpreter), never ROCm."""

    @staticmethod
    def is_rocm():
        return False

    @staticmethod
    def is_cuda():
        return True

    @staticmethod
    def is_device_capability(cap):
        return has_gpu() and torch.cuda.get_device_capability()[0] * 10 + torch.cuda.get_device_capability()[1] == cap

    @staticmethod
    def is_xpu():
        return False


def _next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _not_here(*_a, **_k):
    raise NotImplementedError("the WNA16 paths are not part of this adapter")


_HOST_FACTS = dict(envs=types.SimpleNamespace(VLLM_BATCH_INVARIANT=False), vllm_is_batch_invariant=lambda: False,
                   current_platform=_Platform(), next_power_of_2=_next_power_of_2,
                   should_moe_wna16_use_cuda=_not_here)


@dataclasses.dataclass
class _Prepared:
    ckpt: MoECheckpoint
    w13: torch.Tensor  # [E, N13, H]: bf16 / FP8 on a GPU, exact fp32 values under the interpreter
    w2: torch.Tensor
    s13: torch.Tensor | None  # FP8 weight scales as vLLM holds them: [E] per tensor, [E, N/128, K/128] blocks
    s2: torch.Tensor | None
    b13: torch.Tensor | None
    b2: torch.Tensor | None
    a1_scale: torch.Tensor | None  # static per-tensor input scales (max over experts, as vLLM loads them)
    a2_scale: torch.Tensor | None


class VllmFusedMoE:
    """One vLLM release's fused MoE; see the module docstring."""

    numerical_structure = "vllm_triton"
    # tl.dot gets bf16 activations and weights or per-tensor FP8 codes, all exact, and a per-tensor FP8 scale
    # multiplies the fp32 accumulator: the default operand_dtype (float32). Declaring bfloat16 for every scheme (as
    # before issue 24) let the bound allow a bf16 rounding of every dequantized FP8 operand (2^-7 sum|w||a|): wide
    # enough to hide 0.13.0's bias bug on 5 of its 6 biased cases at the GPU shape. Block FP8 keeps bfloat16: its
    # cases differ from the float32-operand bound by up to 11 ulp (kernel nearer the exact value; not yet traced).
    operand_dtype = {"w_fp8_a_fp8_block": torch.bfloat16}

    def __init__(self, version: str):
        self.release = RELEASES[version]
        self.name = f"vllm_fused_moe@{version}"
        self.known_failures = self.release.known_failures
        # a release kept for its known failure is the newest one's kernel but for that bug: under the ci profile
        # it runs the explicit cases (which hold the record) and not the breadth tests (shape classes, sharding)
        self.ci_breadth = not self.known_failures
        self.device = default_device()
        self._kernels = None
        # compiled, the FP8 schemes' tl.dot runs on the GPU's FP8 matrix units, whose accumulation is the
        # platform's measured fact (harness.platforms); under the interpreter it is exact fp32
        fp8_acc = 0.0 if INTERPRET else detect_platform().fp8_mma_accumulation_error
        self.accumulation_error = {s: fp8_acc for s, kind in _SCHEMES.items() if kind == "fp8_w8a8"}
        # and the others' on its bf16 matrix units, which truncate (harness.platforms)
        self.accumulation_truncation = matrix_unit_truncation("cpu" if INTERPRET else self.device)

    # ---- what it computes ------------------------------------------------------------------------
    def supports(self, problem, platform) -> tuple[bool, str]:
        scheme = problem.scheme
        if scheme.name not in _SCHEMES:
            return False, (f"vLLM's Triton fused_moe_kernel path covers {sorted(_SCHEMES)} (MX/NVFP4 go to other "
                           "experts classes)")
        if problem.activation.name not in self.release.activations:
            return False, f"vLLM {self.release.version}'s fused_experts_impl has no {problem.activation.name} activation"
        if problem.activation.limit is not None and problem.activation.formula == "SILU":
            return False, "silu with a clamp limit runs silu_and_mul_with_clamp, not modelled by this adapter"
        if scheme.weight is not None and platform.fp8_format is not E4M3FN:
            return False, (f"{platform.name}'s {platform.fp8_format.name}: vLLM's ROCm FP8 path (fnuz, scales doubled "
                           "on load) is not modelled by this adapter")
        return True, f"vLLM {self.release.version} fused_moe_kernel ({_SCHEMES[scheme.name] or 'bf16'})"

    def available(self, platform) -> tuple[bool, str]:
        missing = third_party.missing_reason(self.release.source)
        if missing:
            return False, missing
        if platform.is_gpu and platform is not detect_platform():
            return False, f"compiled for this machine's {detect_platform().name}, not {platform.name}"
        return True, ""

    # ---- the release's code ----------------------------------------------------------------------
    def kernels(self):
        if self._kernels is None:
            src = self.release.source
            moe = third_party.load_triton_functions(src, _FUSED_MOE, ("fused_moe_kernel",))
            quant = third_party.load_triton_functions(src, _FP8_UTILS, ("_per_token_group_quant_fp8",))
            host = third_party.load_host_functions(src, _FUSED_MOE, ("get_default_config",), _HOST_FACTS)
            step = None
            if "SWIGLUSTEP" in self.release.activations:
                step = third_party.load_triton_functions(src, _ACTIVATION, ("_swiglustep_and_mul_kernel",))
            self._kernels = types.SimpleNamespace(moe=moe.fused_moe_kernel, group_quant=quant._per_token_group_quant_fp8,
                                                  default_config=host.get_default_config,
                                                  swiglustep=step and step._swiglustep_and_mul_kernel)
        return self._kernels

    # ---- checkpoint layout -> vLLM's ----------------------------------------------------------------
    def prepare(self, ckpt: MoECheckpoint) -> _Prepared:
        dev, wq = self.device, ckpt.scheme.weight

        def weight(w):
            if wq is None:
                return w.data.to(dev).float().contiguous() if INTERPRET else w.data.to(dev).contiguous()
            if INTERPRET:
                return E4M3FN.values_fp32[w.data.long()].contiguous()
            return w.data.to(dev).view(torch.float8_e4m3fn).contiguous()

        def scale(w):
            if wq is None:
                return None
            if wq.granularity is Granularity.PER_TENSOR:
                return w.scale.reshape(-1).float().to(dev).contiguous()
            return w.scale.float().to(dev).contiguous()

        a1, a2 = static_activation_scales(ckpt)
        f32 = lambda t: None if t is None else t.float().reshape(-1).to(dev).contiguous()  # noqa: E731
        bias = lambda t: None if t is None else t.float().to(dev).contiguous()  # noqa: E731
        self.kernels()
        return _Prepared(ckpt, weight(ckpt.w13), weight(ckpt.w2), scale(ckpt.w13), scale(ckpt.w2), bias(ckpt.b13),
                         bias(ckpt.b2), f32(a1), f32(a2))

    # ---- fused_experts_impl ------------------------------------------------------------------------
    def forward(self, prep: _Prepared, hidden_states, topk_weights, topk_ids) -> torch.Tensor:
        ckpt = prep.ckpt
        check_moe_inputs(hidden_states.cpu(), ckpt, topk_weights.cpu(), topk_ids.cpu())
        dev = self.device
        x = hidden_states.to(dev).contiguous()
        t, k = topk_ids.shape
        if t == 0:  # vLLM's callers never launch an empty batch; the grid would be empty
            return torch.empty_like(x)
        w = topk_weights.to(dev).float().contiguous()
        ids = topk_ids.to(dev).to(torch.int32).contiguous()
        e, n13, hsz = prep.w13.shape
        scheme = ckpt.scheme
        dtype = _SCHEMES[scheme.name]
        block = [128, 128] if scheme.name == "w_fp8_a_fp8_block" else None
        config = self.kernels().default_config(t, e, prep.w2.shape[2], hsz, k, dtype, block)

        a1, a1_scale = self._quantize_input(x, prep.a1_scale, scheme)
        sorted_ids, expert_ids, padded = self._assign(ids, config["BLOCK_SIZE_M"], e, t, k)
        cache1 = self._gemm(a1, prep.w13, a1_scale, prep.s13, prep.b13, w, sorted_ids, expert_ids, padded,
                            False, k, config, dtype, block, rows=t * k)
        cache2 = self._activation(cache1.view(t * k, n13), ckpt.activation)
        a2, a2_scale = self._quantize_input(cache2, prep.a2_scale, scheme)
        cache3 = self._gemm(a2, prep.w2, a2_scale, prep.s2, prep.b2, w, sorted_ids, expert_ids, padded,
                            True, 1, config, dtype, block, rows=t * k)
        return self._moe_sum(cache3.view(t, k, hsz))

    def _assign(self, ids, block_m: int, e: int, t: int, k: int):
        """(sorted_token_ids or None, expert_ids, num_tokens_post_padded) as vLLM's moe_align_block_size (or,
        from 0.33 on, _prepare_expert_assignment's naive one-pair-per-block path) returns them."""
        numel = t * k
        flat = ids.reshape(-1).long()
        if "naive_block_assignment" in self.kernels().moe.arg_names and numel * 4 <= e:
            return None, flat.to(torch.int32), torch.tensor([numel * block_m], dtype=torch.int32, device=ids.device)
        counts = torch.bincount(flat, minlength=e)
        padded_counts = (counts + block_m - 1) // block_m * block_m
        total = int(padded_counts.sum())
        capacity = numel + e * (block_m - 1)
        sorted_ids = torch.full((capacity,), numel, dtype=torch.int32, device=ids.device)
        order = torch.sort(flat, stable=True).indices  # pairs grouped by expert, in index order
        starts = torch.cumsum(padded_counts, 0) - padded_counts
        rank = torch.arange(numel, device=ids.device) - (torch.cumsum(counts, 0) - counts)[flat[order]]
        sorted_ids[starts[flat[order]] + rank] = order.to(torch.int32)
        expert_ids = torch.zeros(math.ceil(capacity / block_m), dtype=torch.int32, device=ids.device)
        expert_ids[: total // block_m] = torch.repeat_interleave(torch.arange(e, device=ids.device), padded_counts // block_m).to(torch.int32)
        return sorted_ids, expert_ids, torch.tensor([total], dtype=torch.int32, device=ids.device)

    def _gemm(self, a, b, a_scale, b_scale, bias, topk_weights, sorted_ids, expert_ids, padded, mul_routed_weight,
              top_k, config, dtype, block, rows):
        """invoke_fused_moe_triton_kernel: C [rows, N] of the release's fused_moe_kernel."""
        kern = self.kernels().moe
        n, kdim = b.shape[1], b.shape[2]
        out_dtype = torch.float32 if INTERPRET else torch.bfloat16
        c = torch.empty(rows, n, dtype=out_dtype, device=a.device)
        config = dict(config)
        block_k = config.pop("BLOCK_SIZE_K")
        if block is not None:
            block_k = min(block_k, block[0], block[1])
        m = a.shape[0]
        if sorted_ids is not None:
            em = sorted_ids.shape[0]
            if m < config["BLOCK_SIZE_M"]:
                em = min(em, m * top_k * config["BLOCK_SIZE_M"])
        else:
            em = m * top_k * config["BLOCK_SIZE_M"]
        use_fp8 = dtype == "fp8_w8a8"
        swap_ab = use_fp8 and not INTERPRET and _Platform.is_device_capability(90) and (
            config["BLOCK_SIZE_M"] < 64 and config["BLOCK_SIZE_N"] >= 64)
        if a_scale is not None and a_scale.ndim == 0:
            a_scale = a_scale.reshape(1)
        args = dict(
            a_ptr=a, b_ptr=b, c_ptr=c, b_bias_ptr=bias, a_scale_ptr=a_scale, b_scale_ptr=b_scale,
            topk_weights_ptr=topk_weights, sorted_token_ids_ptr=sorted_ids, expert_ids_ptr=expert_ids,
            num_tokens_post_padded_ptr=padded, N=n, K=kdim, EM=em, num_valid_tokens=m * top_k,
            stride_am=a.stride(0), stride_ak=a.stride(1), stride_be=b.stride(0), stride_bk=b.stride(2),
            stride_bn=b.stride(1), stride_cm=c.stride(0), stride_cn=c.stride(1),
            stride_asm=a_scale.stride(0) if a_scale is not None and a_scale.ndim == 2 else 0,
            stride_ask=a_scale.stride(1) if a_scale is not None and a_scale.ndim == 2 else 0,
            stride_bse=b_scale.stride(0) if b_scale is not None else 0,
            stride_bsk=b_scale.stride(2) if b_scale is not None and b_scale.ndim == 3 else 0,
            stride_bsn=b_scale.stride(1) if b_scale is not None and b_scale.ndim >= 2 and b_scale.size(1) > 1 else 0,
            stride_bbe=bias.stride(0) if bias is not None else 0, stride_bbn=bias.stride(1) if bias is not None else 0,
            group_n=0 if block is None else block[0], group_k=0 if block is None else block[1],
            naive_block_assignment=sorted_ids is None, MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k,
            compute_type=tl.float32 if INTERPRET else tl.bfloat16, use_fp8_w8a8=use_fp8, use_int8_w8a8=False,
            use_int8_w8a16=False, per_channel_quant=False, HAS_BIAS=bias is not None, SWAP_AB=swap_ab, USE_TD=False,
            **{**config, "SPLIT_K": 1, "BLOCK_SIZE_K": block_k},
        )
        known = set(kern.arg_names) | {"num_warps", "num_stages"}
        grid = (triton_cdiv(em, config["BLOCK_SIZE_M"]) * triton_cdiv(n, config["BLOCK_SIZE_N"]),)
        kern[grid](**{key: v for key, v in args.items() if key in known})
        return c.to(torch.bfloat16) if INTERPRET else c  # the kernel's one accumulator.to(bf16), RNE

    def _quantize_input(self, x, static_scale, scheme):
        """moe_kernel_quantize_input: (A for the GEMM, its scale)."""
        if scheme.act is None:
            return (x.float() if INTERPRET else x), None
        if scheme.act.granularity is Granularity.PER_TENSOR:  # scaled_fp8_quant with a static scale
            q = (x.float() * (1.0 / static_scale)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
            return (q.float() if INTERPRET else q), static_scale
        # per_token_group_quant_fp8, group 128: the release's own Triton kernel
        m, kdim = x.shape
        y = x.float().contiguous() if INTERPRET else x.contiguous()
        q = torch.empty(m, kdim, dtype=torch.float32 if INTERPRET else torch.float8_e4m3fn, device=x.device)
        s = torch.empty(m, kdim // 128, dtype=torch.float32, device=x.device)
        if m:
            self.kernels().group_quant[(m * (kdim // 128),)](y, q, s, 128, kdim, y.stride(0), 1e-10, fp8_min=-448.0,
                                                             fp8_max=448.0, use_ue8m0=False, BLOCK=128)
        if INTERPRET:  # the kernel's .to(float8_e4m3fn): RNE of the clamped quotient, exactly representable
            q = q.to(torch.float8_e4m3fn).float()
        return q, s

    def _activation(self, h, act):
        """apply_moe_activation on the bf16 GEMM1 cache [P, N13] -> bf16 [P, N13/2] (or [P, N13])."""
        f = h.float()
        name = act.name
        bf16 = lambda v: v.to(torch.bfloat16)  # noqa: E731
        if not act.gated:  # torch ops on the bf16 cache: fp32 inside, one rounding
            if name == "RELU2_NO_MUL":
                return bf16(torch.square(torch.relu(f)))
            fn = {"SILU_NO_MUL": torch.nn.functional.silu, "GELU_NO_MUL": torch.nn.functional.gelu,
                  "GELU_TANH_NO_MUL": lambda v: torch.nn.functional.gelu(v, approximate="tanh")}[name]
            return bf16(fn(f))
        d = f.shape[1] // 2
        if name == "SWIGLUOAI":  # swigluoai_and_mul: interleaved, fp32, one rounding
            g = torch.clamp(f[:, 0::2], max=act.limit)
            u = torch.clamp(f[:, 1::2], -act.limit, act.limit)
            return bf16((u + 1.0) * g / (1.0 + torch.exp(-g * act.alpha)))
        g, u = f[:, :d], f[:, d:]
        if name == "SITU":  # situ_and_mul_kernel: fp32, one rounding
            up = act.beta_lin * torch.tanh(u * (1.0 / act.beta_lin)) if act.beta_lin > 0 else u
            return bf16(act.beta * torch.tanh(g * (1.0 / act.beta)) / (1.0 + torch.exp(-g)) * up)
        if name == "SWIGLUSTEP":  # the release's own Triton kernel (fp32 i/o under the interpreter)
            src = f.contiguous() if INTERPRET else h.contiguous()
            out = torch.empty(h.shape[0], d, dtype=src.dtype, device=h.device)
            if h.shape[0]:
                self.kernels().swiglustep[(h.shape[0], triton_cdiv(d, 1024))](out, out.stride(0), src, src.stride(0),
                                                                             limit=act.limit, d=d, BLOCK_SIZE=1024)
            return bf16(out) if INTERPRET else out
        # act_and_mul: ACT_FN returns bf16, then * up in fp32, rounded again
        gate = {"SILU": lambda v: v / (1.0 + torch.exp(-v)),
                "GELU": lambda v: v * 0.5 * (1.0 + torch.erf(v * (1.0 / math.sqrt(2.0)))),
                "GELU_TANH": lambda v: 0.5 * v * (1.0 + torch.tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))}[name]
        return bf16(bf16(gate(g)).float() * u)

    @staticmethod
    def _moe_sum(cache3):
        """ops.moe_sum: moe_sum_kernel<TOPK> for top_k 2-4 (bf16 running sum), at::sum_out otherwise."""
        k = cache3.shape[1]
        if 2 <= k <= 4:
            acc = cache3[:, 0]
            for j in range(1, k):
                acc = (acc.float() + cache3[:, j].float()).to(torch.bfloat16)
            return acc
        return cache3.float().sum(1).to(torch.bfloat16)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def make_release_0_33_0() -> VllmFusedMoE:
    return VllmFusedMoE("0.33.0")


def make_release_0_13_0() -> VllmFusedMoE:
    return VllmFusedMoE("0.13.0")
