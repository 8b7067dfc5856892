"""Render ``docs/protocol.md`` and ``docs/configuration.md`` from the code.

``python -m brokers.docgen`` rewrites both files; a test fails when the committed files
differ from what the code says, so the reference docs cannot drift.
"""

from __future__ import annotations

import inspect
import re
import sys

from wire.errors import __all__ as _error_names
from wire.errors import error_for_code
from wire.protocol import codec
from wire.protocol.codec import Array, Field, Message, Struct, WireType
from wire.protocol.messages import (
    API_VERSIONS,
    REQUEST_TYPES,
    RESPONSE_TYPES,
    ApiKey,
    ErrorResponse,
    RequestHeader,
    ResponseHeader,
)

_PRIMITIVES: dict[int, str] = {
    id(codec.INT8): "int8",
    id(codec.INT16): "int16",
    id(codec.INT32): "int32",
    id(codec.INT64): "int64",
    id(codec.BOOL): "bool",
    id(codec.STRING): "string",
    id(codec.NULLABLE_STRING): "nullable string",
    id(codec.BYTES): "bytes",
    id(codec.NULLABLE_BYTES): "nullable bytes",
    id(codec.RECORDS): "records",
}

INTRO = """# Strata wire protocol

Generated from `wire/protocol/messages.py` by `python -m brokers.docgen`; a
test fails if this file and the code disagree.

## Frames

Every request and response is a frame: an `int32` size (bytes that follow, big-endian),
then a header, then a body. The broker rejects a request frame larger than
`socket.request.max.bytes` (default 100 MiB) or smaller than a request header by
closing that connection, before reading the frame.

Requests on one connection may be pipelined. The broker may answer them in any order;
clients match answers to requests by `correlation_id`. A Produce with `acks=0` gets no
answer at all, unless the request fails as a whole (see the response header below).

Below each API's schema, its request and response classes say what the fields mean
and which error each partition or topic can report. Errors are per partition (or per
topic for the admin APIs): one failing partition does not fail the others.

### Primitive types

| type | encoding |
|---|---|
| int8, int16, int32, int64 | big-endian two's complement, 1/2/4/8 bytes |
| bool | int8, 0 or 1 (anything else is INVALID_REQUEST) |
| string | int16 length n ≥ 0, then n bytes of UTF-8 |
| nullable string | int16 length, -1 for null |
| bytes | int32 length n ≥ 0, then n bytes |
| nullable bytes | int32 length, -1 for null |
| records | nullable bytes holding whole record batches (`docs/format.md`); \
fetched records go out with `sendfile` straight from the segment files |
| [T] | int32 count n ≥ 0 (-1 for null where marked nullable), then n values of T |

Decoding checks every length and count against the bytes that remain in the frame
before allocating anything, so a frame can never make a decoder allocate more than its
own size.

### Versions

Each API has a version range (`ApiVersions` returns it). A field added in a later
version is marked "since vN" below; older clients neither send nor receive it.
Current ranges:

"""

HEADERS = """
## Request header

{request}

## Response header

{response}

`error_code` 0 means the API's response body follows. Any other code means the request
failed as a whole (unknown API, unsupported version, undecodable body, broker fault)
and this body follows instead:

{error}
"""


def _type_name(t: WireType) -> str:
    if isinstance(t, Array):
        inner = _type_name(t.item)
        return f"[{inner}]" + (" (nullable)" if t.nullable else "")
    if isinstance(t, Struct):
        return t.cls.__name__
    return _PRIMITIVES.get(id(t), type(t).__name__)


def _nested(t: WireType) -> list[type[Message]]:
    if isinstance(t, Array):
        return _nested(t.item)
    if isinstance(t, Struct):
        return [t.cls]
    return []


def _table(cls: type[Message]) -> str:
    lines = ["| field | type | since |", "|---|---|---|"]
    for f in cls.FIELDS:
        assert isinstance(f, Field)
        lines.append(f"| `{f.name}` | {_type_name(f.type)} | v{f.since} |")
    if len(lines) == 2:
        lines.append("| (empty body) | | |")
    return "\n".join(lines)


def _doc_markdown(doc: str) -> list[str]:
    """A class docstring as Markdown blocks.

    Blank lines separate paragraphs, a line starting with ``- `` starts a list item,
    other lines continue the current paragraph or item, and RST double backquotes
    become Markdown single ones.
    """
    blocks = []
    for paragraph in re.split(r"\n\s*\n", inspect.cleandoc(doc)):
        lines: list[str] = []
        for line in paragraph.splitlines():
            text = line.strip()
            if not lines or text.startswith("- "):
                lines.append(text)
            else:
                lines[-1] += " " + text
        blocks.append("\n".join(lines).replace("``", "`"))
    return blocks


def _render_message(cls: type[Message], seen: set[type[Message]]) -> list[str]:
    out = [f"#### {cls.__name__}", ""]
    doc = (cls.__doc__ or "").strip()
    if doc and not doc.startswith(cls.__name__ + "("):
        for block in _doc_markdown(doc):
            out += [block, ""]
    out += [_table(cls), ""]
    seen.add(cls)
    for f in cls.FIELDS:
        for nested in _nested(f.type):
            if nested not in seen:
                out += _render_message(nested, seen)
    return out


def render() -> str:
    parts = [INTRO, "| API | key | versions |", "|---|---:|---|"]
    for key, (low, high) in API_VERSIONS.items():
        parts.append(f"| {key.name} | {int(key)} | {low}..{high} |")
    parts.append(HEADERS.format(request=_table(RequestHeader), response=_table(ResponseHeader),
                                error=_table(ErrorResponse)))
    parts.append("## APIs\n")
    for key in ApiKey:
        seen: set[type[Message]] = set()
        parts.append(f"### {key.name} (key {int(key)})\n")
        parts.append("Request:\n")
        parts += _render_message(REQUEST_TYPES[key], seen)
        parts.append("Response:\n")
        parts += _render_message(RESPONSE_TYPES[key], seen)
    parts.append("## Error codes\n")
    parts.append("| code | name | meaning | retriable |")
    parts.append("|---:|---|---|---|")
    import wire.errors as errors_module

    rows = {}
    for name in _error_names:
        cls = getattr(errors_module, name)
        # Only codes that travel on the wire; start-up errors (11xx that stop a broker)
        # never reach a client.
        if isinstance(cls, type) and hasattr(cls, "code") and error_for_code(cls.code) is cls:
            rows[cls.code] = cls
    for code in sorted(rows):
        cls = rows[code]
        doc = " ".join((cls.__doc__ or "").split())
        parts.append(f"| {code} | {cls.name} | {doc} | {'yes' if cls.retriable else 'no'} |")
    return "\n".join(parts).rstrip() + "\n"


CONFIG_INTRO = """# Strata configuration

Generated from `brokers/config.py` and `brokers/log/config.py` by
`python -m brokers.docgen`; a test fails if this file and the code disagree.

## Broker configuration

A broker reads, in increasing precedence: the defaults below, a properties file
(`strata broker start --config FILE`, `key=value` lines, `#` comments), environment
variables `STRATA_<KEY>` (upper case, dots as underscores: `STRATA_LOG_SEGMENT_BYTES`
sets `log.segment.bytes`), then flags (`--override key=value`, and the shortcuts
`--broker-id`, `--host`, `--port`, `--data-dir`, `--zookeeper`, `--metrics-port`).
Only variables named after a known key are read. Unknown keys and out-of-range values
stop the broker with a message naming the key.

A key `log.<topic key>` sets the broker-wide default of that topic key (`log.retention.ms`
is the default of `retention.ms`; see "Topic configuration" below). Not every key starting
with `log.` is one: `log.dirs`, `log.retention.check.interval.ms` and
`log.flush.scheduler.interval.ms` are broker keys of their own.

"""

TOPIC_INTRO = """
## Topic configuration

Set at creation (`strata topic create NAME -c key=value`) or later
(`strata topic alter-config NAME --set key=value --delete key`); a topic without an
override uses the broker's `log.<key>` default. Unknown keys and bad values are
rejected before anything is written.

"""


def render_configuration() -> str:
    from brokers.config import BrokerConfig
    from brokers.log.config import TOPIC_CONFIG_KEYS, LogConfig

    parts = [CONFIG_INTRO, "| key | default | meaning |", "|---|---|---|"]
    for key, default, meaning in BrokerConfig.describe():
        parts.append(f"| `{key}` | `{default}` | {meaning} |")
    parts.append(TOPIC_INTRO)
    parts.append("| key | default | accepted | meaning |")
    parts.append("|---|---|---|---|")
    defaults = LogConfig()
    for key, spec in TOPIC_CONFIG_KEYS.items():
        parts.append(f"| `{key}` | `{getattr(defaults, spec.attribute)}` | {spec.accepted} | "
                     f"{spec.doc} |")
    return "\n".join(parts).rstrip() + "\n"


KAFKA_TABLE_START = "<!-- generated by `python -m brokers.docgen`: the served APIs -->"
KAFKA_TABLE_END = "<!-- end of the generated table -->"


def render_kafka_apis() -> str:
    """The API table of docs/kafka-compatibility.md (between its two markers)."""
    from brokers.kafka.codec import API_TYPES, NOTES, VERSIONS

    rows = [KAFKA_TABLE_START, "",
            "| key | API | advertised | served | notes |", "|---:|---|---|---|---|"]
    for key, (low, high, accepted) in sorted(VERSIONS.items()):
        name = API_TYPES[key][0].__name__.removesuffix("Request")
        rows.append(f"| {key} | {name} | {low}-{high} | {accepted}-{high} | "
                    f"{NOTES.get(key, '')} |")
    rows += ["", KAFKA_TABLE_END]
    return "\n".join(rows)


def with_kafka_apis(text: str) -> str:
    """``text`` (docs/kafka-compatibility.md) with its generated table brought up to date."""
    start, end = text.index(KAFKA_TABLE_START), text.index(KAFKA_TABLE_END)
    return text[:start] + render_kafka_apis() + text[end + len(KAFKA_TABLE_END):]


def main() -> None:
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs"
    (docs / "protocol.md").write_text(render())
    (docs / "configuration.md").write_text(render_configuration())
    kafka = docs / "kafka-compatibility.md"
    kafka.write_text(with_kafka_apis(kafka.read_text()))
    sys.stdout.write(f"wrote {docs / 'protocol.md'}, {docs / 'configuration.md'} and the "
                     f"API table of {kafka}\n")


if __name__ == "__main__":
    main()
