"""A real S3 API server for the object-store warehouse tests: moto's standalone server
(``python -m moto.server``, the S3 REST API over HTTP) as a process of its own on
127.0.0.1 and a free port, so a test can stop it (an outage) and start it again on the
same port. Its state lives in memory: a restart empties it, as losing a bucket would.

``environment()`` is what a client process needs to reach it the way a user's would:
the standard AWS variables (dummy credentials, a region, ``AWS_ENDPOINT_URL``), never
options on a command line.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from procs import free_port, kill_pid, wait_for_port

__all__ = ["S3Server"]

#: moto accepts any key pair; these only have to look like one.
ACCESS_KEY = "strata-test-access-key"
SECRET_KEY = "strata-test-secret-key-never-logged"
REGION = "us-east-1"


class S3Server:
    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.log_path = log_dir / "moto_server.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_port("127.0.0.1", self.port, timeout=30)

    def stop(self) -> None:
        if self.process is not None:
            kill_pid(self.process.pid, grace=5.0, expect="moto.server")
            self.process.wait(timeout=10)
            self.process = None

    def environment(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_REGION": REGION, "AWS_ENDPOINT_URL": self.endpoint}

    def create_bucket(self, name: str) -> None:
        import boto3  # moto[server]'s dependency

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                              aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
        client.create_bucket(Bucket=name)
