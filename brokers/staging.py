"""Records staged by sink writers, waiting for their commit: one partition's staging area.

Why staging exists: a Spark micro-batch is written by many tasks on executors, but only
the driver knows when the whole batch succeeded (``commit(messages, batchId)``). So the
tasks *stage* their records on the partition leader (``StageRecords``), where no consumer
can see them, and the driver's commit (``CommitStaged``) appends exactly the staged files
its tasks reported, as one group, stamped with the sink's producer id and batch id. A
replayed commit (Spark re-runs a batch after a crash, or calls ``commit`` twice) finds
its batch id at or below the sink's last commit in the partition's producer state and
is discarded. docs/spark.md gives the whole protocol and its failure cases.

On-disk layout: ``<partition dir>/staging/<staging id>.stage``. A file is the
concatenation of whole record batches in the Strata format, exactly as one writer sent
them, chunk ``i`` being the ``i``-th batch (producer id -1 and no broker-only attribute
bits: the commit stamps those). One writer task attempt owns one staging id.

Invariants:
- A chunk is appended only if its ``chunk_sequence`` is the file's next one; a resend of
  the last chunks (lost response) is acknowledged without writing; a gap is refused.
- A commit names, per staging id, the chunk and record counts the writer saw
  acknowledged; a file that does not hold exactly those is ``STAGED_DATA_MISSING`` and
  nothing is appended, so a lost or partial file never commits silently.
- Staged files are deleted once committed, on abort, and after ``retention_ms`` without
  a commit (a writer whose driver died and never came back).

Recovery: on open every file is re-scanned with CRC checks; a torn tail (a crash during
a write) is cut back to the last whole batch. The commit's count check then refuses a
file that lost a chunk, and the Spark query re-runs the batch.

Durability: staged chunks are not fsynced (the commit check catches anything lost); the
commit's append follows the topic's flush policy like any produce.

Thread-safety: not thread-safe; the partition calls it from the broker's event loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from wire.errors import (
    CorruptRecordError,
    InvalidRecordBatchError,
    InvalidRequestError,
    OutOfOrderSequenceError,
    StagedDataMissingError,
)
from wire.record_batch import (
    BROKER_ONLY_ATTRIBUTE_BITS,
    NO_PRODUCER_ID,
    BatchHeader,
    iter_batches,
)

__all__ = ["STAGING_DIR", "StagedPart", "StagingArea", "valid_staging_id"]

log = logging.getLogger("strata.brokers.staging")

STAGING_DIR: Final = "staging"
STAGE_SUFFIX: Final = ".stage"
_STAGING_ID: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def valid_staging_id(staging_id: str) -> bool:
    return bool(_STAGING_ID.match(staging_id))


@dataclass(frozen=True, slots=True)
class StagedPart:
    """What a writer reports it staged under one id: the commit checks these counts."""

    staging_id: str
    chunks: int
    records: int


@dataclass(slots=True)
class _StagedFile:
    path: Path
    chunks: int = 0
    records: int = 0
    size: int = 0
    touched_ms: int = 0


class StagingArea:
    def __init__(self, partition_dir: Path, *, new: bool = False) -> None:
        """``new``: the partition's directory was just created (nothing to recover)."""
        self.directory = partition_dir / STAGING_DIR
        self._files: dict[str, _StagedFile] = {}
        if not new:
            self._recover()

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> None:
        if not self.directory.is_dir():
            return
        for path in sorted(self.directory.glob("*" + STAGE_SUFFIX)):
            staging_id = path.name[: -len(STAGE_SUFFIX)]
            if not valid_staging_id(staging_id):
                path.unlink(missing_ok=True)
                continue
            staged = _StagedFile(path, touched_ms=int(path.stat().st_mtime * 1000))
            data = path.read_bytes()
            good = 0
            try:
                for header, _ in iter_batches(data, allow_partial_tail=True):
                    staged.chunks += 1
                    staged.records += header.record_count
                    good += header.size
            except (CorruptRecordError, InvalidRecordBatchError) as err:
                log.warning("staged file %s is damaged after byte %d (%s); keeping the "
                            "whole batches before it", path, good, err)
            if good != len(data):
                os.truncate(path, good)
            staged.size = good
            self._files[staging_id] = staged

    # ------------------------------------------------------------------ writes
    def stage(self, staging_id: str, chunk_sequence: int, batch: memoryview | bytes,
              header: BatchHeader) -> bool:
        """Append one validated chunk; return True if it was already staged (a resend).

        ``header`` is the chunk's header, already CRC-checked by the caller.
        """
        if not valid_staging_id(staging_id):
            raise InvalidRequestError(
                f"staging id {staging_id!r} is not valid: use 1-64 characters from "
                "[A-Za-z0-9_-]")
        if header.attributes & BROKER_ONLY_ATTRIBUTE_BITS or \
                header.producer_id != NO_PRODUCER_ID:
            raise InvalidRecordBatchError(
                "a staged batch must have producer id -1 and no transactional, control or "
                "commit-end attribute bits: the commit stamps those")
        staged = self._files.get(staging_id)
        next_chunk = staged.chunks if staged is not None else 0
        if chunk_sequence < next_chunk:
            return True
        if chunk_sequence > next_chunk:
            raise OutOfOrderSequenceError(
                f"staging id {staging_id}: chunk {chunk_sequence} arrived but chunk "
                f"{next_chunk} is next; a chunk was lost, re-run the task")
        if staged is None:
            self.directory.mkdir(exist_ok=True)
            staged = _StagedFile(self.directory / (staging_id + STAGE_SUFFIX))
            self._files[staging_id] = staged
        try:
            with open(staged.path, "ab") as f:
                f.write(batch)
        except OSError:
            # A write that failed part-way (ENOSPC) must not leave bytes a resend would
            # be appended after: cut the file back to its last whole chunk.
            with contextlib.suppress(OSError):
                os.truncate(staged.path, staged.size)
            raise
        staged.chunks += 1
        staged.records += header.record_count
        staged.size += len(batch)
        staged.touched_ms = _now_ms()
        return False

    # ------------------------------------------------------------------ commit
    def collect(self, parts: Iterable[StagedPart]) -> list[memoryview]:
        """The staged batches of ``parts``, in order, after checking every count.

        Raises ``StagedDataMissingError`` (nothing is returned) if any file is missing or
        holds a different number of chunks or records than its writer reported. Every
        batch is CRC-checked again: damage at rest must not get a fresh CRC when stamped.
        """
        found: list[tuple[StagedPart, _StagedFile]] = []
        for part in parts:
            staged = self._files.get(part.staging_id)
            if staged is None or staged.chunks != part.chunks or \
                    staged.records != part.records:
                have = "nothing" if staged is None else \
                    f"{staged.chunks} chunk(s) with {staged.records} record(s)"
                raise StagedDataMissingError(
                    f"staging id {part.staging_id}: the writer staged {part.chunks} chunk(s) "
                    f"with {part.records} record(s) but this broker holds {have} (lost in a "
                    "broker crash, aborted or expired); nothing was committed, re-run the "
                    "batch (a Spark query does so when restarted from its checkpoint)")
            found.append((part, staged))
        batches: list[memoryview] = []
        for part, staged in found:
            # One writable buffer per file; the batches are slices of it that the commit
            # stamps and appends in place (no copy per batch).
            data = bytearray(staged.size)
            with open(staged.path, "rb") as f:
                size = f.readinto(data)
            chunk = 0
            try:
                for _, view in iter_batches(memoryview(data)[:size], allow_partial_tail=False):
                    batches.append(view)
                    chunk += 1
            except (CorruptRecordError, InvalidRecordBatchError) as err:
                raise StagedDataMissingError(
                    f"staging id {part.staging_id}: the staged file {staged.path} is damaged "
                    f"({err.message}); nothing was committed, re-run the batch") from None
            if chunk != part.chunks:  # the file changed under us: never commit a guess
                raise StagedDataMissingError(
                    f"staging id {part.staging_id}: file holds {chunk} chunk(s), expected "
                    f"{part.chunks}; re-run the batch")
        return batches

    def discard(self, staging_ids: Iterable[str]) -> int:
        """Delete staged files (committed, aborted or replayed); return how many existed."""
        removed = 0
        for staging_id in staging_ids:
            staged = self._files.pop(staging_id, None)
            if staged is not None:
                staged.path.unlink(missing_ok=True)
                removed += 1
        return removed

    def expire(self, now_ms: int, retention_ms: int) -> int:
        """Delete files untouched for ``retention_ms``; return how many."""
        old = [sid for sid, f in self._files.items() if f.touched_ms < now_ms - retention_ms]
        for staging_id in old:
            log.info("staged file %s expired without a commit", self._files[staging_id].path)
        return self.discard(old)

    def __len__(self) -> int:
        return len(self._files)

    def staged_bytes(self) -> int:
        return sum(f.size for f in self._files.values())


def _now_ms() -> int:
    return int(time.time() * 1000)
