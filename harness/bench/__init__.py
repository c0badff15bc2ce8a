"""Benchmark support (suites/bench/, `make bench`): `timing` (CUDA-event timer, L2 flush, graph capture,
the run's anchors), `workloads` (model shapes, device checkpoints, bytes and FLOPs), `targets` (the goals,
as data) and `report` (table, targets, roofline). The dequantize-all baseline is a registered backend
(harness.backends.dequantize_all). `--benchmark-timer=harness.bench.cuda_event_timer` names the timer."""

from .report import write_bench_report
from .targets import DENSE_JUDGED_TOKENS, TARGETS, Target, evaluate_targets, format_targets
from .timing import (SUSTAIN_S, SampledClocks, anchors, capture, copy_bandwidth, cuda_event_timer, dense_bf16_matmul,
                     dense_bf16_tflops, flush_l2, median_ms, round_times_ms, time_against_dense)
from .workloads import (CPU_SHAPE, MODEL_SHAPES, TOKENS, ModelShape, device_checkpoint, io_bytes, model_case_parser, model_launch,
                        moe_flops, roofline_time_s, routed_inputs, weight_bytes)

__all__ = ["ModelShape", "MODEL_SHAPES", "TOKENS", "CPU_SHAPE", "cuda_event_timer", "flush_l2", "capture", "median_ms",
           "round_times_ms", "time_against_dense", "SUSTAIN_S", "SampledClocks",
           "copy_bandwidth", "dense_bf16_matmul", "dense_bf16_tflops", "anchors", "device_checkpoint", "weight_bytes", "moe_flops", "io_bytes",
           "routed_inputs", "model_case_parser", "model_launch", "roofline_time_s", "Target", "TARGETS", "DENSE_JUDGED_TOKENS", "evaluate_targets", "format_targets",
           "write_bench_report"]
