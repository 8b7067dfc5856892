"""One way to build a SparkSession for Strata: from the repository's ``conf/`` directory.

Why a helper instead of ``SparkSession.builder`` everywhere: the Delta settings, the Delta
JVM package coordinates and the small-machine tuning live in ``conf/spark-defaults.conf``
so notebooks, jobs and tests share one definition. Spark reads that file only through
``SPARK_CONF_DIR`` and only when the JVM starts, so the variable must be set before the
first session in the process; this module does that.

Three more things only a JVM launch can settle, also done here:

* **The loopback.** Left alone, Spark binds the driver (its RPC endpoint and the block
  manager) to the machine's external interface whenever the hostname resolves to
  127.0.0.1 ("Your hostname ... resolves to a loopback address ...; using <address>
  instead"). A session on ``local[...]`` needs no address but the loopback, so
  :func:`loopback_defaults` pins it there, unless the user configured an address
  (``SPARK_LOCAL_IP``, ``SPARK_LOCAL_HOSTNAME``, ``spark.driver.host`` or
  ``spark.driver.bindAddress`` anywhere Spark reads them) or the master is a cluster.
* **A quiet start.** ``spark-submit`` resolves ``spark.jars.packages`` with Ivy and prints
  the whole resolution (settings files, each module found, a report table) to stdout and
  stderr, where a notebook shows it under the analyst's first Spark cell. The JVM's
  stdout and stderr go through pipes here: what it writes before the session is up is
  held back, and only the routine part (Ivy's resolution chatter, the JDK's
  incubator-module notice) is dropped once the start succeeded; a failed start prints
  everything. From then on both are passed through to this process's stdout and stderr
  unchanged.
* **Package jars in place.** A ``local`` session reads the jars ``spark.jars.packages``
  resolved where Ivy put them instead of copying them into ``spark.local.dir`` at each
  start, and any session puts on the Python path only those of them that hold Python
  (:class:`_InPlace`, :func:`_holds_python`).

We deliberately do not use ``delta.configure_spark_with_delta_pip``: it would ask Ivy for
``io.delta:delta-spark_2.13:<pip version>`` (4.4.1), which does not exist on Maven Central
(see docs/dependencies.md). ``conf/spark-defaults.conf`` names the 4.4.0 jar built for
Spark 4.2 instead.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import shlex
import shutil
import struct
import sys
import threading
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

if TYPE_CHECKING:  # pragma: no cover - import only for the annotation
    from pyspark.sql import SparkSession

__all__ = ["BIND_CONF_KEYS", "BIND_ENV_VARS", "IVY_SETTINGS", "LOOPBACK", "REPO_CONF_DIR",
           "configured_packages", "is_startup_noise", "loopback_defaults", "spark_session"]

#: The Spark configuration shipped with the package (``strata_spark/conf/``; the
#: checkout's ``conf/`` is a link to it), so an installed wheel configures Spark as a
#: checkout does.
REPO_CONF_DIR: Path = Path(__file__).resolve().parent / "conf"

#: Ivy settings that resolve ``spark.jars.packages`` only from ``~/.m2`` and the local Ivy
#: cache, so a session starts with no network (see docs/dependencies.md, "Offline").
IVY_SETTINGS: Path = REPO_CONF_DIR / "ivysettings.xml"

#: The address a single-machine session binds its driver to.
LOOPBACK = "127.0.0.1"
#: Spark settings that choose the driver's address; a user who sets any of them is obeyed.
BIND_CONF_KEYS = ("spark.driver.host", "spark.driver.bindAddress")
#: Environment variables that choose it (read by the launch scripts and the JVM).
BIND_ENV_VARS = ("SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME")

_ENV_SCRIPT_SETS_BIND = re.compile(
    r"^\s*(?:export\s+)?(?:" + "|".join(BIND_ENV_VARS) + r")=", re.MULTILINE)

#: What the JVM prints on a successful start that says nothing to the user: Ivy's
#: resolution of spark.jars.packages (settings files, ":: resolving ::", one "found" line
#: per module, the report table, ":: retrieving ::", the artifact count) and the JDK's
#: notice about the incubator module Spark enables.
_STARTUP_NOISE = re.compile(
    rb":: |"
    rb"\t(?:found |confs: |-{5}|\||\d+ artifacts copied|downloading |\[SUCCESSFUL \])|"
    rb"Ivy Default Cache set to: |"
    rb"The jars for the packages stored in: |"
    rb"\S+#\S+ added as a dependency\r?$|"
    rb"WARNING: Using incubator modules: ")


def is_startup_noise(line: str | bytes) -> bool:
    """True for a line of routine JVM start-up output that :func:`spark_session` drops."""
    data = line.encode() if isinstance(line, str) else line
    return _STARTUP_NOISE.match(data.rstrip(b"\n")) is not None


def _properties(path: Path) -> dict[str, str]:
    """A Java properties file as Spark reads spark-defaults.conf (``key value`` or
    ``key=value``, ``#`` and ``!`` comments); missing or unreadable: empty."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        match = re.match(r"([^\s=:]+)\s*[=:\s]\s*(.*)$", line)
        if match:
            out[match.group(1)] = match.group(2).strip()
        else:
            out[line] = ""
    return out


def configured_packages() -> str | None:
    """``spark.jars.packages`` of the configuration a session here starts from
    (``SPARK_CONF_DIR``'s spark-defaults.conf, else the package's): what a session that
    sets the key itself must keep, e.g. Delta's package beside the S3A connector."""
    conf_dir = Path(os.environ.get("SPARK_CONF_DIR") or REPO_CONF_DIR)
    return _properties(conf_dir / "spark-defaults.conf").get("spark.jars.packages")


def _submit_args(text: str) -> tuple[str | None, dict[str, str]]:
    """``--master`` and the ``--conf``/``-c`` settings of ``PYSPARK_SUBMIT_ARGS``."""
    try:
        words = shlex.split(text)
    except ValueError:
        return None, {}
    master: str | None = None
    conf: dict[str, str] = {}
    for i, word in enumerate(words):
        following = words[i + 1] if i + 1 < len(words) else ""
        if word == "--master":
            master = following
        elif word.startswith("--master="):
            master = word.split("=", 1)[1]
        elif word in ("--conf", "-c") and "=" in following:
            key, value = following.split("=", 1)
            conf[key] = value
        elif word.startswith("--conf=") and "=" in word[len("--conf="):]:
            key, value = word[len("--conf="):].split("=", 1)
            conf[key] = value
    return master, conf


def _is_local(master: str) -> bool:
    return master == "local" or master.startswith(("local[", "local-cluster["))


def loopback_defaults(extra_conf: Mapping[str, str] | None = None,
                      environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings :func:`spark_session` adds to keep a one-machine session on the
    loopback: ``spark.driver.host`` and ``spark.driver.bindAddress`` = 127.0.0.1 (it also
    starts the JVM with ``SPARK_LOCAL_IP=127.0.0.1``), or ``{}`` when it must not.

    It must not when the user chose an address (``SPARK_LOCAL_IP`` or
    ``SPARK_LOCAL_HOSTNAME`` in the environment or in ``$SPARK_CONF_DIR/spark-env.sh``;
    ``spark.driver.host`` or ``spark.driver.bindAddress`` in ``extra_conf``,
    ``PYSPARK_SUBMIT_ARGS`` or ``$SPARK_CONF_DIR/spark-defaults.conf``), or when the
    master is not ``local``/``local[N]``/``local-cluster[...]`` (a cluster's executors
    must reach the driver) or the session is a Spark Connect client.
    """
    env = os.environ if environ is None else environ
    extra = dict(extra_conf or {})
    if any(env.get(name) for name in BIND_ENV_VARS):
        return {}
    conf_dir = env.get("SPARK_CONF_DIR") or (
        str(Path(env["SPARK_HOME"]) / "conf") if env.get("SPARK_HOME") else None)
    defaults: dict[str, str] = {}
    if conf_dir:
        defaults = _properties(Path(conf_dir) / "spark-defaults.conf")
        with contextlib.suppress(OSError):
            if _ENV_SCRIPT_SETS_BIND.search((Path(conf_dir) / "spark-env.sh").read_text()):
                return {}
    submit_master, submit_conf = _submit_args(env.get("PYSPARK_SUBMIT_ARGS", ""))
    settings = {**defaults, **submit_conf, **extra}
    if any(settings.get(key) for key in BIND_CONF_KEYS):
        return {}
    if env.get("SPARK_REMOTE") or settings.get("spark.remote"):
        return {}
    master = (extra.get("spark.master") or submit_master or settings.get("spark.master")
              or env.get("MASTER") or "local[*]")
    if not _is_local(master.strip()):
        return {}
    return {key: LOOPBACK for key in BIND_CONF_KEYS}


def _write_fd(fd: int, data: bytes) -> None:
    """Write to file descriptor ``fd`` (1 or 2) as the JVM would have: in a Jupyter kernel
    that is the pipe ipykernel forwards into the running cell's output."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return
        view = view[written:]


class _JvmStream:
    """The launched JVM's stdout or stderr (``target`` 1 or 2): held back while the JVM
    starts, then passed through to the same descriptor of this process."""

    def __init__(self, target: int) -> None:
        self._target = target
        self._read_fd, self.write_fd = os.pipe()
        self._lock = threading.Lock()
        self._held: bytearray | None = bytearray()
        self._reader = threading.Thread(target=self._pump, name=f"strata-spark-fd{target}",
                                        daemon=True)
        self._reader.start()

    def drain(self, timeout: float = 5.0) -> None:
        """After a failed start: wait until everything the (exited) JVM wrote has been
        read, so that ``release`` prints all of it. Our write end must be closed first."""
        self._reader.join(timeout)

    def _pump(self) -> None:
        try:
            while True:
                try:
                    chunk = os.read(self._read_fd, 65536)
                except InterruptedError:
                    continue
                except OSError:
                    return
                if not chunk:  # the JVM and every process it started have exited
                    return
                with self._lock:
                    if self._held is not None:
                        self._held += chunk
                        continue
                _write_fd(self._target, chunk)
        finally:
            os.close(self._read_fd)

    def release(self, started: bool) -> None:
        """Print what was held back: all of it if the start failed, else all but the
        routine start-up lines; from now on everything passes straight through."""
        with self._lock:
            held, self._held = self._held, None
            if not held:
                return
            lines = bytes(held).splitlines(keepends=True)
            _write_fd(self._target, b"".join(line for line in lines
                                             if not started or not is_startup_noise(line)))


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set for the duration (the JVM launch), then restored,
    so processes this one starts later do not inherit them."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _launch_jvm(options: Mapping[str, str]) -> bool:
    """Start the Spark JVM (``spark-submit``, as the builder would) with its stdout and
    stderr through :class:`_JvmStream` (Ivy prints its settings line to stdout, the rest
    to stderr). Nothing to do if this process already has a JVM, or if PySpark is told
    to attach to an existing gateway; returns whether it started one."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return False
    conf = SparkConf()
    for key, value in options.items():
        conf.set(key, value)
    streams = (_JvmStream(1), _JvmStream(2))
    try:
        gateway = launch_gateway(  # type: ignore[no-untyped-call]
            conf, popen_kwargs={"stdout": streams[0].write_fd, "stderr": streams[1].write_fd})
    except BaseException:
        for stream in streams:
            os.close(stream.write_fd)
        # The JVM has exited: read what is left in the pipes before printing, or this
        # process could end (the exception) before the readers saw the last lines.
        for stream in streams:
            stream.drain()
            stream.release(started=False)
        raise
    for stream in streams:
        os.close(stream.write_fd)  # the JVM holds its own copies
    SparkContext._ensure_initialized(gateway=gateway)
    for stream in streams:
        stream.release(started=True)
    return True


#: The settings through which spark-submit hands a session its dependencies, each a
#: comma-separated list: ``spark.jars`` (the executors fetch and load them),
#: ``spark.files`` (the executors fetch them) and ``spark.submit.pyFiles`` (PySpark copies
#: them into the session's files directory and puts ``.jar``/``.zip``/``.egg`` ones on the
#: Python path).
_DEPENDENCY_KEYS = ("spark.jars", "spark.files", "spark.submit.pyFiles")


def _local_path(entry: str) -> str | None:
    """The local file a dependency entry names (``file:`` URI or plain path), else None."""
    if entry.startswith("file:"):
        return unquote(urlparse(entry).path) or None
    if "://" in entry or not entry.startswith("/"):
        return None
    return entry


class _InPlace:
    """Dependencies of a local session read where they are instead of copied.

    spark-submit resolves ``spark.jars.packages`` into jars in Ivy's directory, puts them
    on the driver's class path and also lists each one in ``spark.jars``, ``spark.files``
    and ``spark.submit.pyFiles``. For those three lists Spark copies every jar into the
    session's files directory under ``spark.local.dir`` (the local executor fetches jars
    and files; PySpark copies the Python files) on each start: with the S3A connector,
    whose AWS SDK bundle alone is 686 MB, 741 MB per session, left behind by a driver
    that is killed. On a ``local`` or ``local[N]`` master the executor runs in the
    driver's JVM and loads classes through the driver's class loader, which has the jars
    already, so the copies buy nothing (not so on ``local-cluster[...]``, whose
    executors are JVMs of their own).

    :func:`_dependencies_in_place` therefore removes from the three lists every entry
    that is a local file on the driver's class path (``settings``), and :meth:`link`
    gives the files directory a symbolic link to each instead of a copy, with the Python
    path entries PySpark would have made for the jars that hold Python (on any master,
    the others stay off the Python path where Spark still delivers them as files:
    :func:`_holds_python`): ``SparkFiles.get`` and imports from a package jar behave as
    before. Everything else (a cluster master's copies, a remote or non-jar entry, a
    class loader this cannot read) is left to Spark. Spark deletes the files directory
    with ``rm -rf`` semantics at stop, removing the links, never their targets.
    """

    def __init__(self, settings: dict[str, str], files: list[str], python: list[str]) -> None:
        self.settings = settings
        self._files = files
        self._python = python

    def link(self, session: SparkSession) -> None:
        if not self._files:
            return
        from pyspark import SparkFiles

        context = session.sparkContext
        root = Path(SparkFiles.getRootDirectory())
        for path in self._files:
            target = root / Path(path).name
            if target.exists() or target.is_symlink():
                continue
            try:
                target.symlink_to(path)
            except OSError:
                shutil.copyfile(path, target)
        includes = context._python_includes
        if includes is None:
            return
        for path in self._python:
            name = Path(path).name
            if name not in includes:
                includes.append(name)
                sys.path.insert(1, str(root / name))


def _holds_python(path: str) -> bool:
    """Whether the zip archive (jar) at ``path`` has a ``.py`` or ``.pyc`` entry, i.e.
    whether it can make anything importable from the Python path.

    PySpark puts every jar of ``spark.submit.pyFiles`` on the Python path of the driver
    and of each Python worker, ahead of site-packages, so every later import reads the
    central directory of each jar first: importing pyarrow and the client took 0.8 CPU-s
    more with the 40 jars of Delta and Spark's Kafka connector on the path, 4.5 more
    with the S3A connector's three added (its AWS SDK bundle has a 52 MB directory). Only
    the central directory is searched (mapped, not read); a name ending in ``.py`` or
    ``.pyc`` holds the bytes ``.py``, so an archive without them holds no Python, and one
    with them is listed properly. An archive this cannot parse counts as holding Python,
    which is what PySpark assumes of every jar.
    """
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0,
                                                 access=mmap.ACCESS_READ) as data:
            end = data.rfind(b"PK\x05\x06", max(0, len(data) - 65_557))
            if end < 0:
                return True
            size, offset = struct.unpack_from("<II", data, end + 12)
            if 0xFFFFFFFF in (size, offset):  # zip64: the sizes are in its own record
                end64 = data.rfind(b"PK\x06\x06", 0, end)
                if end64 < 0:
                    return True
                size, offset = struct.unpack_from("<QQ", data, end64 + 40)
            if offset + size > len(data) or data[offset:offset + 4] != b"PK\x01\x02":
                return True
            if data.find(b".py", offset, offset + size) < 0:
                return False
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith((".py", ".pyc")) for name in archive.namelist())
    except (OSError, ValueError, struct.error, zipfile.BadZipFile):
        return True


def _dependencies_in_place(options: Mapping[str, str], launched: bool) -> _InPlace:
    """What :class:`_InPlace` changes for the session about to be built with ``options``
    in the JVM this process started (``launched``: by this call): on a ``local`` or
    ``local[N]`` master, the jars on the driver's class path are linked instead of
    copied; on any master, a jar of ``spark.submit.pyFiles`` without Python in it that
    Spark still delivers through ``spark.files`` is left off the Python path
    (:func:`_holds_python`).

    The lists come from the JVM's system properties when the JVM was launched by this
    call (spark-submit merged the caller's lists with the resolved packages there, so
    they replace the caller's raw ones); for a later session in a running JVM, from the
    caller's ``options`` where it names them (what the builder would have applied).
    """
    from pyspark import SparkContext

    nothing = _InPlace({}, [], [])
    jvm = SparkContext._jvm
    if jvm is None or SparkContext._active_spark_context is not None:
        return nothing
    system = jvm.System
    master = (options.get("spark.master") or system.getProperty("spark.master") or "").strip()
    # Not local-cluster[...]: its executors are JVMs of their own, without the driver's
    # class loader, and need Spark's copies.
    local = master == "local" or master.startswith("local[")
    on_class_path: set[str] = set()
    if local:
        try:
            loader = jvm.Thread.currentThread().getContextClassLoader()
            on_class_path = {unquote(urlparse(str(url)).path) for url in loader.getURLs()
                             if str(url).startswith("file:")}
        except Exception:  # py4j errors: not a URLClassLoader, or the JVM went away
            on_class_path = set()

    def listed(key: str) -> list[str]:
        value = (system.getProperty(key) if launched or key not in options
                 else options[key]) or ""
        return [e.strip() for e in value.split(",") if e.strip()]

    shipped_as_files = {_local_path(e) for e in listed("spark.files")}
    settings: dict[str, str] = {}
    files: list[str] = []
    python: list[str] = []
    for key in _DEPENDENCY_KEYS:
        entries = listed(key)
        kept: list[str] = []
        for entry in entries:
            path = _local_path(entry)
            if path is None or not os.path.isfile(path):
                kept.append(entry)
                continue
            in_place = path in on_class_path
            if in_place and path not in files:
                files.append(path)
            if key == "spark.submit.pyFiles":
                if path.lower().endswith(".jar") and not _holds_python(path):
                    # Nothing to import. Dropped where SparkFiles still has it (a link, or
                    # Spark's copy through spark.files); else Spark copies it as before.
                    if not (in_place or path in shipped_as_files):
                        kept.append(entry)
                    continue
                if in_place and path.lower().endswith((".jar", ".zip", ".egg")):
                    python.append(path)
            if not in_place:
                kept.append(entry)
        if len(kept) != len(entries) or (launched and key in options):
            settings[key] = ",".join(kept)
    return _InPlace(settings, files, python)


def spark_session(app_name: str, extra_conf: Mapping[str, str] | None = None) -> SparkSession:
    """Return a SparkSession configured from ``conf/spark-defaults.conf``.

    ``SPARK_CONF_DIR`` is pointed at the repository's ``conf/`` unless the caller already
    set it (an operator's own configuration wins), and ``PYSPARK_PYTHON`` at this
    interpreter unless set, so Spark's Python workers run in the same environment.
    ``extra_conf`` overrides single keys, e.g. ``{"spark.sql.shuffle.partitions": "1"}``.

    A ``local`` session binds its driver to 127.0.0.1 unless the user chose an address
    (:func:`loopback_defaults`), and the JVM's routine start-up output (Ivy's resolution
    of the Delta package) is not printed.

    If a session already exists in this process it is returned (Spark allows one
    SparkContext per JVM) with those ``extra_conf`` keys applied that are runtime SQL
    settings; the others need a new JVM and are left alone.
    """
    if "SPARK_CONF_DIR" not in os.environ and REPO_CONF_DIR.is_dir():
        os.environ["SPARK_CONF_DIR"] = str(REPO_CONF_DIR)
    # Spark starts its Python workers (UDFs, the strata data source) with PYSPARK_PYTHON,
    # else the first ``python3`` on PATH, which outside an activated venv is a system
    # Python without pyarrow or this project. The JVM inherits the variable at launch.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from pyspark.sql import SparkSession

    existing = SparkSession.getActiveSession()
    if existing is not None:
        for key, value in (extra_conf or {}).items():
            if existing.conf.isModifiable(key):
                existing.conf.set(key, value)
        return existing

    options = {"spark.app.name": app_name}
    if os.environ.get("SPARK_CONF_DIR") == str(REPO_CONF_DIR) and IVY_SETTINGS.is_file():
        # Must be an absolute path; spark-defaults.conf cannot express "next to this file".
        options["spark.jars.ivySettings"] = str(IVY_SETTINGS)
    pinned = loopback_defaults(extra_conf)
    options.update(pinned)
    options.update(extra_conf or {})
    # SPARK_LOCAL_IP also reaches what the two conf keys do not: the address Spark looks
    # up for itself at start (the loopback warning) and the local executor's host name.
    with _environment({"SPARK_LOCAL_IP": LOOPBACK} if pinned else {}):
        # A JVM lives as long as this process and keeps its launch options as system
        # properties that every later SparkContext reads: a session's SQL settings go
        # to its builder only, or the next session here (a notebook after the tier
        # pass, a test module after another) would inherit them.
        launched = _launch_jvm(
            {k: v for k, v in options.items() if not k.startswith("spark.sql.")})
        in_place = _dependencies_in_place(options, launched)
        options.update(in_place.settings)
        builder = SparkSession.builder
        for key, value in options.items():
            builder = builder.config(key, value)
        session: SparkSession = builder.getOrCreate()
    in_place.link(session)
    return session
