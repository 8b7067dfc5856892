"""How the gateway is served: uvicorn with two changes that measurably matter.

- :class:`OneWriteHttpProtocol`: uvicorn's httptools protocol writes a response's status
  line and headers, then its body, as two writes; on loopback with ``TCP_NODELAY`` that
  is two segments and two wake-ups of the client per answer. The status line and headers
  are held until the first body write (or the end of the response, or a close) and go
  out with it.
- Several workers get one listening socket each, bound with ``SO_REUSEPORT``, so the
  kernel spreads new connections over them evenly. With uvicorn's own ``workers=N``
  they share one socket and whichever worker wakes first accepts: benchmark runs saw
  every keep-alive connection on one worker while the other idled
  (docs/benchmarks.md, "HTTP ingest gateway").

:func:`serve_workers` supervises the workers: it restarts one that dies, forwards
SIGTERM/SIGINT (each worker then drains its in-flight requests) and waits for them.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ingest_gateway._metrics import MULTIPROC_ENV

__all__ = ["DrainingServer", "OneWriteHttpProtocol", "reuseport_socket", "serve_one",
           "serve_workers"]

log = logging.getLogger("strata.gateway.server")

_INTERIM = b"HTTP/1.1 1"  # 100 Continue and other 1xx answers are sent as they are


class _HeldHeadersTransport:
    """A transport that holds a response head until the next write (see the module
    docstring); everything else is the wrapped transport's."""

    __slots__ = ("_held", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + bytes(data))
        elif (data[:9] == b"HTTP/1.1 " and data[:10] != _INTERIM
              and bytes(data[-4:]) == b"\r\n\r\n"):
            self._held = bytes(data)
        else:
            self._transport.write(data)

    def release(self) -> None:
        """Write a held head now (a response without body bytes, e.g. HEAD)."""
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held)

    def close(self) -> None:
        self.release()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class OneWriteHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, writing each response head with its body."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_HeldHeadersTransport(transport))  # type: ignore[arg-type]

    def on_response_complete(self) -> None:
        held = self.transport
        if isinstance(held, _HeldHeadersTransport):
            held.release()
        super().on_response_complete()


def reuseport_socket(host: str, port: int, *, listen: bool = True) -> socket.socket:
    """A TCP socket bound with ``SO_REUSEPORT`` (several may share ``port``), listening
    unless ``listen`` is False (then it only keeps the port from other programs)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(2048)
    return sock


class DrainingServer(uvicorn.Server):
    """uvicorn's server, telling the app the moment the shutdown begins.

    On SIGTERM/SIGINT it calls ``app.drain()`` at once (``/readyz`` answers 503 from
    then on), then keeps serving for ``app.drain_delay_s`` seconds (if any) so that load
    balancers see the 503 and stop sending before the listening socket is closed; then
    uvicorn's graceful shutdown runs as usual. A second signal ends the delay early.
    """

    def __init__(self, config: uvicorn.Config, app: Any) -> None:
        super().__init__(config)
        self._gateway = app
        self._drain_until: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        drain = getattr(self._gateway, "drain", None)
        if drain is not None:
            drain()
        delay = float(getattr(self._gateway, "drain_delay_s", 0.0) or 0.0)
        if delay > 0 and self._drain_until is None and not self.should_exit:
            self._captured_signals.append(sig)  # re-raised after the server ends, as uvicorn does
            self._drain_until = time.monotonic() + delay
            log.info("gateway draining: /readyz answers 503; closing the listener in %g s",
                     delay)
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self._drain_until is not None and time.monotonic() >= self._drain_until:
            self.should_exit = True
        return await super().on_tick(counter)


def serve_one(app: Any, options: dict[str, Any], sock: socket.socket | None = None) -> None:
    """Run one uvicorn server in this process until SIGTERM/SIGINT (see ``DrainingServer``)."""
    server = DrainingServer(uvicorn.Config(app, http=OneWriteHttpProtocol, **options), app)
    server.run(sockets=None if sock is None else [sock])


def _exit_with_parent() -> None:
    """Ask Linux to SIGTERM this worker when the supervisor dies (however it dies), so a
    killed supervisor leaves no orphan serving the port."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


_PR_SET_PDEATHSIG = 1


def _worker_main(factory: Callable[[], Any], options: dict[str, Any], host: str,
                 port: int, parent: int) -> None:
    _exit_with_parent()
    if os.getppid() != parent:  # the supervisor died before prctl took effect
        return
    sock = reuseport_socket(host, port)
    serve_one(factory(), {**options, "host": host, "port": port}, sock)


def serve_workers(factory: Callable[[], Any], options: dict[str, Any], workers: int, *,
                  drain_delay_s: float = 0.0) -> None:
    """``workers`` processes, each calling ``factory()`` for its app and listening on its
    own ``SO_REUSEPORT`` socket; returns when they all ended after SIGTERM/SIGINT.

    A worker that ends on its own is replaced (after a pause that grows while workers
    keep failing right after starting). On SIGTERM/SIGINT every worker gets SIGTERM and
    drains (``drain_delay_s``, uvicorn's graceful wait, then the app's close, each up to
    ``timeout_graceful_shutdown``); one still running after all that is killed."""
    options = dict(options)
    host, port = options.pop("host"), options.pop("port")
    grace = float(options.get("timeout_graceful_shutdown") or 30)
    # Bound, not listening: it keeps the port for the workers (and picks it when 0) and
    # fails here, once, if another program has it; connections go to listening sockets.
    reserve = reuseport_socket(host, port, listen=False)
    port = reserve.getsockname()[1]
    metrics_dir = tempfile.TemporaryDirectory(prefix="strata-gateway-metrics-")
    # before any worker imports prometheus_client: its values then live in shared files
    os.environ[MULTIPROC_ENV] = metrics_dir.name
    context = multiprocessing.get_context("spawn")
    stopping = False
    children: list[multiprocessing.process.BaseProcess] = []

    def start() -> multiprocessing.process.BaseProcess:
        process = context.Process(target=_worker_main,
                                  args=(factory, options, host, port, os.getpid()),
                                  name="strata-gateway-worker")
        process.start()
        return process

    signalled: set[int] = set()

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for process in children:
            # once each: a second SIGTERM makes uvicorn skip its graceful wait
            if process.pid is not None and process.pid not in signalled and process.is_alive():
                signalled.add(process.pid)
                os.kill(process.pid, signal.SIGTERM)

    # handlers first: a signal while workers start must still reach every worker
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    started: list[float] = []
    pause = 0.0
    try:
        for _ in range(workers):
            if stopping:
                break
            children.append(start())
            started.append(time.monotonic())
        log.info("gateway: %d workers on %s:%d (SO_REUSEPORT)", workers, host, port)
        while not stopping:
            time.sleep(0.2)
            for i, process in enumerate(children):
                if stopping or process.is_alive():
                    continue
                quick = time.monotonic() - started[i] < 10
                pause = min(10.0, max(0.5, pause * 2)) if quick else 0.0
                log.error("gateway worker %s ended (exit code %s); starting a new one%s",
                          process.pid, process.exitcode,
                          f" in {pause:.1f} s" if pause else "")
                time.sleep(pause)
                if not stopping:
                    children[i] = start()
                    started[i] = time.monotonic()
                    if stopping:  # the signal came while it started
                        stop(signal.SIGTERM, None)
    finally:
        stop(signal.SIGTERM, None)
        deadline = time.monotonic() + drain_delay_s + 2 * grace + 5
        for process in children:
            process.join(max(0.1, deadline - time.monotonic()))
            if process.is_alive():
                log.error("gateway worker %s did not stop in time: killing it", process.pid)
                process.kill()
                process.join(5)
        reserve.close()
        os.environ.pop(MULTIPROC_ENV, None)
        metrics_dir.cleanup()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
