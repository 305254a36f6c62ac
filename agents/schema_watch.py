"""When a worker reloads a table another tool changed (no I/O here: the load is injected).

The table is the schema's truth: a column added by another tool (Spark's ``ALTER TABLE ... ADD
COLUMN``, pyiceberg's ``update_schema``) is filled by the running workers without a restart,
with schema evolution off as well as on. The cached schema is checked against the top-level
fields of a small sample of each fetch's records for a table (a couple of records, never every
record: agents/table_lookup.py ``TableLookup.refresh``); a field the cached schema lacks and
that is new here reloads the table at once; one the table still lacked at that reload, at most
once per ``min_interval_s`` for that table (records that keep carrying a field the table does not
have cost one catalog load per interval, not one per fetch). The fetch is then decoded against
the reloaded schema, so its values land.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Generic, TypeVar

import pyarrow as pa

__all__ = ["RELOAD_MIN_INTERVAL_S", "SchemaWatch", "unknown_fields"]

RELOAD_MIN_INTERVAL_S = 10.0

T = TypeVar("T")


def unknown_fields(schema: pa.Schema, seen: Iterable[str], built: frozenset[str], *,
                   case_insensitive: bool = False) -> set[str]:
    """Of the top-level field names ``seen`` in records, those ``schema`` lacks; ``built``:
    columns the sink makes itself (key, metadata, ``_cdc``), never the records' news."""
    if case_insensitive:
        have = {n.lower() for n in schema.names} | {n.lower() for n in built}
        return {n for n in seen if n.lower() not in have}
    have = set(schema.names) | built
    return {n for n in seen if n not in have}


class SchemaWatch(Generic[T]):
    """Per worker: when each table was last reloaded for fields its cached schema lacked, and
    which of those fields the table did not have then either. ``load(name)`` reloads a table
    (None: it does not exist any more); ``schema_of`` is a loaded table's Arrow schema.

    A field never seen before reloads at once (a column just added is filled from the first
    fetch that carries it); a field the last reload showed the table lacks reloads at most once
    per ``min_interval_s`` (records that keep carrying a field the table does not have, as the
    reference sink drops it without evolution). At most ``max_absent`` such fields are
    remembered per table; past that every field waits for the interval (records whose
    top-level keys are ever new would otherwise cost a catalog load per fetch)."""

    def __init__(self, load: Callable[[str], Awaitable[T | None]], schema_of: Callable[[T], pa.Schema], *,
                 min_interval_s: float = RELOAD_MIN_INTERVAL_S, clock: Callable[[], float] = time.monotonic,
                 case_insensitive: bool = False, built: frozenset[str] = frozenset(), max_absent: int = 1000) -> None:
        self.load = load
        self.schema_of = schema_of
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.case_insensitive = case_insensitive
        self.built = built
        self.max_absent = max_absent
        self.last: dict[str, float] = {}  # table -> when it was last reloaded here
        self.absent: dict[str, set[str]] = {}  # table -> fields records carry that it lacked at that reload

    async def check(self, name: str, schema: pa.Schema, seen: Iterable[str]) -> T | None:
        """The table reloaded, if records carry a field ``schema`` lacks that is new here, or
        the table was not reloaded for the fields it lacks in the last ``min_interval_s``; else
        None (nothing to do)."""
        ci = self.case_insensitive
        unknown = unknown_fields(schema, seen, self.built, case_insensitive=ci)
        if not unknown:
            return None
        absent = self.absent.setdefault(name, set())
        news = {n.lower() for n in unknown} - absent if ci else unknown - absent
        now = self.clock()
        last = self.last.get(name)
        full = len(absent) >= self.max_absent
        if last is not None and now - last < self.min_interval_s and (not news or full):
            return None
        self.last[name] = now
        loaded = await self.load(name)
        still = unknown if loaded is None else unknown_fields(self.schema_of(loaded), unknown, self.built,
                                                               case_insensitive=ci)
        for n in still:
            if len(absent) < self.max_absent:
                absent.add(n.lower() if ci else n)
        return loaded
