"""Record formats around :func:`agents.convert.decode_json`: the Kafka Connect schema envelope,
and the record key and Kafka metadata as columns.

Connect envelope (``value.converter.schemas.enable=true``)
---------------------------------------------------------
JsonConverter writes each value as ``{"schema": {...}, "payload": {...}}``. The schema of each
record travels with it; a topic usually carries one or a few distinct schemas. A batch is split
into (schema text, payload bytes) per record with byte searches, grouped by identical schema
text, each distinct schema parsed once (cached), and each group's payloads decoded in bulk by
``decode_json``. The Connect schema decides:

- the column types of an auto-created table (:func:`connect_iceberg_schema`: logical types
  Timestamp -> timestamptz, Date -> date, Time -> time, Decimal -> decimal, Debezium's time,
  UUID and JSON names, ``optional`` -> not required);
- how JSON values are read into an existing table's columns: the table schema is the truth, the
  record's schema says the encoding (a Connect Timestamp is epoch milliseconds, a Decimal is
  base64 of the unscaled bytes), given to decode_json as Arrow field metadata
  (``icesink.epoch-unit``, ``icesink.decimal-encoding``; see :func:`decode_schema`);
- with schema evolution, what the table needs (:func:`connect_arrow_schema`, given to the
  ``grow`` of :meth:`RecordFormat.convert`: agents.evolution.Growth).

A record whose envelope is malformed (no ``schema`` or ``payload``, a schema that is not a
Connect struct schema, a Decimal whose scale differs from the column's) is a :class:`Reject`
naming the reason; it goes to the dead letters like any other bad record.

Key and metadata columns
------------------------
``iceberg.tables.key-column`` names a column holding the record key (a string for the String
and JSON key converters, binary for ByteArrayConverter, the key schema's type for a registry key
converter: ``registry_keys``; with a ValueToKey transform, the struct of its value fields).
``iceberg.tables.kafka-metadata-enabled`` adds the source position as the reference's KafkaMetadataTransform does: columns
``<field>_topic``, ``_partition``, ``_offset``, ``_timestamp`` and ``_headers`` (or, nested, a
struct ``<field>`` with those children), ``<field>`` defaulting to ``_kafka_metadata``. These
columns are built from the messages with Arrow, never read from the value. An existing table
gets those of them it has (a ``long`` timestamp column, as the reference SMT creates, gets epoch
milliseconds).

String and bytes values
-----------------------
With ``value.converter`` = StringConverter or ByteArrayConverter each value goes whole into one
column, ``iceberg.tables.value-column`` (``value``): string (UTF-8 text; a value that is not is
a reject) or binary, byte for byte (``raw``).

Modules
-------
``connect_schema`` (Kafka Connect schemas to Iceberg and Arrow), ``envelopes`` (splitting,
grouping and decoding schema+payload envelopes), ``extras`` (the key and metadata columns),
``raw`` (string and bytes values), ``record_format`` (:class:`RecordFormat`, over the four);
each imports only those before it.
This module re-exports their public names.
"""

from __future__ import annotations

from agents.formats.connect_schema import ConnectSchemaError, connect_arrow_schema, connect_iceberg_schema, decode_schema
from agents.formats.envelopes import Envelopes, decode_envelopes, split_envelope
from agents.formats.record_format import Grow, RecordFormat

__all__ = [
    "ConnectSchemaError",
    "Envelopes",
    "Grow",
    "RecordFormat",
    "connect_arrow_schema",
    "connect_iceberg_schema",
    "decode_envelopes",
    "decode_schema",
    "split_envelope",
]
