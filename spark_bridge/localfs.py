"""A local Spark session's files without a ``chmod`` process per file.

Hadoop's local file system sets the permissions of every file, checksum file and directory it
creates. Without Hadoop's native library (pyspark ships none) it does so by running ``chmod``:
a process spawned from the JVM for each. A round written to 200 tables creates hundreds of
them: most of its Spark job's time (see bench/README.md, ingest_bench with --tables). The two small classes in
``spark_bridge/hadoop/`` set the permissions through ``java.nio`` instead; :func:`classes`
compiles them once with ``javac`` against the session's Hadoop jar into a jar of their own
(cached by source and jar; a jar, not a directory, so the JVM's class-data archive can hold
them: spark_bridge/class_archive.py), and :func:`session_conf` points a local session's
``file:`` scheme at them. The jar also holds an empty ``yarn-default.xml`` (the file says why),
which shadows Hadoop's: a local session's Hadoop settings are then about half as many.

Without ``javac`` (a JRE only) or when compiling fails, the session keeps Hadoop's own file
system, with a warning: slower for many tables, the same files. A user's own
``spark.hadoop.fs.file.impl`` is never replaced.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

logger = logging.getLogger(__name__)

FILE_SYSTEM_CLASS = "io.icesink.hadoop.NioLocalFileSystem"
SOURCES = sorted((Path(__file__).parent / "hadoop").glob("*.java"))
RESOURCES = sorted((Path(__file__).parent / "hadoop").glob("*.xml"))  # at the jar's root
_COMPILE_TIMEOUT_S = 120


def session_conf(user_conf: Mapping[str, str]) -> dict[str, str]:
    """Confs for a local session to use the compiled file system ({} when unavailable, or the
    user chose ``spark.hadoop.fs.file.impl``)."""
    if "spark.hadoop.fs.file.impl" in user_conf:
        return {}
    compiled = classes()
    if compiled is None:
        return {}
    path = str(compiled)
    if extra := user_conf.get("spark.driver.extraClassPath"):
        path = f"{extra}{os.pathsep}{path}"
    return {"spark.driver.extraClassPath": path, "spark.hadoop.fs.file.impl": FILE_SYSTEM_CLASS}


def cache_root() -> Path:
    """Where icesink keeps what it builds once per machine (``$XDG_CACHE_HOME/icesink``, else
    ``~/.cache/icesink``; a relative ``XDG_CACHE_HOME`` is ignored, as the XDG spec says)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home().absolute() / ".cache") / "icesink"


def classes(cache_dir: Path | None = None) -> Path | None:
    """The jar of the compiled classes (compiled on first use), or None (logged)."""
    jar = _hadoop_jar()
    if jar is None:
        logger.warning("no hadoop-client-api jar found beside pyspark: Spark keeps Hadoop's local file system "
                       "(a chmod process per written file)")
        return None
    digest = hashlib.sha256(jar.name.encode())
    for source in (*SOURCES, *RESOURCES):
        digest.update(source.read_bytes())
    root = cache_dir or cache_root()
    target = root / f"hadoop-localfs-{digest.hexdigest()[:16]}.jar"
    if target.exists():
        return target
    javac = _javac()
    if javac is None:
        logger.warning("javac not found (a JRE only): Spark keeps Hadoop's local file system, which runs a chmod "
                       "process per written file (about 15 ms each; slow for rounds of many tables). Install a "
                       "JDK (openjdk-17-jdk-headless) to avoid it")
        return None
    try:
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".hadoop-localfs-", dir=root))
        try:
            out = work / "classes"
            done = subprocess.run(
                [javac, "-nowarn", "-cp", str(jar), "-d", str(out), *map(str, SOURCES)],
                capture_output=True, text=True, timeout=_COMPILE_TIMEOUT_S, check=False)
            if done.returncode != 0:
                logger.warning("javac could not compile %s (exit %d: %s): Spark keeps Hadoop's local file system",
                               [s.name for s in SOURCES], done.returncode, done.stderr.strip()[-2000:])
                return None
            packed = work / "classes.jar"
            with zipfile.ZipFile(packed, "w") as archive:
                for compiled in sorted(out.rglob("*.class")):
                    archive.write(compiled, compiled.relative_to(out).as_posix())
                for resource in RESOURCES:
                    archive.write(resource, resource.name)
            packed.replace(target)  # atomic; a replica racing this one writes the same classes
        finally:
            shutil.rmtree(work, ignore_errors=True)
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("could not compile the local file system classes (%s): Spark keeps Hadoop's own", exc)
        return None
    logger.info("compiled %s into %s", FILE_SYSTEM_CLASS, target)
    return target


def spark_jar_dirs() -> list[Path]:
    """Where a session's Spark jars are, in the order spark-class looks: ``$SPARK_HOME/jars``,
    then pyspark's own."""
    homes = [Path(os.environ["SPARK_HOME"]) / "jars"] if os.environ.get("SPARK_HOME") else []
    try:
        import pyspark

        homes.append(Path(pyspark.__file__).parent / "jars")
    except ImportError:  # pragma: no cover - pyspark is a dependency
        pass
    return homes


def _hadoop_jar() -> Path | None:
    for home in spark_jar_dirs():
        jars = sorted(home.glob("hadoop-client-api-*.jar"))
        if jars:
            return jars[-1]
    return None


def _javac() -> str | None:
    if java_home := os.environ.get("JAVA_HOME"):
        candidate = Path(java_home) / "bin" / "javac"
        if candidate.exists():
            return str(candidate)
    return shutil.which("javac")
