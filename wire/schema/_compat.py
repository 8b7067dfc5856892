"""Compatibility between schema versions, with Avro's schema resolution rules applied to
the ``Node`` tree (so JSON Schema gets the same rules, "required" playing the part of
"not nullable, no default").

A reader can read a writer's data when, recursively: every reader field is in the
writer or has a default or is optional; a field the writer may leave null is nullable
for the reader; leaf types are equal or a promotion (``PROMOTIONS``); a reader enum has
every writer symbol; fixed sizes and decimal precision/scale are equal. BACKWARD: the
new schema reads the old data; FORWARD: the old schema reads the new data; FULL: both.
Pure functions: thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from wire.errors import InvalidConfigError
from wire.schema._convert import PROMOTIONS
from wire.schema._model import Compatibility, Kind, Node, ParsedSchema, join

_DIRECTIONS = {
    Compatibility.BACKWARD: ("BACKWARD",), Compatibility.BACKWARD_TRANSITIVE: ("BACKWARD",),
    Compatibility.FORWARD: ("FORWARD",), Compatibility.FORWARD_TRANSITIVE: ("FORWARD",),
    Compatibility.FULL: ("BACKWARD", "FORWARD"),
    Compatibility.FULL_TRANSITIVE: ("BACKWARD", "FORWARD"),
}
_TRANSITIVE = {Compatibility.BACKWARD_TRANSITIVE, Compatibility.FORWARD_TRANSITIVE,
               Compatibility.FULL_TRANSITIVE}


def check_compatibility(new: ParsedSchema, previous: Sequence[ParsedSchema],
                        level: Compatibility | str, *,
                        version_numbers: Sequence[int] | None = None) -> list[str]:
    """Why ``new`` breaks ``level`` against ``previous`` (oldest first); [] if it does not.
    Reasons name ``version N``: ``version_numbers[i]`` for ``previous[i]`` (the
    registry's numbers), by default ``i + 1``."""
    try:
        wanted = Compatibility(str(level).upper())
    except ValueError:
        raise InvalidConfigError(f"compatibility level {level!r} is not one of "
                                 f"{', '.join(Compatibility)}") from None
    numbers = list(version_numbers) if version_numbers is not None \
        else list(range(1, len(previous) + 1))
    if len(numbers) != len(previous):
        raise ValueError("version_numbers must number each previous schema")
    if wanted is Compatibility.NONE or not previous:
        return []
    pairs = list(zip(numbers, previous, strict=True))
    if wanted not in _TRANSITIVE:
        pairs = pairs[-1:]
    reasons: list[str] = []
    for number, old in pairs:
        if old.schema_type != new.schema_type:
            reasons.append(f"version {number}: the schema type changes from {old.schema_type} "
                           f"to {new.schema_type}; a subject's versions share one schema "
                           "type: register it under a new subject")
            continue
        for direction in _DIRECTIONS[wanted]:
            backward = direction == "BACKWARD"
            context = _Context(number, backward)
            reader, writer = (new, old) if backward else (old, new)
            context.read(writer.root, reader.root, "", reasons)
    return list(dict.fromkeys(reasons))


@dataclass(frozen=True)
class _Context:
    version: int
    backward: bool  # reader = new, writer = old; otherwise the other way round

    @property
    def direction(self) -> str:
        return "BACKWARD" if self.backward else "FORWARD"

    def read(self, writer: Node, reader: Node, path: str, out: list[str]) -> None:
        """Appends why ``reader`` cannot read ``writer``'s data at ``path``."""
        if writer.kind is reader.kind is Kind.RECORD:
            for field in reader.fields:
                source = writer.by_name.get(field.name)
                field_path = join(path, field.name)
                if source is None:
                    if not (field.has_default or field.nullable):
                        out.append(self.unfilled(field_path))
                    continue
                if source.nullable and not field.nullable:
                    out.append(self.null_refused(field_path))
                self.read(source.node, field.node, field_path, out)
            return
        if writer.kind is reader.kind and writer.kind in (Kind.ARRAY, Kind.MAP):
            assert writer.element is not None and reader.element is not None
            element_path = path + ("[]" if writer.kind is Kind.ARRAY else "{}")
            if writer.element_nullable and not reader.element_nullable:
                out.append(self.null_refused(element_path))
            self.read(writer.element, reader.element, element_path, out)
            return
        if writer.kind is reader.kind is Kind.ENUM:
            unknown = [s for s in writer.symbols if s not in reader.symbols]
            if unknown:
                out.append(self.symbols_unknown(path, unknown))
            return
        if writer.kind is reader.kind and writer.arrow == reader.arrow:
            return
        if reader.kind in PROMOTIONS.get(writer.kind, frozenset()):
            return
        out.append(self.type_changed(path, writer, reader))

    def unfilled(self, path: str) -> str:
        v = self.version
        if self.backward:
            return (f"version {v}: field '{path}' is new and has no default; the new schema "
                    f"cannot fill it in data written with version {v} (BACKWARD): give it a "
                    "default or make it optional")
        return (f"version {v}: field '{path}' is removed, and version {v} gives it no default; "
                f"readers of version {v} cannot fill it in new data (FORWARD): keep the "
                "field, or first register a version that gives it a default")

    def null_refused(self, path: str) -> str:
        v = self.version
        if self.backward:
            return (f"version {v}: field '{path}' is no longer nullable, but data written with "
                    f"version {v} may hold null there (BACKWARD): keep it optional")
        return (f"version {v}: field '{path}' becomes nullable, but readers of version {v} "
                "need a value there (FORWARD): keep it required")

    def symbols_unknown(self, path: str, unknown: list[str]) -> str:
        v = self.version
        if self.backward:
            return (f"version {v}: field '{path}' drops enum symbols {unknown} that data "
                    f"written with version {v} may hold (BACKWARD): keep them")
        return (f"version {v}: field '{path}' adds enum symbols {unknown} that readers of "
                f"version {v} do not know (FORWARD): keep the symbols, or lower the "
                "subject's compatibility to BACKWARD")

    def type_changed(self, path: str, writer: Node, reader: Node) -> str:
        v = self.version
        old, new = (writer, reader) if self.backward else (reader, writer)
        who = (f"the new schema cannot read data written with version {v}" if self.backward
               else f"readers of version {v} cannot read new data")
        return (f"version {v}: field '{path}' changed type from {old.label} to {new.label}; "
                f"{who} ({self.direction}): keep the type, or add a field under a new name")
