"""The class-data archive with real JVMs: ``icesink spark-archive`` builds it in a throw-away
session's JVM; a later local session's JVM maps it, proven by ``-Xshare:on``, under which a JVM
that cannot map its archive does not start; and a damaged archive under the default
(``-Xshare:auto``) costs the start-up time it saves, never the session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SESSION = """
import logging
import sys
logging.basicConfig(level=logging.INFO)
from spark_bridge.session import SparkSettings
from spark_bridge.writer import SparkFileWriter
writer = SparkFileWriter(SparkSettings(master="local[1]", warm_up_rows=0,
                                       conf={"spark.driver.extraJavaOptions": sys.argv[1]}))
writer.start()
spark = writer.spark
args = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
print("jvm options:", " ".join(str(a) for a in args))
print("rows:", spark.range(1000).count())
writer.stop()
"""


def _run(args: list[str], cache: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_a_built_archive_is_mapped_by_later_sessions_and_a_damaged_one_is_not_fatal(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    built = _run(["-m", "icesink", "spark-archive"], cache)
    assert built.returncode == 0, built.stderr[-3000:]
    archive = Path(built.stdout.strip().splitlines()[-1])
    assert archive.parent == cache / "icesink" and archive.name.startswith("spark-classes-")
    assert archive.stat().st_size > 10_000_000  # the loaded classes of Spark, Hadoop, Parquet, Arrow
    assert sorted(p.name for p in archive.parent.iterdir() if p.suffix == ".jsa" or p.name.startswith(".")) == [
        archive.name]  # no partial dump left beside it
    again = _run(["-m", "icesink", "spark-archive"], cache)
    assert again.returncode == 0 and again.stdout.strip() == str(archive) and "exists" in again.stderr
    check = _run(["-m", "icesink", "spark-archive", "--check"], cache)
    assert check.returncode == 0 and check.stdout.strip() == str(archive)
    assert _run(["-m", "icesink", "spark-archive", "--check"], tmp_path / "empty").returncode == 1

    mapped = _run(["-c", SESSION, "-Xshare:on"], cache)  # -Xshare:on: map the archive or do not start
    assert mapped.returncode == 0, mapped.stderr[-3000:]
    assert f"-XX:SharedArchiveFile={archive}" in mapped.stdout and "rows: 1000" in mapped.stdout
    assert "is given the class-data archive" in mapped.stderr

    archive.chmod(0o644)
    archive.write_bytes(b"not an archive" * 1000)
    strict = _run(["-c", SESSION, "-Xshare:on"], cache)
    assert strict.returncode != 0  # the check above can fail: a JVM that cannot map it does not start
    lenient = _run(["-c", SESSION, "-XX:+ExitOnOutOfMemoryError"], cache)  # the default -Xshare:auto
    assert lenient.returncode == 0, lenient.stderr[-3000:]
    assert "rows: 1000" in lenient.stdout
