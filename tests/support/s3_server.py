"""A real S3 API server for the object-store warehouse tests: moto's standalone server
(``python -m moto.server``, the S3 REST API over HTTP) as a process of its own on
127.0.0.1 and a free port, so a test can stop it (an outage) and start it again on the
same port. Its state lives in memory: a restart empties it, as losing a bucket would.

``environment()`` is what a client process needs to reach it the way a user's would:
the standard AWS variables (dummy credentials, a region, ``AWS_ENDPOINT_URL``), never
options on a command line.

Clients reach the server through a byte-copying front on a port of its own
(``endpoint``; tests/support/s3_front.py), so that a test can take the store away without
losing what it holds: ``outage()`` kills the front's process (every connection through
it drops, new ones are refused, as by a stopped server), ``restore()`` starts it again on
the same port. The front is a process, not a thread of the test's: delta-rs holds the
GIL while it waits for the store, so a front in the same process would never answer it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from procs import free_port, kill_pid, wait_for_port

REPO = Path(__file__).resolve().parents[2]

__all__ = ["S3Server"]

#: moto accepts any key pair; these only have to look like one.
ACCESS_KEY = "strata-test-access-key"
SECRET_KEY = "strata-test-secret-key-never-logged"
REGION = "us-east-1"


class S3Server:
    @classmethod
    @contextmanager
    def serving(cls, log_dir: Path, bucket: str) -> Iterator[S3Server]:
        """A started server holding an empty ``bucket``; stopped (by PID) on exit."""
        server = cls(log_dir)
        try:
            server.start()
            server.create_bucket(bucket)
            yield server
        finally:
            server.stop()

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()  #: the front's: what clients use
        self.backend_port = free_port()
        self.log_path = log_dir / "moto_server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._front: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                 str(self.backend_port)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_port("127.0.0.1", self.backend_port, timeout=30)
        self.restore()

    def outage(self) -> None:
        """The store goes away for its clients: connections cut, new ones refused."""
        if self._front is not None:
            kill_pid(self._front.pid, grace=0.0, expect="s3_front")
            self._front.wait(timeout=10)
            self._front = None

    def restore(self) -> None:
        """The store is back (on the same port), with everything it held."""
        self._front = subprocess.Popen(
            [sys.executable, "-m", "tests.support.s3_front", str(self.port),
             str(self.backend_port)], cwd=REPO, start_new_session=True)
        wait_for_port("127.0.0.1", self.port, timeout=30)

    def stop(self) -> None:
        self.outage()
        if self.process is not None:
            kill_pid(self.process.pid, grace=5.0, expect="moto.server")
            self.process.wait(timeout=10)
            self.process = None

    def environment(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_REGION": REGION, "AWS_ENDPOINT_URL": self.endpoint}

    def client(self) -> Any:
        """A boto3 S3 client of the server (boto3 is moto[server]'s dependency)."""
        import boto3  # type: ignore[import-untyped]

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def keys(self, bucket: str, prefix: str) -> set[str]:
        """Every object key under ``prefix``."""
        pages = self.client().get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix)
        return {item["Key"] for page in pages for item in page.get("Contents", [])}
