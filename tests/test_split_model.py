"""SplitModel: a DISCO model evaluated through its node plans, the wire codec applied as the runtime does."""

from __future__ import annotations

import numpy as np
import torch

from disco.graph import partition
from disco.masks import DiscoModel
from disco.models import build_model
from disco.runtime.local import PerSample, SplitModel
from disco.runtime.transport import get_codec


def test_split_model_equals_disco_model_and_codec_is_per_sample() -> None:
    torch.manual_seed(0)
    model = build_model("cifar_resnet8").eval()
    part = partition(model, (1, 3, 32, 32), 2)
    kept = np.random.default_rng(0).random(part.n_links) < 0.3
    dm = DiscoModel(model, part, kept).eval()
    plain = build_model("cifar_resnet8").eval()
    plain.load_state_dict(dm.plain_state_dict())
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        ref = dm(x)
    out = SplitModel(plain, part, kept)(x)  # batch 3: a partition of its own, the same links
    assert float((out - ref).abs().max() / ref.abs().max()) < 1e-4
    int8 = SplitModel(plain, part, kept, codec="int8")
    batched = int8(x)
    single = torch.cat([int8(x[i:i + 1]) for i in range(3)])
    assert float((batched - ref).abs().max()) > 0  # int8 is lossy ...
    assert float((batched - single).abs().max() / single.abs().max()) < 1e-3  # ... and scales are per sample
    c = PerSample(get_codec("int8"))
    t = torch.randn(2, 4, 3, 3)
    t[1] *= 100  # a batch-wide scale would wipe out sample 0
    back = c.decode(c.encode(t, 1), tuple(t.shape), 1)
    assert back.shape == t.shape and float((back[0] - t[0]).abs().max()) < t[0].abs().max() / 100
    assert c.nbytes(tuple(t.shape), 1) == 2 * (4 * 9 + 4 * 4)
