"""Options and output helpers shared by the client-side commands."""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

from wire.security import PLAINTEXT, SECURITY_PROPERTIES, ClientSecurity

__all__ = ["CommandError", "add_bootstrap", "add_format", "bootstrap_of", "emit_json",
           "load_command_config", "render_bytes", "parse_key_values", "parse_non_negative_int",
           "parse_seconds", "security_of_args"]

BOOTSTRAP_ENV = "STRATA_BOOTSTRAP"
COMMAND_CONFIG_ENV = "STRATA_COMMAND_CONFIG"


class CommandError(Exception):
    """A user-fixable problem; the CLI prints it without a traceback and exits 1."""


def add_bootstrap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap", default=None, metavar="HOST:PORT[,...]",
        help=f"brokers to contact first (default: ${BOOTSTRAP_ENV})")
    parser.add_argument(
        "--command-config", default=None, metavar="FILE",
        help="client security settings, key=value lines: security.protocol, sasl.mechanism, "
        "sasl.username, sasl.password (or sasl.jaas.config), ssl.ca.location, "
        "ssl.certificate.location, ssl.key.location (default: $" + COMMAND_CONFIG_ENV + ")")


def load_command_config(path: str) -> ClientSecurity:
    """The ``ClientSecurity`` a ``--command-config`` file describes (docs/security.md)."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise CommandError(f"cannot read --command-config {path}: {err.strerror}") from None
    properties: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "!")):
            continue
        key, sep, value = stripped.partition("=")
        if not sep:
            raise CommandError(f"{path}:{number}: expected key=value, got {line!r}")
        properties[key.strip()] = value
    try:
        return ClientSecurity.from_properties(properties)
    except KeyError as err:
        raise CommandError(
            f"--command-config {path}: unknown key {err.args[0]!r}; use "
            f"{', '.join([*SECURITY_PROPERTIES, 'sasl.jaas.config'])}") from None
    except ValueError as err:
        raise CommandError(f"--command-config {path}: {err}") from None


def security_of_args(args: argparse.Namespace) -> ClientSecurity:
    """How the command reaches the brokers: ``--command-config``, else the file named by
    ``$STRATA_COMMAND_CONFIG``, else PLAINTEXT."""
    path = getattr(args, "command_config", None) or os.environ.get(COMMAND_CONFIG_ENV, "")
    return load_command_config(path) if path else PLAINTEXT


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


def read_password(password_file: str | None, what: str = "password") -> str:
    """The first line of ``password_file``, else of standard input: never the command
    line, where other users could read it in ``ps``."""
    if password_file:
        try:
            with open(password_file, encoding="utf-8") as source:
                text = source.readline()
        except OSError as err:
            raise CommandError(f"cannot read --password-file {password_file}: "
                               f"{err.strerror}") from None
    else:
        text = sys.stdin.readline()
    password = text.rstrip("\r\n")
    if not password:
        raise CommandError(f"no {what} given: write it to --password-file or pipe one line "
                           "to standard input")
    return password
