"""A registered Protobuf schema's ``.proto`` text compiled by protoc (issue 36): what
``GET /schemas/ids/{id}`` serves on every registry (Confluent's stores the text it canonicalises,
AxonOps the text it was given), unlike ``?format=serialized``, which AxonOps answers lossily (an
enum field makes it fail, maps lose ``map_entry``, proto3 ``optional`` its flag;
docs/schema-registry.md). protoc is grpcio-tools' (``python -m grpc_tools.protoc``, no binary
downloaded), run as a child process: the text comes from the registry, and a protoc that crashes
on it ends that child, not the replica (its error is the schema's reject reason). The text and its
references are written to a private temporary directory by their import names, and protoc's own
well-known types (``google/protobuf/*.proto``) are on its path.
"""

from __future__ import annotations

import functools
import importlib.resources
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path, PurePosixPath

from google.protobuf import descriptor_pb2

from agents.formats.protobuf import ProtobufSchemaError

_MAIN = "__registered__.proto"  # the main file's name in the temporary tree (imports name the others)
_TIMEOUT_S = 60.0  # one compile; a schema that takes longer is a reject


@functools.lru_cache(maxsize=256)
def compile_proto(text: str, references: tuple[tuple[str, str], ...] = ()) -> tuple[bytes, tuple[tuple[str, bytes], ...]]:
    """``text`` and its ``references`` ((import name, .proto text) pairs) compiled: the main file's
    serialized FileDescriptorProto and every file it imports, by import name (the references, and
    the well-known types protoc ships, so that no process-wide pool is needed). Raises
    :class:`ProtobufSchemaError` with protoc's message when they do not compile."""
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
    by_name = {f.name: f.SerializeToString() for f in files}
    return by_name.pop(_MAIN), tuple(by_name.items())

