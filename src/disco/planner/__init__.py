"""``disco plan``: choose N, r, the wire codec (and node shares) for a given link and set of devices.

For every candidate (N, shares, r, codec) the planner builds each node's program from the cost
model alone, with no run (:mod:`.programs`): walking the graph in order, each op becomes a compute segment
(FLOPs / the node's calibrated rate + a fixed cost per op and per message), each exchange a
send on the owner and a wait on the receiver at the first mixing op that reads it (the local half
of a mixing op first, as the executor does), plus the input distribution, the LayerNorm
statistics and the output gather. :func:`disco.runtime.latency.replay` replays these programs, priced by
the calibration (:mod:`.pricing`), against the link model (bandwidth per node interface, one-way latency,
per-message delay and per-message overhead, the node processes sharing ``cores`` cores when they share a
host). :mod:`.search` prices every candidate and picks one, :mod:`.report` prints it. :mod:`.engines`: the node
engine priced, torch as calibrated or the ONNX engine (disco_edge) with its compute and per-message costs timed on
this host.

The calibration (:mod:`.calibration`: compute rate, per-op and per-message costs, delay and overheads) is
fitted by ``python -m bench.latency_fit`` on ``results/latency.json`` and stored in
``results/latency_model.json``; its defaults are that fit, so an installed package plans without the
repository. The library reads no results file: the command line passes the calibration, the accuracy
results and the codecs' drops in (:mod:`disco.cli.model`).
"""

from .accuracy import QUALITY_METRICS, accuracy_for, accuracy_rows, codec_drops, is_quality_metric
from .calibration import Calibration
from .engines import ENGINES, message_costs, onnx_calibration, ort_costs, zmq_pingpong
from .host import CPU_FIELDS, scaled_to_host, single_process, time_one_process
from .pricing import features, predict_ms, price, with_overheads
from .programs import CODEC_FEATURES, FEATURES, message_bytes, programs
from .report import commands, format_table, plot
from .search import Candidate, PlanRequest, pareto_front, plan, recommend, why

__all__ = ["CODEC_FEATURES", "CPU_FIELDS", "ENGINES", "FEATURES", "QUALITY_METRICS", "Calibration", "Candidate",
           "PlanRequest", "accuracy_for", "accuracy_rows", "codec_drops", "commands", "features", "format_table",
           "is_quality_metric", "message_bytes", "message_costs", "onnx_calibration", "ort_costs",
           "pareto_front", "plan", "plot", "predict_ms", "price", "programs", "recommend", "scaled_to_host",
           "single_process", "time_one_process", "why", "with_overheads", "zmq_pingpong"]
