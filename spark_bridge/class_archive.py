"""A class-data-sharing archive for the local Spark session's JVM.

Each start of a local session's JVM loads, parses and verifies the same ten thousand-odd
classes of Spark, Hadoop, Parquet and Arrow: much of the time a session takes to start, and
as much again of CPU in its first writes, which on a replica that starts behind a backlog share
the cores with reading it (see bench/README.md, ingest_bench). Java's class-data sharing (JDK 13+) keeps those
classes, already parsed and verified, in an archive file that every later JVM maps instead.

:func:`build` makes the archive in a JVM of its own: a throw-away local session started with
``-XX:ArchiveClassesAtExit``, which writes the warm-up's classes (its plain and partitioned
writes) to the file when that JVM exits (``icesink spark-archive``, run by ``./dev`` and the image build).
:func:`with_archive` then adds ``-XX:SharedArchiveFile`` to a local session's JVM options when
an archive exists for its JVM and class path. The archive's name is a digest of both (the java
binary, every jar of the Spark distribution, the extra class path, the environment variables
that add to it), so a changed JDK or Spark is never given an archive made for another; the JVM
checks the archive itself too, and without ``-Xshare:on`` starts without it, with a warning,
when it does not match. Without an archive a session starts as before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from spark_bridge.localfs import cache_root, spark_jar_dirs

logger = logging.getLogger(__name__)

PREFIX = "spark-classes-"
JAVA_OPTIONS = "spark.driver.extraJavaOptions"  # the driver JVM's options (spark_bridge/session.py)
_CLASS_PATH = "spark.driver.extraClassPath"
# What else spark-class puts on the JVM's class path (launcher's AbstractCommandBuilder).
_CLASS_PATH_ENV = ("SPARK_HOME", "SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH",
                   "SPARK_CLASSPATH")
_EXIT_TIMEOUT_S = 300
_KEEP = 4  # archives kept in the cache, about 170 MB each


def archive_path(conf: Mapping[str, str], root: Path | None = None) -> Path | None:
    """The archive for a session started with ``conf`` (it may not exist yet), or None when
    the java binary or the Spark jars cannot be found."""
    java, jars = _java(), _spark_jars()
    if java is None or jars is None:
        return None
    digest = hashlib.sha256()
    for path in [java, *sorted(jars.glob("*.jar"))]:
        st = path.stat()
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    digest.update(f"{_CLASS_PATH}={conf.get(_CLASS_PATH, '')}\n".encode())
    for name in _CLASS_PATH_ENV:
        digest.update(f"{name}={os.environ.get(name, '')}\n".encode())
    return (root or cache_root()) / f"{PREFIX}{digest.hexdigest()[:16]}.jsa"


def with_archive(conf: Mapping[str, str], root: Path | None = None) -> dict[str, str]:
    """``conf`` with the archive added to the driver's JVM options when it exists (logged)."""
    out = dict(conf)
    path = archive_path(conf, root)
    if path is None or not path.exists():
        logger.info("spark: no class-data archive for this JVM and class path: `icesink spark-archive` builds one "
                    "(a local session then starts in about half the time)")
        return out
    out[JAVA_OPTIONS] = f"{conf.get(JAVA_OPTIONS, '')} -XX:SharedArchiveFile={option_value(path)}".strip()
    logger.info("spark: the JVM is given the class-data archive %s", path)
    return out


def session_archive(master: str = "local[2]", conf: Mapping[str, str] | None = None,
                    root: Path | None = None) -> Path | None:
    """The archive a worker's local session of ``conf`` looks for (it may not exist yet)."""
    from spark_bridge.session import SparkSessionOwner, SparkSettings

    return archive_path(SparkSessionOwner(SparkSettings(master=master, conf=dict(conf or {}))).startup_conf(), root)


def build(master: str = "local[2]", conf: Mapping[str, str] | None = None, root: Path | None = None) -> Path | None:
    """Build the archive for a local session of ``conf`` unless it exists; its path, or None
    when it cannot be built (said in the log). Starts a Spark session: call it in a process
    whose JVM has not started yet, and only once (the archive is written when that JVM exits,
    which this call ends)."""
    from pyspark import SparkContext

    from spark_bridge.session import SparkSessionOwner, SparkSettings
    from spark_bridge.writer import SparkFileWriter

    if SparkContext._gateway is not None:
        raise RuntimeError("build() needs a process whose Spark JVM has not started yet")
    settings = SparkSettings(master=master, conf=dict(conf or {}), app_name="icesink-class-archive",
                             warm_up_rows=20_000, class_archive=False)
    base = SparkSessionOwner(settings).startup_conf()
    target = archive_path(base, root)
    if target is None:
        logger.warning("no java binary or Spark jars found: no class-data archive")
        return None
    if target.exists():
        logger.info("class-data archive %s exists", target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    # -Xlog:cds=off: the dump names every class it leaves out (signed jars, generated classes).
    dump = f"{base.get(JAVA_OPTIONS, '')} -XX:ArchiveClassesAtExit={option_value(partial)} -Xlog:cds=off".strip()
    writer = SparkFileWriter(dataclasses.replace(settings, conf={**settings.conf, JAVA_OPTIONS: dump}))
    try:
        writer.start()
        writer.warm_up()  # the unpartitioned write path, then a write into partition directories
        writer.stop()
        # The JVM leaves when its stdin closes (PythonGatewayServer), writing the archive then.
        gateway = SparkContext._gateway
        proc = gateway.proc  # type: ignore[attr-defined]
        proc.stdin.close()
        code = proc.wait(timeout=_EXIT_TIMEOUT_S)
        if code != 0 or not partial.exists():
            logger.warning("the JVM exited with %s and left %s: no class-data archive", code,
                           "it" if partial.exists() else "no archive")
            return None
        partial.replace(target)  # atomic: a JVM never maps a half-written archive
    except Exception as exc:  # noqa: BLE001 - an optimisation: the worker starts without it
        logger.warning("could not build the class-data archive: %s", exc)
        return None
    finally:
        partial.unlink(missing_ok=True)
    _prune(target)
    logger.info("built the class-data archive %s (%.0f MB)", target, target.stat().st_size / 1e6)
    return target


def _prune(kept: Path) -> None:
    """Delete all but the newest few archives beside ``kept`` (other JDKs, Sparks or checkouts
    of the machine); a JVM that maps a deleted one keeps its pages."""
    others = sorted((p for p in kept.parent.glob(f"{PREFIX}*.jsa") if p != kept),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in others[_KEEP - 1:]:
        stale.unlink(missing_ok=True)


def option_value(path: Path) -> str:
    """``path`` as one word of a JVM options string (Spark's launcher splits it at blanks and
    honours double quotes)."""
    text = str(path)
    if not any(c.isspace() or c in "\"'\\" for c in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _java() -> Path | None:
    """The java binary spark-class runs: ``$JAVA_HOME/bin/java``, else ``java`` on the PATH."""
    java_home = os.environ.get("JAVA_HOME")
    found = str(Path(java_home, "bin", "java")) if java_home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def _spark_jars() -> Path | None:
    return next((home for home in spark_jar_dirs() if home.is_dir()), None)
