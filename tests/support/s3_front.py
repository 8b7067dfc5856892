"""The S3 test server's front (tests/support/s3_server.py): ``python -m
tests.support.s3_front PORT TARGET`` copies bytes between clients on 127.0.0.1:PORT and
the server on 127.0.0.1:TARGET until it is killed, which is how a test takes the store
away (every connection drops with the process) without losing what the store holds.

A thread per direction of each connection; a half-close is passed on as one; the server
is dialled once a client has sent its first bytes.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading

__all__ = ["serve"]


def serve(port: int, target: int) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_connection, args=(client, target), daemon=True).start()


def _connection(client: socket.socket, target: int) -> None:
    with client:
        try:
            first = client.recv(65536)
            if not first:
                return
            backend = socket.create_connection(("127.0.0.1", target), timeout=10)
        except OSError:
            return
        with backend:
            backend.settimeout(None)
            try:
                backend.sendall(first)
            except OSError:
                return
            back = threading.Thread(target=_pump, args=(backend, client), daemon=True)
            back.start()
            _pump(client, backend)
            back.join()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_RDWR)


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
