"""The reference docs are generated from the code; they must match what is committed."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest

import wire.protocol
from brokers.docgen import render, render_configuration, with_kafka_apis
from wire.protocol import apis, messages

#: Every API family module under wire/protocol/apis/ (a new one is found by itself).
FAMILIES = [importlib.import_module(f"wire.protocol.apis.{m.name}")
            for m in pkgutil.iter_modules(apis.__path__)]

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_protocol_doc_matches_the_message_schemas() -> None:
    assert (DOCS / "protocol.md").read_text() == render(), \
        "docs/protocol.md is stale: run `python -m brokers.docgen`"


def test_kafka_compatibility_doc_lists_the_served_apis() -> None:
    text = (DOCS / "kafka-compatibility.md").read_text()
    assert text == with_kafka_apis(text), \
        "docs/kafka-compatibility.md's API table is stale: run `python -m brokers.docgen`"


def test_configuration_doc_matches_the_config_keys() -> None:
    assert (DOCS / "configuration.md").read_text() == render_configuration(), \
        "docs/configuration.md is stale: run `python -m brokers.docgen`"


@pytest.mark.parametrize("family", FAMILIES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_message_family_is_exported_whole(family: ModuleType) -> None:
    """The rendered schemas come from ``wire.protocol.messages``: it re-exports each API
    family module's names, and lists every one of them in its ``__all__``."""
    names = set(family.__all__)
    assert names <= set(messages.__all__), sorted(names - set(messages.__all__))
    for name in names:
        assert getattr(messages, name) is getattr(family, name) is getattr(wire.protocol, name)


def test_the_message_index_lists_nothing_but_the_families_and_the_registry() -> None:
    assert len(FAMILIES) >= 12  # the package was found (transactions is the 12th)
    named = {n for family in FAMILIES for n in family.__all__}
    registry = {"API_VERSIONS", "ApiKey", "REQUEST_TYPES", "RESPONSE_TYPES"}
    assert set(messages.__all__) == named | registry
    assert len(messages.__all__) == len(set(messages.__all__))
