"""Graph capture, op rules and partitioning."""

from . import ops  # noqa: F401  (registers every op kind)
from .errors import UnsupportedOpError
from .partition import REPLICATED, Links, MixingLayer, Partition, partition, split_owner

__all__ = ["REPLICATED", "Links", "MixingLayer", "Partition", "UnsupportedOpError", "partition", "split_owner"]
