"""Which tables each record of a batch goes to (the reference sink's routing keys).

- No ``iceberg.tables.route-field``: every record goes to every table of ``iceberg.tables``.
- Static: the route field's value is matched (whole value, like Java's ``Matcher.matches``)
  against each table's ``iceberg.table.<table>.route-regex``; a record goes to every table whose
  regex matches. Tables without a regex get no records.
- Dynamic (``iceberg.tables.dynamic-enabled``): the value, lower-cased, is the table name
  (``namespace.table``).

The route field (a dotted path for nested fields; inside ``payload`` for Kafka Connect
envelopes; for Debezium change events a ``_cdc`` field such as ``_cdc.target`` or a field of
the row image, see :meth:`agents.debezium.DebeziumTransform.route_column`) is read for the whole batch in one bulk
parse; the tables of each distinct value are computed once. A record with no route (null or
missing field, no matching regex, a dynamic name that is not ``namespace.table``) is returned as
a :class:`Reject` with the reason, for the dead-letter path: never silently dropped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from agents.convert import Converted, Reject, decode_json
from icesink.shared.config import Settings
from icesink.shared.transform_settings import inserted_fields

if TYPE_CHECKING:
    from agents.debezium import DebeziumTransform
    from agents.formats.registry_values import RegistryValues

__all__ = ["Routes", "Router", "NAME_RE", "TOPIC_ROUTE", "topic_fields"]

#: The route field that routes each record by its topic (after any RegexRouter), no transform needed.
TOPIC_ROUTE = "@topic"


def topic_fields(settings: Settings) -> set[str]:
    """The route fields that mean the record's topic: ``@topic``, and the Kafka metadata's topic
    column (``_kafka_metadata_topic``, or ``_kafka_metadata.topic`` nested) when it is added."""
    out = {TOPIC_ROUTE} | {name for name, source, _ in inserted_fields(settings.transform_chain) if source == "topic"}
    metadata = settings.metadata_columns
    if metadata is not None:
        field, nested, _ = metadata
        out.add(f"{field}.topic" if nested else f"{field}_topic")
    return out

# namespace.table (namespaces may nest: a.b.table); Iceberg-friendly characters only.
NAME_RE = re.compile(r"^[a-z0-9_][a-z0-9_\-$]*(\.[a-z0-9_][a-z0-9_\-$]*)+$")


@dataclass(frozen=True)
class Routes:
    """The outcome of routing one batch: input indices per table, ascending, and the records
    that have no table (or could not be read)."""

    by_table: dict[str, npt.NDArray[np.int64]]
    unrouted: tuple[Reject, ...]


class Router:
    """Routes batches of raw JSON values; holds only a cache of value -> tables."""

    # Distinct route values remembered; past this the cache starts over (bounded memory).
    CACHE_LIMIT = 10_000

    def __init__(self, settings: Settings, debezium: DebeziumTransform | None = None,
                 registry: RegistryValues | None = None) -> None:
        """``registry``: schema-registry values' decoder; the route field is read from their rows."""
        self.field = settings.route_field
        self.registry = registry
        # Debezium change events are routed as the transform will make them: on a ``_cdc``
        # field (``_cdc.target``, the reference's way) or a field of the row image.
        self.debezium = debezium
        self.tables = settings.tables
        self.dynamic = settings.dynamic_tables
        self.regex = {t: re.compile(p) for t, p in settings.table_route_regex.items()}
        self._cache: dict[str, tuple[tuple[str, ...], str | None]] = {}
        #: Routed by the record's topic (after any RegexRouter): the shorthand ``@topic``, or the
        #: topic column of the Kafka metadata (the reference's KafkaMetadataTransform way).
        self.by_topic = self.field is not None and self.field in topic_fields(settings)
        self._schema: pa.Schema | None = None
        self._path = self.field
        if self.field is not None and settings.value_converter_schemas_enable and debezium is None:
            self._path = f"payload.{self.field}"  # Kafka Connect envelope: the record is the payload
        if self._path is not None:
            *parents, leaf = self._path.split(".")
            t: pa.DataType = pa.string()
            inner = pa.field(leaf, t)
            for name in reversed(parents):
                inner = pa.field(name, pa.struct([inner]))
            self._schema = pa.schema([inner])

    def route(self, values: Sequence[bytes], *, topics: pa.Array | None = None) -> Routes:
        """``topics``: each value's topic (after the transforms), for routing by topic."""
        n = len(values)
        if self._schema is None:
            every = np.arange(n, dtype=np.int64)
            return Routes({t: every for t in self.tables}, ())
        if self.by_topic:
            if topics is None:
                raise ValueError(f"routing on {self.field} needs each record's topic")
            column = topics.dictionary_decode() if pa.types.is_dictionary(topics.type) else topics
            return self.routes_of(np.arange(n, dtype=np.int64), pa.chunked_array([column], pa.string()))
        converted, column = self._read(values)
        rows = np.asarray(converted.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        return self.routes_of(rows, column, converted.rejects)

    @property
    def top_level_field(self) -> str | None:
        """The route field when it is a top-level field of plain JSON records (no envelope, no
        Debezium): a column of their decode against a table schema holding it gives the same
        values as :meth:`route`'s own read (agents/ingest.py decodes a fan-out once that way)."""
        if self.debezium is not None or self._path is None or "." in self._path or self.by_topic:
            return None
        return self._path

    def routes_of(self, rows: npt.NDArray[np.int64], column: pa.ChunkedArray | pa.Array,
                  unreadable: Sequence[Reject] = ()) -> Routes:
        """The routes of the records ``rows`` (ascending input indices) whose route field values
        are ``column`` (one per row, null where missing); ``unreadable``: records that could
        not be read, unrouted as they are."""
        unrouted = list(unreadable)
        encoded = column.combine_chunks().dictionary_encode() if len(column) else pa.array([], pa.string()).dictionary_encode()
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        nulls = np.asarray(encoded.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        members: dict[str, list[npt.NDArray[np.int64]]] = {}
        for code, value in enumerate(encoded.dictionary.to_pylist()):
            tables, problem = self._tables_of(value)
            picked = rows[(codes == code) & ~nulls]
            if not tables:
                unrouted.extend(Reject(int(i), problem or "no route", self.field) for i in picked)
                continue
            for t in tables:
                members.setdefault(t, []).append(picked)
        unrouted.extend(
            Reject(int(i), f"no route: field {self.field} is null or missing", self.field) for i in rows[nulls]
        )
        by_table = {t: np.sort(np.concatenate(parts)) for t, parts in members.items()}
        return Routes(by_table, tuple(sorted(unrouted, key=lambda r: r.index)))

    def _read(self, values: Sequence[bytes]) -> tuple[Converted, pa.ChunkedArray | pa.Array]:
        """The route field's value of every readable record (null where missing)."""
        if self.debezium is not None:
            assert self.field is not None
            converted = self.debezium.route_column(values, self.field)
            return converted, converted.table.column(0)
        assert self._path is not None  # a route field is set whenever this router reads records
        if self.registry is not None:
            converted = self.registry.column(values, self._path)
            return converted, converted.table.column(0)
        converted = decode_json(values, self._schema)
        column = converted.table.column(0)
        for _ in range(self._path.count(".")):
            column = pc.struct_field(column, [0])
        return converted, column

    def _tables_of(self, value: str) -> tuple[tuple[str, ...], str | None]:
        hit = self._cache.get(value)
        if hit is None:
            if len(self._cache) >= self.CACHE_LIMIT:
                self._cache.clear()
            hit = self._cache[value] = self._compute(value)
        return hit

    def _compute(self, value: str) -> tuple[tuple[str, ...], str | None]:
        if self.dynamic:
            name = value.strip().lower()
            if NAME_RE.match(name):
                return (name,), None
            return (), f"no route: {self.field} value {value[:80]!r} is not a namespace.table name"
        tables = tuple(t for t, rx in self.regex.items() if rx.fullmatch(value))
        if tables:
            return tables, None
        return (), f"no route: {self.field} value {value[:80]!r} matches no table's route-regex"
