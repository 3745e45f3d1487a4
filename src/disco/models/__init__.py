"""Model registry: project models by name, torchvision models as a fallback.

A model is identified by a *config*: ``{"name": ..., "kwargs": {...}}``. The config
travels inside checkpoints so that a checkpoint can always rebuild its architecture.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .registry import _REGISTRY, register_model, registered_input_shape

log = logging.getLogger(__name__)


def list_models() -> list[str]:
    """Names of the models registered in the project (torchvision names work too)."""
    return sorted(_REGISTRY)


def build_model(name: str, weights: str | Path | None = None, **kwargs: Any) -> nn.Module:
    """Build a registered or torchvision model with random weights, or load ``weights``.

    ``weights`` is a local file (a ``state_dict`` saved with ``torch.save`` or a
    ``.safetensors`` file): there is no download.
    """
    if name.startswith("timm/"):  # timm's model where torchvision has one of the same name (efficientnet_b0)
        model = _timm_model(name.removeprefix("timm/"), kwargs)
    elif name in _REGISTRY:
        model = _REGISTRY[name](**kwargs)
    else:
        import torchvision

        if name in torchvision.models.list_models():
            model = torchvision.models.get_model(name, weights=None, **kwargs)
        else:
            model = _timm_model(name, kwargs)
    if weights is not None:
        load_weights(model, weights)
    return model.eval()


def _timm_model(name: str, kwargs: dict[str, Any]) -> nn.Module:
    try:
        import timm
    except ImportError:  # pragma: no cover
        timm = None
    if timm is None or not timm.is_model(name):
        raise ValueError(f"unknown model {name!r}: not registered in disco ({', '.join(list_models())}), "
                         "not a torchvision model and not a timm model")
    return timm.create_model(name, pretrained=False, **kwargs)  # never downloads


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load a local state-dict file (``.pth``/``.pt`` or ``.safetensors``) into ``model``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(state, dict) and "state_dict" in state:
            state = state["state_dict"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"weights {path} do not fit the model: missing {list(missing)[:5]}, unexpected {list(unexpected)[:5]}"
        )
    log.info("loaded weights from %s", path)


__all__ = ["build_model", "list_models", "load_weights", "register_model", "registered_input_shape"]

from . import cifar_resnet, deeplab, rrdbnet, ssd, vit  # noqa: E402,F401  (registers the project models)
