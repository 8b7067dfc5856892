"""Options and output helpers shared by the client-side commands."""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from typing import Any

__all__ = ["CommandError", "add_bootstrap", "add_format", "bootstrap_of", "emit_json",
           "render_bytes", "parse_key_values", "parse_non_negative_int", "parse_seconds"]

BOOTSTRAP_ENV = "STRATA_BOOTSTRAP"


class CommandError(Exception):
    """A user-fixable problem; the CLI prints it without a traceback and exits 1."""


def add_bootstrap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap", default=None, metavar="HOST:PORT[,...]",
        help=f"brokers to contact first (default: ${BOOTSTRAP_ENV})")


def add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=("text", "json"), default="text")


def bootstrap_of(args: argparse.Namespace) -> str:
    value = args.bootstrap or os.environ.get(BOOTSTRAP_ENV, "")
    if not value:
        raise CommandError(
            f"no brokers given: pass --bootstrap HOST:PORT or export {BOOTSTRAP_ENV} "
            "(`strata up` prints it)")
    return str(value)


def render_bytes(data: bytes | None) -> tuple[str | None, str | None]:
    """(text, encoding): UTF-8 text when the bytes decode, else base64; None stays None."""
    if data is None:
        return None, None
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, sort_keys=False) + "\n")


def parse_key_values(items: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"{what} expects key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def parse_non_negative_int(text: str) -> int | None:
    """``"12"`` -> 12; None for anything but plain decimal digits (no sign, no spaces)."""
    return int(text) if text.isascii() and text.isdigit() else None


def parse_seconds(text: str, option: str) -> float:
    """A positive number of seconds, or ``CommandError`` naming ``option``."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise CommandError(f"{option} expects a number of seconds above 0, got {text!r}")
    return value
