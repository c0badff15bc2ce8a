"""triton_dot_scaled: MX-weight MoE (W4A16 MXFP4, MXFP8 weights with bf16 activations) through
tl.dot_scaled, which the compiler emulates on sm90 (upcast to bf16) and runs natively on sm100 and
gfx950. The rest of the pipeline (alignment, activation, top-k sum) is triton_emulation's.
tl.dot_scaled is not implemented by the Triton interpreter: GPU only."""

from __future__ import annotations

from .triton_emulation import TritonEmulationBackend

_FORMATS = {"e2m1": "e2m1", "e4m3fn": "e4m3"}


class TritonDotScaledBackend(TritonEmulationBackend):
    name = "triton_dot_scaled"
    use_dot_scaled = True

    min_block_k = 128  # dot_scaled's scale tile needs K/32 >= 4

    def supports(self, problem, platform) -> tuple[bool, str]:
        s = problem.scheme
        if s.weight is None or s.weight.kind != "mx" or s.weight.elem.name not in _FORMATS:
            return False, "tl.dot_scaled path: MXFP4 or MXFP8 (E4M3) weights only"
        if s.act is not None:
            return False, "tl.dot_scaled path: bf16 activations (W4A16 / W8A16) only"
        if platform.vendor == "cpu":
            return False, "tl.dot_scaled is not implemented in the Triton interpreter"
        return super().supports(problem, platform)

    def available(self, platform) -> tuple[bool, str]:
        if self.device == "cpu":
            return False, "needs a GPU: tl.dot_scaled is not implemented in the Triton interpreter"
        return True, ""

    def dot_scaled_format(self, elem) -> str:
        return _FORMATS[elem.name]


def make_backend() -> TritonDotScaledBackend:
    return TritonDotScaledBackend()
