"""Graph capture, op rules and partitioning."""

from .partition import REPLICATED, Links, MixingLayer, Partition, UnsupportedOpError, partition, split_owner

__all__ = ["REPLICATED", "Links", "MixingLayer", "Partition", "UnsupportedOpError", "partition", "split_owner"]
