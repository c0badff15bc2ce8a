"""triton_kernels_ogs: OpenAI's triton_kernels `matmul_ogs`, as vLLM's gpt-oss MXFP4 path runs it on Hopper.

The code is the copy of triton_kernels that the pinned vLLM 0.33.0 wheel ships (vllm/third_party/triton_kernels,
the 3.5.1 API: routing.py, matmul_ogs.py; it imports only torch and triton), imported as the package
`triton_kernels` from the git-ignored cache (harness.third_party), never from vllm. vLLM's own bitmatrix packer
(`pack_bitmatrix`, experts/gpt_oss_triton_kernels_moe.py) is cut out of the same wheel. The host glue follows
vLLM 0.33.0's `triton_kernel_fused_experts` and `make_routing_data` (3.5.1 branch) and, for the weights,
`oracle/mxfp4.py` (TRITON backend) and `quantization/utils/mxfp4_utils.py::_swizzle_mxfp4` on sm90:

  routing    topk ids (int16) packed into a bitmatrix by pack_bitmatrix; `routing_from_bitmatrix` sorts the
             (token, k) pairs by expert: RoutingData (gate_scal = the router weights in expert order),
             GatherIndx, ScatterIndx.
  GEMM1      matmul_ogs(x, w13, b13, gather_indx) with the fused SWIGLU (triton_kernels.swiglu.swiglu_fn,
             alpha 1.702, limit 7.0, reduction_n 2: gate and up interleaved by column): the activation is
             evaluated on the fp32 accumulator (bias added) and rounded once to bf16.
  GEMM2      matmul_ogs(y, w2, b2, scatter_indx, gammas=gate_scal): fp32 accumulator + bias, times the router
             weight, rounded to bf16 per (token, k) pair (the "matmul" scratchpad has the output dtype when
             split_k = 1, which vLLM forces on sm90); reduce_grouped sums the k rows in fp32 and rounds once.
  weights    bf16: [E, K, N] as they are. MXFP4: codes and E8M0 scales transposed so that the block axis is
             dim 1, HopperMXValueLayout / HopperMXScaleLayout(mx_axis=1, num_warps=8), the scale's K groups
             padded to a multiple of 4 (vLLM's patch for triton issue 47303); split_k pinned to 1.
             The intermediate size is padded with zero weights, scales and biases to a multiple of 64, as
             oracle/mxfp4.py's mxfp4_round_up_hidden_size_and_intermediate_size does for this backend on CUDA
             (gpt-oss at TP 2: 1440 -> 1472): the padded SWIGLU pairs are exactly 0. Fed an MXFP4 GEMM2 whose K
             is 32 mod 64 unpadded, matmul_ogs is wrong (results/gpu-issue23/run-4: 1010 of 184320 outputs
             out of bound, 5.3x, at K = 1440); vLLM never does that. Biases fp32.

One deliberate difference from vLLM: make_routing_data casts the router weights to bf16 before they become
gate_scal. In gpt-oss the router's top-k weights are bf16 already, so there the cast is lossless; the
harness's topk_weights are fp32 inputs of the op, so they are passed as they are (the kernel multiplies in
fp32 either way).

GPU only (Hopper and later): the Hopper layouts, TMA descriptors and `tl.extra.cuda` have no interpreter path.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import types

import torch

from harness import third_party
from harness.platforms import default_device, detect_platform, matrix_unit_truncation
from reference.checkpoints import MoECheckpoint
from reference.moe import check_moe_inputs

__all__ = ["TritonKernelsOgs", "make_backend", "pad_intermediate", "SOURCE"]

SOURCE = "vllm-0.33.0"
_EXPERTS = "vllm/model_executor/layers/fused_moe/experts/gpt_oss_triton_kernels_moe.py"
_SCHEMES = ("bf16", "w_mxfp4")
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0  # triton_kernel_fused_experts' defaults (gpt-oss)
MXFP4_INTERMEDIATE_ALIGN = 64  # mxfp4_round_up_hidden_size_and_intermediate_size, TRITON backend on CUDA


@dataclasses.dataclass
class _Prepared:
    ckpt: MoECheckpoint  # as the kernels see it (MXFP4: intermediate size padded)
    w13: object  # torch [E, K, N] bf16, or a triton_kernels Tensor in the Hopper MX layout
    w2: object
    pc13: object  # triton_kernels PrecisionConfig
    pc2: object
    b13: torch.Tensor | None  # fp32 [E, N13]
    b2: torch.Tensor | None


def pad_intermediate(ckpt: MoECheckpoint, align: int) -> MoECheckpoint:
    """The same MoE with the intermediate size rounded up to align: zero (gate, up) row pairs appended to w13 (its
    rows are gate/up interleaved) with zero scale codes and biases, zero K columns in w2. Each padded pair gives
    SWIGLU(0, 0) = 0 exactly and meets zero weights, so the output is unchanged bit for bit."""
    pad = -ckpt.intermediate_size % align
    if not pad:
        return ckpt
    block = ckpt.scheme.weight.k_block if ckpt.scheme.weight else 1
    if pad % block:
        raise ValueError(f"pad_intermediate: {pad} padded columns are not whole blocks of {block}")
    per_byte = ckpt.intermediate_size // ckpt.w2.data.shape[-1]  # FP4 codes are packed two a byte along K
    fpad = torch.nn.functional.pad
    rows = lambda t: None if t is None else fpad(t, (0, 0) * (t.dim() - 2) + (0, 2 * pad))  # noqa: E731
    w13 = dataclasses.replace(ckpt.w13, data=rows(ckpt.w13.data), scale=rows(ckpt.w13.scale))
    w2 = dataclasses.replace(ckpt.w2, data=fpad(ckpt.w2.data, (0, pad // per_byte)),
                             scale=None if ckpt.w2.scale is None else fpad(ckpt.w2.scale, (0, pad // block)))
    return dataclasses.replace(ckpt, w13=w13, w2=w2, b13=rows(ckpt.b13),
                               intermediate_size=ckpt.intermediate_size + pad)


class TritonKernelsOgs:
    name = "triton_kernels_ogs"
    numerical_structure = "triton_kernels_ogs"
    operand_dtype = torch.bfloat16  # bf16 x; MXFP4 weights upcast to bf16 in the kernel (exact)

    def __init__(self):
        self.device = default_device()
        self.accumulation_truncation = matrix_unit_truncation(self.device)  # matmul_ogs: bf16 tl.dot, compiled
        self._tk = None

    # ---- what it computes ------------------------------------------------------------------------
    def supports(self, problem, platform) -> tuple[bool, str]:
        if problem.scheme.name not in _SCHEMES:
            return False, (f"vLLM's triton_kernels path (gpt-oss) covers {list(_SCHEMES)}; other schemes go to "
                           "other experts classes")
        if problem.activation.name != "SWIGLUOAI":
            return False, ("triton_kernel_fused_experts asserts 'Only SWIGLUOAI activation is supported' (the "
                           "fused swiglu_fn)")
        if problem.top_k & (problem.top_k - 1):
            return False, (f"top_k {problem.top_k}: triton_kernels 3.5.1's routing kernels need a power-of-two top_k "
                           "(vLLM patches them at import for DeepSeek-V4's 6; that patch is not modelled here)")
        if problem.scheme.name == "w_mxfp4" and problem.hidden_size <= 128:
            return False, (f"hidden_size {problem.hidden_size}: with the Hopper MX scale layout (num_warps 8) GEMM2's "
                           "BLOCK_N must be a multiple of 256, which an N of 128 does not get (_matmul_ogs' "
                           "static_assert, results/gpu-issue24/run-1); real models' hidden sizes are >= 2048")
        if problem.num_experts > 32767:
            return False, "expert ids are int16 in make_routing_data"
        return True, f"triton_kernels matmul_ogs ({problem.scheme.name}) from vLLM 0.33.0"

    def available(self, platform) -> tuple[bool, str]:
        missing = third_party.missing_reason(SOURCE)
        if missing:
            return False, missing
        if not torch.cuda.is_available():
            return False, ("triton_kernels' matmul_ogs runs compiled on a CUDA GPU only (Hopper layouts, TMA, "
                           "tl.extra.cuda: no interpreter path)")
        if torch.cuda.get_device_capability() < (9, 0):
            return False, "vLLM runs triton_kernels' MoE on sm90 and later only"
        if platform is not detect_platform():
            return False, f"compiled for this machine's {detect_platform().name}, not {platform.name}"
        return True, ""

    # ---- the release's code ----------------------------------------------------------------------
    def kernels(self):
        """The wheel's triton_kernels package (imported from the cache) and vLLM's pack_bitmatrix."""
        if self._tk is None:
            root = third_party.source_dir(SOURCE) / "vllm" / "third_party"
            loaded = sys.modules.get("triton_kernels")
            if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(str(root)):
                raise RuntimeError(f"a different triton_kernels is already imported ({loaded.__file__}); this backend "
                                   f"runs the copy shipped in vllm 0.33.0 ({root})")
            if str(root) not in sys.path:
                sys.path.insert(0, str(root))
            mod = {m: importlib.import_module(f"triton_kernels.{m}") for m in
                   ("matmul_ogs", "routing", "swiglu", "tensor", "numerics", "tensor_details.layout",
                    "matmul_ogs_details.opt_flags")}
            pack = third_party.load_triton_functions(SOURCE, _EXPERTS, ("pack_bitmatrix",)).pack_bitmatrix
            # _swizzle_mxfp4 on sm90: split_k pinned to 1 for every matmul_ogs call (a process-wide constraint
            # in triton_kernels, set by vLLM at weight load)
            mod["matmul_ogs_details.opt_flags"].update_opt_flags_constraints({"split_k": 1})
            self._tk = types.SimpleNamespace(pack_bitmatrix=pack, **{k.replace(".", "_"): v for k, v in mod.items()})
        return self._tk

    # ---- checkpoint layout -> vLLM's ----------------------------------------------------------------
    def _weight(self, w, scheme_name):
        tk = self.kernels()
        dev = self.device
        if scheme_name == "bf16":  # [E, N, K] -> [E, K, N]
            return w.data.to(dev).transpose(1, 2).contiguous(), tk.matmul_ogs.PrecisionConfig()
        codes = w.data.to(dev)  # [E, N, K/2] uint8, two E2M1 codes per byte, low nibble first
        scale = w.scale.to(dev)  # [E, N, K/32] E8M0
        pad_k = -scale.shape[-1] % 4  # vLLM: "pad K (num scale groups) to 0 mod 4" (triton issue 47303)
        if pad_k:
            scale = torch.nn.functional.pad(scale, (0, pad_k))
        lay = tk.tensor_details_layout
        value_layout, value_opts = lay.make_default_matmul_mxfp4_w_layout(mx_axis=1)
        scale_layout, scale_opts = lay.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=8)
        t = tk.tensor
        values = t.convert_layout(t.wrap_torch_tensor(codes.transpose(-2, -1), dtype=t.FP4), value_layout,
                                  **value_opts)
        scales = t.convert_layout(t.wrap_torch_tensor(scale.transpose(-2, -1)), scale_layout, **scale_opts)
        mo = tk.matmul_ogs
        pc = mo.PrecisionConfig(weight_scale=scales, flex_ctx=mo.FlexCtx(rhs_data=tk.numerics.InFlexData()))
        return values, pc

    def prepare(self, ckpt: MoECheckpoint) -> _Prepared:
        name = ckpt.scheme.name
        if name not in _SCHEMES or ckpt.activation.name != "SWIGLUOAI":
            raise NotImplementedError(f"{name}/{ckpt.activation.name}: only bf16 and w_mxfp4 with SWIGLUOAI")
        if name == "w_mxfp4":
            ckpt = pad_intermediate(ckpt, MXFP4_INTERMEDIATE_ALIGN)
        w13, pc13 = self._weight(ckpt.w13, name)
        w2, pc2 = self._weight(ckpt.w2, name)
        bias = lambda b: None if b is None else b.float().to(self.device).contiguous()  # noqa: E731
        return _Prepared(ckpt, w13, w2, pc13, pc2, bias(ckpt.b13), bias(ckpt.b2))

    # ---- triton_kernel_fused_experts ----------------------------------------------------------------
    def _routing(self, topk_ids, topk_weights, num_experts: int):
        """make_routing_data (triton_kernels 3.5.1 branch), router weights kept in fp32 (module docstring)."""
        tk = self.kernels()
        ids = topk_ids.to(torch.int16).contiguous()
        rows, k = ids.shape
        block_m, block_k = 512, 32
        cols = -(-num_experts // block_k)
        bits = torch.zeros((rows, cols), dtype=torch.uint32, device=ids.device)
        tk.pack_bitmatrix[(-(-rows // block_m),)](bits, ids, rows, cols, k, BLOCK_SIZE_M=block_m, BLOCK_SIZE_K=block_k)
        bitmatrix = tk.tensor.Bitmatrix(bits, shape=[rows, cols * 32], shape_max=[rows, None], scratchpad=None)
        return tk.routing.routing_from_bitmatrix(bitmatrix, topk_weights.float().contiguous(), ids, num_experts, k)

    def forward(self, prep: _Prepared, hidden_states, topk_weights, topk_ids) -> torch.Tensor:
        check_moe_inputs(hidden_states.cpu(), prep.ckpt, topk_weights.cpu(), topk_ids.cpu())
        dev = self.device
        x = hidden_states.to(dev).contiguous()
        if topk_ids.shape[0] == 0:  # an empty batch never reaches the kernels in vLLM
            return torch.empty_like(x)
        return self.launch(prep, x, topk_weights.to(dev).float().contiguous(), topk_ids.to(dev).contiguous())

    def launch(self, prep: _Prepared, x, topk_weights, topk_ids) -> torch.Tensor:
        """The device work of forward() on device inputs, without host synchronisation (CUDA-graph capturable,
        as vLLM captures it)."""
        ckpt, tk = prep.ckpt, self.kernels()
        t, k = topk_ids.shape
        routing, gather, scatter = self._routing(topk_ids, topk_weights, ckpt.num_experts)
        mo = tk.matmul_ogs
        act = mo.FusedActivation(mo.FnSpecs("swiglu", tk.swiglu.swiglu_fn, ("alpha", "limit")),
                                 (SWIGLU_ALPHA, SWIGLU_LIMIT), 2)
        inter = torch.empty((1, t * k, ckpt.intermediate_size), dtype=torch.bfloat16, device=x.device)
        mo.matmul_ogs(x, prep.w13, prep.b13, routing, gather_indx=gather, precision_config=prep.pc13,
                      gammas=None, fused_activation=act, y=inter)
        out = torch.empty((1, t, ckpt.hidden_size), dtype=torch.bfloat16, device=x.device)
        mo.matmul_ogs(inter.view(t * k, ckpt.intermediate_size), prep.w2, prep.b2, routing, scatter_indx=scatter,
                      precision_config=prep.pc2, gammas=routing.gate_scal, y=out)
        return out.view(t, ckpt.hidden_size)


def make_backend() -> TritonKernelsOgs:
    return TritonKernelsOgs()
