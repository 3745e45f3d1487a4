"""Tiny models with GroupNorm as a module (``nn.GroupNorm``) or as a function (``F.group_norm`` on a module's
parameters), registered by name so that node processes rebuild them: the node program imports this file when
``DISCO_NODE_HOOKS`` names it (:mod:`disco.runtime.hooks`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from disco.models import list_models, register_model


class GroupNormNet(nn.Module):
    """A conv stem, GroupNorm, a 1x1-conv MLP with a residual, a second GroupNorm, a pooled head. ``groups`` per
    norm; ``functional`` per norm: ``F.group_norm`` instead of calling the module (the first on ``norm1``'s
    weight and bias as keywords, the second with neither and the default eps)."""

    def __init__(self, groups: tuple[int, int] = (4, 4), functional: tuple[bool, bool] = (True, True),
                 c: int = 64) -> None:
        super().__init__()
        self.groups, self.functional = groups, functional
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.norm1, self.norm2 = nn.GroupNorm(groups[0], c), nn.GroupNorm(groups[1], c, affine=not functional[1])
        self.fc1, self.fc2 = nn.Conv2d(c, c, 1), nn.Conv2d(c, c, 1)
        self.head = nn.Linear(c, 5)
        with torch.no_grad():  # not the identity affine terms of a fresh GroupNorm
            for norm in (self.norm1, self.norm2):
                if norm.affine:
                    norm.weight.uniform_(0.5, 1.5)
                    norm.bias.normal_(0, 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        if self.functional[0]:
            y = F.group_norm(x, self.groups[0], weight=self.norm1.weight, bias=self.norm1.bias, eps=self.norm1.eps)
        else:
            y = self.norm1(x)
        x = x + self.fc2(F.gelu(self.fc1(F.gelu(y))))
        y = F.group_norm(x, self.groups[1]) if self.functional[1] else self.norm2(x)
        return self.head(y.mean((2, 3)))


MODELS: dict[str, Callable[[], nn.Module]] = {
    "test_gn_functional_1": lambda: GroupNormNet((1, 1)),  # one group: statistics exchanged
    "test_gn_functional_4": lambda: GroupNormNet((4, 4)),  # 4 groups of 16 channels: aligned to the nodes
    "test_gn_functional_1_module_4": lambda: GroupNormNet((1, 4), (True, False)),
}
for _name, _make in MODELS.items():
    if _name not in list_models():  # imported once per process, but never twice
        register_model(_name, input_shape=(2, 3, 6, 6))(_make)


def install_node_hooks(register: Callable[..., None]) -> None:
    """No hooks: importing this file (above) registered the models."""
