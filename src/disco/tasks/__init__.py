"""Tasks: data, loss, metric and default model of one application (a registry by name)."""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor, nn

from .registry import _TASKS, register_task


class Task(Protocol):
    name: str
    input_shape: tuple[int, ...]
    default_model: str
    model_kwargs: dict[str, Any]

    def loaders(
        self, data: str, batch_size: int, limit: int | None = None, seed: int = 0,
    ) -> tuple[Any, Any]: ...
    def loss(self, out: Tensor, target: Tensor) -> Tensor: ...
    def distill(self, out: Tensor, teacher_out: Tensor) -> Tensor: ...
    def evaluate(self, model: nn.Module, loader: Any) -> dict[str, float]: ...


def get_task(name: str) -> Task:
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(sorted(_TASKS))}")
    return _TASKS[name]()


def task_names() -> list[str]:
    """The names of the registered tasks, sorted."""
    return sorted(_TASKS)


def task_for_model(model: str) -> type | None:
    """The task class whose default model is ``model`` (None if no task names it)."""
    return next((t for t in _TASKS.values() if getattr(t, "default_model", None) == model), None)


__all__ = ["Task", "get_task", "register_task", "task_for_model", "task_names"]

from . import classification, det, imagenet, seg, sr  # noqa: E402,F401
