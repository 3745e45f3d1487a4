"""The registry of tasks by name (the task modules register themselves here)."""

from __future__ import annotations

_TASKS: dict[str, type] = {}


def register_task(cls: type) -> type:
    _TASKS[cls.name] = cls
    return cls
