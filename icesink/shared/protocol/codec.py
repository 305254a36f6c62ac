"""The control protocol's codec: events (:mod:`icesink.shared.protocol.events`) to bytes and back.

On the wire each event is one JSON object ``{"v": 1, "type": "<tag>", ...fields}`` with sorted
keys (``v`` 2 when it holds a field that older readers must not ignore: :data:`_SINCE`), so
bytes are stable and old events stay readable (golden bytes in tests/unit/test_events.py).
Both directions follow the event class's declared field types, never field names: ``bytes``
is base64 text, tuples are JSON lists, nested dataclasses are objects. The control topic is
input, not trust: :func:`decode` checks every field against its declared type and range and
raises a :class:`ProtocolError` naming the control offset, the event type and the field for
anything else (a newer version, an unknown type, more than :data:`MAX_EVENT_BYTES`); fields it
does not know are ignored, so events of a newer minor change stay readable.
"""

from __future__ import annotations

import base64
import json
from dataclasses import MISSING, fields, is_dataclass
from types import UnionType
from typing import Any, Union, assert_never, get_args, get_origin, get_type_hints

from icesink.shared.errors import ProtocolError
from icesink.shared.protocol.events import (
    EVENT_TYPES, AlterPositions, Claim, CommitComplete, CommitRequest, CommitToTable, DataComplete, DataWritten, Event, FileInfo,
    OffsetRange, Owner, Rewind, Resume, SchemaProposal, StartCommit, TopicPartition,
)

VERSION = 2

# The largest encoded event a reader accepts (and a writer may send). The control producer's
# max_request_size (icesink/shared/control.py) is 1 MiB more: room for the key and the batch framing.
MAX_EVENT_BYTES = 15 * 1024 * 1024

def _to_json(value: Any) -> Any:
    """By type, as :func:`_value` reads it back: bytes as base64 text, dataclasses as objects
    of their fields, tuples as lists, scalars as they are."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_json(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple):
        return [_to_json(v) for v in value]
    return value


#: Fields a reader of an older version must not ignore, with the version that added them. An
#: event is written with the oldest version that holds it: such a field is left out while it
#: has its default (the event's bytes stay those of version 1), and its presence raises the
#: event's ``v``, so older readers refuse it (a reader ignores unknown fields otherwise).
_SINCE: dict[tuple[type, str], int] = {(DataWritten, "deleted_keys"): 2}


def encode(event: Event) -> bytes:
    """Stable bytes for one event: sorted keys, no spaces. Refuses an event larger than
    :data:`MAX_EVENT_BYTES`, which no reader would accept."""
    body: dict[str, Any] = {"v": 1, "type": event.TYPE}
    for f in fields(event):
        value = getattr(event, f.name)
        since = _SINCE.get((type(event), f.name))
        if since is not None:
            if value == f.default:
                continue
            body["v"] = max(body["v"], since)
        body[f.name] = _to_json(value)
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")
    if len(data) > MAX_EVENT_BYTES:
        raise ProtocolError(
            f"{event.TYPE} event: expected at most {MAX_EVENT_BYTES} bytes encoded, found {len(data)}"
        )
    return data


# Decoding: every field is checked against its declared type (int never bool, str as UTF-8
# text, tuples as JSON lists, bytes as base64); unknown fields are ignored (forward
# compatibility). Every integer is bounded (issue 40: an epoch of 10**400 crashed every reader
# that turned it into a metric, and stalled the group for good): within a signed 64-bit long
# (what Kafka offsets, Iceberg ids, counts and sizes are), tighter where the meaning allows.
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Coordinator epochs: one more per coordinator start, so never near this in practice; kept
#: exact as a float (metrics) with room above for the next epoch (coordinator/state.py next_epoch).
MAX_EPOCH = 2**53 - 1

_Bound = tuple[int, int]
_OFFSET: _Bound = (0, INT64_MAX)  # the default: Kafka offsets, counts, sizes, timestamps
_INT32: _Bound = (0, INT32_MAX)  # Kafka generations and partitions, Iceberg spec and field ids
_STATS: tuple[_Bound, _Bound] = (_INT32, _OFFSET)  # (field id, count or size)
_BOUNDS: dict[tuple[type, str], _Bound | tuple[_Bound, _Bound]] = {
    (TopicPartition, "partition"): _INT32,
    (Claim, "generation"): _INT32,
    (Resume, "generation"): _INT32,
    (DataComplete, "generation"): _INT32,
    (DataComplete, "events_sent"): _INT32,
    (Owner, "generation"): (-1, INT32_MAX),  # -1: owned before a consumer-group reset (coordinator/state.py)
    (FileInfo, "spec_id"): _INT32,
    **{(FileInfo, name): _STATS for name in ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts")},
    **{(FileInfo, name): (_INT32, (0, 0)) for name in ("lower_bounds", "upper_bounds")},  # (field id, bytes)
    **{(cls, "epoch"): (0, MAX_EPOCH) for cls in (Resume, StartCommit, CommitToTable, CommitComplete, Rewind)},
    (CommitToTable, "snapshot_id"): (INT64_MIN, INT64_MAX),
    (CommitToTable, "watermark"): (-1, INT64_MAX),  # -1: nothing applied yet
    (CommitComplete, "through"): (-1, INT64_MAX),
}


class _Invalid(Exception):
    def __init__(self, path: str, expected: str, found: str) -> None:
        super().__init__(f"field {path}: expected {expected}, found {found}")
        self.path, self.expected, self.found = path, expected, found


def _found(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "an object"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = get_type_hints(cls)
    return hints


_HINTS: dict[type, dict[str, Any]] = {}


def _object(cls: type, raw: Any, path: str) -> Any:
    if not isinstance(raw, dict):
        raise _Invalid(path or "(event)", "an object", _found(raw))
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        where = f"{path}.{f.name}" if path else f.name
        bound = _BOUNDS.get((cls, f.name), _OFFSET)
        if f.name not in raw:
            if f.default is MISSING:
                raise _Invalid(where, _expected(hints[f.name], bound), "nothing (the field is missing)")
            continue  # optional field with a default (added in a later minor change)
        kwargs[f.name] = _value(hints[f.name], raw[f.name], where, bound)
    out = cls(**kwargs)
    if isinstance(out, OffsetRange) and out.start > out.end:
        raise _Invalid(path, "start <= end", f"start {out.start}, end {out.end}")
    if isinstance(out, (DataWritten, CommitToTable, SchemaProposal)) and not _table_name(out.table):
        raise _Invalid(f"{path}.table" if path else "table", "a table name namespace.table (no empty part)",
                       _found(out.table))
    if isinstance(out, DataComplete):
        seen: set[TopicPartition] = set()
        for i, r in enumerate(out.ranges):
            if r.tp in seen:
                raise _Invalid(f"ranges[{i}].tp", "each partition once", f"{r.tp} again")
            seen.add(r.tp)
    return out


def _table_name(name: str) -> bool:
    """A name every catalog can look up: a namespace and a table, no part empty or blank (a
    catalog raises on others instead of answering that no such table exists)."""
    parts = name.split(".")
    return len(parts) >= 2 and all(p.strip() for p in parts)


def _expected(tp: Any, bound: Any) -> str:
    if tp is int:
        return "int" if bound[0] == INT64_MIN else f"int >= {bound[0]}"
    if tp is str:
        return "str"
    if tp is bytes:
        return "base64 text"
    if tp is Any:
        return "a JSON scalar"
    if get_origin(tp) in (Union, UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        return f"{_expected(inner[0], bound)} or null"
    if get_origin(tp) is tuple:
        args = get_args(tp)
        return "a list" if args[-1] is Ellipsis else f"a list of {len(args)} items"
    return "an object"


def _value(tp: Any, raw: Any, path: str, bound: Any) -> Any:
    """``raw`` as type ``tp``; ``bound`` is (low, high) for the integers in it, or for a pair
    (a tuple of two items) one such bound per item."""
    if tp is int:
        if type(raw) is not int:
            raise _Invalid(path, _expected(tp, bound), _found(raw))
        if raw < bound[0]:
            raise _Invalid(path, f"int >= {bound[0]}", _found(raw))
        if raw > bound[1]:
            raise _Invalid(path, f"int <= {bound[1]}", _found(raw))
        return raw
    if tp is str:
        if not isinstance(raw, str):
            raise _Invalid(path, "str", _found(raw))
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:
            raise _Invalid(path, "UTF-8 text", "a lone surrogate") from None
        return raw
    if tp is bytes:
        try:
            if not isinstance(raw, str):
                raise ValueError
            return base64.b64decode(raw, validate=True)
        except ValueError:  # binascii.Error too
            raise _Invalid(path, "base64 text", _found(raw)) from None
    if tp is Any:  # a partition value: a JSON scalar as Iceberg stores it (a long at most)
        if raw is not None and not isinstance(raw, (bool, int, float, str)):
            raise _Invalid(path, "a JSON scalar", _found(raw))
        if type(raw) is int and not INT64_MIN <= raw <= INT64_MAX:
            raise _Invalid(path, "a JSON scalar (an int within 64 bits)", _found(raw))
        return raw
    origin = get_origin(tp)
    if origin in (Union, UnionType):
        if raw is None:
            return None
        try:
            return _value(next(a for a in get_args(tp) if a is not type(None)), raw, path, bound)
        except _Invalid as exc:
            if exc.path != path:  # a field inside it
                raise
            raise _Invalid(path, f"{exc.expected} or null", exc.found) from None
    if origin is tuple:
        args = get_args(tp)
        if not isinstance(raw, list) or (args[-1] is not Ellipsis and len(raw) != len(args)):
            raise _Invalid(path, _expected(tp, bound), _found(raw))
        if args[-1] is Ellipsis:
            return tuple(_value(args[0], x, f"{path}[{i}]", bound) for i, x in enumerate(raw))
        per_item = bound if isinstance(bound[0], tuple) else (bound,) * len(args)
        return tuple(_value(a, x, f"{path}[{i}]", b) for i, (a, x, b) in enumerate(zip(args, raw, per_item)))
    return _object(tp, raw, path)


def decode(data: bytes | None, offset: int | None = None) -> Event:
    """The event encoded in ``data``, checked field by field; anything else raises a
    :class:`ProtocolError` that names the control ``offset`` (if given), the event type and
    the field: ``control offset 123: data-complete field ranges[0].start: expected int >= 0,
    found 'x'``."""
    where = f"control offset {offset}: " if offset is not None else "control event: "
    if data is None:
        raise ProtocolError(f"{where}value: expected a JSON event, found null")
    if len(data) > MAX_EVENT_BYTES:
        raise ProtocolError(f"{where}expected at most {MAX_EVENT_BYTES} bytes, found {len(data)}")
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"{where}expected a JSON event, found text that is not JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise ProtocolError(f"{where}expected a JSON object, found {_found(raw)}")
    version = raw.get("v")
    if type(version) is not int or version > VERSION or version < 1:
        raise ProtocolError(
            f"{where}version: expected 1..{VERSION}, found {_found(version)} "
            "(upgrade icesink to read events written by a newer version)"
        )
    tag = raw.get("type")
    cls = EVENT_TYPES.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise ProtocolError(f"{where}type: expected one of {sorted(EVENT_TYPES)}, found {_found(tag)}")
    try:
        event: Event = _object(cls, raw, "")
        return event
    except _Invalid as exc:
        raise ProtocolError(f"{where}{cls.TYPE} {exc}") from None


def describe(event: Event) -> str:
    """One readable line per event, for ``icesink control tail`` and logs."""
    match event:
        case Claim(worker=w, generation=g, partitions=ps):
            return f"claim      worker={w} gen={g} partitions={' '.join(map(str, ps))}"
        case Resume(epoch=e, worker=w, generation=g, positions=ps):
            pos = " ".join(f"{p.tp}@{p.offset}" for p in ps)
            return f"resume     epoch={e} worker={w} gen={g} {pos}"
        case StartCommit(epoch=e, commit_id=c):
            return f"start      epoch={e} round={c}"
        case DataWritten(commit_id=c, worker=w, table=t, files=fs, deleted_keys=dk):
            rows = sum(f.record_count for f in fs)
            names = " ".join(f.path.rsplit("/", 1)[-1] for f in fs[:3])
            more = f" (+{len(fs) - 3} more)" if len(fs) > 3 else ""
            deletes = f" deleted_keys={sum(f.record_count for f in dk)}" if dk else ""
            return f"written    round={c} worker={w} table={t} files={len(fs)} rows={rows}{deletes} {names}{more}"
        case DataComplete(commit_id=c, worker=w, generation=g, ranges=rs, events_sent=n):
            rng = " ".join(f"{r.tp}[{r.start},{r.end})" for r in rs)
            return f"complete   round={c} worker={w} gen={g} events={n} {rng}"
        case CommitToTable(epoch=e, commit_id=c, table=t, snapshot_id=s, files=nf, records=nr, watermark=wm):
            return f"committed  round={c} epoch={e} table={t} snapshot={s} files={nf} rows={nr} watermark={wm}"
        case CommitComplete(epoch=e, commit_id=c, through=th, positions=ps):
            pos = " ".join(f"{p.tp}@{p.offset}" for p in ps)
            return f"done       round={c} epoch={e} through={th} {pos}"
        case Rewind(epoch=e, worker=w, partitions=ps, reason=r):
            return f"rewind     epoch={e} worker={w} partitions={' '.join(map(str, ps))} reason={r}"
        case CommitRequest(worker=w, buffered_bytes=b):
            return f"request    worker={w} buffered_bytes={b}"
        case SchemaProposal(worker=w, table=t, schema_json=sj):
            return f"schema     worker={w} table={t} {_schema_brief(sj)}"
        case AlterPositions(positions=ps, reason=r):
            pos = " ".join(f"{p.tp}@{p.offset}" for p in ps)
            return f"alter      {pos} reason={r}"
        case _:
            assert_never(event)


def _schema_brief(schema_json: str) -> str:
    """``name:type`` of the top-level fields of an Iceberg schema JSON (nested types abridged)."""
    try:
        body = json.loads(schema_json)
        return " ".join(
            f"{f['name']}:{f['type'] if isinstance(f['type'], str) else f['type'].get('type', '?')}"
            for f in body.get("fields", [])
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return f"(unreadable schema: {schema_json[:60]!r})"


__all__ = ["VERSION", "MAX_EVENT_BYTES", "MAX_EPOCH", "INT32_MAX", "INT64_MAX", "INT64_MIN", "encode", "decode", "describe"]
