"""Sharded conformance with real ranks: one process per rank (torch.multiprocessing), torch.distributed for the
all-reduce of the partial outputs: NCCL on GPUs (one GPU per rank), gloo on the CPU (how make test covers this
code). Each rank builds the same case (seeded), takes its canonical shard, runs the backend on it and joins
the all-reduce of its bf16 partial; rank 0 compares the reduced output with the sharded reference (the same
reference and bound as the simulated run: harness.parallel.sharding) and writes the verdicts.

    python -m harness parallel --world nccl --tp 2 --backend triton_emulation   # on a machine with 2 GPUs
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .sharding import CANONICAL, Parallelism, parallel_shape, sharded_reference, with_backend_padding

__all__ = ["DistributedCase", "run_distributed", "WORLDS"]

WORLDS = ("nccl", "gloo")
COLLECTIVE_TIMEOUT_S = 240


@dataclass(frozen=True)
class DistributedCase:
    backend: str
    scheme: str
    activation: str
    tp: int = 1
    ep: int = 1
    seed: int = 0

    @property
    def parallelism(self) -> Parallelism:
        return Parallelism(tp=self.tp, ep=self.ep)

    @property
    def id(self) -> str:
        return f"{self.scheme}/{self.activation}/{self.backend}/{self.parallelism.label}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: str, size: int, port: int, cases: list[dict], out: str) -> None:
    # the GPU machine's NCCL must keep NVLink multicast off (shared hosts); set before NCCL starts
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    from harness.backends import (Declined, backend_bound_declarations, backend_prepare,
                                  backend_structure, load_backend)
    from harness.core.conformance import case_checkpoint, case_inputs, case_problem
    from harness.core.tolerances import compare
    from harness.platforms import PLATFORMS, detect_platform
    from reference.activations import ACTIVATIONS
    from reference.schemes import SCHEMES

    if world == "nccl":
        torch.cuda.set_device(rank)
    elif "lo" in {name for _, name in socket.if_nameindex()}:
        # every gloo rank is on this host: loopback, not the interface the hostname resolves to (a lookup that a
        # machine with no network may wait out, or answer with an address the ranks cannot reach)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # a stuck collective fails after this, inside the GPU machine's per-call limit
    dist.init_process_group(world, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    device = f"cuda:{rank}" if world == "nccl" else "cpu"
    platform = detect_platform() if world == "nccl" else PLATFORMS["cpu"]
    verdicts = []
    try:
        for raw in cases:
            case = DistributedCase(**raw)
            scheme, act = SCHEMES[case.scheme], ACTIVATIONS[case.activation]
            shape = parallel_shape(scheme, world == "nccl")
            backend = load_backend(case.backend)
            par = with_backend_padding(case.parallelism, backend)
            full = case_checkpoint(case.scheme, case.activation, platform.fp8_format.name, shape, case.seed, True)
            shards = CANONICAL.shard(full, par)
            local_shape = shape.__class__(shards[0].num_experts, shape.hidden_size, shards[0].intermediate_size,
                                          shape.tokens, shape.top_k)
            problem, ok, reason = case_problem(backend, scheme, act, platform, local_shape)
            # every rank decides the same (same inputs): skip together, never deadlock in the all-reduce
            if not ok:
                verdicts.append(dict(case=case.id, outcome="skipped", reason=reason))
                continue
            ckpt = full if problem.has_bias else case_checkpoint(case.scheme, case.activation,
                                                                 platform.fp8_format.name, shape, case.seed, False)
            x, w, ids = case_inputs(shape, case.seed)
            shard = CANONICAL.shard(ckpt, par)[rank]
            w_r, ids_r = CANONICAL.route(w, ids, par, rank, ckpt.num_experts)
            # prepare and forward on every rank, then agree: a rank that declined its shard or failed makes every
            # rank move on together (never one rank left alone in the all-reduce)
            partial, declined, error = None, "", ""
            try:
                prepared = backend_prepare(backend, shard)
                partial = backend.forward(prepared, x.to(device), w_r.to(device), ids_r.to(device))
            except Declined as exc:
                declined = str(exc)
            except Exception as exc:  # noqa: BLE001 - reported as this case's failure on every rank
                error = f"rank {rank}: {type(exc).__name__}: {exc}"
            status = torch.tensor([0 if error else 1 if declined else 2], dtype=torch.int32, device=device)
            dist.all_reduce(status, op=dist.ReduceOp.MIN)
            if int(status) < 2:
                outcome = "failed" if int(status) == 0 else "skipped"
                verdicts.append(dict(case=case.id, outcome=outcome,
                                     reason=error or declined or f"another rank {'failed' if outcome == 'failed' else 'declined'}"))
                continue
            dist.all_reduce(partial, op=dist.ReduceOp.SUM)  # bf16, in the order the library picks
            if rank == 0:
                expected, bound, exacts = sharded_reference(x, ckpt, w, ids, par, backend_structure(backend),
                                                            backend_bound_declarations(backend, ckpt.scheme.name))
                r = compare(expected, partial.cpu(), bound, f"{case.id}/{world}x{size}: output",
                            structure=backend_structure(backend), exact=torch.stack(exacts).sum(0))
                verdicts.append(dict(case=case.id, outcome="passed" if r.ok else "failed",
                                     reason="" if r.ok else r.message(), worst_ulps=r.worst_ulps,
                                     max_ratio=r.max_ratio))
        dist.barrier()  # every rank's last collective done before the group goes
    finally:
        if rank == 0:
            Path(out).write_text(json.dumps(verdicts))
        dist.destroy_process_group()


def run_distributed(cases: list[DistributedCase], world: str = "nccl") -> list[dict]:
    """Run each case over tp x ep ranks (all cases must use the same rank count), one process per rank;
    returns rank 0's verdicts (case, outcome, reason, worst_ulps, max_ratio)."""
    if world not in WORLDS:
        raise ValueError(f"world must be one of {WORLDS}, got {world!r}")
    sizes = {c.parallelism.ranks for c in cases}
    if len(sizes) != 1:
        raise ValueError(f"all cases of one run must use the same number of ranks, got {sorted(sizes)}")
    size = sizes.pop()
    if world == "nccl" and torch.cuda.device_count() < size:
        raise RuntimeError(f"{size} ranks need {size} GPUs; this machine has {torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "verdicts.json")
        mp.spawn(_rank_main, args=(world, size, _free_port(), [asdict(c) for c in cases], out), nprocs=size, join=True)
        return json.loads(Path(out).read_text())
