"""Protobuf schemas as the registry holds them: compile, find messages, and Confluent's wire envelope.

A registered Protobuf schema is either `.proto` text or a base64-encoded serialized FileDescriptorProto
(Confluent accepts both). `compile_schema` turns either, with its references, into a FileDescriptorSet
using grpcio-tools' bundled protoc, so every consumer (registry, produce-time enforcement, the Spark
archive) sees the same descriptors. The main file is always the LAST file of the returned set (protoc
orders a set with --include_imports topologically); its name is `MAIN_FILE`.

Confluent's wire format of a record key or value: magic byte 0, the schema id as a 4-byte big-endian
integer, the message indexes (a zigzag-varint count followed by zigzag-varint indexes, where the
single byte 0 means [0], the first top-level message), then the Protobuf message bytes.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import struct
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path, PurePosixPath

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError

from icelog.errors import IcelogError
from icelog.records.varint import VARINT_BYTES, VarintError, read_varint, write_varint

MAGIC_BYTE = 0
MAIN_FILE = "schema.proto"
_PROTOC_TIMEOUT_S = 60
_ABSL_LOG_LINE = re.compile(r"^[IWE]\d{4} ")
_MAX_INDEXES = 1000  # a deeper nesting than this is garbage, not a schema


class InvalidSchemaError(IcelogError):
    """A schema (or one of its references) does not compile; the message is protoc's."""


@lru_cache(maxsize=1)
def well_known_include_dir() -> str:
    """grpcio-tools' bundled include dir with google/protobuf/*.proto (the well-known types)."""
    import grpc_tools

    return os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")


def decode_serialized(schema: str) -> descriptor_pb2.FileDescriptorProto | None:
    """The FileDescriptorProto of a base64-encoded schema, or None when `schema` is not base64 of one."""
    text = schema.strip()
    if not text:
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None  # .proto text always holds spaces, quotes or ';', which base64 cannot
    fdp = descriptor_pb2.FileDescriptorProto()
    try:
        fdp.ParseFromString(raw)
    except DecodeError:
        return None
    return fdp


def _safe_relative(name: str) -> PurePosixPath:
    # A name must be a plain relative file path as written: not '.', '..', '/x', 'a//b' or './a', whose
    # files would land outside (or be) the temp dir and make the error name the server's path.
    path = PurePosixPath(name)
    if (not name or path.is_absolute() or str(path) != name or any(p in (".", "..") for p in name.split("/"))
            or "\\" in name or "\0" in name):
        raise InvalidSchemaError(f"invalid import name {name[:100]!r}")
    return path


def compile_schema(schema: str, references: Mapping[str, str]) -> descriptor_pb2.FileDescriptorSet:
    """Compile a schema (.proto text or base64 FileDescriptorProto) into a FileDescriptorSet.

    `references` maps every import name the schema needs, transitively, to that file's schema text
    (either form); well-known types (google/protobuf/*.proto) need no reference. The returned set holds
    the main file (last; named MAIN_FILE unless a reference has that name) and every file it imports.
    Raises InvalidSchemaError.
    """
    main_name = MAIN_FILE if MAIN_FILE not in references else "__icelog_main__.proto"
    with tempfile.TemporaryDirectory(prefix="icelog-protoc-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        serialized = descriptor_pb2.FileDescriptorSet()
        for name, text in [*references.items(), (main_name, schema)]:
            relative = _safe_relative(name)
            fdp = decode_serialized(text)
            if fdp is not None:
                # protoc reads serialized files through --descriptor_set_in, text files from -I.
                fdp.name = name
                serialized.file.append(fdp)
            else:
                target = src / relative
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(text, encoding="utf-8")
                except (OSError, UnicodeEncodeError):  # their messages name the temp dir
                    raise InvalidSchemaError(f"cannot use {name[:100]!r} as an import name") from None
        out = Path(tmp) / "out.pb"
        args = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"--proto_path={src}",
            f"--proto_path={well_known_include_dir()}",
            "--include_imports",
            f"--descriptor_set_out={out}",
        ]
        if serialized.file:
            set_in = Path(tmp) / "in.pb"
            set_in.write_bytes(serialized.SerializeToString())
            args.append(f"--descriptor_set_in={set_in}")
        args.append(main_name)
        try:
            result = subprocess.run(args, capture_output=True, text=True, timeout=_PROTOC_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as exc:
            raise InvalidSchemaError("protoc timed out compiling the schema") from exc
        if result.returncode != 0 or not out.exists():
            # File names relative to the sources; anything else under the temp dir (in.pb, out.pb) unnamed.
            message = _protoc_errors(result.stderr or result.stdout).replace(str(src) + os.sep, "").replace(tmp, "")
            raise InvalidSchemaError(message or f"protoc failed with exit code {result.returncode}")
        fds = descriptor_pb2.FileDescriptorSet()
        fds.ParseFromString(out.read_bytes())
    return fds


def _protoc_errors(output: str) -> str:
    # protoc (via absl) prefixes its errors with logging noise such as "WARNING: All log messages before
    # absl::InitializeLog()" and "W0000 ... parser.cc] ..." lines; keep the errors.
    lines = [
        line for line in output.strip().splitlines()
        if not line.startswith("WARNING: All log messages") and not _ABSL_LOG_LINE.match(line)
    ]
    return "\n".join(lines).strip()


def main_file_of(
    fds: descriptor_pb2.FileDescriptorSet, main_file: str | None = None
) -> descriptor_pb2.FileDescriptorProto:
    """The main FileDescriptorProto of a compiled set: `main_file` by name, else the last file."""
    if not fds.file:
        raise InvalidSchemaError("empty descriptor set")
    if main_file is None:
        return fds.file[-1]
    for fdp in fds.file:
        if fdp.name == main_file:
            return fdp
    raise InvalidSchemaError(f"file {main_file!r} is not in the descriptor set")


def build_pool(fds: descriptor_pb2.FileDescriptorSet) -> descriptor_pool.DescriptorPool:
    """A fresh DescriptorPool holding every file of the set (files in dependency order)."""
    pool = descriptor_pool.DescriptorPool()
    for fdp in fds.file:
        try:
            pool.AddSerializedFile(fdp.SerializeToString())
        except Exception as exc:  # the C and upb pools raise TypeError/ValueError variants
            raise InvalidSchemaError(f"{fdp.name}: {exc}") from exc
    return pool


def message_name_at(fdp: descriptor_pb2.FileDescriptorProto, message_indexes: Sequence[int]) -> str:
    """The fully-qualified name of the message that Confluent message indexes point at in a file."""
    if not message_indexes:
        message_indexes = [0]
    messages = fdp.message_type
    parts = [fdp.package] if fdp.package else []
    for index in message_indexes:
        if index < 0 or index >= len(messages):
            raise InvalidSchemaError(f"message index {list(message_indexes)} is out of range in {fdp.name}")
        parts.append(messages[index].name)
        messages = messages[index].nested_type
    return ".".join(parts)


def message_indexes_of(fdp: descriptor_pb2.FileDescriptorProto, full_name: str) -> list[int]:
    """Confluent message indexes of a message (by fully-qualified name) in a file."""
    name = full_name.lstrip(".")
    prefix = f"{fdp.package}." if fdp.package else ""
    if not name.startswith(prefix):
        raise InvalidSchemaError(f"message {full_name!r} is not in {fdp.name}")
    path = name[len(prefix) :].split(".")
    indexes: list[int] = []
    messages = fdp.message_type
    for part in path:
        for i, message in enumerate(messages):
            if message.name == part:
                indexes.append(i)
                messages = message.nested_type
                break
        else:
            raise InvalidSchemaError(f"message {full_name!r} is not in {fdp.name}")
    return indexes


def message_descriptor(
    fds: descriptor_pb2.FileDescriptorSet,
    main_file: str | None,
    message_name: str | None = None,
    message_indexes: Sequence[int] | None = None,
) -> Descriptor:
    """The message descriptor by full name, else by Confluent message indexes, else the main file's first."""
    pool = build_pool(fds)
    main = main_file_of(fds, main_file)
    if message_name:
        name = message_name.lstrip(".")
    else:
        name = message_name_at(main, list(message_indexes) if message_indexes else [0])
    try:
        return pool.FindMessageTypeByName(name)
    except KeyError as exc:
        raise InvalidSchemaError(f"message {name!r} is not in the schema") from exc


def serialized_main(fds: descriptor_pb2.FileDescriptorSet) -> str:
    """The main file as base64 serialized FileDescriptorProto (the registry's `format=serialized`)."""
    return base64.b64encode(main_file_of(fds).SerializeToString(deterministic=True)).decode("ascii")


def _read_varint(payload: bytes, pos: int) -> tuple[int, int] | None:
    try:  # Confluent writes the indexes as Kafka's int32 zigzag varints (ByteUtils.writeVarint)
        return read_varint(payload, pos, max_bytes=VARINT_BYTES)
    except VarintError:
        return None


def parse_envelope(payload: bytes) -> tuple[int, list[int], int] | None:
    """Split Confluent's envelope: (schema_id, message_indexes, body_offset), or None when absent.

    A Protobuf message never starts with byte 0 (field number 0 is invalid), so magic byte 0 plus a
    well-formed index list is taken as an envelope.
    """
    if len(payload) < 6 or payload[0] != MAGIC_BYTE:
        return None
    schema_id = struct.unpack_from(">I", payload, 1)[0]
    if payload[5] == 0:  # the common case: the first message, written as the single byte 0
        return schema_id, [0], 6
    read = _read_varint(payload, 5)
    if read is None:
        return None
    count, pos = read
    if count == 0:
        return schema_id, [0], pos
    if count < 0 or count > _MAX_INDEXES:
        return None
    indexes: list[int] = []
    for _ in range(count):
        read = _read_varint(payload, pos)
        if read is None:
            return None
        index, pos = read
        indexes.append(index)
    return schema_id, indexes, pos


def encode_envelope(schema_id: int, message_indexes: Sequence[int]) -> bytes:
    """Confluent's envelope for a schema id and message indexes ([0] is written as the single byte 0)."""
    out = bytearray(struct.pack(">bI", MAGIC_BYTE, schema_id))
    indexes = list(message_indexes) or [0]
    if indexes == [0]:
        out.append(0)
        return bytes(out)
    write_varint(len(indexes), out)
    for index in indexes:
        write_varint(index, out)
    return bytes(out)
