"""Step 1 of agents.convert: the wrapped buffer. Each value wrapped as ``{"v":<value>}`` and the
batch joined into one buffer (:class:`Run`); invalid UTF-8 found up front; maps and
case-folded keys rewritten per record when a schema needs it; the pyarrow.json read itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from agents.convert import limits
from agents.convert.columns import holds_map, is_list
from agents.convert.limits import DENSE_GAP, DENSE_LIMIT
from agents.convert.outcome import Reject


_PREFIX: Final = b'{"v":'


_SEP: Final = b'}\n{"v":'


_BOM: Final = b"\xef\xbb\xbf"


_WRAP_OVERHEAD: Final = len(_PREFIX) + 1  # the closing "}"


_ROW: Final = re.compile(r" in row (\d+)\s*$")


_NUMBER_OR_BOOL: Final = rb"(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false)"


def utf8_reason(exc: UnicodeDecodeError) -> str:
    return f"malformed JSON: invalid UTF-8 at byte {exc.start} ({exc.reason})"


def _wrap(parts: list[bytes]) -> bytes:
    """``{"v":a}\\n{"v":b}...`` in one join (``parts`` is modified)."""
    if len(parts) == 1:
        return _PREFIX + parts[0] + b"}"
    parts[0] = _PREFIX + parts[0]
    parts[-1] = parts[-1] + b"}"
    return _SEP.join(parts)


def _utf8_ok(buf: bytes) -> bool:
    offsets = np.array([0, len(buf)], dtype=np.int64)
    arr = pa.Array.from_buffers(
        pa.large_string(), 1, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(buf)]
    )
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


@dataclass(frozen=True)
class Run:
    """Records as one wrapped buffer: record ``k`` is ``buf[starts[k] : starts[k + 1] - 1]``."""

    buf: bytes
    starts: npt.NDArray[np.int64]  # len size + 1; starts[size] == len(buf) + 1
    positions: npt.NDArray[np.int64]  # input index of each record
    multiline: bool  # some value holds a newline or CR: the reader must not split on them
    keys: frozenset[str] = frozenset()  # keys whose bare numbers and booleans are quoted

    @property
    def size(self) -> int:
        return len(self.positions)

    def view(self, lo: int, hi: int) -> pa.Buffer:
        start = int(self.starts[lo])
        return pa.py_buffer(self.buf).slice(start, int(self.starts[hi]) - 1 - start)

    def matching(self, lo: int, hi: int, pattern: str) -> npt.NDArray[np.bool_]:
        """Whether each record of ``[lo, hi)`` holds a match of RE2 ``pattern`` (in bulk: the
        buffer seen as one binary value per record, each with its newline)."""
        offsets = self.starts[lo : hi + 1].copy()
        offsets[-1] = min(int(offsets[-1]), len(self.buf))
        records = pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), hi - lo, [None, pa.py_buffer(offsets), pa.py_buffer(self.buf)])
        return np.asarray(pc.match_substring_regex(records, pattern).to_numpy(zero_copy_only=False), dtype=np.bool_)

    def longest(self, lo: int, hi: int) -> int:
        """Bytes of the longest record in ``[lo, hi)`` (with its newline)."""
        return int(np.max(np.diff(self.starts[lo : hi + 1]))) if hi > lo else 0

    def quoted(self, lo: int, hi: int, keys: frozenset[str]) -> Run:
        """Records ``[lo, hi)`` with bare numbers and booleans of ``keys`` quoted as strings.

        ``"k": 42`` becomes ``"k": "42"`` wherever key ``k`` appears. Only whole values followed
        by ``,`` or ``}`` are touched, so valid JSON stays valid and means the same to every
        target type (each accepts the quoted form with the same value).
        """
        names = b"|".join(re.escape(k.encode()) for k in sorted(keys))
        pattern = re.compile(rb'("(?:' + names + rb')"\s*:\s*)' + _NUMBER_OR_BOOL + rb"(?=\s*[,}])")

        def quote(text: bytes) -> bytes:
            pieces = pattern.split(text)  # text, key, value, text, key, value, ..., text
            pieces[2::3] = [b'"' + value + b'"' for value in pieces[2::3]]
            return b"".join(pieces)

        if not self.multiline:
            buf = quote(self.view(lo, hi).to_pybytes())
            newlines = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == 0x0A)
            starts = np.concatenate(([0], newlines + 1, [len(buf) + 1])).astype(np.int64)
            return Run(buf, starts, self.positions[lo:hi], False, keys)
        whole = self.buf
        parts = [
            quote(whole[int(self.starts[k]) + len(_PREFIX) : int(self.starts[k + 1]) - 2])
            for k in range(lo, hi)
        ]
        return Run(_wrap(list(parts)), _starts(parts), self.positions[lo:hi], True, keys)


ENTRY_KEY: Final = "k"


ENTRY_VALUE: Final = "v"


#: A JSON number kept as text through ``json.loads``/``json.dumps``: a string marked with NUL.
_MARK: Final = "\x00"


_MARKED: Final = re.compile(r'"\\u0000([^"]*)"')


def _mark_number(text: str) -> str:
    return _MARK + text


def _no_constant(text: str) -> object:
    raise ValueError(f"constant {text}")  # NaN, Infinity: the reference path decides


def _unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate key")  # the reference path names it
    return out


def _int_keeping_minus_zero(text: str) -> object:
    return _MARK + text if text == "-0" else int(text)  # -0 is not 0 for a float or string column


_ENTRIES_DECODER: Final = json.JSONDecoder(
    parse_float=_mark_number, parse_constant=_no_constant, object_pairs_hook=_unique
)


#: For records that may hold a bare ``-0`` (rare): json.loads would read it as the int 0.
_MINUS_ZERO_DECODER: Final = json.JSONDecoder(
    parse_float=_mark_number, parse_int=_int_keeping_minus_zero, parse_constant=_no_constant,
    object_pairs_hook=_unique,
)


_MINUS_ZERO: Final = re.compile(rb"[:\[,]\s*-0\s*[,\]}]")


_ENTRIES_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)


_Rewrite: TypeAlias = Callable[[object], object]


def rewritten(values: Sequence[bytes], schema: pa.Schema, *, fold: bool) -> list[bytes]:
    """``values`` as the bulk reader can parse them for ``schema``: every map (a JSON object or
    an array of ``[key, value]`` pairs) as a list of entries ``[{"k": key text, "v": value},
    ...]`` in its order, and with ``fold`` every object key that names a field in another case
    spelt as the field is.

    pyarrow.json has no map type, keeps no JSON text and matches keys exactly, so this is one
    C-level ``json.loads``/``json.dumps`` per record (non-integer numbers keep their exact text
    through a marker). A record this cannot rewrite faithfully (malformed JSON, a duplicate key,
    a NUL escape, NaN, a map that is neither form) becomes ``null``, which sends it to the
    reference path with its original bytes; tombstones stay as they are."""
    rewrite = rewriter(pa.struct(list(schema)), entries=True, fold=fold)
    decode, careful, encode = _ENTRIES_DECODER.decode, _MINUS_ZERO_DECODER.decode, _ENTRIES_ENCODER.encode
    out: list[bytes] = []
    for value in values:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            out.append(value)
            continue
        raw = bytes(value)
        if raw[:3] == _BOM:
            raw = raw[3:]
        try:
            if b"\\u0000" in raw:
                raise ValueError("NUL escape")  # the number marker would be ambiguous
            minus_zero = b"-0" in raw and _MINUS_ZERO.search(raw) is not None
            doc = (careful if minus_zero else decode)(raw.decode("utf-8"))
            if not isinstance(doc, dict):
                raise ValueError("not an object")
            text = encode(rewrite(doc))
            if "\\u0000" in text:
                text = _MARKED.sub(r"\1", text)
            out.append(text.encode("utf-8"))
        except (ValueError, UnicodeError, RecursionError):
            out.append(b"null")
    return out


def holds_struct(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return True
    if pa.types.is_map(t):
        return holds_struct(t.item_type)
    return is_list(t) and holds_struct(t.value_type)


def map_items(v: object) -> list[tuple[object, object]] | None:
    """The entries of a JSON map: an object, or an array of ``[key, value]`` pairs (what Kafka
    Connect's JsonConverter writes for maps whose keys are not strings); None for other kinds."""
    if isinstance(v, dict):
        return list(v.items())
    if isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 for p in v):
        return [(p[0], p[1]) for p in v]
    return None


def _key_text(k: object) -> str:
    """A map key parsed by ``_ENTRIES_DECODER`` as the text the reader's key column holds."""
    if isinstance(k, str):
        return k[1:] if k[:1] == _MARK else k  # a marked non-integer number: its text
    if isinstance(k, bool):
        return "true" if k else "false"
    if isinstance(k, int):
        return str(k)  # (-0 came marked, as its text)
    raise ValueError("a map key that is not a scalar")  # the reference path names it


def rewriter(t: pa.DataType, *, entries: bool, fold: bool) -> _Rewrite:
    """A function rewriting parsed JSON of type ``t`` in place where it can: with ``entries``
    maps become entry lists (ValueError for a map in neither JSON form), with ``fold`` object
    keys naming a field in another case are renamed to the field. Kinds that do not fit ``t``
    are left for the reader or the reference path to refuse."""

    def needed(c: pa.DataType) -> bool:
        return (entries and holds_map(c)) or (fold and holds_struct(c))

    if pa.types.is_map(t):
        item = rewriter(t.item_type, entries=entries, fold=fold) if needed(t.item_type) else None

        def map_(v: object) -> object:
            if v is None:
                return None
            items = map_items(v)
            if items is None:
                if entries:
                    raise ValueError("a map that is neither an object nor an array of pairs")
                return v
            if entries:
                out = [{ENTRY_KEY: _key_text(k), ENTRY_VALUE: item(x) if item else x} for k, x in items]
                if isinstance(v, list) and len({e[ENTRY_KEY] for e in out}) != len(out):
                    raise ValueError("a key twice")  # the reference path names it (objects: _unique)
                return out
            if item is None:
                return v
            if isinstance(v, dict):
                return {k: item(x) for k, x in items}
            return [[k, item(x)] for k, x in items]

        return map_
    if is_list(t):
        element = rewriter(t.value_type, entries=entries, fold=fold)
        return lambda v: [element(x) for x in v] if isinstance(v, list) else v
    children = [(c.name, rewriter(c.type, entries=entries, fold=fold)) for c in t if needed(c.type)]
    names = frozenset(c.name for c in t)
    canon = {c.name.lower(): c.name for c in reversed(list(t))} if fold else {}

    def struct_(v: object) -> object:
        if isinstance(v, dict):
            if canon:
                v = _fold_keys(v, names, canon)
            for name, rewrite in children:
                if name in v:
                    v[name] = rewrite(v[name])
        return v

    return struct_


def _fold_keys(v: dict[str, object], names: frozenset[str], canon: dict[str, str]) -> dict[str, object]:
    """``v`` with keys that name a field of ``names`` in another case renamed to it. Two
    spellings of one field: the exact one wins unless null, else the first non-null."""
    if all(k in names or k.lower() not in canon for k in v):
        return v
    out: dict[str, object] = {}
    for k, x in v.items():
        target = k if k in names else canon.get(k.lower(), k)
        if target not in out or out[target] is None or (k == target and x is not None):
            out[target] = x
    return out


def _starts(parts: list[bytes]) -> npt.NDArray[np.int64]:
    """Where each wrapped part starts in ``_wrap(parts)`` (and one past the end)."""
    lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    starts = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(lengths + _WRAP_OVERHEAD + 1, out=starts[1:])
    return starts


def prepare(values: Sequence[bytes]) -> tuple[Run | None, list[Reject]]:
    """The wrapped buffer of every value worth parsing, and the values rejected up front."""
    parts = list(values)
    rejects: list[Reject] = []
    positions = np.arange(len(parts), dtype=np.int64)
    if not parts:
        return None, rejects
    try:
        buf = _wrap(list(parts))
    except TypeError:  # None (a tombstone) or another non-bytes value
        keep: list[int] = []
        for i, value in enumerate(parts):
            if isinstance(value, (bytes, bytearray, memoryview)):
                keep.append(i)
            else:
                found = "null (a tombstone)" if value is None else type(value).__name__
                rejects.append(Reject(i, f"not a JSON object: the record value is {found}", None))
        positions = np.array(keep, dtype=np.int64)
        parts = [bytes(parts[i]) for i in keep]
        if not parts:
            return None, rejects
        buf = _wrap(list(parts))
    if _BOM[:1] in buf and _PREFIX + _BOM in buf:  # memchr first: most batches are ASCII
        parts = [p[3:] if p[:3] == _BOM else p for p in parts]
        buf = _wrap(list(parts))
    if not _utf8_ok(buf):
        keep_mask = np.ones(len(parts), dtype=np.bool_)
        for k, part in enumerate(parts):
            try:
                part.decode("utf-8")
            except UnicodeDecodeError as exc:
                keep_mask[k] = False
                rejects.append(Reject(int(positions[k]), utf8_reason(exc), None))
        parts = [p for p, keep_it in zip(parts, keep_mask, strict=True) if keep_it]
        positions = positions[keep_mask]
        if not parts:
            return None, rejects
        buf = _wrap(list(parts))
    newlines = int(np.count_nonzero(np.frombuffer(buf, dtype=np.uint8) == 0x0A))
    multiline = newlines != len(parts) - 1 or b"\r" in buf
    return Run(buf, _starts(parts), positions, multiline), rejects


def read_buffer(data: pa.Buffer, schema: pa.Schema | None, multiline: bool, single: bool, longest: int) -> pa.Table:
    """One pyarrow.json read. ``single``: one block, no threads, so errors name the row.
    ``longest``: bytes of the longest record. A block is always at least twice that: pyarrow
    26 crashes the process (a segfault or abort, not an error) on some inputs where a record
    spans more than two blocks (tests/unit/test_convert_blocks.py), so a record never does."""
    if schema is None:
        parse = pj.ParseOptions(newlines_in_values=multiline)
    else:
        parse = pj.ParseOptions(
            explicit_schema=schema, newlines_in_values=multiline, unexpected_field_behavior="ignore"
        )
    if single:
        read = pj.ReadOptions(use_threads=False, block_size=max(data.size + 1, 1 << 16, 2 * longest))
    else:
        read = pj.ReadOptions(use_threads=True, block_size=max(limits.BLOCK_SIZE, 2 * longest))
    return pj.read_json(pa.BufferReader(data), read_options=read, parse_options=parse)


def error_row(message: str) -> int | None:
    match = _ROW.search(message)
    return int(match.group(1)) if match else None


class Pacer:
    """Notices failures that come thick and fast, so a scan can switch to per-record work."""

    def __init__(self) -> None:
        self.dense = 0

    def failed_at(self, row: int) -> bool:
        """Record a failure ``row`` records into the current read; True when it is time to stop."""
        self.dense = self.dense + 1 if row < DENSE_GAP else 0
        if self.dense >= DENSE_LIMIT:
            self.dense = 0
            return True
        return False
