"""The schema-registry converters' settings (issue 36 point 1): which converter classes
read registry-framed values, and their ``value.converter.*`` keys as one typed object
(:func:`registry_settings`); a registry ``key.converter`` takes the same keys under
``key.converter.*`` (``registry_settings(s, "key")``). Leaf module: no I/O.

Each key either acts or is refused at start naming it (:class:`ConfigError`):

- ``value.converter.schema.registry.url``: one or more URLs, comma-separated (Confluent's).
  Apicurio's converter takes ``value.converter.apicurio.registry.url`` (its own API,
  ``.../apis/registry/v2`` or ``v3``); the sink reads the Confluent-compatible API beside it
  (``.../apis/ccompat/v7``), where the ids its 4-byte content-id frames name are served.
- ``value.converter.basic.auth.credentials.source``: ``URL`` (the default, as Confluent's: the
  URL's own ``user:password@``) or ``USER_INFO`` (``value.converter.basic.auth.user.info``, a
  secret). Others (``SASL_INHERIT``) are refused.
- TLS: ``value.converter.schema.registry.ssl.truststore.location`` with ``.truststore.type=PEM``,
  ``.keystore.location`` with ``.keystore.type=PEM`` (certificate and key in one file) and
  ``.key.password``; JKS and PKCS12 stores are refused.
- Apicurio without headers: its wire format must be Confluent's (its defaults since 3.x): an
  ``apicurio.registry.id-handler`` other than ``Default4ByteIdHandler`` (3.x) or
  ``Legacy4ByteIdHandler`` (2.x), or ``apicurio.registry.use-id=globalId`` is refused. Apicurio 2's settings
  (``apicurio.registry.as-confluent``, which must be true, or its ``Legacy4ByteIdHandler``) also
  need ``use-id=contentId`` and ``headers.enabled=false`` said outright: 2.x defaults to global
  ids in headers.
- Apicurio's ``ProtobufConverter`` (docs/schema-registry.md, "Apicurio's Protobuf frame"): its
  serde's own frame, :class:`ApicurioFrame`: ``apicurio.registry.id-handler``
  ``Default4ByteIdHandler`` / ``Legacy4ByteIdHandler`` (or ``as-confluent=true``) for a 4-byte id,
  ``DefaultIdHandler`` / ``Legacy8ByteIdHandler`` for an 8-byte one; ``use-id`` ``contentId``
  (read through the Confluent-compatible API) or ``globalId`` (read through Apicurio's own API,
  ``/ids/globalIds/{id}``); ``apicurio.registry.serde.read-indexes=true`` skips Confluent's
  message indexes before the Ref. ``serde.read-type-ref=false`` (no Ref: nothing names the
  message) is refused.
- Apicurio's headers mode (``apicurio.registry.headers.enabled=true``, 2.x's default), both
  converters (keys: Avro, ``apicurio.key.*`` headers): :class:`ApicurioHeaders` (:func:`_apicurio_headers`), the id read
  from the record header ``use-id`` names (docs/schema-registry.md, "Apicurio's headers mode").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from pydantic import SecretStr

from icesink.shared.errors import ConfigError
from icesink.shared.secrets import mask_url

if TYPE_CHECKING:
    from icesink.shared.config import Settings

AVRO_CONVERTER: Final = "io.confluent.connect.avro.AvroConverter"
PROTOBUF_CONVERTER: Final = "io.confluent.connect.protobuf.ProtobufConverter"
JSON_SCHEMA_CONVERTER: Final = "io.confluent.connect.json.JsonSchemaConverter"
APICURIO_AVRO_CONVERTER: Final = "io.apicurio.registry.utils.converter.AvroConverter"
APICURIO_PROTOBUF_CONVERTER: Final = "io.apicurio.registry.utils.converter.ProtobufConverter"
#: Converter class -> the decoder of its payloads (agents/formats/registry_values.py dispatches on
#: it): the one place to add a registry converter.
REGISTRY_CONVERTERS: Final[Mapping[str, str]] = {
    AVRO_CONVERTER: "avro",
    APICURIO_AVRO_CONVERTER: "avro",
    PROTOBUF_CONVERTER: "protobuf",
    APICURIO_PROTOBUF_CONVERTER: "protobuf",
    JSON_SCHEMA_CONVERTER: "json",
}
#: Registry converters known but not read: refused at start, saying so. Apicurio's
#: ExtJsonConverter is JSON with the id inside, not the registry wire format.
NOT_YET: Final[Mapping[str, str]] = {
    "io.apicurio.registry.utils.converter.ExtJsonConverter": "Apicurio's JSON",
}
APICURIO: Final = frozenset({APICURIO_AVRO_CONVERTER, APICURIO_PROTOBUF_CONVERTER})

#: Serializer-side keys a sink's converter has no use for: accepted, logged, no effect.
_NO_EFFECT: Final = frozenset((
    "auto.register.schemas", "use.latest.version", "normalize.schemas", "latest.compatibility.strict",
    "key.subject.name.strategy", "value.subject.name.strategy", "apicurio.registry.auto-register",
    "apicurio.registry.find-latest", "apicurio.registry.artifact-resolver-strategy",
    "apicurio.registry.serde.send-type-ref", "apicurio.registry.serde.send-indexes",  # the serializer's
    "apicurio.registry.serde.validation-enabled",
))
#: The read-side keys of Confluent's ProtobufData / JsonSchemaData (ProtobufDataConfig,
#: JsonSchemaDataConfig, AbstractDataConfig) by decoder: key -> the value icesink reads as
#: Confluent's default does. A key in OPTIONS acts; any other of these is accepted only at that
#: default value (another would change the table, and is refused naming the key).
DATA_KEYS: Final[Mapping[str, Mapping[str, str]]] = {
    "protobuf": {"wrapper.for.nullables": "false", "generate.index.for.unions": "true", "int.for.enums": "false",
                 "enhanced.protobuf.schema.support": "false", "scrub.invalid.names": "false",
                 "optional.for.nullables": "false", "optional.for.proto2": "true", "generate.struct.for.nulls": "false",
                 "wrapper.for.raw.primitives": "true", "flatten.unions": "false",
                 "generalized.sum.type.support": "false", "ignore.default.for.nullables": "false"},
    "json": {"use.optional.for.nonrequired": "false", "flatten.singleton.unions": "true",
             "ignore.modern.dialects": "false", "preserve.additional.properties": "false",
             "generalized.sum.type.support": "false", "ignore.default.for.nullables": "false"},
}
#: Keys that act (DecodeOptions' fields).
OPTIONS: Final = frozenset({"wrapper.for.nullables", "generate.index.for.unions", "int.for.enums",
                            "use.optional.for.nonrequired"})
#: A cache size, and JsonSchemaData's write-side keys (how it writes decimals, objects): no effect on
#: what a sink reads.
_CACHE_KEYS: Final[Mapping[str, frozenset[str]]] = {
    "avro": frozenset({"schemas.cache.config"}),
    "protobuf": frozenset({"schemas.cache.config"}),
    "json": frozenset({"schemas.cache.config", "decimal.format", "object.additional.properties"}),
}
_APICURIO_ID_HANDLER: Final = "io.apicurio.registry.serde.Default4ByteIdHandler"
#: Apicurio 2's 4-byte id handler, the one its ``as-confluent=true`` picks: with its defaults it
#: writes the global id (``use-id=globalId``) and puts ids in headers (``headers.enabled=true``).
_APICURIO_2_ID_HANDLER: Final = "io.apicurio.registry.serde.Legacy4ByteIdHandler"
_AS_CONFLUENT: Final = ("the Confluent wire format (a 4-byte content id after the magic byte, no headers), "
                        "as Apicurio 3's defaults or Apicurio 2's apicurio.registry.as-confluent=true with "
                        "use-id=contentId and headers.enabled=false write it")


@dataclass(frozen=True)
class DecodeOptions:
    """The converter's keys that change what a value decodes to (Confluent's defaults)."""

    wrapper_for_nullables: bool = False  # Protobuf wrappers: their primitive (true) or struct<value>
    index_for_unions: bool = True  # Protobuf: a oneof's column is <name>_<index> (generate.index.for.unions)
    int_for_enums: bool = False  # Protobuf: an enum is its number
    optional_for_nonrequired: bool = False  # JSON Schema: a property ``required`` omits is optional


_DEFAULTS: Final = DecodeOptions()

#: Apicurio's id handlers: class -> the id's width in bytes (2.x: DefaultIdHandler, Legacy4ByteIdHandler;
#: 3.x: Default4ByteIdHandler, Legacy8ByteIdHandler).
_ID_HANDLERS: Final[Mapping[str, int]] = {
    "io.apicurio.registry.serde.DefaultIdHandler": 8, "io.apicurio.registry.serde.Legacy8ByteIdHandler": 8,
    _APICURIO_ID_HANDLER: 4, _APICURIO_2_ID_HANDLER: 4,
}
_APICURIO_2_HANDLERS: Final = frozenset({"io.apicurio.registry.serde.DefaultIdHandler", _APICURIO_2_ID_HANDLER})


@dataclass(frozen=True)
class ApicurioFrame:
    """How Apicurio's Protobuf serde frames a value (agents/formats/apicurio_proto.py reads it):
    magic byte 0, the id in ``id_bytes`` (4 or 8) big-endian bytes, Confluent's message indexes
    if ``indexes``, Apicurio's length-delimited ``Ref`` message, the payload. ``global_ids``: the
    id is a global id (Apicurio's own API) rather than a content id (the Confluent-compatible API)."""

    id_bytes: int = 4
    global_ids: bool = False
    indexes: bool = False


@dataclass(frozen=True)
class ApicurioHeaders:
    """Apicurio's headers mode (``apicurio.registry.headers.enabled=true``, 2.x's serde default;
    agents/formats/apicurio_headers.py reads it): the value carries no magic byte nor id, the id
    is an 8-byte big-endian long in the record header ``id_header`` (``apicurio.value.globalId``,
    or ``apicurio.value.contentId`` with ``use-id=contentId``); a Protobuf value's message is named
    by ``type_header`` (``apicurio.protobuf.type``, no Ref in the value); an Avro value's encoding
    by ``encoding_header`` (``apicurio.value.encoding``: BINARY is read, JSON is a reject)."""

    id_header: str
    global_ids: bool
    type_header: str | None = None  # Protobuf only
    encoding_header: str = "apicurio.value.encoding"


@dataclass(frozen=True)
class RegistrySettings:
    """A registry converter's settings, checked."""

    converter: str
    format: str  # the decoder: "avro", "protobuf" or "json"
    urls: tuple[str, ...]
    user_info: SecretStr | None
    cafile: str | None
    certfile: str | None
    key_password: SecretStr | None
    url_key: str  # the key the URLs came from, named in errors
    options: DecodeOptions = _DEFAULTS
    apicurio_frame: ApicurioFrame | None = None  # Apicurio's ProtobufConverter: its own frame
    apicurio_headers: ApicurioHeaders | None = None  # Apicurio's headers mode: the id in record headers

    @property
    def global_ids(self) -> bool:
        """The ids name Apicurio global ids (read through Apicurio's own API)."""
        if self.apicurio_headers is not None:
            return self.apicurio_headers.global_ids
        return self.apicurio_frame is not None and self.apicurio_frame.global_ids


def is_registry_converter(converter: str) -> bool:
    return converter in REGISTRY_CONVERTERS or converter in NOT_YET


def registry_settings(s: Settings, side: Literal["value", "key"] = "value") -> RegistrySettings | None:
    """The registry settings of ``s``'s value (or key) converter (None: no registry converter).
    Raises ConfigError naming the key that is missing, unknown or wrong."""
    converter = s.value_converter if side == "value" else s.key_converter
    pre = f"{side}.converter."
    k_url, k_apicurio_url = pre + "schema.registry.url", pre + "apicurio.registry.url"
    k_source, k_user_info = pre + "basic.auth.credentials.source", pre + "basic.auth.user.info"
    if converter in NOT_YET:
        raise ConfigError(f"{side}.converter", converter,
                          f"a converter icesink reads: {NOT_YET[converter]} values through a schema registry are "
                          f"not yet supported (supported: {', '.join(sorted(REGISTRY_CONVERTERS))})")
    if converter not in REGISTRY_CONVERTERS:
        return None
    props = s.value_converter_props if side == "value" else s.key_converter_props
    apicurio = converter in APICURIO
    fmt = REGISTRY_CONVERTERS[converter]
    options = _options(props, fmt, pre)
    for key in props:
        name = key[len(pre):]
        if not _known(name, apicurio, converter == APICURIO_PROTOBUF_CONVERTER) and name not in _NO_EFFECT \
                and name not in _CACHE_KEYS[fmt] \
                and name not in DATA_KEYS.get(fmt, {}):
            raise ConfigError(key, mask_url(props[key]), f"a key {converter} takes here (registry URL, credentials, "
                              "PEM TLS files; docs/schema-registry.md); this one would be ignored")
    url_key = k_apicurio_url if apicurio else k_url
    urls = tuple(u.strip().rstrip("/") for u in props.get(url_key, "").split(",") if u.strip())
    if not urls:
        raise ConfigError(url_key, props.get(url_key), "one or more registry URLs, comma-separated "
                          "(http://host:8081)")
    for u in urls:
        if not re.match(r"https?://[^/\s]+", u):
            raise ConfigError(url_key, mask_url(u), "http:// or https:// URLs, comma-separated")
    frame = None
    headers = _apicurio_headers(props, pre, side, fmt) if apicurio else None
    if headers is not None:
        urls = tuple(_native(u, k_apicurio_url) if headers.global_ids else _ccompat(u, k_apicurio_url) for u in urls)
    elif converter == APICURIO_PROTOBUF_CONVERTER:
        frame = _apicurio_frame(props, pre)
        urls = tuple(_native(u, k_apicurio_url) if frame.global_ids else _ccompat(u, k_apicurio_url) for u in urls)
    elif apicurio:
        urls = tuple(_ccompat(u, k_apicurio_url) for u in urls)
        _check_apicurio(props, pre)
    source = props.get(k_source, "URL").strip().upper()
    if source not in ("URL", "USER_INFO"):
        raise ConfigError(k_source, props.get(k_source), "URL or USER_INFO")
    user_info = (s.value_converter_user_info if side == "value" else s.key_converter_user_info
                 ) if source == "USER_INFO" else None
    if source == "USER_INFO" and (user_info is None or ":" not in user_info.get_secret_value()):
        raise ConfigError(k_user_info, None, f"user:password, since {k_source} is USER_INFO")
    cafile = _pem(props, "truststore", pre + "schema.registry.ssl.")
    certfile = _pem(props, "keystore", pre + "schema.registry.ssl.")
    password = s.value_converter_key_password if side == "value" else s.key_converter_key_password
    return RegistrySettings(converter, fmt, urls, user_info, cafile, certfile,
                            password if certfile else None, url_key, options, frame, headers)


def _options(props: Mapping[str, str], fmt: str, pre: str) -> DecodeOptions:
    """The ProtobufData / JsonSchemaData keys: those in OPTIONS act, the others only at their default."""
    known = DATA_KEYS.get(fmt, {})
    got: dict[str, bool] = {}
    for name, default in known.items():
        raw = props.get(pre + name)
        if raw is None:
            continue
        value = raw.strip().lower()
        if default in ("true", "false") and value not in ("true", "false"):
            raise ConfigError(pre + name, raw, "true or false")
        if name in OPTIONS:
            got[name] = value == "true"
        elif value != default:
            raise ConfigError(pre + name, raw, f"{default} (Confluent's default, what icesink reads; another value "
                              "would change the table and is not supported)")
    return DecodeOptions(wrapper_for_nullables=got.get("wrapper.for.nullables", False),
                         index_for_unions=got.get("generate.index.for.unions", True),
                         int_for_enums=got.get("int.for.enums", False),
                         optional_for_nonrequired=got.get("use.optional.for.nonrequired", False))


def _known(key: str, apicurio: bool, apicurio_protobuf: bool = False) -> bool:
    """Whether ``key`` (after ``value.converter.`` or ``key.converter.``) is a key read here."""
    ssl = "schema.registry.ssl."
    own = {"basic.auth.credentials.source", ssl + "truststore.location", ssl + "truststore.type",
           ssl + "keystore.location", ssl + "keystore.type"}
    if apicurio:
        return key in own or key in ("apicurio.registry.url", "apicurio.registry.id-handler",
                                     "apicurio.registry.use-id", "apicurio.registry.headers.enabled",
                                     "apicurio.registry.as-confluent") \
            or (apicurio_protobuf and key in ("apicurio.registry.serde.read-type-ref",
                                              "apicurio.registry.serde.read-indexes")) \
            or key == "apicurio.registry.headers.handler" or key.startswith("apicurio.registry.headers.")
    return key in own or key == "schema.registry.url"


def _pem(props: Mapping[str, str], store: str, ssl_prefix: str) -> str | None:
    location = props.get(f"{ssl_prefix}{store}.location")
    kind = props.get(f"{ssl_prefix}{store}.type")
    if location is None:
        if kind is not None and kind.upper() != "PEM":
            raise ConfigError(f"{ssl_prefix}{store}.type", kind, "PEM (the only store type read here)")
        return None
    if kind is None or kind.strip().upper() != "PEM":
        raise ConfigError(f"{ssl_prefix}{store}.type", kind, f"PEM: {store} files are read as PEM only (JKS and PKCS12 "
                          f"are refused; Confluent's default is JKS, so set it), for {ssl_prefix}{store}.location")
    return location


def _ccompat(url: str, k_apicurio_url: str) -> str:
    m = re.match(r"(?P<base>.*?)/apis/registry/v[23]$", url)
    if m is None:
        raise ConfigError(k_apicurio_url, mask_url(url), "Apicurio's API URL, ending in /apis/registry/v2 or "
                          "/apis/registry/v3 (the sink reads the Confluent-compatible API beside it)")
    return f"{m['base']}/apis/ccompat/v7"


def _native(url: str, k_apicurio_url: str) -> str:
    _ccompat(url, k_apicurio_url)  # the same check: Apicurio's API URL
    return url


def _flag(props: Mapping[str, str], key: str, default: bool) -> bool:
    raw = props.get(key)
    if raw is None:
        return default
    if raw.strip().lower() not in ("true", "false"):
        raise ConfigError(key, raw, "true or false")
    return raw.strip().lower() == "true"


def _apicurio_frame(props: Mapping[str, str], pre: str) -> ApicurioFrame:
    """The frame Apicurio's Protobuf serde writes under these keys (as its ProtobufKafkaDeserializer
    reads it: AbstractKafkaSerDe picks the id handler, ``as-confluent`` overriding it)."""
    k = pre + "apicurio.registry."
    handler = (props.get(k + "id-handler") or _APICURIO_ID_HANDLER).strip()
    if handler not in _ID_HANDLERS:
        raise ConfigError(k + "id-handler", handler, "one of Apicurio's id handlers: " + ", ".join(sorted(_ID_HANDLERS)))
    as_confluent = _flag(props, k + "as-confluent", False)
    width = 4 if as_confluent else _ID_HANDLERS[handler]
    use_id = (props.get(k + "use-id") or "contentId").strip()
    if use_id not in ("contentId", "globalId"):
        raise ConfigError(k + "use-id", use_id, "contentId or globalId")
    if not _flag(props, k + "serde.read-type-ref", True):
        raise ConfigError(k + "serde.read-type-ref", props[k + "serde.read-type-ref"],
                          "true: the frame's Ref message is what names the message type of each value")
    if as_confluent or handler in _APICURIO_2_HANDLERS:
        for key, default in (("use-id", "globalId"), ("headers.enabled", "true")):
            if props.get(k + key) is None:
                raise ConfigError(k + key, None, f"set with Apicurio 2's id handler or as-confluent (2.x's default is "
                                  f"{default}, 3.x's the other): say which the producers write")
    return ApicurioFrame(width, use_id == "globalId", _flag(props, k + "serde.read-indexes", False))


def _check_apicurio(props: Mapping[str, str], pre: str) -> None:
    handler = props.get(pre + "apicurio.registry.id-handler")
    handler = handler.strip() if handler is not None else None
    if handler is not None and handler not in (_APICURIO_ID_HANDLER, _APICURIO_2_ID_HANDLER):
        raise ConfigError(pre + "apicurio.registry.id-handler", handler, _AS_CONFLUENT)
    as_confluent = props.get(pre + "apicurio.registry.as-confluent")
    if as_confluent is not None and as_confluent.strip().lower() != "true" and handler != _APICURIO_2_ID_HANDLER:
        raise ConfigError(pre + "apicurio.registry.as-confluent", as_confluent,
                          "true (Apicurio 2 writes 8-byte ids otherwise): " + _AS_CONFLUENT)
    use_id = props.get(pre + "apicurio.registry.use-id")
    if use_id is not None and use_id.strip() != "contentId":
        raise ConfigError(pre + "apicurio.registry.use-id", use_id, "contentId: " + _AS_CONFLUENT)
    headers = props.get(pre + "apicurio.registry.headers.enabled")
    if as_confluent is not None or handler == _APICURIO_2_ID_HANDLER:
        # Apicurio 2 settings: its defaults are global ids in headers, so both must be said
        for key, value in (("use-id", use_id), ("headers.enabled", headers)):
            if value is None:
                raise ConfigError(pre + "apicurio.registry." + key, None,
                                  "set with Apicurio 2's as-confluent or Legacy4ByteIdHandler (its default is "
                                  + ("globalId" if key == "use-id" else "true") + "): " + _AS_CONFLUENT)


_HEADERS_HANDLER: Final = "io.apicurio.registry.serde.headers.DefaultHeadersHandler"
#: Keys that frame a value without headers: with headers on, icesink reads ids from headers only.
_FRAME_KEYS: Final = ("id-handler", "as-confluent", "serde.read-indexes", "serde.read-type-ref")


def _apicurio_headers(props: Mapping[str, str], pre: str, side: str, fmt: str) -> ApicurioHeaders | None:
    """Apicurio's headers mode under these keys (None: headers off), as 2.4's DefaultHeadersHandler
    reads it (docs/schema-registry.md, "Apicurio's headers mode"): the id's header per ``use-id``
    (``globalId``, 2.x's default, or ``contentId``), renamed by ``headers.<side>.globalId.name`` /
    ``.contentId.name``. Header keys that would act on nothing icesink reads are refused by name."""
    k = pre + "apicurio.registry."
    header_keys = sorted(key for key in props if key.startswith(k + "headers.") and key != k + "headers.enabled")
    if not _flag(props, k + "headers.enabled", False):
        if header_keys:
            raise ConfigError(header_keys[0], props[header_keys[0]], f"set only with {k}headers.enabled=true "
                              "(without headers it would be ignored)")
        return None
    for name in _FRAME_KEYS:
        if props.get(k + name) is not None:
            raise ConfigError(k + name, props[k + name], "unset with headers.enabled=true: it frames values without "
                              "headers, and icesink reads ids from the record headers only (a value without them is "
                              "a dead letter)")
    use_id = (props.get(k + "use-id") or "globalId").strip()
    if use_id not in ("contentId", "globalId"):
        raise ConfigError(k + "use-id", use_id, "contentId or globalId")
    id_key = f"{k}headers.{side}.{use_id}.name"
    for key in header_keys:
        if key == k + "headers.handler":
            if props[key].strip() != _HEADERS_HANDLER:
                raise ConfigError(key, props[key], f"{_HEADERS_HANDLER} (Apicurio's, the headers icesink reads)")
        elif key != id_key:
            raise ConfigError(key, props[key], f"not read: icesink reads the {use_id} header only ({id_key} "
                              "renames it); records named by group, artifact and version headers are dead letters")
    default = f"apicurio.{side}.{use_id}"
    return ApicurioHeaders((props.get(id_key) or default).strip(), use_id == "globalId",
                           # ProtobufSerdeHeaders: the message's name, ".key" after it for keys
                           ("apicurio.protobuf.type" + (".key" if side == "key" else "")) if fmt == "protobuf" else None,
                           f"apicurio.{side}.encoding")
