"""Op kinds, one module per kind; importing this package registers them all.

To add an op kind, write one module in this folder: an object per kind (a subclass of
:class:`~disco.graph.types.Rule`, :class:`~disco.graph.ops.base.Local` or
:class:`~disco.graph.ops.mixing.Mixing`), registered with :mod:`disco.graph.registry` at the
bottom of the module. Every module of this folder is imported (and so registered) here.
"""

import importlib
import pkgutil

from ..types import REPLICATED, OpCost, Rule, WeightView, local_index, tensor_args
from .base import Local, Static, arg
from .conv import ConvRule, ConvSameRule, ConvTransposeRule
from .linear import FunctionalLinearRule, LinearRule
from .local import Elementwise, LocalWithChildren, PadRule
from .mixing import Mixing, block_weight_names
from .norms import ChannelsFirstLayerNorm, L2NormRule, MeanRule, Reduce
from .views import (
    GATHER,
    Cat,
    ChunkRule,
    Flatten,
    Gather,
    GetItem,
    InferenceIdentity,
    PixelShuffleRule,
    PixelUnshuffleRule,
    Transpose,
    View,
)

__all__ = [
    "GATHER", "REPLICATED", "Cat", "ChannelsFirstLayerNorm", "ChunkRule", "ConvRule", "ConvSameRule",
    "ConvTransposeRule", "Elementwise", "Flatten", "FunctionalLinearRule", "Gather", "GetItem", "InferenceIdentity",
    "L2NormRule", "LinearRule", "Local", "LocalWithChildren", "MeanRule", "Mixing", "OpCost", "PadRule",
    "PixelShuffleRule", "PixelUnshuffleRule", "Reduce", "Rule", "Static", "Transpose", "View", "WeightView", "arg",
    "block_weight_names", "local_index", "tensor_args",
]

for _m in pkgutil.iter_modules(__path__):  # every op module registers its kinds when imported
    importlib.import_module(f"{__name__}.{_m.name}")
