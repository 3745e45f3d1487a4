"""Token mixing: a Linear over a dim that is not the channel dim (MLP-Mixer's ``mlp_tokens`` on B x C x T).

Every channel's tokens are mixed by the same weight, so output channel c reads input channel c only: a
channel-local op. Every rank holds the whole weight (it has no channel dim to cut) and runs the Linear on
its own channels. :class:`~disco.graph.ops.linear.LinearRule` hands such a use to :data:`TOKEN_MIXING`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor, fx, nn

from .base import Local, tensor_args

if TYPE_CHECKING:
    from ..types import Builder


class TokenMixing(Local):
    """A Linear applied along a non-channel dim: channel-local, its weight held whole on every rank."""

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        x = tensor_args(node, b)[0]
        c = b.cdim[x]
        if c == len(b.shape(x)) - 1:
            b.unsupported(node, "mixes the channel dim (a mixing op, not token mixing)")
        b.set(node, b.atoms[x], c)

    def flops_per_element(self, in_shape: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> float:
        """A multiply-add per input feature of the mixed dim."""
        return 2.0 * in_shape[-1] if in_shape else 0.0

    def slice_param(self, module: nn.Module, name: str, t: Tensor, local, channels: int) -> Tensor:  # noqa: ANN001
        """The weight mixes tokens, not channels: every rank holds all of it."""
        return t


TOKEN_MIXING = TokenMixing()


def mixes_tokens(b: Builder, node: fx.Node) -> bool:
    """Is this Linear applied to a node-owned tensor along a dim other than its channel dim?"""
    ins = tensor_args(node, b)
    return len(ins) == 1 and not b.replicated(ins[0]) and b.cdim[ins[0]] != len(b.shape(ins[0])) - 1
