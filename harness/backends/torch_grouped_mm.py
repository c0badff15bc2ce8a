"""PyTorch's grouped GEMMs as MoE backends (kernels we did not write: CUTLASS grouped GEMMs inside torch):

  torch_grouped_mm         bf16 MoE, both GEMMs through torch._grouped_mm (on sm90 a CUTLASS grouped GEMM;
                           on the CPU torch's own fallback, which is what make test runs)
  torch_scaled_grouped_mm  w_fp8_a_fp8 through torch._scaled_grouped_mm (sm90 FP8 tensor cores, rowwise
                           activation scales, per-expert per-column weight scales)

What a serving engine writes around such GEMMs is written here in torch: the (token, expert) pairs sorted by
expert into contiguous groups (each group padded with zero rows to `row_alignment`, and those rows dropped
again), the activation between the GEMMs, the FP8 quantization of the activations, and the weighted top-k
sum. Their numerical structure ("rounded_terms"): each GEMM rounds its fp32 accumulator (scales applied
first) to bf16 once; the activation is evaluated in fp32 on that bf16 output and rounded once to bf16; the
router weight multiplies the rounded GEMM2 row in fp32 and the k terms are summed in fp32, one rounding at the
output. Static FP8 activation scales are applied as x / scale and expanded exactly to the per-row vector the
kernel takes (every row the same scale); per-expert weight scales to one per output column. Expert biases are
declined: the grouped GEMMs have no fp32 bias epilogue, and adding a bias after the bf16 rounding would be
another structure."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.platforms import PLATFORMS, default_device, detect_platform, has_gpu, matrix_unit_truncation
from reference.activations import apply_activation
from reference.checkpoints import MoECheckpoint
from reference.fp8 import Granularity
from reference.moe import check_moe_inputs, static_activation_scales
from reference.structure import STRUCTURES

__all__ = ["GroupedRows", "group_rows", "TorchGroupedMMBackend", "TorchScaledGroupedMMBackend",
           "make_bf16_backend", "make_fp8_backend"]

_TORCH_FP8 = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}


@dataclass(frozen=True)
class GroupedRows:
    """The (token, k) pairs laid out as one contiguous group of rows per expert, in expert order.

    source[r]  the pair (t * top_k + j) that row r holds, or -1 for a padding row (group padding, and the
               spare rows after the last group: the row count is fixed by T, k, E and the alignment so that
               no host sync is needed and the launch can be captured in a CUDA graph)
    offsets    int32 [E]: the end row of each expert's group (the grouped GEMMs' `offs`); an expert with
               no pairs has an empty group (offsets[e] == offsets[e - 1]); rows past offsets[-1] are spare
    """

    source: torch.Tensor
    offsets: torch.Tensor

    @property
    def rows(self) -> int:
        return self.source.numel()

    @property
    def real(self) -> torch.Tensor:
        return self.source >= 0


def group_rows(topk_ids: torch.Tensor, num_experts: int, row_alignment: int = 1) -> GroupedRows:
    """Sort pairs by expert (stable: within an expert, in (token, k) order) and pad each expert's group with
    padding rows up to a multiple of row_alignment. Device ops only, no host sync."""
    if row_alignment < 1:
        raise ValueError(f"row_alignment must be >= 1, got {row_alignment}")
    flat = topk_ids.reshape(-1).long()
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + row_alignment - 1) // row_alignment * row_alignment
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    # the i-th pair of expert e goes to row starts[e] + i
    rank = torch.arange(flat.numel(), device=flat.device) - (torch.cumsum(counts, 0) - counts)[flat[order]]
    # at most row_alignment - 1 padding rows per expert
    source = torch.full((flat.numel() + num_experts * (row_alignment - 1),), -1, dtype=torch.long, device=flat.device)
    source[starts[flat[order]] + rank] = order
    return GroupedRows(source, ends.to(torch.int32))


def _gather(x: torch.Tensor, groups: GroupedRows, top_k: int) -> torch.Tensor:
    """Row r = the token of pair source[r]; padding rows are zero."""
    token = torch.where(groups.real, groups.source // top_k, 0)
    return torch.where(groups.real[:, None], x[token], torch.zeros((), dtype=x.dtype, device=x.device))


def _weighted_topk_sum(z_rows: torch.Tensor, groups: GroupedRows, topk_weights: torch.Tensor) -> torch.Tensor:
    """The rounded GEMM2 rows back to their pairs, times the router weight in fp32, summed over k in fp32
    (in k order), rounded once to bf16."""
    t, k = topk_weights.shape
    # padding and spare rows all land in one extra row that is dropped (no boolean indexing: no host sync)
    z = torch.empty(t * k + 1, z_rows.shape[1], dtype=torch.float32, device=z_rows.device)
    z.index_copy_(0, torch.where(groups.real, groups.source, t * k), z_rows.float())
    zk = z[: t * k].view(t, k, z.shape[1])
    out = torch.zeros(t, z.shape[1], dtype=torch.float32, device=z.device)
    for j in range(k):
        out += topk_weights[:, j : j + 1].float() * zk[:, j]
    return out.to(torch.bfloat16)


class _GroupedMoE:
    """The MoE around two grouped GEMMs; subclasses say how a GEMM is called and what it accepts."""

    numerical_structure = STRUCTURES["rounded_terms"]
    row_alignment = 1  # pad each expert's group of rows to a multiple of this

    def __init__(self, device: str | None = None):
        self.device = device or default_device()

    def _common_supports(self, problem) -> tuple[bool, str]:
        if problem.has_bias:
            return False, ("no fp32 bias epilogue in torch's grouped GEMMs (a bias added after the bf16 rounding "
                           "is another structure)")
        return True, ""

    def forward(self, prep, hidden_states, topk_weights, topk_ids):
        check_moe_inputs(hidden_states.cpu(), prep["ckpt"], topk_weights.cpu(), topk_ids.cpu())
        return self.launch(prep, hidden_states, topk_weights, topk_ids)

    def launch(self, prep, hidden_states, topk_weights, topk_ids):
        """forward() without the input checks: device work only (the benchmark captures it in a CUDA graph)."""
        ckpt = prep["ckpt"]
        groups = group_rows(topk_ids, ckpt.num_experts, self.row_alignment)
        a1 = _gather(hidden_states, groups, topk_ids.shape[1])
        h = self._gemm(prep, "w13", a1, groups)  # bf16 [rows, 2I]
        y = apply_activation(h.float(), ckpt.activation).to(torch.bfloat16)
        z = self._gemm(prep, "w2", y, groups)  # bf16 [rows, H]
        return _weighted_topk_sum(z, groups, topk_weights)


class TorchGroupedMMBackend(_GroupedMoE):
    name = "torch_grouped_mm"
    operand_dtype = torch.bfloat16  # bf16 operands, fp32 accumulation

    @property
    def accumulation_truncation(self) -> float:  # on the GPU's bf16 matrix units, which truncate (harness.platforms)
        return matrix_unit_truncation(self.device)

    def supports(self, problem, platform) -> tuple[bool, str]:
        if problem.scheme.weight is not None or problem.scheme.act is not None:
            return False, "torch._grouped_mm is the bf16 MoE (scheme bf16); quantized schemes are not its"
        return self._common_supports(problem)

    def available(self, platform) -> tuple[bool, str]:
        if not hasattr(torch, "_grouped_mm"):
            return False, f"torch {torch.__version__} has no torch._grouped_mm"
        return True, ""

    def prepare(self, ckpt: MoECheckpoint):
        dev = self.device
        # [E, N, K] row-major, passed as the [E, K, N] view the grouped GEMM multiplies by (K-major)
        return dict(ckpt=ckpt, w13=ckpt.w13.data.to(dev).transpose(-2, -1), w2=ckpt.w2.data.to(dev).transpose(-2, -1))

    @staticmethod
    def _gemm(prep, name, a, groups):
        return torch._grouped_mm(a.to(torch.bfloat16), prep[name], offs=groups.offsets.to(a.device))


class TorchScaledGroupedMMBackend(_GroupedMoE):
    name = "torch_scaled_grouped_mm"
    operand_dtype = torch.float32  # FP8 codes are the operands; the scales multiply fp32 results
    # the same Hopper FP8 tensor cores as torch_fp8 (harness.platforms: a narrow adder per k-chunk, promoted to fp32)
    accumulation_error = PLATFORMS["sm90"].fp8_mma_accumulation_error
    intermediate_multiple = 16  # FP8 GEMM dims must be multiples of 16 (a TP share of I is padded to it)

    def __init__(self, device: str | None = None, scaled_grouped_mm=None, row_alignment: int = 1):
        super().__init__(device)
        # groups need no alignment on the H200 (tools/probe_grouped_mm.py: ragged offsets run); engines that
        # pad groups to 16 rows are exercised on the CPU (row_alignment=16: padding must change nothing)
        self.row_alignment = row_alignment
        # the GEMM as data: torch's on a GPU; the CPU tests pass an fp32 emulation of it to check the glue
        self.scaled_grouped_mm = scaled_grouped_mm or getattr(torch, "_scaled_grouped_mm", None)

    def supports(self, problem, platform) -> tuple[bool, str]:
        if "fp8" not in platform.native_formats:
            return False, f"{platform.name} has no FP8 matrix units"
        if platform.fp8_format.name != "e4m3fn":
            return False, f"torch._scaled_grouped_mm takes float8_e4m3fn; {platform.name} uses {platform.fp8_format.name}"
        w = problem.scheme.weight
        if problem.scheme.name != "w_fp8_a_fp8" or w.granularity is not Granularity.PER_TENSOR:
            return False, ("torch._scaled_grouped_mm takes rowwise scales: w_fp8_a_fp8 (per-tensor static scales, "
                           "expanded exactly) only")
        if problem.hidden_size % 16 or problem.intermediate_size % 16:
            return False, (f"torch._scaled_grouped_mm wants H and I multiples of 16 (the H200 refused 72), got "
                           f"H={problem.hidden_size}, I={problem.intermediate_size}")
        return self._common_supports(problem)

    def available(self, platform) -> tuple[bool, str]:
        if self.scaled_grouped_mm is None:
            return False, f"torch {torch.__version__} has no torch._scaled_grouped_mm"
        if self.scaled_grouped_mm is getattr(torch, "_scaled_grouped_mm", None):
            if not has_gpu():
                return False, "torch._scaled_grouped_mm runs on CUDA FP8 tensor cores only; no GPU here"
            here = detect_platform()
            if here.name != platform.name:
                return False, f"this GPU is {here.name}, not {platform.name}"
        return True, ""

    def prepare(self, ckpt: MoECheckpoint):
        dev = self.device
        dt = _TORCH_FP8[ckpt.fp8_format.name]
        a1_scale, a2_scale = static_activation_scales(ckpt)
        prep = dict(ckpt=ckpt, dtype=dt, fmax=ckpt.fp8_format.max_normal,
                    a_scale=dict(w13=a1_scale.float().to(dev).reshape(()), w2=a2_scale.float().to(dev).reshape(())))
        for name in ("w13", "w2"):
            w = getattr(ckpt, name)
            e, n, _ = w.data.shape
            prep[name] = w.data.to(dev).view(dt).transpose(-2, -1)  # [E, K, N], column-major as FP8 wants
            # one per-expert scale -> the same value in each of the expert's N columns (exact: a copy)
            prep[f"{name}_scale"] = w.scale.float().to(dev).reshape(e, 1).expand(e, n).contiguous()
        return prep

    def _gemm(self, prep, name, a, groups):
        s = prep["a_scale"][name]
        a8 = (a.float() / s).clamp(-prep["fmax"], prep["fmax"]).to(prep["dtype"])
        scale_a = s.expand(a8.shape[0]).contiguous()  # the static scale in every row
        return self.scaled_grouped_mm(a8, prep[name], scale_a, prep[f"{name}_scale"],
                                      offs=groups.offsets.to(a.device), out_dtype=torch.bfloat16)


def make_bf16_backend() -> TorchGroupedMMBackend:
    return TorchGroupedMMBackend()


def make_fp8_backend() -> TorchScaledGroupedMMBackend:
    return TorchScaledGroupedMMBackend()
