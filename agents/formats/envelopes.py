"""The ``{"schema": ..., "payload": ...}`` envelopes of JsonConverter: split by byte searches
(:func:`split_envelope`), grouped by schema text (:class:`Envelopes`, parsed schemas cached), each
group's payloads decoded in bulk (:func:`decode_envelopes`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from agents.convert import Converted, Reject, decode_json
from agents.formats.connect_schema import ConnectSchemaError, NOT_ENVELOPE, decode_schema


_SCHEMA_CACHE: Final = 256


_HEAD: Final = re.compile(rb'\s*\{\s*"schema"\s*:\s*')
_SEP: Final = b',"payload":'
_WS: Final = " \t\r\n"


def _split_fast(value: bytes) -> tuple[bytes, bytes] | None:
    """(schema text, payload bytes) of JsonConverter's compact output, or None to look closer.
    A wrong cut (a "payload" key inside the schema) yields schema text that does not parse."""
    head = _HEAD.match(value)
    if head is None:
        return None
    cut = value.find(_SEP, head.end())
    end = len(value.rstrip())
    if cut < 0 or value[end - 1 : end] != b"}":
        return None
    return value[head.end() : cut], value[cut + len(_SEP) : end - 1]


def split_envelope(value: bytes | None) -> tuple[Any, bytes] | str:
    """(parsed schema, payload bytes) of one envelope in any key order and spacing, or the
    reason it is not one. The per-record path: the bulk path uses byte searches."""
    if value is None:
        return f"{NOT_ENVELOPE}: the record value is null (a tombstone)"
    try:
        text = bytes(value).decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        return f"malformed JSON: invalid UTF-8 at byte {exc.start} ({exc.reason})"
    decoder = json.JSONDecoder()
    found: dict[str, tuple[int, int, Any]] = {}
    i = len(text) - len(text.lstrip(_WS))
    try:
        if text[i : i + 1] != "{":
            return f"{NOT_ENVELOPE}: the value is not a JSON object"
        i += 1
        while True:
            i += len(text[i:]) - len(text[i:].lstrip(_WS))
            if text[i : i + 1] == "}" and not found:
                break
            key, i = decoder.raw_decode(text, i)
            i += len(text[i:]) - len(text[i:].lstrip(_WS))
            if text[i : i + 1] != ":" or not isinstance(key, str):
                raise ValueError("expected a key and ':'")
            i += 1
            i += len(text[i:]) - len(text[i:].lstrip(_WS))
            start = i
            item, i = decoder.raw_decode(text, i)
            if key in found:
                return f"{NOT_ENVELOPE}: duplicate key {key!r}"
            found[key] = (start, i, item)
            i += len(text[i:]) - len(text[i:].lstrip(_WS))
            if text[i : i + 1] == ",":
                i += 1
                continue
            if text[i : i + 1] == "}":
                break
            raise ValueError("expected ',' or '}'")
        if text[i + 1 :].strip(_WS):
            raise ValueError("text after the object")
    except (ValueError, RecursionError) as exc:
        return f"malformed JSON: {exc}"
    missing = [k for k in ("schema", "payload") if k not in found]
    if missing:
        hint = " (was it written with value.converter.schemas.enable=false?)" if len(missing) == 2 else ""
        return f"{NOT_ENVELOPE}: no {' or '.join(repr(k) for k in missing)} key{hint}"
    start, end, _ = found["payload"]
    return found["schema"][2], text[start:end].encode()


@dataclass(frozen=True)
class Group:
    schema: Any  # the parsed Connect schema
    indices: list[int]
    payloads: list[bytes]


_NOT_JSON: Final = object()


class Envelopes:
    """Splits batches of envelopes and groups them by schema; parsed schemas are cached."""

    def __init__(self) -> None:
        self._parsed: dict[bytes, Any] = {}  # schema text -> parsed schema, or _NOT_JSON

    def _parse(self, text: bytes) -> Any:
        try:
            return self._parsed[text]
        except KeyError:
            pass
        if len(self._parsed) >= _SCHEMA_CACHE:
            self._parsed.clear()
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError):
            parsed = _NOT_JSON
        self._parsed[text] = parsed
        return parsed

    def group(self, values: Sequence[bytes | None]) -> tuple[list[Group], list[Reject]]:
        """Records grouped by identical schema text (input order within a group), and the
        records that are no envelope."""
        by_text: dict[bytes, list[int]] = {}
        schemas: dict[bytes, Any] = {}
        payloads: list[bytes] = [b""] * len(values)
        slow: list[int] = []
        for i, value in enumerate(values):
            parts = _split_fast(value) if value is not None else None
            parsed = self._parse(parts[0]) if parts is not None else _NOT_JSON
            if parts is None or parsed is _NOT_JSON:  # not compact JsonConverter output, or a wrong cut
                slow.append(i)
                continue
            by_text.setdefault(parts[0], []).append(i)
            schemas[parts[0]] = parsed
            payloads[i] = parts[1]
        rejects: list[Reject] = []
        for i in slow:
            found = split_envelope(values[i])
            if isinstance(found, str):
                rejects.append(Reject(i, found, None))
                continue
            text = json.dumps(found[0], sort_keys=True).encode()
            by_text.setdefault(text, []).append(i)
            schemas[text] = found[0]
            payloads[i] = found[1]
        groups = []
        for text, indices in by_text.items():
            indices.sort()
            groups.append(Group(schemas[text], indices, [payloads[i] for i in indices]))
        return groups, rejects


def decode_envelopes(
    groups: Sequence[Group], rejects: list[Reject], target: pa.Schema | None,
    decode_as: Callable[[Any], pa.Schema] | None = None, *, fold_case: bool = False,
) -> Converted:
    """Each group's payloads decoded in bulk against ``decode_as(its Connect schema)`` (default:
    :func:`decode_schema` of ``target``), as ``target``, in input order. A group whose schema
    cannot fill the table (``ConnectSchemaError``) is rejects, naming why. ``fold_case``: keys
    and Connect fields name columns ignoring case, at every level."""
    tables: list[pa.Table] = []
    indices: list[npt.NDArray[np.int64]] = []
    rejects = list(rejects)
    for g in groups:
        try:
            if target is None:
                raise ConnectSchemaError("the table does not exist and no record of the batch could create it")
            schema = decode_schema(target, g.schema, fold_case=fold_case) if decode_as is None else decode_as(g.schema)
        except ConnectSchemaError as exc:
            rejects += [Reject(i, exc.reason, exc.field) for i in g.indices]
            continue
        part = decode_json(g.payloads, schema, fold_case=fold_case)
        positions = np.asarray(g.indices, dtype=np.int64)
        rejects += [Reject(int(positions[r.index]), r.reason, r.field) for r in part.rejects]
        tables.append(part.table.cast(target))
        indices.append(positions[part.indices.to_numpy()])
    table = pa.concat_tables(tables) if tables else (target or pa.schema([])).empty_table()
    order = np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64)
    if len(tables) > 1:  # groups interleave: back to input order
        sort = np.argsort(order, kind="stable")
        table, order = table.take(pa.array(sort)), order[sort]
    return Converted(table, pa.array(order, pa.int64()), tuple(sorted(rejects, key=lambda r: r.index)))
