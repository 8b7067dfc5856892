"""Source options: parsing, validation and the offset JSON format.

Why a separate, Spark-free module: every option mistake must fail the query when it
starts, with a message naming the option and saying what to do. Keeping the parsing pure
(a mapping of strings in, a frozen ``SourceOptions`` out, no network) lets the reader
validate in its constructor, which Spark calls when the query starts, and lets tests
check every message without a SparkSession.

The option names, values and defaults mirror Spark's Kafka source (``subscribe``,
``subscribePattern``, ``startingOffsets``, ``startingTimestamp``, ``endingOffsets``,
``maxOffsetsPerTrigger``, ``minPartitions``, ``failOnDataLoss``), so a Kafka query moves
over by changing ``format("kafka")`` to ``format("strata")``. Spark hands a Python data
source its options in a case-insensitive dictionary whose keys are lower-cased; this
module lower-cases keys itself too, so a plain ``dict`` behaves the same.

Isolation (``kafka.isolation.level``, Spark's Kafka option name, or ``isolation.level``,
the same name without the prefix as for every Kafka client property this source takes):
``read_committed`` by default, unlike Spark's Kafka source (whose Kafka consumer
defaults to ``read_uncommitted``), because Strata's own exactly-once sink writes every
micro-batch as one transaction and only a read_committed reader sees it whole. A batch
then ends at the last stable offset, not the high watermark (docs/spark.md).

Offsets, as Spark checkpoints them, are ``{"topic": {"partition": offset}}`` with topics
sorted by name and partitions by number: Spark compares offsets as JSON text, so equal
offsets must serialise identically (spark_source/README.md, "Offsets and invariants"). It
is also the Kafka source's JSON offset format, so ``startingOffsets`` / ``endingOffsets``
JSON reads the same.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

import pyarrow as pa

from spark_source._errors import StrataSparkOptionError
from strata.client import TopicPartition
from wire.security import PLAINTEXT, SECURITY_PROPERTIES, ClientSecurity

__all__ = [
    "DEFAULT_ISOLATION",
    "EARLIEST",
    "ENV_BOOTSTRAP",
    "ISOLATION_LEVELS",
    "IsolationLevel",
    "LATEST",
    "OPTION_NAMES",
    "Offsets",
    "OffsetsJson",
    "SourceOptions",
    "VALUE_FORMATS",
    "ValueFormat",
    "describe",
    "offsets_from_json",
    "offsets_to_json",
    "parse_source_options",
]

#: In ``startingOffsets`` / ``endingOffsets`` JSON: -2 is the earliest offset, -1 the latest
#: (Kafka's convention).
EARLIEST: Final = -2
LATEST: Final = -1

#: Environment variable holding the default bootstrap servers (the CLI's variable). Spark
#: exports ``spark.executorEnv.<NAME>`` to every Python worker it starts, the driver-side
#: planner workers included, so ``spark.executorEnv.STRATA_BOOTSTRAP`` sets it from
#: Spark configuration.
ENV_BOOTSTRAP: Final = "STRATA_BOOTSTRAP"

#: Every option the source accepts, lower-cased -> the spelling used in messages and docs.
OPTION_NAMES: Final[dict[str, str]] = {
    name.lower(): name
    for name in (
        "bootstrap.servers",
        "kafka.bootstrap.servers",
        "subscribe",
        "subscribePattern",
        "startingOffsets",
        "startingTimestamp",
        "endingOffsets",
        "maxOffsetsPerTrigger",
        "minPartitions",
        "failOnDataLoss",
        "includeHeaders",
        "valueFormat",
        "valueSchemaVersion",
        "path",
        "kafka.isolation.level",
        "isolation.level",
    )
}

#: Security options (source and sink): Kafka's client property names with the ``kafka.``
#: prefix, as the Kafka source takes them, and the same names without it (Strata's);
#: docs/spark.md lists them. Passwords are options like any other: keep them out of code
#: (e.g. read them from a secret store into the option).
SECURITY_OPTION_NAMES: Final[dict[str, str]] = {
    name.lower(): name
    for base in (*SECURITY_PROPERTIES, "sasl.jaas.config")
    for name in (base, "kafka." + base)
}
OPTION_NAMES.update(SECURITY_OPTION_NAMES)

#: Kafka source options a user may bring along that this source does not implement, with
#: what to do instead. Unknown options fail too; these just get a better message.
_KAFKA_ONLY: Final[dict[str, str]] = {
    "assign": "read whole topics with subscribe, and filter on the partition column",
    "startingoffsetsbytimestamp": "use startingTimestamp (one timestamp for every "
                                  "partition)",
    "startingoffsetsbytimestampstrategy": "a partition with no record at or after "
                                          "startingTimestamp starts at its latest offset",
    "endingoffsetsbytimestamp": "use endingOffsets with offsets",
    "endingtimestamp": "use endingOffsets with offsets",
    "minoffsetspertrigger": "only maxOffsetsPerTrigger is supported",
    "maxtriggerdelay": "only maxOffsetsPerTrigger is supported",
    "groupidprefix": "the source reads with assigned partitions and keeps its offsets in "
                     "the Spark checkpoint; there is no consumer group",
    "kafkaconsumer.polltimeoutms": "the source waits up to 120 s for a broker",
    "fetchoffset.numretries": "offset lookups are retried until the client's request "
                              "timeout",
    "fetchoffset.retryintervalms": "offset lookups are retried until the client's request "
                                   "timeout",
}

_TOPIC_NAME: Final = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_WHOLE_NUMBER: Final = re.compile(r"\+?[0-9]+")

#: ``valueFormat``: how a typed topic's value reaches Spark. ``struct`` (the default): a
#: struct of the schema's fields; ``binary``: the Confluent wire format (magic byte, schema
#: id, Avro body), as Spark's Kafka source would show it; ``json``: a JSON document.
ValueFormat: TypeAlias = Literal["struct", "binary", "json"]
VALUE_FORMATS: Final[tuple[ValueFormat, ...]] = ("struct", "binary", "json")
#: The client's ``value_format`` for each ``valueFormat``.
CONSUMER_VALUE_FORMAT: Final[dict[str, str]] = {
    "struct": "arrow", "binary": "confluent", "json": "json"}

#: ``kafka.isolation.level`` / ``isolation.level``: which records a read returns.
#: ``read_committed`` (the default): only committed transactions' records, up to the last
#: stable offset; ``read_uncommitted``: everything up to the high watermark, aborted and
#: still-open transactions included (Spark's Kafka source's default).
IsolationLevel: TypeAlias = Literal["read_committed", "read_uncommitted"]
ISOLATION_LEVELS: Final[tuple[IsolationLevel, ...]] = ("read_committed", "read_uncommitted")
DEFAULT_ISOLATION: Final[IsolationLevel] = "read_committed"

#: Offsets keyed by partition: the reader's working form.
Offsets: TypeAlias = dict[TopicPartition, int]
#: Offsets as Spark stores them in the checkpoint: ``{"topic": {"partition": offset}}``.
OffsetsJson: TypeAlias = dict[str, dict[str, int]]
#: ``startingOffsets`` / ``endingOffsets``: a keyword, or specific offsets per partition
#: (values may be ``EARLIEST`` / ``LATEST``).
OffsetSpec: TypeAlias = Literal["earliest", "latest"] | Offsets


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Validated source options; see ``spark_source/README.md`` for the table.

    ``subscribe`` (sorted, unique topic names) and ``subscribe_pattern`` are mutually
    exclusive; exactly one is set. ``starting_offsets`` is ``None`` when
    ``starting_timestamp`` is set instead. ``ending_offsets`` is ``None`` for streams.
    """

    bootstrap: str
    subscribe: tuple[str, ...] | None
    subscribe_pattern: str | None
    starting_offsets: OffsetSpec | None
    starting_timestamp: int | None
    ending_offsets: OffsetSpec | None
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    fail_on_data_loss: bool
    streaming: bool
    security: ClientSecurity = PLAINTEXT
    value_format: ValueFormat = "struct"
    isolation_level: IsolationLevel = DEFAULT_ISOLATION
    #: Set by the reader from the schema the query was planned with (``_reader``), for
    #: typed topics only: the subject version every task reads under (so all tasks
    #: agree), the schema's text and type (for defaults of fields older Delta files
    #: lack), and the Arrow type Spark expects of a struct ``value`` (None: binary).
    value_schema_version: int | None = None
    value_schema: tuple[str, str] | None = None
    value_arrow_type: pa.DataType | None = None

    def subscribes_to(self, topic: str) -> bool:
        """Whether ``topic`` belongs to the subscription (pattern: a whole-name match;
        names starting with ``__`` are internal and never match a pattern)."""
        if self.subscribe is not None:
            return topic in self.subscribe
        assert self.subscribe_pattern is not None
        return not topic.startswith("__") and \
            re.fullmatch(self.subscribe_pattern, topic) is not None

    @property
    def subscription(self) -> str:
        """How the subscription reads in messages."""
        if self.subscribe is not None:
            return f"subscribe={','.join(self.subscribe)}"
        return f"subscribePattern={self.subscribe_pattern}"


# ----------------------------------------------------------------------------- parsing


def parse_source_options(options: Mapping[str, str], *, streaming: bool,
                         environ: Mapping[str, str] | None = None) -> SourceOptions:
    """Validate ``options`` for a stream (``readStream``) or a batch read (``read``).

    Raises ``StrataSparkOptionError`` naming the first problem found. Pure: no network.
    The checks that need the cluster (do the topics exist, are all partitions of a JSON
    offset given) happen when the reader first asks the cluster.
    """
    opts = {key.lower(): value for key, value in options.items()}
    env = os.environ if environ is None else environ
    _reject_unknown(opts)

    path = opts.get("path", "")
    if path.strip():
        raise StrataSparkOptionError(
            "path", f"load({path!r}) names no Strata topic; call load() with no argument and "
            "name the topics with option('subscribe', 'a,b') or "
            "option('subscribePattern', 'regex')")
    headers = opts.get("includeheaders")
    if headers is not None and _boolean("includeHeaders", headers) is False:
        raise StrataSparkOptionError(
            "includeHeaders", "the strata source always returns the headers column; drop "
            "the option (select the columns you need instead)")

    bootstrap = _bootstrap(opts, env)
    subscribe, pattern = _subscription(opts)

    starting_raw = opts.get("startingoffsets")
    timestamp_raw = opts.get("startingtimestamp")
    starting_timestamp: int | None = None
    starting: OffsetSpec | None
    if timestamp_raw is not None:
        if starting_raw is not None:
            raise StrataSparkOptionError(
                "startingTimestamp", "is set together with startingOffsets; set only one "
                "of them (startingTimestamp: the first record at or after this time in ms, "
                "startingOffsets: earliest, latest or JSON offsets)")
        starting_timestamp = _whole_number("startingTimestamp", timestamp_raw, minimum=0)
        starting = None
    else:
        default = "latest" if streaming else "earliest"
        starting = _offset_spec("startingOffsets", starting_raw or default,
                                subscribe, pattern, ending=False)
        if not streaming and (starting == "latest" or (
                isinstance(starting, dict) and LATEST in starting.values())):
            raise StrataSparkOptionError(
                "startingOffsets", "latest (-1) is not allowed for a batch query (spark.read): "
                "it would read nothing; use earliest, a JSON offset, or readStream")

    ending_raw = opts.get("endingoffsets")
    ending: OffsetSpec | None = None
    if streaming:
        if ending_raw is not None:
            raise StrataSparkOptionError(
                "endingOffsets", "applies to batch queries (spark.read) only; a stream has no "
                "end. To stop a stream once it has caught up, use "
                "trigger(availableNow=True)")
    else:
        ending = _offset_spec("endingOffsets", ending_raw or "latest", subscribe, pattern,
                              ending=True)

    max_offsets: int | None = None
    raw = opts.get("maxoffsetspertrigger")
    if raw is not None:
        if not streaming:
            raise StrataSparkOptionError(
                "maxOffsetsPerTrigger", "applies to streaming queries only; a batch query "
                "reads startingOffsets..endingOffsets in one go")
        max_offsets = _whole_number("maxOffsetsPerTrigger", raw, minimum=1)
    raw = opts.get("minpartitions")
    min_partitions = None if raw is None else _whole_number("minPartitions", raw, minimum=1)
    raw = opts.get("failondataloss")
    fail_on_data_loss = True if raw is None else _boolean("failOnDataLoss", raw)

    return SourceOptions(
        bootstrap=bootstrap, subscribe=subscribe, subscribe_pattern=pattern,
        starting_offsets=starting, starting_timestamp=starting_timestamp,
        ending_offsets=ending, max_offsets_per_trigger=max_offsets,
        min_partitions=min_partitions, fail_on_data_loss=fail_on_data_loss,
        streaming=streaming, security=security_of(opts), value_format=value_format_of(opts),
        value_schema_version=value_schema_version_of(opts),
        isolation_level=isolation_level_of(opts))


def isolation_level_of(opts: Mapping[str, str]) -> IsolationLevel:
    """``kafka.isolation.level`` / ``isolation.level`` of the (lower-cased) options;
    ``read_committed`` when neither is set."""
    kafka = opts.get("kafka.isolation.level")
    plain = opts.get("isolation.level")
    if kafka is not None and plain is not None and \
            kafka.strip().lower() != plain.strip().lower():
        raise StrataSparkOptionError(
            "kafka.isolation.level", f"is {kafka!r} but isolation.level is {plain!r}; set "
            "only one of them")
    name = "kafka.isolation.level" if kafka is not None else "isolation.level"
    raw = kafka if kafka is not None else plain
    if raw is None:
        return DEFAULT_ISOLATION
    text = raw.strip().lower()
    for level in ISOLATION_LEVELS:
        if text == level:
            return level
    raise StrataSparkOptionError(
        name, f"{raw!r} is not valid; use read_committed (the default: only committed "
        "transactions, up to the last stable offset) or read_uncommitted (everything up to "
        "the high watermark, aborted and open transactions included)")


def value_schema_version_of(opts: Mapping[str, str]) -> int | None:
    """``valueSchemaVersion`` of the (lower-cased) options: the subject version a typed
    topic's values are read under; None (``latest`` or unset): the latest when the query
    is planned. A restarted stream that must keep its columns pins it."""
    raw = opts.get("valueschemaversion")
    if raw is None or raw.strip().lower() == "latest":
        return None
    return _whole_number("valueSchemaVersion", raw, minimum=1)


def value_format_of(opts: Mapping[str, str]) -> ValueFormat:
    """``valueFormat`` of the (lower-cased) options; ``struct`` when unset."""
    raw = opts.get("valueformat")
    if raw is None:
        return "struct"
    text = raw.strip().lower()
    for known in VALUE_FORMATS:
        if text == known:
            return known
    raise StrataSparkOptionError(
        "valueFormat", f"{raw!r} is not valid; use struct (a typed topic's value as a "
        "struct of its schema's fields, the default), binary (Confluent wire-format bytes, "
        "as the Kafka source shows them) or json (a JSON document as bytes)")


def subscription_of(options: Mapping[str, str], environ: Mapping[str, str] | None = None
                    ) -> SourceOptions | None:
    """What ``DataSource.schema()`` needs (bootstrap, subscription, security,
    ``valueFormat``), without the checks that depend on batch or stream; None when the
    options subscribe to nothing (a write, which has no subscription)."""
    opts = {key.lower(): value for key, value in options.items()}
    if "subscribe" not in opts and "subscribepattern" not in opts:
        return None
    env = os.environ if environ is None else environ
    subscribe, pattern = _subscription(opts)
    return SourceOptions(
        bootstrap=_bootstrap(opts, env), subscribe=subscribe, subscribe_pattern=pattern,
        starting_offsets=None, starting_timestamp=None, ending_offsets=None,
        max_offsets_per_trigger=None, min_partitions=None, fail_on_data_loss=True,
        streaming=False, security=security_of(opts), value_format=value_format_of(opts),
        value_schema_version=value_schema_version_of(opts),
        isolation_level=isolation_level_of(opts))


def security_of(opts: Mapping[str, str]) -> ClientSecurity:
    """The connection security the (lower-cased) options describe; PLAINTEXT if none."""
    given = {k: v for k, v in opts.items() if k in SECURITY_OPTION_NAMES}
    try:
        return ClientSecurity.from_properties(given)
    except ValueError as err:
        name = next((SECURITY_OPTION_NAMES[k] for k in sorted(given)
                     if k.endswith(("security.protocol", "sasl.mechanism"))),
                    "security.protocol")
        raise StrataSparkOptionError(name, f"{err}; see docs/spark.md (security)") from None


def _reject_unknown(opts: Mapping[str, str]) -> None:
    for key in sorted(opts):
        if key in OPTION_NAMES:
            continue
        if key in _KAFKA_ONLY:
            raise StrataSparkOptionError(
                key, f"is a Kafka source option the strata source does not support: "
                f"{_KAFKA_ONLY[key]}")
        if key.startswith("kafka."):
            raise StrataSparkOptionError(
                key, "the strata source passes no kafka.* settings to a Kafka client "
                "(it has none); kafka.bootstrap.servers, kafka.isolation.level and the "
                "security options (kafka.security.protocol, kafka.sasl.*, ssl.*: "
                "docs/spark.md) are accepted")
        known = ", ".join(sorted(OPTION_NAMES.values()))
        raise StrataSparkOptionError(
            key, f"is not a strata source option; remove it or fix its spelling "
            f"(options: {known})")


def _bootstrap(opts: Mapping[str, str], env: Mapping[str, str]) -> str:
    plain = opts.get("bootstrap.servers")
    alias = opts.get("kafka.bootstrap.servers")
    if plain is not None and alias is not None and plain.strip() != alias.strip():
        raise StrataSparkOptionError(
            "bootstrap.servers", f"is {plain!r} but kafka.bootstrap.servers is {alias!r}; "
            "set only one of them")
    name = "bootstrap.servers" if plain is not None or alias is None else \
        "kafka.bootstrap.servers"
    value = plain if plain is not None else alias
    if value is None:
        value = env.get(ENV_BOOTSTRAP)
        name = f"bootstrap.servers (from ${ENV_BOOTSTRAP})"
        if value is None or not value.strip():
            raise StrataSparkOptionError(
                "bootstrap.servers", "is not set; pass option('bootstrap.servers', "
                "'host:port[,host:port]') or set the STRATA_BOOTSTRAP environment variable "
                "before the SparkSession starts (or spark.executorEnv.STRATA_BOOTSTRAP)")
    servers = [part.strip() for part in value.split(",")]
    for server in servers:
        host, sep, port = server.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise StrataSparkOptionError(
                name, f"{value!r} is not a list of host:port; use e.g. '127.0.0.1:2191' or "
                "'host1:9092,host2:9092'")
    return ",".join(servers)


def _subscription(opts: Mapping[str, str]) -> tuple[tuple[str, ...] | None, str | None]:
    subscribe = opts.get("subscribe")
    pattern = opts.get("subscribepattern")
    if (subscribe is None) == (pattern is None):
        which = "both are set" if subscribe is not None else "neither is set"
        raise StrataSparkOptionError(
            "subscribe", f"set exactly one of subscribe (a comma-separated list of topics) "
            f"and subscribePattern (a regular expression matching whole topic names); "
            f"{which}")
    if subscribe is not None:
        topics = [t.strip() for t in subscribe.split(",")]
        for topic in topics:
            if not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
                raise StrataSparkOptionError(
                    "subscribe", f"{topic!r} in {subscribe!r} is not a topic name; list topics "
                    "separated by commas, each 1-249 characters from [a-zA-Z0-9._-]")
        return tuple(sorted(set(topics))), None
    assert pattern is not None
    if not pattern.strip():
        raise StrataSparkOptionError("subscribePattern", "is empty; give a regular expression "
                                     "such as 'events-.*'")
    try:
        re.compile(pattern)
    except re.error as err:
        raise StrataSparkOptionError(
            "subscribePattern", f"{pattern!r} is not a valid regular expression ({err}); "
            "it uses Python's re syntax and must match whole topic names") from None
    return None, pattern


def _offset_spec(name: str, raw: str, subscribe: tuple[str, ...] | None,
                 pattern: str | None, *, ending: bool) -> OffsetSpec:
    text = raw.strip()
    keyword = text.lower()
    if keyword == "latest":
        return "latest"
    if keyword == "earliest":
        if ending:
            raise StrataSparkOptionError(
                name, "earliest is not allowed as an end: the query would read nothing; use "
                "latest or JSON offsets")
        return "earliest"
    if not text.startswith("{"):
        raise StrataSparkOptionError(
            name, f"{raw!r} is not valid; use earliest, latest or JSON such as "
            '{"topic":{"0":23,"1":-2}} (-2: earliest, -1: latest)')
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as err:
        raise StrataSparkOptionError(
            name, f"is not valid JSON ({err.msg} at character {err.pos}); write it as "
            '{"topic":{"0":23,"1":-2}} (-2: earliest, -1: latest)') from None
    example = '{"topic":{"0":23,"1":-2}}'
    if not isinstance(parsed, dict) or not parsed:
        raise StrataSparkOptionError(
            name, f"must be a non-empty JSON object of topics, such as {example}")
    offsets: Offsets = {}
    lowest = LATEST if ending else EARLIEST
    for topic, partitions in parsed.items():
        if subscribe is not None and topic not in subscribe:
            raise StrataSparkOptionError(
                name, f"names topic {topic!r}, which subscribe does not list "
                f"({','.join(subscribe)}); give offsets for subscribed topics only")
        if pattern is not None and (topic.startswith("__")
                                    or re.fullmatch(pattern, topic) is None):
            raise StrataSparkOptionError(
                name, f"names topic {topic!r}, which does not match subscribePattern "
                f"{pattern!r}; give offsets for subscribed topics only")
        if not isinstance(partitions, dict) or not partitions:
            raise StrataSparkOptionError(
                name, f"topic {topic!r} must map to a non-empty object of partition -> "
                f"offset, such as {example}")
        for partition, offset in partitions.items():
            if not isinstance(partition, str) or not partition.isdigit():
                raise StrataSparkOptionError(
                    name, f"partition {partition!r} of topic {topic!r} is not a partition "
                    "number; use strings of whole numbers as keys (\"0\", \"1\", ...)")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < lowest:
                allowed = ">= 0 or -1 for latest" if ending else \
                    ">= 0, -2 for earliest or -1 for latest"
                raise StrataSparkOptionError(
                    name, f"offset {offset!r} of {topic}-{partition} is not valid; use an "
                    f"integer {allowed}")
            offsets[TopicPartition(topic, int(partition))] = offset
    return offsets


def _whole_number(name: str, raw: str, *, minimum: int) -> int:
    text = raw.strip()
    if not _WHOLE_NUMBER.fullmatch(text) or int(text) < minimum:
        raise StrataSparkOptionError(
            name, f"{raw!r} is not valid; use a whole number >= {minimum}")
    return int(text)


def _boolean(name: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text not in ("true", "false"):
        raise StrataSparkOptionError(name, f"{raw!r} is not valid; use true or false")
    return text == "true"


# ----------------------------------------------------------------------------- offsets


def offsets_to_json(offsets: Mapping[TopicPartition, int]) -> OffsetsJson:
    """Offsets in Spark's checkpoint form, in a stable order (topics by name, partitions
    by number), because Spark compares offsets as JSON text."""
    out: OffsetsJson = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def offsets_from_json(value: object, what: str = "offset") -> Offsets:
    """Parse offsets Spark hands back (from ``initialOffset``/``latestOffset`` or a
    checkpoint). Anything else means the checkpoint belongs to another source."""
    if not isinstance(value, dict):
        raise ValueError(f"the {what} {value!r} is not a strata offset "
                         '({"topic": {"partition": offset}}); was this checkpoint written by '
                         "another source? Start the query with a new checkpointLocation")
    out: Offsets = {}
    for topic, partitions in value.items():
        if not isinstance(partitions, dict):
            raise ValueError(f"the {what} {value!r} is not a strata offset; start the query "
                             "with a new checkpointLocation")
        for partition, offset in partitions.items():
            if not str(partition).isdigit() or isinstance(offset, bool) \
                    or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"the {what} {value!r} is not a strata offset; start the "
                                 "query with a new checkpointLocation")
            out[TopicPartition(str(topic), int(partition))] = offset
    return out


def describe(tps: Iterable[TopicPartition]) -> str:
    """``a-0, a-1, b-3``: partitions in messages, in a stable order."""
    return ", ".join(str(tp) for tp in sorted(tps))
