"""The tables a worker replica writes to, as its catalog has them: loaded, created from the
first records routed to them (auto-create), reloaded after a schema evolution, and waited for
when they do not exist (agents/missing.py). Two parts: :class:`GroupHistory` (what the group
did before: a completed round, the tables it committed to) and :class:`TableLookup`, which
asks it whether a missing table was dropped (waited for) or never existed (refused)."""

from __future__ import annotations

import asyncio
import json

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyiceberg.catalog import Catalog

from agents.buffer import Buffers, Chunk
from agents.debezium import CDC_COLUMN, DebeziumTransform
from agents.evolution import Evolver
from agents.formats import RecordFormat
from agents.formats.extras import KeyColumnUnknown
from agents.missing import MissingTables
from agents.schema_watch import SchemaWatch
from agents.tables import (
    Target, create_targets, holds_group_state, load_target, namespace_exists, not_created, target_of,
)
from icesink.shared.config import Settings
from icesink.shared.control import ControlReader
from icesink.shared.deadletter_table import ensure_table
from icesink.shared.errors import ConfigError
from icesink.shared.iceberg import split_name
from icesink.shared.metrics import Metrics
from icesink.shared.offload import Offload
from icesink.shared.protocol import CommitToTable, SchemaProposal, TopicPartition
from icesink.shared.signing import Keyring

if TYPE_CHECKING:
    from pyiceberg.schema import Schema

log = logging.getLogger(__name__)

COMMITTED_SCAN_S = 60.0  # reading the control log for the tables the group committed to


class History(Protocol):
    """What the table lookup asks of the group's past (:class:`GroupHistory`)."""

    async def has_run(self) -> bool: ...

    async def has_committed(self) -> bool: ...

    async def committed_tables(self) -> set[str] | None: ...


class GroupHistory:
    """Whether the group ran before (a table missing now was dropped, not a typo of a first
    start) and which tables it committed to, from its control topic and its tables; each read
    once, remembered in ``missing`` (agents/missing.py)."""

    def __init__(self, settings: Settings, bootstrap: str, keyring: Keyring, missing: MissingTables,
                 targets: dict[str, Target], offload: Offload) -> None:
        self.settings = settings
        self.bootstrap = bootstrap
        self.keyring = keyring  # the group's key: the control log is read signed
        self.missing = missing
        self.targets = targets
        self.offload = offload
        self.catalog: Catalog | None = None  # once loaded (attach)

    def attach(self, catalog: Catalog) -> None:
        self.catalog = catalog

    async def has_run(self) -> bool:
        """Whether the group completed a round (the coordinator's group has a committed offset)
        or a table holds its sink state (where its signing began: icesink/shared/group_secret.py)."""
        if not self.missing.group_has_run:
            group = self.settings.group_id
            reader = ControlReader(self.bootstrap, self.settings.control_topic, group,
                                   self.settings.control_client_kwargs(), commit_group=self.settings.coordinator_group)
            await reader.start()
            try:
                ran = await reader.committed() is not None
            finally:
                await reader.stop()
            self.missing.group_has_run = ran or await self._tables_hold_state()
        return self.missing.group_has_run

    async def has_committed(self) -> bool:
        """Whether the group committed rows to a table: it has run, and its control log holds a
        CommitToTable (or, truncated, cannot tell) or a table holds its sink state. A new group's
        first round comes one interval after its launch and can complete before its first
        record, committing no table: a table missing now is still a first start's typo."""
        if not self.missing.group_has_committed and await self.has_run():
            committed = await self.committed_tables()
            self.missing.group_has_committed = committed is None or bool(committed) or await self._tables_hold_state()
        return self.missing.group_has_committed

    async def _tables_hold_state(self) -> bool:
        names = sorted(set(self.settings.tables) | set(self.targets))
        return await self.offload.run(holds_group_state, self.catalog, names, self.settings.group_id)

    async def committed_tables(self) -> set[str] | None:
        """The tables the group committed to, as its control log shows (CommitToTable events,
        read once from the log's start, signed by the group's key) and as read since; None if the
        log cannot tell: truncated (its first events deleted), or not read in time."""
        if self.missing.committed is None:
            reader = ControlReader(self.bootstrap, self.settings.control_topic, self.settings.group_id,
                                   self.settings.control_client_kwargs(), secret=self.keyring)
            names: set[str] = set()
            await reader.start()
            try:
                start = await reader.seek_to_beginning()
                end = await reader.end_offset()
                deadline = time.monotonic() + COMMITTED_SCAN_S
                complete = start == 0
                while complete and await reader.position() < end:
                    if time.monotonic() > deadline:
                        log.warning("reading control topic %r to offset %d for the tables the group committed to "
                                    "timed out: a missing table is waited for as if dropped",
                                    self.settings.control_topic, end)
                        complete = False
                        break
                    names.update(ev.table for _, ev in await reader.read(1.0) if isinstance(ev, CommitToTable))
            finally:
                await reader.stop()
            self.missing.committed, self.missing.log_complete = names, complete
        if not self.missing.log_complete:
            return None
        return self.missing.committed | self.missing.seen_committed


class TableLookup:
    """The tables of ``targets`` (shared with the decoder and the round responder), as the
    catalog has them. ``send`` puts a schema proposal on the control topic; ``fail`` stops the
    replica (a table back with settings that do not fit it)."""

    def __init__(self, settings: Settings, metrics: Metrics, targets: dict[str, Target], missing: MissingTables,
                 history: History, offload: Offload, record_format: RecordFormat, debezium: DebeziumTransform | None,
                 evolver: Evolver | None, send: Callable[[SchemaProposal], Awaitable[object]],
                 fail: Callable[[Exception], None]) -> None:
        self.settings = settings
        self.metrics = metrics
        self.targets = targets
        self.missing = missing
        self.history = history
        self.offload = offload
        self.format = record_format
        self.debezium = debezium
        self.evolver = evolver
        self.send = send
        self.fail = fail
        self.catalog: Catalog | None = None  # once loaded (attach)
        built = frozenset(record_format.extras.names() | ({CDC_COLUMN} if debezium is not None else set()))
        self.watch: SchemaWatch[Target] = SchemaWatch(self._reload, lambda t: t.arrow_schema,
                                                      case_insensitive=settings.schema_case_insensitive, built=built)

    def attach(self, catalog: Catalog) -> None:
        self.catalog = catalog

    async def _reload(self, name: str) -> Target | None:
        return await self.offload.run(load_target, self.catalog, name, self.settings)

    async def refresh(self, by_table: Mapping[str, npt.NDArray[np.int64]], values: Sequence[bytes]) -> bool:
        """Before a fetch is decoded: reload the tables whose records carry a top-level field
        their cached schema lacks (a column another tool added: agents/schema_watch.py), at
        most once per interval a table. A sample of the fetch is looked at, never every record:
        the first and last record of each table (one inferring parse for plain JSON). Whether
        a table's schema changed (then the fetch is decoded against the new one)."""
        if self.format.raw is not None:  # string or bytes values: no fields
            return False
        samples = {name: sorted({int(idx[0]), int(idx[-1])}) for name, idx in by_table.items()
                   if len(idx) and name in self.targets}
        if not samples:
            return False
        try:
            seen = self._fields_seen(samples, values)
        except Exception as exc:  # noqa: BLE001 - a sample that does not parse: its records are rejects
            log.debug("schema check of a fetch skipped: %s", exc)
            return False
        changed = False
        for name, fields in seen.items():
            old = self.targets[name]
            try:
                fresh = await self.watch.check(name, old.arrow_schema, fields)
            except ConfigError as exc:  # reloaded, but the settings do not fit it now
                self.fail(exc)
                return changed
            except Exception as exc:  # noqa: BLE001 - the catalog is away: looked at again after the interval
                log.warning("reloading table %s (its records carry fields its schema lacks) failed: %s", name, exc)
                continue
            if fresh is None or fresh.arrow_schema.equals(old.arrow_schema, check_metadata=True):
                continue
            log.info("table %s was changed by another writer: its columns are now %s (were %s)", name,
                     ", ".join(fresh.arrow_schema.names), ", ".join(old.arrow_schema.names))
            self.targets[name] = fresh
            if self.evolver is not None:
                self.evolver.refreshed(name, fresh.arrow_schema)
            changed = True
        return changed

    def _fields_seen(self, samples: Mapping[str, list[int]], values: Sequence[bytes]) -> dict[str, set[str]]:
        """The top-level field names the sampled records of each table carry."""
        if self.debezium is not None:
            dbz = self.debezium
            return {name: set(dbz.row_schema([values[i] for i in idx]).names) for name, idx in samples.items()}
        if self.format.plain:  # a few small objects: their keys, for every table of the fetch at once
            names: set[str] = set()
            for i in sorted({i for v in samples.values() for i in v}):
                doc = json.loads(values[i])  # Arrow's inferring reader costs ~0.5 ms a fetch; this ~10 us
                if isinstance(doc, dict):
                    names.update(doc)
            return {name: names for name in samples}
        out = {}
        for name, idx in samples.items():
            found = self.format.table_schema([values[i] for i in idx])
            if found is not None:
                out[name] = set(_names(found))
        return out

    async def load_configured(self) -> None:
        """Load the configured tables; once the group has run, those that do not exist are
        shown and looked up from now (a first start refuses at its first record)."""
        for name in self.settings.tables:
            target = await self.offload.run(load_target, self.catalog, name, self.settings)
            if target is not None:
                self.targets[name] = target
        if (dl := self.settings.deadletter_table) is not None:  # created if missing, with its fixed schema
            self.targets[dl] = target_of(dl, await self.offload.run(ensure_table, self.catalog, dl))
        absent = [name for name in self.settings.tables if name not in self.targets]
        if absent and not self.settings.auto_create and await self.history.has_committed():
            for name in absent:
                self.wait_for(name)

    async def propose(self, proposal: SchemaProposal) -> None:
        try:
            await self.send(proposal)
            self.metrics.schema_proposals.labels(table=proposal.table).inc()
        except Exception as exc:  # re-sent at the next round while the data waits for it
            log.warning("schema proposal for %s not sent (%s); retried at the next round", proposal.table, exc)

    async def evolution_ready(self, buffers: Buffers) -> Callable[[Chunk], bool] | None:
        """At a round: reload the tables buffered data was decoded for with an evolved schema
        (the coordinator applied the proposals before this round); a chunk is ready when its
        tables can hold it. Data not ready waits; its proposal is sent again."""
        if self.evolver is None:
            return None
        for name in self.evolver.tables_to_reload(buffers, self.targets):
            target = await self.offload.run(load_target, self.catalog, name, self.settings)
            if target is not None:
                self.targets[name] = target
                self.evolver.refreshed(name, target.arrow_schema)
        for name in list(self.evolver.schemas):
            proposal = self.evolver.pending_proposal(name, self.targets[name].arrow_schema)
            if proposal is not None:
                await self.propose(proposal)
        return self.evolver.ready(self.targets)

    async def targets_of(self, wanted: Mapping[str, list[bytes]]) -> dict[str, Target | None]:
        """The tables ``wanted`` names, each loaded if it exists (a dynamic route to an existing
        table), else auto-created from its records (None: no record tells its schema). Their
        loads overlap on the offload threads, and the tables missing are created together
        (agents/tables.py ``create_targets``: one transaction on the SQL catalog): 200 new
        tables one after another held the first fetch about 150 ms each. All loads finish
        before the first error, if any, is raised."""
        names = list(wanted)
        got = await asyncio.gather(*(self.offload.run(load_target, self.catalog, n, self.settings) for n in names),
                                   return_exceptions=True)
        for result in got:
            if isinstance(result, BaseException):
                raise result
        found: dict[str, Target | None] = {n: t for n, t in zip(names, got, strict=True)
                                           if not isinstance(t, BaseException)}
        inferred = {}
        for name in names:
            if found[name] is None and (schema := self._inferred(name, wanted[name])) is not None:
                inferred[name] = schema
        if inferred:
            found.update(await self.offload.run(create_targets, self.catalog, self.settings, inferred))
        for name, target in found.items():
            if target is not None:
                self.targets[name] = target
        return found

    def _inferred(self, name: str, values: list[bytes]) -> pa.Schema | Schema | None:
        """The schema a new table ``name`` gets from these records (None: no record tells)."""
        try:
            if self.debezium is not None:
                return self.format.with_extras(self.debezium.infer_schema(values))
            return self.format.table_schema(values, timestamp_fields=self.settings.timestamp_fields_of(name))
        except KeyColumnUnknown:  # registry keys: no key schema known yet
            return None

    async def held_back(self, tp: TopicPartition, names: Iterable[str]) -> list[str]:
        """Of the tables ``names`` records of ``tp`` go to, those it waits for (agents/missing.py):
        then ``tp`` is held. A table not loaded is looked up; without auto-create, one that does
        not exist is refused on the group's first start (exit code 2) and waited for after."""
        missing = []
        for name in names:
            if name in self.targets:
                continue
            if name not in self.missing.tables:
                if self.settings.auto_create:
                    continue  # created from its records (target)
                target = await self.offload.run(load_target, self.catalog, name, self.settings)
                if target is not None:
                    self.targets[name] = target
                    continue
                if not await self._dropped(name):
                    namespace, _ = split_name(name)
                    raise not_created(name, await self.offload.run(namespace_exists, self.catalog, namespace))
                self.wait_for(name)
            missing.append(name)
        if missing:
            self.missing.hold(tp, missing)
        return missing

    def wait_for(self, name: str) -> None:
        if self.missing.add(name):
            self.metrics.table_missing.labels(table=name).set(1)
            log.warning("table %s does not exist (dropped by another writer?) and iceberg.tables.auto-create-enabled "
                        "is false: partitions with records for it wait until it is back (recreated with the same "
                        "schema, partition spec and location); the other partitions go on", name)

    async def _dropped(self, name: str) -> bool:
        """Whether ``name``, which does not exist, existed for the group (agents/missing.py):
        the group committed rows and the table is configured, or the group committed to it (or
        its control log, truncated, cannot tell)."""
        if not await self.history.has_committed():
            return False
        if name in self.settings.tables:
            return True
        committed = await self.history.committed_tables()
        return committed is None or name in committed

    async def look_for_missing(self) -> list[TopicPartition]:
        """Look each missing table up again once its backoff is over (from the housekeeping);
        returns the partitions that tables back freed, to read on from where they stopped."""
        freed: list[TopicPartition] = []
        for name in self.missing.due():
            error = None
            try:
                target = await self.offload.run(load_target, self.catalog, name, self.settings)
            except ConfigError as exc:  # back, but the settings do not fit it (mirror keys, column properties)
                self.fail(exc)
                return freed
            except Exception as exc:  # noqa: BLE001 - the catalog is away: looked up again after the backoff
                target, error = None, f"{type(exc).__name__}: {exc}"
            if target is None:
                if self.missing.still_missing(name, error):
                    m = self.missing.tables[name]
                    log.warning("table %s still does not exist (%d look-ups%s); held partitions: %s", name,
                                m.attempts, f", the last failed: {error}" if error else "",
                                ", ".join(map(str, sorted(m.held))) or "none")
                continue
            self.targets[name] = target
            found = self.missing.found(name)
            self.metrics.table_missing.labels(table=name).set(0)
            log.info("table %s exists again: partitions %s read on", name, ", ".join(map(str, found)) or "none")
            freed += found
        return freed


def _names(schema: pa.Schema | Schema) -> list[str]:
    return schema.names if isinstance(schema, pa.Schema) else [f.name for f in schema.fields]
