"""The .proto is the official client's: its descriptor, field by field.

sepp/grpc/proto/sepp/v1/queue.proto was written from the descriptor sepp-py 0.1.0
ships (src/sepp/v1/queue_pb2.py, built by buf). Both serialized descriptors are
read (the official one from its file, without importing it: it would register the
same proto file name in this process) and compared whole, except `json_name`,
which buf records and protoc's Python plugin leaves out (it changes nothing on
the wire). And the checked-in generated code is what the .proto generates.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from sepp.grpc.v1 import queue_pb2
from tests.grpc.conftest import OfficialClient


def serialized_descriptor(path: Path) -> descriptor_pb2.FileDescriptorProto:
    """The FileDescriptorProto a generated *_pb2.py adds to the pool."""
    source = path.read_text()
    start = source.index("AddSerializedFile(") + len("AddSerializedFile(")
    end = source.index(")\n", start)
    return descriptor_pb2.FileDescriptorProto.FromString(ast.literal_eval(source[start:end]))


def without_json_names(
    fd: descriptor_pb2.FileDescriptorProto,
) -> descriptor_pb2.FileDescriptorProto:
    out = descriptor_pb2.FileDescriptorProto()
    out.CopyFrom(fd)

    def strip(message: descriptor_pb2.DescriptorProto) -> None:
        for field in message.field:
            field.ClearField("json_name")
        for nested in message.nested_type:
            strip(nested)

    for message in out.message_type:
        strip(message)
    return out


def ours() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto()
    queue_pb2.DESCRIPTOR.CopyToProto(fd)
    return fd


def test_our_descriptor_equals_the_official_clients_field_for_field(
    official_client: OfficialClient,
):
    official = without_json_names(serialized_descriptor(official_client.queue_pb2))
    mine = without_json_names(ours())
    assert official.name == mine.name == "sepp/v1/queue.proto"
    assert official.package == mine.package == "sepp.v1"
    # Message by message first, so a difference names its message.
    assert [m.name for m in mine.message_type] == [m.name for m in official.message_type]
    for theirs, own in zip(official.message_type, mine.message_type, strict=True):
        assert own == theirs, own.name
    assert list(mine.enum_type) == list(official.enum_type)
    assert list(mine.service) == list(official.service)
    assert mine == official


def test_the_descriptor_has_the_eight_rpcs_and_fourteen_rejection_variants():
    service = queue_pb2.DESCRIPTOR.services_by_name["QueueService"]
    assert [m.name for m in service.methods] == [
        "EnqueueBatch", "EnqueueAtomic", "Reserve", "Ack", "Nack", "Extend",
        "DrainDeadLetters", "GetServerInfo",
    ]  # fmt: skip
    reason = queue_pb2.JobRejection.DESCRIPTOR.oneofs_by_name["reason"]
    assert len(reason.fields) == 14


def test_the_checked_in_generated_code_is_what_the_proto_generates():
    pytest.importorskip("grpc_tools", reason="regenerating needs grpcio-tools (the dev extra)")
    from sepp.grpc import gen

    assert gen.main(["--check"]) == 0
