"""Every refusal at capture or partition time names the op, its module path and the file:line of the model's
source that made it, in one line; ``-v`` adds the model's call stack (issue 43 item 1). One test per kind."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

from disco.cli import main
from disco.errors import RefusedError, UnsupportedOpError
from disco.graph import partition

HERE = "test_arch_refusals.py"


def _line(fn: object, text: str) -> int:
    """The line number of the first line of ``fn``'s source that contains ``text``."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(k for k, ln in enumerate(lines) if text in ln)


class NoRule(nn.Module):  # an op without a rule
    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.c(x)
        return torch.cumsum(y, 1)


class RefusedUse(nn.Module):  # an op with a rule that refuses this use of it (pads the channels)
    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.pad(self.c(x), (0, 0, 0, 0, 1, 1))


class MyConv(nn.Conv2d):  # a subclass that redefines the forward of a registered type
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


class Sub(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = MyConv(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(x)


class Outer(nn.Module):  # the refused op is two modules down: the path and the innermost line are named
    def __init__(self) -> None:
        super().__init__()
        self.inner = NoRule()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + 1


@pytest.mark.parametrize(("model", "fn", "text", "what"), [
    (NoRule(), NoRule.forward, "torch.cumsum", "no op rule for call_function torch.cumsum"),
    (RefusedUse(), RefusedUse.forward, "functional.pad", "pads the channel dim"),
    (Sub(), Sub.forward, "return self.c(x)", "is a subclass of Conv2d that redefines its forward"),
    (Outer(), NoRule.forward, "torch.cumsum", "in module 'inner'"),
])
def test_a_refusal_names_op_module_and_source_line(model: nn.Module, fn: object, text: str, what: str) -> None:
    with pytest.raises(UnsupportedOpError) as e:
        partition(model, (1, 3, 4, 4), 2)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1, msg
    assert what in msg, msg
    assert f"{HERE}:{_line(fn, text)} in forward" in msg, msg


class Branchy(nn.Module):  # a data-dependent branch: the capture itself fails
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x


def test_a_capture_failure_names_the_line() -> None:
    with pytest.raises(RefusedError) as e:
        partition(Branchy(), (1, 3, 4, 4), 2)
    assert f"{HERE}:{_line(Branchy.forward, 'if x.sum()')} in forward: if x.sum() > 0:" in str(e.value)


def test_verbose_prints_the_models_call_stack(capsys, monkeypatch) -> None:  # noqa: ANN001
    from disco.models import registry

    monkeypatch.setitem(registry._REGISTRY, "outer", Outer)
    code = main(["-v", "cost", "outer", "--nodes", "2", "--input-shape", "1,3,4,4"])
    err = capsys.readouterr().err
    assert code == 2
    assert "the model's source that made node" in err
    assert f"line {_line(Outer.forward, 'self.inner(x)')}, in forward" in err
    assert f"line {_line(NoRule.forward, 'torch.cumsum')}, in forward" in err
