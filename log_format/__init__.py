"""log_format: the bytes on disk of sepp.

Owns: segment files and their names, record framing, masked CRC32C, the msgpack
event envelope, snapshot-file framing and the event catalogue as data. FORMAT.md,
next to this file, is the specification; this package is its reference
implementation, and golden-byte tests keep the two identical.

Promises: decoders raise only `FormatError`; the record scanner never raises on
damage but classifies it (`Record`*, then `CleanEnd` | `TornTail` | `Corruption`)
and leaves the decision to the caller; encoders check their inputs and raise
ValueError for a caller bug.

Must not import: anything but the standard library, `msgpack` and `crc32c` -- in
particular nothing from `sepp` or `tools`, so the format can be read without the
server.
"""

# First: refuses a stale compiled build, honours SEPP_PURE (see _compiled.py).
from log_format import _compiled  # noqa: F401
from log_format.catalogue import (
    CATALOGUE,
    EVENT_SPECS_BY_TYPE,
    FIELD_TYPES,
    EventSpec,
    FieldSpec,
    validate_event,
)
from log_format.crc import CRC_MASK_DELTA, masked_crc32c, unmask_crc
from log_format.envelope import (
    COMMAND_ACK,
    COMMAND_DEAD_LETTER_JOBS,
    COMMAND_DRAIN_DEAD_LETTERS,
    COMMAND_ENQUEUE,
    COMMAND_ENQUEUE_ATOMIC,
    COMMAND_EXTEND,
    COMMAND_KIND_NAMES,
    COMMAND_KINDS,
    COMMAND_NACK,
    COMMAND_RELEASE,
    COMMAND_REQUEUE_DEAD_LETTERS,
    COMMAND_RESERVE,
    COMMAND_SWEEP,
    ENVELOPE_VERSION,
    Envelope,
    decode_envelope,
    encode_envelope,
)
from log_format.errors import FormatError
from log_format.fastpath import ValidEnvelopes
from log_format.files import (
    FILE_HEADER_BYTES,
    FORMAT_VERSION,
    SEGMENT_FILE_SUFFIX,
    SEGMENT_MAGIC,
    SNAPSHOT_FILE_SUFFIX,
    SNAPSHOT_MAGIC,
    SegmentHeader,
    SnapshotHeader,
    decode_segment_header,
    decode_snapshot_header,
    encode_segment_header,
    encode_snapshot_header,
    parse_segment_file_name,
    parse_snapshot_file_name,
    segment_file_name,
    snapshot_file_name,
)
from log_format.reader import BadHeader, SegmentItem, SnapshotItem, read_segment, read_snapshot
from log_format.records import (
    RECORD_BODY_BYTES_MAX,
    RECORD_HEADER_BYTES,
    RECORD_KIND_COMMAND,
    RECORD_KIND_NAMES,
    RECORD_KIND_SNAPSHOT_BEGIN,
    RECORD_KIND_SNAPSHOT_DEAD_LETTERS,
    RECORD_KIND_SNAPSHOT_DEDUP,
    RECORD_KIND_SNAPSHOT_END,
    RECORD_KIND_SNAPSHOT_JOBS,
    RECORD_KINDS,
    SNAPSHOT_RECORD_KINDS,
    WAL_RECORD_KINDS,
    ZERO_FILLED_TAIL,
    CleanEnd,
    Corruption,
    Record,
    ScanItem,
    TornTail,
    encode_record,
    encode_record_header,
    find_next_valid_record,
    scan_records,
    scan_snapshot_records,
)

__all__ = [
    "CATALOGUE",
    "COMMAND_ACK",
    "COMMAND_DEAD_LETTER_JOBS",
    "COMMAND_DRAIN_DEAD_LETTERS",
    "COMMAND_ENQUEUE",
    "COMMAND_ENQUEUE_ATOMIC",
    "COMMAND_EXTEND",
    "COMMAND_KINDS",
    "COMMAND_KIND_NAMES",
    "COMMAND_NACK",
    "COMMAND_RELEASE",
    "COMMAND_REQUEUE_DEAD_LETTERS",
    "COMMAND_RESERVE",
    "COMMAND_SWEEP",
    "CRC_MASK_DELTA",
    "ENVELOPE_VERSION",
    "EVENT_SPECS_BY_TYPE",
    "FIELD_TYPES",
    "FILE_HEADER_BYTES",
    "FORMAT_VERSION",
    "RECORD_BODY_BYTES_MAX",
    "RECORD_HEADER_BYTES",
    "RECORD_KINDS",
    "RECORD_KIND_COMMAND",
    "RECORD_KIND_NAMES",
    "RECORD_KIND_SNAPSHOT_BEGIN",
    "RECORD_KIND_SNAPSHOT_DEAD_LETTERS",
    "RECORD_KIND_SNAPSHOT_DEDUP",
    "RECORD_KIND_SNAPSHOT_END",
    "RECORD_KIND_SNAPSHOT_JOBS",
    "SEGMENT_FILE_SUFFIX",
    "SEGMENT_MAGIC",
    "SNAPSHOT_FILE_SUFFIX",
    "SNAPSHOT_MAGIC",
    "SNAPSHOT_RECORD_KINDS",
    "WAL_RECORD_KINDS",
    "ZERO_FILLED_TAIL",
    "BadHeader",
    "CleanEnd",
    "Corruption",
    "Envelope",
    "EventSpec",
    "FieldSpec",
    "FormatError",
    "Record",
    "ScanItem",
    "SegmentHeader",
    "SegmentItem",
    "SnapshotHeader",
    "SnapshotItem",
    "TornTail",
    "ValidEnvelopes",
    "decode_envelope",
    "decode_segment_header",
    "decode_snapshot_header",
    "encode_envelope",
    "encode_record",
    "encode_record_header",
    "encode_segment_header",
    "encode_snapshot_header",
    "find_next_valid_record",
    "masked_crc32c",
    "parse_segment_file_name",
    "parse_snapshot_file_name",
    "read_segment",
    "read_snapshot",
    "scan_records",
    "scan_snapshot_records",
    "segment_file_name",
    "snapshot_file_name",
    "unmask_crc",
    "validate_event",
]
