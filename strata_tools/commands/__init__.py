"""Subcommands of the ``strata`` CLI; each module exposes ``register(subparsers)``."""
