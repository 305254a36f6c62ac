"""spark_bridge/class_archive.py without a JVM: the archive is named after the java binary, the
Spark jars and the class path, so a changed JDK, Spark or class path never gets an archive made
for another; a session's JVM options gain it only when it exists."""

from __future__ import annotations

import logging
import os
import shlex
from pathlib import Path

import pytest

from spark_bridge import class_archive


@pytest.fixture
def jdk_and_spark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    java_home, spark_home = tmp_path / "jdk", tmp_path / "spark"
    (java_home / "bin").mkdir(parents=True)
    (java_home / "bin" / "java").write_text("#!/bin/sh\n")
    (spark_home / "jars").mkdir(parents=True)
    for name in ("spark-core.jar", "parquet-hadoop.jar"):
        (spark_home / "jars" / name).write_bytes(b"PK")
    monkeypatch.setenv("JAVA_HOME", str(java_home))
    monkeypatch.setenv("SPARK_HOME", str(spark_home))
    for name in ("SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH", "SPARK_CLASSPATH"):
        monkeypatch.delenv(name, raising=False)
    return java_home, spark_home


def test_the_archive_is_named_after_the_jvm_the_jars_and_the_class_path(
    jdk_and_spark: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    java_home, spark_home = jdk_and_spark
    root = tmp_path / "cache"
    first = class_archive.archive_path({}, root)
    assert first is not None and first.parent == root and first.name.startswith("spark-classes-")
    assert class_archive.archive_path({"spark.sql.shuffle.partitions": "4"}, root) == first  # not on the class path
    names: set[Path | None] = {first}
    jar = spark_home / "jars" / "spark-core.jar"
    jar.write_bytes(b"PK-newer-spark")  # another Spark
    names.add(class_archive.archive_path({}, root))
    os.utime(java_home / "bin" / "java", ns=(1, 1))  # another JDK build
    names.add(class_archive.archive_path({}, root))
    names.add(class_archive.archive_path({"spark.driver.extraClassPath": "/opt/x.jar"}, root))
    monkeypatch.setenv("HADOOP_CONF_DIR", "/etc/hadoop")  # spark-class adds it to the class path
    names.add(class_archive.archive_path({}, root))
    assert len(names) == 5


def test_without_java_there_is_no_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-such-jdk"))
    assert class_archive.archive_path({}, tmp_path) is None
    assert class_archive.with_archive({"a": "b"}, tmp_path) == {"a": "b"}


def test_a_session_maps_the_archive_only_when_it_exists(
    jdk_and_spark: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cache"
    conf = {"spark.driver.extraJavaOptions": "-XX:+ExitOnOutOfMemoryError", "spark.ui.enabled": "false"}
    with caplog.at_level(logging.INFO, logger="spark_bridge.class_archive"):
        assert class_archive.with_archive(conf, root) == conf
    assert "icesink spark-archive" in caplog.text
    path = class_archive.archive_path(conf, root)
    assert path is not None
    root.mkdir()
    path.write_bytes(b"archive")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="spark_bridge.class_archive"):
        out = class_archive.with_archive(conf, root)
    assert out == {**conf, "spark.driver.extraJavaOptions": f"-XX:+ExitOnOutOfMemoryError -XX:SharedArchiveFile={path}"}
    assert str(path) in caplog.text
    assert class_archive.with_archive({}, root)["spark.driver.extraJavaOptions"] == f"-XX:SharedArchiveFile={path}"


@pytest.mark.parametrize("path", ["/cache/spark-classes-1.jsa", "/home/a user/.cache/x.jsa", '/odd"dir\\name/it\'s.jsa'])
def test_an_archive_path_stays_one_word_of_the_jvm_options(path: str) -> None:
    # Spark's launcher splits spark.driver.extraJavaOptions at blanks, honouring quotes and
    # backslashes as a POSIX shell does (CommandBuilderUtils.parseOptionString).
    options = f"-XX:+ExitOnOutOfMemoryError -XX:SharedArchiveFile={class_archive.option_value(Path(path))}"
    assert shlex.split(options) == ["-XX:+ExitOnOutOfMemoryError", f"-XX:SharedArchiveFile={path}"]


def test_a_new_archive_keeps_the_newest_few_of_other_checkouts(tmp_path: Path) -> None:
    for age, name in enumerate(["a", "b", "c", "d", "e"]):
        path = tmp_path / f"spark-classes-{name}.jsa"
        path.write_bytes(b"x")
        os.utime(path, (1000 - age, 1000 - age))  # a is the newest
    (tmp_path / "hadoop-localfs-1.jar").write_bytes(b"PK")
    kept = tmp_path / "spark-classes-new.jsa"
    kept.write_bytes(b"x")
    class_archive._prune(kept)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "hadoop-localfs-1.jar", "spark-classes-a.jsa", "spark-classes-b.jsa", "spark-classes-c.jsa",
        "spark-classes-new.jsa"]
