"""The registry of project models by name (the model modules register themselves here)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}
_INPUT_SHAPES: dict[str, tuple[int, ...]] = {}


def register_model(name: str, input_shape: tuple[int, ...] | None = None
                   ) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator: register a model factory under ``name`` (with the input shape it is meant for)."""

    def deco(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} is already registered")
        _REGISTRY[name] = fn
        if input_shape is not None:
            _INPUT_SHAPES[name] = tuple(input_shape)
        return fn

    return deco


def registered_input_shape(name: str) -> tuple[int, ...] | None:
    """The input shape a registered model was registered with (None if it was not given)."""
    return _INPUT_SHAPES.get(name)
