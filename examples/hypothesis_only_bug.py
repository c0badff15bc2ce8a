"""A backend whose bug only the Hypothesis search finds: it works in chunks of 4 tokens paired into 8, and when
the token count leaves a lone chunk (4, 12, 20, ... tokens) that chunk's output is dropped. No explicit case
has such a count (the CPU shape runs 8 tokens, the GPU shape 64, the pinned @examples 0, 1 and 10, the shape
classes 1, 3, 5, 7, 9 and 257), so every explicit case passes; `test_conformance_hypothesis` draws 0 to 10
tokens and finds 4. README, "Nightly GPU matrix and the shared
Hypothesis database", uses it to show a failure found by the nightly profile replay from the database:

    pytest suites/test_conformance.py --backend examples.hypothesis_only_bug:make_backend -k hypothesis \
        --hypothesis-profile=nightly                       # finds it, writes .hypothesis/examples
    MOE_CONFORMANCE_SHARED_DB=path/to/that/examples pytest ... -k hypothesis   # dev profile: replays it first
"""

from examples.simple_backend import SimpleBackend

CHUNK = 4


class DropsALoneChunk(SimpleBackend):
    name = "hypothesis_only_bug"

    def forward(self, prepared, hidden_states, topk_weights, topk_ids):
        out = super().forward(prepared, hidden_states, topk_weights, topk_ids)
        if out.shape[0] % (2 * CHUNK) == CHUNK:
            out = out.clone()
            out[-CHUNK:] = 0
        return out


def make_backend():
    return DropsALoneChunk()
