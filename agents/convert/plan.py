"""Step 2 of agents.convert: the parse schema derived from the target schema (what JSON kind
pyarrow should expect for each field) and how it adapts when a bulk parse fails
(:class:`Plan`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

import pyarrow as pa

from agents.convert.columns import (
    Path, connect_bytes, is_list, is_string, is_temporal, numbers_first, strict_text,
)
from agents.convert.grammar import UNSURE_NUMBER
from agents.convert.wrapped import ENTRY_KEY, ENTRY_VALUE


#: Wide decimal that integer columns fall back to when a value is not a plain integer token.
_WIDE_INT: Final = pa.decimal128(38, 18)


_KIND_ERROR: Final = re.compile(r"Column\((?P<path>.*)\) changed from (?P<old>\w+) to (?P<new>\w+)")


def default_parse_type(f: pa.Field) -> pa.DataType:
    t = f.type
    if connect_bytes(f):
        return pa.string()
    if numbers_first(f):
        return pa.int64()  # the text of a JSON integer is its digits; any other value: text (adapt)
    if pa.types.is_integer(t):
        return pa.int64()
    if pa.types.is_floating(t):
        return pa.float64()
    if pa.types.is_decimal(t):
        # Wider than the column, so too many decimals or digits show up as a row mask later
        # instead of failing the whole read.
        scale = max(t.scale, min(18, 37 - (t.precision - t.scale)))
        return pa.decimal128(38, scale)
    if pa.types.is_large_string(t):
        return pa.large_string()
    if pa.types.is_boolean(t):
        return pa.bool_()
    return pa.string()  # string, timestamp, date, time, binary, uuid (temporal ones adapt)


def leaves(t: pa.DataType, path: Path = ()) -> Iterator[tuple[Path, pa.Field]]:
    """The leaf fields of struct/list type ``t`` with their paths (``[]`` for list elements)."""
    children = list(t) if pa.types.is_struct(t) else [t.value_field]
    for child in children:
        child_path = (*path, child.name if pa.types.is_struct(t) else "[]")
        if pa.types.is_struct(child.type) or is_list(child.type):
            yield from leaves(child.type, child_path)
        else:
            yield child_path, child


def _leaf_at(t: pa.DataType, path: Path) -> pa.Field | None:
    f: pa.Field | None = None
    for part in path:
        if pa.types.is_struct(t):
            index = t.get_field_index(part)
            if index < 0:
                return None
            f = t.field(index)
        elif is_list(t) and part == "[]":
            f = t.value_field
        else:
            return None
        t = f.type
    if f is None or pa.types.is_struct(t) or is_list(t):
        return None
    return f


def parse_form(f: pa.Field) -> pa.Field:
    """``f`` as the bulk reader parses it: maps as lists of ``{"k": key text, "v": value}``."""
    t = f.type
    if pa.types.is_struct(t):
        return f.with_type(pa.struct([parse_form(c) for c in t]))
    if is_list(t):
        return f.with_type(pa.list_(parse_form(t.value_field)))
    if pa.types.is_map(t):
        key = pa.field(ENTRY_KEY, pa.string(), nullable=False)
        return f.with_type(pa.list_(pa.struct([key, parse_form(t.item_field.with_name(ENTRY_VALUE))])))
    return f


_SPACE: Final = r"[ \t\r\n]*"


def _unsure_numbers(parse_type: pa.DataType) -> str | None:
    """An RE2 pattern matching a record's text where a number (or numeric string) that Arrow's
    decimal parse may misread (grammar.UNSURE_NUMBER) is the value of a leaf parsed as a decimal:
    after its key, or in a list under its key; anywhere after ``:``, ``,`` or ``[`` where the key
    is not known (map values, lists of lists, keys JSON may escape). None: no such leaf."""
    keys: set[str] = set()
    lists: set[str] = set()
    anywhere = False
    for path, f in leaves(parse_type):
        if not pa.types.is_decimal(f.type):
            continue
        in_list = path[-1] == "[]"
        key = path[-2] if in_list and len(path) > 1 else path[-1]
        map_value = path[-1] == ENTRY_VALUE and path[-2:-1] == ("[]",)
        # a key JSON may spell otherwise (escaped: a quote, a backslash, "bel\\u00f8p"): search anywhere
        if key == "[]" or map_value or not (key.isascii() and key.isprintable()) or '"' in key or "\\" in key:
            anywhere = True
        else:
            (lists if in_list else keys).add(key)
    if anywhere:
        return r"[:,\[]" + _SPACE + UNSURE_NUMBER
    if not keys and not lists:
        return None
    before = [f'"(?:{"|".join(re.escape(k) for k in sorted(keys))})"{_SPACE}:{_SPACE}'] if keys else []
    if lists:  # the first element, or one after a comma (the elements are scalars: no ']' before)
        names = "|".join(re.escape(k) for k in sorted(lists))
        before.append(f'"(?:{names})"{_SPACE}:{_SPACE}\\[(?:[^\\]]*?,)?{_SPACE}')
    return "(?:" + "|".join(before) + ")" + UNSURE_NUMBER


@dataclass(frozen=True)
class Plan:
    """How to parse: a JSON parse type per leaf (default or adapted), keys whose values are quoted,
    and the parse schema they give (built once, when the plan is made)."""

    target: pa.StructType
    overrides: tuple[tuple[Path, pa.DataType], ...] = ()
    quoted: frozenset[str] = frozenset()
    parse_schema: pa.Schema = field(init=False, repr=False, compare=False)
    #: RE2 pattern of a record holding a number the reader's decimal parse may misread, or None
    unsure_numbers: str | None = field(init=False, repr=False, compare=False)

    @classmethod
    def of(cls, fields: Sequence[pa.Field]) -> Plan:
        """The default plan for a table of ``fields``."""
        return cls(pa.struct([parse_form(f) for f in fields]))

    def __post_init__(self) -> None:
        object.__setattr__(self, "parse_schema", self._schema())
        object.__setattr__(self, "unsure_numbers", _unsure_numbers(self.parse_schema.field(0).type))

    def parse_type(self, path: Path, leaf: pa.Field) -> pa.DataType:
        for p, t in self.overrides:
            if p == path:
                return t
        return default_parse_type(leaf)

    def _schema(self) -> pa.Schema:
        def build(f: pa.Field, path: Path) -> pa.DataType:
            t = f.type
            if pa.types.is_struct(t):
                return pa.struct([pa.field(c.name, build(c, (*path, c.name))) for c in t])
            if is_list(t):
                return pa.list_(build(t.value_field, (*path, "[]")))
            return self.parse_type(path, f)

        return pa.schema([pa.field("v", build(pa.field("v", self.target), ()))])

    def _with(self, changes: dict[Path, pa.DataType], quote: frozenset[str] = frozenset()) -> Plan:
        kept = tuple((p, t) for p, t in self.overrides if p not in changes)
        return Plan(self.target, kept + tuple(changes.items()), self.quoted | quote)

    def adapt(self, message: str) -> Plan | None:
        """A plan that avoids the failure in ``message``, or None when none does."""
        kind = _KIND_ERROR.search(message)
        if kind is not None:
            return self._adapt_kind(kind.group("path"), kind.group("new"))
        if "Failed to convert JSON to int64" in message:  # a fraction, an exponent or beyond int64
            # Cast's fields first (read as text: integer columns stay int64 if the value was there)
            texts = {p: pa.string() for p, f in leaves(self.target)
                     if numbers_first(f) and self.parse_type(p, f) == pa.int64()}
            if texts:
                return self._with(texts)
            wide = {
                p: _WIDE_INT
                for p, f in leaves(self.target)
                if (pa.types.is_integer(f.type) or is_temporal(f.type)) and self.parse_type(p, f) == pa.int64()
            }
            return self._with(wide) if wide else None
        if "decimal" in message:
            # A numeric column parsed as a decimal met a value the decimal cannot hold: parse
            # those columns as (quoted) strings; the string path flags the rows instead.
            paths = [p for p, f in leaves(self.target) if pa.types.is_decimal(self.parse_type(p, f))]
            if not paths:
                return None
            keys = frozenset(p[-1] for p in paths if p[-1] != "[]" and self._quotable(p[-1]))
            return self._with({p: pa.string() for p in paths}, keys)
        return None

    def _quotable(self, key: str) -> bool:
        """Whether quoting bare numbers of ``key`` keeps their meaning in every column so named."""
        return not any(p[-1] == key and strict_text(f) for p, f in leaves(self.target))

    def _adapt_kind(self, arrow_path: str, found: str) -> Plan | None:
        parts = arrow_path.split("/")
        if parts[:2] != ["", "v"] or len(parts) < 3:
            return None
        path = tuple(parts[2:])
        leaf = _leaf_at(self.target, path)
        if leaf is None:
            return None
        current = self.parse_type(path, leaf)
        t = leaf.type
        if numbers_first(leaf) and not is_string(current):  # not only integers: read the texts
            return self._with({path: pa.string()})
        if found == "string" and not is_string(current) and not pa.types.is_decimal(current):
            if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or is_temporal(t):
                return self._with({path: pa.string()})
            return None
        if found == "number" and is_temporal(t) and is_string(current) and path not in dict(self.overrides):
            return self._with({path: pa.int64()})  # epoch counts: parse them as numbers
        if found in ("number", "boolean") and is_string(current):
            key = path[-1]
            if key == "[]" or key in self.quoted or not self._quotable(key):
                return None
            return self._with({}, frozenset({key}))
        return None
