"""``strata perf security``: what TLS and SASL cost, plaintext and SASL_SSL in one run.

Starts its own ZooKeeper and one broker (free ports, a temporary directory, both stopped
at the end, by PID) with two listeners, PLAINTEXT and SASL_SSL (SCRAM-SHA-256, a private
CA from ``strata_tools.certs``), and the authorizer off so only the transport differs.
Then, for each listener in turn, ``strata perf produce`` (``send_batch``, acks=1) and
``strata perf consume`` on a topic of its own, as separate processes, as ``make bench``
runs them. Prints one JSON object: records/s and MB/s per listener and the SASL_SSL
share of plaintext (the target is at least 70 %: docs/benchmarks.md, "Security: PLAINTEXT
vs SASL_SSL").

Consumption over TLS cannot use ``sendfile``: the broker copies the record data through
the TLS transport (brokers/network.py), which is part of what the consume figure shows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["add_security_arguments", "run_security"]


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-records", type=int, default=3_000_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=8)


def _free_port() -> int:
    from procs import free_port

    return free_port()


def _perf(kind: str, bootstrap: str, topic: str, records: int, size: int,
          config: Path | None) -> dict[str, Any]:
    args = [sys.executable, "-m", "strata_tools.cli", "perf", kind, "--bootstrap", bootstrap,
            "--topic", topic, "--num-records", str(records), "--format", "json"]
    if kind == "produce":
        args += ["--record-size", str(size), "--acks", "1"]
    if config is not None:
        args += ["--command-config", str(config)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"strata perf {kind} failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run_security(args: argparse.Namespace) -> int:
    from brokers.coordination import ZooKeeperClient
    from procs import kill_pid
    from strata.client import Admin, NewTopic
    from strata_tools.certs import CertificateAuthority
    from wire.sasl import scram_credential
    from wire.security import ClientSecurity
    from zookeeper.launcher import ZooKeeperServer

    with tempfile.TemporaryDirectory(prefix="strata-perf-security-") as scratch:
        root = Path(scratch)
        ca = CertificateAuthority.create(root / "ca")
        cert = ca.issue(root, "broker")
        zookeeper = ZooKeeperServer(root / "zookeeper", _free_port(), start_timeout=60)
        zookeeper.start()
        broker: subprocess.Popen[str] | None = None
        data_dir = root / "broker"
        try:
            coordinator = ZooKeeperClient(zookeeper.connect_string)
            coordinator.start()
            try:
                coordinator.put_scram_credential(
                    "bench", scram_credential("SCRAM-SHA-256", "bench-secret"))
            finally:
                coordinator.stop()
            plain_port, secure_port = _free_port(), _free_port()
            broker = subprocess.Popen(
                [sys.executable, "-m", "brokers", "--broker-id", "0", "--data-dir",
                 str(data_dir), "--zookeeper", zookeeper.connect_string, "--metrics-port", "0",
                 "--override", f"listeners=PLAINTEXT://127.0.0.1:{plain_port},"
                 f"SASL_SSL://127.0.0.1:{secure_port}",
                 "--override", f"ssl.certfile={cert.certfile}",
                 "--override", f"ssl.keyfile={cert.keyfile}",
                 "--override", "offsets.topic.replication.factor=1",
                 "--log-level", "WARNING"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True)
            assert broker.stdout is not None
            deadline = time.monotonic() + 60
            for line in broker.stdout:
                if line.startswith("strata broker 0 ready"):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the benchmark's broker did not start")
            config = root / "client.properties"
            config.write_text("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\n"
                              "sasl.username=bench\nsasl.password=bench-secret\n"
                              f"ssl.ca.location={ca.certfile}\n")
            results: dict[str, Any] = {"num_records": args.num_records,
                                       "record_size": args.record_size,
                                       "partitions": args.partitions}
            runs = (("PLAINTEXT", f"127.0.0.1:{plain_port}", None, ClientSecurity()),
                    ("SASL_SSL", f"127.0.0.1:{secure_port}", config,
                     ClientSecurity("SASL_SSL", "SCRAM-SHA-256", "bench", "bench-secret",
                                    ssl_cafile=str(ca.certfile))))
            for name, bootstrap, properties, security in runs:
                topic = f"bench-{name.lower()}"
                with Admin(bootstrap, security=security) as admin:
                    admin.create_topics([NewTopic(topic, args.partitions, 1)])
                produced = _perf("produce", bootstrap, topic, args.num_records,
                                 args.record_size, properties)
                consumed = _perf("consume", bootstrap, topic, args.num_records,
                                 args.record_size, properties)
                results[name] = {"produce": produced, "consume": consumed}
            for kind in ("produce", "consume"):
                plain = results["PLAINTEXT"][kind]["records_per_sec"]
                secure = results["SASL_SSL"][kind]["records_per_sec"]
                results[f"sasl_ssl_share_of_plaintext_{kind}"] = round(secure / plain, 3)
        finally:
            if broker is not None and broker.poll() is None:
                kill_pid(broker.pid, grace=10.0, expect=str(data_dir))
                broker.wait(30)
            zookeeper.stop(grace=5.0)
    print(json.dumps(results))
    return 0
