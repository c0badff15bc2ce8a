"""Small quantized MoE model directories written by the producing tools themselves, for the on-disk loader's tests
(harness.inputs.checkpoints_on_disk): random bf16 expert weights quantized per expert projection by ModelOpt's
NVFP4QTensor or by compressed-tensors' scale helpers and compressors (as harness.peers.*_adapter call them), saved
with safetensors.torch.save_file one shard per decoder layer, beside a plausible config.json (a Qwen3-MoE-like
model) and, for ModelOpt, hf_quant_config.json. Test helpers only: a real export runs calibration over a model;
here the tools' own quantizers run on the weights and on a stated activation amax, which is what ends in the files.

AMD Quark's OCP MXFP4 export is written from Quark's own MX cast (downcast_to_mxfp_torch, EVEN scales) through its
exporter's own packing (Pack_fp4, to_e8m0_uint8) under the config QConfig.to_dict() gives. gpt-oss's fused MXFP4
layout is written from the REFERENCE's quantize_mx and pack_fp4: transformers' own quantizer (quantize_to_mxfp4)
needs the triton_kernels hub, which does not run on the CPU; its reader (convert_moe_packed_tensors) does, and the
tests check the loader against it.

Gate and up share one global scale per expert (NVFP4) or one per-tensor scale (FP8, unless fuse_gate_up=False):
ModelOpt's export syncs the two amaxes (the max) and llm-compressor fuses NVFP4's gate/up global scales the same
way; llm-compressor's per-tensor FP8 keeps one scale per projection (fuse_gate_up=False writes that)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

__all__ = ["write_modelopt_nvfp4", "write_ct_nvfp4", "write_ct_fp8", "write_quark_mxfp4", "write_gpt_oss_mxfp4",
           "expert_key", "ct_quantization_config", "quark_quantization_config", "GPT_OSS_NOT_CONVERTED", "WRITERS"]

_PROJ = ("gate_proj", "up_proj", "down_proj")


def expert_key(layer: int, expert: int, proj: str, field: str) -> str:
    return f"model.layers.{layer}.mlp.experts.{expert}.{proj}.{field}"


def _weights(seed: int, layers: int, experts: int, hidden: int, inter: int):
    """{(layer, expert, proj): bf16 [N, K]} Gaussian / sqrt(K), two input channels per weight 16x larger (outliers
    that make block scales differ), each expert at its own magnitude 2^u, u in [-2, 2] (so per-expert global scales
    differ); and {(layer, expert): (gate/up input amax, down input amax)}."""
    g = torch.Generator().manual_seed(seed)
    w, amax = {}, {}
    for layer in range(layers):
        for e in range(experts):
            mag = 2.0 ** float(torch.empty(()).uniform_(-2, 2, generator=g))
            for proj, (n, k) in zip(_PROJ, ((inter, hidden), (inter, hidden), (hidden, inter))):
                x = torch.randn(n, k, generator=g) / k**0.5
                x[:, torch.randperm(k, generator=g)[:2]] *= 16.0
                w[layer, e, proj] = (x * mag).to(torch.bfloat16)
            amax[layer, e] = tuple(float(v) for v in 2.0 + 6.0 * torch.rand(2, generator=g))
    return w, amax


def _model_config(layers: int, experts: int, hidden: int, inter: int) -> dict:
    return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_act": "silu",
            "hidden_size": hidden, "moe_intermediate_size": inter, "num_experts": experts, "num_experts_per_tok": 2,
            "num_hidden_layers": layers, "torch_dtype": "bfloat16"}


def _save(root: Path, per_layer: list[dict[str, torch.Tensor]], config: dict, hf_quant_config: dict | None,
          seed: int, qwen_router: bool = True) -> Path:
    """One shard per layer (the loader must find a layer's tensors in whichever file holds them), each with the
    layer's unquantized router and norm beside the experts, plus the index file save_pretrained writes."""
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed + 1)
    hidden, experts = config["hidden_size"], config.get("num_experts", config.get("num_local_experts"))
    weight_map, total = {}, 0
    for layer, tensors in enumerate(per_layer):
        tensors = dict(tensors)
        if qwen_router:
            tensors[f"model.layers.{layer}.mlp.gate.weight"] = torch.randn(experts, hidden,
                                                                           generator=g).to(torch.bfloat16)
        tensors[f"model.layers.{layer}.post_attention_layernorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
        name = f"model-{layer + 1:05d}-of-{len(per_layer):05d}.safetensors"
        # one storage per key (gate and up may hold the very same global-scale tensor object)
        save_file({k: v.clone().contiguous() for k, v in tensors.items()}, str(root / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in tensors})
        total += sum(v.numel() * v.element_size() for v in tensors.values())
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (root / "config.json").write_text(json.dumps(config, indent=2))
    if hf_quant_config is not None:
        (root / "hf_quant_config.json").write_text(json.dumps(hf_quant_config, indent=4))
    return root


def write_modelopt_nvfp4(root, *, layers: int = 2, experts: int = 4, hidden: int = 64, inter: int = 32,
                         seed: int = 0, input_scales: bool = True) -> Path:
    """A ModelOpt NVFP4 export: per projection NVFP4QTensor.quantize(w, 16, weights_scaling_factor_2=s2) with s2 =
    get_weights_scaling_factor_2 (fl(amax / 2688)) of gate and up together (their synced amax) or of down alone;
    `weight` is the QTensor's packed bytes, `weight_scale` its E4M3 block scales, `weight_scale_2` s2 squeezed to
    0-d as the export does. input_scale: fl(amax / (6 * 448)) of the stated activation amax, ModelOpt's NVFP4
    activation scaling factor (get_weights_scaling_factor_2 of a one-element tensor computes exactly that).
    Without input scales the quant_algo is W4A16_NVFP4, ModelOpt's weight-only NVFP4."""
    import modelopt
    from modelopt.torch.export.convert_hf_config import convert_hf_quant_config_format
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    w, amax = _weights(seed, layers, experts, hidden, inter)
    per_layer = []
    for layer in range(layers):
        t = {}
        for e in range(experts):
            s2_13 = NVFP4QTensor.get_weights_scaling_factor_2(
                torch.cat([w[layer, e, "gate_proj"], w[layer, e, "up_proj"]]))
            for proj in _PROJ:
                x = w[layer, e, proj]
                s2 = s2_13 if proj != "down_proj" else NVFP4QTensor.get_weights_scaling_factor_2(x)
                qt, block_scales, s2 = NVFP4QTensor.quantize(x, 16, weights_scaling_factor_2=s2)
                t[expert_key(layer, e, proj, "weight")] = qt._quantized_data
                t[expert_key(layer, e, proj, "weight_scale")] = block_scales
                t[expert_key(layer, e, proj, "weight_scale_2")] = s2.float().reshape(())
                if input_scales:
                    a = amax[layer, e][0 if proj != "down_proj" else 1]
                    t[expert_key(layer, e, proj, "input_scale")] = NVFP4QTensor.get_weights_scaling_factor_2(
                        torch.tensor([a])).reshape(())
        per_layer.append(t)
    hf = {"producer": {"name": "modelopt", "version": modelopt.__version__},
          "quantization": {"quant_algo": "NVFP4" if input_scales else "W4A16_NVFP4", "kv_cache_quant_algo": None,
                           "group_size": 16, "exclude_modules": ["lm_head", "model.layers.*.mlp.gate"]}}
    config = _model_config(layers, experts, hidden, inter)
    config["quantization_config"] = convert_hf_quant_config_format(hf)
    return _save(Path(root), per_layer, config, hf, seed)


def ct_quantization_config(scheme, fmt: str) -> dict:
    """config.json's quantization_config as ModelCompressor.update_config writes it."""
    import compressed_tensors
    from compressed_tensors.quantization import QuantizationConfig

    qc = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, quantization_status="compressed",
                            ignore=["lm_head", "re:.*mlp.gate$"])
    return {"version": compressed_tensors.__version__, "quant_method": "compressed-tensors", "sparsity_config": {},
            "transform_config": {}, **json.loads(qc.model_dump_json(exclude={"quant_method"}))}


def write_ct_nvfp4(root, *, layers: int = 2, experts: int = 4, hidden: int = 64, inter: int = 32, seed: int = 0,
                   input_scales: bool = True) -> Path:
    """An llm-compressor NVFP4 (or NVFP4A16) checkpoint: weight_global_scale = generate_gparam(min, max) (fl(2688 /
    amax)) over gate and up together (llm-compressor's fused gate/up global scale) or down alone; block scales by
    compute_dynamic_scales_and_zp under it; NVFP4PackedCompressor.compress packs the codes (weight_packed) and casts
    the scales to E4M3. input_global_scale = generate_gparam(-amax, amax) of the stated activation amax."""
    from compressed_tensors.compressors.nvfp4 import NVFP4PackedCompressor
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import compute_dynamic_scales_and_zp, generate_gparam

    scheme = preset_name_to_scheme("NVFP4" if input_scales else "NVFP4A16", ["Linear"])
    w, amax = _weights(seed, layers, experts, hidden, inter)
    per_layer = []
    for layer in range(layers):
        t = {}
        for e in range(experts):
            both = torch.cat([w[layer, e, "gate_proj"], w[layer, e, "up_proj"]])
            gs13 = generate_gparam(both.amin(), both.amax())
            for proj in _PROJ:
                x = w[layer, e, proj]
                gs = gs13 if proj != "down_proj" else generate_gparam(x.amin(), x.amax())
                scale, zp = compute_dynamic_scales_and_zp(x, scheme.weights, None, global_scale=gs)
                state = NVFP4PackedCompressor.compress(
                    {"weight": x, "weight_scale": scale, "weight_zero_point": zp, "weight_global_scale": gs}, scheme)
                for field in ("weight_packed", "weight_scale", "weight_global_scale"):
                    t[expert_key(layer, e, proj, field)] = state[field]
                if input_scales:
                    a = torch.tensor(amax[layer, e][0 if proj != "down_proj" else 1])
                    t[expert_key(layer, e, proj, "input_global_scale")] = generate_gparam(-a, a)
        per_layer.append(t)
    config = _model_config(layers, experts, hidden, inter)
    config["quantization_config"] = ct_quantization_config(scheme, "nvfp4-pack-quantized")
    return _save(Path(root), per_layer, config, None, seed)


_FP8_PRESETS = {"tensor": "FP8", "channel": "FP8_DYNAMIC", "block": "FP8_BLOCK"}


def _fp8_min_max(x: torch.Tensor, strategy: str):
    if strategy == "tensor":
        return x.amin().reshape(1), x.amax().reshape(1)
    if strategy == "channel":
        return x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    n, k = x.shape
    blocks = x.reshape(n // 128, 128, k // 128, 128)
    return blocks.amin(dim=(1, 3)), blocks.amax(dim=(1, 3))


def write_ct_fp8(root, strategy: str = "tensor", *, scale_dtype: torch.dtype = torch.bfloat16,
                 fuse_gate_up: bool = True, layers: int = 2, experts: int = 4, hidden: int = 128, inter: int = 128,
                 seed: int = 0) -> Path:
    """An llm-compressor FP8 checkpoint (presets FP8 / FP8_DYNAMIC / FP8_BLOCK for strategy tensor / channel /
    block): weight_scale = calculate_qparams(min, max) (fl(amax / 448)) per tensor, output channel or 128x128 block,
    FloatQuantizationCompressor.compress casts w / scale to E4M3. The module computes in `scale_dtype`: a bf16
    model's scales are bf16 (initialize_module_for_quantization registers them in the weight's dtype), an fp32
    model's fp32. Per tensor: gate and up share the scale of their joint amax unless fuse_gate_up=False, and
    input_scale = calculate_qparams(-amax, amax) of the stated activation amax (static per-tensor inputs)."""
    from compressed_tensors.compressors.naive_quantized import FloatQuantizationCompressor
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    scheme = preset_name_to_scheme(_FP8_PRESETS[strategy], ["Linear"])
    w, amax = _weights(seed, layers, experts, hidden, inter)
    per_layer = []
    for layer in range(layers):
        t = {}
        for e in range(experts):
            xs = {p: w[layer, e, p].to(scale_dtype) for p in _PROJ}
            joint = _fp8_min_max(torch.cat([xs["gate_proj"], xs["up_proj"]]), strategy)
            for proj in _PROJ:
                x = xs[proj]
                lo, hi = joint if (strategy == "tensor" and fuse_gate_up and proj != "down_proj") else \
                    _fp8_min_max(x, strategy)
                scale, zp = calculate_qparams(lo, hi, scheme.weights)
                state = FloatQuantizationCompressor.compress(
                    {"weight": x, "weight_scale": scale, "weight_zero_point": zp}, scheme)
                t[expert_key(layer, e, proj, "weight")] = state["weight"]
                t[expert_key(layer, e, proj, "weight_scale")] = state["weight_scale"]
                if strategy == "tensor":
                    a = torch.tensor([amax[layer, e][0 if proj != "down_proj" else 1]], dtype=scale_dtype)
                    t[expert_key(layer, e, proj, "input_scale")] = calculate_qparams(
                        -a, a, scheme.input_activations)[0].reshape(1)
        per_layer.append(t)
    config = _model_config(layers, experts, hidden, inter)
    config["quantization_config"] = ct_quantization_config(scheme, "float-quantized")
    return _save(Path(root), per_layer, config, None, seed)


# ---- OCP MX ------------------------------------------------------------------------------------------------------


def quark_quantization_config(input_mx: bool) -> dict:
    """config.json's quantization_config as Quark's QuarkSafetensorsExporter writes it (QConfig.to_dict() plus the
    JsonExporterConfig under "export"): OCP_MXFP4Spec weights (static: quantized at export) and, with input_mx,
    dynamic OCP_MXFP4Spec input activations; the router and lm_head excluded."""
    import dataclasses

    from harness.peers.quark_adapter import _install_standins

    _install_standins()  # the config classes import in ~0.1 s under the adapter's stand-ins
    from quark.torch.export.config.config import JsonExporterConfig
    from quark.torch.quantization.config.config import OCP_MXFP4Spec, QConfig, QLayerConfig

    layer = QLayerConfig(weight=OCP_MXFP4Spec(ch_axis=-1, is_dynamic=False).to_quantization_spec(),
                         input_tensors=OCP_MXFP4Spec(ch_axis=-1, is_dynamic=True).to_quantization_spec()
                         if input_mx else None)
    qc = QConfig(global_quant_config=layer, exclude=["lm_head", "*mlp.gate"]).to_dict()
    qc["export"] = dataclasses.asdict(JsonExporterConfig())
    return qc


def write_quark_mxfp4(root, *, layers: int = 2, experts: int = 4, hidden: int = 64, inter: int = 32, seed: int = 0,
                      input_mx: bool = True) -> Path:
    """An AMD Quark OCP MXFP4 export (quant_method "quark"): per projection Quark's MX cast downcast_to_mxfp_torch(w,
    axis=-1, EVEN) (the rule of OCP_MXFP4Spec's scale_calculation_mode "even"); `weight` is Pack_fp4.pack of the
    cast's FP4 element values (what the exporter's real quantizer packs: element 2j in the low nibble), `weight_scale`
    to_e8m0_uint8 of the block scale 2^e (uint8 e + 127), as apply_export_state_dict_mappings names them. Dynamic
    MX inputs store nothing (no input_scale)."""
    from harness.peers.quark_adapter import _mx_module

    mx = _mx_module()
    from quark.torch.utils.numerics import to_e8m0_uint8
    from quark.torch.utils.pack import Pack_fp4

    pack = Pack_fp4("per_group", "fp4")
    w, _ = _weights(seed, layers, experts, hidden, inter)
    per_layer = []
    for layer in range(layers):
        t = {}
        for e in range(experts):
            for proj in _PROJ:
                q, s = mx.downcast_to_mxfp_torch(w[layer, e, proj], torch.uint8, axis=-1,
                                                 DEQUANT_SCALE_ROUNDING_MODE=mx.DequantScaleRoundingMode.EVEN)
                # the cast's element values (its codes at scale 1), then the exporter's packing of them
                values = mx.upcast_from_mxfp_torch(q, torch.full_like(s, 127), torch.float32, axis=-1)
                t[expert_key(layer, e, proj, "weight")] = pack.pack(values, True)
                t[expert_key(layer, e, proj, "weight_scale")] = to_e8m0_uint8(torch.exp2(s.float() - 127))
        per_layer.append(t)
    config = _model_config(layers, experts, hidden, inter)
    config["quantization_config"] = quark_quantization_config(input_mx)
    return _save(Path(root), per_layer, config, None, seed)


# gpt-oss-20b's config.json quantization_config.modules_to_not_convert
GPT_OSS_NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def write_gpt_oss_mxfp4(root, *, layers: int = 2, experts: int = 4, hidden: int = 64, inter: int = 32, seed: int = 0
                        ) -> Path:
    """gpt-oss's MXFP4 checkpoint layout, written from the reference's quantize_mx / pack_fp4 (transformers'
    quantize_to_mxfp4 needs the triton_kernels hub: no CPU path): per layer gate_up_proj_{blocks,scales,bias}
    [E, 2I, H/32, 16] / [E, 2I, H/32] / [E, 2I] with gate row j at 2j and up row j at 2j + 1, down_proj_* [E, H,
    I/32, 16] / [E, H, I/32] / [E, H], bf16 biases, plus the router (weight and bias) gpt-oss keeps in bf16, and a
    GptOssConfig-like config.json with quantization_config {"quant_method": "mxfp4", "modules_to_not_convert"}."""
    from reference.formats import E2M1
    from reference.mx import quantize_mx
    from reference.packing import pack_fp4

    w, _ = _weights(seed, layers, experts, hidden, inter)
    g = torch.Generator().manual_seed(seed + 2)

    def blocks_and_scales(x: torch.Tensor):
        q = quantize_mx(x.float(), E2M1, axis=-1)
        e, n, k = x.shape
        return pack_fp4(q.codes).reshape(e, n, k // 32, 16), q.scales

    per_layer = []
    for layer in range(layers):
        gate = torch.stack([w[layer, e, "gate_proj"] for e in range(experts)])
        up = torch.stack([w[layer, e, "up_proj"] for e in range(experts)])
        gate_up = torch.stack([gate, up], dim=2).flatten(1, 2)  # [E, 2I, H], rows gate0, up0, gate1, up1, ...
        down = torch.stack([w[layer, e, "down_proj"] for e in range(experts)])
        t = {}
        for name, x, n in (("gate_up_proj", gate_up, 2 * inter), ("down_proj", down, hidden)):
            blocks, scales = blocks_and_scales(x)
            t[f"model.layers.{layer}.mlp.experts.{name}_blocks"] = blocks
            t[f"model.layers.{layer}.mlp.experts.{name}_scales"] = scales
            t[f"model.layers.{layer}.mlp.experts.{name}_bias"] = torch.randn(experts, n, generator=g).to(torch.bfloat16)
        t[f"model.layers.{layer}.mlp.router.weight"] = torch.randn(experts, hidden, generator=g).to(torch.bfloat16)
        t[f"model.layers.{layer}.mlp.router.bias"] = torch.randn(experts, generator=g).to(torch.bfloat16)
        per_layer.append(t)
    config = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": hidden,
              "intermediate_size": inter, "num_local_experts": experts, "num_experts_per_tok": 2,
              "experts_per_token": 2, "num_hidden_layers": layers, "swiglu_limit": 7.0, "torch_dtype": "bfloat16",
              "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": GPT_OSS_NOT_CONVERTED}}
    return _save(Path(root), per_layer, config, None, seed, qwen_router=False)


# each producer's layer by the name `python -m harness write-checkpoint --tool` takes: (writer, its fixed arguments,
# the peer extra it needs)
WRITERS = {
    "modelopt-nvfp4": (write_modelopt_nvfp4, {}, "modelopt"),
    "compressed-tensors-nvfp4": (write_ct_nvfp4, {}, "compressed-tensors"),
    "compressed-tensors-fp8": (write_ct_fp8, {"strategy": "tensor"}, "compressed-tensors"),
    "compressed-tensors-fp8-block": (write_ct_fp8, {"strategy": "block"}, "compressed-tensors"),
    "quark-mxfp4": (write_quark_mxfp4, {}, "quark"),
    "gpt-oss-mxfp4": (write_gpt_oss_mxfp4, {}, None),
}
