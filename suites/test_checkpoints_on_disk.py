"""Checkpoint formats in (issue 27): harness.inputs.checkpoints_on_disk.load_moe_layer reads one MoE layer of a model
directory that the producing tool itself wrote (harness.peers.checkpoint_writers: ModelOpt's NVFP4QTensor,
compressed-tensors' NVFP4 and FP8 compressors, AMD Quark's MX cast and export packing, 2 layers of 4 experts; gpt-oss's
fused MXFP4 layout from the reference's quantize_mx, since transformers' MXFP4 quantizer has no CPU path), and the
reference's dequantization of what it loaded is the tool's own dequantization of the same on-disk tensors: bit for
bit where the tool rounds once (FP8, MXFP4: Quark's importer and upcast, transformers' convert_moe_packed_tensors),
and the tool's known double rounding where it rounds twice (NVFP4, as in the peer suites). The tool unpacks the
on-disk nibbles its own way and the reference unpacks them with reference.packing.unpack_fp4; equal dequantizations
prove that both producers' nibble order is the reference's. Then the refusals: a global scale read in the wrong
direction, per-channel FP8, unfused per-tensor gate/up scales, and missing, mistyped or misshaped tensors, each
error naming the key or config field."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from harness.inputs.checkpoints_on_disk import load_moe_layer
from harness.peers.checkpoint_writers import (GPT_OSS_NOT_CONVERTED, ct_quantization_config, expert_key, write_ct_fp8,
                                             write_ct_nvfp4, write_gpt_oss_mxfp4, write_modelopt_nvfp4,
                                             write_quark_mxfp4)
from harness.peers.compressed_tensors_adapter import compressed_tensors_available
from harness.peers.modelopt_adapter import modelopt_available
from harness.peers.quark_adapter import quark_available
from reference.checkpoints import check_checkpoint, dequantize_weight
from reference.formats import E2M1, E4M3FN, decode
from reference.packing import unpack_fp4

_MO = modelopt_available()
_CT = compressed_tensors_available()
needs_modelopt = pytest.mark.skipif(not _MO[0], reason=_MO[1])
needs_ct = pytest.mark.skipif(not _CT[0], reason=_CT[1])
_QUARK = quark_available()
needs_quark = pytest.mark.skipif(not _QUARK[0], reason=_QUARK[1])
needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="transformers is not installed")
by_the_reference = pytest.mark.skipif(False, reason="written by the reference's own MX quantizer")

LAYER, EXPERTS = 1, 4
SHARD = "model-00002-of-00002.safetensors"  # layer 1's shard (the writers put one layer in each)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Each writer's directory once per module: made(name, writer, **kwargs) -> Path."""
    cache: dict[str, Path] = {}

    def get(name: str, writer, **kwargs) -> Path:
        if name not in cache:
            cache[name] = writer(tmp_path_factory.mktemp(name), **kwargs)
        return cache[name]

    return get


def _disk(root: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(root / SHARD))


def _rows(ckpt, e: int):
    """{projection: the reference's fp32 dequantization of that projection's rows of expert e}."""
    w13 = dequantize_weight(ckpt.w13, ckpt.scheme.weight, ckpt)[e]
    i = ckpt.intermediate_size
    return {"gate_proj": w13[:i], "up_proj": w13[i:], "down_proj": dequantize_weight(ckpt.w2, ckpt.scheme.weight,
                                                                                     ckpt)[e]}


def _escaped(key: str) -> str:
    return key.replace(".", r"\.")


def _nvfp4_parts(packed: torch.Tensor, block_scales: torch.Tensor):
    """(e2m1 values, per-element E4M3 block scale values) of on-disk NVFP4 bytes, through the reference's unpacking."""
    return decode(unpack_fp4(packed), E2M1), decode(block_scales.view(torch.uint8), E4M3FN).repeat_interleave(16, -1)


# ---- each layout, against its tool ------------------------------------------------------------------------------


@needs_modelopt
@pytest.mark.parametrize("input_scales", [True, False], ids=["NVFP4", "W4A16_NVFP4"])
def test_modelopt_nvfp4_layer_is_what_modelopt_dequantizes(made, input_scales):
    """ModelOpt's NVFP4QTensor.dequantize of each on-disk projection is fl(fl(stored * weight_scale_2) * e2m1) (two
    roundings, as suites/test_peers_modelopt.py asserts); the loaded checkpoint's dequantization is the one rounding
    of the exact product of the same codes and scales, so the two agree within two fp32 roundings. Global scales are
    each expert's own (decode direction), input scales the larger of gate's and up's."""
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    root = made(f"modelopt_{input_scales}", write_modelopt_nvfp4, input_scales=input_scales)
    ckpt = load_moe_layer(root, LAYER)
    check_checkpoint(ckpt)
    assert ckpt.scheme.name == ("w_nvfp4_a_nvfp4" if input_scales else "w_nvfp4")
    assert ckpt.nvfp4_global_convention == "decode" and ckpt.num_experts == EXPERTS
    assert (ckpt.hidden_size, ckpt.intermediate_size) == (64, 32)
    disk = _disk(root)
    for e in range(EXPERTS):
        ours = _rows(ckpt, e)
        for proj, rows in ours.items():
            packed, block_scales, s2 = (disk[expert_key(LAYER, e, proj, f)] for f in
                                        ("weight", "weight_scale", "weight_scale_2"))
            qt = NVFP4QTensor(rows.shape, torch.float32, packed)
            theirs = qt.dequantize(torch.float32, scale=block_scales, double_scale=s2, block_sizes={-1: 16})
            e2m1, stored = _nvfp4_parts(packed, block_scales)
            assert torch.equal(theirs, (stored * s2) * e2m1)
            assert torch.equal(rows, (e2m1.double() * stored.double() * s2.double()).float())
            assert bool(((theirs.double() - rows.double()).abs() <= rows.double().abs() * 2.0**-23).all())
        assert float(ckpt.w13.global_scale[e]) == float(disk[expert_key(LAYER, e, "gate_proj", "weight_scale_2")])
        assert float(ckpt.w2.global_scale[e]) == float(disk[expert_key(LAYER, e, "down_proj", "weight_scale_2")])
        if input_scales:
            gate, up, down = (float(disk[expert_key(LAYER, e, p, "input_scale")]) for p in
                              ("gate_proj", "up_proj", "down_proj"))
            assert float(ckpt.w13_input_scale[e]) == max(gate, up) and float(ckpt.w2_input_scale[e]) == down
    assert ckpt.w13.global_scale.unique().numel() == EXPERTS  # per expert, not one for the layer
    assert (ckpt.w13_input_scale is None) == (not input_scales)


@needs_ct
@pytest.mark.parametrize("input_scales", [True, False], ids=["NVFP4", "NVFP4A16"])
def test_ct_nvfp4_layer_is_what_compressed_tensors_dequantizes(made, input_scales):
    """compressed-tensors' dequantize of each on-disk projection (unpack_fp4_from_uint8 of weight_packed, to fp32) is
    fl(e2m1 * fl(stored / weight_global_scale)); its checkpoint decompressor returns the same rounded to bf16. The
    loaded checkpoint (encode direction) dequantizes the same codes and scales with one rounding: within 2^-22 of
    the tool's wherever the tool's divisor and result are normal fp32 (suites/test_peers_compressed_tensors.py)."""
    from compressed_tensors.compressors.nvfp4 import NVFP4PackedCompressor
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme

    scheme = preset_name_to_scheme("NVFP4" if input_scales else "NVFP4A16", ["Linear"])
    root = made(f"ct_nvfp4_{input_scales}", write_ct_nvfp4, input_scales=input_scales)
    ckpt = load_moe_layer(root, LAYER)
    check_checkpoint(ckpt)
    assert ckpt.scheme.name == ("w_nvfp4_a_nvfp4" if input_scales else "w_nvfp4")
    assert ckpt.nvfp4_global_convention == "encode"
    disk = _disk(root)
    for e in range(EXPERTS):
        for proj, rows in _rows(ckpt, e).items():
            packed, block_scales, gs = (disk[expert_key(LAYER, e, proj, f)] for f in
                                        ("weight_packed", "weight_scale", "weight_global_scale"))
            n, k = rows.shape
            theirs = dequantize(unpack_fp4_from_uint8(packed, n, k, dtype=torch.float32), block_scales.float(),
                                args=scheme.weights, dtype=torch.float32, global_scale=gs)
            e2m1, stored = _nvfp4_parts(packed, block_scales)
            assert torch.equal(theirs, e2m1 * (stored / gs))
            s_dec = (1.0 / gs).double()
            assert torch.equal(rows, (e2m1.double() * stored.double() * s_dec).float())
            decompressed = NVFP4PackedCompressor.decompress(
                {"weight_packed": packed, "weight_scale": block_scales, "weight_global_scale": gs}, scheme)["weight"]
            assert torch.equal(decompressed, theirs.to(torch.bfloat16))
            normal = ((stored / gs) >= 2.0**-126) & (rows.abs() >= 2.0**-126)
            assert bool(((theirs.double() - rows.double()).abs() <= rows.double().abs() * 2.0**-22)[normal].all())
        assert float(ckpt.w13.global_scale[e]) == float(disk[expert_key(LAYER, e, "up_proj", "weight_global_scale")])
        if input_scales:
            gate, up, down = (float(disk[expert_key(LAYER, e, p, "input_global_scale")]) for p in
                              ("gate_proj", "up_proj", "down_proj"))
            # encode direction: the larger activation amax is the smaller scale
            assert float(ckpt.w13_input_scale[e]) == min(gate, up) and float(ckpt.w2_input_scale[e]) == down
    assert ckpt.w13.global_scale.unique().numel() == EXPERTS


@needs_ct
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float32], ids=["bf16_model", "fp32_model"])
@pytest.mark.parametrize("strategy", ["tensor", "block"])
def test_ct_fp8_layer_is_what_compressed_tensors_dequantizes(made, strategy, scale_dtype):
    """FP8 dequantization rounds once on both sides: compressed-tensors' dequantize with the on-disk scale widened to
    fp32 is the loaded checkpoint's dequantization bit for bit (code * scale is exact in fp32: 4 + 8 significant
    bits); in the scale's own dtype (bf16 for a bf16 model) it is that exact product rounded once to bf16."""
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme

    args = preset_name_to_scheme({"tensor": "FP8", "block": "FP8_BLOCK"}[strategy], ["Linear"]).weights
    root = made(f"ct_fp8_{strategy}_{scale_dtype}", write_ct_fp8, strategy=strategy, scale_dtype=scale_dtype)
    ckpt = load_moe_layer(root, LAYER)
    check_checkpoint(ckpt)
    assert ckpt.scheme.name == {"tensor": "w_fp8_a_fp8", "block": "w_fp8_a_fp8_block"}[strategy]
    assert (ckpt.hidden_size, ckpt.intermediate_size) == (128, 128)
    disk = _disk(root)
    for e in range(EXPERTS):
        for proj, rows in _rows(ckpt, e).items():
            codes, scale = disk[expert_key(LAYER, e, proj, "weight")], disk[expert_key(LAYER, e, proj, "weight_scale")]
            assert scale.dtype == scale_dtype
            assert torch.equal(dequantize(codes, scale.float(), args=args), rows)
            assert torch.equal(dequantize(codes, scale, args=args), rows.to(scale_dtype))
        if strategy == "tensor":
            gate, up, down = (disk[expert_key(LAYER, e, p, "input_scale")].float() for p in
                              ("gate_proj", "up_proj", "down_proj"))
            assert torch.equal(ckpt.w13_input_scale[e:e + 1], torch.maximum(gate, up))
            assert torch.equal(ckpt.w2_input_scale[e:e + 1], down)
            assert torch.equal(ckpt.w13.scale[e].reshape(1), disk[expert_key(LAYER, e, "gate_proj",
                                                                               "weight_scale")].float())
    assert (ckpt.w13_input_scale is None) == (strategy == "block")


@needs_quark
@pytest.mark.parametrize("input_mx", [True, False], ids=["w_mxfp4_a_mxfp4", "w_mxfp4"])
def test_quark_mxfp4_layer_is_what_quark_dequantizes(made, input_mx):
    """AMD Quark's OCP MXFP4 export (quant_method "quark"): the reference's dequantization of the loaded layer is, bit
    for bit (a power-of-two scale times an E2M1 value is exact), both of Quark's own readings of the on-disk bytes:
    its importer's (Pack_fp4.unpack, then the E8M0 scale 2^(code - 127) as RealQuantizer.unpack_params decodes it,
    per block of 32) and its MX kernel's torch twin (upcast_from_mxfp_torch). The exporter's packing (Pack_fp4.pack)
    and the cast's own (downcast_to_mxfp_torch) are the same bytes: element 2j in the low nibble. Dynamic MX inputs
    in the config make the scheme w_mxfp4_a_mxfp4 (no input scale on disk); none, w_mxfp4."""
    from harness.peers.quark_adapter import _mx_module

    mx = _mx_module()
    from quark.torch.utils.pack import Pack_fp4

    root = made(f"quark_{input_mx}", write_quark_mxfp4, input_mx=input_mx)
    qc = json.loads((root / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "quark" and qc["global_quant_config"]["weight"]["dtype"] == "fp4"
    ckpt = load_moe_layer(root, LAYER)
    check_checkpoint(ckpt)
    assert ckpt.scheme.name == ("w_mxfp4_a_mxfp4" if input_mx else "w_mxfp4")
    assert (ckpt.num_experts, ckpt.hidden_size, ckpt.intermediate_size) == (EXPERTS, 64, 32)
    disk = _disk(root)
    assert not any(k.endswith("input_scale") for k in disk)
    for e in range(EXPERTS):
        for proj, rows in _rows(ckpt, e).items():
            packed, scale = disk[expert_key(LAYER, e, proj, "weight")], disk[expert_key(LAYER, e, proj, "weight_scale")]
            assert packed.dtype == scale.dtype == torch.uint8
            n, k = rows.shape
            assert packed.shape == (n, k // 2) and scale.shape == (n, k // 32)
            values = Pack_fp4("per_group", "fp4").unpack(packed, True)
            block = torch.exp2(scale.float() - 127).repeat_interleave(32, -1)
            assert torch.equal(values * block, rows)
            assert torch.equal(mx.upcast_from_mxfp_torch(packed, scale, torch.float32, axis=-1), rows)
            # re-cast with Quark's EVEN rule: the dequantized rows are their own MX values, same bytes and scales
            q, s = mx.downcast_to_mxfp_torch(rows, torch.uint8, axis=-1,
                                             DEQUANT_SCALE_ROUNDING_MODE=mx.DequantScaleRoundingMode.EVEN)
            assert torch.equal(mx.upcast_from_mxfp_torch(q, s, torch.float32, axis=-1), rows)


@needs_quark
def test_quark_configs_that_are_not_ocp_mxfp4_are_refused_naming_the_field(made, tmp_path):
    src = made("quark_True", write_quark_mxfp4, input_mx=True)

    def with_config(name: str, edit) -> Path:
        root = shutil.copytree(src, tmp_path / name)
        config = json.loads((root / "config.json").read_text())
        edit(config["quantization_config"])
        (root / "config.json").write_text(json.dumps(config))
        return root

    def legacy_mx(qc):
        qc["global_quant_config"]["weight"].update(dtype="mx", mx_element_dtype="fp4")

    def static_inputs(qc):
        qc["global_quant_config"]["input_tensors"]["is_dynamic"] = False

    def excluded(qc):
        qc["exclude"].append("*.experts.*")

    def nvfp4_group(qc):
        qc["layer_quant_config"]["*.experts.*"] = dict(qc["global_quant_config"])
        qc["layer_quant_config"]["*.experts.*"]["weight"] = dict(qc["global_quant_config"]["weight"], group_size=16)

    for name, edit, pattern in (
            ("legacy", legacy_mx, r"global_quant_config\.weight\.dtype = 'mx': Quark's legacy MX dtype .* "
                                  r"unbiased int8"),
            ("static", static_inputs, r"global_quant_config\.input_tensors\.is_dynamic = False"),
            ("excluded", excluded, r"exclude '\*\.experts\.\*' matches model\.layers\.1\.mlp\.experts\.0\.gate_proj"),
            ("group16", nvfp4_group, r"layer_quant_config\['\*\.experts\.\*'\]\.weight\.group_size = 16")):
        with pytest.raises(ValueError, match=pattern):
            load_moe_layer(with_config(name, edit), LAYER)


def _gpt_oss_tensors(root: Path, layer: int = LAYER) -> dict[str, torch.Tensor]:
    disk = _disk(root)
    prefix = f"model.layers.{layer}.mlp.experts."
    return {k[len(prefix):]: v for k, v in disk.items() if k.startswith(prefix)}


@needs_transformers
def test_gpt_oss_mxfp4_layer_is_what_transformers_dequantizes(made):
    """gpt-oss's fused MXFP4 layout (written from the reference's quantize_mx: transformers' quantizer needs the
    triton_kernels hub). transformers' own reader, convert_moe_packed_tensors (FP4 LUT, low nibble to the even
    element, ldexp by scale - 127, transposed to its [E, K, N] parameters), gives the reference's dequantization of
    the loaded layer bit for bit, in fp32 and in its default bf16; the biases are the files' widened to fp32. Then
    transformers' GptOssExperts, loaded with those dequantized parameters, computes the reference's exact MoE
    (float64): gate/up interleaving, SWIGLUOAI's clamp (limit 7, alpha 1.702) and both biases sit where gpt-oss puts
    them."""
    from transformers import GptOssConfig
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    from reference.moe import fused_moe

    root = made("gpt_oss", write_gpt_oss_mxfp4)
    ckpt = load_moe_layer(root, LAYER)
    check_checkpoint(ckpt)
    assert ckpt.scheme.name == "w_mxfp4" and ckpt.activation.name == "SWIGLUOAI"
    assert (ckpt.activation.limit, ckpt.activation.alpha) == (7.0, 1.702)
    assert (ckpt.num_experts, ckpt.hidden_size, ckpt.intermediate_size) == (EXPERTS, 64, 32)
    t = _gpt_oss_tensors(root)
    params = {}
    for name, ours in (("gate_up_proj", ckpt.w13), ("down_proj", ckpt.w2)):
        rows = dequantize_weight(ours, ckpt.scheme.weight, ckpt)
        theirs = convert_moe_packed_tensors(t[f"{name}_blocks"], t[f"{name}_scales"], dtype=torch.float32)
        assert torch.equal(theirs, rows.transpose(1, 2))
        bf16 = convert_moe_packed_tensors(t[f"{name}_blocks"], t[f"{name}_scales"])
        assert torch.equal(bf16, rows.transpose(1, 2).to(torch.bfloat16))
        params[name] = theirs
    assert torch.equal(ckpt.b13, t["gate_up_proj_bias"].float()) and torch.equal(ckpt.b2, t["down_proj_bias"].float())

    config = GptOssConfig(hidden_size=64, intermediate_size=32, num_local_experts=EXPERTS, num_experts_per_tok=2)
    experts = GptOssExperts(config).double()
    with torch.no_grad():
        experts.gate_up_proj.copy_(params["gate_up_proj"])
        experts.down_proj.copy_(params["down_proj"])
        experts.gate_up_proj_bias.copy_(t["gate_up_proj_bias"])
        experts.down_proj_bias.copy_(t["down_proj_bias"])
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(16, 64, generator=g) * 2).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(EXPERTS, generator=g)[:2] for _ in range(16)])
    w = torch.rand(16, 2, generator=g)
    with torch.no_grad():
        theirs = experts(x.double(), router_indices=ids, routing_weights=w.double())
    ours = fused_moe(x, ckpt, w, ids, exact=True)
    assert torch.allclose(ours.double(), theirs, rtol=1e-9, atol=1e-9), (ours.double() - theirs).abs().max()


@needs_transformers
def test_gpt_oss_module_exclusion_is_transformers_rule():
    """modules_to_not_convert is matched as transformers' should_convert_module matches it (regex from the start to
    a module boundary, or a suffix): gpt-oss's own list leaves the experts quantized; others exclude them."""
    from transformers.quantizers.quantizers_utils import should_convert_module

    from harness.inputs.checkpoints_on_disk import _hf_module_excluded

    name = f"model.layers.{LAYER}.mlp.experts"
    for pattern in GPT_OSS_NOT_CONVERTED + ["model.layers.1", "model.layers.11", "experts", "mlp.experts",
                                            "model.layers.*.mlp", "model.layers.1.", "layers.1.mlp", "exp"]:
        assert _hf_module_excluded(name, pattern) == (not should_convert_module(name, [pattern])), pattern


def test_gpt_oss_layouts_that_do_not_fit_are_refused_naming_the_key(made, tmp_path):
    src = made("gpt_oss", write_gpt_oss_mxfp4)
    prefix = f"model.layers.{LAYER}.mlp.experts."
    assert load_moe_layer(src, LAYER, activation="silu").activation.name == "SILU"  # halves, un-interleaved
    halves, inter = load_moe_layer(src, LAYER, activation="silu"), load_moe_layer(src, LAYER)
    i = inter.intermediate_size
    for a, b in ((halves.w13.data, inter.w13.data), (halves.w13.scale, inter.w13.scale), (halves.b13, inter.b13)):
        assert torch.equal(a[:, :i], b[:, 0::2]) and torch.equal(a[:, i:], b[:, 1::2])

    def pop_bias(t):
        t.pop(prefix + "down_proj_bias")

    def nan_scale(t):
        t[prefix + "gate_up_proj_scales"][0, 0, 0] = 0xFF

    def per_expert(t):
        t[prefix + "0.gate_proj.weight"] = torch.zeros(32, 32, dtype=torch.uint8)

    def flat_blocks(t):
        t[prefix + "down_proj_blocks"] = t[prefix + "down_proj_blocks"].flatten(-2)

    for name, edit, pattern in (
            ("bias", pop_bias, rf"{_escaped(prefix)}down_proj_bias is missing: the gpt-oss MXFP4 layout"),
            ("nan", nan_scale, rf"{_escaped(prefix)}gate_up_proj_scales holds E8M0 NaN scale codes"),
            ("foreign", per_expert, rf"{_escaped(prefix)}0\.gate_proj\.weight: '0\.gate_proj\.weight' is not a "
                                    rf"tensor of the gpt-oss MXFP4 layout"),
            ("flat", flat_blocks, rf"{_escaped(prefix)}down_proj_blocks must be uint8 \[4, 64, 1, 16\] .* got uint8 "
                                  rf"\[4, 64, 16\]")):
        with pytest.raises(ValueError, match=pattern):
            load_moe_layer(_mutated(src, tmp_path / name, edit), LAYER)
    with pytest.raises(ValueError, match="holds w_mxfp4 .*, not w_mxfp4_a_mxfp4"):
        load_moe_layer(src, LAYER, scheme="w_mxfp4_a_mxfp4")
    with pytest.raises(ValueError, match="RELU2_NO_MUL has no gate"):
        load_moe_layer(src, LAYER, activation="relu2_no_mul")
    excluded = shutil.copytree(src, tmp_path / "excluded")
    config = json.loads((excluded / "config.json").read_text())
    config["quantization_config"]["modules_to_not_convert"].append("model.layers.*.mlp.experts")
    (excluded / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"modules_to_not_convert 'model\.layers\.\*\.mlp\.experts' matches"):
        load_moe_layer(excluded, LAYER)


# ---- refusals ----------------------------------------------------------------------------------------------------


@needs_ct
def test_ct_fp8_per_channel_is_refused_as_having_no_reference_scheme(made):
    root = made("ct_fp8_channel", write_ct_fp8, strategy="channel")
    with pytest.raises(ValueError, match=r"weights\.strategy = 'channel': per-channel FP8 weights .* no reference "
                                         r"scheme"):
        load_moe_layer(root, LAYER)


@needs_ct
def test_ct_fp8_per_projection_gate_and_up_scales_are_refused(made):
    """llm-compressor's per-tensor FP8 keeps one scale per projection; the reference holds one per expert's w13, and
    making one of two (vLLM requantizes to the larger) would change the weights: refused, naming both keys."""
    root = made("ct_fp8_unfused", write_ct_fp8, strategy="tensor", fuse_gate_up=False)
    gate = _escaped(expert_key(LAYER, 0, "gate_proj", "weight_scale"))
    up = _escaped(expert_key(LAYER, 0, "up_proj", "weight_scale"))
    with pytest.raises(ValueError, match=rf"{gate} = .* and {up} = .* differ"):
        load_moe_layer(root, LAYER)


def _relabelled(src: Path, dst: Path, renames: dict[str, tuple[str, tuple[int, ...] | None]], config: dict,
                hf_quant_config: dict | None) -> Path:
    """src's tensors with every expert field renamed (old -> (new, shape or None to keep it)), under another
    producer's config: what a converter that renames keys but keeps the stored numbers would write."""
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    for f in src.glob("*.safetensors"):
        out = {}
        for k, v in load_file(str(f)).items():
            field = k.rsplit(".", 1)[-1]
            if ".mlp.experts." in k and field in renames:
                new, shape = renames[field]
                k, v = k[: -len(field)] + new, (v if shape is None else v.reshape(shape))
            out[k] = v
        save_file(out, str(dst / f.name))
    (dst / "config.json").write_text(json.dumps(config))
    if hf_quant_config is not None:
        (dst / "hf_quant_config.json").write_text(json.dumps(hf_quant_config))
    return dst


def _relabelled_as_modelopt(src: Path, dst: Path) -> Path:
    """A compressed-tensors NVFP4 layer under a ModelOpt export's names and configs, its numbers kept."""
    from modelopt.torch.export.convert_hf_config import convert_hf_quant_config_format

    hf = {"producer": {"name": "modelopt", "version": _MO[1]},
          "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                           "exclude_modules": ["lm_head"]}}
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = convert_hf_quant_config_format(hf)
    return _relabelled(src, dst, {"weight_packed": ("weight", None), "weight_global_scale": ("weight_scale_2", ()),
                                  "input_global_scale": ("input_scale", ())}, config, hf)


@needs_modelopt
@needs_ct
def test_ct_global_scales_relabelled_as_modelopt_are_refused_naming_the_direction(made, tmp_path):
    """compressed-tensors' encode-direction weight_global_scale (2688 / amax, hundreds here) stored as ModelOpt's
    weight_scale_2 and read as a decode scale implies weights of ~2688^2 / amax: refused as a global scale
    direction error naming the key, not dequantized to garbage."""
    root = _relabelled_as_modelopt(made("ct_nvfp4_True", write_ct_nvfp4, input_scales=True), tmp_path / "relabelled")
    key = _escaped(expert_key(LAYER, 0, "gate_proj", "weight_scale_2"))
    with pytest.raises(ValueError, match=rf"{key} = .* decode .* global scale direction is wrong"):
        load_moe_layer(root, LAYER)


@needs_modelopt
@needs_ct
def test_modelopt_global_scales_relabelled_as_compressed_tensors_are_refused_naming_the_direction(made, tmp_path):
    """The converse: ModelOpt's decode-direction weight_scale_2 (amax / 2688, ~1e-3 here) as compressed-tensors'
    weight_global_scale is read as an encode scale, implying weights of ~2688^2 / amax."""
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme

    src = made("modelopt_True", write_modelopt_nvfp4, input_scales=True)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = ct_quantization_config(preset_name_to_scheme("NVFP4", ["Linear"]),
                                                           "nvfp4-pack-quantized")
    root = _relabelled(src, tmp_path / "relabelled", {"weight": ("weight_packed", None),
                                                      "weight_scale_2": ("weight_global_scale", (1,)),
                                                      "input_scale": ("input_global_scale", (1,))}, config, None)
    key = _escaped(expert_key(LAYER, 0, "gate_proj", "weight_global_scale"))
    with pytest.raises(ValueError, match=rf"{key} = .* encode .* global scale direction is wrong"):
        load_moe_layer(root, LAYER)


@needs_modelopt
def test_modelopt_config_json_alone_is_read_and_a_conflicting_label_is_refused(made, tmp_path):
    """ModelOpt's export repeats hf_quant_config.json in config.json (quant_method "modelopt"): either one says the
    layout. A directory labelled both ModelOpt (hf_quant_config.json) and compressed-tensors (config.json) is
    ambiguous and refused."""
    src = made("modelopt_True", write_modelopt_nvfp4, input_scales=True)
    alone = shutil.copytree(src, tmp_path / "alone")
    (alone / "hf_quant_config.json").unlink()
    a, b = load_moe_layer(src, LAYER), load_moe_layer(alone, LAYER)
    assert a.scheme == b.scheme and torch.equal(a.w13.data, b.w13.data) and torch.equal(a.w2.global_scale,
                                                                                          b.w2.global_scale)
    both = shutil.copytree(src, tmp_path / "both")
    config = json.loads((both / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "compressed-tensors", "config_groups": {}}
    (both / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="hf_quant_config.json says ModelOpt, config.json's quantization_config says "
                                         "quant_method 'compressed-tensors'"):
        load_moe_layer(both, LAYER)


def _mutated(src: Path, dst: Path, fn) -> Path:
    """A copy of src whose layer-1 shard went through fn(tensors dict) (in place)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / SHARD))
    fn(tensors)
    save_file(tensors, str(dst / SHARD))
    return dst


@needs_ct
def test_a_missing_tensor_is_named(made, tmp_path):
    key = expert_key(LAYER, 2, "up_proj", "weight_scale")
    root = _mutated(made("ct_nvfp4_True", write_ct_nvfp4, input_scales=True), tmp_path / "m", lambda t: t.pop(key))
    with pytest.raises(ValueError, match=rf"{_escaped(key)} is missing: the compressed-tensors NVFP4 layout"):
        load_moe_layer(root, LAYER)


@needs_ct
def test_a_wrong_dtype_is_named_with_the_one_expected(made, tmp_path):
    key = expert_key(LAYER, 1, "down_proj", "weight_scale")

    def to_uint8(t):  # the same bytes as raw uint8: a writer that forgot the E4M3 dtype
        t[key] = t[key].view(torch.uint8)

    root = _mutated(made("ct_nvfp4_True", write_ct_nvfp4, input_scales=True), tmp_path / "m", to_uint8)
    with pytest.raises(ValueError, match=rf"{_escaped(key)} must be float8_e4m3fn \[64, 2\] .* got uint8 \[64, 2\]"):
        load_moe_layer(root, LAYER)


@needs_ct
def test_a_wrong_shape_is_named_with_the_one_expected(made, tmp_path):
    key = expert_key(LAYER, 3, "gate_proj", "weight_packed")

    def unpacked(t):  # one code per byte: a writer that did not pack
        t[key] = unpack_fp4(t[key])

    root = _mutated(made("ct_nvfp4_True", write_ct_nvfp4, input_scales=True), tmp_path / "m", unpacked)
    with pytest.raises(ValueError, match=rf"{_escaped(key)} must be uint8 \[32, 32\] .* got uint8 \[32, 64\]"):
        load_moe_layer(root, LAYER)


@needs_ct
def test_gate_and_up_global_scales_that_differ_are_named(made, tmp_path):
    key = expert_key(LAYER, 0, "up_proj", "weight_global_scale")

    def halve(t):
        t[key] = t[key] / 2

    root = _mutated(made("ct_nvfp4_True", write_ct_nvfp4, input_scales=True), tmp_path / "m", halve)
    with pytest.raises(ValueError, match=rf"gate_proj\.weight_global_scale = .* and {_escaped(key)} = .* differ"):
        load_moe_layer(root, LAYER)


@needs_ct
def test_foreign_field_names_under_a_label_are_named(made, tmp_path):
    """compressed-tensors' tensors under a ModelOpt label, keys not renamed: the foreign fields are named."""
    src = made("ct_nvfp4_True", write_ct_nvfp4, input_scales=True)
    root = shutil.copytree(src, tmp_path / "m")
    (root / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4", "group_size": 16}}))
    config = json.loads((root / "config.json").read_text())
    del config["quantization_config"]
    (root / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"'input_global_scale', 'weight_global_scale', 'weight_packed' are "
                                         r"not fields of the ModelOpt NVFP4 layout"):
        load_moe_layer(root, LAYER)


@needs_ct
def test_scheme_layer_and_activation_arguments(made):
    root = made("ct_nvfp4_True", write_ct_nvfp4, input_scales=True)
    with pytest.raises(ValueError, match="holds w_nvfp4_a_nvfp4 .*, not w_nvfp4"):
        load_moe_layer(root, LAYER, scheme="w_nvfp4")
    with pytest.raises(ValueError, match=r"layer 5 has no MoE experts here \(layers with experts: \[0, 1\]\)"):
        load_moe_layer(root, 5)
    with pytest.raises(ValueError, match=r"'gate_proj' is not a projection .*up_proj, down_proj"):
        load_moe_layer(root, LAYER, activation="relu2_no_mul")
    # SWIGLUOAI's w13 interleaves gate row j (row 2j) with up row j (row 2j + 1), codes and block scales alike
    halves, inter = load_moe_layer(root, LAYER), load_moe_layer(root, LAYER, activation="swigluoai")
    check_checkpoint(inter)
    i = halves.intermediate_size
    for field in ("data", "scale"):
        h, x = getattr(halves.w13, field), getattr(inter.w13, field)
        assert torch.equal(x[:, 0::2], h[:, :i]) and torch.equal(x[:, 1::2], h[:, i:])
    assert load_moe_layer(root, 0).num_experts == EXPERTS  # the other shard's layer


# ---- the suites on a checkpoint: pytest --checkpoint DIR --layer N -------------------------------------------------

def _pytest_on(root, *extra):
    import subprocess
    import sys

    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "cpu",
            "suites/test_conformance.py::test_conformance", "--hypothesis-profile=ci", "--checkpoint", str(root),
            "--layer", str(LAYER), *extra]
    return subprocess.run(args, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)


@pytest.mark.parametrize("tool, scheme, expected", [
    ("compressed-tensors NVFP4", "w_nvfp4_a_nvfp4", {"torch_emulation", "triton_emulation", "triton_bitplace"}),
    ("ModelOpt NVFP4", "w_nvfp4_a_nvfp4", {"torch_emulation", "triton_emulation", "triton_bitplace"}),
    ("compressed-tensors FP8", "w_fp8_a_fp8", {"torch_emulation", "triton_emulation", "vllm_fused_moe@0.33.0"}),
    ("AMD Quark MXFP4", "w_mxfp4_a_mxfp4", {"torch_emulation", "triton_emulation", "triton_bitplace"}),
    ("gpt-oss MXFP4", "w_mxfp4", {"torch_emulation", "triton_emulation", "triton_bitplace"}),
])
def test_the_conformance_cases_run_on_a_layer_written_by_each_tool(made, tool, scheme, expected):
    """pytest --checkpoint DIR --layer N on a layer the tool wrote: the cases become the layer's scheme at its sizes
    (its own tensors: ModelOpt's decode-direction or compressed-tensors' encode-direction NVFP4 global scales, FP8
    per-tensor scales), and every CPU backend that supports the scheme passes (vLLM's releases where their source was
    fetched; 0.13.0's declared bias bug does not arise: the layer has no biases)."""
    writers = {"compressed-tensors NVFP4": ("ct_nvfp4_True", write_ct_nvfp4, dict(input_scales=True), needs_ct),
               "ModelOpt NVFP4": ("modelopt_True", write_modelopt_nvfp4, dict(input_scales=True), needs_modelopt),
               "compressed-tensors FP8": ("ct_fp8_tensor", write_ct_fp8, dict(strategy="tensor"), needs_ct),
               "AMD Quark MXFP4": ("quark_True", write_quark_mxfp4, dict(input_mx=True), needs_quark),
               "gpt-oss MXFP4": ("gpt_oss", write_gpt_oss_mxfp4, {}, by_the_reference)}
    # gpt-oss's layout is SWIGLUOAI's (the loader's default for it); the per-expert layouts default to SILU
    act = "SWIGLUOAI" if tool == "gpt-oss MXFP4" else "SILU"
    name, writer, kwargs, needs = writers[tool]
    if needs.args[0]:  # the producer is not installed
        pytest.skip(needs.kwargs["reason"])
    root = made(name, writer, **kwargs)
    if tool == "compressed-tensors NVFP4":  # the command line itself, once (a subprocess: ~6 s)
        proc = _pytest_on(root, "-rA")
        tail = proc.stdout[-3000:] + proc.stderr[-2000:]
        assert proc.returncode == 0 and "FAILED" not in proc.stdout, tail
        ran = [line for line in proc.stdout.splitlines() if line.startswith("PASSED")]
        assert ran and all(f"[{scheme}/{act}/" in line for line in ran), tail
        assert expected - {"vllm_fused_moe@0.33.0"} <= {line.split("/")[3] for line in ran}, tail
        return
    # the others in this process, through what --checkpoint sets up (use_checkpoint): the same cases and verdicts
    verdicts = _cases_on(load_moe_layer(root, LAYER), f"{tool} layer {LAYER}")
    assert verdicts and {case.split("/")[:2] == [scheme, act] for case in verdicts} == {True}, verdicts
    assert expected - {"vllm_fused_moe@0.33.0"} <= {case.split("/")[2] for case in verdicts}, verdicts
    assert all(v == "passed" for v in verdicts.values()), verdicts


def _cases_on(ckpt, source: str) -> dict[str, str]:
    """{case id: "passed" | message} of every CPU conformance case on a given checkpoint, as test_conformance runs
    them under --checkpoint (harness.core.conformance.use_checkpoint), in this process; restored after."""
    from harness.backends import Declined, known_failure_for, registered_backends
    from harness.core.conformance import (case_problem, conformance_cases, conformance_shape, run_case,
                                          runs_with_bias, use_checkpoint)
    from harness.platforms import PLATFORMS

    cpu, backends, out = PLATFORMS["cpu"], registered_backends(), {}
    use_checkpoint(ckpt, source)
    try:
        for case, reason in conformance_cases(backends, platforms=[cpu], host=cpu):
            if reason is not None:
                continue
            backend = backends[case.backend_name]
            problem, _, _ = case_problem(backend, case.scheme, case.activation, cpu, conformance_shape(cpu))
            if known_failure_for(backend, case.scheme.name, runs_with_bias(problem)):
                continue
            try:
                r = run_case(backend, case, conformance_shape(cpu))
            except Declined:
                continue
            out[case.id] = "passed" if r.ok else r.message()
    finally:
        use_checkpoint(None)
    return out


@needs_modelopt
@needs_ct
def test_a_layer_whose_convention_is_mislabelled_is_refused_naming_it(made, tmp_path):
    """compressed-tensors' tensors (encode-direction global scales) relabelled as a ModelOpt export: the run stops
    before any case with a usage error naming the global scale direction."""
    root = _relabelled_as_modelopt(made("ct_nvfp4_True", write_ct_nvfp4, input_scales=True), tmp_path / "m")
    proc = _pytest_on(root)
    assert proc.returncode == 4 and "global scale direction" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@needs_ct
def test_the_activation_is_config_jsons_hidden_act_unless_given(made, tmp_path):
    """hidden_act "silu" (what the writers put, as Qwen3-MoE does) -> SILU; "gelu_pytorch_tanh" -> GELU_TANH; an
    activation the reference has no MoE form of is refused naming hidden_act; an explicit activation wins."""
    src = made("ct_nvfp4_True", write_ct_nvfp4, input_scales=True)
    assert load_moe_layer(src, LAYER).activation.name == "SILU"
    for hidden_act, expected in (("gelu_pytorch_tanh", "GELU_TANH"), ("xielu", None)):
        root = tmp_path / hidden_act
        shutil.copytree(src, root)
        config = json.loads((root / "config.json").read_text())
        (root / "config.json").write_text(json.dumps({**config, "hidden_act": hidden_act}))
        if expected is None:
            with pytest.raises(ValueError, match=r"hidden_act 'xielu' has no reference MoE activation"):
                load_moe_layer(root, LAYER)
            assert load_moe_layer(root, LAYER, activation="GELU").activation.name == "GELU"
        else:
            assert load_moe_layer(root, LAYER).activation.name == expected


def test_write_checkpoint_writes_a_layer_the_checkpoint_option_reads(tmp_path, capsys):
    """`python -m harness write-checkpoint` (README's commands per tool): the directory it writes loads, and it
    prints the pytest command that runs the cases on it. Every tool name maps to a writer and a pinned extra."""
    import tomllib

    from harness.__main__ import main
    from harness.peers.checkpoint_writers import WRITERS

    assert main(["write-checkpoint", "--tool", "gpt-oss-mxfp4", "--out", str(tmp_path / "m"), "--experts", "3"]) == 0
    out = capsys.readouterr().out
    assert "w_mxfp4, SWIGLUOAI, 3 experts" in out and f"--checkpoint {tmp_path / 'm'} --layer 0" in out
    assert load_moe_layer(tmp_path / "m", 1).num_experts == 3
    extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert all(callable(w) and (extra is None or extra in extras) for w, _, extra in WRITERS.values())
