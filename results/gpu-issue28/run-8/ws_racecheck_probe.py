"""Is racecheck's report on bitplace_partials_kernel (reads at the kernel's entry line against writes at its entry
and at its `if expert >= 0` line, no line of our partitions) about Triton's warp_specialize plumbing (the
default partition hands each worker warp its partition index and the captured values through shared memory,
between named barriers), or about our kernel? This kernel has that plumbing and little else: one mbarrier,
initialised and never used, no async copy (SYNC 0; the first probe, run-8's PART=check, had no mbarrier at all);
SYNC 1 adds what our consumer partition has besides: a barrier among its own 4 warps (bar.sync 0, 128) in a loop.
(A third variant, an mbarrier the worker arrived on 4 times and the default partition waited on by parity, hung
under racecheck in run-8: without a second barrier the worker can run two phases ahead, the probe's own error;
removed.) Run under `compute-sanitizer --tool racecheck`: the hazard pattern of our kernel (at the entry and `if`
lines only) on a variant says what triggers it."""
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # Triton 3.6's name, then later releases'


@gluon.jit
def _default(out_ptr, v, bar, SYNC: gl.constexpr):
    if SYNC == 1:
        for i in range(4):
            _cta_barrier()
    gl.store(out_ptr + gl.program_id(0) * 2 + gl.arange(0, 1, gl.BlockedLayout([1], [32], [4], [0])), v)


@gluon.jit
def _worker(out_ptr, v, bar, SYNC: gl.constexpr):
    gl.store(out_ptr + gl.program_id(0) * 2 + 1 + gl.arange(0, 1, gl.BlockedLayout([1], [32], [1], [0])), v + 1)


@gluon.jit
def ws_probe_kernel(out_ptr, flag_ptr, SYNC: gl.constexpr):
    flag = gl.load(flag_ptr + gl.program_id(0))
    if flag >= 0:  # as bitplace_partials_kernel's `if expert >= 0`: some programs skip the partitions
        v = flag * 2
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        gl.warp_specialize([(_default, (out_ptr, v, bar, SYNC)), (_worker, (out_ptr, v, bar, SYNC))], [1], [40])


if __name__ == "__main__":
    n = 64
    flag = torch.arange(n, device="cuda", dtype=torch.int32)
    flag[::5] = -1
    for sync in (0, 1):
        out = torch.zeros(2 * n, device="cuda", dtype=torch.int32)
        ws_probe_kernel[(n,)](out, flag, SYNC=sync, num_warps=4)
        torch.cuda.synchronize()
        want = torch.stack([flag * 2, flag * 2 + 1], 1).flatten()
        live = (flag >= 0).repeat_interleave(2)
        print(f"ws probe SYNC {sync}: outputs right:", bool(torch.equal(out[live], want[live])),
              "skipped untouched:", bool((out[~live] == 0).all()), flush=True)
