"""spark_bridge/localfs.py: the nio local file system classes are compiled once with the real
javac and cached; without javac the session keeps Hadoop's own, said in the log; a user's own
``spark.hadoop.fs.file.impl`` is kept."""

from __future__ import annotations

import logging
import shutil
import zipfile
from pathlib import Path

import pytest

from spark_bridge import localfs

pytestmark = pytest.mark.skipif(shutil.which("javac") is None, reason="needs javac (./dev installs a JDK)")


def test_classes_are_compiled_once_and_then_taken_from_the_cache(tmp_path: Path, monkeypatch) -> None:
    compiled = localfs.classes(tmp_path)
    assert compiled is not None and compiled.parent == tmp_path and compiled.suffix == ".jar"
    with zipfile.ZipFile(compiled) as jar:  # a jar, not a directory: a class-data archive can hold it
        assert sorted(jar.namelist()) == ["io/icesink/hadoop/NioLocalFileSystem.class",
                                          "io/icesink/hadoop/NioRawLocalFileSystem.class", "yarn-default.xml"]
        assert b"<configuration/>" in jar.read("yarn-default.xml")  # no setting: shadows Hadoop's
    monkeypatch.setattr(localfs, "_javac", lambda: None)  # no compiler needed the second time
    assert localfs.classes(tmp_path) == compiled
    assert [p.name for p in tmp_path.iterdir()] == [compiled.name]  # no work directory left


def test_without_javac_the_session_keeps_hadoops_file_system_and_says_so(
    tmp_path: Path, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(localfs, "_javac", lambda: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="spark_bridge.localfs"):
        assert localfs.classes(tmp_path / "empty") is None
        assert localfs.session_conf({}) == {}
    assert "javac not found" in caplog.text and "chmod" in caplog.text


def test_session_conf_keeps_the_users_file_system_and_class_path(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert localfs.session_conf({"spark.hadoop.fs.file.impl": "x.Y"}) == {}
    conf = localfs.session_conf({"spark.driver.extraClassPath": "/opt/extra.jar"})
    assert conf["spark.hadoop.fs.file.impl"] == localfs.FILE_SYSTEM_CLASS
    first, second = conf["spark.driver.extraClassPath"].split(":")
    assert first == "/opt/extra.jar" and Path(second).parent == tmp_path / "icesink"
