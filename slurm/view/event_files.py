"""The scalars of TensorBoard event files, for `deepdive status`: what slime writes with
`--use-tensorboard` (torch's SummaryWriter, into TENSORBOARD_DIR) and the local backend writes
with tensorboardX, read without TensorBoard.

An event file is a sequence of TFRecords (a little-endian u64 length, its masked CRC32C, the
bytes, their masked CRC32C), each an `Event` protobuf. The records are decoded by protobuf
itself, against the few fields of TensorBoard's event.proto and summary.proto we read, declared
here by number; every other field is skipped as protobuf skips unknown ones. Why not a reader
from a package (measured on this machine, see the report that came with this module):
TensorBoard's own EventFileLoader pulls in ~50 MB (grpcio, its Rust data server, werkzeug),
tensorboardX has no reader and importing its protos imports torch (1.5 s per status), and
`tfrecord` reads only the framing and raises on the partial record a live writer leaves at
the end. The CRCs are not checked (the standard library has no CRC32C): a writer only ever
appends, so the one damage a reader meets is a record cut short at the end, which ends the
file here.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

HEADER = struct.Struct("<QI")  # length, masked CRC32C of the length
FOOTER = 4  # masked CRC32C of the data
PATTERN = "events.out.tfevents.*"


def _event_class() -> Any:
    """`Event` with the fields read here (tensorboard/compat/proto/event.proto, summary.proto,
    tensor.proto: the numbers are TensorBoard's)."""
    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="deepdive_tensorboard_event.proto", package="deepdive.tb", syntax="proto2"
    )

    def message(name: str, *fields: tuple[str, int, int, str | None, bool]) -> None:
        described = proto.message_type.add(name=name)
        for field_name, number, kind, type_name, repeated in fields:
            field = described.field.add(name=field_name, number=number, type=kind)
            field.label = F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL
            if type_name:
                field.type_name = f".deepdive.tb.{type_name}"

    message("Tensor", ("float_val", 5, F.TYPE_FLOAT, None, True))
    message(
        "Value",
        ("tag", 1, F.TYPE_STRING, None, False),
        ("simple_value", 2, F.TYPE_FLOAT, None, False),
        ("tensor", 8, F.TYPE_MESSAGE, "Tensor", False),
    )
    message("Summary", ("value", 1, F.TYPE_MESSAGE, "Value", True))
    message(
        "Event",
        ("wall_time", 1, F.TYPE_DOUBLE, None, False),
        ("step", 2, F.TYPE_INT64, None, False),
        ("summary", 5, F.TYPE_MESSAGE, "Summary", False),
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("deepdive.tb.Event"))


_EVENT = _event_class()


@dataclass(frozen=True)
class Scalar:
    tag: str
    step: int
    value: float
    wall_time: float


def records(path: Path) -> Iterator[bytes]:
    """Every whole record of one event file (a record still being written ends it)."""
    with path.open("rb") as handle:
        while True:
            header = handle.read(HEADER.size)
            if len(header) < HEADER.size:
                return
            length, _ = HEADER.unpack(header)
            data = handle.read(length)
            if len(data) < length or len(handle.read(FOOTER)) < FOOTER:
                return
            yield data


def scalars(path: Path) -> Iterator[Scalar]:
    """The scalars of one event file, in the order written."""
    for data in records(path):
        event = _EVENT()
        try:
            event.ParseFromString(data)
        except DecodeError:
            continue  # not an Event: skipped as TensorBoard skips it
        for value in event.summary.value:
            if value.HasField("simple_value"):
                number = value.simple_value
            elif value.HasField("tensor") and len(value.tensor.float_val) == 1:
                number = value.tensor.float_val[0]
            else:
                continue
            yield Scalar(value.tag, int(event.step), float(number), float(event.wall_time))


def latest(folder: Path, tags: tuple[str, ...]) -> Scalar | None:
    """The scalar written last (by wall time) under the first of `tags` that any event file
    under `folder` has: several processes each write their own file, and a resumed run writes
    its steps again after a requeue, so the newest write is the run's current step."""
    found: dict[str, Scalar] = {}
    for path in sorted(folder.rglob(PATTERN)) if folder.is_dir() else []:
        for scalar in scalars(path):
            if scalar.tag in tags:
                known = found.get(scalar.tag)
                if known is None or scalar.wall_time >= known.wall_time:
                    found[scalar.tag] = scalar
    return next((found[tag] for tag in tags if tag in found), None)


def at_step(folder: Path, step: int, prefixes: tuple[str, ...]) -> dict[str, float]:
    """Every scalar logged at `step` under a tag starting with one of `prefixes` (the newest
    write of each tag: a requeued attempt logs its steps again), the prefix taken off."""
    found: dict[str, Scalar] = {}
    for path in sorted(folder.rglob(PATTERN)) if folder.is_dir() else []:
        for scalar in scalars(path):
            if scalar.step != step or not scalar.tag.startswith(prefixes):
                continue
            known = found.get(scalar.tag)
            if known is None or scalar.wall_time >= known.wall_time:
                found[scalar.tag] = scalar
    shown: dict[str, float] = {}
    for tag, scalar in sorted(found.items()):
        prefix = next(p for p in prefixes if tag.startswith(p))
        shown[tag.removeprefix(prefix)] = scalar.value
    return shown
