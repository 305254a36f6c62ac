"""Spark reads the tables icesink writes, through the same catalog: a reader for the tests,
separate from the workers' Spark.

icesink's SQL catalog is pyiceberg's (the table ``iceberg_tables``: ``catalog_name``,
``table_namespace``, ``table_name``, ``metadata_location``, ``previous_metadata_location`` and
``iceberg_type``), the layout of Iceberg's own JdbcCatalog (its "V1" schema, with views; a
``NULL`` ``iceberg_type`` is a table). So Spark with the Iceberg Spark runtime reads it as
``spark.sql.catalog.NAME = org.apache.iceberg.spark.SparkCatalog``, ``type = jdbc``, ``uri =
jdbc:sqlite:PATH`` under the same catalog NAME (the rows are keyed by it), with
``jdbc.init-catalog-tables = false`` (a reader creates nothing) and ``cache-enabled = false`` (each
read sees the catalog's current metadata). :func:`jdbc_catalog_conf` turns pyiceberg's properties
into that conf.

The Iceberg Spark runtime is built for one Spark minor version, and the newest (Iceberg 1.12)
is for Spark 4.1; the workers' pyspark 4.3 cannot load it (``IncompatibleClassChangeError``
on ``SparkView``). The reader therefore runs in a Python environment of its own with pyspark 4.1
(:data:`REQUIREMENTS`), as a child process (``spark_reader_child.py``) with one Spark session for
the whole test session. Its jars (``maven/spark-reader/pom.xml``) and its environment live in
``$XDG_CACHE_HOME/icesink/spark-reader-<digest>`` (default ``~/.cache/icesink``; the digest
covers the pom and :data:`REQUIREMENTS`, so changing either resolves again): :func:`resolve` makes
them once (``./dev test`` calls ``python -m tests.support.spark_reader resolve``); with the cache
full it only checks a stamp file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any
from urllib.parse import unquote, urlparse

import pyarrow as pa

logger = logging.getLogger(__name__)

POM = Path(__file__).resolve().parent / "maven" / "spark-reader" / "pom.xml"
CHILD = Path(__file__).resolve().parent / "spark_reader_child.py"
#: What the reader's Python environment holds: the Spark the runtime in POM is built for.
REQUIREMENTS = ("pyspark==4.1.3", "pyarrow>=17")
_STAMP = "resolved"


class SparkReaderError(RuntimeError):
    """The reader could not be made or started, or Spark could not answer a read."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "icesink"


def reader_home(pom: Path = POM) -> Path:
    digest = hashlib.sha256(pom.read_bytes() + "\n".join(REQUIREMENTS).encode()).hexdigest()[:16]
    return cache_root() / f"spark-reader-{digest}"


def resolve(pom: Path = POM, *, timeout_s: float = 1800.0) -> Path:
    """The reader's directory (``lib/`` the jars, ``venv/`` the Python environment), made unless
    a previous run did (a stamp file says it finished). Safe to call from several processes at
    once (a lock file)."""
    home = reader_home(pom)
    if (home / _STAMP).exists():
        return home
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SparkReaderError("mvn (Apache Maven) is not on PATH: it fetches the Iceberg Spark runtime from "
                               "Maven Central (`apt-get install maven`; ./dev test installs it)")
    home.mkdir(parents=True, exist_ok=True)
    with (home / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / _STAMP).exists():
            return home
        began = time.monotonic()
        logger.info("making the Spark reader in %s: the Iceberg Spark runtime from Maven Central, then %s "
                    "from PyPI (first time: a few minutes)", home, " ".join(REQUIREMENTS))
        partial = home / "lib.partial"
        shutil.rmtree(partial, ignore_errors=True)
        _run([mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies", "-DincludeScope=runtime",
              f"-DoutputDirectory={partial}"], timeout_s)
        if not any(partial.glob("iceberg-spark-runtime-*.jar")):
            raise SparkReaderError(f"mvn copied no iceberg-spark-runtime jar into {partial}")
        shutil.rmtree(home / "lib", ignore_errors=True)
        partial.rename(home / "lib")
        jars_s = time.monotonic() - began
        venv = home / "venv"
        shutil.rmtree(venv, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(venv)], timeout_s)
        _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *REQUIREMENTS], timeout_s)
        (home / _STAMP).write_text(" ".join(sorted(p.name for p in (home / "lib").glob("*.jar"))) + "\n")
        logger.info("Spark reader made in %s in %.1f s (Maven %.1f s, venv and pip %.1f s)", home,
                    time.monotonic() - began, jars_s, time.monotonic() - began - jars_s)
    return home


def _run(cmd: list[str], timeout_s: float) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise SparkReaderError(f"{' '.join(cmd)}: no result within {timeout_s:.0f} s") from None
    if done.returncode != 0:
        raise SparkReaderError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")


def jdbc_catalog_conf(name: str, props: Mapping[str, str]) -> dict[str, str]:
    """The Spark conf of an Iceberg JdbcCatalog named ``name`` reading the pyiceberg SQL catalog
    ``load_catalog(name, **props)`` opens (SQLite: ``uri=sqlite:///PATH``)."""
    uri, warehouse = props.get("uri", ""), props.get("warehouse")
    parsed = urlparse(uri)
    path = unquote(parsed.path)[1:]  # sqlite:////x/y.db -> /x/y.db; sqlite:///y.db is relative (to a cwd)
    if parsed.scheme != "sqlite" or not path.startswith("/"):
        raise SparkReaderError(f"catalog {name}: expected a SQLite SQL catalog at an absolute path (uri sqlite:////PATH), "
                               f"found uri {uri!r}")
    if not warehouse:
        raise SparkReaderError(f"catalog {name}: expected a warehouse property (Iceberg's JdbcCatalog needs one), found none")
    prefix = f"spark.sql.catalog.{name}"
    return {
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.type": "jdbc",
        f"{prefix}.uri": f"jdbc:sqlite:{path}",  # SQLAlchemy's ?timeout=... is not sqlite-jdbc's: dropped
        f"{prefix}.warehouse": warehouse,
        f"{prefix}.jdbc.init-catalog-tables": "false",
        f"{prefix}.cache-enabled": "false",
    }


class SparkReader:
    """A Spark 4.1 session with the Iceberg Spark runtime in a child process. ``catalog(name,
    props)`` gives a handle that reads through one catalog; each read returns an Arrow table."""

    def __init__(self, directory: Path, *, start_timeout_s: float = 300.0, read_timeout_s: float = 300.0) -> None:
        self.directory = directory
        self.start_timeout_s = start_timeout_s
        self.read_timeout_s = read_timeout_s
        self.log_path = directory / "spark-reader.log"
        self.started_in_s: float | None = None
        self.spark_version: str | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._log: IO[bytes] | None = None
        self._next_id = 0
        self._lock = threading.Lock()
        self.reads = 0
        self.reading_s = 0.0  # the time spent waiting for Spark's answers (the warm-up's included)
        self.warmed_in_s: float | None = None
        self._starter: threading.Thread | None = None
        self._start_error: BaseException | None = None
        self._spawned_at = 0.0

    def start(self) -> None:
        self._spawn()
        self._wait_ready()

    def _spawn(self) -> None:
        """The child process, from this thread: its parent-death signal fires when the thread that
        made it ends (Linux ``PR_SET_PDEATHSIG``), so never from a short-lived one."""
        home = resolve()
        jars = sorted(str(p) for p in (home / "lib").glob("*.jar"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        self._spawned_at = time.monotonic()
        from icesink.app.embedded import _die_with_parent_hook

        self._proc = subprocess.Popen(
            [str(home / "venv" / "bin" / "python"), str(CHILD), "--jars", ",".join(jars), "--dir", str(self.directory)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env,
            start_new_session=True, preexec_fn=_die_with_parent_hook(),
        )

    def _wait_ready(self) -> None:
        ready = self._answer(self.start_timeout_s, "start")
        self.started_in_s = time.monotonic() - self._spawned_at
        self.spark_version = ready.get("spark")
        logger.info("Spark reader (Spark %s) started in %.1f s", self.spark_version, self.started_in_s)

    def start_in_background(self) -> None:
        """Start and warm up (:meth:`warm_up`) in a thread, while the test that asked for the reader
        runs its pipeline; the first read waits for it, and fails with the reason if it failed."""
        self._spawn()

        def run() -> None:
            try:
                self._wait_ready()
                self.warm_up()
            except BaseException as exc:  # handed to the first read, which raises it
                self._start_error = exc

        self._starter = threading.Thread(target=run, name="spark-reader-start", daemon=True)
        self._starter.start()

    def wait_started(self) -> None:
        starter = self._starter
        if starter is None or starter is threading.current_thread():
            return
        starter.join()
        if self._start_error is not None:
            raise SparkReaderError(f"the Spark reader did not start: {self._start_error}") from self._start_error

    def warm_up(self) -> None:
        """Read a small table of a SQLite catalog of its own (every row, and rows per value), the
        reads the tests make: the JVM's first Iceberg read loads and compiles most of what later
        ones use (about 30 s on a busy 2-core machine; later reads take about a second)."""
        from pyiceberg.catalog.sql import SqlCatalog

        began = time.monotonic()
        where = self.directory / "warm-up"
        where.mkdir(parents=True, exist_ok=True)
        catalog = SqlCatalog("warm", uri=f"sqlite:///{where}/catalog.db", warehouse=f"file://{where}/wh")
        catalog.create_namespace("db")
        table = catalog.create_table("db.w", schema=pa.schema([("id", pa.int64()), ("s", pa.string())]))
        table.append(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "s": ["a", "b", "a"]}))
        spark = self.catalog("warm", catalog.properties)
        rows = spark.table("db.w").num_rows
        counts = dict(zip(*spark.table("db.w", group_by=["s"]).to_pydict().values(), strict=True))
        if rows != 3 or counts != {"a": 2, "b": 1}:
            raise SparkReaderError(f"warm-up: expected 3 rows and counts {{'a': 2, 'b': 1}}, found {rows} and {counts}")
        self.warmed_in_s = time.monotonic() - began

    def stop(self) -> None:
        if self._starter is not None and self._starter is not threading.current_thread():
            self._starter.join()
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                if proc.stdin:
                    proc.stdin.close()
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
            if proc.stdout:
                proc.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> SparkReader:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def catalog(self, name: str, props: Mapping[str, str]) -> SparkCatalogReader:
        return SparkCatalogReader(self, name, jdbc_catalog_conf(name, props))

    def request(self, request: dict[str, Any]) -> pa.Table:
        self.wait_started()
        with self._lock:
            proc = self._proc
            if proc is None or proc.stdin is None:
                raise SparkReaderError("the Spark reader is not running")
            self._next_id += 1
            request = {**request, "id": self._next_id}
            began = time.monotonic()
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            answer = self._answer(self.read_timeout_s, json.dumps(request))
            self.reads += 1
            self.reading_s += time.monotonic() - began
        if "error" in answer:
            raise SparkReaderError(f"Spark could not read {request.get('table') or request.get('sql')}: {answer['error']}")
        path = Path(answer["path"])
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_file(source).read_all()
        path.unlink()
        return table

    def _answer(self, timeout_s: float, what: str) -> dict[str, Any]:
        """The child's next answer line; a child that exits or stays silent fails with its log."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(proc.stdout.readline() if proc.stdout else ""), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not result or not result[0]:
            if result:  # its stdout closed: it is exiting (a negative code is the signal that ended it)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            state = "no answer" if not result else f"exited with {proc.poll()}"
            self._kill()  # a reader that missed an answer is out of step: no later read may use it
            raise SparkReaderError(f"Spark reader: {state} within {timeout_s:.0f} s to {what}:\n{self._log_tail()}")
        answer: dict[str, Any] = json.loads(result[0])
        return answer

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=30)

    def _log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError as exc:
            return f"(no log: {exc})"


class SparkCatalogReader:
    """Reads through one catalog, as a user's Spark session configured with the same conf would."""

    def __init__(self, reader: SparkReader, name: str, conf: dict[str, str]) -> None:
        self.reader = reader
        self.name = name
        self.conf = conf

    def table(self, identifier: str, *, snapshot_id: int | None = None, group_by: Sequence[str] = ()) -> pa.Table:
        """``spark.table(NAME.identifier)`` (``spark.read.option("versionAsOf", ...)`` for an older
        snapshot), with ``.groupBy(*group_by).count()`` if columns are given."""
        return self.reader.request({"catalog": self.conf, "table": f"{self.name}.{identifier}",
                                    "snapshot_id": snapshot_id, "group_by": list(group_by)})

    def sql(self, query: str) -> pa.Table:
        return self.reader.request({"catalog": self.conf, "sql": query})



# ---------------------------------------------------------------------------------------------
# The same read by Spark, DuckDB and pyiceberg


def _plain(value: Any) -> Any:
    """A value as every engine can agree on it: a UUID as its text (Spark has no UUID type: it
    reads Iceberg's as strings), structs and lists as tuples, an aware time in UTC."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return tuple(sorted((k, _plain(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC)
    return value


def _rows(records: Sequence[Mapping[str, Any]], columns: Sequence[str], uuid_columns: set[str]) -> list[tuple[Any, ...]]:
    def cell(name: str, value: Any) -> Any:
        if name in uuid_columns and isinstance(value, bytes):  # pyiceberg's fixed[16] for a uuid
            return str(uuid.UUID(bytes=value))
        return _plain(value)

    return sorted((tuple(cell(c, r[c]) for c in columns) for r in records), key=repr)


def engine_rows(spark: SparkCatalogReader, catalog: Any, identifier: str, *,
                snapshot_id: int | None = None) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the table (of ``snapshot_id``, else the current snapshot) as Spark, DuckDB's
    iceberg extension and a pyiceberg scan read it, each sorted the same way; the columns are
    the table schema's, and each engine must return exactly those."""
    from pyiceberg.types import UUIDType

    from tests.support import duck

    table = catalog.load_table(identifier)
    schema = table.schemas()[table.snapshot_by_id(snapshot_id).schema_id] if snapshot_id is not None else table.schema()
    columns = [f.name for f in schema.fields]
    uuid_columns = {f.name for f in schema.fields if isinstance(f.field_type, UUIDType)}
    read = {"spark": spark.table(identifier, snapshot_id=snapshot_id),
            "pyiceberg": table.scan(snapshot_id=snapshot_id).to_arrow()}
    with duck.connect(table.io.properties) as con:
        at = "" if snapshot_id is None else f", snapshot_from_id => {int(snapshot_id)}"
        cursor = con.execute(f"SELECT * FROM iceberg_scan(?{at})", [duck.plain_path(table.metadata_location)])
        names = [d[0] for d in cursor.description or []]
        duck_records = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    found = {engine: list(result.column_names) for engine, result in read.items()} | {"duckdb": names}
    assert all(sorted(c) == sorted(columns) for c in found.values()), (
        f"{identifier}: expected the columns {columns} from every engine, found {found}")
    out = {engine: _rows(result.to_pylist(), columns, uuid_columns) for engine, result in read.items()}
    out["duckdb"] = _rows(duck_records, columns, uuid_columns)
    return out


def engine_counts(spark: SparkCatalogReader, catalog: Any, identifier: str, column: str) -> dict[str, dict[Any, int]]:
    """Rows per value of ``column`` (the tutorial's question: orders per store) as Spark
    (``spark.table(...).groupBy(column).count()``), DuckDB (``GROUP BY``) and pyiceberg (a scan,
    grouped by Arrow) answer it."""
    from tests.support import duck

    table = catalog.load_table(identifier)
    by_spark = spark.table(identifier, group_by=[column]).to_pylist()
    scanned = table.scan(selected_fields=(column,)).to_arrow()
    by_arrow = scanned.group_by(column).aggregate([([], "count_all")]).to_pylist()
    with duck.connect(table.io.properties) as con:
        quoted = '"' + column.replace('"', '""') + '"'
        by_duck = con.execute(f"SELECT {quoted}, count(*) FROM iceberg_scan(?) GROUP BY {quoted}",
                              [duck.plain_path(table.metadata_location)]).fetchall()
    return {"spark": {_plain(r[column]): r["count"] for r in by_spark},
            "duckdb": {_plain(k): n for k, n in by_duck},
            "pyiceberg": {_plain(r[column]): r["count_all"] for r in by_arrow}}


def assert_engines_agree(answers: Mapping[str, Any], what: str) -> None:
    """Every engine's answer equals Spark's; the message names the engines that differ and how."""
    spark = answers["spark"]
    differ = {engine: answer for engine, answer in answers.items() if answer != spark}
    if not differ:
        return
    lines = [f"{what}: Spark's answer differs from {sorted(differ)}'s"]
    for engine, answer in differ.items():
        if isinstance(answer, list) and isinstance(spark, list):
            only_spark = [r for r in spark if r not in answer][:5]
            only_other = [r for r in answer if r not in spark][:5]
            lines.append(f"  {len(spark)} rows by Spark, {len(answer)} by {engine}; only Spark's (first 5): "
                         f"{only_spark}; only {engine}'s: {only_other}")
        elif isinstance(answer, dict) and isinstance(spark, dict):
            keys = sorted({*answer, *spark}, key=repr)
            lines.append(f"  (value: Spark, {engine}) where they differ: "
                         f"{ {k: (spark.get(k), answer.get(k)) for k in keys if spark.get(k) != answer.get(k)} }")
        else:
            lines.append(f"  Spark: {spark!r}\n  {engine}: {answer!r}")
    raise AssertionError("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.spark_reader", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("resolve", help="make the reader's jars and Python environment (nothing to do when made); print the directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.cmd == "resolve":
        print(resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
