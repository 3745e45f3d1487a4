"""What encoding and decoding a link message costs per value for each wire codec, on one core.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.codec_cost      # results/codec_cost.json + the calibration

The latency model's fit (fp32 and fp16 runs) holds those codecs' costs; any other codec (int8, bf16) is charged per
value what its encode and decode cost beyond fp16's on ResNet-50 split messages (``codec_encode_s`` and
``codec_decode_s`` of results/latency_model.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from disco.timing import median_ms

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(1, 26, 56, 56), (1, 51, 28, 28), (1, 102, 14, 14), (1, 205, 7, 7)]  # r~0.1 messages of resnet50 N=2
FITTED = ("fp32", "fp16")  # codecs of results/latency.json: their cost is in the fitted terms


def measure(repeats: int) -> dict[str, dict[str, float]]:
    """Per codec, the mean over SHAPES of the median seconds per value (``repeats`` calls) to encode and decode."""
    import torch

    from disco.runtime.transport import CODECS

    torch.set_num_threads(1)
    torch.manual_seed(0)
    out: dict[str, dict[str, float]] = {}
    for name, codec in CODECS.items():
        enc, dec = [], []
        for shape in SHAPES:
            x = torch.randn(shape)
            v = x.numel()
            buf = codec.encode(x, 1)
            enc.append(median_ms(lambda x=x, c=codec: c.encode(x, 1), repeats) / 1e3 / v)
            dec.append(median_ms(lambda buf=buf, shape=shape, c=codec: c.decode(buf, shape, 1), repeats) / 1e3 / v)
        out[name] = {"encode_s_per_value": statistics.mean(enc), "decode_s_per_value": statistics.mean(dec)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out", default=str(ROOT / "results" / "codec_cost.json"))
    ap.add_argument("--model", default=str(ROOT / "results" / "latency_model.json"),
                    help="the calibration the planner reads (its codec_encode_s/codec_decode_s are replaced)")
    a = ap.parse_args()
    costs = measure(a.repeats)
    extra = {f"codec_{k}_s": {c: max(0.0, v[f"{k}_s_per_value"] - costs["fp16"][f"{k}_s_per_value"])
                              for c, v in costs.items() if c not in FITTED} for k in ("encode", "decode")}
    res = {"shapes": [list(s) for s in SHAPES], "threads": 1, "repeats": a.repeats, "per_codec": costs,
           **extra, "loadavg_1min": round(os.getloadavg()[0], 2), "method": __doc__.strip().splitlines()[0]}
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    model = Path(a.model)
    if model.is_file():
        d = json.loads(model.read_text())
        d.setdefault("calibration", {}).update(extra)
        model.write_text(json.dumps(d, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
