"""One MoE layer of a quantized Hugging Face checkpoint on disk, read into the reference's MoECheckpoint.

A model directory holds *.safetensors shards and its config. Each expert e of decoder layer L stores its three
projections as separate Linear weights under `model.layers.{L}.mlp.experts.{e}.{gate_proj,up_proj,down_proj}.`:
gate_proj and up_proj are [I, H] (out x in), down_proj is [H, I]. The reference wants w13 [E, N13, H] (gate rows,
then up rows; rows interleaved gate/up for SWIGLUOAI; up_proj alone for the *_NO_MUL activations, which have no
gate_proj) and w2 [E, H, I]. Four per-expert on-disk layouts are read (K is a projection's input dim, N its output
dim), and gpt-oss's fused one (at the end of this file: _load_gpt_oss):

ModelOpt NVFP4 (hf_quant_config.json {"quantization": {"quant_algo": "NVFP4", "group_size": 16}}; ModelOpt's
export also writes the same facts into config.json's quantization_config with quant_method "modelopt", read when
hf_quant_config.json is absent). Fields per projection, as modelopt.torch.export (unified_export_hf /
quant_utils) registers them:
  weight          uint8 [N, K/2]      E2M1 codes, two per byte along K; element 2j in the LOW nibble
                                      (NVFP4QTensor.quantize packs (q[..., 1::2] << 4) | q[..., 0::2])
  weight_scale    float8_e4m3fn [N, K/16]  one E4M3 scale per 16 elements along K
  weight_scale_2  fp32 [] (0-d)       the DECODE-direction global scale, amax / (6 * 448): dequantization
                                      multiplies e2m1 * weight_scale * weight_scale_2
  input_scale     fp32 []             the activation's global scale, decode direction (amax / 2688); absent for
                                      weight-only NVFP4 (quant_algo W4A16_NVFP4, or calibrated without inputs)
  -> scheme w_nvfp4_a_nvfp4 with input scales, w_nvfp4 without; nvfp4_global_convention "decode".

compressed-tensors NVFP4 (config.json quantization_config, quant_method "compressed-tensors", format
"nvfp4-pack-quantized"; weights num_bits 4, type float, strategy tensor_group, group_size 16). Fields as
NVFP4PackedCompressor.compress and initialize_module_for_quantization create them:
  weight_packed        uint8 [N, K/2]  E2M1 codes, element 2j in the LOW nibble (pack_fp4_to_uint8:
                                       indices[:, 0] | indices[:, 1] << 4 over consecutive pairs)
  weight_scale         float8_e4m3fn [N, K/16]
  weight_global_scale  fp32 [1]        the ENCODE-direction global scale, 2688 / amax (generate_gparam):
                                       dequantization multiplies e2m1 * (weight_scale / weight_global_scale)
  input_global_scale   fp32 [1]        the activation's global scale, encode direction; present when the config
                                       quantizes input activations (the NVFP4 preset: dynamic "local" block scales
                                       under a static global scale), absent for NVFP4A16
  -> w_nvfp4_a_nvfp4 / w_nvfp4; nvfp4_global_convention "encode".

compressed-tensors FP8 (format "float-quantized"; weights num_bits 8, type float). FloatQuantizationCompressor
writes:
  weight        float8_e4m3fn [N, K]
  weight_scale  [1] (strategy tensor), [N, 1] (channel) or [ceil(N/128), K/128] (block, block_structure
                [128, 128]); decode direction (amax / 448: dequantization multiplies). Its dtype is the dtype the
                module's weight had when llm-compressor calibrated it (initialize_module_for_quantization registers
                the scale in the observed dtype): bf16 for a bf16 model, fp32 for an fp32 one; both widen to fp32
                exactly
  input_scale   [1], same direction and dtype rule; static per-tensor input activations only
  -> per tensor with static per-tensor inputs (the FP8 preset): w_fp8_a_fp8; 128x128 blocks with dynamic 1x128
  input groups (FP8_BLOCK): w_fp8_a_fp8_block. Per channel (FP8_DYNAMIC) has no reference scheme: refused.

AMD Quark OCP MXFP4 (config.json quantization_config, quant_method "quark": QConfig.to_dict() as Quark's
QuarkSafetensorsExporter writes it). The expert Linear's config is Quark's resolution for its name
(get_layer_quant_config: the first fnmatch of layer_quant_config, else global_quant_config; an `exclude` fnmatch
means unquantized); its weight must be OCP_MXFP4Spec's QTensorConfig (dtype "fp4", qscheme "per_group", group_size 32,
scale_format "e8m0", ch_axis -1). Fields as the exporter's real quantizer and apply_export_state_dict_mappings name
them:
  weight        uint8 [N, K/2]   E2M1 codes, element 2j in the LOW nibble (Pack_fp4.pack: (q[..., 1] << 4) +
                                 q[..., 0] over consecutive pairs; the MX cast downcast_to_mxfp_torch packs alike)
  weight_scale  uint8 [N, K/32]  E8M0 (to_e8m0_uint8: round(log2 scale) + 127; Quark decodes 2^(code - 127)), not
                                 transposed (only integer per-group dtypes are)
  no input_scale: OCP_MXFP4Spec input activations are dynamic
  -> input_tensors null: w_mxfp4; input_tensors dynamic OCP MXFP4: w_mxfp4_a_mxfp4. Quark's legacy dtype "mx"
  (Pack_mxfp4: unbiased int8 exponents) and other MX element types are refused.

What one expert's w13 cannot hold is refused, not approximated: the reference keeps ONE global scale (NVFP4) or
one per-tensor scale (FP8) for an expert's whole w13, so gate_proj's and up_proj's must be equal (ModelOpt's
export and llm-compressor's NVFP4 fuse them, taking the larger amax; llm-compressor's per-tensor FP8 does not, and
vLLM requantizes such a w13 to the larger scale on load: a lossy step this loader does not take). Experts may
differ from each other: every field is per expert. Static input scales of gate_proj and up_proj (the same input)
may differ: w13_input_scale takes the one of the larger activation amax (decode: the max; encode: the min), which
loses nothing, since the MoE quantizes its input with the max over experts anyway.

A global scale stored in one direction and read in the other is found by its magnitude: read as a decode scale
s, a weight's largest representable magnitude is 6 * (largest block scale) * s; read the other way it is
6 * (largest block scale) / s. Real weights are far below 2688 = 6 * 448 (where the two readings meet, s = 1), so
the right reading is the smaller; the loader refuses a reading 2^4 or more above the other (s above 4 for a decode
reading), naming the global scale direction.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from reference.activations import Activation, activation_by_name
from reference.checkpoints import MoECheckpoint, QuantizedWeight, check_checkpoint
from reference.formats import E4M3FN, decode
from reference.schemes import scheme_by_name

__all__ = ["load_moe_layer", "DIRECTION_TOLERANCE"]

_NVFP4_BLOCK = 16
_FP8_BLOCK = 128
_MX_BLOCK = 32
_E8M0_NAN = 0xFF
_E2M1_MAX = 6.0
# a reading of an NVFP4 global scale whose largest representable weight is this many times the opposite reading's
# is taken as a global scale stored in the other direction
DIRECTION_TOLERANCE = 2.0**4
_HALF_PRECISION_OR_FP32 = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class _Field:
    """One tensor of a projection: its key suffix, the dtypes and shapes it may have given the projection's
    [N, K], and what it is (for errors)."""

    name: str
    dtypes: tuple[torch.dtype, ...]
    shapes: object  # (n, k) -> tuple of allowed shapes
    what: str


@dataclass(frozen=True)
class _Layout:
    name: str  # e.g. "ModelOpt NVFP4", for errors
    scheme: str
    weight: _Field
    scale: _Field
    global_scale: _Field | None = None  # NVFP4
    input_scale: _Field | None = None  # static schemes
    convention: str = "decode"  # NVFP4 global scale direction
    fp8_strategy: str | None = None  # "tensor" or "block"
    mx: bool = False  # OCP MX (E8M0 scales per 32)

    @property
    def family(self) -> str:
        return "mx" if self.mx else ("nvfp4" if self.fp8_strategy is None else "fp8")

    @property
    def fields(self) -> tuple[_Field, ...]:
        return tuple(f for f in (self.weight, self.scale, self.global_scale, self.input_scale) if f is not None)


def _scalar_shapes(n, k):
    return ((), (1,))


def _one_shapes(n, k):
    return ((1,),)


def _nvfp4_fields(weight: str, global_scale: str, global_what: str, input_scale: str | None, input_what: str,
                  global_shapes) -> tuple[_Field, _Field, _Field, _Field | None]:
    fields = (
        _Field(weight, (torch.uint8,), lambda n, k: ((n, k // 2),),
               "E2M1 codes packed two per byte along K, element 2j in the low nibble"),
        _Field("weight_scale", (torch.float8_e4m3fn,), lambda n, k: ((n, k // _NVFP4_BLOCK),),
               "E4M3 block scales, one per 16 elements along K"),
        _Field(global_scale, (torch.float32,), global_shapes, global_what),
    )
    if input_scale is None:
        return fields + (None,)
    return fields + (_Field(input_scale, (torch.float32,), global_shapes, input_what),)


def _modelopt_nvfp4(with_inputs: bool) -> _Layout:
    # ModelOpt's export squeezes both scalars to 0-d; a one-element [1] is the same number and is accepted
    w, s, g, i = _nvfp4_fields(
        "weight", "weight_scale_2", "fp32 global scale, decode direction (amax / 2688)",
        "input_scale" if with_inputs else None, "fp32 activation global scale, decode direction (amax / 2688)",
        _scalar_shapes)
    return _Layout("ModelOpt NVFP4", "w_nvfp4_a_nvfp4" if with_inputs else "w_nvfp4", w, s, g, i, "decode")


def _ct_nvfp4(with_inputs: bool) -> _Layout:
    w, s, g, i = _nvfp4_fields(
        "weight_packed", "weight_global_scale", "fp32 global scale, encode direction (2688 / amax)",
        "input_global_scale" if with_inputs else None,
        "fp32 activation global scale, encode direction (2688 / amax)", _one_shapes)
    return _Layout("compressed-tensors NVFP4", "w_nvfp4_a_nvfp4" if with_inputs else "w_nvfp4", w, s, g, i, "encode")


def _ct_fp8(strategy: str) -> _Layout:
    weight = _Field("weight", (torch.float8_e4m3fn,), lambda n, k: ((n, k),), "E4M3 codes")
    if strategy == "tensor":
        scale = _Field("weight_scale", _HALF_PRECISION_OR_FP32, _one_shapes,
                       "one per-tensor scale, decode direction (amax / 448)")
        inputs = _Field("input_scale", _HALF_PRECISION_OR_FP32, _one_shapes,
                        "static per-tensor activation scale, decode direction (amax / 448)")
        return _Layout("compressed-tensors FP8 per-tensor", "w_fp8_a_fp8", weight, scale, None, inputs,
                       fp8_strategy="tensor")
    scale = _Field("weight_scale", _HALF_PRECISION_OR_FP32,
                   lambda n, k: ((-(-n // _FP8_BLOCK), k // _FP8_BLOCK),),
                   "one scale per 128 x 128 block, decode direction (block amax / 448)")
    return _Layout("compressed-tensors FP8 128x128-block", "w_fp8_a_fp8_block", weight, scale, fp8_strategy="block")


def _quark_mxfp4(with_inputs: bool) -> _Layout:
    # dynamic MX activations have no stored scale: the layout is the weight's two fields either way
    weight = _Field("weight", (torch.uint8,), lambda n, k: ((n, k // 2),),
                    "E2M1 codes packed two per byte along K, element 2j in the low nibble (Quark's Pack_fp4)")
    scale = _Field("weight_scale", (torch.uint8,), lambda n, k: ((n, k // _MX_BLOCK),),
                   "E8M0 block scales (exponent + 127), one per 32 elements along K")
    return _Layout("AMD Quark OCP MXFP4", "w_mxfp4_a_mxfp4" if with_inputs else "w_mxfp4", weight, scale, mx=True)


# ---- the config: which layout the files are in ---------------------------------------------------------------


# config.json's hidden_act (Hugging Face's activation names) -> the reference's gated MoE activation. gelu_new and
# gelu_pytorch_tanh are both the tanh approximation; "gelu" is erf's
_HF_ACTIVATIONS = {"silu": "SILU", "swish": "SILU", "gelu": "GELU", "gelu_new": "GELU_TANH",
                   "gelu_pytorch_tanh": "GELU_TANH"}


def _config_activation(config: dict | None, root: Path) -> str | None:
    """The MoE activation config.json names (hidden_act, or text_config.hidden_act for multimodal configs), None
    when it names none; one it names that the reference has no gated form of is refused, naming it."""
    if config is None:
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    name = config.get("hidden_act", text.get("hidden_act"))
    if name is None:
        return None
    if name not in _HF_ACTIVATIONS:
        raise ValueError(f"{root / 'config.json'}: hidden_act {name!r} has no reference MoE activation (known: "
                         f"{', '.join(f'{k} -> {v}' for k, v in _HF_ACTIVATIONS.items())}); pass the activation "
                         "explicitly (pytest --activation NAME)")
    return _HF_ACTIVATIONS[name]


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _config_layout(root: Path, modules: list[str]) -> tuple[str, object]:
    """("modelopt", (quant_algo, group_size, where)) or ("compressed-tensors", (weights args, input args or None,
    format, where)) from hf_quant_config.json / config.json; `where` names the file (and field) for errors."""
    hf = _read_json(root / "hf_quant_config.json")
    config = _read_json(root / "config.json")
    qc = None if config is None else config.get("quantization_config")
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    if hf is not None:
        if method not in (None, "modelopt"):
            raise ValueError(f"{root}: hf_quant_config.json says ModelOpt, config.json's quantization_config says "
                             f"quant_method {method!r}: which producer wrote these tensors is ambiguous")
        q = hf.get("quantization")
        if not isinstance(q, dict) or "quant_algo" not in q:
            raise ValueError(f"{root / 'hf_quant_config.json'}: expected {{\"quantization\": {{\"quant_algo\": ...}}}}")
        if method == "modelopt" and qc.get("quant_algo") not in (None, q["quant_algo"]):
            raise ValueError(f"{root}: hf_quant_config.json quant_algo {q['quant_algo']!r} and config.json "
                             f"quantization_config.quant_algo {qc.get('quant_algo')!r} disagree")
        _modelopt_excluded(q.get("exclude_modules") or [], modules, root / "hf_quant_config.json")
        group_size = q.get("group_size", _NVFP4_BLOCK)
        where = root / "hf_quant_config.json"
        return "modelopt", (q["quant_algo"], group_size, where)
    if qc is None:
        raise ValueError(f"{root}: neither hf_quant_config.json (ModelOpt) nor config.json's quantization_config "
                         f"(compressed-tensors, or ModelOpt's copy) is there: the quantization layout is unknown")
    if not isinstance(qc, dict):
        raise ValueError(f"{root / 'config.json'}: quantization_config must be an object")
    if method == "modelopt":
        _modelopt_excluded(qc.get("ignore") or [], modules, root / "config.json")
        groups = qc.get("config_groups") or {}
        weights = next(iter(groups.values()), {}).get("weights", {}) if groups else {}
        return "modelopt", (qc.get("quant_algo"), weights.get("group_size", _NVFP4_BLOCK), root / "config.json")
    if method == "quark":
        return "quark", _quark_layout(qc, modules, f"{root / 'config.json'}: quantization_config")
    if method != "compressed-tensors":
        raise ValueError(f"{root / 'config.json'}: quantization_config.quant_method {method!r} is not a layout this "
                         f"loader reads ('compressed-tensors', 'quark', gpt-oss's 'mxfp4', or ModelOpt's 'modelopt' / "
                         f"hf_quant_config.json)")
    return "compressed-tensors", _ct_group(qc, modules, root / "config.json")


def _modelopt_excluded(patterns: list[str], modules: list[str], where: Path) -> None:
    for m in modules:
        for p in patterns:
            if fnmatch.fnmatchcase(m, p):
                raise ValueError(f"{where}: exclude_modules {p!r} matches {m}: that expert is not quantized "
                                 f"(bf16 experts are not a quantized layout)")


def _ct_matches(name: str, target: str) -> int | None:
    """compressed-tensors' target matching, most specific first: 0 exact module name, 1 "re:" regex (re.match,
    as match_name does), 2 the class name (every expert projection is a Linear); None: no match."""
    if target == name:
        return 0
    if target.startswith("re:"):
        return 1 if re.match(target[3:], name) else None
    return 2 if target == "Linear" else None


def _ct_group(qc: dict, modules: list[str], where: Path):
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ValueError(f"{where}: quantization_config.config_groups is missing or empty")
    for m in modules:
        for pat in qc.get("ignore") or []:
            if _ct_matches(m, pat) is not None:
                raise ValueError(f"{where}: quantization_config.ignore {pat!r} matches {m}: that expert is not "
                                 f"quantized (bf16 experts are not a quantized layout)")
    chosen = set()
    for m in modules:
        best = None
        for gname, g in groups.items():
            ranks = [r for t in g.get("targets", []) if (r := _ct_matches(m, t)) is not None]
            if ranks and (best is None or min(ranks) < best[0]):
                best = (min(ranks), gname)
        if best is None:
            raise ValueError(f"{where}: no quantization_config.config_groups entry targets {m}")
        chosen.add(best[1])
    if len(chosen) > 1:
        raise ValueError(f"{where}: the layer's expert projections fall in different config groups {sorted(chosen)}: "
                         f"one MoE layer has one scheme")
    gname = chosen.pop()
    g = groups[gname]
    fmt = g.get("format") or qc.get("format")
    return (g.get("weights") or {}, g.get("input_activations"), fmt,
            f"{where}: quantization_config.config_groups.{gname}")


def _quark_layer_config(qc: dict, module: str, where: str) -> tuple[str, dict]:
    """(where, QLayerConfig dict) Quark resolves for one Linear, as its exporter does (quant_config_parser's
    get_layer_quant_config): the first layer_quant_config pattern that fnmatches the name, else the
    layer_type_quant_config entry of Linear, else global_quant_config; a name matching an `exclude` pattern is not
    quantized at all."""
    for pat in qc.get("exclude") or []:
        if fnmatch.fnmatch(module, pat):
            raise ValueError(f"{where}.exclude {pat!r} matches {module}: that expert is not quantized (bf16 experts "
                             f"are not a quantized layout)")
    for pat, cfg in (qc.get("layer_quant_config") or {}).items():
        if fnmatch.fnmatch(module, pat):
            return f"{where}.layer_quant_config[{pat!r}]", cfg
    by_type = qc.get("layer_type_quant_config") or {}
    if by_type:
        raise ValueError(f"{where}.layer_type_quant_config = {sorted(by_type)!r}: per-layer-type configs are not read "
                         f"here (a Linear's config would be whichever entry names its class)")
    return f"{where}.global_quant_config", qc.get("global_quant_config")


def _quark_mx_spec(spec, where: str, what: str) -> None:
    """OCP MXFP4 as Quark's OCP_MXFP4Spec serializes it (QTensorConfig.to_dict): dtype "fp4", qscheme "per_group",
    group_size 32, scale_format "e8m0", along the last axis (K for a weight, the hidden dim for an input)."""
    if not isinstance(spec, dict):
        raise ValueError(f"{where} = {spec!r}: expected one QTensorConfig object ({what}); a list is Quark's "
                         f"double quantization, which has no reference scheme")
    if spec.get("dtype") == "mx":
        raise ValueError(f"{where}.dtype = 'mx': Quark's legacy MX dtype (mx_element_dtype "
                         f"{spec.get('mx_element_dtype')!r}) stores each block's exponent as an unbiased int8 "
                         f"(Pack_mxfp4), not E8M0: not read here; OCP MXFP4 is dtype 'fp4' with scale_format 'e8m0'")
    want = {"dtype": "fp4", "qscheme": "per_group", "group_size": _MX_BLOCK, "scale_format": "e8m0"}
    for key, v in want.items():
        if spec.get(key) != v:
            raise ValueError(f"{where}.{key} = {spec.get(key)!r}: {what} must be OCP MXFP4 ({want}); only Quark's "
                             f"MXFP4 (OCP_MXFP4Spec) is read here")
    if spec.get("ch_axis", -1) not in (-1, 1):
        raise ValueError(f"{where}.ch_axis = {spec.get('ch_axis')!r}: MX blocks run along the last axis (-1)")


def _quark_layout(qc: dict, modules: list[str], where: str) -> _Layout:
    """AMD Quark's HF export (quant_method "quark"): OCP MXFP4 weights; inputs None (w_mxfp4) or dynamic OCP MXFP4
    (w_mxfp4_a_mxfp4)."""
    resolved = {m: _quark_layer_config(qc, m, where) for m in modules}
    kinds = {json.dumps(cfg, sort_keys=True) for _, cfg in resolved.values()}
    if len(kinds) > 1:
        places = sorted({w for w, _ in resolved.values()})
        raise ValueError(f"{where}: the layer's expert projections get different configs ({', '.join(places)}): one "
                         f"MoE layer has one scheme")
    cfg_where, cfg = next(iter(resolved.values()))
    if not isinstance(cfg, dict):
        raise ValueError(f"{cfg_where} = {cfg!r}: expected a QLayerConfig object")
    if cfg.get("weight") is None:
        raise ValueError(f"{cfg_where}.weight is null: the experts' weights are not quantized")
    _quark_mx_spec(cfg["weight"], f"{cfg_where}.weight", "the weight")
    for other in ("output_tensors", "bias"):
        if cfg.get(other) is not None:
            raise ValueError(f"{cfg_where}.{other} is set: a quantized {other.replace('_', ' ')} has no reference "
                             f"scheme")
    inputs = cfg.get("input_tensors")
    if inputs is None:
        return _quark_mxfp4(False)
    _quark_mx_spec(inputs, f"{cfg_where}.input_tensors", "the input activation")
    if inputs.get("is_dynamic") is not True:
        raise ValueError(f"{cfg_where}.input_tensors.is_dynamic = {inputs.get('is_dynamic')!r}: w_mxfp4_a_mxfp4 "
                         f"quantizes its inputs dynamically (no stored input scale)")
    return _quark_mxfp4(True)


def _ct_layout(weights: dict, inputs: dict | None, fmt: str | None, where: str) -> _Layout:
    def arg(d, key, default=None):
        return d.get(key, default) if d else default

    bits, typ = arg(weights, "num_bits"), arg(weights, "type")
    if arg(weights, "symmetric", True) is not True:
        raise ValueError(f"{where}.weights.symmetric is false: asymmetric (zero-point) weights have no reference "
                         f"scheme")
    if fmt == "nvfp4-pack-quantized":
        want = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": _NVFP4_BLOCK}
        for key, v in want.items():
            if arg(weights, key) != v:
                raise ValueError(f"{where}.weights.{key} = {arg(weights, key)!r}: the format nvfp4-pack-quantized "
                                 f"is NVFP4 only with {want}")
        if inputs is None:
            return _ct_nvfp4(False)
        for key, v in want.items():
            if arg(inputs, key) != v:
                raise ValueError(f"{where}.input_activations.{key} = {arg(inputs, key)!r}: NVFP4 activations "
                                 f"(w_nvfp4_a_nvfp4) are {want} with a static global scale")
        if arg(inputs, "dynamic") != "local":
            raise ValueError(f"{where}.input_activations.dynamic = {arg(inputs, 'dynamic')!r}: w_nvfp4_a_nvfp4 needs "
                             f"'local' (dynamic block scales under the checkpoint's static input_global_scale)")
        return _ct_nvfp4(True)
    if fmt == "float-quantized":
        if (bits, typ) != (8, "float"):
            raise ValueError(f"{where}.weights: num_bits {bits!r}, type {typ!r}: float-quantized FP8 is 8-bit float")
        strategy = arg(weights, "strategy", "tensor")
        if strategy == "channel":
            raise ValueError(f"{where}.weights.strategy = 'channel': per-channel FP8 weights (compressed-tensors' "
                             f"FP8_DYNAMIC preset, weight_scale [N, 1]) have no reference scheme (the reference has "
                             f"per-tensor w_fp8_a_fp8 and 128x128-block w_fp8_a_fp8_block)")
        if strategy == "tensor":
            static = (arg(inputs, "num_bits"), arg(inputs, "type"), arg(inputs, "strategy", "tensor"),
                      arg(inputs, "dynamic"))
            if inputs is None or static != (8, "float", "tensor", False):
                raise ValueError(f"{where}.input_activations = {inputs!r}: per-tensor FP8 weights have a reference "
                                 f"scheme only with static per-tensor FP8 inputs (w_fp8_a_fp8: num_bits 8, float, "
                                 f"strategy tensor, dynamic false)")
            return _ct_fp8("tensor")
        if strategy == "block":
            if list(arg(weights, "block_structure") or []) != [_FP8_BLOCK, _FP8_BLOCK]:
                raise ValueError(f"{where}.weights.block_structure = {arg(weights, 'block_structure')!r}: the "
                                 f"reference's block FP8 is 128 x 128")
            dyn = (arg(inputs, "num_bits"), arg(inputs, "type"), arg(inputs, "strategy"), arg(inputs, "group_size"),
                   arg(inputs, "dynamic"))
            if inputs is None or dyn != (8, "float", "group", _FP8_BLOCK, True):
                raise ValueError(f"{where}.input_activations = {inputs!r}: w_fp8_a_fp8_block quantizes its inputs "
                                 f"dynamically in 1 x 128 groups (num_bits 8, float, strategy group, group_size 128, "
                                 f"dynamic true)")
            return _ct_fp8("block")
        raise ValueError(f"{where}.weights.strategy = {strategy!r}: FP8 weights are read per tensor or per 128x128 "
                         f"block")
    raise ValueError(f"{where}: format {fmt!r} is not read here (nvfp4-pack-quantized, float-quantized)")


def _modelopt_layout(quant_algo, group_size, where: Path, has_inputs: bool) -> _Layout:
    if quant_algo not in ("NVFP4", "W4A16_NVFP4"):
        raise ValueError(f"{where}: quant_algo {quant_algo!r} is not read here (ModelOpt NVFP4, W4A16_NVFP4)")
    if group_size != _NVFP4_BLOCK:
        raise ValueError(f"{where}: group_size {group_size!r}: NVFP4 blocks are 16")
    return _modelopt_nvfp4(has_inputs and quant_algo == "NVFP4")


# ---- the tensors -----------------------------------------------------------------------------------------------


class _Shards:
    """The keys of every *.safetensors file in a directory, read lazily (headers only until a tensor is asked for)."""

    def __init__(self, root: Path):
        try:
            from safetensors import safe_open
        except ImportError:
            raise ImportError("reading checkpoints needs the safetensors package (pip install safetensors)") from None
        self._open = safe_open
        files = sorted(root.glob("*.safetensors"))
        if not files:
            raise ValueError(f"{root}: no *.safetensors files")
        self.where: dict[str, Path] = {}
        for f in files:
            with safe_open(f, framework="pt") as h:
                for key in h.keys():
                    if key in self.where:
                        raise ValueError(f"{key} is in both {self.where[key].name} and {f.name}")
                    self.where[key] = f

    def get(self, key: str) -> torch.Tensor:
        with self._open(self.where[key], framework="pt") as h:
            return h.get_tensor(key)


def _fmt(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _read(shards: _Shards, key: str, field: _Field, n: int, k: int, layout: _Layout) -> torch.Tensor:
    if key not in shards.where:
        raise ValueError(f"{key} is missing: the {layout.name} layout stores {field.name} ({field.what}) for every "
                         f"expert projection")
    t = shards.get(key)
    shapes = field.shapes(n, k)
    if t.dtype not in field.dtypes or tuple(t.shape) not in shapes:
        want_dtype = " or ".join(_fmt(d) for d in field.dtypes)
        want_shape = " or ".join(str(list(s)) for s in shapes)
        raise ValueError(f"{key} must be {want_dtype} {want_shape} ({layout.name}: {field.what}), got "
                         f"{_fmt(t.dtype)} {list(t.shape)}")
    return t


def _positive_finite(t: torch.Tensor, key: str, what: str) -> torch.Tensor:
    t = t.float().reshape(-1)
    if not bool(torch.isfinite(t).all()) or not bool((t > 0).all()):
        raise ValueError(f"{key} = {t.tolist()}: {what} must be positive and finite")
    return t


def _check_e4m3_scales(codes: torch.Tensor, key: str) -> None:
    # block scales are positive E4M3FN: no sign bit, no NaN (0x7F); both producers only write those
    if bool((codes >= 0x7F).any()):
        raise ValueError(f"{key} holds negative or NaN E4M3 block scales (codes >= 0x7F)")


def _check_e8m0_scales(codes: torch.Tensor, key: str) -> None:
    # E8M0 0xFF is NaN (the whole block NaN, OCP MX); no producer writes it for finite weights
    if bool((codes == _E8M0_NAN).any()):
        raise ValueError(f"{key} holds E8M0 NaN scale codes (0xFF)")


def _check_fp8_codes(codes: torch.Tensor, key: str) -> None:
    # E4M3FN's NaN is S.1111.111; an FP8 checkpoint holds none (ModelOpt 0.47 writes them for an all-zero tensor)
    if bool(((codes & 0x7F) == 0x7F).any()):
        raise ValueError(f"{key} holds E4M3 NaN codes (0x7F / 0xFF)")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.float().view(torch.int32), b.float().view(torch.int32))


def _expert_ids(shards: _Shards, prefix: str, layer: int) -> list[int]:
    ids = set()
    for key in shards.where:
        if key.startswith(prefix):
            head = key[len(prefix):].split(".", 1)[0]
            if not head.isdigit():
                raise ValueError(f"{key}: expected per-expert tensors {prefix}<e>.<projection>.<field>; fused "
                                 f"expert tensors (all experts in one tensor) are not this layout")
            ids.add(int(head))
    if not ids:
        layers = sorted({int(m.group(1)) for key in shards.where
                         if (m := re.match(r"model\.layers\.(\d+)\.mlp\.experts\.", key))})
        raise ValueError(f"no tensors under {prefix}: layer {layer} has no MoE experts here (layers with experts: "
                         f"{layers})")
    missing = sorted(set(range(max(ids) + 1)) - ids)
    if missing:
        raise ValueError(f"experts {missing} of layer {layer} have no tensors under {prefix} (found {len(ids)} "
                         f"experts up to {max(ids)})")
    return sorted(ids)


def _check_fields(shards: _Shards, prefix: str, projections: tuple[str, ...], layout: _Layout) -> None:
    """Every key under the layer's experts is a field of the layout on a projection the activation uses; foreign
    fields are named all at once (another producer's names say which layout the tensors really are)."""
    names = {f.name for f in layout.fields}
    foreign: dict[str, str] = {}
    for key in sorted(k for k in shards.where if k.startswith(prefix)):
        proj, _, field = key[len(prefix):].partition(".")[2].partition(".")
        if proj not in projections:
            raise ValueError(f"{key}: {proj!r} is not a projection of this layer's experts "
                             f"({', '.join(projections)} for the chosen activation)")
        if field not in names:
            foreign.setdefault(field, key)
    if foreign:
        listed = ", ".join(repr(f) for f in sorted(foreign))
        verb = "is not a field" if len(foreign) == 1 else "are not fields"
        raise ValueError(f"{min(foreign.values())}: {listed} {verb} of the {layout.name} layout (its fields: "
                         f"{', '.join(sorted(names))})")


# ---- the loader -----------------------------------------------------------------------------------------------


def load_moe_layer(path, layer: int, scheme: str | None = None, activation: str | Activation | None = None
                   ) -> MoECheckpoint:
    """The MoE layer `layer` of the checkpoint directory `path` as a reference MoECheckpoint (layouts: module
    docstring). scheme, if given, must be the one the files hold; activation, if not given, is config.json's
    hidden_act (silu -> SILU, gelu -> GELU, gelu_pytorch_tanh / gelu_new -> GELU_TANH), else SILU; SWIGLUOAI for
    gpt-oss's fused layout (gpt-oss's own activation). Every mismatch is a
    ValueError naming the tensor key or config field and what was expected."""
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"{root} is not a directory")
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise ValueError(f"layer must be a non-negative int, got {layer!r}")
    shards = _Shards(root)
    prefix = f"model.layers.{layer}.mlp.experts."
    config = _read_json(root / "config.json")
    qc = None if config is None else config.get("quantization_config")
    if isinstance(qc, dict) and qc.get("quant_method") == "mxfp4":
        if (root / "hf_quant_config.json").is_file():
            raise ValueError(f"{root}: hf_quant_config.json says ModelOpt, config.json's quantization_config says "
                             f"quant_method 'mxfp4' (gpt-oss): which producer wrote these tensors is ambiguous")
        return _load_gpt_oss(root, shards, layer, prefix, scheme, activation, config)
    act = activation if isinstance(activation, Activation) else activation_by_name(
        activation or _config_activation(config, root) or "SILU")
    experts = _expert_ids(shards, prefix, layer)
    projections = ("gate_proj", "up_proj", "down_proj") if act.gated else ("up_proj", "down_proj")
    modules = [f"{prefix}{e}.{p}" for e in experts for p in projections]

    producer, info = _config_layout(root, modules)
    if producer == "modelopt":
        quant_algo, group_size, where = info
        has_inputs = any(k.startswith(prefix) and k.endswith(".input_scale") for k in shards.where)
        layout = _modelopt_layout(quant_algo, group_size, where, has_inputs)
    elif producer == "quark":
        layout = info
    else:
        layout = _ct_layout(*info)
    if scheme is not None and scheme_by_name(scheme).name != layout.scheme:
        raise ValueError(f"{root} holds {layout.scheme} ({layout.name}), not {scheme_by_name(scheme).name}")
    _check_fields(shards, prefix, projections, layout)

    # logical sizes from expert 0's down_proj [H, I] (NVFP4 and MXFP4 store I / 2 bytes per row)
    family = layout.family
    down_key = f"{prefix}{experts[0]}.down_proj.{layout.weight.name}"
    if down_key not in shards.where:
        raise ValueError(f"{down_key} is missing: the {layout.name} layout stores {layout.weight.name} "
                         f"({layout.weight.what}) for every expert projection")
    down_shape = shards.get(down_key).shape
    if len(down_shape) != 2:
        raise ValueError(f"{down_key} must be 2-d [H, I{' / 2' if family != 'fp8' else ''}], got "
                         f"{list(down_shape)}")
    hidden = down_shape[0]
    inter = down_shape[1] * (2 if family != "fp8" else 1)
    block = {"nvfp4": _NVFP4_BLOCK, "mx": _MX_BLOCK}.get(family, _FP8_BLOCK if layout.fp8_strategy == "block" else 1)
    for name, v in (("hidden size H", hidden), ("intermediate size I", inter)):
        if v % block:
            raise ValueError(f"{down_key}: {name} {v} is not a multiple of {block}: the reference holds whole "
                             f"{layout.name} scale blocks")
    if act.interleaved and layout.fp8_strategy == "block":
        raise ValueError(f"{act.name} interleaves gate and up rows, which splits every 128-row FP8 scale block "
                         f"between them: no reference layout for {layout.scheme}")

    sizes = {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}
    per = {p: {f.name: [] for f in layout.fields} for p in projections}
    for e in experts:
        for p in projections:
            n, k = sizes[p]
            for f in layout.fields:
                per[p][f.name].append(_read(shards, f"{prefix}{e}.{p}.{f.name}", f, n, k, layout))

    def key(e: int, p: str, f: _Field) -> str:
        return f"{prefix}{e}.{p}.{f.name}"

    w13_parts = ("gate_proj", "up_proj") if act.gated else ("up_proj",)

    def w13_rows(name: str, e: int) -> torch.Tensor:
        parts = [per[p][name][e] for p in w13_parts]
        if len(parts) == 1:
            return parts[0]
        if act.interleaved:  # gate row j at 2j, up row j at 2j + 1 (gpt-oss)
            return torch.stack(parts, dim=1).flatten(0, 1)
        return torch.cat(parts, dim=0)

    # codes: every producer here packs element 2j into the low nibble (NVFP4, MXFP4) or stores one E4M3 code per
    # byte (FP8), the reference's layout already, so bytes pass through unchanged
    lw, ls = layout.weight, layout.scale
    for p in projections:
        for e in experts:
            if family == "nvfp4":
                _check_e4m3_scales(per[p][ls.name][e].view(torch.uint8), key(e, p, ls))
            elif family == "mx":
                _check_e8m0_scales(per[p][ls.name][e], key(e, p, ls))
            else:
                _check_fp8_codes(per[p][lw.name][e].view(torch.uint8), key(e, p, lw))
                _positive_finite(per[p][ls.name][e], key(e, p, ls), "an FP8 weight scale")
    data13 = torch.stack([w13_rows(lw.name, e).view(torch.uint8) for e in experts])
    data2 = torch.stack([per["down_proj"][lw.name][e].view(torch.uint8) for e in experts])

    if family == "mx":  # E8M0 scale codes per 32, no global scale
        w13 = QuantizedWeight(data13, torch.stack([w13_rows(ls.name, e) for e in experts]), None)
        w2 = QuantizedWeight(data2, torch.stack([per["down_proj"][ls.name][e] for e in experts]), None)
    elif family == "nvfp4":  # NVFP4: E4M3 scale codes, one global scale per expert and weight
        scale13 = torch.stack([w13_rows(ls.name, e).view(torch.uint8) for e in experts])
        scale2 = torch.stack([per["down_proj"][ls.name][e].view(torch.uint8) for e in experts])
        g13, g2 = _one_per_expert(per, layout.global_scale, w13_parts, experts, key, "NVFP4 global scale",
                                  "ModelOpt's export and llm-compressor both fuse them, by the larger amax")
        w13 = QuantizedWeight(data13, scale13, g13)
        w2 = QuantizedWeight(data2, scale2, g2)
    elif layout.fp8_strategy == "tensor":  # one fp32 scale per expert, widened exactly from its stored dtype
        s13, s2 = _one_per_expert(per, ls, w13_parts, experts, key, "per-tensor FP8 weight scale",
                                  "llm-compressor's per-tensor FP8 keeps one per projection; vLLM requantizes such a "
                                  "w13 to the larger scale on load, a lossy step this loader does not take")
        w13 = QuantizedWeight(data13, s13.reshape(-1, 1, 1), None)
        w2 = QuantizedWeight(data2, s2.reshape(-1, 1, 1), None)
    else:  # 128x128 blocks: gate's block rows, then up's (I is a multiple of 128, so no block straddles the two)
        w13 = QuantizedWeight(data13, torch.stack([w13_rows(ls.name, e).float() for e in experts]), None)
        w2 = QuantizedWeight(data2, torch.stack([per["down_proj"][ls.name][e].float() for e in experts]), None)

    in13 = in2 = None
    if layout.input_scale is not None:
        f = layout.input_scale
        # the larger activation amax of gate and up: the larger decode scale, the smaller encode scale
        pick = torch.minimum if layout.convention == "encode" else torch.maximum
        vals = {p: [_positive_finite(per[p][f.name][e], key(e, p, f), f.what) for e in experts] for p in projections}
        in13 = torch.stack([vals[w13_parts[0]][e] if len(w13_parts) == 1 else pick(vals["gate_proj"][e],
                                                                                     vals["up_proj"][e])
                            for e in experts]).reshape(-1)
        in2 = torch.stack(vals["down_proj"]).reshape(-1)

    ckpt = MoECheckpoint(
        scheme=scheme_by_name(layout.scheme), activation=act, w13=w13, w2=w2, hidden_size=hidden,
        intermediate_size=inter, w13_input_scale=in13, w2_input_scale=in2,
        nvfp4_global_convention=layout.convention if family == "nvfp4" else "decode", fp8_format=E4M3FN)
    check_checkpoint(ckpt)
    if family == "nvfp4":
        _check_direction(ckpt, layout, w13_parts[0], prefix)
    return ckpt


def _one_per_expert(per, field: _Field, w13_parts, experts, key, what: str, why: str):
    """(w13's [E], w2's [E]) fp32 from a field that is one number per projection: gate's and up's must agree."""
    w13, w2 = [], []
    for e in experts:
        vals = [_positive_finite(per[p][field.name][e], key(e, p, field), what) for p in w13_parts]
        if len(vals) == 2 and not _same(vals[0], vals[1]):
            raise ValueError(
                f"{key(e, 'gate_proj', field)} = {vals[0].item()!r} and {key(e, 'up_proj', field)} = "
                f"{vals[1].item()!r} differ: the reference holds one {what} for an expert's whole w13 (gate and up "
                f"rows together, as fused MoE kernels do), so gate_proj's and up_proj's must be equal ({why})")
        w13.append(vals[0])
        w2.append(_positive_finite(per["down_proj"][field.name][e], key(e, "down_proj", field), what))
    return torch.cat(w13), torch.cat(w2)


def _check_direction(ckpt: MoECheckpoint, layout: _Layout, w13_proj: str, prefix: str) -> None:
    """Refuse a global scale whose reading implies weights DIRECTION_TOLERANCE times larger than the opposite
    reading would (module docstring)."""
    for wname, proj in (("w13", w13_proj), ("w2", "down_proj")):
        w: QuantizedWeight = getattr(ckpt, wname)
        stored = w.global_scale
        s_dec = stored if layout.convention == "decode" else 1.0 / stored
        # positive E4M3 codes order as their values, so the largest code is the largest block scale
        biggest = decode(w.scale.reshape(w.scale.shape[0], -1).amax(-1), E4M3FN) * _E2M1_MAX
        implied, other = biggest * s_dec, biggest / s_dec
        bad = implied > DIRECTION_TOLERANCE * other
        if bool(bad.any()):
            e = int(bad.nonzero()[0, 0])
            k = f"{prefix}{e}.{proj}.{layout.global_scale.name}"
            direction = ("decode (multiply on dequantization: ModelOpt's amax / 2688)" if layout.convention == "decode"
                         else "encode (divide on dequantization: compressed-tensors' 2688 / amax)")
            raise ValueError(
                f"{k} = {float(stored[e])!r} read in the {direction} direction implies weights up to "
                f"{float(implied[e]):.4g} (6 x the largest block scale x the decode scale), read the other way up to "
                f"{float(other[e]):.4g}: more than {DIRECTION_TOLERANCE:g}x apart, so the global scale direction is "
                f"wrong for this {layout.name} label (a scale stored in the other direction, or tensors relabelled "
                f"between producers)")


# ---- gpt-oss's MXFP4 layout: all experts of a layer fused in one tensor per field --------------------------------

_GPT_OSS = "gpt-oss MXFP4"


def _hf_module_excluded(name: str, pattern: str) -> bool:
    """transformers' modules_to_not_convert rule (quantizers_utils.should_convert_module): the pattern, as a regex,
    matches the module name from its start up to a module boundary (a "." or the end), or the name ends with it."""
    if name.endswith(pattern):
        return True
    try:
        return re.match(rf"(?:{pattern})(?:(?![^.])|(?<=\.))", name) is not None
    except re.error:
        return False


def _gpt_oss_fields(e: int) -> dict[str, _Field]:
    """The six tensors under model.layers.L.mlp.experts. (transformers' Mxfp4GptOssExperts parameters): n, k are the
    projection's output and input sizes (gate_up: 2I, H; down: H, I)."""
    blocks = lambda n, k: ((e, n, k // _MX_BLOCK, _MX_BLOCK // 2),)  # noqa: E731
    scales = lambda n, k: ((e, n, k // _MX_BLOCK),)  # noqa: E731
    bias = lambda n, k: ((e, n),)  # noqa: E731
    what_blocks = ("E2M1 codes, 16 bytes per block of 32 along K, element 2j of a block in byte j's low nibble "
                   "(transformers' convert_moe_packed_tensors)")
    what_scales = "E8M0 block scales (exponent + 127), one per 32 elements along K"
    return {
        "gate_up_proj_blocks": _Field("gate_up_proj_blocks", (torch.uint8,), blocks, what_blocks),
        "gate_up_proj_scales": _Field("gate_up_proj_scales", (torch.uint8,), scales, what_scales),
        "gate_up_proj_bias": _Field("gate_up_proj_bias", _HALF_PRECISION_OR_FP32, bias,
                                    "per-expert bias of the interleaved gate/up rows"),
        "down_proj_blocks": _Field("down_proj_blocks", (torch.uint8,), blocks, what_blocks),
        "down_proj_scales": _Field("down_proj_scales", (torch.uint8,), scales, what_scales),
        "down_proj_bias": _Field("down_proj_bias", _HALF_PRECISION_OR_FP32, bias, "per-expert bias of the output"),
    }


def _load_gpt_oss(root: Path, shards: _Shards, layer: int, prefix: str, scheme, activation, config: dict
                  ) -> MoECheckpoint:
    """gpt-oss's own MXFP4 checkpoint (config.json quantization_config {"quant_method": "mxfp4"}), as transformers'
    Mxfp4HfQuantizer reads it. Per layer, all E experts in one tensor per field (K is a projection's input dim):
      gate_up_proj_blocks  uint8 [E, 2I, H/32, 16]  E2M1 codes; block g's 16 bytes hold elements 32g .. 32g + 31,
                                                    element 32g + 2j in byte j's LOW nibble, 32g + 2j + 1 in its high
                                                    nibble (convert_moe_packed_tensors: lut[b & 0x0F] to the even
                                                    positions, lut[b >> 4] to the odd ones)
      gate_up_proj_scales  uint8 [E, 2I, H/32]      E8M0: the block's value is code * 2^(scale - 127)
      gate_up_proj_bias    bf16 [E, 2I]
      down_proj_blocks     uint8 [E, H, I/32, 16], down_proj_scales uint8 [E, H, I/32], down_proj_bias [E, H]
    Rows are output channels (transformers dequantizes to [E, N, K] and transposes to its [E, K, N] parameters);
    gate_up's rows interleave gate (2j) and up (2j + 1), as GptOssExperts splits gate_up[..., ::2] / [..., 1::2],
    which is the reference's SWIGLUOAI w13 layout; flattening [H/32, 16] to H/2 bytes is the reference's FP4
    packing. So bytes and scales pass through; biases widen exactly to fp32. Activation: SWIGLUOAI (gpt-oss's
    clamped SwiGLU, limit 7, alpha 1.702) unless another gated one is asked for (its rows are then un-interleaved
    into gate then up halves). Scheme w_mxfp4: activations stay bf16."""
    where = root / "config.json"
    qc = config["quantization_config"]
    experts_module = prefix[:-1]
    for pat in qc.get("modules_to_not_convert") or []:
        if _hf_module_excluded(experts_module, pat):
            raise ValueError(f"{where}: quantization_config.modules_to_not_convert {pat!r} matches {experts_module}: "
                             f"those experts are not quantized (bf16 experts are not a quantized layout)")
    act = activation if isinstance(activation, Activation) else activation_by_name(activation or "SWIGLUOAI")
    if not act.gated:
        raise ValueError(f"{act.name} has no gate, but gpt-oss's {prefix}gate_up_proj_* hold gate and up rows")
    if scheme is not None and scheme_by_name(scheme).name != "w_mxfp4":
        raise ValueError(f"{root} holds w_mxfp4 ({_GPT_OSS}), not {scheme_by_name(scheme).name}")

    names = {k[len(prefix):]: k for k in shards.where if k.startswith(prefix)}
    if not names:
        layers = sorted({int(m.group(1)) for key in shards.where
                         if (m := re.match(r"model\.layers\.(\d+)\.mlp\.experts\.", key))})
        raise ValueError(f"no tensors under {prefix}: layer {layer} has no MoE experts here (layers with experts: "
                         f"{layers})")
    probe = _gpt_oss_fields(0)
    foreign = sorted(set(names) - set(probe))
    if foreign:
        raise ValueError(f"{names[foreign[0]]}: {', '.join(repr(f) for f in foreign)} "
                         f"{'is not a tensor' if len(foreign) == 1 else 'are not tensors'} of the {_GPT_OSS} layout "
                         f"(its tensors: {', '.join(probe)}; per-expert tensors are another producer's layout)")
    for name, f in probe.items():
        if name not in names:
            raise ValueError(f"{prefix}{name} is missing: the {_GPT_OSS} layout stores {name} ({f.what}) for every "
                             f"MoE layer")

    # sizes from gate_up_proj_blocks [E, 2I, H/32, 16]
    key13 = prefix + "gate_up_proj_blocks"
    shape13 = tuple(shards.get(key13).shape)
    if len(shape13) != 4 or shape13[3] != _MX_BLOCK // 2 or shape13[1] % 2:
        raise ValueError(f"{key13} must be 4-d [E, 2I, H/32, 16] ({_GPT_OSS}: E2M1 codes, 16 bytes per block of 32 "
                         f"along H), got {list(shape13)}")
    e, hidden, inter = shape13[0], shape13[2] * _MX_BLOCK, shape13[1] // 2
    if inter % _MX_BLOCK:
        raise ValueError(f"{key13}: intermediate size I = {inter} (half of {shape13[1]} rows) is not a multiple of 32: "
                         f"down_proj_blocks has whole blocks of 32 along I")
    for field, v in (("num_local_experts", e), ("hidden_size", hidden), ("intermediate_size", inter)):
        if field in config and config[field] != v:
            raise ValueError(f"{where}: {field} = {config[field]!r}, but {key13} {list(shape13)} holds {v}")
    if act.formula == "SWIGLUOAI":
        for field, v in (("swiglu_limit", act.limit), ("swiglu_alpha", act.alpha)):
            if field in config and float(config[field]) != float(v):
                raise ValueError(f"{where}: {field} = {config[field]!r}: the reference's {act.name} has {v} (gpt-oss's "
                                 f"clamped SwiGLU)")

    layout = _Layout(_GPT_OSS, "w_mxfp4", probe["gate_up_proj_blocks"], probe["gate_up_proj_scales"], mx=True)
    fields = _gpt_oss_fields(e)
    sizes = {"gate_up_proj": (2 * inter, hidden), "down_proj": (hidden, inter)}
    t = {}
    for name, f in fields.items():
        n, k = sizes[name.rsplit("_", 1)[0]]
        t[name] = _read(shards, prefix + name, f, n, k, layout)
    for proj in sizes:
        _check_e8m0_scales(t[f"{proj}_scales"], prefix + f"{proj}_scales")
        bias = t[f"{proj}_bias"]
        if not bool(torch.isfinite(bias).all()):
            raise ValueError(f"{prefix}{proj}_bias holds non-finite values")

    data13 = t["gate_up_proj_blocks"].reshape(e, 2 * inter, hidden // 2)
    data2 = t["down_proj_blocks"].reshape(e, hidden, inter // 2)
    scale13, b13 = t["gate_up_proj_scales"], t["gate_up_proj_bias"].float()
    if not act.interleaved:  # gate rows (even) first, then up rows (odd)
        rows = torch.cat([torch.arange(0, 2 * inter, 2), torch.arange(1, 2 * inter, 2)])
        data13, scale13, b13 = data13[:, rows], scale13[:, rows], b13[:, rows]
    ckpt = MoECheckpoint(
        scheme=scheme_by_name("w_mxfp4"), activation=act,
        w13=QuantizedWeight(data13.contiguous(), scale13.contiguous(), None),
        w2=QuantizedWeight(data2.contiguous(), t["down_proj_scales"].contiguous(), None),
        hidden_size=hidden, intermediate_size=inter, b13=b13.contiguous(), b2=t["down_proj_bias"].float())
    check_checkpoint(ckpt)
    return ckpt
