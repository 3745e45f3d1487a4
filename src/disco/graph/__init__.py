"""Graph capture, op rules and partitioning."""

from . import attention  # noqa: F401  (registers the attention decompositions and rule)
from .errors import UnsupportedOpError
from .partition import REPLICATED, Links, MixingLayer, Partition, partition, split_owner

__all__ = ["REPLICATED", "Links", "MixingLayer", "Partition", "UnsupportedOpError", "partition", "split_owner"]
