"""Models are built with no download ever (issue 33 item 3): torchvision builders get ``weights=None`` and
``weights_backbone=None``, timm ``pretrained=False``; ``disco cost --json`` of a segmentation and a detection
builder works (or refuses in one line) with the network blocked, and prints only JSON on stdout."""

from __future__ import annotations

import json
import socket
import urllib.request

import pytest
import torchvision

from disco.cli import main
from disco.errors import RefusedError
from disco.models import build_model
from disco.runtime.export import check_model_spec


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    """No network: every socket connection and urlopen raises; an empty torch hub cache."""

    def refuse(*a: object, **k: object) -> None:
        raise OSError("network blocked by the test")

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "hub"))
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)


def test_the_block_is_effective(offline: None) -> None:
    """Without weights_backbone=None torchvision would download the ImageNet backbone, and fail here."""
    with pytest.raises(Exception, match="network blocked"):
        torchvision.models.get_model("lraspp_mobilenet_v3_large", weights=None)


def test_cost_of_a_segmentation_builder_offline(offline: None, capsys: pytest.CaptureFixture) -> None:
    rc = main(["cost", "lraspp_mobilenet_v3_large", "--nodes", "2", "--ratio", "0.2", "--input-shape",
               "1,3,64,64", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    rep = json.loads(out.out)  # stdout holds only the JSON
    assert rep["nodes"] == 2 and abs(rep["ratio"] - 0.2) < 0.01


def test_a_detection_builder_offline_is_built_and_refused_in_one_line(offline: None,
                                                                      capsys: pytest.CaptureFixture) -> None:
    rc = main(["cost", "fasterrcnn_mobilenet_v3_large_320_fpn", "--nodes", "2", "--ratio", "0.2",
               "--input-shape", "1,3,64,64", "--json"])
    out = capsys.readouterr()
    assert rc == 2, out.err  # built offline (no URLError, exit 3); its data-dependent forward is refused
    assert out.out == "" and "cannot capture FasterRCNN" in out.err and "network" not in out.err


def test_downloading_kwargs_are_refused_and_none_is_accepted() -> None:
    with pytest.raises(RefusedError, match="weights_backbone"):
        build_model("lraspp_mobilenet_v3_large", weights_backbone="DEFAULT")
    check_model_spec({"name": "fcn_resnet50", "kwargs": {"weights": None, "weights_backbone": None}}, "test")
    with pytest.raises(RefusedError):
        check_model_spec({"name": "fcn_resnet50", "kwargs": {"weights_backbone": "DEFAULT"}}, "test")


def test_timm_pretrained_is_refused() -> None:
    pytest.importorskip("timm")
    with pytest.raises(RefusedError, match="pretrained"):
        build_model("timm/resnet18", pretrained=True)


def test_verbose_shows_the_traceback(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import disco.cli.model as cm

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("an unexpected failure")

    monkeypatch.setattr(cm, "build_model", boom, raising=False)
    monkeypatch.setattr("disco.models.build_model", boom)
    rc = main(["cost", "cifar_resnet8", "--nodes", "2", "--ratio", "0.2", "--json"])
    quiet = capsys.readouterr().err
    rc_v = main(["-v", "cost", "cifar_resnet8", "--nodes", "2", "--ratio", "0.2", "--json"])
    loud = capsys.readouterr().err
    assert rc == rc_v == 3 and "run with -v for the traceback" in quiet and "Traceback" not in quiet
    assert "Traceback (most recent call last)" in loud and "an unexpected failure" in loud
