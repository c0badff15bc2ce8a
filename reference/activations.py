"""MoE activations, computed in fp32 (or float64 for the exact reference).

Gated activations take [..., 2I] (gate and up) and return [..., I]; *_NO_MUL take [..., d] and apply
the gate function only. Gate/up come in halves (gate = x[..., :I], up = x[..., I:]) except SWIGLUOAI
(gpt-oss), whose checkpoint interleaves them (gate = x[..., 0::2], up = x[..., 1::2]).

  SILU        silu(g) * u; with limit L: g = min(g, L), u = clamp(u, -L, L)
  GELU        erf-gelu(g) * u            GELU_TANH  tanh-approximated gelu(g) * u
  RELU2       relu(g)^2 * u
  SWIGLUOAI   g = min(g, limit), u = clamp(u, -limit, limit); (u + 1) * g * sigmoid(alpha * g); alpha 1.702, limit 7
  SWIGLUSTEP  min(silu(g), limit) * clamp(u, -limit, limit); limit 7
  SITU        beta * tanh(g / beta) * sigmoid(g) * U, U = beta_lin * tanh(u / beta_lin) if beta_lin > 0 else u
              (Kimi K3 "SiTU-GLU": beta 4, beta_lin 25)

Each activation also carries `gate_lipschitz`: sup |d gate(g) / dg| over the reals (None where it is
unbounded: RELU2), derived numerically once from the function itself and used by the error bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
import torch

from .formats import true_divide

__all__ = ["Activation", "ACTIVATIONS", "activation_by_name", "apply_activation", "gate_and_up"]


def _silu(g):
    return g * torch.sigmoid(g)


def _gelu(g):
    return torch.nn.functional.gelu(g)


def _gelu_tanh(g):
    return torch.nn.functional.gelu(g, approximate="tanh")


def _relu2(g):
    return torch.relu(g) ** 2


@dataclass(frozen=True)
class Activation:
    name: str
    gated: bool
    interleaved: bool = False
    limit: float | None = None  # clamp limit (SILU optional; SWIGLUOAI/SWIGLUSTEP fixed 7)
    alpha: float = 1.702  # SWIGLUOAI
    beta: float = 4.0  # SITU
    beta_lin: float = 25.0  # SITU
    kind: str = field(default="", repr=False)  # which formula; defaults to the name without _NO_MUL

    @property
    def formula(self) -> str:
        return self.kind or self.name.removesuffix("_NO_MUL")

    def with_params(self, **params) -> "Activation":
        """A copy with other parameters (e.g. SILU.with_params(limit=10.0))."""
        return replace(self, **params)

    def out_features(self, in_features: int) -> int:
        if self.gated and in_features % 2:
            raise ValueError(f"{self.name} needs an even number of gate/up features, got {in_features}")
        return in_features // 2 if self.gated else in_features

    # ---- the gate function alone (fp32 or float64) -------------------------------------------
    def gate(self, g: torch.Tensor) -> torch.Tensor:
        f = self.formula
        if f == "SILU":
            return _silu(g)
        if f == "GELU":
            return _gelu(g)
        if f == "GELU_TANH":
            return _gelu_tanh(g)
        if f == "RELU2":
            return _relu2(g)
        if f == "SWIGLUOAI":
            return g * torch.sigmoid(self.alpha * g)
        if f == "SWIGLUSTEP":
            return _silu(g)
        if f == "SITU":
            return self.beta * torch.tanh(true_divide(g, self.beta)) * torch.sigmoid(g)
        raise ValueError(f"unknown activation formula {f!r}")

    @property
    def gate_lipschitz(self) -> float | None:
        return _lipschitz(self)


def _lipschitz(act: Activation) -> float | None:
    if act.formula == "RELU2":
        return None
    return _lipschitz_cached(act.formula, act.alpha, act.beta)


_LIPSCHITZ: dict[tuple, float] = {}


def _lipschitz_cached(formula: str, alpha: float, beta: float) -> float:
    key = (formula, alpha, beta)
    if key not in _LIPSCHITZ:
        # sup |gate'| on a dense float64 grid; every gate here has its extreme derivative within |g| < 20
        # and tends to a constant (0 or 1) outside. The grid step 1e-4 bounds the sampling error by
        # step * sup|gate''| < 1e-4; we add it.
        probe = Activation("probe", gated=False, alpha=alpha, beta=beta, kind=formula)
        g = torch.arange(-40.0, 40.0, 1e-4, dtype=torch.float64)
        d = torch.diff(probe.gate(g)) / 1e-4
        _LIPSCHITZ[key] = float(d.abs().max()) + 1e-4
    return _LIPSCHITZ[key]


def _split(x: torch.Tensor, act: Activation):
    n = x.shape[-1]
    act.out_features(n)
    if act.interleaved:
        return x[..., 0::2], x[..., 1::2]
    return x[..., : n // 2], x[..., n // 2 :]


def gate_and_up(x: torch.Tensor, act: Activation) -> tuple[torch.Tensor, torch.Tensor]:
    """The two factors of act(x) = phi * psi: phi the gate function of the (clamped) gate, psi the
    transformed up projection (1 for *_NO_MUL). Error bounds use them separately."""
    if not isinstance(act, Activation):
        raise TypeError(f"act must be an Activation, got {act!r}")
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"activations are computed in fp32 or float64, got {x.dtype}")
    if not act.gated:
        return act.gate(x), torch.ones_like(x)
    g, u = _split(x, act)
    f = act.formula
    if f == "SWIGLUOAI" or (f == "SILU" and act.limit is not None):
        g = torch.clamp(g, max=act.limit)
        u = torch.clamp(u, -act.limit, act.limit)
    if f == "SWIGLUOAI":
        return act.gate(g), u + 1
    if f == "SWIGLUSTEP":
        return torch.clamp(act.gate(g), max=act.limit), torch.clamp(u, -act.limit, act.limit)
    if f == "SITU" and act.beta_lin > 0:
        u = act.beta_lin * torch.tanh(true_divide(u, act.beta_lin))
    return act.gate(g), u


def apply_activation(x: torch.Tensor, act: Activation) -> torch.Tensor:
    """act(x) in x's precision (fp32 for kernels' semantics, float64 for the exact reference)."""
    phi, psi = gate_and_up(x, act)
    return phi if not act.gated else phi * psi


ACTIVATIONS: dict[str, Activation] = {
    a.name: a
    for a in (
        Activation("SILU", gated=True),
        Activation("GELU", gated=True),
        Activation("GELU_TANH", gated=True),
        Activation("RELU2", gated=True),
        Activation("SWIGLUOAI", gated=True, interleaved=True, limit=7.0),
        Activation("SWIGLUSTEP", gated=True, limit=7.0),
        Activation("SITU", gated=True, beta=4.0, beta_lin=25.0),
        Activation("SILU_NO_MUL", gated=False),
        Activation("GELU_NO_MUL", gated=False),
        Activation("GELU_TANH_NO_MUL", gated=False),
        Activation("RELU2_NO_MUL", gated=False),
        Activation("SITU_NO_MUL", gated=False, beta=4.0),
    )
}


def activation_by_name(name: str) -> Activation:
    try:
        return ACTIVATIONS[name.upper()] if isinstance(name, str) else ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; expected one of {sorted(ACTIVATIONS)}") from None

