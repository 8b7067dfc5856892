"""The optional parts of the package (pip extras) and the error when one is missing.

The core install (``pip install strata``) is what a broker host needs. ``strata[spark]``
adds the Spark source and sink, the tiering job and the ZooKeeper jars that ship inside
the pyspark wheel; ``strata[gateway]`` the HTTP ingest gateway; ``strata[notebooks]`` the
analysts' notebooks; ``strata[all]`` everything (what ``strata up`` runs on one machine).
A command that needs a part that is not installed fails with one line naming the extra,
instead of an ``ImportError`` traceback.
"""

from __future__ import annotations

import importlib.util
from typing import Final

__all__ = ["EXTRA_MODULES", "MissingExtraError", "extra_for_missing_module", "require"]

#: The modules each extra provides (the top-level import names of its requirements).
EXTRA_MODULES: Final = {
    "spark": ("pyspark", "delta", "deltalake", "pandas"),
    "gateway": ("fastapi", "uvicorn", "httptools", "uvloop", "msgspec"),
    "notebooks": ("matplotlib", "ipykernel"),
}


class MissingExtraError(RuntimeError):
    """A command needs an extra that is not installed; the message says which."""


def _advice(extra: str, module: str, what: str) -> str:
    return (f"{what} needs the '{extra}' extra, which is not installed (no module "
            f"'{module}'): pip install 'strata[{extra}]' (or 'strata[all]' for everything)")


def extra_for_missing_module(error: ModuleNotFoundError) -> str | None:
    """The one-line advice for an import that failed because an extra is missing, or
    None when the missing module belongs to no extra (a real bug)."""
    top = (error.name or "").split(".")[0]
    for extra, modules in EXTRA_MODULES.items():
        if top in modules:
            return _advice(extra, top, "this command")
    return None


def require(extra: str, what: str) -> None:
    """Raise :class:`MissingExtraError` unless every module of ``extra`` is importable.

    A lookup that fails rather than answering (a process that ran Spark keeps the jars
    of its stopped session on ``sys.path``, and looking into a deleted one raises) is
    not taken as a missing extra: the import itself then says what is wrong."""
    for module in EXTRA_MODULES[extra]:
        try:
            found = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            found = None
        except (ImportError, OSError, ValueError):
            continue
        if found is None:
            raise MissingExtraError(_advice(extra, module, what))
