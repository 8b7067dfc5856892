"""The schema registry's state as loaded from ``__schemas``-0 (brokers/schema_registry.py):
what the records that survive compaction, or a stricter parser, leave it knowing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from brokers.schema_registry import _State
from wire.errors import InvalidSchemaError

pytestmark = pytest.mark.unit

SCHEMA = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a",
                                                                "type": "int"}]})


def _version(subject: str, version: int, schema_id: int, schema: str = SCHEMA
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    return ({"keytype": "SCHEMA", "subject": subject, "version": version},
            {"subject": subject, "version": version, "id": schema_id, "schema": schema,
             "deleted": False})


def test_compacted_deletes_keep_the_next_id() -> None:
    """Ids 1..3 were given out, id 3's version deleted permanently, and compaction then
    dropped both its record and its tombstone: the IDS record still says 4."""
    state = _State(0)
    state.apply(*_version("a-value", 1, 1))
    state.apply({"keytype": "IDS", "subject": ""}, {"next_id": 4})
    assert state.next_id == 4
    state.apply({"keytype": "IDS", "subject": ""}, {"next_id": 2})  # never lowers it
    assert state.next_id == 4


def test_an_unreadable_record_still_holds_its_id_and_version() -> None:
    """A record this loader cannot parse (a stricter parser after an upgrade) is
    skipped, but its id and version number are never handed out again."""
    state = _State(0)
    state.apply(*_version("b-value", 1, 1))
    with pytest.raises(InvalidSchemaError):  # the loader logs it and goes on
        state.apply(*_version("b-value", 2, 7, schema='{"type": "nonsense"}'))
    assert state.next_id == 8
    assert state.last_version["b-value"] == 2
    assert sorted(state.subjects["b-value"]) == [1]
