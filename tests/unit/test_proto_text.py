"""Registered .proto texts compiled by protoc (agents/formats/proto_text.py): what AxonOps'
``?format=serialized`` loses (enums, map entries, proto3 ``optional``) is kept, every imported
file comes back (the well-known types too, so no process-wide pool is needed), errors name the
place, and reference names cannot write outside the private directory."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2

from agents.formats.proto_text import compile_proto
from agents.formats.protobuf import ProtobufSchemaError

TEXT = """syntax = "proto3";
package t;
import "t/ref.proto";
import "google/protobuf/timestamp.proto";
message M {
  enum E { A = 0; B = 1; }
  E e = 1;
  map<string, int32> m = 2;
  optional string o = 3;
  t.R r = 4;
  google.protobuf.Timestamp at = 5;
}
"""
REF = 'syntax = "proto3";\npackage t;\nmessage R {\n  int32 x = 1;\n}\n'


def test_enums_maps_and_optional_are_kept_and_every_import_comes_back() -> None:
    main, refs = compile_proto(TEXT, (("t/ref.proto", REF),))
    fdp = descriptor_pb2.FileDescriptorProto.FromString(main)
    [m] = fdp.message_type
    assert [e.name for e in m.enum_type] == ["E"]
    assert [n.options.map_entry for n in m.nested_type] == [True]
    assert {f.name: f.proto3_optional for f in m.field}["o"] is True
    assert dict(refs).keys() == {"t/ref.proto", "google/protobuf/timestamp.proto"}


def test_a_schema_that_does_not_compile_names_the_line() -> None:
    with pytest.raises(ProtobufSchemaError) as e:
        compile_proto('syntax = "proto3";\nmessage M {\n  int64 id = 1\n}\n')
    assert "does not compile: schema:4:" in str(e.value)
    with pytest.raises(ProtobufSchemaError) as e:
        compile_proto(TEXT)  # its reference missing
    assert "t/ref.proto" in str(e.value)


@pytest.mark.parametrize("name", ["../x.proto", "/tmp/x.proto", "a/../../x.proto", "x.txt"])
def test_reference_names_stay_inside_the_private_directory(name: str) -> None:
    with pytest.raises(ProtobufSchemaError) as e:
        compile_proto(TEXT, ((name, REF),))
    assert "not a relative .proto path" in str(e.value)


def test_apicurios_explicit_map_entries_compile_as_maps() -> None:
    """Apicurio 2.4 stores a map field as its serializer printed it: ``repeated XEntry`` and the
    nested entry message with ``option map_entry = true``, which protoc refuses when written."""
    text = ('syntax = "proto3";\npackage shop;\nmessage Order {\n  int64 id = 1;\n  repeated CountsEntry counts = 5;\n\n'
            '  message CountsEntry {\n    option map_entry = true;\n\n    string key = 1;\n    int32 value = 2;\n  }\n}\n')
    main, _ = compile_proto(text)
    [entry] = descriptor_pb2.FileDescriptorProto.FromString(main).message_type[0].nested_type
    assert entry.name == "CountsEntry" and entry.options.map_entry
