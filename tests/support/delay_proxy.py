"""A TCP proxy that holds back chosen requests (the KAFKA-17754 nemesis, issue [3.3]).

    proxy = DelayProxy(("127.0.0.1", broker_port)).start()
    proxy.hold(ApiKey.PRODUCE)          # the next Produce through it waits ...
    ...                                 # ... while the test goes on elsewhere
    proxy.release()                     # now the broker gets it
    proxy.close()

Requests are framed as on the wire (4-byte big-endian size, then the request; its
first two bytes are the API key). Client-to-broker frames pass one by one: a frame whose
API key is held waits (and so does every later frame of that connection: Kafka answers
a connection's requests in order). Broker-to-client bytes are copied as they come. The
proxy runs its own event loop in a thread; it only listens on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from typing import Any

__all__ = ["DelayProxy"]


class DelayProxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self.held_frames = 0  #: frames held so far (a test waits for its frame to arrive)
        self._held_keys: set[int] = set()
        self._release = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="delay-proxy",
                                        daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._arrived = threading.Condition()

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    def start(self) -> DelayProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def hold(self, api_key: int) -> None:
        """Hold every following request with ``api_key`` until ``release``."""
        self._release.clear()
        self._held_keys.add(int(api_key))

    def release(self) -> None:
        self._held_keys.clear()
        self._release.set()

    def wait_held(self, count: int, timeout: float = 10.0) -> None:
        """Wait until ``count`` frames in all have been held."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: self.held_frames >= count, timeout):
                raise AssertionError(f"only {self.held_frames} of {count} frames reached "
                                     "the proxy")

    def close(self) -> None:
        self.release()

        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    # ------------------------------------------------------------------ pumps
    async def _serve(self, client_r: asyncio.StreamReader,
                     client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            broker_r, broker_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            self._tasks.discard(task)
            return
        back = asyncio.create_task(self._copy(broker_r, client_w))
        self._tasks.add(back)
        try:
            while True:
                size_bytes = await client_r.readexactly(4)
                (size,) = struct.unpack(">i", size_bytes)
                body = await client_r.readexactly(size)
                (api_key,) = struct.unpack(">h", body[:2])
                if api_key in self._held_keys:
                    with self._arrived:
                        self.held_frames += 1
                        self._arrived.notify_all()
                    await asyncio.to_thread(self._release.wait)
                broker_w.write(size_bytes + body)
                await broker_w.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            back.cancel()
            for writer in (broker_w, client_w):
                writer.close()
            self._tasks.discard(task)
            self._tasks.discard(back)

    @staticmethod
    async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
