"""The transaction checker (issue [3.3] section 4): a pure function over what was written
and what was read, in the manner of Jepsen's Kafka and Bufstream analyses.

Writers run transactions; every record they write carries, in its value, the writer,
the transaction's number (per writer, counting up), the record's partition and index
within that partition's part of the transaction, and the transaction's *manifest* (how
many records it writes to each partition). So the checker proves all-or-nothing from
reads alone: a transaction read in part is torn whatever the writer believed.

Each writer also reports what it saw of each transaction: ``committed`` (
``commit_transaction`` returned), ``aborted`` (``abort_transaction`` returned, or the
transaction failed before its commit was sent) or ``unknown`` (the commit was sent and
its answer lost: a timeout, a crash, a fence during the commit; either outcome is
allowed, but only one, whole).

Reads: ``final`` reads are read_committed reads of every partition from the start to the
end after the writers stopped; ``live`` reads come from read_committed consumers that
polled while the writers ran, each partition read once, in order, never seeking back.

Checks, per transaction and per partition:

ABORTED-READ
    no record of a transaction its writer saw aborted is read (at read_committed), in
    final or live reads;
LOST-WRITE
    every record of a transaction its writer saw committed is in the final reads;
TORN
    a transaction is read whole or not at all: in the final reads, each transaction has
    every record of its manifest, in every partition of it, or none at all (this also
    decides an ``unknown`` transaction: all means committed, none aborted);
DUPLICATE
    no record (writer, transaction, partition, index) is read twice by one reader, and no
    offset holds two different records;
ORDER
    per partition, a writer's records appear in the order it wrote them: by transaction,
    then index (transactions of one writer are sequential);
LIVE
    a live read_committed reader, which never seeks back, delivers per partition exactly
    the committed records of that partition, in offset order, with no gap: a reader
    served past the first offset of a transaction that was still open (past the last
    stable offset) skips that transaction's records for good once it commits, and one
    served an aborted record fails ABORTED-READ;
FOREIGN
    a read value that no writer wrote (a corrupt or made-up record).

``check`` never raises on a bad history; ``Report.render`` names every violation with
its writer, transaction, partition and offsets.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["Outcome", "Read", "Record", "Report", "Txn", "TxnHistory", "Violation", "check",
           "decode_value", "encode_value", "exactly_once", "load"]

Outcome = Literal["committed", "aborted", "unknown"]
_OUTCOMES = ("committed", "aborted", "unknown")


# ----------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True, order=True)
class Record:
    """What one written record says about itself."""

    writer: str
    txn: int
    partition: int
    index: int
    manifest: tuple[tuple[int, int], ...]  # ((partition, records), ...), sorted


def encode_value(writer: str, txn: int, partition: int, index: int,
                 manifest: Mapping[int, int]) -> bytes:
    """``w|txn|partition|index|p:n,p:n``: a writer name must not contain ``|``."""
    if "|" in writer:
        raise ValueError(f"writer name {writer!r} must not contain '|'")
    parts = ",".join(f"{p}:{n}" for p, n in sorted(manifest.items()))
    return f"{writer}|{txn}|{partition}|{index}|{parts}".encode()


def decode_value(value: bytes | str | None) -> Record | None:
    """The record a value describes, or None for a value no writer could have written."""
    if value is None:
        return None
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    try:
        writer, txn, partition, index, parts = text.split("|")
        manifest = tuple(sorted((int(p), int(n)) for p, n in
                                (item.split(":") for item in parts.split(",") if item)))
        return Record(writer, int(txn), int(partition), int(index), manifest)
    except ValueError:
        return None


# ----------------------------------------------------------------------------- input


@dataclass(frozen=True, slots=True)
class Txn:
    """One transaction as its writer saw it."""

    writer: str
    txn: int
    manifest: tuple[tuple[int, int], ...]
    outcome: Outcome
    started: float = 0.0
    ended: float = 0.0


@dataclass(frozen=True, slots=True)
class Read:
    """One record a reader returned: ``reader`` names the consumer (a live reader's reads
    are in the order it returned them)."""

    reader: str
    partition: int
    offset: int
    value: str | None
    at: float = 0.0


@dataclass(slots=True)
class TxnHistory:
    txns: list[Txn]
    final: list[Read]
    live: list[Read] = field(default_factory=list)
    #: Partitions the workload wrote (a partition missing from the reads is then empty).
    partitions: int = 0


# ----------------------------------------------------------------------------- output


@dataclass(frozen=True, slots=True)
class Violation:
    check: str
    detail: str
    writer: str | None = None
    txn: int | None = None
    partition: int | None = None

    def render(self) -> str:
        where = " ".join(f"{k} {v}" for k, v in (("writer", self.writer), ("txn", self.txn),
                                                   ("partition", self.partition))
                         if v is not None)
        return f"{self.check}: {where + ': ' if where else ''}{self.detail}"


@dataclass(slots=True)
class Report:
    violations: list[Violation] = field(default_factory=list)
    txns: int = 0
    committed: int = 0  # seen committed by the writer
    aborted: int = 0
    unknown: int = 0
    unknown_committed: int = 0  # unknown transactions the reads show whole
    records_read: int = 0
    live_reads: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def checks(self) -> list[str]:
        return sorted({v.check for v in self.violations})

    def summary(self) -> str:
        counts: dict[str, int] = defaultdict(int)
        for v in self.violations:
            counts[v.check] += 1
        found = ", ".join(f"{k}={n}" for k, n in sorted(counts.items())) or "none"
        return (f"{self.txns} transactions: {self.committed} committed, {self.aborted} "
                f"aborted, {self.unknown} unknown ({self.unknown_committed} of them read "
                f"as committed); {self.records_read} records in the final reads, "
                f"{self.live_reads} live reads; violations: {found}")

    def render(self, limit: int = 60) -> str:
        lines = [self.summary()]
        lines += [f"  {v.render()}" for v in self.violations[:limit]]
        if len(self.violations) > limit:
            lines.append(f"  ... {len(self.violations) - limit} more")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- checks


def _runs(numbers: Iterable[int]) -> str:
    """[1, 2, 3, 7] -> '1..3, 7'."""
    out: list[str] = []
    start = prev = None
    for n in sorted(numbers):
        if prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            out.append(f"{start}" if start == prev else f"{start}..{prev}")
        start = prev = n
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}..{prev}")
    return ", ".join(out)


def _expected(txn: Txn) -> set[tuple[int, int]]:
    """(partition, index) of every record of the transaction."""
    return {(p, i) for p, n in txn.manifest for i in range(n)}


def check(history: TxnHistory) -> Report:
    """Judge a history (see the module docstring); never raises on bad behaviour."""
    report = Report(txns=len(history.txns))
    txns: dict[tuple[str, int], Txn] = {}
    for txn in history.txns:
        txns[(txn.writer, txn.txn)] = txn
        if txn.outcome == "committed":
            report.committed += 1
        elif txn.outcome == "aborted":
            report.aborted += 1
        else:
            report.unknown += 1

    # Final reads: what each transaction left, per reader (normally one).
    seen: dict[tuple[str, int], set[tuple[int, int]]] = defaultdict(set)
    offsets_of: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    by_offset: dict[tuple[int, int], str | None] = {}
    per_reader: dict[str, set[Record]] = defaultdict(set)
    per_partition: dict[int, list[tuple[int, Record]]] = defaultdict(list)
    for read in history.final:
        report.records_read += 1
        earlier = by_offset.setdefault((read.partition, read.offset), read.value)
        if earlier != read.value:
            report.violations.append(Violation(
                "DUPLICATE", f"offset {read.offset} read as {earlier!r} and as "
                f"{read.value!r}", partition=read.partition))
        record = decode_value(read.value)
        if record is None or (record.writer, record.txn) not in txns or \
                record.partition != read.partition:
            report.violations.append(Violation(
                "FOREIGN", f"offset {read.offset} holds {read.value!r}, which no writer "
                "wrote to this partition", partition=read.partition))
            continue
        if record in per_reader[read.reader]:
            report.violations.append(Violation(
                "DUPLICATE", f"record {record.index} read twice by {read.reader} (again at "
                f"offset {read.offset})", record.writer, record.txn, read.partition))
            continue
        per_reader[read.reader].add(record)
        key = (record.writer, record.txn)
        seen[key].add((record.partition, record.index))
        offsets_of[key].append((read.partition, read.offset))
        per_partition[read.partition].append((read.offset, record))

    for key, txn in sorted(txns.items()):
        got = seen.get(key, set())
        want = _expected(txn)
        where = sorted(offsets_of.get(key, []))
        if got and txn.outcome == "aborted":
            report.violations.append(Violation(
                "ABORTED-READ", f"{len(got)} record(s) of a transaction its writer saw "
                f"aborted were read at read_committed, at {_offsets(where)}",
                txn.writer, txn.txn))
        if got and got != want:
            missing = want - got
            by_partition: dict[int, list[int]] = defaultdict(list)
            for p, i in missing:
                by_partition[p].append(i)
            report.violations.append(Violation(
                "TORN", f"read in part: {len(got)} of {len(want)} records "
                f"(read at {_offsets(where)}; missing "
                + "; ".join(f"partition {p} index {_runs(ix)}"
                            for p, ix in sorted(by_partition.items())) + ")",
                txn.writer, txn.txn))
        if txn.outcome == "committed" and not got:
            report.violations.append(Violation(
                "LOST-WRITE", f"committed (its writer saw commit_transaction return) but "
                f"none of its {len(want)} records were read", txn.writer, txn.txn))
        if txn.outcome == "unknown" and got == want:
            report.unknown_committed += 1

    # Order: per partition, each writer's records in (txn, index) order by offset.
    for p, items in sorted(per_partition.items()):
        items.sort()
        last: dict[str, tuple[int, Record]] = {}
        for offset, record in items:
            before = last.get(record.writer)
            if before is not None and (record.txn, record.index) < \
                    (before[1].txn, before[1].index):
                report.violations.append(Violation(
                    "ORDER", f"txn {record.txn} index {record.index} at offset {offset} "
                    f"follows txn {before[1].txn} index {before[1].index} at offset "
                    f"{before[0]}", record.writer, record.txn, p))
            last[record.writer] = (offset, record)

    _check_live(history, txns, report)
    return report


def _offsets(where: list[tuple[int, int]]) -> str:
    by_partition: dict[int, list[int]] = defaultdict(list)
    for p, o in where:
        by_partition[p].append(o)
    return "; ".join(f"partition {p} offsets {_runs(os)}" for p, os in sorted(by_partition.items()))


def _check_live(history: TxnHistory, txns: Mapping[tuple[str, int], Txn],
                report: Report) -> None:
    """LIVE (and ABORTED-READ for live readers): each live reader's deliveries of a
    partition are exactly the committed records the final reads hold there, in order."""
    committed: dict[int, list[tuple[int, str | None]]] = defaultdict(list)
    final_values: dict[tuple[int, int], str | None] = {}
    for read in history.final:
        final_values[(read.partition, read.offset)] = read.value
    for (p, o), value in sorted(final_values.items()):
        committed[p].append((o, value))
    streams: dict[tuple[str, int], list[Read]] = defaultdict(list)
    for read in history.live:
        report.live_reads += 1
        streams[(read.reader, read.partition)].append(read)
    for (reader, p), reads in sorted(streams.items()):
        expected = committed.get(p, [])
        # The reader may have stopped early: compare against the prefix up to its last
        # offset; it must not skip or add anything on the way.
        last_offset = reads[-1].offset
        want = [(o, v) for o, v in expected if o <= last_offset]
        got = [(r.offset, r.value) for r in reads]
        for r in reads:
            record = decode_value(r.value)
            if record is not None and txns.get((record.writer, record.txn)) is not None and \
                    txns[(record.writer, record.txn)].outcome == "aborted":
                report.violations.append(Violation(
                    "ABORTED-READ", f"live reader {reader} returned offset {r.offset} of a "
                    "transaction its writer saw aborted", record.writer, record.txn, p))
        if got == want:
            continue
        got_set, want_set = set(got), set(want)
        skipped = sorted(o for o, _ in want_set - got_set)
        extra = sorted(o for o, _ in got_set - want_set)
        order = [o for o, _ in got] != sorted({o for o, _ in got})
        parts = []
        if skipped:
            parts.append(f"skipped committed offsets {_runs(skipped)}")
        if extra:
            parts.append(f"returned offsets {_runs(extra)} that the final read_committed "
                         "read does not hold")
        if order:
            parts.append("went back or repeated offsets")
        report.violations.append(Violation(
            "LIVE", f"live reader {reader}: " + "; ".join(parts or ["differs"]),
            partition=p))


def exactly_once(inputs: Iterable[bytes], outputs: Iterable[bytes | None]) -> list[Violation]:
    """A consume-transform-produce job's output (read at read_committed) against its
    input: each input value's upper-cased transform exactly once (the ctp job of
    tests/support/ctp_job.py). LOST-WRITE: an input with no output; DUPLICATE: an
    output twice or more; FOREIGN: an output no input explains."""
    want = {value.upper() for value in inputs}
    counts: dict[bytes | None, int] = defaultdict(int)
    for value in outputs:
        counts[value] += 1
    out: list[Violation] = []
    missing = sorted(want - set(counts))
    if missing:
        out.append(Violation("LOST-WRITE", f"{len(missing)} input record(s) have no output, "
                             f"e.g. {missing[:5]}"))
    twice = sorted((v, n) for v, n in counts.items() if n > 1 and v in want)
    if twice:
        out.append(Violation("DUPLICATE", f"{len(twice)} output(s) written more than once, "
                             f"e.g. {twice[:5]}"))
    foreign = sorted(repr(v) for v in counts if v not in want)
    if foreign:
        out.append(Violation("FOREIGN", f"{len(foreign)} output(s) no input explains, e.g. "
                             f"{foreign[:5]}"))
    return out


# ----------------------------------------------------------------------------- files


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


def load(directory: Path) -> TxnHistory:
    """A history from a directory: ``txns*.jsonl`` (writers: writer, txn, manifest
    {partition: count}, outcome, started, ended; a later line for the same transaction
    replaces an earlier one, so a writer logs ``unknown`` before the commit and the
    outcome after), ``final.jsonl`` and ``live*.jsonl`` (reader, p, o, v, t)."""
    txns: dict[tuple[str, int], Txn] = {}
    for path in sorted(directory.glob("txns*.jsonl")):
        for t in _lines(path):
            outcome = t.get("outcome")
            if outcome not in _OUTCOMES:
                continue
            manifest = tuple(sorted((int(p), int(n)) for p, n in t["manifest"].items()))
            txns[(t["writer"], int(t["txn"]))] = Txn(
                t["writer"], int(t["txn"]), manifest, outcome,
                float(t.get("started", 0.0)), float(t.get("ended", 0.0)))
    final = [Read(r["reader"], int(r["p"]), int(r["o"]), r.get("v"), float(r.get("t", 0)))
             for r in _lines(directory / "final.jsonl")]
    live = [Read(r["reader"], int(r["p"]), int(r["o"]), r.get("v"), float(r.get("t", 0)))
            for path in sorted(directory.glob("live*.jsonl")) for r in _lines(path)]
    return TxnHistory(list(txns.values()), final, live)


def main(argv: list[str]) -> int:
    import sys

    if len(argv) != 1:
        print("usage: python -m tests.support.txn_checker LOG_DIR", file=sys.stderr)
        return 2
    report = check(load(Path(argv[0])))
    print(report.render())
    return 0 if report.ok else 1


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
