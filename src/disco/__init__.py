"""DISCO: distributed DNN inference with sparse communications.

The public API (see :mod:`disco.api`): :func:`partition`, :class:`DiscoModel`, :func:`select_links`,
:func:`estimate`, :func:`sparsify_model` (with :class:`SparsifyConfig`, :class:`Loaders`), :func:`export`
and :func:`run`; with files: :func:`train_checkpoint`, :func:`sparsify_checkpoint` and :func:`evaluate`. They are
imported on first use, so ``import disco`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["CostReport", "DiscoModel", "Loaders", "Partition", "SparsifyConfig", "__version__", "estimate",
           "evaluate", "export", "partition", "run", "select_links", "sparsify_checkpoint", "sparsify_model",
           "train_checkpoint"]

if TYPE_CHECKING:  # pragma: no cover
    from .api import (
        CostReport,
        DiscoModel,
        Loaders,
        Partition,
        SparsifyConfig,
        estimate,
        evaluate,
        export,
        partition,
        run,
        select_links,
        sparsify_checkpoint,
        sparsify_model,
        train_checkpoint,
    )


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'disco' has no attribute {name!r}")
