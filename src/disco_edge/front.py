"""Rank 0's HTTP front: the Open Inference Protocol on starlette + uvicorn, one asyncio loop in the main thread.

The front never touches a ZeroMQ socket nor the engine: it checks a request (token, size, tensors), hands it to
the group thread (:mod:`disco_edge.group`) through the bounded queue and awaits its answer. Endpoints:
``/v2/health/live``, ``/v2/health/ready``, ``/v2``, ``/v2/models/{m}[/versions/{v}]``, ``.../ready``,
``.../infer``, ``.../stats`` (each node's state) and ``/metrics`` (Prometheus). Errors are ``{"error": ...}``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import signal
import socket
import time
from typing import Any

import numpy as np

from . import __version__
from .group import Group, Request, Unavailable
from .metrics import CONTENT_TYPE, Metrics
from .oip import EXTENSIONS, HEADER_LENGTH, BadRequest, TensorSpec, build_response, parse_request

log = logging.getLogger(__name__)
TOKEN_ENV = "DISCO_SERVE_TOKEN"
OPEN_PATHS = ("/v2/health/live", "/v2/health/ready")  # probes need no token


def _error(status: int, why: str) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse({"error": why}, status_code=status)


class Front:
    """The OIP app of one served group."""

    def __init__(self, group: Group, model: str, token: str | None, max_body: int, request_timeout: float
                 ) -> None:
        sch = group.node.b.schedule
        self.group, self.model, self.token = group, model, token
        self.max_body, self.request_timeout = max_body, request_timeout
        self.inputs = [TensorSpec(s["name"], [int(d) for d in s["shape"]]) for s in sch["inputs"]]
        self.outputs = [TensorSpec(s["name"], [int(d) for d in s["shape"]]) for s in sch["outputs"]]
        self.metrics = Metrics(group.nodes_state, group.q.qsize, lambda: group.ready)
        group.on_wait = self.metrics.queue_wait.observe
        self.preprocess = group.node.b.manifest.get("preprocess")

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        m = "/v2/models/{model}"
        v = "/v2/models/{model}/versions/{version}"
        routes = [Route("/v2/health/live", self.live), Route("/v2/health/ready", self.ready_ep),
                  Route("/v2", self.server_meta), Route("/metrics", self.prom),
                  Route("/v2/repository/index", self.index, methods=["POST"])]
        for base in (m, v):
            routes += [Route(base, self.model_meta), Route(base + "/ready", self.model_ready),
                       Route(base + "/stats", self.stats), Route(base + "/infer", self.infer, methods=["POST"])]
        async def http_error(request: Any, exc: Any) -> Any:
            return _error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")

        app = Starlette(routes=routes, exception_handlers={404: http_error, 405: http_error})
        app.add_middleware(_Guard, front=self)
        return app

    # ---- endpoints ------------------------------------------------------------------------------------------
    async def live(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse({"live": True})

    async def ready_ep(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        ok = self.group.ready
        return JSONResponse({"ready": ok, **({} if ok else {"reason": self.group.why})},
                            status_code=200 if ok else 503)

    async def server_meta(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse({"name": "disco", "version": __version__, "extensions": EXTENSIONS})

    def _model(self, request: Any) -> str | None:
        name = request.path_params["model"]
        version = request.path_params.get("version")
        return None if name != self.model or version not in (None, "", "1") else name

    async def index(self, request: Any) -> Any:
        """Triton's model repository index: the one model this group serves."""
        from starlette.responses import JSONResponse

        return JSONResponse([{"name": self.model, "version": "1", "state": "READY" if self.group.ready
                              else "UNAVAILABLE", "reason": self.group.why}])

    async def model_meta(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        if self._model(request) is None:
            return self._unknown(request)
        meta = {"name": self.model, "versions": ["1"], "platform": "disco_onnx_split",
                "inputs": [s.meta() for s in self.inputs], "outputs": [s.meta() for s in self.outputs]}
        if self.preprocess is not None:
            meta["parameters"] = {"preprocess": self.preprocess}
        return JSONResponse(meta)

    async def model_ready(self, request: Any) -> Any:
        if self._model(request) is None:
            return self._unknown(request)
        return await self.ready_ep(request)

    async def stats(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        if self._model(request) is None:
            return self._unknown(request)
        g = self.group
        return JSONResponse({"model": self.model, "state": g.state, "reason": g.why, "ready": g.ready,
                             "queue_depth": g.q.qsize(), "max_queue": g.max_queue, "inflight": g.inflight,
                             "self_tests": g.self_tests,
                             "nodes": [g.nodes_state()[j] for j in range(g.nodes)]})

    async def prom(self, request: Any) -> Any:
        from starlette.responses import Response

        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    def _unknown(self, request: Any) -> Any:
        return _error(404, f"unknown model {request.path_params['model']!r} (version "
                           f"{request.path_params.get('version') or '-'}); this server has {self.model!r} version 1")

    async def infer(self, request: Any) -> Any:
        t0 = time.monotonic()
        resp = await self._infer(request, t0)
        outcome = {200: "success", 400: "bad_request", 404: "bad_request", 413: "bad_request"}.get(
            resp.status_code, "failure")
        if resp.status_code == 503 and getattr(resp, "rejected", False):
            outcome = "rejected"
        self.metrics.requests.labels(outcome).inc()
        self.metrics.duration.observe(time.monotonic() - t0)
        return resp

    async def _infer(self, request: Any, t0: float) -> Any:
        from starlette.responses import Response

        if self._model(request) is None:
            return self._unknown(request)
        if request.headers.get("content-encoding", "identity") != "identity":
            return _error(400, f"Content-Encoding {request.headers['content-encoding']!r} is not supported: send "
                               "the request uncompressed")
        body = await _read_body(request, self.max_body)
        if isinstance(body, int):
            return _error(413, f"the request body exceeds {self.max_body} bytes (--max-body)")
        try:
            req = parse_request(body, request.headers.get(HEADER_LENGTH), self.inputs, self.outputs)
        except BadRequest as e:
            return _error(400, str(e))
        wait = self.request_timeout if req.timeout_s is None else min(req.timeout_s, self.request_timeout)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()

        def done(out: list[np.ndarray] | None, err: str | None, status: int) -> None:
            loop.call_soon_threadsafe(_settle, fut, (out, err, status))

        r = Request(req.inputs, req.id, t0 + wait, done)
        try:
            self.group.submit(r)
        except Unavailable as e:
            resp = _error(e.status, str(e))
            resp.rejected = True
            return resp
        try:
            out, err, status = await asyncio.wait_for(asyncio.shield(fut), timeout=wait)
        except asyncio.TimeoutError:
            r.cancelled = True
            return _error(504, f"no answer within the request's deadline of {wait:g} s")
        if err is not None:
            return _error(status, err)
        names = [s.name for s in self.outputs]
        values = dict(zip(names, out, strict=True))
        content, headers = build_response(self.model, req, values)
        return Response(content, headers=headers)


def _settle(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


async def _read_body(request: Any, limit: int) -> bytes | int:
    """The body, or its size so far once it exceeds ``limit`` (checked on Content-Length first)."""
    cl = request.headers.get("content-length")
    if cl is not None and cl.isdigit() and int(cl) > limit:
        return int(cl)
    chunks, n = [], 0
    async for c in request.stream():
        n += len(c)
        if n > limit:
            return n
        chunks.append(c)
    return b"".join(chunks)


class _Guard:
    """ASGI middleware: the bearer token (401 without it) and a 500 with a body for anything unexpected."""

    def __init__(self, app: Any, front: Front) -> None:
        self.app, self.front = app, front

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        tok = self.front.token
        if tok and scope["path"] not in OPEN_PATHS:
            auth = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            if not hmac.compare_digest(auth.encode(), f"Bearer {tok}".encode()):
                self.front.metrics.requests.labels("unauthorized").inc() if scope["path"].endswith("/infer") \
                    else None
                resp = _error(401, "a bearer token is required (Authorization: Bearer ...; --serve-token)")
                return await resp(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        except Exception as e:  # never a node's crash: one 500 with a body
            log.exception("internal error")
            resp = _error(500, f"internal error: {type(e).__name__}: {e}")
            await resp(scope, receive, send)


def _listen(host: str, port: int) -> socket.socket:
    """The HTTP socket, bound before anything else starts (a port in use is refused at once)."""
    from .errors import Refused

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise Refused(f"--serve {host}:{port}: cannot listen there ({e.strerror})") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(node: Any, host_port: str, model: str, token: str | None, max_queue: int, inflight: int,
          max_body: int, request_timeout: float) -> None:
    """Rank 0: start the group thread and the HTTP front; return on SIGINT/SIGTERM or when the group fails."""
    import uvicorn

    from .errors import Refused

    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise Refused(f"--serve {host_port}: write HOST:PORT, e.g. 127.0.0.1:8000")
    token = token or os.environ.get(TOKEN_ENV) or None
    if host not in ("127.0.0.1", "localhost", "::1") and not token:
        log.warning("serving on %s without a token: anyone who reaches it can query the model", host)
    group = Group(node, max_queue=max_queue, inflight=inflight)
    front = Front(group, model, token, max_body, request_timeout)
    config = uvicorn.Config(front.app(), host=host, port=int(port), log_level="warning", access_log=False,
                            lifespan="off", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)

    sock = _listen(host, int(port))
    stopped: list[int] = []

    async def main(sock: socket.socket) -> None:
        group.start()
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not task.done():
            if group.fatal is not None or stopped:  # rank 0 failed, or a signal before uvicorn took them
                server.should_exit = True
            await asyncio.sleep(0.2)
        await task

    # uvicorn catches SIGINT/SIGTERM for its graceful shutdown, then raises the signal again under the handler
    # that was there before: this one, so that the group is ended (its members told) and the node exits 0
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, f: stopped.append(s))
    try:
        asyncio.run(main(sock))
    finally:
        group.stop()
        sock.close()
    log.info("rank 0 stopped%s", f" by signal {stopped[0]}" if stopped else "")
    if group.fatal is not None:
        raise group.fatal
