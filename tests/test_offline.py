"""Models are built with no download (issue 33 item 3), failures show the traceback with -v, and a model that
cannot be traced is refused with the file and line of its data-dependent branch (item 4)."""

from __future__ import annotations

import json
import socket
import urllib.request

import pytest
import torch
from torch import nn

from disco.cli import main
from disco.graph import partition
from disco.models import build_model
from disco.runtime.export import check_model_spec


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*_a, **_k):
        raise OSError("network blocked by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse)


def test_torchvision_builders_take_no_backbone_weights(no_network):
    model = build_model("lraspp_mobilenet_v3_large", num_classes=3)
    assert isinstance(model, nn.Module)


@pytest.mark.parametrize("name", ["fcn_resnet50", "lraspp_mobilenet_v3_large"])
def test_cost_of_a_segmentation_builder_offline_prints_only_json(no_network, capsys, name):
    assert main(["cost", name, "--nodes", "2", "--ratio", "0.2", "--input-shape", "1,3,64,64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)  # stdout holds the JSON and nothing else
    assert out["nodes"] == 2 and out["bytes"] > 0


def test_a_detection_builder_offline_is_refused_not_failed_on_a_download(no_network, capsys):
    code = main(["cost", "ssdlite320_mobilenet_v3_large", "--nodes", "2", "--input-shape", "1,3,64,64", "--json"])
    err = capsys.readouterr()
    assert code == 2 and err.out == "" and "cannot capture SSD" in err.err and "URLError" not in err.err


def test_manifest_accepts_weights_none_and_refuses_a_weights_file():
    check_model_spec({"name": "fcn_resnet50", "kwargs": {"weights": None, "weights_backbone": None}}, "manifest")
    with pytest.raises(Exception, match="model.kwargs.weights_backbone"):
        check_model_spec({"name": "fcn_resnet50", "kwargs": {"weights_backbone": "IMAGENET1K_V1"}}, "manifest")


@pytest.mark.parametrize("verbose", [False, True])
def test_a_failure_shows_the_traceback_with_v_as_its_message_promises(monkeypatch, capsys, verbose):
    import disco.cli as cli

    real = cli.build_parser

    def failing_parser():
        p = real()
        for action in p._subparsers._group_actions:  # every command's function raises
            for sub in action.choices.values():
                sub.set_defaults(func=lambda _a: (_ for _ in ()).throw(RuntimeError("deliberate failure")))
        return p

    monkeypatch.setattr(cli, "build_parser", failing_parser)
    assert cli.main([*(["-v"] if verbose else []), "cost", "cifar_resnet8"]) == 3
    err = capsys.readouterr().err
    assert "deliberate failure" in err
    if verbose:
        assert "Traceback (most recent call last)" in err and "run with -v" not in err
    else:
        assert "run with -v for the traceback" in err and "Traceback" not in err


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.conv(x)
        if y.sum() > 0:  # data-dependent: the refusal names this line
            return y
        return -y


def test_a_model_that_cannot_be_traced_is_refused_with_its_file_and_line():
    with pytest.raises(ValueError) as e:
        partition(Branchy(), (1, 3, 8, 8), 2)
    line = Branchy.forward.__code__.co_firstlineno + 2
    assert f"test_offline.py:{line}" in str(e.value) and "if y.sum() > 0:" in str(e.value)
