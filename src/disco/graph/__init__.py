"""Graph capture, op rules and partitioning."""

from . import ops  # noqa: F401  (registers every op kind)
from .errors import UnsupportedOpError
from .partition import partition, split_owner
from .types import REPLICATED, Links, MixingLayer, Partition, shape_of

__all__ = ["REPLICATED", "Links", "MixingLayer", "Partition", "UnsupportedOpError", "partition", "shape_of",
           "split_owner"]
