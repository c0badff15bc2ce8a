"""run-23's conformance backend (`--backend prefill_backends:emulation_warp_spec` with this directory on PYTHONPATH):
triton_emulation with the warp-specialized bf16 prefill row (MOE_CONFORMANCE_BF16_WARP_SPEC's: both operands by TMA,
Triton's producer and two consumer warpgroups) fixed at every size, warp_spec where the case's sizes allow it (the
table row's warp_spec_if_fits rule), so that the conformance suites' small shapes run the warp-specialized loop."""
from harness.backends import load_backend
from harness.backends.triton_emulation import TritonEmulationBackend

ROW = dict(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=4, group_m=8, tma=1, w2_block_n=256)


class WarpSpecPrefill(TritonEmulationBackend):
    name = "triton_emulation"

    def resolve_tiles(self, tiles, prepared, p, dev):
        return super().resolve_tiles({**tiles, "warp_spec_if_fits": 1}, prepared, p, dev)


def emulation_warp_spec():
    backend = WarpSpecPrefill()
    return backend.configure(**ROW)


assert load_backend("triton_emulation").name == WarpSpecPrefill.name
