"""A registered Protobuf schema's ``.proto`` text compiled by protoc (issue 36): what
``GET /schemas/ids/{id}`` serves on every registry (Confluent's stores the text it canonicalises,
AxonOps the text it was given), unlike ``?format=serialized``, which AxonOps answers lossily (an
enum field makes it fail, maps lose ``map_entry``, proto3 ``optional`` its flag;
docs/schema-registry.md). protoc is grpcio-tools' (``python -m grpc_tools.protoc``, no binary
downloaded), run as a child process: the text comes from the registry, and a protoc that crashes
on it ends that child, not the replica (its error is the schema's reject reason). The text and its
references are written to a private temporary directory by their import names, and protoc's own
well-known types (``google/protobuf/*.proto``) are on its path.

Apicurio stores a Protobuf schema as its serializer printed it from the message's descriptor
(2.4's FileDescriptorUtils): a map field as the ``repeated XEntry`` it is on the wire with the
nested ``message XEntry { option map_entry = true; ... }`` spelled out, which protoc refuses
("map_entry should not be set explicitly"). Such options are taken out of the text before
protoc runs and set again on those messages in the descriptors it returns, so the field is the
map Apicurio's own deserializer sees.
"""

from __future__ import annotations

import functools
import importlib.resources
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from google.protobuf import descriptor_pb2

from agents.formats.protobuf import ProtobufSchemaError

_MAP_ENTRY = re.compile(r"(message\s+(\w+)\s*\{)\s*option\s+map_entry\s*=\s*true\s*;")
_MAIN = "__registered__.proto"  # the main file's name in the temporary tree (imports name the others)
_TIMEOUT_S = 60.0  # one compile; a schema that takes longer is a reject


@functools.lru_cache(maxsize=256)
def compile_proto(text: str, references: tuple[tuple[str, str], ...] = ()) -> tuple[bytes, tuple[tuple[str, bytes], ...]]:
    """``text`` and its ``references`` ((import name, .proto text) pairs) compiled: the main file's
    serialized FileDescriptorProto and every file it imports, by import name (the references, and
    the well-known types protoc ships, so that no process-wide pool is needed). Raises
    :class:`ProtobufSchemaError` with protoc's message when they do not compile."""
    entries = {m[2] for t in (text, *(r for _, r in references)) for m in _MAP_ENTRY.finditer(t)}
    if entries:  # Apicurio's explicit map entries: protoc refuses the option, set it after
        text = _MAP_ENTRY.sub(r"\1", text)
        references = tuple((n, _MAP_ENTRY.sub(r"\1", r)) for n, r in references)
    include = str(importlib.resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory(prefix="icesink-proto-") as tmp:
        root = Path(tmp)
        for name, ref in references:
            path = PurePosixPath(name)
            if path.is_absolute() or ".." in path.parts or not name.endswith(".proto"):
                raise ProtobufSchemaError(f"Protobuf schema: reference name {name!r} is not a relative .proto path")
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(ref, encoding="utf-8")
        (root / _MAIN).write_text(text, encoding="utf-8")
        out = root / "set.pb"
        try:
            done = subprocess.run(
                [sys.executable, "-m", "grpc_tools.protoc", f"-I{root}", f"-I{include}", "--include_imports",
                 f"--descriptor_set_out={out}", str(root / _MAIN)],
                capture_output=True, timeout=_TIMEOUT_S, env={}, check=False)  # nothing of ours inherited
        except subprocess.TimeoutExpired:
            raise ProtobufSchemaError(f"Protobuf schema does not compile: protoc ran over {_TIMEOUT_S:g} s") from None
        code = done.returncode
        if code != 0 or not out.exists():
            lines = done.stderr.decode(errors="replace").replace(str(root) + os.sep, "").splitlines()
            message = "; ".join(x.replace(_MAIN, "schema") for x in lines
                                if x.strip() and "absl::" not in x and not re.match(r"[IWEF]\d{4} ", x))
            raise ProtobufSchemaError(f"Protobuf schema does not compile: {message or f'protoc exit {code}'}")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    if entries:
        for f in files:
            _mark_entries(f.message_type, entries)
    by_name = {f.name: f.SerializeToString() for f in files}
    return by_name.pop(_MAIN), tuple(by_name.items())


def _mark_entries(messages: Iterable[descriptor_pb2.DescriptorProto], entries: set[str]) -> None:
    """``map_entry`` set on the nested messages named in ``entries`` that look like one (key 1, value 2)."""
    for m in messages:
        for nested in m.nested_type:
            if nested.name in entries and [f.number for f in nested.field] == [1, 2] \
                    and [f.name for f in nested.field] == ["key", "value"]:
                nested.options.map_entry = True
        _mark_entries(m.nested_type, entries)
