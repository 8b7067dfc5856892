"""The consumer group fault checker (issue [2.1] section 2): a pure function over logs.

tests/test_group_faults.py runs consumer groups of member processes
(tests/support/group_member.py) under a nemesis and leaves a directory of logs; ``load``
reads it into a ``History`` and ``check`` judges it, per group:

LOST
    every acknowledged record was delivered to some member of the group at least once
    (and a delivered offset holds the value that was acknowledged there: WRONG; a value
    no producer sent to that partition: UNEXPECTED);
ORDER / UNOWNED
    per partition, each member's deliveries within one ownership (``on_assign`` to
    ``on_revoke`` / ``on_lost``, in the order of its log) go up one offset at a time, and
    a member delivers no record of a partition it does not own;
COMMIT-BACKWARDS
    committed offsets never move backwards: over the Admin samples and the commits the
    members report, a commit or sample that started after another ended never shows a
    lower offset for the same partition;
STALL
    no partition owned by a live member (started, not yet asked to stop, not SIGKILLed,
    not SIGSTOPped, its application polling) goes without a delivery to it for longer
    than the session timeout (or ``max_poll_interval_ms``, the larger) plus 5 s while it
    has lag: an acknowledged record above the member's last delivered offset (at the
    start of an ownership, above every offset the group delivered before it, which
    bounds the committed offset the member starts from);
ORPHAN
    no partition with lag is owned by no live member for longer than that either (a
    partition whose owner died must move within about the session timeout, one whose
    owner's application stopped polling within about ``max_poll_interval_ms``: a member
    whose ``busy`` span, the time between a poll's return and its next poll, is longer
    than that is not live over it);
ZOMBIE-COMMIT
    a member whose application did not poll for longer than ``max_poll_interval_ms``
    has left its group: a commit it sent after that (plus 1 s) and before its next poll
    must have been refused (issue [3.1]);
EXIT
    no member process died by itself (an ``error`` line, or an exit the harness did not
    ask for), and every member asked to leave (SIGTERM) exited with status 0.

The STALL and ORPHAN clocks stop while a broker is down (from its SIGKILL until it is
back and the topics are healthy): a partition without a leader has no new
acknowledgements, but records acknowledged just before may wait for the failover.

Each violation names the check, group, partition, member and time span (seconds since
the test started); ``Report.render`` prints them under a summary line per group.
``python -m tests.support.group_checker DIR`` checks a kept log directory again.

Files in a log directory (JSON lines):

``harness.jsonl``
    ``meta`` (topic, partitions, session_timeout_s, max_poll_interval_s, t0, seed), then
    ``member-start``
    (m, g, t, mode), ``member-stop`` (SIGTERM sent), ``member-kill``, ``member-pause``,
    ``member-resume``, ``member-stall`` and ``member-output-blocked`` (s: seconds; what
    the member did is in its own ``busy`` lines), ``member-exit`` (code),
    ``broker-kill`` (broker),
    ``broker-healthy`` (broker), ``end``; every ``t`` is ``time.monotonic()``;
``records.jsonl``
    every record handed to a producer: p, v (value), o and t (offset and time of its
    acknowledgement, null if it was not acknowledged);
``samples.jsonl``
    Admin ``list_group_offsets`` answers: g, s (sent), t (answered), offsets {p: o};
``members/<name>.jsonl``
    each member's own log (tests/support/group_member.py).
"""

from __future__ import annotations

import bisect
import json
import math
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["GRACE_S", "Ack", "GroupReport", "History", "MemberLog", "MemberRun", "OffsetSample",
           "OffsetSampler", "Report", "Violation", "check", "load"]

#: Seconds on top of the session timeout a partition may wait (STALL, ORPHAN).
GRACE_S = 5.0
INF = math.inf


# ----------------------------------------------------------------------------- input


class OffsetSampler:
    """Every group's committed offsets (Admin ``list_group_offsets``) once a second, on a
    thread, in the form ``load`` reads (``samples.jsonl`` rows); once more at ``stop``."""

    def __init__(self, bootstrap: str, groups: list[str]) -> None:
        self.bootstrap, self.groups = bootstrap, groups
        self.samples: list[dict[str, Any]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="offset-sampler", daemon=True)

    def start(self) -> OffsetSampler:
        self._thread.start()
        return self

    def sample(self, admin: Any) -> None:
        for group in self.groups:
            sent = time.monotonic()
            try:
                offsets = admin.list_group_offsets(group)
            except Exception:  # coordinator moving or down: the next sample will do
                self.errors += 1
                continue
            self.samples.append({"g": group, "s": sent, "t": time.monotonic(), "offsets": {
                tp.partition: c.offset for tp, c in offsets.items() if c.offset >= 0}})

    def _run(self) -> None:
        from strata.client import Admin

        with Admin(self.bootstrap, request_timeout_ms=5000) as admin:
            while not self._stop.wait(1.0):
                self.sample(admin)
            self.sample(admin)  # once more after the members left

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        self._thread.join(timeout)


class MemberLog:
    """What one member process (tests/support/group_member.py) has logged so far: the
    partitions it owns, the records it was handed, its errors. ``refresh`` reads the
    complete lines appended since the last call."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.owned: set[int] = set()
        self.delivered: set[tuple[int, int]] = set()
        self.errors: list[str] = []
        self._offset = 0

    def refresh(self) -> None:
        try:
            with self.log.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self._offset += end
        for line in data[:end].splitlines():
            event = json.loads(line)
            if event["ev"] == "assign":
                self.owned |= set(event["ps"])
            elif event["ev"] in ("revoke", "lost"):
                self.owned -= set(event["ps"])
            elif event["ev"] == "recv":
                self.delivered.update((p, o) for p, o, _ in event["r"])
            elif event["ev"] == "error":
                self.errors.append(str(event.get("text", ""))[-400:])


@dataclass(frozen=True, slots=True)
class Ack:
    """A record the producer had acknowledged (acks=all) at ``at`` (monotonic)."""

    partition: int
    offset: int
    at: float
    value: str


@dataclass(slots=True)
class MemberRun:
    """One member process: its own log (``events``, file order) and what the harness did
    to it. ``ended`` is when it stopped being live (SIGTERM sent, SIGKILL, or an exit the
    harness noticed); ``pauses`` are SIGSTOP..SIGCONT spans."""

    name: str
    group: str
    started: float
    events: list[dict[str, Any]] = field(default_factory=list)
    ended: float | None = None
    end_kind: str | None = None  # "stop" | "kill" | "exit"
    exit_code: int | None = None
    pauses: list[tuple[float, float]] = field(default_factory=list)

    @property
    def busy(self) -> list[tuple[float, float]]:
        """Spans in which its application did not poll (its own ``busy`` lines)."""
        return [(float(e["from"]), float(e["to"])) for e in self.events
                if e.get("ev") == "busy"]

    def live(self, until: float) -> list[tuple[float, float]]:
        """Intervals in which the process ran, was not asked to go and polled, up to
        ``until``."""
        end = min(self.ended if self.ended is not None else INF, until)
        return _subtract([(self.started, end)], self.pauses + self.busy)


@dataclass(frozen=True, slots=True)
class OffsetSample:
    """Committed offsets as one request saw them: sent at ``sent``, answered at ``done``;
    ``source`` is "admin" or the member that committed them."""

    group: str
    sent: float
    done: float
    offsets: dict[int, int]
    source: str = "admin"


@dataclass(slots=True)
class History:
    """Everything ``check`` looks at (``load`` builds it from a log directory)."""

    topic: str
    partitions: int
    session_timeout_s: float
    t0: float
    end: float
    acks: list[Ack]
    #: Value -> partition of every record handed to a producer (acknowledged or not).
    sent: dict[str, int]
    members: dict[str, MemberRun]
    samples: list[OffsetSample] = field(default_factory=list)
    #: Spans in which a broker was down or the topics not yet healthy again.
    disturbed: list[tuple[float, float]] = field(default_factory=list)
    seed: int | None = None
    #: The members' max_poll_interval_ms in seconds (None: not recorded, no such check).
    max_poll_interval_s: float | None = None

    @property
    def groups(self) -> list[str]:
        return sorted({m.group for m in self.members.values()})

    @property
    def limit_s(self) -> float:
        return max(self.session_timeout_s, self.max_poll_interval_s or 0.0) + GRACE_S


# ----------------------------------------------------------------------------- output


@dataclass(frozen=True, slots=True)
class Violation:
    check: str
    group: str
    partition: int | None
    member: str | None
    start: float
    end: float
    detail: str

    def render(self, t0: float) -> str:
        where = f"group {self.group}"
        if self.partition is not None:
            where += f" partition {self.partition}"
        if self.member is not None:
            where += f" member {self.member}"
        return (f"{self.check}: {where} +{self.start - t0:.1f}s..+{self.end - t0:.1f}s: "
                f"{self.detail}")


@dataclass(slots=True)
class GroupReport:
    group: str
    members: int = 0
    acknowledged: int = 0
    delivered: int = 0  # distinct acknowledged records delivered
    deliveries: int = 0  # every delivery, repeats included
    commits: int = 0  # successful commits the members reported
    samples: int = 0
    violations: list[Violation] = field(default_factory=list)

    def summary(self) -> str:
        counts: dict[str, int] = defaultdict(int)
        for v in self.violations:
            counts[v.check] += 1
        found = ", ".join(f"{k}={n}" for k, n in sorted(counts.items())) or "none"
        return (f"group {self.group}: {self.members} member processes, acknowledged "
                f"{self.acknowledged}, delivered {self.delivered} "
                f"(deliveries {self.deliveries}, again {self.deliveries - self.delivered}), "
                f"lost {self.acknowledged - self.delivered}, member commits {self.commits}, "
                f"admin samples {self.samples}; violations: {found}")


@dataclass(slots=True)
class Report:
    t0: float
    groups: list[GroupReport]

    @property
    def violations(self) -> list[Violation]:
        return [v for g in self.groups for v in g.violations]

    @property
    def ok(self) -> bool:
        return not self.violations

    def render(self, limit: int = 60) -> str:
        lines = []
        for g in self.groups:
            lines.append(g.summary())
            shown = sorted(g.violations, key=lambda v: (v.start, v.check))
            lines += [f"  {v.render(self.t0)}" for v in shown[:limit]]
            if len(shown) > limit:
                lines.append(f"  ... {len(shown) - limit} more")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- intervals


def _merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _subtract(intervals: Iterable[tuple[float, float]],
              holes: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    holes = _merge(holes)
    out: list[tuple[float, float]] = []
    for a, b in _merge(intervals):
        cursor = a
        for h0, h1 in holes:
            if h1 <= cursor or h0 >= b:
                continue
            if h0 > cursor:
                out.append((cursor, h0))
            cursor = max(cursor, h1)
        if cursor < b:
            out.append((cursor, b))
    return out


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]
               ) -> list[tuple[float, float]]:
    out = []
    for a0, a1 in a:
        for b0, b1 in b:
            lo, hi = max(a0, b0), min(a1, b1)
            if lo < hi:
                out.append((lo, hi))
    return _merge(out)


def _measure(start: float, end: float, holes: list[tuple[float, float]]) -> float:
    """Length of ``[start, end]`` outside ``holes`` (merged)."""
    return sum(b - a for a, b in _subtract([(start, end)], holes))


# ----------------------------------------------------------------------------- the checks


@dataclass(slots=True)
class _Span:
    """One ownership of one partition by one member, as the member's log tells it."""

    member: str
    partition: int
    start: float
    end: float | None = None
    how: str = ""
    deliveries: list[tuple[float, int]] = field(default_factory=list)


class _Acks:
    """Per partition: acknowledged offsets with the earliest acknowledgement of any
    offset at or above each (when lag above an offset first existed)."""

    def __init__(self, acks: Iterable[Ack]) -> None:
        by_partition: dict[int, list[Ack]] = defaultdict(list)
        for ack in acks:
            by_partition[ack.partition].append(ack)
        self.offsets: dict[int, list[int]] = {}
        self.suffix_min: dict[int, list[float]] = {}
        self.by_offset: dict[tuple[int, int], Ack] = {}
        for p, items in by_partition.items():
            items.sort(key=lambda a: a.offset)
            self.offsets[p] = [a.offset for a in items]
            mins, low = [0.0] * len(items), INF
            for i in range(len(items) - 1, -1, -1):
                low = min(low, items[i].at)
                mins[i] = low
            self.suffix_min[p] = mins
            for a in items:
                self.by_offset[(p, a.offset)] = a

    def lag_since(self, partition: int, offset: int) -> float:
        """When a record at ``offset`` or above was first acknowledged (inf: never)."""
        offsets = self.offsets.get(partition, [])
        i = bisect.bisect_left(offsets, offset)
        return self.suffix_min[partition][i] if i < len(offsets) else INF

    def waiting(self, partition: int, offset: int, at: float) -> int:
        """Acknowledged records at or above ``offset`` by time ``at``."""
        offsets = self.offsets.get(partition, [])
        i = bisect.bisect_left(offsets, offset)
        return sum(1 for o in offsets[i:] if self.by_offset[(partition, o)].at <= at)


def _ranges(offsets: list[int]) -> Iterator[tuple[int, int]]:
    """Runs of consecutive numbers: [1, 2, 3, 7] -> (1, 3), (7, 7)."""
    start = prev = None
    for o in offsets:
        if prev is not None and o == prev + 1:
            prev = o
            continue
        if start is not None and prev is not None:
            yield start, prev
        start = prev = o
    if start is not None and prev is not None:
        yield start, prev


def _spans(member: MemberRun, report: GroupReport) -> list[_Span]:
    """Ownership spans from the member's log, with ORDER and UNOWNED found on the way."""
    spans: list[_Span] = []
    owned: dict[int, _Span] = {}
    for event in member.events:
        ev, t = event.get("ev"), float(event.get("t", 0.0))
        if ev == "assign":
            for p in event["ps"]:
                if p not in owned:
                    owned[p] = _Span(member.name, p, t)
                    spans.append(owned[p])
        elif ev in ("revoke", "lost"):
            for p in event["ps"]:
                span = owned.pop(p, None)
                if span is not None:
                    span.end, span.how = t, ev
        elif ev == "recv":
            for p, o, _value in event["r"]:
                span = owned.get(p)
                if span is None:
                    report.violations.append(Violation(
                        "UNOWNED", member.group, p, member.name, t, t,
                        f"offset {o} delivered while the member did not own the partition"))
                    continue
                if span.deliveries:
                    last_t, last = span.deliveries[-1]
                    if o <= last:
                        report.violations.append(Violation(
                            "ORDER", member.group, p, member.name, last_t, t,
                            f"offset {o} delivered after offset {last} (went back)"))
                    elif o != last + 1:
                        report.violations.append(Violation(
                            "ORDER", member.group, p, member.name, last_t, t,
                            f"offset {o} delivered after offset {last} (skipped "
                            f"{last + 1}..{o - 1})"))
                span.deliveries.append((t, o))
    return spans


def _check_delivered(group: str, history: History, members: list[MemberRun],
                     spans: list[_Span], acks: _Acks, report: GroupReport) -> None:
    delivered: dict[tuple[int, int], str | None] = {}
    for member in members:
        for event in member.events:
            if event.get("ev") != "recv":
                continue
            t = float(event["t"])
            for p, o, value in event["r"]:
                report.deliveries += 1
                delivered.setdefault((p, o), value)
                ack = acks.by_offset.get((p, o))
                if ack is not None and value != ack.value:
                    report.violations.append(Violation(
                        "WRONG", group, p, member.name, t, t,
                        f"offset {o} delivered as {value!r}, acknowledged as {ack.value!r}"))
                elif ack is None and history.sent.get(value or "") != p:
                    report.violations.append(Violation(
                        "UNEXPECTED", group, p, member.name, t, t,
                        f"offset {o} delivered as {value!r}, which no producer sent to "
                        f"partition {p}"))
    missing: dict[int, list[int]] = defaultdict(list)
    for ack in history.acks:
        report.acknowledged += 1
        if (ack.partition, ack.offset) in delivered:
            report.delivered += 1
        else:
            missing[ack.partition].append(ack.offset)
    for p, offsets in sorted(missing.items()):
        for first, last in _ranges(sorted(offsets)):
            times = [acks.by_offset[(p, o)].at for o in range(first, last + 1)
                     if (p, o) in acks.by_offset]
            owners = sorted({s.member for s in spans if s.partition == p and s.end is None})
            before = max((o for (q, o) in delivered if q == p and o < first), default=None)
            report.violations.append(Violation(
                "LOST", group, p, None, min(times), max(times),
                f"acknowledged offsets {first}..{last} ({len(times)} records) never "
                f"delivered; highest offset delivered below them: {before}; owned at the "
                f"end by: {', '.join(owners) or 'nobody'}"))


def _check_commits(group: str, history: History, members: list[MemberRun],
                   report: GroupReport) -> None:
    points: dict[int, list[tuple[float, float, int, str]]] = defaultdict(list)
    for sample in history.samples:
        if sample.group == group:
            report.samples += 1
            for p, o in sample.offsets.items():
                points[p].append((sample.sent, sample.done, o, sample.source))
    for member in members:
        for event in member.events:
            if event.get("ev") == "commit" and event.get("ps"):
                report.commits += event.get("err") is None
                for p, o in event["ps"].items():
                    points[int(p)].append((float(event["s"]), float(event["t"]), int(o),
                                           f"{event.get('kind')} commit by {member.name}"))
    for p, items in sorted(points.items()):
        by_done = sorted(items, key=lambda i: i[1])
        best: tuple[float, float, int, str] | None = None
        k = 0
        reported = 0
        for item in sorted(items, key=lambda i: i[0]):
            sent, done, offset, source = item
            while k < len(by_done) and by_done[k][1] < sent:
                if best is None or by_done[k][2] > best[2]:
                    best = by_done[k]
                k += 1
            if best is not None and offset < best[2] and reported < 5:
                reported += 1
                report.violations.append(Violation(
                    "COMMIT-BACKWARDS", group, p, None, best[1], done,
                    f"committed offset {offset} ({source}, sent "
                    f"+{sent - history.t0:.1f}s) after {best[2]} ({best[3]}, answered "
                    f"+{best[1] - history.t0:.1f}s)"))


def _check_stalls(group: str, history: History, members: list[MemberRun],
                  spans_of: dict[str, list[_Span]], acks: _Acks, report: GroupReport) -> None:
    limit, holes = history.limit_s, _merge(history.disturbed)
    # The group's deliveries per partition in time order, with running maxima: the
    # committed offset at any time is at most one above what the group delivered before.
    progress: dict[int, tuple[list[float], list[int]]] = {}
    raw: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for spans in spans_of.values():
        for span in spans:
            raw[span.partition] += span.deliveries
    for p, items in raw.items():
        items.sort()
        maxima, top = [], -1
        for _t, o in items:
            top = max(top, o)
            maxima.append(top)
        progress[p] = ([t for t, _ in items], maxima)

    def delivered_before(p: int, at: float) -> int:
        times, maxima = progress.get(p, ([], []))
        i = bisect.bisect_left(times, at)
        return maxima[i - 1] if i else -1

    def gap(member: str | None, p: int, start: float, end: float, last: int, check: str,
            what: str) -> None:
        waiting_from = max(start, acks.lag_since(p, last + 1))
        if waiting_from >= end:
            return
        idle = _measure(waiting_from, end, holes)
        if idle > limit:
            report.violations.append(Violation(
                check, group, p, member, waiting_from, end,
                f"{what} for {idle:.1f}s (limit {limit:.1f}s) while "
                f"{acks.waiting(p, last + 1, end)} acknowledged records above offset "
                f"{last} waited"))

    owned_live: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for member in members:
        live = member.live(history.end)
        for span in spans_of[member.name]:
            windows = _intersect([(span.start, span.end if span.end is not None
                                   else history.end)], live)
            owned_live[span.partition] += windows
            for ws, we in windows:
                before = [o for t, o in span.deliveries if t < ws]
                last = max(before) if before else delivered_before(span.partition,
                                                                   span.start)
                cursor = ws
                for t, o in span.deliveries:
                    if t < ws or t > we:
                        continue
                    gap(member.name, span.partition, cursor, t, last, "STALL",
                        "owned by this live member and not delivered")
                    last, cursor = max(last, o), t
                gap(member.name, span.partition, cursor, we, last, "STALL",
                    "owned by this live member and not delivered")
    formed = min((s.start for spans in spans_of.values() for s in spans), default=None)
    if formed is None:
        return
    for p in range(history.partitions):
        for os_, oe in _subtract([(formed, history.end)], owned_live[p]):
            gap(None, p, os_, oe, delivered_before(p, oe), "ORPHAN",
                "owned by no live member")


def _check_zombie_commits(group: str, history: History, members: list[MemberRun],
                          report: GroupReport) -> None:
    """ZOMBIE-COMMIT: a commit accepted from a member that had left for not polling."""
    interval = history.max_poll_interval_s
    if interval is None:
        return
    for member in members:
        for left, back in member.busy:
            gone_from = left + interval + 1.0
            for event in member.events:
                if event.get("ev") != "commit" or event.get("err") is not None or \
                        not event.get("ps"):
                    continue
                sent = float(event["s"])
                if gone_from <= sent <= back:
                    report.violations.append(Violation(
                        "ZOMBIE-COMMIT", group, None, member.name, left, sent,
                        f"{event.get('kind')} commit {event['ps']} sent "
                        f"{sent - left:.1f}s after its application last polled (max poll "
                        f"interval {interval:.1f}s: it had left the group) was accepted"))


def _check_exits(group: str, history: History, members: list[MemberRun],
                 report: GroupReport) -> None:
    for member in members:
        errors = [e for e in member.events if e.get("ev") == "error"]
        for e in errors:
            text = str(e.get("text", "")).strip().splitlines()
            report.violations.append(Violation(
                "EXIT", group, None, member.name, float(e["t"]), float(e["t"]),
                f"the member failed: {text[-1] if text else '?'}"))
        at = member.ended if member.ended is not None else history.end
        if member.end_kind == "exit" and not errors:
            report.violations.append(Violation(
                "EXIT", group, None, member.name, at, at,
                f"the process exited by itself with status {member.exit_code}"))
        elif member.end_kind == "stop" and member.exit_code not in (0, None) and not errors:
            report.violations.append(Violation(
                "EXIT", group, None, member.name, at, at,
                f"asked to leave (SIGTERM), the process ended with status "
                f"{member.exit_code} (a negative status: killed after it did not exit)"))


def check(history: History) -> Report:
    """Judge a history (see the module docstring); never raises on bad behaviour."""
    acks = _Acks(history.acks)
    report = Report(history.t0, [])
    for group in history.groups:
        members = [m for m in history.members.values() if m.group == group]
        g = GroupReport(group, members=len(members))
        spans_of = {m.name: _spans(m, g) for m in members}
        spans = [s for ss in spans_of.values() for s in ss]
        _check_delivered(group, history, members, spans, acks, g)
        _check_commits(group, history, members, g)
        _check_stalls(group, history, members, spans_of, acks, g)
        _check_zombie_commits(group, history, members, g)
        _check_exits(group, history, members, g)
        report.groups.append(g)
    return report


# ----------------------------------------------------------------------------- loading


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    """JSON lines; a torn last line (its writer was SIGKILLed mid-write) is skipped."""
    if not path.exists():
        return
    for line in path.read_text(errors="replace").splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value


def load(directory: Path) -> History:
    """Read a log directory (module docstring) into a ``History``."""
    harness = list(_lines(directory / "harness.jsonl"))
    meta = next(e for e in harness if e["ev"] == "meta")
    members: dict[str, MemberRun] = {}
    disturbed: list[tuple[float, float]] = []
    down: dict[int, float] = {}
    paused: dict[str, float] = {}
    end = max((float(e["t"]) for e in harness if "t" in e), default=float(meta["t0"]))
    for e in harness:
        ev, t = e["ev"], float(e.get("t", 0.0))
        if ev == "member-start":
            members[e["m"]] = MemberRun(e["m"], e["g"], t)
        elif ev in ("member-stop", "member-kill", "member-exit"):
            member = members[e["m"]]
            if member.ended is None:
                member.ended, member.end_kind = t, ev.removeprefix("member-")
            if ev == "member-exit":
                member.exit_code = e.get("code")
        elif ev == "member-pause":
            paused[e["m"]] = t
        elif ev == "member-resume" and e["m"] in paused:
            members[e["m"]].pauses.append((paused.pop(e["m"]), t))
        elif ev == "broker-kill":
            down.setdefault(int(e["broker"]), t)
        elif ev == "broker-healthy" and int(e["broker"]) in down:
            disturbed.append((down.pop(int(e["broker"])), t))
        elif ev == "end":
            end = t
    for name, since in paused.items():
        members[name].pauses.append((since, INF))
    disturbed += [(since, INF) for since in down.values()]
    for name, member in members.items():
        member.events = list(_lines(directory / "members" / f"{name}.jsonl"))
    acks, sent = [], {}
    for r in _lines(directory / "records.jsonl"):
        sent[r["v"]] = int(r["p"])
        if r.get("o") is not None:
            acks.append(Ack(int(r["p"]), int(r["o"]), float(r["t"]), r["v"]))
    samples = [OffsetSample(s["g"], float(s["s"]), float(s["t"]),
                            {int(p): int(o) for p, o in s["offsets"].items()})
               for s in _lines(directory / "samples.jsonl")]
    max_poll = meta.get("max_poll_interval_s")
    return History(meta["topic"], int(meta["partitions"]), float(meta["session_timeout_s"]),
                   float(meta["t0"]), end, acks, sent, members, samples, disturbed,
                   meta.get("seed"), None if max_poll is None else float(max_poll))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.support.group_checker LOG_DIR", file=sys.stderr)
        return 2
    report = check(load(Path(argv[0])))
    print(report.render())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
