"""The reference docs are generated from the code; they must match what is committed."""

from __future__ import annotations

from pathlib import Path

from brokers.docgen import render, render_configuration

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_protocol_doc_matches_the_message_schemas() -> None:
    assert (DOCS / "protocol.md").read_text() == render(), \
        "docs/protocol.md is stale: run `python -m brokers.docgen`"


def test_configuration_doc_matches_the_config_keys() -> None:
    assert (DOCS / "configuration.md").read_text() == render_configuration(), \
        "docs/configuration.md is stale: run `python -m brokers.docgen`"
