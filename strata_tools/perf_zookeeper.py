"""The benchmarks' read-only view of the cluster's ZooKeeper (layout:
``brokers/coordination.py``).

``strata perf failover`` and ``strata perf scale`` time elections and recoveries against
the cluster's truth, read from ZooKeeper directly rather than through a broker whose
metadata may lag: the registered brokers, the controller, each partition's replicas,
leader and ISR, and watches on them. Many znodes are read at once in multiRead requests
(``brokers.coordination.read_znodes``): pipelined ``get_async`` calls took 4-6 s for
10,000 znodes here, which would have padded every figure.

Blocking (kazoo): async code calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Final

__all__ = ["ROOT", "Key", "ZooKeeperView"]

ROOT: Final = "/strata"
Key = tuple[str, int]  # (topic, partition)


class ZooKeeperView:
    """The znodes the benchmarks read, and the two watches the failover benchmark sets."""

    def __init__(self, hosts: str, timeout: float) -> None:
        """Connected within ``timeout`` seconds, or kazoo's error is raised (and the
        client closed)."""
        from kazoo.client import KazooClient

        self.zk = KazooClient(hosts=hosts, timeout=10.0)
        try:
            self.zk.start(timeout=timeout)
        except BaseException:
            self.zk.stop()
            self.zk.close()
            raise

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()

    def get_many(self, paths: Sequence[str]) -> list[Any]:
        """The JSON value of each path (None where it does not exist), in multiRead
        requests."""
        from brokers.coordination import read_znodes

        found = read_znodes(self.zk, paths)
        out: list[Any] = []
        for path in paths:
            data = found.get(path, (b"", None))[0]
            out.append(json.loads(data.decode()) if data else None)
        return out

    def replicas(self, topics: Sequence[str]) -> dict[str, dict[int, list[int]] | None]:
        """Each topic's replicas per partition (None: the topic has no definition)."""
        values = self.get_many([f"{ROOT}/brokers/topics/{t}" for t in topics])
        return {topic: {int(p): [int(b) for b in replicas]
                        for p, replicas in value["partitions"].items()}
                if isinstance(value, dict) else None
                for topic, value in zip(topics, values, strict=True)}

    def states(self, keys: Sequence[Key]) -> dict[Key, tuple[int, list[int]]]:
        """(leader, isr) of each partition; (-1, []) while it has no state znode."""
        values = self.get_many([f"{ROOT}/brokers/topics/{t}/partitions/{p}/state"
                                for t, p in keys])
        return {k: ((int(v["leader"]), [int(b) for b in v["isr"]])
                    if isinstance(v, dict) else (-1, []))
                for k, v in zip(keys, values, strict=True)}

    def live_brokers(self) -> set[int]:
        """The brokers registered now (their ephemeral ``brokers/ids`` znodes)."""
        from kazoo.exceptions import NoNodeError

        try:
            return {int(c) for c in self.zk.get_children(f"{ROOT}/brokers/ids")}
        except NoNodeError:
            return set()

    def controller(self) -> int | None:
        (value,) = self.get_many([f"{ROOT}/controller"])
        return int(value["broker_id"]) if isinstance(value, dict) else None

    def on_gone(self, path: str, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on kazoo's thread) once ``path`` no longer exists."""
        def watch(data: bytes | None, stat: Any) -> bool:
            if stat is None:
                callback()
                return False
            return True
        self.zk.DataWatch(path)(watch)

    def on_leader_change(self, topic: str, partition: int, old: int,
                         callback: Callable[[int], None]) -> None:
        """Call ``callback(new_leader)`` once the state names a live leader other than
        ``old``."""
        def watch(data: bytes | None, stat: Any) -> bool:
            if not data:
                return True
            leader = int(json.loads(data.decode())["leader"])
            if leader not in (old, -1):
                callback(leader)
                return False
            return True
        self.zk.DataWatch(f"{ROOT}/brokers/topics/{topic}/partitions/{partition}/state")(watch)
