"""The schedule as data: every message is sent once and received once, it survives JSON, and its link
bytes and message count are the cost model's."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from disco import schedule
from disco.cost import estimate
from disco.graph import partition
from disco.models import build_model


@pytest.fixture(scope="module", params=[("cifar_resnet8", 2), ("cifar_resnet8", 3), ("vit_tv_test", 2)])
def case(request):
    name, n = request.param
    torch.manual_seed(0)
    part = partition(build_model(name).eval(), torch.randn(1, 3, 32, 32), n)
    kept = np.random.default_rng(1).random(part.n_links) < 0.3
    return part, kept, schedule.build(part, kept)


def test_every_send_has_its_recv(case) -> None:
    _, _, sch = case
    sends = sorted((s.rank, m.peer, m.tag, m.shape, m.channels) for s in sch for m in s.messages("send"))
    recvs = sorted((m.peer, s.rank, m.tag, m.shape, m.channels) for s in sch for m in s.messages("recv"))
    assert sends == recvs and sends


def test_links_are_each_sent_once_and_bytes_match_the_cost_model(case) -> None:
    part, kept, sch = case
    ids = [i for s in sch for m in s.messages("send", "links") for i in m.links]
    assert sorted(ids) == np.nonzero(kept)[0].tolist()
    rep = estimate(part, kept)
    assert sum(m.values for s in sch for m in s.messages("send", "links")) * 4 == rep.bytes
    assert sum(1 for s in sch for _ in s.messages("send")) == rep.messages_per_inference


def test_recv_comes_before_the_remote_half_that_reads_it(case) -> None:
    _, _, sch = case
    for s in sch:
        got: set[str] = set()
        for st in s.steps:
            if isinstance(st, schedule.Message) and st.op == "recv" and st.kind == "links":
                got.add(st.value)
            if isinstance(st, schedule.Run) and st.half == "remote":
                assert got  # some channels arrived before any remote half


def test_json_round_trip(case) -> None:
    for s in case[2]:
        d = json.loads(json.dumps(s.to_json()))
        assert d["format"] == schedule.FORMAT
        assert schedule.RankSchedule.from_json(d) == s
    with pytest.raises(ValueError, match="format"):
        schedule.RankSchedule.from_json({"format": "other"})
