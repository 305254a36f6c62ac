"""``icesink deadletters replay``: dead letters from ``deadletter.table`` back into their tables,
exactly once (docs/deadletters.md).

The chosen rows (``--where``, ``--from``/``--to``) are fed, in offset order per origin
partition, through the worker's own conversion (agents/ingest.py: transforms, screening,
routing, decoding, the tables' schemas) built from the given config, which may differ from the
sink's (a fixed transform, a corrected table). Each target table then gets ONE commit holding
its rows and, in the same commit, the table property ``icesink.replayed.<dead-letter table>``:
the origin offsets (``topic:partition:start-end`` ranges) whose rows that table now holds.
Before converting, letters a table already lists are left out for that table: a second replay
of the same selection adds nothing, and a replay killed between two tables' commits, run again,
completes the others only. Letters that fail again stay in the dead-letter table as they are;
the command prints how many, with the first few.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

    from icesink.shared.config import Settings

log = logging.getLogger(__name__)

COMMIT_ATTEMPTS = 5
BATCH = 5000  # letters per conversion call
Key = tuple[str, int, int]  # origin topic, partition, offset


@dataclass
class Msg:
    """A dead letter as the ingest reads a record."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    timestamp: int | None


@dataclass
class Converted:
    tables: dict[str, pa.Table]  # target -> rows
    failed: dict[Key, tuple[str | None, str]]  # letter -> (tables that rejected it: None all, reason)


def add_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    d = sub.add_parser("deadletters", help="replay dead letters from deadletter.table",
                       description="Work with the dead-letter table (deadletter.table).")
    dsub = d.add_subparsers(dest="deadletters_command", required=True)
    r = dsub.add_parser(
        "replay", help="feed chosen dead letters into their tables again, exactly once",
        description="Feed the dead letters chosen from deadletter.table through this config's converters, "
        "transforms and routes into their target tables, exactly once: each table's commit names the "
        "letters it took, and letters a table already took are left out (docs/deadletters.md). "
        "Letters that fail again stay in the dead-letter table.",
    )
    common(r)
    r.add_argument("--where", help="a pyiceberg row filter on the dead-letter table, e.g. \"reason = 'uncoercible'\"")
    r.add_argument("--from", dest="origin", metavar="TOPIC:PARTITION:OFFSET", help="first origin offset to replay")
    r.add_argument("--to", type=int, metavar="OFFSET", help="with --from: stop before this origin offset")
    r.set_defaults(fn=cmd_replay)
    out: argparse.ArgumentParser = r
    return out


def cmd_replay(args: argparse.Namespace) -> int:
    from icesink.app.cli import _settings
    from icesink.shared.errors import ConfigError

    settings = _settings(args)
    origin = None
    if args.origin is not None:
        topic, _, rest = args.origin.rpartition(":")
        topic, _, part = topic.rpartition(":")
        if not topic or not part.isdigit() or not rest.isdigit():
            raise ConfigError("--from", args.origin, "TOPIC:PARTITION:OFFSET")
        origin = (topic, int(part), int(rest))
    elif args.to is not None:
        raise ConfigError("--to", args.to, "used with --from")
    result = replay(settings, args.where, origin, args.to)
    print(result.summary(), file=sys.stderr)
    return 0


@dataclass
class Result:
    selected: int
    landed: dict[str, int]  # table -> rows committed now
    skipped: dict[str, int]  # table -> letters it held already
    failed: dict[Key, tuple[str | None, str]]

    def summary(self) -> str:
        parts = [f"{self.selected} dead letters selected"]
        parts += [f"{t}: {n} rows added" for t, n in sorted(self.landed.items())]
        parts += [f"{t}: {n} letters already replayed, skipped" for t, n in sorted(self.skipped.items()) if n]
        if self.failed:
            first = ", ".join(f"{t}:{p}:{o} ({why})" for (t, p, o), (_, why) in sorted(self.failed.items())[:3])
            parts.append(f"{len(self.failed)} failed again and stay in the dead-letter table (first: {first})")
        return "; ".join(parts)


def replay(settings: Settings, where: str | None, origin: tuple[str, int, int] | None, to: int | None) -> Result:
    from icesink.shared.errors import ConfigError
    from icesink.shared.iceberg import load_catalog

    dl = settings.deadletter_table
    if dl is None:
        raise ConfigError("deadletter.table", None, "the dead-letter table to replay from")
    catalog = load_catalog(settings)
    letters = select(catalog.load_table(dl), where, origin, to)
    return asyncio.run(_replay(settings, catalog, dl, letters))


def select(table: Any, where: str | None, origin: tuple[str, int, int] | None, to: int | None) -> pa.Table:
    """The chosen rows, one per origin offset, sorted by topic, partition and offset."""
    from pyiceberg.expressions.parser import parse

    from icesink.shared.errors import ConfigError

    clauses = [f"({where})"] if where else []
    if origin is not None:  # topic names are [a-zA-Z0-9._-]: nothing to quote
        topic, partition, offset = origin
        clauses += [f"topic = '{topic}'", f"partition = {partition}", f"offset >= {offset}"]
        if to is not None:
            clauses.append(f"offset < {to}")
    try:
        expr = parse(" AND ".join(clauses) or "true")
    except Exception as exc:
        raise ConfigError("--where", where, f"a pyiceberg row filter ({exc})") from None
    rows = table.scan(row_filter=expr).to_arrow()
    rows = rows.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")])
    if rows.num_rows:  # the table holds each once; a hand-made copy may not
        n = rows.num_rows
        cols = [rows[k].combine_chunks() for k in ("topic", "partition", "offset")]
        same = [pc.equal(c.slice(1), c.slice(0, n - 1)) for c in cols]
        repeat = pc.and_(pc.and_(same[0], same[1]), same[2])
        rows = rows.filter(pa.concat_arrays([pa.array([True]), pc.invert(repeat)]))
    return rows


async def _replay(settings: Settings, catalog: Catalog, dl: str, letters: pa.Table) -> Result:
    from icesink.shared.deadletter_table import covered, read_ranges

    pipe = Pipeline(settings, catalog, dl)
    try:
        first = await pipe.convert(letters)
        done = {name: read_ranges(catalog.load_table(name), dl) for name in first.tables}
        # Letters grouped by the tables that already hold them (usually none: one group).
        masks = {name: covered(r, letters) for name, r in done.items()}
        groups: dict[frozenset[str], list[int]] = {}
        for i in range(letters.num_rows) if any(m.any() for m in masks.values()) else ():
            groups.setdefault(frozenset(n for n, m in masks.items() if m[i]), []).append(i)
        outputs = [(frozenset(), letters, first)] if not groups else [
            (held, part, await pipe.convert(part)) for held, idx in groups.items()
            if (part := letters.take(pa.array(idx, pa.int64()))).num_rows]
    finally:
        await pipe.close()
    result = Result(letters.num_rows, {}, {n: int(m.sum()) for n, m in masks.items()}, dict(first.failed))
    result.failed = {k: v for _, _, c in outputs for k, v in c.failed.items()}
    for name in sorted({n for _, _, c in outputs for n in c.tables}):
        rows: list[pa.Table] = []
        keys: list[Key] = []
        for held, part, conv in outputs:
            if name in held or name not in conv.tables:
                continue
            rows.append(conv.tables[name])
            keys.extend(k for k in _keys(part) if not _failed_for(conv.failed.get(k), name))
        data = pa.concat_tables(rows) if rows else None
        if data is not None and data.num_rows:
            commit(settings, catalog, name, dl, data, keys)
            result.landed[name] = data.num_rows
    return result


def _keys(letters: pa.Table) -> Iterable[Key]:
    return zip(letters["topic"].to_pylist(), letters["partition"].to_pylist(), letters["offset"].to_pylist(), strict=True)


def _failed_for(failure: tuple[str | None, str] | None, table: str) -> bool:
    return failure is not None and (failure[0] is None or table in failure[0].split(","))


def commit(settings: Settings, catalog: Catalog, name: str, dl: str, data: pa.Table, keys: list[Key]) -> None:
    """``data`` and the letters it came from (``keys``) into ``name`` in ONE commit; a conflict with
    another writer is retried, unless another replay took letters meanwhile (then nothing)."""
    from pyiceberg.exceptions import CommitFailedException

    from coordinator.iceberg_ext.snapshots import check_before_retry
    from icesink.shared.deadletter_table import add_ranges, property_key, read_ranges
    from icesink.shared.errors import ConfigError
    from icesink.shared.faults import crash_point, hold_point_blocking

    table = catalog.load_table(name)
    before = read_ranges(table, dl)
    for _attempt in range(COMMIT_ATTEMPTS):
        if read_ranges(table, dl) != before:
            raise ConfigError("deadletter.table", dl, f"one replay at a time: another replay committed to {name} "
                              "meanwhile; run this one again (it skips what is there)")
        fmt = table.properties.get("write.format.default", "parquet").lower()
        if fmt != "parquet":
            raise ConfigError(f"table {name} property write.format.default", fmt, "parquet (replay writes Parquet)")
        hold_point_blocking(settings, "replay.before-table-commit")  # fault tests: a sink round lands meanwhile
        try:
            with table.transaction() as tx:
                # pyiceberg retries a conflict by itself on the refreshed table, with the ranges
                # planned from this one: stop it if another replay changed them meanwhile
                check_before_retry(tx, lambda refreshed: _same_ranges(refreshed, dl, before))
                tx.append(data, branch=settings.commit_branch(name))
                tx.set_properties({property_key(dl): add_ranges(before, keys)})
            break
        except CommitFailedException as exc:
            log.warning("replay commit to %s conflicted (%s); retrying", name, exc)
            table = catalog.load_table(name)
    else:
        raise RuntimeError(f"replay commit to {name} kept conflicting ({COMMIT_ATTEMPTS} attempts); run again")
    log.info("replayed %d rows of %d dead letters into %s", data.num_rows, len(keys), name)
    crash_point(settings, "replay.after-table-commit")


def _same_ranges(table: Any, dl: str, before: Any) -> None:
    from pyiceberg.exceptions import CommitFailedException

    from icesink.shared.deadletter_table import read_ranges

    if read_ranges(table, dl) != before:
        raise CommitFailedException("another replay changed the replayed ranges meanwhile")


class Pipeline:
    """The worker's ingest (agents/ingest.py) over dead letters instead of fetches: the same
    transforms, screening, routing and decoding, without Kafka, Spark or the control topic.
    Schemas are not evolved (rows a table cannot hold fail again)."""

    def __init__(self, settings: Settings, catalog: Catalog, dl: str) -> None:
        from types import SimpleNamespace

        from prometheus_client import CollectorRegistry

        from agents.buffer import Buffers
        from agents.deadletter import DeadLetters
        from agents.debezium import DebeziumTransform
        from agents.decode import BatchDecoder
        from agents.formats import RecordFormat
        from agents.ingest import Ingest
        from agents.missing import MissingTables
        from agents.parts import Replica
        from agents.registry_source import registry_keys, registry_values
        from agents.routing import Router
        from agents.table_lookup import TableLookup
        from agents.tables import Target, target_of
        from agents.tasks import TaskOwner
        from agents.transforms.values import mongo_before_debezium
        from icesink.shared.metrics import Metrics
        from icesink.shared.offload import Offload

        # Bad records are taken, not sent: rows of the dead-letter table in the chunks.
        s = settings.model_copy(update={"dlq_topic": None, "errors_tolerance": "all", "deadletter_table": dl,
                                        "evolve_schema": False})
        self.settings, self.dl = s, dl
        metrics = Metrics(CollectorRegistry())
        self.offload = Offload()
        self.buffers = Buffers(2**62)
        self.targets: dict[str, Target] = {dl: target_of(dl, catalog.load_table(dl))}
        status: dict[str, Any] = {}
        registry, keys = registry_values(s, metrics, status), registry_keys(s, metrics, status)
        self.clients = [r[1] for r in (registry, keys) if r is not None]
        fmt = RecordFormat(s, registry=None if registry is None else registry[0], keys=None if keys is None else keys[0])
        pattern = s.debezium_target_pattern
        debezium = None if pattern is None else DebeziumTransform(
            pattern, s.value_converter_schemas_enable, s.schema_case_insensitive, fmt.registry,
            mongo=mongo_before_debezium(s.transform_chain))

        async def nothing(*_: Any) -> None:
            return None

        history = SimpleNamespace(has_run=lambda: _true(), has_committed=lambda: _true(), committed_tables=lambda: _none())
        missing = MissingTables()
        self.lookup = TableLookup(s, metrics, self.targets, missing, history, self.offload, fmt, debezium, None,
                                  nothing, self._fail)
        self.lookup.attach(catalog)
        decoder = BatchDecoder(s, fmt, Router(s, debezium, fmt.registry), debezium, None, self.targets, nothing)
        consumer = SimpleNamespace(pause_partitions=lambda tps: None, resume_partitions=lambda tps: None)
        owner = SimpleNamespace(owns=lambda st, g: True, seek=nothing, seek_all=nothing)
        app: Any = SimpleNamespace(consumer=consumer)  # pauses nothing: there is no consumer
        self.ingest = Ingest(s, metrics, Replica("replay", {}), self.buffers, missing, decoder, DeadLetters(s, metrics, "replay"),
                             self.lookup, app, owner, TaskOwner(self._fail), nothing, lambda: None)
        self.loaded = False

    @staticmethod
    def _fail(exc: Exception, exit_code: int = 2) -> None:
        raise exc

    async def close(self) -> None:
        for client in self.clients:
            await client.close()
        self.offload.close()

    async def convert(self, letters: pa.Table) -> Converted:
        """The rows each target table gets from ``letters`` (sorted by origin), and those that failed."""
        from agents.evolution import conform
        from icesink.shared.protocol import TopicPartition

        if not self.loaded:
            await self.lookup.load_configured()
            self.loaded = True
        generation = 1
        for start in range(0, letters.num_rows, BATCH):
            part = letters.slice(start, BATCH).to_pylist()
            for (topic, partition), msgs in _by_partition(part).items():
                tp = TopicPartition(topic, partition)
                if tp not in self.buffers.partitions:  # reads from its first letter on
                    self.buffers.claim(tp, generation)
                    self.buffers.resume(tp, msgs[0].offset, 0.0)
                st = self.buffers.partitions[tp]
                before = st.next_offset
                await self.ingest.buffer(st, msgs)
                if st.next_offset == before:  # held back: a table it routes to does not exist
                    from icesink.shared.errors import ConfigError

                    raise ConfigError("iceberg.tables.auto-create-enabled", self.settings.auto_create,
                                      f"the tables letters of {tp} route to, created (see the log)")
        snap = self.buffers.take(generation)
        self.buffers = type(self.buffers)(2**62)
        self.ingest.buffers = self.buffers
        ci = self.settings.schema_case_insensitive
        tables = snap.tables(lambda name, t: conform(t, self.targets[name].arrow_schema, case_insensitive=ci))
        for name in tables:
            if name != self.dl and self.targets[name].keys is not None:
                from icesink.shared.errors import ConfigError

                raise ConfigError(f"table {name}", "a mirror table", "a table without key columns (replay appends)")
        failed: dict[Key, tuple[str | None, str]] = {}
        if (dead := tables.pop(self.dl, None)) is not None:
            for r in dead.select(["topic", "partition", "offset", "tables", "error"]).to_pylist():
                failed[(r["topic"], r["partition"], r["offset"])] = (r["tables"], r["error"])
        return Converted(tables, failed)


def _by_partition(rows: list[dict[str, Any]]) -> dict[tuple[str, int], list[Msg]]:
    out: dict[tuple[str, int], list[Msg]] = {}
    for r in rows:
        ts = r["timestamp"]
        out.setdefault((r["topic"], r["partition"]), []).append(Msg(
            r["topic"], r["partition"], r["offset"], r["key"], r["value"],
            [(h["key"], h["value"]) for h in r["headers"] or ()], None if ts is None else int(ts.timestamp() * 1000)))
    return out


async def _true() -> bool:
    return True


async def _none() -> None:
    return None
