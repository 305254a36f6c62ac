"""Single message transforms and predicates, as Kafka Connect configures them, checked at start.

``transforms=a,b``, ``transforms.a.type=<class>``, ``transforms.a.<prop>``, and
``predicates=p``, ``predicates.p.type=<class>``, ``transforms.a.predicate=p``,
``transforms.a.negate``. Each class name (Kafka Connect's, the Apache reference sink's and the
Tabular one's) maps to a kind; each kind states its properties. An unknown class, an unknown
property or a bad value is a ConfigError naming the key: none is ignored. The transforms run in
agents/transforms/ (the Debezium one in agents/debezium.py). Leaf module: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from icesink.shared.conversion_settings import check_conversion
from icesink.shared.errors import ConfigError

__all__ = ["KEY_TRANSFORMS", "PREDICATES", "TRANSFORMS", "PredicateSpec", "TransformSpec", "gone_fields",
           "inserted_fields", "java_replacement", "parse_chain", "unwrap_options"]

_CONNECT = "org.apache.kafka.connect.transforms."
#: Transforms that act on the record key only (and ValueToKey, which makes the key from the value).
KEY_TRANSFORMS: Final[Mapping[str, str]] = {
    "ReplaceField$Key": "replace-field-key", "InsertField$Key": "insert-field-key", "HoistField$Key": "hoist-field-key",
    "Cast$Key": "cast-key", "TimestampConverter$Key": "timestamp-converter-key", "ValueToKey": "value-to-key"}
_CONNECT_PREDICATES = "org.apache.kafka.connect.transforms.predicates."
_REFERENCE = ("org.apache.iceberg.connect.transforms.", "io.tabular.iceberg.connect.transforms.")
#: ExtractNewRecordState's delete.tombstone.handling.mode values, and its older delete.handling.mode's.
UNWRAP_MODES: Final = ("drop", "tombstone", "rewrite", "rewrite-with-tombstone", "delete-to-tombstone")
_UNWRAP_LEGACY: Final = {"drop": "drop", "none": "tombstone", "rewrite": "rewrite"}

#: Transform class -> kind.
TRANSFORMS: Final[Mapping[str, str]] = {
    **{f"{p}DebeziumTransform": "debezium" for p in _REFERENCE},
    **{f"{p}KafkaMetadataTransform": "kafka-metadata" for p in _REFERENCE},
    **{f"{p}CopyValue": "copy-value" for p in _REFERENCE},
    f"{_CONNECT}ReplaceField$Value": "replace-field",
    f"{_CONNECT}InsertField$Value": "insert-field",
    f"{_CONNECT}HoistField$Value": "hoist-field",
    f"{_CONNECT}Filter": "filter",
    f"{_CONNECT}RegexRouter": "regex-router",
    "io.debezium.transforms.ExtractNewRecordState": "unwrap",
    **{f"{p}DmsTransform": "dms" for p in _REFERENCE},
    **{f"{p}JsonToMapTransform": "json-to-map" for p in _REFERENCE},
    f"{_CONNECT}Cast$Value": "cast",  # agents/transforms/cast.py
    f"{_CONNECT}TimestampConverter$Value": "timestamp-converter",  # agents/transforms/timestamp_converter.py
    **{f"{_CONNECT}{c}": kind for c, kind in KEY_TRANSFORMS.items()},  # refused with a key column (not yet)
    **{f"{p}MongoDebeziumTransform": "mongo-debezium" for p in _REFERENCE},
}
#: Predicate class -> kind.
PREDICATES: Final[Mapping[str, str]] = {
    f"{_CONNECT_PREDICATES}TopicNameMatches": "topic-name-matches",
    f"{_CONNECT_PREDICATES}HasHeaderKey": "has-header-key",
    f"{_CONNECT_PREDICATES}RecordIsTombstone": "record-is-tombstone",
}
#: Kind -> its properties (besides ``type``, ``predicate`` and ``negate``) and which are required.
_OWN_PROPS: Final[Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "debezium": (("cdc.target.pattern",), ()),
    "kafka-metadata": (("field_name", "nested"), ()),
    "filter": ((), ()),
    "hoist-field": (("field",), ("field",)),
    "insert-field": (("topic.field", "partition.field", "offset.field", "timestamp.field", "static.field",
                      "static.value"), ()),
    "copy-value": (("source.field", "target.field"), ("source.field", "target.field")),
    "replace-field": (("exclude", "include", "renames", "blacklist", "whitelist"), ()),
    "regex-router": (("regex", "replacement"), ("regex", "replacement")),
    "unwrap": (("delete.tombstone.handling.mode", "delete.handling.mode", "drop.tombstones", "add.fields",
                "add.fields.prefix", "add.headers.prefix", "replace.null.with.default", "drop.fields.from.key",
                "drop.fields.keep.schema.compatible"), ()),
    "dms": ((), ()),
    "json-to-map": (("json.root",), ()),
    "cast": (("spec", "replace.null.with.default"), ("spec",)),
    "timestamp-converter": (("field", "target.type", "format", "unix.precision", "replace.null.with.default"),
                            ("target.type",)),
    "value-to-key": (("fields", "replace.null.with.default"), ("fields",)),
    "mongo-debezium": (("array_handling_mode",), ()),
}
_TRANSFORM_PROPS: Final[Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    **_OWN_PROPS, **{f"{k}-key": v for k, v in _OWN_PROPS.items()
                                           if k in ("cast", "timestamp-converter", "replace-field", "insert-field",
                                                    "hoist-field")}}
#: MongoDebeziumTransform's array_handling_mode values.
ARRAY_MODES: Final = ("array", "document")
_PREDICATE_PROPS: Final[Mapping[str, tuple[str, ...]]] = {
    "topic-name-matches": ("pattern",),
    "has-header-key": ("name",),
    "record-is-tombstone": (),
}
#: What the reference has and icesink does not (yet): refused by name, with what to do.
_NOT_YET: Final[Mapping[str, str]] = {
    "external_field": "unset: a constant metadata field is not supported yet (add it with a default column value)",
    "add.headers": "unset: headers a transform adds are not kept here (add.fields puts the same values in columns)",
    "route.by.field": "unset: routing reads the values before the transform (use iceberg.tables.route-field)",
    "drop.fields.header.name": "unset: headers a transform reads are not kept here",
}


@dataclass(frozen=True)
class PredicateSpec:
    name: str
    kind: str
    props: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TransformSpec:
    """One configured transform: its name, kind, properties, and the predicate guarding it."""

    name: str
    kind: str
    props: Mapping[str, str] = field(default_factory=dict)
    predicate: PredicateSpec | None = None
    negate: bool = False


def _bool(key: str, value: str) -> bool:
    v = value.strip().lower()
    if v not in ("true", "false"):
        raise ConfigError(key, value, "true or false")
    return v == "true"


def _regex(key: str, value: str) -> re.Pattern[str]:
    try:
        return re.compile(value)
    except re.error as exc:
        raise ConfigError(key, value, f"a regular expression ({exc})") from None


def java_replacement(replacement: str) -> str:
    """A Java ``Matcher.replaceFirst`` replacement (``$1``, ``${name}``, ``\\$``) in Python's ``re`` form."""
    out = re.sub(r"\\(.)|\$(\d+)|\$\{(\w+)\}", lambda m: (m[1].replace("\\", "\\\\") if m[1] is not None
                                                       else f"\\g<{m[2] or m[3]}>"), replacement)
    return out


def parse_chain(names: tuple[str, ...], props: Mapping[str, Mapping[str, str]],
                predicate_names: tuple[str, ...], predicate_props: Mapping[str, Mapping[str, str]]) -> tuple[TransformSpec, ...]:
    """The configured chain, in order; raises ConfigError naming the first bad key."""
    predicates: dict[str, PredicateSpec] = {}
    for p in predicate_names:
        pp = predicate_props.get(p, {})
        kind = PREDICATES.get(pp.get("type", ""))
        if kind is None:
            raise ConfigError(f"predicates.{p}.type", pp.get("type"), f"one of {tuple(PREDICATES)}")
        allowed = _PREDICATE_PROPS[kind]
        for prop in sorted(pp.keys() - {"type", *allowed}):
            raise ConfigError(f"predicates.{p}.{prop}", pp[prop], f"unset: {pp['type']} has only {allowed or 'no properties'}")
        for prop in allowed:
            if not pp.get(prop):
                raise ConfigError(f"predicates.{p}.{prop}", None, f"set: {pp['type']} needs it")
        if kind == "topic-name-matches":
            _regex(f"predicates.{p}.pattern", pp["pattern"])
        predicates[p] = PredicateSpec(p, kind, dict(pp))
    for p in predicate_props.keys() - set(predicate_names):
        raise ConfigError(f"predicates.{p}.type", predicate_props[p].get("type"), f"{p} listed in predicates, or unset")
    chain = []
    for name in names:
        tp = props.get(name, {})
        cls = tp.get("type")
        kind = TRANSFORMS.get(cls or "")
        if kind is None:
            raise ConfigError(f"transforms.{name}.type", cls, f"one of {tuple(TRANSFORMS)} (docs/transforms.md)")
        allowed, required = _TRANSFORM_PROPS[kind]
        for prop in sorted(tp.keys() - {"type", "predicate", "negate", *allowed}):
            why = _NOT_YET.get(prop) or f"unset: {cls} has only {allowed or 'no properties'} here"
            raise ConfigError(f"transforms.{name}.{prop}", tp[prop], why)
        for prop in required:
            if prop not in tp:
                raise ConfigError(f"transforms.{name}.{prop}", None, f"set: {cls} needs it")
        predicate = None
        if "predicate" in tp:
            predicate = predicates.get(tp["predicate"])
            if predicate is None:
                raise ConfigError(f"transforms.{name}.predicate", tp["predicate"],
                                  f"one of the predicates listed in predicates ({', '.join(predicates) or 'none'})")
            if kind not in ("filter", "regex-router"):  # the value steps run on every record of a batch
                raise ConfigError(f"transforms.{name}.predicate", tp["predicate"],
                                  f"unset: a predicate guards only Filter and RegexRouter here, not {cls} (docs/transforms.md)")
        negate = _bool(f"transforms.{name}.negate", tp["negate"]) if "negate" in tp else False
        if negate and predicate is None:
            raise ConfigError(f"transforms.{name}.negate", tp["negate"], "unset, or a predicate set for it to negate")
        if kind == "regex-router":
            pattern = _regex(f"transforms.{name}.regex", tp["regex"])
            for ref in re.findall(r"\\g<(\w+)>", java_replacement(tp["replacement"])):
                if not (ref.isdigit() and int(ref) <= pattern.groups) and ref not in pattern.groupindex:
                    raise ConfigError(f"transforms.{name}.replacement", tp["replacement"],
                                      f"a replacement naming groups of the regex (it has no group {ref})")
        if kind in ("replace-field", "replace-field-key"):
            for legacy, now in (("blacklist", "exclude"), ("whitelist", "include")):
                if legacy in tp:  # Connect's old names, still read by ReplaceField
                    tp = {k: v for k, v in tp.items() if k != legacy} | {now: tp[legacy]}
            for pair in (x.strip() for x in tp.get("renames", "").split(",") if x.strip()):
                if len(pair.split(":")) != 2:
                    raise ConfigError(f"transforms.{name}.renames", tp["renames"], f"old:new pairs ({pair!r} is not one)")
        if kind in ("insert-field", "insert-field-key"):
            if ("static.field" in tp) != ("static.value" in tp):
                missing = "static.value" if "static.field" in tp else "static.field"
                raise ConfigError(f"transforms.{name}.{missing}", None, "set: static.field and static.value go together")
            if tp.get("timestamp.field", "").endswith("!"):
                raise ConfigError(f"transforms.{name}.timestamp.field", tp["timestamp.field"],
                                  "an optional field (no '!'): a record may have no timestamp")
        if kind == "unwrap":
            unwrap_options(name, tp)
        if kind == "json-to-map" and "json.root" in tp:
            _bool(f"transforms.{name}.json.root", tp["json.root"])
        if kind.removesuffix("-key") in ("cast", "timestamp-converter"):
            check_conversion(name, kind, tp)
        if kind == "mongo-debezium" and tp.get("array_handling_mode", "array").strip().lower() not in ARRAY_MODES:
            raise ConfigError(f"transforms.{name}.array_handling_mode", tp["array_handling_mode"], f"one of {ARRAY_MODES}")
        if kind == "kafka-metadata" and "nested" in tp:
            _bool(f"transforms.{name}.nested", tp["nested"])
        chain.append(TransformSpec(name, kind, dict(tp), predicate, negate))
    return tuple(chain)


def unwrap_options(name: str, props: Mapping[str, str]) -> tuple[str, tuple[tuple[str, str, str], ...]]:
    """ExtractNewRecordState's delete mode (one of UNWRAP_MODES) and its ``add.fields`` as
    (struct or "", field, column), as Debezium's FieldReference reads them: ``op``, ``ts_ms``,
    ``ts_us``, ``ts_ns`` top-level, ``id``, ``total_order``, ``data_collection_order`` in
    ``transaction``, any other in ``source`` (else top-level when that has none); ``struct.field``
    names its struct; ``:name`` renames;
    the column is ``add.fields.prefix`` (``__``) + the name (``struct_field`` when qualified)."""
    key = f"transforms.{name}."
    for b in ("drop.tombstones", "replace.null.with.default", "drop.fields.from.key", "drop.fields.keep.schema.compatible"):
        if b in props:
            _bool(key + b, props[b])
    mode = props.get("delete.tombstone.handling.mode", "tombstone").strip().lower()
    if mode not in UNWRAP_MODES:
        raise ConfigError(key + "delete.tombstone.handling.mode", props["delete.tombstone.handling.mode"],
                          f"one of {UNWRAP_MODES}")
    if "delete.handling.mode" in props:
        legacy = props["delete.handling.mode"].strip().lower()
        if legacy not in _UNWRAP_LEGACY:
            raise ConfigError(key + "delete.handling.mode", props["delete.handling.mode"], f"one of {tuple(_UNWRAP_LEGACY)}")
        if "delete.tombstone.handling.mode" in props:
            raise ConfigError(key + "delete.handling.mode", props["delete.handling.mode"],
                              "unset with delete.tombstone.handling.mode (its replacement)")
        mode = _UNWRAP_LEGACY[legacy]
    prefix = props.get("add.fields.prefix", "__")
    fields = []
    for ref in (x.strip() for x in props.get("add.fields", "").split(",") if x.strip()):
        parts = ref.split(":")
        splits = parts[0].split(".")
        if len(parts) > 2 or len(splits) > 2 or not all(splits) or (len(parts) == 2 and not parts[1]):
            raise ConfigError(key + "add.fields", props["add.fields"], f"field[:name] or struct.field[:name] ({ref!r} is not)")
        leaf = splits[-1]
        struct = splits[0] if len(splits) == 2 else (
            "transaction" if leaf in ("id", "total_order", "data_collection_order")
            else "" if leaf in ("op", "ts_ms", "ts_us", "ts_ns") else "source")
        column = prefix + (parts[1] if len(parts) == 2 else leaf if len(splits) == 1 else f"{struct}_{leaf}")
        fields.append((struct, leaf, column))
    return mode, tuple(fields)


def inserted_fields(chain: tuple[TransformSpec, ...]) -> tuple[tuple[str, str, bool], ...]:
    """InsertField$Value's columns: (column, source, required) with source ``topic``,
    ``partition``, ``offset``, ``timestamp`` or ``static:<value>``; ``!`` makes it required,
    ``?`` (the default) optional, as Connect reads the field names."""
    out = []
    for spec in chain:
        if spec.kind != "insert-field":
            continue
        for what in ("topic", "partition", "offset", "timestamp", "static"):
            raw = spec.props.get(f"{what}.field")
            if raw:
                name, required = raw.rstrip("!?"), raw.endswith("!")
                out.append((name, f"static:{spec.props['static.value']}" if what == "static" else what, required))
    return tuple(out)


def gone_fields(chain: tuple[TransformSpec, ...]) -> dict[str, str]:
    """Top-level value fields every record has lost by the end of the chain, and how: renamed
    away or excluded by an unguarded ReplaceField, not made again by a later transform (a rename,
    CopyValue, InsertField). Guarded transforms may leave a record's fields as they are; after a
    HoistField or the Debezium transform the fields are others: nothing is known gone there."""
    gone: dict[str, str] = {}
    for spec in chain:
        if spec.kind in ("hoist-field", "debezium"):
            return {}
        made: set[str] = set()
        if spec.kind == "replace-field":
            pairs = [p.split(":") for p in (x.strip() for x in spec.props.get("renames", "").split(",")) if p]
            made = {new.strip() for _, new in pairs}
            if spec.predicate is None:
                for old, new in pairs:
                    gone[old.strip()] = f"renamed to {new.strip()!r} by transforms.{spec.name}"
                for field in (x.strip() for x in spec.props.get("exclude", "").split(",") if x.strip()):
                    gone[field] = f"excluded by transforms.{spec.name}"
        elif spec.kind == "copy-value":
            made = {spec.props["target.field"]}
        elif spec.kind == "insert-field":
            made = {name for name, _, _ in inserted_fields((spec,))}
        for name in made:
            gone.pop(name, None)
    return gone


def metadata_columns(chain: tuple[TransformSpec, ...],
                     own: tuple[str, bool, bool] | None) -> tuple[str, bool, bool] | None:
    """The Kafka metadata columns (field or prefix, nested, with headers): the reference's
    KafkaMetadataTransform's (no headers, as it) if the chain has one, else ``own``
    (iceberg.tables.kafka-metadata-enabled's, with headers); None: none."""
    for spec in chain:
        if spec.kind == "kafka-metadata":
            nested = spec.props.get("nested", "false").strip().lower() == "true"
            return spec.props.get("field_name", "_kafka_metadata"), nested, False
    return own
