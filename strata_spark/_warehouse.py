"""Where the Delta warehouse lives: a local directory, or a prefix of an S3 bucket.

Accepted by :meth:`Warehouse.parse` everywhere a warehouse is named: ``strata up
--warehouse``, ``strata tier run --warehouse``, ``TierSettings``, the notebooks' helpers
(what ``strata status`` records), and the Spark source's tier reader (the table URI
ZooKeeper records):

=============================== ===============================================
``/data/warehouse``, ``wh``      a local directory (relative: from the current one)
``file:///data/warehouse``       the same, as a URI
``s3://bucket[/prefix]``         S3 or an S3-compatible store (``s3a://`` means
                                 the same; Spark is given ``s3a://``, delta-rs
                                 ``s3://``)
=============================== ===============================================

Refused with ``InvalidWarehouseError`` (``INVALID_WAREHOUSE``, 1405) before anything
is read or written: any other scheme (``abfss://``, ``gs://``: Strata's readers do not
reach them yet, docs/deployment.md §10), credentials in the URI
(``s3://KEY:SECRET@bucket``: they would end up in argv, in logs and in ``strata
status``), a port, query or fragment, and a bucket name S3 does not accept.

**Credentials and endpoint** never come from the URI: they come from where every AWS
SDK looks (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``,
``AWS_PROFILE`` and ``~/.aws``, an instance role; ``AWS_REGION`` or
``AWS_DEFAULT_REGION``) and, for an S3-compatible store, ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL``. Spark's S3A connector reads the credentials through its default
provider chain, so :meth:`Warehouse.spark_conf` holds no secret: only the connector
jar, the endpoint, path-style access and whether TLS is used. delta-rs reads the same
variables itself; :meth:`Warehouse.storage_options` adds only ``AWS_ALLOW_HTTP`` for an
``http://`` endpoint. Settings a user gives Spark (``spark.hadoop.fs.s3a.*``) win over
these.

**Who may commit**: every Delta commit on the store must be a put-if-absent of the next
log file, or two writers could both commit version N and one commit would silently
replace the other. :meth:`Warehouse.unsafe_settings` refuses (``UNSAFE_WAREHOUSE``, 1407)
the settings known to turn it into an overwrite: delta-rs's
``AWS_S3_ALLOW_UNSAFE_RENAME=true`` and S3A's ``fs.s3a.create.performance=true``.

Thread-safety: a ``Warehouse`` is immutable; the environment is read when a method is
called.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from strata_spark._session import configured_packages
from wire.errors import StrataError

__all__ = ["HADOOP_AWS_PACKAGE", "InvalidWarehouseError", "UnsafeWarehouseError", "Warehouse",
           "s3_endpoint"]

#: The S3A connector matching the Hadoop client jars of pyspark 4.2.0 (Hadoop 3.5.0);
#: it brings the AWS SDK v2 bundle. The set-up (scripts/setup.sh) puts both in ~/.m2.
HADOOP_AWS_PACKAGE: Final = "org.apache.hadoop:hadoop-aws:3.5.0"

#: S3's bucket naming rules (general purpose buckets): 3-63 characters of lower-case
#: letters, digits, dots and hyphens, starting and ending with a letter or digit.
_BUCKET: Final = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SUPPORTED: Final = "a directory, file:///path or s3://bucket[/prefix]"


class InvalidWarehouseError(StrataError):
    """A warehouse location Strata cannot use: an unsupported scheme, credentials or a
    port in the URI, or an invalid bucket name. Nothing was read or written."""

    code = 1405
    name = "INVALID_WAREHOUSE"


class UnsafeWarehouseError(StrataError):
    """The settings would let two writers both commit one version of a Delta table on the
    object store (one commit silently replacing the other). Nothing was written."""

    code = 1407
    name = "UNSAFE_WAREHOUSE"


#: Settings under which a commit to an S3 table is no longer a put-if-absent (see
#: ``Warehouse.unsafe_settings``): (key, the value that makes it unsafe, why); the first
#: tuple is checked in the environment, the second in a Spark session's settings.
_UNSAFE_ENV: Final = (
    ("AWS_S3_ALLOW_UNSAFE_RENAME", "true",
     "delta-rs then commits with a plain PUT, which replaces a version another writer "
     "just committed"),
)
_UNSAFE_SPARK: Final = (
    ("spark.hadoop.fs.s3a.create.performance", "true",
     "S3A then turns Delta's create-if-absent of the next log file into an overwrite"),
)


def s3_endpoint() -> str | None:
    """The S3-compatible endpoint the environment names (``AWS_ENDPOINT_URL_S3``, else
    ``AWS_ENDPOINT_URL``), or None for AWS itself."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


@dataclass(frozen=True, slots=True)
class Warehouse:
    """One warehouse location: ``path`` for a local one, ``bucket`` and ``prefix`` (no
    leading or trailing slash, may be empty) for S3."""

    path: Path | None = None
    bucket: str | None = None
    prefix: str = ""

    @classmethod
    def parse(cls, text: str | os.PathLike[str]) -> Warehouse:
        """Parse a warehouse location (see the module docstring); raises
        ``InvalidWarehouseError`` with what to write instead."""
        raw = os.fspath(text)
        if not raw.strip():
            raise InvalidWarehouseError(f"the warehouse location is empty; give {_SUPPORTED}")
        if "://" not in raw:
            return cls(path=Path(raw).expanduser().absolute())
        parts = urlsplit(raw)
        scheme = parts.scheme.lower()
        if parts.query or parts.fragment:
            raise InvalidWarehouseError(
                f"warehouse {cls._shown(raw)!r} has a query or fragment; give {_SUPPORTED}")
        if scheme == "file":
            if parts.netloc not in ("", "localhost"):
                raise InvalidWarehouseError(
                    f"warehouse {raw!r} names host {parts.netloc!r}; a file:// warehouse is "
                    "a local path (file:///path): mount shared storage at the same path "
                    "on every host instead")
            if not parts.path.startswith("/"):
                raise InvalidWarehouseError(f"warehouse {raw!r}: file:// needs an absolute "
                                            "path (file:///path)")
            return cls(path=Path(parts.path))
        if scheme in ("s3", "s3a"):
            if "@" in parts.netloc or parts.password is not None:
                raise InvalidWarehouseError(
                    f"warehouse {cls._shown(raw)!r} carries credentials; give s3://bucket"
                    "[/prefix] and put them in the environment (AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE), where Spark and delta-rs "
                    "find them and no log or `strata status` shows them")
            if ":" in parts.netloc:
                raise InvalidWarehouseError(
                    f"warehouse {raw!r} names a port; an S3-compatible store's address "
                    "goes in AWS_ENDPOINT_URL (e.g. http://127.0.0.1:9000), the URI keeps "
                    "s3://bucket[/prefix]")
            bucket = parts.netloc
            if not _BUCKET.match(bucket) or ".." in bucket:
                raise InvalidWarehouseError(
                    f"warehouse {raw!r}: {bucket!r} is not a valid S3 bucket name (3-63 "
                    "lower-case letters, digits, dots and hyphens, starting and ending "
                    "with a letter or digit)")
            prefix = parts.path.strip("/")
            if any(segment in ("", ".", "..") for segment in prefix.split("/")) and prefix:
                raise InvalidWarehouseError(
                    f"warehouse {raw!r}: the prefix {prefix!r} has an empty, '.' or '..' "
                    "segment")
            return cls(bucket=bucket, prefix=prefix)
        raise InvalidWarehouseError(
            f"warehouse {cls._shown(raw)!r}: the {scheme!r} scheme is not supported; give "
            f"{_SUPPORTED} (docs/deployment.md, section 10)")

    @staticmethod
    def _shown(raw: str) -> str:
        """``raw`` with any ``user:password@`` part of it masked, for messages."""
        return re.sub(r"(://)[^/@]*@", r"\1***@", raw)

    # ------------------------------------------------------------------ locations
    @property
    def is_local(self) -> bool:
        return self.path is not None

    @property
    def uri(self) -> str:
        """The canonical form: the absolute path, or ``s3://bucket[/prefix]``."""
        if self.path is not None:
            return str(self.path)
        return self.delta_uri()

    def delta_uri(self, *parts: str) -> str:
        """Where delta-rs (and pyarrow) reach ``parts`` under the warehouse: a local
        path, or ``s3://bucket/prefix/...``."""
        if self.path is not None:
            return str(self.path.joinpath(*parts))
        return "s3://" + "/".join(p for p in (self.bucket, self.prefix, *parts) if p)

    def spark_uri(self, *parts: str) -> str:
        """Where Spark reaches ``parts``: a local path, or ``s3a://bucket/prefix/...``."""
        if self.path is not None:
            return str(self.path.joinpath(*parts))
        return "s3a://" + "/".join(p for p in (self.bucket, self.prefix, *parts) if p)

    def __str__(self) -> str:
        return self.uri

    # ------------------------------------------------------------------ clients
    def storage_options(self) -> dict[str, str]:
        """delta-rs ``storage_options``: empty for a local warehouse; for S3, only
        ``AWS_ALLOW_HTTP`` when the endpoint is plain HTTP (delta-rs reads the
        credentials, region and endpoint from the environment itself)."""
        if self.path is not None:
            return {}
        endpoint = s3_endpoint()
        if endpoint is not None and endpoint.lower().startswith("http://"):
            return {"AWS_ALLOW_HTTP": "true"}
        return {}

    def unsafe_settings(self, spark_conf: dict[str, str] | None = None) -> None:
        """Raise ``UnsafeWarehouseError`` when, for an object-store warehouse, the
        environment or ``spark_conf`` (a session's settings) turns a Delta commit into
        something other than a put-if-absent, so that two writers could both commit
        version N. A local warehouse has nothing to check (its commits are atomic
        creates)."""
        if self.path is not None:
            return
        found = [(f"the environment's {key}={os.environ[key]}", why)
                 for key, bad, why in _UNSAFE_ENV
                 if os.environ.get(key, "").strip().lower() == bad]
        found += [(f"Spark's {key}={(spark_conf or {})[key]}", why)
                  for key, bad, why in _UNSAFE_SPARK
                  if str((spark_conf or {}).get(key, "")).strip().lower() == bad]
        if found:
            what, why = found[0]
            raise UnsafeWarehouseError(
                f"warehouse {self.uri}: {what} is not safe for Delta commits on an object "
                f"store: {why}. Remove it; Strata's commits rely on S3's conditional writes "
                "(If-None-Match), which S3 and current S3-compatible stores provide "
                "(docs/deployment.md, section 10)")

    def spark_conf(self, packages: str | None = None) -> dict[str, str]:
        """Spark settings a session needs for this warehouse: for S3, the S3A connector
        added to ``packages`` (default: the configured ``spark.jars.packages``, which
        names Delta's; ``configured_packages``) and, with an
        S3-compatible endpoint, that endpoint with path-style access and TLS as its
        scheme says. Never a credential (S3A's default chain reads the environment)."""
        if self.path is not None:
            return {}
        if packages is None:
            packages = configured_packages()
        listed = [p.strip() for p in (packages or "").split(",") if p.strip()]
        if HADOOP_AWS_PACKAGE not in listed:
            listed.append(HADOOP_AWS_PACKAGE)
        conf = {"spark.jars.packages": ",".join(listed)}
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        endpoint = s3_endpoint()
        if endpoint is not None:
            conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
            conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
            conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = \
                str(endpoint.lower().startswith("https://")).lower()
        if region:
            conf["spark.hadoop.fs.s3a.endpoint.region"] = region
        return conf
