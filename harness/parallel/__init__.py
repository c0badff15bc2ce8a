"""Sharded MoE conformance: tensor and expert parallelism as data (sharding.py), simulated rank by rank in one
process or run on several GPUs with NCCL (distributed.py); seeded bugs of this layer (mutants.py)."""

from .sharding import (CANONICAL, Parallelism, Sharder, check_parallel_structure, intermediate_block,
                       padded_intermediate, run_sharded, sharded_reference)

__all__ = ["Parallelism", "Sharder", "CANONICAL", "intermediate_block", "padded_intermediate", "run_sharded",
           "sharded_reference", "check_parallel_structure"]
