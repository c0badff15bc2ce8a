"""Top-k routing: which experts each token goes to and with which weight.

  scores   = softmax(logits) or sigmoid(logits), fp32
  choice   = scores + e_score_correction_bias (DeepSeek/Kimi) or scores
  grouped  keep the best `topk_group` of `num_groups` groups, a group's score being the sum of its top-2
           choice scores when a correction bias is used, else its max choice score
  ids      top-k of `choice` among the kept experts
  weights  the UNBIASED scores at those ids; optionally renormalized to sum 1; times routed_scaling_factor
Ties are broken deterministically: among equal scores the lower expert (or group) index wins.
DeepSeek-V3: sigmoid, bias, 8 groups, topk_group 4, top-8, scale 2.5. Kimi-K2: sigmoid, bias, 1 group, top-8.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["RoutingConfig", "route"]


@dataclass(frozen=True)
class RoutingConfig:
    top_k: int
    scoring: str = "softmax"  # or "sigmoid"
    renormalize: bool = True
    num_groups: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0

    def check(self, num_experts: int) -> None:
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"scoring must be 'softmax' or 'sigmoid', got {self.scoring!r}")
        if not 1 <= self.top_k <= num_experts:
            raise ValueError(f"top_k must be in [1, num_experts={num_experts}], got {self.top_k}")
        if self.num_groups < 1 or num_experts % self.num_groups:
            raise ValueError(f"num_groups={self.num_groups} must divide num_experts={num_experts}")
        if not 1 <= self.topk_group <= self.num_groups:
            raise ValueError(f"topk_group must be in [1, num_groups={self.num_groups}], got {self.topk_group}")
        if self.num_groups > 1 and self.top_k > self.topk_group * (num_experts // self.num_groups):
            raise ValueError(f"top_k={self.top_k} exceeds the {self.topk_group} kept groups' experts")


def _topk_lowest_index_first(x: torch.Tensor, k: int) -> torch.Tensor:
    # A stable descending sort keeps equal values in index order: ties go to the lower index.
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]


def route(
    router_logits: torch.Tensor,
    config: RoutingConfig,
    e_score_correction_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (topk_weights fp32 [T, k], topk_ids int64 [T, k])."""
    if not isinstance(router_logits, torch.Tensor) or router_logits.dim() != 2:
        raise ValueError(f"router_logits must be a [tokens, experts] tensor, got {getattr(router_logits, 'shape', None)}")
    if not router_logits.is_floating_point():
        raise TypeError(f"router_logits must be floating point, got {router_logits.dtype}")
    t, e = router_logits.shape
    config.check(e)
    logits = router_logits.float()
    if not bool(torch.isfinite(logits).all()):
        raise ValueError("router_logits must be finite")
    scores = torch.softmax(logits, dim=-1) if config.scoring == "softmax" else torch.sigmoid(logits)
    choice = scores
    if e_score_correction_bias is not None:
        if tuple(e_score_correction_bias.shape) != (e,):
            raise ValueError(f"e_score_correction_bias must have shape ({e},), got {tuple(e_score_correction_bias.shape)}")
        choice = scores + e_score_correction_bias.float()
    if config.num_groups > 1:
        g = choice.view(t, config.num_groups, e // config.num_groups)
        if e_score_correction_bias is not None:
            group_score = g.topk(min(2, g.shape[-1]), dim=-1).values.sum(-1)
        else:
            group_score = g.amax(-1)
        keep = _topk_lowest_index_first(group_score, config.topk_group)
        mask = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, keep, True)
        choice = choice.masked_fill(~mask.repeat_interleave(e // config.num_groups, dim=1), float("-inf"))
    ids = _topk_lowest_index_first(choice, config.top_k)
    weights = scores.gather(1, ids)
    if config.renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights * config.routed_scaling_factor, ids
