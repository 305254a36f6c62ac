"""An ORC file's column metrics for its manifest entry, from the column statistics in its footer
(pyarrow's ORC reader does not expose them, so the file tail is read here: the postscript, then
the footer's ``types`` and ``statistics`` protobuf messages, decompressed with the file's codec).

As Iceberg's ``OrcMetrics``: for each primitive column outside lists and maps, the value count
(the file's rows), the null count (rows less the column's values when it has nulls) and, by the
table's metrics mode, lower and upper bounds (booleans, integers, dates, decimals, strings with
exact minimum and maximum; strings truncated as the mode says). Float and double columns get counts
only (Iceberg's own writer takes their bounds from the values, NaN aside, not the statistics), and so
do timestamps (ORC keeps milliseconds in the writer's zone) and binary columns (no minimum).
Columns are matched to the table's fields by name: Spark's ORC files carry no Iceberg ids.

No Spark here: plain bytes, cramjam and pyiceberg.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import cramjam
from pyiceberg.io.pyarrow import StatisticsCollector, StatsAggregator
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType, DateType, DecimalType, IcebergType, IntegerType, ListType, LongType, MapType, NestedField, StringType,
    StructType,
)

__all__ = ["orc_metrics"]

_Message = dict[int, list[Any]]
_STRUCT, _LIST, _MAP = 12, 10, 11  # ORC Type.Kind
_PHYSICAL: dict[type[IcebergType], str] = {
    BooleanType: "BOOLEAN", IntegerType: "INT32", LongType: "INT64", DateType: "INT32", StringType: "BYTE_ARRAY",
}


def orc_metrics(data: bytes, schema: Schema, plan: Mapping[int, StatisticsCollector]) -> dict[str, Any]:
    """``DataFile.from_args`` keywords (record count, value and null counts, bounds) of the ORC file
    whose last bytes (at least its postscript and footer) are ``data``; ``plan``: pyiceberg's
    ``compute_statistics_plan`` (each field's metrics mode)."""
    footer = _footer(data)
    rows = _int(footer, 6)
    types, stats = [_parse(t) for t in footer.get(4, [])], [_parse(s) for s in footer.get(7, [])]
    values: dict[int, int] = {}
    nulls: dict[int, int] = {}
    lower: dict[int, bytes] = {}
    upper: dict[int, bytes] = {}
    for column, field in _columns(types, schema):
        collector = plan.get(field.field_id)
        if collector is None or column >= len(stats) or collector.mode.type.value == "none":
            continue
        stat = stats[column]
        values[field.field_id] = rows
        nulls[field.field_id] = rows - _int(stat, 1) if _int(stat, 10) else 0
        if collector.mode.type.value in ("truncate", "full"):
            bounds = _bounds(stat, field.field_type)
            if bounds is not None:
                aggregator = StatsAggregator(collector.iceberg_type, _physical(field.field_type), collector.mode.length)
                aggregator.update_min(bounds[0])
                aggregator.update_max(bounds[1])
                if (low := aggregator.min_as_bytes()) is not None:
                    lower[field.field_id] = low
                if (high := aggregator.max_as_bytes()) is not None:
                    upper[field.field_id] = high
    return {"record_count": rows, "value_counts": values, "null_value_counts": nulls, "lower_bounds": lower,
            "upper_bounds": upper}


def _physical(t: IcebergType) -> str:
    return "FIXED_LEN_BYTE_ARRAY" if isinstance(t, DecimalType) else _PHYSICAL[type(t)]


def _bounds(stat: _Message, t: IcebergType) -> tuple[Any, Any] | None:
    """The column's minimum and maximum as pyiceberg values, or None (no usable statistics)."""
    if _int(stat, 1) == 0:
        return None  # only nulls
    if isinstance(t, (IntegerType, LongType)) and 2 in stat:
        ints = _parse(stat[2][-1])
        return (_zigzag(_int(ints, 1)), _zigzag(_int(ints, 2))) if 1 in ints and 2 in ints else None
    if isinstance(t, DateType) and 7 in stat:
        dates = _parse(stat[7][-1])
        return (_zigzag(_int(dates, 1)), _zigzag(_int(dates, 2))) if 1 in dates and 2 in dates else None
    if isinstance(t, StringType) and 4 in stat:
        text = _parse(stat[4][-1])  # exact minimum and maximum only (lowerBound/upperBound: truncated by ORC)
        return (text[1][-1].decode(), text[2][-1].decode()) if 1 in text and 2 in text else None
    if isinstance(t, DecimalType) and 6 in stat:
        dec = _parse(stat[6][-1])
        if 1 not in dec or 2 not in dec:
            return None
        quantum = Decimal(1).scaleb(-t.scale)
        return Decimal(dec[1][-1].decode()).quantize(quantum), Decimal(dec[2][-1].decode()).quantize(quantum)
    if isinstance(t, BooleanType) and 5 in stat:
        trues = _packed(_parse(stat[5][-1]).get(1, []))
        n_true = trues[0] if trues else 0
        return n_true == _int(stat, 1), n_true > 0  # min True when every value is; max True when one is
    return None


def _columns(types: list[_Message], schema: Schema) -> list[tuple[int, NestedField]]:
    """(ORC column id, table field) of every primitive column outside lists and maps, by name."""
    out: list[tuple[int, NestedField]] = []

    def visit(column: int, struct: StructType) -> None:
        orc_type = types[column]
        children = _packed(orc_type.get(2, []))
        names = [n.decode() for n in orc_type.get(3, [])]
        by_name = {f.name: f for f in struct.fields}
        for child, name in zip(children, names, strict=False):
            field = by_name.get(name)
            if field is None or child >= len(types):
                continue
            kind = _int(types[child], 1)
            if isinstance(field.field_type, StructType) and kind == _STRUCT:
                visit(child, field.field_type)
            elif not isinstance(field.field_type, (ListType, MapType, StructType)) and kind not in (_LIST, _MAP, _STRUCT):
                out.append((child, field))

    if types and _int(types[0], 1) == _STRUCT:
        visit(0, schema.as_struct())
    return out


# ORC's file tail ----------------------------------------------------------------------------

_CODECS = {0: "none", 1: "zlib", 2: "snappy", 4: "lz4", 5: "zstd"}


def _footer(data: bytes) -> _Message:
    ps_length = data[-1]
    postscript = _parse(data[-1 - ps_length:-1])
    footer_length = _int(postscript, 1)
    codec = _CODECS.get(_int(postscript, 2))
    if codec is None:
        raise ValueError(f"ORC compression kind {_int(postscript, 2)} is not read here")
    end = len(data) - 1 - ps_length
    if footer_length > end:
        raise ValueError("the ORC footer is longer than the bytes given")
    raw = data[end - footer_length:end]
    return _parse(raw if codec == "none" else _decompress(raw, codec, _int(postscript, 3) or 256 * 1024))


def _decompress(raw: bytes, codec: str, block_size: int) -> bytes:
    """ORC's compressed stream: chunks, each a 3-byte little-endian header (length << 1 | original)."""
    out = bytearray()
    pos = 0
    while pos < len(raw):
        header = raw[pos] | raw[pos + 1] << 8 | raw[pos + 2] << 16
        length, original = header >> 1, header & 1
        chunk = raw[pos + 3:pos + 3 + length]
        pos += 3 + length
        if original:
            out += chunk
        elif codec == "zlib":
            out += zlib.decompress(chunk, -15)
        elif codec == "snappy":
            out += bytes(cramjam.snappy.decompress_raw(chunk))
        elif codec == "lz4":
            out += bytes(cramjam.lz4.decompress_block(chunk, output_len=block_size))
        else:
            out += bytes(cramjam.zstd.decompress(chunk))
    return bytes(out)


def _parse(buf: bytes) -> _Message:
    """A protobuf message's fields: number -> values (varints as ints, length-delimited as bytes,
    fixed64 as the 8 raw bytes)."""
    out: _Message = {}
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"protobuf wire type {wire} in an ORC file tail")
        out.setdefault(number, []).append(value)
    return out


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _int(message: _Message, number: int) -> int:
    values = message.get(number)
    return int(values[-1]) if values else 0


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _packed(values: list[Any]) -> list[int]:
    """A repeated varint field, packed (bytes) or not (ints)."""
    out: list[int] = []
    for v in values:
        if isinstance(v, bytes):
            pos = 0
            while pos < len(v):
                n, pos = _varint(v, pos)
                out.append(n)
        else:
            out.append(v)
    return out

