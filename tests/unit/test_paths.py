"""Paths from settings (issue 40): ``worker.id`` is a plain name; every path-valued setting is
absolute once loaded; the staging directory's clean-up deletes only what icesink made; writes
that keep failing stop the replica after a bounded number of capped-backoff attempts."""

import asyncio
import logging
from pathlib import Path

import pytest

from icesink.shared.config import build, load_settings
from icesink.shared.errors import ConfigError

BASE = {"topics": "t", "iceberg.tables": "db.t"}


@pytest.mark.parametrize("value", ["/tmp/x", "../x", "a/b", "..", ".", "", "x y", "-x", ".hidden", "a\\b", "é", "a" * 129])
def test_a_worker_id_that_is_not_a_plain_name_is_refused_naming_the_key_the_value_and_what_is_valid(value):
    with pytest.raises(ConfigError) as err:
        build({**BASE, "worker.id": value})
    assert err.value.key == "worker.id" and err.value.value == value
    assert "a plain name" in str(err.value) and repr(value) in str(err.value)


def test_a_worker_id_from_the_environment_is_checked_too():
    with pytest.raises(ConfigError, match="'worker.id'"):
        load_settings(environ={"ICESINK_TOPICS": "t", "ICESINK_WORKER_ID": "../../etc"})


@pytest.mark.parametrize("value", ["w1", "host-1.example_2", "A" * 128, "a..b"])
def test_plain_worker_ids_are_kept(value):
    assert build({**BASE, "worker.id": value}).worker_id == value


def test_the_default_worker_id_of_a_replica_is_a_plain_name_whatever_the_host_is_called(tmp_path, monkeypatch):
    import socket

    from prometheus_client import CollectorRegistry

    from agents.worker import Worker
    from icesink.app.files import spark_files
    from icesink.shared.metrics import Metrics

    monkeypatch.setattr(socket, "gethostname", lambda: "../odd host/name")
    w = Worker(build({**BASE, "state.dir": str(tmp_path)}), "127.0.0.1:1", Metrics(CollectorRegistry()),
               files=spark_files)
    build({**BASE, "worker.id": w.worker_id})  # valid
    assert "/" not in w.worker_id and not w.worker_id.startswith(".")


def test_every_path_setting_is_absolute_once_loaded_and_stays_put_when_the_directory_changes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = build({**BASE, "ssl.cafile": "tls/ca.pem", "ssl.certfile": "tls/me.pem", "ssl.keyfile": "./tls/me.key",
               "iceberg.catalog.warehouse": "wh", "iceberg.catalog.uri": "sqlite:///cat/catalog.db"})
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert s.state_dir == tmp_path / "var"  # the default, relative to where the worker started
    assert (s.ssl_cafile, s.ssl_certfile, s.ssl_keyfile) == (
        str(tmp_path / "tls/ca.pem"), str(tmp_path / "tls/me.pem"), str(tmp_path / "tls/me.key"))
    assert s.catalog_props["warehouse"] == str(tmp_path / "wh")
    assert s.catalog_props["uri"] == f"sqlite:///{tmp_path}/cat/catalog.db"
    assert build({**BASE, "state.dir": "a/../b"}).state_dir == tmp_path / "elsewhere" / "b"


@pytest.mark.parametrize(("key", "value"), [
    ("iceberg.catalog.warehouse", "s3://lake/wh"), ("iceberg.catalog.warehouse", "file:///abs/wh"),
    ("iceberg.catalog.warehouse", "/abs/wh"), ("iceberg.catalog.uri", "sqlite:////abs/c.db"),
    ("iceberg.catalog.uri", "sqlite:///:memory:"), ("iceberg.catalog.uri", "postgresql+psycopg2://u@h/db"),
    ("iceberg.catalog.uri", "http://rest:8181"), ("iceberg.catalog.warehouse", "lake"),
])
def test_values_that_are_not_relative_local_paths_are_kept(tmp_path, monkeypatch, key, value):
    monkeypatch.chdir(tmp_path)
    props = {**BASE, key: value}
    if value == "lake":  # a REST catalog's warehouse names a warehouse, not a directory
        props["iceberg.catalog.type"] = "rest"
    assert build(props).catalog_props[key.removeprefix("iceberg.catalog.")] == value


# The staging directory --------------------------------------------------------------------


def test_a_staging_directory_is_made_with_a_marker_and_only_icesinks_leftovers_are_cleared(tmp_path):
    from spark_bridge.staging import MARKER, claim, scratch

    root = claim(tmp_path / "state" / "staging" / "w1")
    assert root.is_absolute() and (root / MARKER).is_file()
    left = scratch(root, "icesink-tables-")
    (left / "out").mkdir()
    (left / "out" / "part-0.parquet").write_bytes(b"x")
    (root / "notes.txt").write_text("someone else's")
    assert claim(root) == root  # the next start: a crash's scratch directory goes, nothing else
    assert not left.exists() and (root / "notes.txt").read_text() == "someone else's"


def test_a_staging_directory_icesink_did_not_make_is_never_emptied(tmp_path, caplog):
    from spark_bridge.staging import MARKER, claim

    root = tmp_path / "mine"
    (root / "icesink-tables-abc").mkdir(parents=True)
    (root / "icesink-tables-abc" / "data").write_text("precious")
    with caplog.at_level(logging.WARNING):
        assert claim(root) == root
    assert (root / "icesink-tables-abc" / "data").read_text() == "precious"
    assert not (root / MARKER).exists() and "not made by icesink" in caplog.text
    empty = tmp_path / "empty"
    empty.mkdir()
    claim(empty)  # an empty directory is adopted: nothing in it to lose
    assert (empty / MARKER).is_file()


def test_scratch_directories_are_absolute_under_a_relative_base(tmp_path, monkeypatch):
    from spark_bridge.staging import scratch

    monkeypatch.chdir(tmp_path)
    made = scratch(Path("rel"), "icesink-warm-up-")
    assert made.is_absolute() and made.parent == tmp_path / "rel" and made.as_uri().startswith("file:///")
    assert scratch(None, "icesink-x-").is_absolute()


# Writes that keep failing ------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_write_failures_back_off_capped_and_give_up_at_the_limit():
    from agents.write_failures import WriteFailures

    clock = Clock()
    f = WriteFailures(limit=4, backoff_s=5, backoff_cap_s=12, clock=clock)
    assert f.wait_s() == 0 and f.status() is None
    waits = []
    for i in range(3):
        assert not f.failed(RuntimeError(f"disk full {i}"))
        waits.append(f.wait_s())
        clock.now += f.wait_s()
        assert f.wait_s() == 0
    assert waits == [5, 10, 12]  # doubling, capped
    st = f.status()
    assert st is not None and st["in_a_row"] == 3 and st["limit"] == 4 and "disk full 2" in st["last_error"]
    assert f.failed(RuntimeError("disk full 3"))  # the limit: give up
    assert "failed 4 times in a row" in f.reason() and "disk full 3" in f.reason() and "27 s" in f.reason()


def test_the_reason_keeps_what_a_jvm_error_says_without_its_stack_frames():
    from agents.write_failures import WriteFailures

    f = WriteFailures(limit=1, clock=Clock())
    assert f.failed(RuntimeError("Spark failed: An error occurred while calling o1.parquet.\n"
                                 ": java.io.IOException: Mkdirs failed\n\tat org.apache.A.b(A.java:1)\n"
                                 "\tat org.apache.C.d(C.java:2)\n\t... 12 more\nCaused by: x.Y: disk full"))
    assert f.reason().endswith("RuntimeError: Spark failed: An error occurred while calling o1.parquet.\n"
                               ": java.io.IOException: Mkdirs failed\nCaused by: x.Y: disk full")


def test_a_success_resets_the_failures():
    from agents.write_failures import WriteFailures

    clock = Clock()
    f = WriteFailures(limit=2, backoff_s=5, clock=clock)
    assert not f.failed(OSError("storage unavailable"))
    f.succeeded()
    assert f.in_a_row == 0 and f.wait_s() == 0 and f.status() is None
    assert not f.failed(OSError("storage unavailable"))


def _failing_worker(tmp_path, limit):
    from tests.unit.test_worker_control import _worker_with_a_buffered_round

    from icesink.shared.errors import SparkWriteError

    w = _worker_with_a_buffered_round(tmp_path, SparkWriteError("Spark failed to write 2 rows: mkdirs failed"))
    w.settings = w.settings.model_copy(update={"write_failure_limit": limit})
    from agents.write_failures import WriteFailures

    w.rounds.write_failures = WriteFailures(limit, backoff_s=5, clock=Clock())
    return w


def test_a_round_write_that_keeps_failing_stops_the_replica_with_the_reason_in_status_and_a_metric(tmp_path):
    async def go():
        w = _failing_worker(tmp_path, limit=3)
        w.rounds.spark_ready = asyncio.get_running_loop().create_future()
        w.rounds.spark_ready.set_result(None)
        gauge = []
        for i in range(5):
            await w.rounds.respond(f"r{i}")  # a round during the backoff is not attempted
            gauge.append(w.metrics.registry.get_sample_value("icesink_write_failures_in_a_row"))
            w.rounds.write_failures.clock.now += 60
            if w.stops:
                break
        return w, gauge

    w, gauge = asyncio.run(go())
    assert gauge == [1, 2, 3]
    assert w.stops and w.exit_code == 2 and w.buffers.rows == 2  # nothing reported: the data stays
    assert "failed 3 times in a row" in w.status["error"] and "mkdirs failed" in w.status["error"]
    assert w.status["write_failures"]["in_a_row"] == 3


def test_a_round_during_the_backoff_is_not_attempted(tmp_path, caplog):
    async def go():
        w = _failing_worker(tmp_path, limit=3)
        w.rounds.spark_ready = asyncio.get_running_loop().create_future()
        w.rounds.spark_ready.set_result(None)
        await w.rounds.respond("r1")
        with caplog.at_level(logging.INFO):
            await w.rounds.respond("r2")
        return w

    w = asyncio.run(go())
    assert w.rounds.write_failures.in_a_row == 1 and not w.stops
    assert "retrying in" in caplog.text


def test_the_cache_of_the_class_archive_and_compiled_classes_never_depends_on_the_directory(tmp_path, monkeypatch):
    from spark_bridge.localfs import cache_root

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", "cache")  # relative: ignored, as the XDG spec says
    assert cache_root() == tmp_path / "home" / ".cache" / "icesink"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "icesink"
