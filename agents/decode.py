"""Decoding a partition's fetch for its tables, in bulk (Arrow): the strategies of a worker's
ingest (agents/ingest.py) as one object, :class:`BatchDecoder`.

- a table's records decoded against its schema, through the Debezium transform or the record
  format, or with schema evolution against what the data needs (:meth:`BatchDecoder.decode`);
- the tables of a fan-out whose rows have one schema decoded together, once
  (:meth:`BatchDecoder.decode_together`), then split per table (:func:`split_converted`);
- a fan-out seen in earlier fetches read once against its schema and routed by the decoded
  route column (:meth:`BatchDecoder.decode_fanout`, :class:`FanoutPlan`).

Every step works on whole batches (Arrow, numpy): no per-record Python work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from agents import mirror
from agents.buffer import FanoutRows
from agents.convert import Converted, EpochUnit, Reject
from agents.debezium import CDC_COLUMN, DebeziumTransform
from agents.evolution import Evolver
from agents.formats import Grow, RecordFormat
from agents.routing import Router, Routes
from agents.tables import Target
from icesink.shared.config import Settings
from icesink.shared.errors import ConfigError
from icesink.shared.protocol import SchemaProposal
from icesink.shared.schema_changes import identifier_paths


@dataclasses.dataclass(frozen=True)
class FanoutPlan:
    """A fan-out remembered from earlier fetches: the schema its tables share (it holds the
    route field as a string column), their timestamp unit, and its tables as loaded then."""

    schema: pa.Schema
    unit: EpochUnit
    members: Mapping[str, Target]


@dataclasses.dataclass(frozen=True)
class SchemaGroup:
    """Tables of one fetch whose rows have one schema and timestamp unit: decoded together."""

    schema: pa.Schema
    unit: EpochUnit
    names: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class TableReject:
    """A record one table's decode rejected (its index into the fetch's values)."""

    reject: Reject
    table: str


@dataclasses.dataclass(frozen=True)
class FanoutBatch:
    """A fetch read the fan-out way: its routes, its rows (kept whole, each with its table),
    and the decode's rejects with their tables, as the usual way gives them."""

    routes: Routes
    rows: FanoutRows
    rejects: tuple[TableReject, ...]


@dataclasses.dataclass(frozen=True)
class Shared:
    """Tables decoded together (:meth:`BatchDecoder.decode_together`): each one's rows, and the
    Arrow bytes of the decodes they are slices of."""

    converted: dict[str, Converted]
    nbytes: int


@dataclasses.dataclass(frozen=True)
class DebeziumRows:
    """The record format's row decoder for Debezium change events: the transform's rows."""

    transform: DebeziumTransform
    values: Sequence[bytes]
    offsets: Sequence[int]
    keys: Sequence[bytes | None] = ()  # MongoDebeziumTransform before it: a partial update's _id

    def __call__(self, schema: pa.Schema, grow: Grow | None) -> Converted:
        return self.transform.apply(self.values, self.offsets, schema, grow=grow, keys=self.keys)


@dataclasses.dataclass(frozen=True)
class RowSchema:
    """What schema evolution infers of Debezium events: the row images' fields."""

    transform: DebeziumTransform
    values: Sequence[bytes]

    def __call__(self) -> pa.Schema:
        return self.transform.row_schema(self.values)


@dataclasses.dataclass(frozen=True)
class FormatDecode:
    """Schema evolution's decode of a batch against a probed schema: the record format's."""

    format: RecordFormat
    messages: Sequence[Any]
    values: Sequence[bytes]
    unit: EpochUnit
    rows: DebeziumRows | None

    def __call__(self, schema: pa.Schema) -> Converted:
        return self.format.convert(self.messages, self.values, schema, epoch_unit=self.unit, decode_values=self.rows)


class BatchDecoder:
    """Decodes fetches for their tables. ``targets`` is the replica's (shared with the ingest,
    which loads and creates tables); ``propose`` sends a schema change to the coordinator."""

    def __init__(self, settings: Settings, format: RecordFormat, router: Router, debezium: DebeziumTransform | None,
                 evolver: Evolver | None, targets: dict[str, Target],
                 propose: Callable[[SchemaProposal], Awaitable[None]]) -> None:
        self.settings = settings
        self.format = format
        self.router = router
        self.debezium = debezium
        self.evolver = evolver
        self.targets = targets
        self.propose = propose
        self.fanout: FanoutPlan | None = None  # only ever set for a top-level route field, without evolution or Debezium

    async def decode_together(self, by_table: Mapping[str, npt.NDArray[np.int64]], values: list[bytes],
                              messages: Sequence[Any], positions: Sequence[int]) -> Shared:
        """The tables of a fan-out whose rows have one schema, decoded together: one decode of
        their records, then each table's rows and rejects split off (:func:`split_converted`).
        A fetch routed to 200 tables gives most of them a record or two, and each decode has
        a fixed cost (it was most of a worker's Python time at 200 tables). Only plain tables
        (no schema evolution, no Debezium transform, not mirror tables), each record in one of
        them; anything else is decoded table by table. Also the Arrow bytes of the rows decoded
        together (each table's rows are slices of them)."""
        if self.evolver is not None or self.debezium is not None or len(by_table) < 2:
            return Shared({}, 0)
        building: list[tuple[pa.Schema, EpochUnit, list[str]]] = []
        for name in by_table:
            target = self.targets.get(name)
            if target is None or target.keys is not None:
                continue
            unit = self.settings.timestamp_unit_of(name)
            for schema, group_unit, names in building:
                if group_unit == unit and schema.equals(target.arrow_schema, check_metadata=True):
                    names.append(name)
                    break
            else:
                building.append((target.arrow_schema, unit, [name]))
        groups = [SchemaGroup(schema, unit, tuple(names)) for schema, unit, names in building]
        self._remember_fanout(groups, by_table)
        out: dict[str, Converted] = {}
        nbytes = 0
        for group in groups:
            if len(group.names) < 2:
                continue
            parts = [by_table[n] for n in group.names]
            union = np.sort(np.concatenate(parts))
            if len(union) > 1 and bool((union[1:] == union[:-1]).any()):
                continue  # a record routed to several of them: table by table
            first = group.names[0]
            converted = await self.decode(first, self.targets[first], [values[i] for i in union],
                                          [messages[positions[i]] for i in union])
            out.update(split_converted(converted, union, group.names, parts))
            nbytes += converted.table.nbytes
        return Shared(out, nbytes)

    def _remember_fanout(self, groups: Sequence[SchemaGroup], by_table: Mapping[str, npt.NDArray[np.int64]]) -> None:
        """After a fetch decoded the usual way: when all of its tables were one group of
        :meth:`decode_together` whose schema holds the route field as a string column, the
        next fetches are read once against that schema (:meth:`decode_fanout`)."""
        field = self.router.top_level_field
        one = groups[0] if len(groups) == 1 and len(groups[0].names) == len(by_table) > 1 else None
        if one is None or field is None or field in self.format.extras.names() or self.format.fold_case:
            self.fanout = None
            return
        index = one.schema.get_field_index(field)
        if index < 0 or one.schema.field(index).type not in (pa.string(), pa.large_string()):
            self.fanout = None
            return
        members = {n: self.targets[n] for n in one.names}
        plan = self.fanout
        if plan is not None and plan.unit == one.unit and plan.schema.equals(one.schema, check_metadata=True):
            members = {**plan.members, **members}  # tables of the fan-out seen in earlier fetches
        self.fanout = FanoutPlan(one.schema, one.unit, members)

    def decode_fanout(self, values: list[bytes], messages: Sequence[Any]) -> FanoutBatch | None:
        """A fetch of a fan-out (a topic routed to many tables of one schema) decoded ONCE,
        against that schema, and routed by the route field's column of the decoded rows: the
        usual way reads every record twice, once for its route field and once for its table
        (the route field's read was a third of a fetch's handling at 200 tables, py-spy). A
        record that does not decode is routed by the router alone, as the usual way routes it.
        The routes, the rows (kept whole, each with its table) and each decode reject with its
        table (indexes into ``values``), as the usual way gives them; or None to go the usual
        way: no fan-out remembered, a table not of the fan-out (a new one: the usual way creates
        it), a record routed to several tables."""
        plan = self.fanout
        if plan is None or len(values) < 2:
            return None
        field = self.router.top_level_field
        assert field is not None
        converted = self.format.convert(messages, values, plan.schema, epoch_unit=plan.unit)
        rows = np.asarray(converted.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        routes = self.router.routes_of(rows, converted.table.column(field))
        if converted.rejects:  # the usual way routes them first, then its decode rejects them
            bad = np.array([r.index for r in converted.rejects], dtype=np.int64)
            more = self.router.route([values[i] for i in bad])
            by_table = dict(routes.by_table)
            for name, idx in more.by_table.items():
                by_table[name] = np.sort(np.concatenate([by_table.get(name, bad[:0]), bad[idx]]))
            unrouted = [*routes.unrouted, *(dataclasses.replace(r, index=int(bad[r.index])) for r in more.unrouted)]
            routes = Routes(by_table, tuple(sorted(unrouted, key=lambda r: r.index)))
        # a table not a member (None is None would let a new one through, never created) or
        # reloaded since: the usual way
        members = plan.members
        if not routes.by_table or any(n not in members or self.targets.get(n) is not members[n] for n in routes.by_table):
            return None
        names = list(routes.by_table)
        owner = np.full(len(values), -1, dtype=np.int32)
        routed = 0
        for k, part in enumerate(routes.by_table.values()):
            owner[part] = k
            routed += len(part)
        if int((owner >= 0).sum()) != routed:  # a record routed to several tables
            return None
        row_owner = owner[rows]
        table = converted.table
        if len(rows) and int(row_owner.min()) < 0:  # records without a route: no table's rows or rejects
            keep = row_owner >= 0
            table, row_owner = table.filter(pa.array(keep)), row_owner[keep]
        counts = np.bincount(row_owner, minlength=len(names))
        if not counts.all():  # tables whose records all failed: no rows, only rejects
            renumber = np.cumsum(counts > 0, dtype=np.int32) - 1
            row_owner = renumber[row_owner]
        present = tuple(n for n, c in zip(names, counts, strict=True) if c)
        table_rejects = tuple(TableReject(r, names[owner[r.index]]) for r in converted.rejects if owner[r.index] >= 0)
        return FanoutBatch(routes, FanoutRows(table, row_owner, present), table_rejects)

    async def prepare(self, values: list[bytes], messages: Sequence[Any] = ()) -> list[bytes]:
        """Before a fetch is decoded: the schemas its registry values (and registry keys, for a
        key column: ``messages``' keys) name, looked up (a registry outage waits here, with capped
        backoff; the fetch is not taken meanwhile). Returns the values to decode: in Apicurio's
        headers mode framed from ``messages``' headers (one per value), else ``values``."""
        if self.format.registry is not None and values:
            if self.format.registry.headers is not None:
                values = list(self.format.registry.framed(values, [m.headers for m in messages]))
            await self.format.registry.prepare(values)
        if self.format.keys is not None and messages:
            keyed = [m for m in messages if m.key is not None]
            keys = [m.key for m in keyed]
            if keys and self.format.keys.headers is not None:  # Apicurio's headers mode
                keys = list(self.format.keys.framed(keys, [m.headers for m in keyed]))
            if keys:
                await self.format.keys.prepare(keys)
        return values

    def screen_changes(self, name: str, keys: tuple[str, ...], converted: Converted) -> Converted:
        """A mirror table's changes without a key value or a readable operation become rejects."""
        try:
            return mirror.screen(converted, keys, self.settings.cdc_field)
        except ValueError as exc:  # the setting does not fit the table: stop the replica, saying so
            raise ConfigError("iceberg.tables.cdc-field", self.settings.cdc_field,
                              f"a field of the rows of mirror table {name} ({exc})") from None

    async def decode(self, name: str, target: Target | None, values: list[bytes], messages: Sequence[Any]) -> Converted:
        """Decode against the table's schema (through the Debezium transform or the record
        format; key and metadata columns around either), or with evolution against what the
        data needs (agents/evolution.py): the records' Connect schemas say it (envelopes,
        Debezium with schemas), else their values do; schema changes are proposed to the
        coordinator."""
        unit = self.settings.timestamp_unit_of(name)
        if target is None:
            return self.format.convert(messages, values, None, epoch_unit=unit)
        schema, dbz = target.arrow_schema, self.debezium
        rows = None if dbz is None else DebeziumRows(dbz, values, [m.offset for m in messages],
                                                            [m.key for m in messages] if dbz.mongo is not None else ())
        if self.evolver is None or self.format.raw is not None:  # string or bytes values: nothing to evolve
            return self.format.convert(messages, values, schema, epoch_unit=unit, decode_values=rows)
        keep = identifier_paths(target.table)
        frozen = frozenset(self.format.extras.names() | ({CDC_COLUMN} if dbz is not None else set()))
        if self.format.envelope or self.format.registry is not None:  # each record states its schema
            growth = self.evolver.growth(name, schema, keep, frozen)
            out = growth.done(self.format.convert(
                messages, values, growth.schema, epoch_unit=unit, grow=growth, decode_values=rows))
        elif self.format.plain and dbz is None:
            out = self.evolver.decode(name, schema, values, keep)
        else:
            out = self.evolver.decode(name, schema, values, keep, frozen=frozen,
                                      infer=None if dbz is None else RowSchema(dbz, values),
                                      decode=FormatDecode(self.format, messages, values, unit, rows))
        if out.proposal is not None:
            await self.propose(out.proposal)
        return out.converted


def split_converted(converted: Converted, union: npt.NDArray[np.int64], names: Sequence[str],
                    parts: Sequence[npt.NDArray[np.int64]]) -> dict[str, Converted]:
    """One decode of the records ``union`` (ascending value indices, the disjoint ``parts`` of
    ``names`` together) as each table's own: its rows in input order (slices of one sort, no
    copy per table), their indices and its rejects counted within its own part, as
    :meth:`BatchDecoder.decode` of that part alone would give them."""
    owner = np.empty(int(union[-1]) + 1 if len(union) else 0, dtype=np.int64)
    for k, part in enumerate(parts):
        owner[part] = k
    row_values = union[converted.indices.to_numpy(zero_copy_only=False)]
    row_owner = owner[row_values]
    order = np.argsort(row_owner, kind="stable")
    rows = converted.table.take(pa.array(order, pa.int64()))
    counts = np.bincount(row_owner, minlength=len(names))
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rejects: dict[int, list[Reject]] = {}
    for r in converted.rejects:
        value = int(union[r.index])
        k = int(owner[value])
        rejects.setdefault(k, []).append(dataclasses.replace(r, index=int(np.searchsorted(parts[k], value))))
    out: dict[str, Converted] = {}
    for k, name in enumerate(names):
        start, count = int(starts[k]), int(counts[k])
        local = np.searchsorted(parts[k], row_values[order[start:start + count]])
        out[name] = Converted(rows.slice(start, count), pa.array(local, pa.int64()), tuple(rejects.get(k, ())))
    return out
