"""Hostile backends: each breaks the protocol in one way a buggy kernel or adapter does. The suite must
fail each alone, with a message naming what it did, while a correct backend in the same run still
passes (suites/test_bad_input.py runs them beside examples.simple_backend):

    .venv/bin/python -m pytest suites/test_conformance.py -k "w_mxfp4/SILU/ and cpu and not hypothesis" \\
        --backend examples.hostile_backends:mutates_hidden_states --backend examples.simple_backend:make_backend
"""

import time

import torch

from examples.simple_backend import SimpleBackend


class _Hostile(SimpleBackend):
    def __init__(self, name):
        self.name = name


class _MutatesHiddenStates(_Hostile):
    def forward(self, prepared, hidden_states, topk_weights, topk_ids):
        out = super().forward(prepared, hidden_states, topk_weights, topk_ids)
        hidden_states.mul_(2)  # scratch space reused in place
        return out


class _MutatesCheckpoint(_Hostile):
    def prepare(self, ckpt):
        ckpt.w13.data.zero_()  # "repacks" the weights in place
        return super().prepare(ckpt)


class _MutatesRouterWeights(_Hostile):
    def forward(self, prepared, hidden_states, topk_weights, topk_ids):
        topk_weights.div_(topk_weights.sum(-1, keepdim=True))  # renormalizes in place
        return super().forward(prepared, hidden_states, topk_weights, topk_ids)


class _Hangs(_Hostile):
    def forward(self, prepared, hidden_states, topk_weights, topk_ids):
        while True:  # a kernel that never returns (a deadlocked launch, a spin on a flag)
            time.sleep(0.05)


class _SupportsAnswers(_Hostile):
    def __init__(self, name, answer):
        super().__init__(name)
        self.answer = answer

    def supports(self, problem, platform):
        return self.answer


class _Output(_Hostile):
    def __init__(self, name, transform):
        super().__init__(name)
        self.transform = transform

    def forward(self, prepared, hidden_states, topk_weights, topk_ids):
        return self.transform(super().forward(prepared, hidden_states, topk_weights, topk_ids))


class _Raises(_Hostile):
    def forward(self, prepared, hidden_states, topk_weights, topk_ids):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def _nan_output(out):
    out = out.clone()
    out[0, 0] = float("nan")
    return out


def mutates_hidden_states():
    return _MutatesHiddenStates("a_mutates_hidden_states")  # sorts before simple_example: runs first


def mutates_checkpoint():
    return _MutatesCheckpoint("a_mutates_checkpoint")


def mutates_router_weights():
    return _MutatesRouterWeights("a_mutates_router_weights")


def hangs():
    return _Hangs("hangs")


def supports_returns_bool():
    return _SupportsAnswers("supports_bool", True)


def supports_returns_none():
    return _SupportsAnswers("supports_none", None)


def supports_returns_a_string():
    return _SupportsAnswers("supports_string", "no")  # two characters: unpacks as (ok, reason) = ("n", "o")


def wrong_output_shape():
    return _Output("wrong_shape", lambda out: out[:, :-1])


def wrong_output_dtype():
    return _Output("wrong_dtype", lambda out: out.float())


def nan_output():
    return _Output("nan_output", _nan_output)


def raises():
    return _Raises("raises")


def name_with_a_slash():
    return _Hostile("vendor/kernel")


NOT_A_FACTORY = 42


def factory_raises():
    """A factory that fails (no device, a missing library): the --backend value must be named, no INTERNALERROR."""
    raise RuntimeError("this backend needs a device this machine does not have")
