"""Model registry: project models by name, torchvision models as a fallback.

A model is identified by a *config*: ``{"name": ..., "kwargs": {...}}``. The config
travels inside checkpoints so that a checkpoint can always rebuild its architecture.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import RefusedError
from .pretrained import map_in_order, preprocess_of
from .registry import _REGISTRY, register_model, registered_input_shape

log = logging.getLogger(__name__)


def list_models() -> list[str]:
    """Names of the models registered in the project (torchvision names work too)."""
    return sorted(_REGISTRY)


def build_model(name: str, weights: str | Path | None = None, new_head: bool = False, **kwargs: Any) -> nn.Module:
    """Build a registered, torchvision or timm model with random weights, or load ``weights``.

    ``weights`` is a local file (a ``state_dict`` saved with ``torch.save`` or a
    ``.safetensors`` file): there is no download. With ``new_head`` the classifier head of the
    file may have another class count than the model (``num_classes``): it is left newly initialised.
    """
    with contextlib.redirect_stdout(sys.stderr):  # a library's print never mixes with a command's JSON
        if name.startswith("timm/"):  # timm's model where torchvision has one of the same name (efficientnet_b0)
            model = _timm_model(name.removeprefix("timm/"), kwargs)
        elif name in _REGISTRY:
            model = _REGISTRY[name](**kwargs)
        else:
            model = _torchvision_model(name, kwargs)
    if weights is not None:
        load_weights(model, weights, new_head=new_head)
    return model.eval()


def _torchvision_model(name: str, kwargs: dict[str, Any]) -> nn.Module:
    """A torchvision model with random weights: no pretrained weights and no pretrained backbone (the
    segmentation and detection builders default ``weights_backbone`` to ImageNet's, a download)."""
    import torchvision

    if name not in torchvision.models.list_models():
        return _timm_model(name, kwargs)
    offline = {"weights": None}
    if "weights_backbone" in inspect.signature(torchvision.models.get_model_builder(name)).parameters:
        offline["weights_backbone"] = None
    for k in offline:
        if kwargs.get(k) is not None:
            raise RefusedError(f"{name}: {k}={kwargs[k]!r} would download weights; models are built with random "
                               "weights (load a local file with --weights)")
    return torchvision.models.get_model(name, **{**kwargs, **offline})


def _timm_model(name: str, kwargs: dict[str, Any]) -> nn.Module:
    try:
        import timm
    except ImportError:  # pragma: no cover
        timm = None
    if timm is None or not timm.is_model(name):
        raise ValueError(f"unknown model {name!r}: not registered in disco ({', '.join(list_models())}), "
                         "not a torchvision model and not a timm model")
    if kwargs.get("pretrained"):
        raise RefusedError(f"{name}: pretrained=True would download weights; models are built with random weights "
                           "(load a local file with --weights)")
    return timm.create_model(name, **{**kwargs, "pretrained": False})  # never downloads


def classifier_head(model: nn.Module) -> str | None:
    """The module name of the classifier head: timm's ``get_classifier()``, else the last ``nn.Linear``."""
    head = None
    if hasattr(model, "get_classifier"):
        try:
            target = model.get_classifier()
        except Exception:  # noqa: BLE001  (a model may implement it partially)
            target = None
        for n, m in model.named_modules():
            if m is target and isinstance(m, nn.Linear):
                return n
    for n, m in model.named_modules():
        if isinstance(m, nn.Linear):
            head = n
    return head


def _read_state(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # unpickling, safetensors header, truncated file: many types
        raise ValueError(f"weights {path} cannot be read as a state dict or safetensors file "
                         f"({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})") from e
    if isinstance(state, dict):
        for key in ("state_dict", "model", "model_state_dict"):
            if isinstance(state.get(key), dict):
                state = state[key]
                break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"weights {path} hold no state dict of tensors")
    if state and all(k.startswith("module.") for k in state):  # saved from a DDP-wrapped model
        state = {k[len("module."):]: v for k, v in state.items()}
    return state


def load_weights(model: nn.Module, path: str | Path, new_head: bool = False) -> None:
    """Load a local state-dict file (``.pth``/``.pt`` or ``.safetensors``) into ``model``.

    A file that does not fit is refused with the missing, unexpected and wrongly shaped keys by
    name. With ``new_head`` a classifier head of another shape (another class count) is skipped and
    keeps its fresh initialisation.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist")
    state = _read_state(path)
    own = model.state_dict()
    shape = sorted(k for k in state if k in own and state[k].shape != own[k].shape)
    head = classifier_head(model)
    head_keys = {f"{head}.weight", f"{head}.bias"} if head else set()
    if shape and set(shape) <= head_keys:
        if not new_head:
            w = f"{head}.weight"
            raise ValueError(f"weights {path} have a {state[w].shape[0]}-class head ({w}), the model has "
                             f"{own[w].shape[0]} classes: pass --num-classes {own[w].shape[0]} to start a new head")
        log.warning("weights %s: classifier head %s (%d classes) not loaded; a new %d-class head is trained",
                    path, head, state[f"{head}.weight"].shape[0], own[f"{head}.weight"].shape[0])
        state = {k: v for k, v in state.items() if k not in shape}
        shape = []
    missing = sorted(set(own) - set(state) - ({*head_keys} if new_head else set()))
    unexpected = sorted(set(state) - set(own))
    if missing and unexpected and not (set(state) & set(own)):  # a foreign naming: map it in order, or say why not
        mapped, why = map_in_order(own, state)
        if mapped is None:
            raise ValueError(f"weights {path} use another naming than model {type(model).__name__} (the file's "
                             f"first tensor is {next(iter(state))}, the model's {next(iter(own))}) and cannot be "
                             f"mapped in order: {why}")
        log.info("weights %s: foreign naming mapped in order onto %d tensors (%s -> %s, every shape and kind "
                 "matching)", path, len(mapped), next(iter(state)), next(iter(mapped)))
        state, missing, unexpected, shape = mapped, [], [], []
    if missing or unexpected or shape:
        parts = [f"{len(v)} {what} ({', '.join(v[:4])}{', ...' if len(v) > 4 else ''})"
                 for what, v in (("missing", missing), ("unexpected", unexpected), ("of another shape", shape)) if v]
        raise ValueError(f"weights {path} do not fit model {type(model).__name__}: keys " + "; ".join(parts))
    model.load_state_dict(state, strict=False)
    log.info("loaded weights from %s", path)


__all__ = ["build_model", "list_models", "load_weights", "map_in_order", "preprocess_of", "register_model",
           "registered_input_shape"]

from . import cifar_resnet, deeplab, rrdbnet, ssd, vit  # noqa: E402,F401  (registers the project models)
