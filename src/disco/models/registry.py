"""The registry of project models by name (the model modules register themselves here)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator: register a model factory under ``name``."""

    def deco(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return deco
