"""The verdict: one conformance case as values (conformance), the derived bound and the comparison
(tolerances), dispatch (oracle) and what keeps a backend from fooling or stalling the harness (guard).
Layer: above harness.backends and harness.inputs, below harness.detection and harness.outputs."""
