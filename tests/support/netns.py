"""Hosts of their own on one machine: Linux network namespaces on a bridge, and the link
faults a network nemesis needs (issue [2.5] section 2).

``Network`` makes a bridge in the root namespace with the first address of a private
/24 (so the test, a client in the root namespace, reaches every node), and per node a
namespace with a veth pair to the bridge and one address. Nothing else is touched: every
name (namespace, bridge, veth) carries a random tag, the subnet is one no interface or
route of this machine uses, and ``close()`` removes exactly what was made (also after a
failure). Processes run in a node with ``prefix(node)`` (``ip netns exec NS``, which
execs the command, so the PID is the process's own); kill them before ``close()``.

Faults, all undone by ``heal()``:

- ``partition(side_a, side_b)``: no packet between any node of one side and any of the
  other, in either direction (a ``blackhole`` route per peer address in each node's
  namespace, which discards silently, as a dropped link does); the root namespace (the
  clients) still reaches every node;
- ``isolate(node)``: the node's link is down: nobody reaches it, clients included;
- ``degrade(node, delay_ms=, loss_percent=)``: latency and packet loss on its link.

Latency and loss (``tc netem``) need the kernel's ``sch_netem``; ``netem_available()``
tells whether this machine has it.

Needs root (``CAP_NET_ADMIN``) and the ``ip`` tool; ``unavailable()`` says why not.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import subprocess
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Network", "NetworkNode", "netem_available", "unavailable"]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30,
                          check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "the `ip` tool (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN); the tests run as another user"
    probe = f"stprobe{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def netem_available() -> str | None:
    """Why ``tc netem`` (latency, loss) cannot be used here, or None when it can."""
    if shutil.which("tc") is None:
        return "the `tc` tool is not installed"
    probe = f"stnetem{uuid.uuid4().hex[:5]}"
    made = _ip("link", "add", probe, "type", "veth", "peer", "name", f"{probe}p", check=False)
    if made.returncode != 0:
        return f"could not make a veth pair to try netem on: {made.stderr.strip()}"
    try:
        done = subprocess.run(["tc", "qdisc", "add", "dev", probe, "root", "netem", "delay",
                               "1ms"], capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            return (f"this kernel has no netem queueing discipline (`tc qdisc add ... netem` "
                    f"says: {done.stderr.strip()}); it needs the sch_netem module")
        return None
    finally:
        _ip("link", "del", probe, check=False)


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = _ip("-o", "-4", "addr", "show").stdout + _ip("-4", "route", "show").stdout
    found = []
    for word in out.split():
        with contextlib.suppress(ValueError):
            if "/" in word:
                found.append(ipaddress.ip_network(word, strict=False))
    return found


def _free_subnet() -> ipaddress.IPv4Network:
    used = _used_networks()
    for _ in range(200):
        candidate = ipaddress.ip_network(
            f"10.{random.randrange(200, 250)}.{random.randrange(0, 256)}.0/24")
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise RuntimeError("no free 10.x.y.0/24 subnet for the test network")


def _qdisc(node: NetworkNode, action: str, *netem: str, check: bool = True) -> None:
    """``tc qdisc <action>`` on both ends of the node's link (both directions)."""
    for prefix, device in (((), node.veth),
                           (("ip", "netns", "exec", node.namespace), node.inner)):
        done = subprocess.run([*prefix, "tc", "qdisc", action, "dev", device, "root", *netem],
                              capture_output=True, text=True, timeout=30, check=False)
        if check and done.returncode != 0:
            raise RuntimeError(f"tc qdisc {action} on {device} failed: {done.stderr.strip()}")


@dataclass(frozen=True, slots=True)
class NetworkNode:
    name: str
    namespace: str
    address: str
    veth: str  # the end in the root namespace, on the bridge
    inner: str  # the end in the node's namespace


class Network:
    """See the module docstring."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:5]
        self.subnet = _free_subnet()
        hosts = self.subnet.hosts()
        self.gateway = str(next(hosts))
        self._addresses = hosts
        self.bridge = f"stbr{self.tag}"
        self.nodes: dict[str, NetworkNode] = {}
        self._routes: list[tuple[str, str]] = []  # (namespace, blackholed address)
        self._down: set[str] = set()
        self._degraded: list[NetworkNode] = []
        _ip("link", "add", self.bridge, "type", "bridge")
        try:
            _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    def add(self, name: str) -> NetworkNode:
        index = len(self.nodes)
        inner = f"st{self.tag}i{index}"
        node = NetworkNode(name, f"st{self.tag}{name}", str(next(self._addresses)),
                           f"st{self.tag}v{index}", inner)
        self.nodes[name] = node
        _ip("netns", "add", node.namespace)
        _ip("link", "add", node.veth, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", node.namespace)
        _ip("link", "set", node.veth, "master", self.bridge)
        _ip("link", "set", node.veth, "up")
        _ip("-n", node.namespace, "addr", "add", f"{node.address}/{self.subnet.prefixlen}",
            "dev", inner)
        _ip("-n", node.namespace, "link", "set", inner, "up")
        _ip("-n", node.namespace, "link", "set", "lo", "up")
        return node

    @staticmethod
    def prefix(node: NetworkNode) -> tuple[str, ...]:
        return ("ip", "netns", "exec", node.namespace)

    # ------------------------------------------------------------------ faults
    def partition(self, side_a: Iterable[NetworkNode], side_b: Iterable[NetworkNode]) -> None:
        a, b = list(side_a), list(side_b)
        for left in a:
            for right in b:
                for here, there in ((left, right), (right, left)):
                    _ip("-n", here.namespace, "route", "add", "blackhole",
                        f"{there.address}/32")
                    self._routes.append((here.namespace, there.address))

    def isolate(self, node: NetworkNode) -> None:
        _ip("link", "set", node.veth, "down")
        self._down.add(node.veth)

    def degrade(self, node: NetworkNode, *, delay_ms: int, loss_percent: float) -> None:
        """Both directions of the node's link get ``delay_ms`` of latency (with a tenth of
        it as jitter) and lose ``loss_percent`` of their packets (``tc netem``)."""
        self._degraded.append(node)
        _qdisc(node, "add", "netem", "delay", f"{delay_ms}ms",
               f"{max(1, delay_ms // 10)}ms", "loss", f"{loss_percent}%")

    def heal(self) -> None:
        for node in self._degraded:
            _qdisc(node, "del", check=False)
        self._degraded.clear()
        for namespace, address in self._routes:
            _ip("-n", namespace, "route", "del", "blackhole", f"{address}/32", check=False)
        self._routes.clear()
        for veth in self._down:
            _ip("link", "set", veth, "up", check=False)
        self._down.clear()

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Remove every namespace, veth and the bridge this object made."""
        for node in self.nodes.values():
            _ip("netns", "del", node.namespace, check=False)  # takes its veth end along
            _ip("link", "del", node.veth, check=False)
        _ip("link", "del", self.bridge, check=False)
        self.nodes.clear()
