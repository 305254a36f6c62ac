"""The ``icesink`` command: ``worker``, ``connect``, ``demo``, ``pizzas``, ``control tail``, ``gc``,
``offsets``, ``rewind``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from icesink.shared.errors import ConfigError, ControlLogError, ControlSecretError, StartFailure
from icesink.shared.secrets import Redactor, install_log_redaction

if TYPE_CHECKING:
    from agents.file_writer import FileWriting
    from icesink.shared.config import Settings

log = logging.getLogger("icesink")


def _setup_logging(level: str, fmt: str = "text") -> None:
    from icesink.app.log_format import setup_logging

    setup_logging(level, fmt)


def _choice(name: str, env: str, choices: tuple[str, ...], fold: Callable[[str], str]) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if fold(value) not in choices:
            raise argparse.ArgumentTypeError(f"{value!r} is not one of {', '.join(choices)} (from {name} or {env})")
        return fold(value)
    return parse


def _logging_flags(parser: argparse.ArgumentParser, top: bool) -> None:
    """--log-level and --log-format, before the command (defaults from the environment) or after
    it (given there, they win)."""
    from icesink.app.log_format import FORMATS, LEVELS

    level_default = os.environ.get("ICESINK_LOG_LEVEL", "INFO") if top else argparse.SUPPRESS
    format_default = os.environ.get("ICESINK_LOG_FORMAT", "text") if top else argparse.SUPPRESS
    parser.add_argument("--log-level", default=level_default,
                        type=_choice("--log-level", "ICESINK_LOG_LEVEL", LEVELS, str.upper),
                        help="DEBUG, INFO, WARNING or ERROR (default INFO, or ICESINK_LOG_LEVEL)")
    parser.add_argument("--log-format", default=format_default,
                        type=_choice("--log-format", "ICESINK_LOG_FORMAT", FORMATS, str.lower),
                        help="text or json: one JSON object per line (default text, or ICESINK_LOG_FORMAT)")


def _overrides(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError("--set", pair, "KEY=VALUE")
        out[key.strip()] = value
    return out


def _settings(args: argparse.Namespace) -> Settings:
    """The settings; from here on every log record is redacted of their secrets."""
    from icesink.shared.config import load_settings

    overrides = _overrides(args.set or [])
    if getattr(args, "metrics_port", None) is not None:
        overrides["metrics.port"] = args.metrics_port
    settings = load_settings(args.config, os.environ, overrides)
    install_log_redaction(settings.redactor())
    return settings


def cmd_worker(args: argparse.Namespace) -> int:
    launched_at = time.monotonic()  # a new group's first round comes one interval after it (coordinator/session.py)
    # SIGTERM during the imports and set-up below (a few seconds) would end the process by the
    # signal; it is kept until the worker's own handlers run, which then stop it as usual.
    terminated = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: terminated.set())

    from icesink.shared import gc_tuning

    gc_tuning.tune()  # before start-up allocates (icesink/shared/gc_tuning.py)
    settings = _settings(args)
    redact = settings.redactor()
    log.info("settings given (the rest are defaults; --log-level DEBUG lists all): %s", settings.masked(only_given=True))
    log.debug("settings: %s", settings.masked())

    from agents.parts import default_worker_id
    from icesink.app.spark_session import spark_session
    from icesink.shared.faults import hold_point_blocking

    # The Spark session starts now, in a thread of its own: a local JVM's start (seconds, most of
    # it the JVM's own threads) then runs beside the imports and the set-up below instead of
    # beside the first records read (bench/README.md, "The Spark session started first"), and
    # is asked for before those imports (pyiceberg, pandas, the writer: "The JVM asked for
    # before the heavy imports"; tests/unit/test_spark_start_order.py).
    worker_id = settings.worker_id or default_worker_id()
    session = spark_session(settings, worker_id)
    session.start_soon(lambda: hold_point_blocking(settings, "worker.spark-start"))  # fault tests: a slow start

    from agents.worker import Worker  # what the group join needs: Faust, aiokafka, ownership
    from icesink.shared.metrics import Metrics
    from icesink.app.stack import resolve_bootstrap
    from icesink.app.status import serve

    def preload() -> None:
        """The writer's and the coordinator's modules (pyiceberg, pandas, the Spark writer):
        imported in the worker's thread while its group join is answered (agents/assembly.py)."""
        import coordinator.service  # noqa: F401
        import icesink.app.files  # noqa: F401
        from coordinator import iceberg_ext

        iceberg_ext.install()  # pyiceberg extensions (pinned version checked) before any catalog or commit

    def files(settings: Settings, worker_id: str) -> FileWriting:
        from icesink.app.files import spark_files

        return spark_files(settings, worker_id, session)

    def leader(*args: Any, **kwargs: Any) -> Any:
        from coordinator.service import Coordinator

        return Coordinator(*args, **kwargs)

    bootstrap, broker = resolve_bootstrap(settings)
    metrics = Metrics()
    try:
        # A replica is a worker, and the coordinator while it leads the group.
        worker = Worker(settings, bootstrap, metrics, files=files, leader=leader, launched_at=launched_at,
                        worker_id=worker_id, preload=preload)
        if settings.metrics_port:
            serve(settings.metrics_host, settings.metrics_port, metrics.registry, worker.status_report, redact)
        asyncio.run(worker.run(stop_requested=terminated))
    except Exception as exc:
        _start_failure(exc, bootstrap, settings.catalog_name, settings.catalog_props.get("uri"),
                       settings.catalog_props.get("warehouse"))
        raise
    finally:
        if broker is not None:
            broker.stop()
    return worker.exit_code


def _start_failure(exc: Exception, bootstrap: str, catalog: str | None = None, uri: str | None = None,
                   warehouse: str | None = None) -> None:
    """Raise StartFailure (one line) if ``exc`` is a failure of the surroundings a user fixes."""
    from icesink.app.start_failures import describe

    line = describe(exc, bootstrap=bootstrap, catalog=catalog, catalog_uri=uri, catalog_warehouse=warehouse)
    if line is not None:
        log.debug("the start failure in full", exc_info=exc)
        raise StartFailure(line) from exc


def cmd_connect(args: argparse.Namespace) -> int:
    from icesink.app.connect import run_connect
    from icesink.app.connect_settings import load_connect_settings
    from icesink.app.stack import resolve_bootstrap

    overrides = _overrides(args.set or [])
    settings = load_connect_settings(args.config, os.environ, overrides)
    defaults = settings.process_settings()
    install_log_redaction(Redactor(settings.secret_values()))
    bootstrap, broker = resolve_bootstrap(defaults)
    try:
        return asyncio.run(run_connect(settings, bootstrap))
    except Exception as exc:
        _start_failure(exc, bootstrap)
        raise
    finally:
        if broker is not None:
            broker.stop()


def cmd_pizzas(args: argparse.Namespace) -> int:
    import json
    import time

    from icesink.shared.kafka_admin import ensure_topic, partition_counts
    from icesink.app.pizzas import pizza_values, produce

    bootstrap = args.bootstrap
    if bootstrap is None:
        record = args.state_dir.resolve() / "broker.json"
        if not record.exists():
            raise ConfigError("--bootstrap", None, f"a broker address (no embedded broker is recorded in {record})")
        bootstrap = json.loads(record.read_text())["bootstrap"]
    # --partitions only if it is created: a topic that exists (a worker subscribed first, and its
    # consumer created it) is produced to over the partitions it has.
    partitions = asyncio.run(partition_counts(bootstrap)).get(args.topic)
    if partitions is None:
        asyncio.run(ensure_topic(bootstrap, args.topic, args.partitions))
        partitions = args.partitions
    values = pizza_values(args.count, seed=int(time.time()))
    asyncio.run(produce(bootstrap, args.topic, values, partitions=partitions))
    print(f"produced {len(values)} pizza orders to {args.topic} at {bootstrap}", file=sys.stderr)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from icesink.app.demo import run_demo

    return run_demo(
        duration_s=args.duration, rate=args.rate, replicas=args.replicas,
        interval_ms=args.interval_ms, state_dir=args.state_dir,
    )


def cmd_control_tail(args: argparse.Namespace) -> int:
    from icesink.shared.control import ControlReader
    from icesink.shared.group_secret import stored_keyring
    from icesink.shared.iceberg import load_catalog
    from icesink.shared.protocol import describe

    settings = _settings(args)
    bootstrap = args.bootstrap or settings.bootstrap_servers
    if bootstrap is None:
        from icesink.app.stack import resolve_bootstrap

        bootstrap, _ = resolve_bootstrap(settings)

    async def tail() -> None:
        reader = ControlReader(bootstrap, settings.control_topic, settings.group_id, settings.kafka_client_kwargs(),
                               secret=await stored_keyring(settings, bootstrap, load_catalog(settings)))
        await reader.start()
        try:
            end = await reader.end_offset()
            await reader.seek(max(0, end - args.last) if args.last else 0)
            while True:
                batch = await reader.read(1.0)
                for offset, ev in batch:
                    print(f"{offset:>8}  {describe(ev)}", flush=True)
                if not batch and not args.follow and await reader.position() >= end:
                    return
        finally:
            await reader.stop()

    asyncio.run(tail())
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from coordinator.gc import (
        delete_orphans, find_orphans, in_flight_files, parse_duration, remove_empty_dirs, sink_states,
    )
    from icesink.shared.group_secret import stored_keyring
    from icesink.shared.iceberg import load_catalog

    settings = _settings(args)
    older_than = parse_duration(args.older_than)
    catalog = load_catalog(settings)
    tables = {name: catalog.load_table(name) for name in args.table or settings.tables}
    protected: frozenset[str] = frozenset()
    if not args.no_control:
        bootstrap = settings.bootstrap_servers
        if bootstrap is None:
            from icesink.app.stack import resolve_bootstrap

            bootstrap, _ = resolve_bootstrap(settings)
        # Without a readable checkpoint: from the lowest replay start in the tables' state.
        starts = [st.replay_from for t in tables.values() if (st := sink_states(t).get(settings.group_id))
                  and st.replay_from is not None]

        async def read_log() -> Any:  # checked with the group's key, as its replicas check: forged events named nothing
            keyring = await stored_keyring(settings, bootstrap, catalog)
            return await in_flight_files(settings, bootstrap, min(starts) if starts else None, keyring)

        in_flight = asyncio.run(read_log())
        print(f"control log read from offset {in_flight.start} ({in_flight.source}): "
              f"{len(in_flight.paths)} files in flight", file=sys.stderr)
        protected = in_flight.paths
    for name, table in tables.items():
        found = find_orphans(table, older_than, protected, retired=args.retired_group or ())
        for o in found.orphans:
            print(f"{name}\t{o.path}\t{o.size_bytes}\t{o.age_s / 3600:.1f}h", flush=True)
        if found.held:
            print(f"{name}: kept {len(found.held)} unreferenced files their group may still commit "
                  f"(e.g. {found.held[0].path}: {found.held[0].reason})", file=sys.stderr)
        size = sum(o.size_bytes for o in found.orphans)
        if args.delete and found.orphans:
            deleted = delete_orphans(table, found.orphans)
            print(f"{name}: deleted {deleted} of {len(found.orphans)} orphan files ({size} bytes)", file=sys.stderr)
        else:
            print(f"{name}: {len(found.orphans)} orphan files ({size} bytes) older than {args.older_than}"
                  + ("" if args.delete else "; add --delete to delete them"), file=sys.stderr)
        if found.empty_dirs and args.delete:
            removed = remove_empty_dirs(table, found.empty_dirs)
            print(f"{name}: removed {removed} empty write directories", file=sys.stderr)
        elif found.empty_dirs:
            print(f"{name}: {len(found.empty_dirs)} empty write directories older than {args.older_than}; "
                  "add --delete to remove them", file=sys.stderr)
    return 0


def _bootstrap(settings: Settings) -> str:
    if settings.bootstrap_servers is not None:
        return settings.bootstrap_servers
    from icesink.app.stack import resolve_bootstrap

    return resolve_bootstrap(settings)[0]


def cmd_offsets(args: argparse.Namespace) -> int:
    import json

    from icesink.app.rewind import format_offsets, pending_rewind, snapshot_positions
    from icesink.shared.iceberg import load_catalog

    settings = _settings(args)
    table = load_catalog(settings).load_table(args.table)
    rows = snapshot_positions(table, settings.group_id, settings.commit_branch(args.table))
    if (pending := pending_rewind(table, settings.group_id)) is not None:
        print(f"table {args.table}: a rewind of sink group {settings.group_id} was interrupted after its table "
              f"commit; run `icesink rewind {args.table} --to {pending}` again before starting the sink", file=sys.stderr)
    if args.snapshot is not None:
        rows = [r for r in rows if r.snapshot_id == args.snapshot]
        if not rows:
            log.error("table %s: no snapshot %d in the ancestry of its commit branch", args.table, args.snapshot)
            return 1
    print(json.dumps([r.as_json() for r in rows], indent=1) if args.json else format_offsets(rows))
    return 0


def cmd_rewind(args: argparse.Namespace) -> int:
    from icesink.app.connect_offsets import OffsetsRefused
    from icesink.app.rewind import RewindRefused, parse_targets, rewind

    settings = _settings(args)
    try:
        asyncio.run(rewind(settings, _bootstrap(settings), args.table, parse_targets(args.to), sys.stdout,
                           args.assume_stopped))
    except (RewindRefused, OffsetsRefused) as exc:
        print(exc, file=sys.stderr)
        return 3
    return 0


def cmd_spark_archive(args: argparse.Namespace) -> int:
    from spark_bridge import class_archive

    master, conf = "local[*]", {}
    if args.config is not None:
        settings = _settings(args)
        if settings.spark_remote is not None or not settings.spark_master.startswith("local"):
            log.error("spark.master %s: the class-data archive is for a local session's JVM only",
                      settings.spark_remote or settings.spark_master)
            return 2
        master, conf = settings.spark_master, dict(settings.spark_conf)
    if args.check:
        found = class_archive.session_archive(master, conf)
        if found is None or not found.exists():
            return 1
        print(found)
        return 0
    path = class_archive.build(master, conf)
    if path is None:
        return 1
    print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="icesink",
        description="Stream Kafka topics into Apache Iceberg tables exactly once.",
    )
    p.add_argument("--version", action="version", version=f"icesink {_version()}")
    _logging_flags(p, top=True)
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", type=Path, help="settings file, JSON or TOML (reference-sink keys)")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override one setting, e.g. --set metrics.port=9401 (repeatable)")

    w = sub.add_parser(
        "worker", help="run one worker replica",
        description="Run one worker replica. Replicas with the same group.id form one group: "
        "they share the source partitions, and the Faust leader among them runs the coordinator. "
        "Every setting can also come from ICESINK_<KEY> environment variables "
        "(ICESINK_METRICS_PORT for metrics.port).",
    )
    common(w)
    w.add_argument("--metrics-port", type=int, help="port of /metrics (0 disables); same as metrics.port")
    w.set_defaults(fn=cmd_worker)

    k = sub.add_parser(
        "connect", help="run a Kafka Connect-compatible REST API and cluster process",
        description="Serve Kafka Connect's REST API (listeners, default http://127.0.0.1:8083) and run "
        "the connectors PUT to it as worker replicas. Processes with the same group.id form one "
        "cluster through the config topic (config.storage.topic, default icesink-connect-configs): "
        "each serves the whole API, and tasks (tasks.max replicas per connector) spread over them. "
        "Keys other than the connect settings are defaults for every connector's tasks (no secrets: "
        "connectors reference those through config providers). README: Kafka Connect's REST API.",
    )
    common(k)
    k.set_defaults(fn=cmd_connect)

    d = sub.add_parser(
        "demo", help="run the pizza demo on the embedded stack",
        description="Start an embedded broker and SQLite catalog, produce random pizza orders to "
        "the 6-partition topic completed-pizzas, run worker replicas as separate processes, then "
        "print the rows, the top stores and the snapshot history of rpc.pizzas, and stop everything.",
    )
    d.add_argument("--duration", type=float, default=45.0, help="seconds of producing (default 45)")
    d.add_argument("--rate", type=float, default=1000.0, help="pizzas per second (default 1000)")
    d.add_argument("--replicas", type=int, default=2, help="worker processes (default 2)")
    d.add_argument("--interval-ms", type=int, default=10_000, help="commit interval (default 10000)")
    d.add_argument("--state-dir", type=Path, default=None, help="where to keep demo state (default: a temp dir)")
    d.set_defaults(fn=cmd_demo)

    z = sub.add_parser("pizzas", help="produce random pizza orders (for the quickstarts)",
                       description="Produce random pizza orders (the tutorial's events) to a topic, created "
                       "if missing; by default to the embedded broker recorded in STATE_DIR/broker.json.")
    z.add_argument("--count", type=int, default=10_000, help="orders to produce (default 10000)")
    z.add_argument("--topic", default="completed-pizzas", help="topic (default completed-pizzas)")
    z.add_argument("--partitions", type=int, default=6, help="partitions if it is created (default 6)")
    z.add_argument("--bootstrap", help="bootstrap servers (default: the embedded broker of --state-dir)")
    z.add_argument("--state-dir", type=Path, default=Path("var"), help="state.dir of the embedded stack (default var)")
    z.set_defaults(fn=cmd_pizzas)

    c = sub.add_parser("control", help="inspect the control topic (the commit log)",
                       description="Inspect the control topic, the commit log of a sink group.")
    csub = c.add_subparsers(dest="control_command", required=True)
    t = csub.add_parser("tail", help="print control events, one readable line each",
                        description="Print the group's control events with their offsets: rounds, tables, "
                        "files, ranges and positions.")
    common(t)
    t.add_argument("--bootstrap", help="bootstrap servers (default: bootstrap.servers from the config)")
    t.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    t.add_argument("--last", type=int, default=0, help="start this many events before the end (default: all)")
    t.set_defaults(fn=cmd_control_tail)

    g = sub.add_parser(
        "gc", help="list or delete orphan data files (referenced by no snapshot)",
        description="List (default) or delete data files under each table's location that no "
        "snapshot references, that no in-flight response in the control log names, that are "
        "older than --older-than, and that no round of any sink group writing the table can "
        "still commit (docs/commits.md). Committed files are never deleted; each deletion is logged.",
    )
    common(g)
    g.add_argument("--table", action="append", help="only this table (repeatable; default: iceberg.tables)")
    g.add_argument("--older-than", default="1d", help="grace period: 90s, 30m, 6h, 3d (default 1d)")
    g.add_argument("--delete", action="store_true", help="delete the orphans (default: only list them)")
    g.add_argument("--retired-group", action="append", metavar="GROUP",
                   help="a sink group that runs nowhere any more (repeatable): its unreferenced files are "
                   "orphans, where otherwise they are kept until its position in the table passes them")
    g.add_argument("--no-control", action="store_true",
                   help="do not read the control topic for in-flight files (only when the broker is gone; "
                   "then use a grace period longer than any catalog outage)")
    g.set_defaults(fn=cmd_gc)

    o = sub.add_parser(
        "offsets", help="print the Kafka positions each snapshot of a table holds for the sink group",
        description="Print, per snapshot of TABLE's commit branch (newest first, or the one asked), the "
        "Kafka positions (topic, partition, next offset to read) its rows cover for the sink group of "
        "--config: every record below them is in that snapshot (docs/rewind.md).",
    )
    common(o)
    o.add_argument("table", help="the table, e.g. db.events")
    o.add_argument("--snapshot", type=int, help="only this snapshot id")
    o.add_argument("--json", action="store_true", help="a JSON list instead of the plain table")
    o.set_defaults(fn=cmd_offsets)

    r = sub.add_parser(
        "rewind", help="take a table back to before given offsets and read again from there",
        description="With every replica of the sink stopped: roll TABLE back to the newest snapshot "
        "holding no record at or past the offsets of --to, move the sink group's positions there "
        "(a signed alter-positions event), so the started sink reads again and holds each record "
        "once. Refused, changing nothing, when the sink runs or another writer's snapshot would be "
        "lost. Safe to run again after a crash (docs/rewind.md). Exit 3 when refused.",
    )
    common(r)
    r.add_argument("table", help="the table, e.g. db.events")
    r.add_argument("--to", required=True, metavar="TOPIC:PARTITION:OFFSET[,...]",
                   help="remove every record at or past these offsets")
    r.add_argument("--assume-stopped", action="store_true",
                   help="skip the check that the sink group's consumer group has no member (for brokers that "
                   "keep listing the members of stopped replicas, as Tansu does): every replica must be stopped")
    r.set_defaults(fn=cmd_rewind)

    a = sub.add_parser(
        "spark-archive", help="build the class-data archive a local Spark session's JVM starts from",
        description="Build, unless it exists, the class-data-sharing archive for the local Spark "
        "session's JVM and class path (under $XDG_CACHE_HOME/icesink, default ~/.cache/icesink): "
        "a throw-away session writes once and its JVM saves the classes it loaded. Every later "
        "local session with the same JVM and Spark maps it and starts in about half the time. "
        "Prints the archive's path. With --config, for that file's spark.* settings.",
    )
    a.add_argument("--config", type=Path, help="settings file whose spark.* settings the worker uses")
    a.add_argument("--check", action="store_true", help="build nothing: exit 0 if the archive exists, else 1")
    a.set_defaults(fn=cmd_spark_archive, set=None)
    from icesink.app.deadletters import add_parser as deadletters_parser  # icesink deadletters replay

    for leaf in (w, k, d, z, t, g, o, r, a, deadletters_parser(sub, common)):
        _logging_flags(leaf, top=False)
    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("icesink")
    except PackageNotFoundError:  # run from a source tree without installing
        return "0+unknown"


def _last_line(exc: Exception) -> None:
    """The one line of a failed start, and the last: threads still starting beside it (the Spark
    session's) log nothing more while the process ends, nor does the Spark JVM."""
    from icesink.app.log_format import last_line

    last_line(log, exc)
    if "spark_bridge.session" in sys.modules:  # a local Spark JVM may be starting or writing
        sys.modules["spark_bridge.session"].silence_jvm_logs()


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level, args.log_format)
    try:
        code = args.fn(args)
    except (ConfigError, ControlLogError, ControlSecretError) as exc:
        _last_line(exc)
        code = 2
    except StartFailure as exc:
        _last_line(exc)
        code = 1
    except KeyboardInterrupt:
        code = 130
    except Exception:  # logged through the redacting handlers, not Python's bare traceback
        log.exception("icesink %s stopped by an unexpected error", args.command)
        code = 1
    sys.exit(code)
