"""The producer's record accumulator: records waiting, per partition, to be sent.

Job: take records from ``send`` / ``produce`` / ``send_batch`` (type checks and the
``batch_size`` estimate, partitioning: Kafka's murmur2 of the key, sticky partitioning
for null keys), append them to their partition's *open batch* (plain Python lists; the
sender encodes a batch once, when it first sends it), close batches at ``batch_size`` or
after ``linger_ms``, account ``buffer_memory`` and make callers wait (or raise
``BufferFullError``) while it is full, and tell the sender which partitions can send now
(``ready``). It never does I/O and never completes a delivery future.

The per-record hot path (``add``): a bare value for a topic whose sticky batch has room
is one lock, one subtraction and two list appends. Open batches reserve
``buffer_memory`` in ``RESERVATION_STEP`` steps (Kafka's buffer pool hands out whole
batch buffers the same way), so that common append checks only its batch's ``room``;
everything else (keys, headers, a partition, a timestamp, a full batch) takes ``_add``.

Invariants:

- Per partition (``PartitionQueue``): at most one open batch, filling, and a FIFO
  ``queue`` of closed ones; ``queue[0]`` is the next (or the in-flight) batch, and a batch
  leaves the queue only through ``release``, once, when it is finished for good. Records
  of a partition therefore go out in the order they were appended.
- ``buffered`` is the reservations of the open batches plus the size estimate of every
  closed batch not released yet; an append that would pass ``buffer_memory`` first
  closes the batch it would join (so it goes out now) and then waits (one ``send_batch``
  chunk larger than the whole buffer is let into an empty buffer). Closing a batch
  (``seal``) gives its unused reservation back.
- A closed batch is never appended to again; a batch holds at most
  ``MAX_RECORDS_PER_BATCH`` records (a reservation never exceeds what that many records
  of ``RECORD_OVERHEAD`` bytes could use, so the room check also bounds the count).
- ``_sticky_queues`` / ``_sticky_batches`` name a topic's sticky queue and its open batch
  only while that batch is open: whatever detaches an open batch drops them.

Thread-safety: ``lock`` guards the open batches and queues, ``buffered`` and the sticky
partitioner, because the blocking face appends from caller threads; the sender reads and
releases on the event loop. ``partitions`` only ever grows (under the lock), so one
lookup by key is safe without it. Waiting for space is a condition wait in caller
threads and a future on the loop; the loop thread itself never blocks (``send`` from a
delivery callback raises ``BufferFullError`` instead). ``Wakeup`` is how appends wake the
sender from any thread. ``send_batch``'s queueing is one coroutine for both faces
(``_append_chunks``): the blocking face runs it in the caller's thread, where its waits
block instead of suspending (``_run_blocking``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from array import array
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from functools import partial
from time import time_ns
from typing import Any, Final, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from strata.client._config import ProducerConfig
from strata.client._delivery import (
    AnyFuture,
    BufferFullError,
    DeliveryCallback,
    DeliveryFuture,
    ProducerClosedError,
    SendBatchGroup,
    resolve,
)
from strata.client._schemas import TypedValue, typed_column
from wire.errors import RecordTooLargeError, StrataError
from wire.partitioner import (
    StickyPartitioner,
    key_partitions,
    partition_for_key,
    split_by_partition,
)
from wire.record_batch import (
    MAX_RECORDS_PER_BATCH,
    NO_SEQUENCE,
    PAYLOAD_SCHEMA,
    Compression,
    build_batch,
    encode_record_batch,
    int_scalar,
    typed_payload_schema,
)

_binary_column: Callable[[list[bytes | None]], tuple[bytes, bytes, bytes | None] | None] | None
_millis: Callable[[array[int]], tuple[bytes, int, int]] | None
try:  # built by `make setup` (strata/client/_fastproduce.c); else pyarrow converts
    from strata.client._fastproduce import binary_column as _binary_column
    from strata.client._fastproduce import millis as _millis
except ImportError:
    _binary_column = _millis = None

__all__ = [
    "RECORD_OVERHEAD",
    "Accumulator",
    "Batch",
    "Header",
    "Headers",
    "Key",
    "PartitionQueue",
    "Value",
    "Wakeup",
]

#: Per-record bytes added to key/value/header lengths in the ``batch_size`` estimate.
RECORD_OVERHEAD: Final = 16
#: An open batch reserves ``buffer_memory`` in steps of this many bytes (at most
#: ``batch_size``), so a record's append checks only the batch's own ``room``.
RESERVATION_STEP: Final = 16 * 1024
#: Largest ``timestamp_ms`` a record may carry (the wire's int64, as in Kafka).
MAX_TIMESTAMP_MS: Final = (1 << 63) - 1
_HEADERS_TYPE: Final = PAYLOAD_SCHEMA.field("headers").type

Key: TypeAlias = bytes | bytearray | memoryview | str | None
Value: TypeAlias = bytes | bytearray | memoryview | str | TypedValue | None
Headers: TypeAlias = Sequence[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None
Header: TypeAlias = tuple[str, bytes | None]
#: ``send_batch`` input cut into ``(partition or None=sticky, payload, size, timestamp)``
#: chunks; ``timestamp`` (ms) is every row's (``send_batch`` gives all rows one).
Chunks: TypeAlias = list[tuple[int | None, pa.RecordBatch, int, int]]
#: Who hears a record's outcome: a future (``send``) or an ``on_delivery`` callback.
Watcher: TypeAlias = "AnyFuture | DeliveryCallback"
#: The futures a watcher can be (anything else is an ``on_delivery`` callback).
_FUTURE_TYPES: Final = (asyncio.Future, concurrent.futures.Future)  # (DeliveryFuture is one)


# --------------------------------------------------------------------------- records


def _as_bytes(value: Key, what: str) -> bytes | None:
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"record {what} must be bytes, str or None, not {type(value).__name__}; "
                    "serialize it first")


def _normalize_headers(headers: Headers) -> tuple[list[Header] | None, int]:
    if not headers:
        return None, 0
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: list[Header] = []
    size = 0
    for item in items:
        try:
            name, raw = item
        except (TypeError, ValueError):
            raise TypeError("headers must be (str, bytes) pairs or a {str: bytes} mapping") \
                from None
        if not isinstance(name, str):
            raise TypeError(f"header key {name!r} must be a str")
        value = _as_bytes(raw, f"header {name!r} value")
        out.append((name, value))
        size += len(name) + (len(value) if value is not None else 0)
    return out, size


def _column(values: Any, name: str) -> pa.Array:
    """A binary Arrow array from an Arrow array/chunked array or a list of bytes/str/None."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if type(values) is list:  # of bytes/None: the C helper's buffers (binary_array)
        values = binary_array(values)
    if not isinstance(values, pa.Array):
        try:
            values = pa.array(values, pa.binary())
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as err:
            raise TypeError(f"{name} must be bytes/str/None values: {err}") from None
    if values.type != pa.binary():
        try:
            values = values.cast(pa.binary())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise TypeError(f"{name} has Arrow type {values.type}; need binary or string") \
                from err
    return values


# --------------------------------------------------------------------------- batches


#: Batches of up to this many records take their timestamps through Python, not pyarrow.
_SMALL_BATCH: Final = 32


class Batch:
    """Records of one partition that travel together; immutable once closed.

    A per-record batch keeps plain lists: ``values`` and ``timestamps`` (nanoseconds
    since the epoch: the clock's own unit, divided into milliseconds once per batch by
    Arrow) for every record; ``keys`` and ``headers`` only once a record has one, and
    only as far as the last such record (``seal`` pads them with ``None``). ``watchers``
    holds ``(record index, future)`` for the records sent with ``send``; ``callbacks``
    is a sparse column like ``keys``: the ``on_delivery`` callback of each ``produce``
    record that has one (a plain list of references, so a record's callback allocates
    nothing the garbage collector must trace: a ``(index, callback)`` tuple per record
    cost about 0.5 us a record in collections). A ``produce`` record without a callback
    has neither, and its failure goes to the producer's failure ledger instead.

    ``size`` is what the batch holds of ``buffer_memory``: while it is open, a
    reservation that ``room`` counts down per record (so the common append is one
    subtraction, not a buffer check); once sealed, the size estimate of its records.
    """

    __slots__ = (
        "arrow",
        "arrow_more",
        "arrow_ms",
        "arrow_rows",
        "attempts",
        "base_sequence",
        "callbacks",
        "condition",
        "created",
        "deadline",
        "done_waiters",
        "encoded",
        "explicit_ms",
        "finished",
        "headers",
        "keys",
        "last_error",
        "members",
        "partition",
        "retry_at",
        "room",
        "size",
        "timestamps",
        "topic",
        "values",
        "watchers",
    )

    def __init__(self, topic: str, partition: int, now: float, delivery_timeout_s: float) -> None:
        self.topic = topic
        self.partition = partition
        self.created = now
        self.deadline = now + delivery_timeout_s
        self.values: list[bytes | TypedValue | None] = []
        self.timestamps = array("q")  # int64 ns; Arrow reads the buffer as it is
        # Timestamps given by the caller, in ms (sparse, like keys): any int64 ms fits
        # here, where the clock's nanoseconds would overflow past the year 2262.
        self.explicit_ms: list[int | None] | None = None
        self.keys: list[bytes | None] | None = None
        self.headers: list[list[Header] | None] | None = None
        self.watchers: list[tuple[int, AnyFuture]] | None = None
        self.callbacks: list[DeliveryCallback | None] | None = None
        self.condition: threading.Condition | None = None  # shared by DeliveryFutures
        # A send_batch chunk: its rows, the later chunks merged into it (``merge``), the
        # rows of all of them, and the smallest and largest of their timestamps (each
        # chunk's rows share one).
        self.arrow: pa.RecordBatch | None = None
        self.arrow_more: list[pa.RecordBatch] | None = None
        self.arrow_rows = 0
        self.arrow_ms = (0, 0)
        #: ``(group, index in its parts, first row here, rows)`` of each chunk in it.
        self.members: list[tuple[SendBatchGroup, int, int, int]] | None = None
        self.size = 0
        self.room = 0
        self.encoded: bytes | None = None
        self.base_sequence = NO_SEQUENCE
        self.attempts = 0
        self.retry_at = 0.0
        self.last_error: StrataError | None = None
        self.done_waiters: list[asyncio.Future[None]] = []
        self.finished = False

    @property
    def count(self) -> int:
        """Records in the batch."""
        return len(self.values) if self.arrow is None else self.arrow_rows

    def timestamp_ms(self, index: int) -> int:
        """The create time of record ``index``, in ms since the epoch."""
        explicit = self.explicit_ms
        if explicit is not None and index < len(explicit):
            given = explicit[index]
            if given is not None:
                return given
        return self.timestamps[index] // 1_000_000

    def seal(self) -> int:
        """Close the batch to appends: pad the sparse columns, hand back the unused
        reservation (returned: the bytes to free from the buffer)."""
        count = len(self.values)
        for column in (self.keys, self.headers, self.explicit_ms, self.callbacks):
            if column is not None:
                _pad(column, count)
        unused, self.room = self.room, 0
        self.size -= unused
        return unused

    def encode(self, compression: Compression, producer_id: int, producer_epoch: int,
               base_sequence: int, transactional: bool = False) -> bytes:
        if self.arrow is not None:
            rows = self.arrow if self.arrow_more is None \
                else pa.concat_batches([self.arrow, *self.arrow_more])
            return encode_record_batch(rows, compression=compression,
                                       producer_id=producer_id, producer_epoch=producer_epoch,
                                       base_sequence=base_sequence,
                                       transactional=transactional,
                                       timestamp_bounds=self.arrow_ms)
        bounds: tuple[int, int] | None = None
        stamps = self.timestamps
        if self.explicit_ms is None and _millis is not None:
            # The C helper: ms and their bounds in one pass over the int64 buffer.
            data, low, high = _millis(stamps)
            timestamps = pa.Array.from_buffers(pa.int64(), len(stamps),
                                               [None, pa.py_buffer(data)])
            bounds = (low, high)
        elif self.explicit_ms is None and len(stamps) <= _SMALL_BATCH:
            # A batch of a few records: Python's division and min/max cost less than
            # pyarrow's compute calls (a fixed ~20 us a batch, when each of 10,000 new
            # partitions gets one record).
            ms = [t // 1_000_000 for t in stamps]
            timestamps = pa.array(ms, pa.int64())
            bounds = (min(ms), max(ms))
        else:
            # The int64 buffer as an Arrow array, no copy (pa.array of the Python ints
            # cost 8x as much: 150 us for 4,500 records); ns to ms as a unit cast
            # (truncating), not a division: pyarrow imports pandas the first time it is
            # handed a Python scalar.
            timestamps = pa.Array.from_buffers(
                pa.timestamp("ns"), len(stamps), [None, pa.py_buffer(stamps)]).cast(
                pa.timestamp("ms"), safe=False).view(pa.int64())
        if self.explicit_ms is not None:  # the caller's own, where given
            timestamps = pc.coalesce(pa.array(self.explicit_ms, pa.int64()), timestamps)
        values: Any = self.values
        schema_id = None
        if type(values[0]) is TypedValue:  # a typed topic's records (send of a dict)
            schema_id, values = typed_column(values)
        else:
            values = binary_array(values)
        return build_batch(values, keys=None if self.keys is None else binary_array(self.keys),
                           timestamps=timestamps,
                           headers=self.headers, compression=compression,
                           producer_id=producer_id, producer_epoch=producer_epoch,
                           base_sequence=base_sequence, value_schema_id=schema_id,
                           transactional=transactional, timestamp_bounds=bounds)

    def merge(self, rows: pa.RecordBatch, size: int, timestamp_ms: int,
              group: SendBatchGroup, index: int) -> None:
        """Append a later ``send_batch`` chunk of the same partition to this queued,
        never-sent chunk batch (``Accumulator._merge_target`` says when it may)."""
        assert self.members is not None
        if self.arrow_more is None:
            self.arrow_more = []
        self.arrow_more.append(rows)
        self.members.append((group, index, self.arrow_rows, rows.num_rows))
        self.arrow_rows += rows.num_rows
        low, high = self.arrow_ms
        self.arrow_ms = (min(low, timestamp_ms), max(high, timestamp_ms))
        self.size += size

    def unwatched(self) -> int:
        """Records nobody holds a future or callback for (``produce`` without one)."""
        callbacks = self.callbacks
        called = len(callbacks) - callbacks.count(None) if callbacks else 0
        return self.count - (len(self.watchers) if self.watchers else 0) - called


class PartitionQueue:
    """Per-partition queue: ``open`` fills; ``queue[0]`` is the next (or in-flight) batch."""

    __slots__ = ("in_flight", "key", "num_partitions", "open", "queue")

    def __init__(self, topic: str, partition: int, num_partitions: int) -> None:
        self.key = (topic, partition)
        self.num_partitions = num_partitions
        self.open: Batch | None = None
        self.queue: deque[Batch] = deque()
        self.in_flight = False  # set and cleared by the sender, on the loop

    def batches(self) -> list[Batch]:
        out = list(self.queue)
        if self.open is not None:
            out.append(self.open)
        return out


class Wakeup:
    """Wakes the sender task: ``set`` on the loop, ``set_from_any_thread`` from anywhere
    (one ``call_soon_threadsafe`` per burst of appends)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.event: asyncio.Event | None = None
        self._scheduled = False
        self._loop_thread_id: int | None = None

    def start(self) -> None:
        """Bind to the loop thread (call on the loop)."""
        self._loop_thread_id = threading.get_ident()
        self.event = asyncio.Event()

    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self._loop_thread_id

    def set(self) -> None:
        if self.event is not None:
            self.event.set()

    def _set_from_thread(self) -> None:
        self._scheduled = False
        self.set()

    def set_from_any_thread(self) -> None:
        if self.on_loop_thread():
            self.set()
        elif not self._scheduled:
            self._scheduled = True
            try:
                self.loop.call_soon_threadsafe(self._set_from_thread)
            except RuntimeError:  # loop closed: the producer is gone
                self._scheduled = False


def binary_array(items: list[bytes | None]) -> pa.Array | list[bytes | None]:
    """``items`` as an Arrow binary array, built by the C helper
    (``_fastproduce.binary_column``) from the bytes themselves; the list unchanged where
    the helper is not built or an item is not bytes or None (``build_batch`` then
    converts it with ``pa.array``, which costs about 21 ns an item and imports pandas
    the first time)."""
    if _binary_column is not None:
        buffers = _binary_column(items)
        if buffers is not None:
            offsets, data, validity = buffers
            return pa.Array.from_buffers(
                pa.binary(), len(items),
                [None if validity is None else pa.py_buffer(validity),
                 pa.py_buffer(offsets), pa.py_buffer(data)])
    return items


def native_columns() -> bool:
    """Whether ``binary_array`` builds columns in C (``_fastproduce`` is built)."""
    return _binary_column is not None


_NULLS: dict[tuple[pa.DataType, int], pa.Array] = {}
#: Columns of more rows are made afresh: their offsets would pin megabytes, and a call
#: that big does not notice one ``pa.nulls``.
_NULLS_MAX_ROWS: Final = 16_384


def _nulls(n: int, type_: pa.DataType) -> pa.Array:
    """An all-null column of ``n`` rows, shared (Arrow arrays are immutable): the keys
    and headers of a ``send_batch`` without them cost a ``pa.nulls`` call each per chunk
    otherwise. A few sizes recur (the caller's chunk size); the cache stays small (at
    most 64 columns of at most ``_NULLS_MAX_ROWS`` rows)."""
    if n > _NULLS_MAX_ROWS:
        return pa.nulls(n, type_)
    key = (type_, n)
    column = _NULLS.get(key)
    if column is None:
        if len(_NULLS) >= 64:
            _NULLS.clear()
        column = _NULLS[key] = pa.nulls(n, type_)
    return column


def _pad(column: list[Any], rows: int) -> None:
    """Give a sparse column ``rows`` entries: ``None`` for the rows that had no value."""
    if len(column) < rows:
        column.extend([None] * (rows - len(column)))


def _sparse_append(column: list[Any] | None, index: int, value: Any) -> list[Any]:
    """``column`` (a new one for ``None``) with ``value`` at ``index``."""
    if column is None:
        column = []
    _pad(column, index)
    column.append(value)
    return column


def _run_blocking(coroutine: Coroutine[Any, Any, None]) -> None:
    """Run ``coroutine`` to its end in this thread, with no event loop: every await in it
    must block or finish at once, never suspend (a suspension is a bug: RuntimeError)."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()
    raise RuntimeError("a coroutine run by _run_blocking suspended")


# --------------------------------------------------------------------------- accumulator


class Accumulator:
    """The open batches and send queues of every partition, and the buffer they fill."""

    def __init__(self, config: ProducerConfig, wakeup: Wakeup,
                 topics: dict[str, dict[int, Any]]) -> None:
        self.config = config
        #: The producer's metadata, topic -> partitions (``Cluster.topics``, updated in
        #: place), read without a lock on every ``add``.
        self._topics = topics
        self.wakeup = wakeup
        self.lock = threading.Lock()
        self._space = threading.Condition(self.lock)
        self._space_waiters: list[asyncio.Future[None]] = []
        self.partitions: dict[tuple[str, int], PartitionQueue] = {}
        #: The queues with an open or queued batch (a subset of ``partitions``, lock
        #: held): what ``ready`` looks at, so a sender pass costs what is in flight, not
        #: a visit to every partition ever written (10,000 after a first write to each).
        self._active: dict[tuple[str, int], PartitionQueue] = {}
        self.buffered = 0
        self._sticky = StickyPartitioner()
        #: topic -> the queue of its sticky partition and that queue's open batch, while
        #: it has one (both dropped whenever the batch closes or the partition moves).
        self._sticky_queues: dict[str, PartitionQueue] = {}
        self._sticky_batches: dict[str, Batch] = {}
        self.closing = False
        # Read on every append: plain attributes are cheaper than config lookups.
        self._batch_size = config.batch_size
        self._buffer_memory = config.buffer_memory
        self._delivery_timeout_s = config.delivery_timeout_ms / 1000

    # ------------------------------------------------------------------ records
    def prepare(self, key: Key, value: Value, headers: Headers, timestamp_ms: int | None
                ) -> tuple[bytes | None, bytes | TypedValue | None, list[Header] | None,
                           int | None, int]:
        """Type-check one record; return key, value, headers, its timestamp (``None``:
        now) and its size estimate.

        This runs once per ``send``/``produce``: the common types take the short way.
        """
        v = value if type(value) is bytes or value is None or isinstance(value, TypedValue) \
            else _as_bytes(value, "value")
        size = RECORD_OVERHEAD if v is None else RECORD_OVERHEAD + len(v)
        k: bytes | None = None
        if key is not None:
            k = key if type(key) is bytes else _as_bytes(key, "key")
            size += len(k)  # type: ignore[arg-type]  # not None: key was not
        hs: list[Header] | None = None
        if headers:
            hs, header_bytes = _normalize_headers(headers)
            size += header_bytes
        ts: int | None = None
        if timestamp_ms is not None:
            ts = int(timestamp_ms)
            if not 0 <= ts <= MAX_TIMESTAMP_MS:
                raise ValueError(f"timestamp_ms={timestamp_ms} must be in 0..{MAX_TIMESTAMP_MS} "
                                 "(ms since the epoch)")
        if size > self._buffer_memory:
            raise RecordTooLargeError(
                f"a record of about {size} bytes does not fit in buffer_memory="
                f"{self.config.buffer_memory}; raise buffer_memory or send smaller records")
        return k, v, hs, ts, size

    @staticmethod
    def check_partition(topic: str, partition: int | None, num_partitions: int) -> None:
        if partition is not None and not 0 <= partition < num_partitions:
            raise ValueError(f"partition {partition} does not exist: topic {topic!r} has "
                             f"{num_partitions} partition(s), 0..{num_partitions - 1}")

    # ------------------------------------------------------------------ appending
    @property
    def sticky_batches(self) -> dict[str, Batch]:
        """Each topic's open sticky batch (the dict itself, never replaced; change it only
        with ``lock`` held): what ``add``'s fast path and the blocking producer's C path
        (``_fastproduce.c``) append to."""
        return self._sticky_batches

    def add(self, topic: str, value: Value, key: Key, headers: Headers,
            partition: int | None, timestamp_ms: int | None, watcher: Watcher | None,
            blocking: bool) -> bool | None:
        """Append one record to its partition's open batch: the per-record hot path.

        ``True``: appended. ``False`` (only when not ``blocking``): no buffer space,
        nothing appended (await ``wait_for_space``, then call again). ``None``: the
        topic's partitions are not known yet, nothing appended (fetch its metadata, then
        call again). ``blocking`` waits in this thread for space, up to ``max_block_ms``
        (``BufferFullError`` after it, at once with ``on_buffer_full="raise"``, and on
        the loop thread). Raises for a bad record or partition, and
        ``ProducerClosedError`` once closing.

        The common record (a bytes value and nothing else, with or without a watcher)
        that fits the room of its topic's sticky batch costs one lock, one subtraction
        and two list appends; everything else takes ``_add``. Safe from any thread: the
        lock covers the append (uncontended on the asyncio face, where only the loop
        appends).
        """
        if type(value) is bytes and key is None and headers is None and partition is None \
                and timestamp_ms is None:
            size = len(value) + 16  # RECORD_OVERHEAD, spelled out: no global lookup
            lock = self.lock
            lock.acquire()
            try:
                batch = self._sticky_batches.get(topic)
                if batch is not None:
                    room = batch.room - size
                    if room >= 0:
                        batch.room = room
                        values = batch.values
                        if watcher is not None:
                            callbacks = batch.callbacks
                            if callbacks is not None and len(callbacks) == len(values) \
                                    and not isinstance(watcher, _FUTURE_TYPES):
                                callbacks.append(watcher)  # at index len(values)
                            else:
                                self._watch(batch, watcher)
                        values.append(value)  # (list.append: a specialised call)
                        batch.timestamps.append(time_ns())
                        return True
            finally:
                lock.release()
        return self._add(topic, value, key, headers, partition, timestamp_ms, watcher,
                         blocking)

    def _add(self, topic: str, value: Value, key: Key, headers: Headers,
             partition: int | None, timestamp_ms: int | None, watcher: Watcher | None,
             blocking: bool) -> bool | None:
        """``add`` for every record: checks, partitioning, a batch with room, sparse
        columns, watchers."""
        partitions = self._topics.get(topic)
        if not partitions:
            return None
        num_partitions = len(partitions)
        k, v, hs, ts, size = self.prepare(key, value, headers, timestamp_ms)
        if partition is not None:
            self.check_partition(topic, partition, num_partitions)
        sticky = partition is None and k is None
        with self.lock:
            if self.closing:
                raise ProducerClosedError("send() after close(): create a new producer")
            if partition is not None:
                st = self._queue(topic, partition, num_partitions)
            elif k is not None:
                st = self._queue(topic, partition_for_key(k, num_partitions), num_partitions)
            else:
                st = self._sticky_queues.get(topic) or self._queue(
                    topic, self._sticky.partition(topic, num_partitions), num_partitions)
            batch = st.open
            while batch is not None and type(v) is TypedValue and batch.values \
                    and getattr(batch.values[-1], "schema_id", v.schema_id) != v.schema_id:
                # One schema id per batch: a record converted under another version (the
                # subject's latest changed while the batch was open) starts the next one.
                # Ids say nothing of version order (a text keeps its id in every subject),
                # so no record is ever rewritten under another version.
                self._close_open(st)
                self.wakeup.set_from_any_thread()
                if sticky:
                    st = self._queue(topic, self._sticky.partition(topic, num_partitions),
                                     num_partitions)
                batch = st.open
            if batch is None or batch.room < size:
                room = self._make_room(st, size, sticky, blocking)
                if room is None:
                    return False
                st = room
                batch = st.open
                assert batch is not None
            if sticky:  # st has an open batch: the fast path may append to it
                self._sticky_queues[topic] = st
                self._sticky_batches[topic] = batch
            index = len(batch.values)
            batch.room -= size
            batch.values.append(v)
            if ts is None:
                batch.timestamps.append(time_ns())
            else:
                batch.timestamps.append(0)  # a placeholder: explicit_ms holds it
                batch.explicit_ms = _sparse_append(batch.explicit_ms, index, ts)
            if k is not None:
                batch.keys = _sparse_append(batch.keys, index, k)
            if hs is not None:
                batch.headers = _sparse_append(batch.headers, index, hs)
            if watcher is not None:
                self._watch(batch, watcher, index)
            return True

    @staticmethod
    def _watch(batch: Batch, watcher: Watcher, index: int = -1) -> None:
        """Register ``watcher`` for record ``index`` of ``batch`` (default: the record
        about to be appended); a ``DeliveryFuture`` gets the batch's shared condition,
        a callback its place in the ``callbacks`` column."""
        if index < 0:
            index = len(batch.values)
        if not isinstance(watcher, _FUTURE_TYPES):
            batch.callbacks = _sparse_append(batch.callbacks, index, watcher)
            return
        if type(watcher) is DeliveryFuture:
            if batch.condition is None:
                batch.condition = threading.Condition()
            watcher._condition = batch.condition
        if batch.watchers is None:
            batch.watchers = []
        batch.watchers.append((index, watcher))

    def _make_room(self, st: PartitionQueue, size: int, sticky: bool, blocking: bool
                   ) -> PartitionQueue | None:
        """Give a ``size``-byte record room (lock held): grow the open batch's
        reservation, or close it when full (a sticky record then moves to the next
        sticky partition, Kafka's onNewBatch) and open a new one. Waits for buffer space
        when ``blocking``, else ``None`` when there is none. The queue with room."""
        topic = st.key[0]
        deadline: float | None = None
        while True:
            if self.closing:
                raise ProducerClosedError("send() after close(): create a new producer")
            batch = st.open
            if batch is not None:
                if batch.room >= size:
                    return st  # another thread made room while this one waited
                grow = self._growth(batch, size)
                if grow:
                    batch.room += grow
                    batch.size += grow
                    self.buffered += grow
                    return st
                self._close_open(st)
                self.wakeup.set_from_any_thread()
                if sticky:
                    st = self._queue(topic, self._sticky.partition(topic, st.num_partitions),
                                     st.num_partitions)
                continue
            free = self._buffer_memory - self.buffered
            if size <= free:
                reserve = min(max(size, min(RESERVATION_STEP, self._batch_size)), free,
                              max(size, MAX_RECORDS_PER_BATCH * RECORD_OVERHEAD))
                batch = st.open = Batch(topic, st.key[1], time.monotonic(),
                                        self._delivery_timeout_s)
                self._active[st.key] = st
                batch.room = batch.size = reserve
                self.buffered += reserve
                self.wakeup.set_from_any_thread()
                return st
            if not blocking:
                return None
            deadline = self._wait_for_space_sync(deadline)

    def _growth(self, batch: Batch, size: int) -> int:
        """Bytes to add to ``batch``'s reservation for a ``size``-byte record (lock held);
        0 when the record cannot join it: ``batch_size``, ``MAX_RECORDS_PER_BATCH`` (each
        record takes at least ``RECORD_OVERHEAD`` of room) or the buffer is reached."""
        need = size - batch.room
        most = min(self._batch_size - batch.size,
                   (MAX_RECORDS_PER_BATCH - len(batch.values)) * RECORD_OVERHEAD - batch.room,
                   self._buffer_memory - self.buffered)
        if need > most:
            return 0
        return min(max(need, RESERVATION_STEP), most)

    def _queue(self, topic: str, partition: int, num_partitions: int) -> PartitionQueue:
        st = self.partitions.get((topic, partition))
        if st is None:
            st = self.partitions[(topic, partition)] = PartitionQueue(
                topic, partition, num_partitions)
        else:
            st.num_partitions = num_partitions
        return st

    def _close_open(self, st: PartitionQueue) -> None:
        """Move the open batch to the send queue (lock held); the sticky partition moves."""
        batch = self._detach_open(st)
        if batch is None:
            return
        st.queue.append(batch)
        self._sticky.batch_closed(st.key[0], st.key[1], st.num_partitions)

    def _detach_open(self, st: PartitionQueue) -> Batch | None:
        """Take ``st``'s open batch away from appends (lock held): sealed, its unused
        reservation back in the buffer, no longer the fast path's."""
        batch = st.open
        if batch is None:
            return None
        st.open = None
        topic = st.key[0]
        if self._sticky_queues.get(topic) is st:
            del self._sticky_queues[topic]
            self._sticky_batches.pop(topic, None)
        unused = batch.seal()
        if unused:
            self.buffered -= unused
            self._space.notify_all()
            self._wake_space_waiters()  # (only the loop has any: the asyncio face's)
        return batch

    def _wait_for_space_sync(self, deadline: float | None) -> float:
        """Wait (lock held) for freed buffer space; raise ``BufferFullError`` when not allowed."""
        if self.config.on_buffer_full == "raise":
            raise self._buffer_full()
        if self.wakeup.on_loop_thread():
            # Blocking the loop thread would stop the very acknowledgements that free space.
            raise self._buffer_full(" (send() from the producer's own loop thread, e.g. a "
                                    "delivery callback, cannot block)")
        now = time.monotonic()
        if deadline is None:
            deadline = now + self.config.max_block_ms / 1000
        if now >= deadline or (not self._space.wait(deadline - now)
                               and time.monotonic() >= deadline):
            raise self._buffer_full(f" for max_block_ms={self.config.max_block_ms}")
        return deadline

    async def wait_for_space(self, deadline: float | None) -> float:
        """Await freed buffer space on the loop (``add`` said ``False``); the deadline to
        pass on to the next wait. ``BufferFullError`` as for ``add(blocking=True)``."""
        if self.config.on_buffer_full == "raise":
            raise self._buffer_full()
        now = time.monotonic()
        if deadline is None:
            deadline = now + self.config.max_block_ms / 1000
        if now >= deadline:
            raise self._buffer_full(f" for max_block_ms={self.config.max_block_ms}")
        waiter: asyncio.Future[None] = self.wakeup.loop.create_future()
        self._space_waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, deadline - now)
        except TimeoutError:
            raise self._buffer_full(f" for max_block_ms={self.config.max_block_ms}") from None
        return deadline

    def _buffer_full(self, detail: str = "", **extra: Any) -> BufferFullError:
        return BufferFullError(
            f"producer buffer full: {self.buffered} of buffer_memory="
            f"{self.config.buffer_memory} bytes await acknowledgement{detail}; slow down, "
            "flush(), or raise buffer_memory", **extra)

    # ------------------------------------------------------------------ columnar path
    def plan_columns(self, topic: str, num_partitions: int, values: Any, keys: Any,
                     partition: int | None, timestamp_ms: int | None,
                     value_schema_id: int | None = None) -> Chunks:
        """Cut whole columns into ``(partition or None=sticky, payload, size)`` chunks.

        All vectorized: sizes come from ``binary_length`` and a cumulative sum, chunk
        edges from a run-end encoding of ``(cumsum - 1) // batch_size``. Only keyed
        records without an explicit partition pay a Python murmur2 call each.

        ``value_schema_id`` set: a typed topic's values, already a StructArray of that
        schema (its rows are sized by their average: a struct has no per-row length).
        """
        if value_schema_id is None:
            value_array = _column(values, "values")
            payload_schema = PAYLOAD_SCHEMA
        else:
            value_array = values
            payload_schema = typed_payload_schema(values.type, value_schema_id)
        n = len(value_array)
        if n == 0:
            return []
        key_array = _nulls(n, pa.binary()) if keys is None else _column(keys, "keys")
        if len(key_array) != n:
            raise ValueError(f"keys has {len(key_array)} rows but values has {n}")
        ts = time.time_ns() // 1_000_000 if timestamp_ms is None else int(timestamp_ms)
        if not 0 <= ts <= MAX_TIMESTAMP_MS:
            raise ValueError(f"timestamp_ms={timestamp_ms} must be in 0..{MAX_TIMESTAMP_MS} "
                             "(ms since the epoch)")
        # The constant column from its buffer: pa.repeat cost ~20 us a call here.
        ts_array = pa.Array.from_buffers(pa.int64(), n,
                                         [None, pa.py_buffer(array("q", (ts,)) * n)])
        # The (all-null) headers column is added per chunk: Arrow's IPC writer does not
        # trim a *sliced* list array, so a slice of a big one would carry all its offsets.
        payload = pa.RecordBatch.from_arrays([key_array, value_array, ts_array],
                                             names=["key", "value", "timestamp"])
        groups: list[tuple[int | None, pa.RecordBatch]]
        if partition is not None or key_array.null_count == n:
            groups = [(partition, payload)]
        else:
            # Null keys in a keyed column follow the sticky partition, as with send().
            targets = key_partitions(key_array, num_partitions, null_target=-1)
            groups = [(None if p < 0 else p, rows)
                      for p, rows in split_by_partition(payload, targets)]
        out: Chunks = []
        for target, rows in groups:
            # Common case: the rows fit one batch. Their buffer size plus the per-record
            # overhead bounds the estimate from above, so no per-row sizes are needed.
            estimate = rows.nbytes + rows.num_rows * RECORD_OVERHEAD
            if estimate <= self.config.batch_size and rows.num_rows <= MAX_RECORDS_PER_BATCH:
                out.append((target, pa.RecordBatch.from_arrays(
                    [*rows.columns, _nulls(rows.num_rows, _HEADERS_TYPE)],
                    schema=payload_schema), estimate, ts))
                continue
            # Scalars are passed as Arrow scalars made without pa.scalar: given a Python
            # int, pyarrow retries a failing optional import on every call (about 70 us
            # each here), and pa.scalar itself costs 19 us (int_scalar: 1.5).
            zero = int_scalar(0, pa.int32())
            value_sizes = pc.fill_null(pc.binary_length(rows.column(1)), zero) \
                if value_schema_id is None else pa.repeat(
                    int_scalar(-(-rows.column(1).nbytes // rows.num_rows), pa.int32()),
                    rows.num_rows)
            sizes = pc.add(pc.add(pc.fill_null(pc.binary_length(rows.column(0)), zero),
                                  value_sizes),
                           int_scalar(RECORD_OVERHEAD, pa.int32()))
            sizes = pc.cast(sizes, pa.int64())
            cumulative = pc.cumulative_sum(sizes)
            windows = pc.divide(pc.subtract(cumulative, int_scalar(1, pa.int64())),
                                int_scalar(self.config.batch_size, pa.int64()))
            ends = pc.run_end_encode(windows).run_ends.to_pylist()
            start = 0
            for end in ends:
                while start < end:
                    stop = min(end, start + MAX_RECORDS_PER_BATCH)
                    part = rows.slice(start, stop - start)
                    chunk = pa.RecordBatch.from_arrays(
                        [*part.columns, _nulls(stop - start, _HEADERS_TYPE)],
                        schema=payload_schema)
                    before = cumulative[start - 1].as_py() if start else 0
                    out.append((target, chunk, cumulative[stop - 1].as_py() - before, ts))
                    start = stop
        return out

    def _append_chunk_locked(self, topic: str, num_partitions: int, target: int | None,
                             rows: pa.RecordBatch, size: int, timestamp_ms: int,
                             group: SendBatchGroup) -> bool:
        """Queue one pre-built chunk as its own batch (lock held); ``False``: no space."""
        if self.closing:
            raise ProducerClosedError("send_batch() after close(): create a new producer")
        if self.buffered + size > self.config.buffer_memory and self.buffered > 0:
            return False
        partition = self._sticky.partition(topic, num_partitions) if target is None else target
        st = self._queue(topic, partition, num_partitions)
        self._close_open(st)  # records sent earlier to this partition go first
        index = len(group.parts)
        group.parts.append(None)
        group.expected += 1
        tail = self._merge_target(st, rows, size)
        if tail is not None:
            tail.merge(rows, size, timestamp_ms, group, index)
        else:
            batch = Batch(topic, partition, time.monotonic(),
                          self.config.delivery_timeout_ms / 1000)
            batch.arrow = rows
            batch.arrow_rows = rows.num_rows
            batch.arrow_ms = (timestamp_ms, timestamp_ms)
            batch.size = size
            batch.members = [(group, index, 0, rows.num_rows)]
            st.queue.append(batch)
        self._active[st.key] = st
        self.buffered += size
        self._sticky.batch_closed(topic, partition, num_partitions)
        self._sticky_queues.pop(topic, None)
        self._sticky_batches.pop(topic, None)
        return True

    def _merge_target(self, st: PartitionQueue, rows: pa.RecordBatch, size: int
                      ) -> Batch | None:
        """The queued chunk batch of ``st`` that a new chunk may join (lock held), if any.

        Only the last of two or more queued batches, never the head: the sender encodes
        a partition's head (outside the lock) and nothing behind it, so a batch behind
        the head has no bytes and no sequence yet. Chunks queue behind a head only while
        that partition has a batch in flight, i.e. under load: then consecutive small
        ``send_batch`` calls share one wire batch (up to ``batch_size`` and
        ``MAX_RECORDS_PER_BATCH``), where each used to cost a batch of its own to
        encode, append, replicate and decode; an idle producer's chunks still go at once.
        """
        queue = st.queue
        if len(queue) < 2:
            return None
        tail = queue[-1]
        if tail.arrow is None or tail.encoded is not None or tail.attempts \
                or tail.size + size > self.config.batch_size \
                or tail.arrow_rows + rows.num_rows > MAX_RECORDS_PER_BATCH \
                or not tail.arrow.schema.equals(rows.schema, check_metadata=True):
            return None
        return tail

    def append_chunks_blocking(self, topic: str, num_partitions: int, chunks: Chunks,
                               group: SendBatchGroup) -> None:
        """``send_batch`` from any thread: ``_append_chunks``, waiting for space in the
        caller's thread (on the loop thread a full buffer raises ``BufferFullError``)."""
        _run_blocking(self._append_chunks(topic, num_partitions, chunks, group,
                                          self._retry_blocking))

    async def append_chunks_async(self, topic: str, num_partitions: int, chunks: Chunks,
                                  group: SendBatchGroup) -> None:
        """``send_batch`` on the loop: ``_append_chunks``, awaiting space."""
        await self._append_chunks(topic, num_partitions, chunks, group, self._retry_on_loop)

    async def _append_chunks(self, topic: str, num_partitions: int, chunks: Chunks,
                             group: SendBatchGroup,
                             retry: Callable[[Callable[[], bool]], Awaitable[None]]) -> None:
        """Queue ``chunks`` in order, each as its own batch, waking the sender after each,
        then seal ``group``. Both faces run this; they differ only in ``retry``, how they
        wait for buffer space between attempts to queue a chunk.

        A ``BufferFullError`` (no space, and no waiting allowed or ``max_block_ms`` passed
        for one chunk) comes out naming the records queued before it (``_partial``).
        """
        accepted = 0
        try:
            for target, rows, size, timestamp_ms in chunks:
                await retry(partial(self._append_chunk_locked, topic, num_partitions, target,
                                    rows, size, timestamp_ms, group))
                accepted += rows.num_rows
                self.wakeup.set_from_any_thread()
        except BufferFullError as err:
            raise self._partial(group, accepted, err) from None
        finally:
            self._seal(group)

    async def _retry_blocking(self, attempt: Callable[[], bool]) -> None:
        """Call ``attempt`` (lock held) until it succeeds, waiting on ``_space`` between
        tries: blocks the calling thread, never suspends (``_run_blocking`` runs it)."""
        deadline: float | None = None
        with self._space:
            while not attempt():
                deadline = self._wait_for_space_sync(deadline)

    async def _retry_on_loop(self, attempt: Callable[[], bool]) -> None:
        """Call ``attempt`` (lock held) until it succeeds, awaiting freed space between
        tries with the lock released."""
        deadline: float | None = None
        while True:
            with self.lock:
                if attempt():
                    return
            deadline = await self.wait_for_space(deadline)

    @staticmethod
    def _partial(group: SendBatchGroup, accepted: int, err: BufferFullError
                 ) -> BufferFullError:
        return BufferFullError(
            f"{err.message}; the first {accepted} record(s) of this send_batch were queued "
            "and will be delivered (see .accepted)", records_accepted=accepted,
            accepted=group.future if accepted else None)

    def _seal(self, group: SendBatchGroup) -> None:
        def seal() -> None:
            group.sealed = True
            group.maybe_finish()
        # Completions run on the loop; sealing there too avoids racing them.
        if self.wakeup.on_loop_thread():
            seal()
        else:
            self.wakeup.loop.call_soon_threadsafe(seal)

    # ------------------------------------------------------------------ the sender's side
    def ready(self, now: float, force: bool, has_id: Callable[[tuple[str, int]], bool] | None
              ) -> tuple[list[PartitionQueue], float | None, list[tuple[PartitionQueue, Batch]]]:
        """Close lingered batches (all of them with ``force``, or once closing); return the
        partitions whose head batch can go now, the next time something is due, and the
        batches past their delivery deadline. ``has_id`` (idempotence) says whether a
        partition can number a new batch; a retry keeps its bytes and needs no id."""
        linger = self.config.linger_ms / 1000
        force = force or self.closing
        ready: list[PartitionQueue] = []
        expired: list[tuple[PartitionQueue, Batch]] = []
        next_wake: float | None = None

        def soon(t: float) -> None:
            nonlocal next_wake
            if next_wake is None or t < next_wake:
                next_wake = t

        with self.lock:
            active = self._active
            for st in list(active.values()):
                batch = st.open
                if batch is not None:
                    if force or now >= batch.created + linger:
                        self._close_open(st)
                    else:
                        soon(batch.created + linger)
                if not st.queue:
                    if st.open is None:
                        del active[st.key]  # idle: back in when it gets a batch
                    continue
                for i, queued in enumerate(st.queue):
                    if i == 0 and st.in_flight:
                        continue
                    if now >= queued.deadline:
                        expired.append((st, queued))
                    else:
                        soon(queued.deadline)
                if st.in_flight:
                    continue
                head = st.queue[0]
                if now >= head.deadline:
                    continue
                if head.retry_at > now:
                    soon(head.retry_at)
                    continue
                if has_id is not None and head.encoded is None and not has_id(st.key):
                    continue
                ready.append(st)
        return ready, next_wake, expired

    def release(self, st: PartitionQueue | None, batch: Batch) -> bool:
        """Drop ``batch`` from its queue and free its buffer space; ``False`` if done."""
        if batch.finished:
            return False
        batch.finished = True
        with self.lock:
            if st is not None:
                if st.queue and st.queue[0] is batch:
                    st.queue.popleft()
                elif batch in st.queue:
                    st.queue.remove(batch)
                elif st.open is batch:
                    self._detach_open(st)
            self.buffered -= batch.size
            self._space.notify_all()
        self._wake_space_waiters()
        return True

    def pending(self, st: PartitionQueue) -> list[Batch]:
        """Every batch of ``st`` not released yet (queued, in flight or open)."""
        with self.lock:
            return st.batches()

    def batches(self) -> list[Batch]:
        """Every batch that exists now, of every partition."""
        with self.lock:
            return [b for st in self.partitions.values() for b in st.batches()]

    def topics(self) -> list[str]:
        """The topics records were appended to (sorted)."""
        with self.lock:  # caller threads may add partitions concurrently
            return sorted({topic for topic, _ in self.partitions})

    def close(self) -> None:
        """Refuse appends from now on; wake everybody waiting for space (they raise)."""
        with self.lock:
            self.closing = True
            self._sticky_queues.clear()  # every append now takes _add, which refuses it
            self._sticky_batches.clear()
            self._space.notify_all()
        self._wake_space_waiters()

    def take_unsent(self) -> list[tuple[PartitionQueue, Batch]]:
        """Every batch not sent yet (open or queued, not the one in flight), taken out
        of its queue: a transaction's abort drops them."""
        out: list[tuple[PartitionQueue, Batch]] = []
        with self.lock:
            for st in self.partitions.values():
                self._close_open(st)
                keep = [st.queue[0]] if st.queue and st.in_flight else []
                out.extend((st, b) for b in list(st.queue)[len(keep):])
                st.queue.clear()
                st.queue.extend(keep)
        return out

    def take_all(self) -> list[Batch]:
        """Empty every queue (at close): the batches that were still in them."""
        leftovers: list[Batch] = []
        with self.lock:
            for st in self.partitions.values():
                self._close_open(st)
                leftovers.extend(st.queue)
                st.queue.clear()
        return leftovers

    def _wake_space_waiters(self) -> None:
        waiters, self._space_waiters = self._space_waiters, []
        for waiter in waiters:
            resolve(waiter, None)

