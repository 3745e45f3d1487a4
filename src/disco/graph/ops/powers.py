"""Powers of a feature tensor (``x ** 2``, ``x.pow(2)``: timm's StarReLU, ``s * relu(x) ** 2 + b``): elementwise,
channel-local; a tensor exponent is coupled channel by channel like an operand of ``mul``."""

from __future__ import annotations

import operator

import torch

from ..registry import register_function_rule, register_method_rule
from .base import Local

register_function_rule(operator.pow, torch.pow, torch.square, torch.sqrt, torch.abs, torch.exp)(Local(flops=1))
register_method_rule("pow", "square", "sqrt", "abs", "neg", "exp")(Local(flops=1))
