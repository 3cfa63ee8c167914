"""The event envelope: golden bytes, a strict decoder that raises only FormatError,
and a writer that checks what it writes."""

from __future__ import annotations

import random
import threading
from typing import Any

import msgpack
import pytest

from log_format import (
    COMMAND_ENQUEUE,
    COMMAND_KIND_NAMES,
    COMMAND_KINDS,
    COMMAND_SWEEP,
    Envelope,
    FormatError,
    decode_envelope,
    encode_envelope,
    encode_envelope_parts,
    validate_event,
)
from log_format.envelope import ENVELOPE_PART_BYTES_MIN

JOB = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
T = 1_700_000_000_000

# One event of each type, in type-id order, as sepp.core.events.to_fields builds them.
ONE_OF_EACH_EVENT: list[list[Any]] = [
    [
        1, 1, JOB, "emails", "send", b"\x00\x01payload", "application/json", 5, 3, T,
        None, None, "key-1", T + 86_400_000,
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "congo=t61rcWkgMzE",
        {"tenant": "acme", "retries": 2, "ratio": 0.5, "vip": True},
    ],
    [2, 1, JOB, 1, T + 30_000, "worker-1"],
    [3, 1, JOB, 1, "worker-1"],
    [4, 1, JOB, 1, T + 1_000, "timeout", None],
    [5, 1, JOB, 2, T + 60_000, None],
    [6, 1, JOB, 2],
    [7, 1, JOB],
    [8, 1, JOB, 3, 1, T, "boom", True],
    [9, 1, JOB],
    [10, 1, JOB],
    [11, 1, "emails", "key-1", T + 86_400_000],
    [12, 1, JOB, T],
]  # fmt: skip

ONE_OF_EACH_ENVELOPE_HEX = (
    "9401cf0000018bcfe56800089cdc00110101d92430313930613162322d633364"
    "342d376535662d386139622d306331643265336634613562a6656d61696c73a4"
    "73656e64c40900017061796c6f6164b06170706c69636174696f6e2f6a736f6e"
    "0503cf0000018bcfe56800c0c0a56b65792d31cf0000018bd50bc400d9373030"
    "2d30616637363531393136636434336464383434386562323131633830333139"
    "632d623761643662373136393230333333312d3031b1636f6e676f3d74363172"
    "63576b674d7a4584a674656e616e74a461636d65a77265747269657302a57261"
    "74696fcb3fe0000000000000a3766970c3960201d92430313930613162322d63"
    "3364342d376535662d386139622d30633164326533663461356201cf0000018b"
    "cfe5dd30a8776f726b65722d31950301d92430313930613162322d633364342d"
    "376535662d386139622d30633164326533663461356201a8776f726b65722d31"
    "970401d92430313930613162322d633364342d376535662d386139622d306331"
    "64326533663461356201cf0000018bcfe56be8a774696d656f7574c0960501d9"
    "2430313930613162322d633364342d376535662d386139622d30633164326533"
    "663461356202cf0000018bcfe65260c0940601d92430313930613162322d6333"
    "64342d376535662d386139622d30633164326533663461356202930701d92430"
    "313930613162322d633364342d376535662d386139622d306331643265336634"
    "613562980801d92430313930613162322d633364342d376535662d386139622d"
    "3063316432653366346135620301cf0000018bcfe56800a4626f6f6dc3930901"
    "d92430313930613162322d633364342d376535662d386139622d306331643265"
    "336634613562930a01d92430313930613162322d633364342d376535662d3861"
    "39622d306331643265336634613562950b01a6656d61696c73a56b65792d31cf"
    "0000018bd50bc400940c01d92430313930613162322d633364342d376535662d"
    "386139622d306331643265336634613562cf0000018bcfe56800"
)


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


# ---------------------------------------------------------------- golden bytes


def test_envelope_with_one_of_each_event_golden_bytes() -> None:
    body = encode_envelope(T, COMMAND_SWEEP, ONE_OF_EACH_EVENT)
    assert body.hex() == ONE_OF_EACH_ENVELOPE_HEX


def test_golden_envelope_decodes_to_the_same_events() -> None:
    envelope = decode_envelope(bytes.fromhex(ONE_OF_EACH_ENVELOPE_HEX))
    assert envelope == Envelope(time_ms=T, command_kind=COMMAND_SWEEP, events=ONE_OF_EACH_EVENT)
    for event in envelope.events:
        validate_event(event)


def test_bytes_stay_bytes_and_strings_stay_strings() -> None:
    events = [[1, 1, "s", b"b", ""], [2, 1, b"", "\u00e9\u4e2d"]]
    decoded = decode_envelope(encode_envelope(0, COMMAND_ENQUEUE, events)).events
    assert decoded == events
    assert [type(v) for v in decoded[0]] == [int, int, str, bytes, str]
    assert [type(v) for v in decoded[1]] == [int, int, bytes, str]


def test_decode_accepts_a_memoryview_of_a_record_body() -> None:
    body = b"junk" + encode_envelope(5, COMMAND_ENQUEUE, [[7, 1, JOB]])
    assert decode_envelope(memoryview(body)[4:]) == Envelope(5, COMMAND_ENQUEUE, [[7, 1, JOB]])


def test_envelope_with_no_events_is_well_formed() -> None:
    assert decode_envelope(encode_envelope(0, COMMAND_SWEEP, [])).events == []


def test_envelope_with_a_synced_seq_is_version_2_golden_bytes() -> None:
    body = encode_envelope(5, COMMAND_ENQUEUE, [[7, 1, "j"]], 41)
    # [2, 5, 1, [[7, 1, "j"]], 41]: version 2 is version 1 plus synced_seq at the end.
    assert body.hex() == "9502050191930701a16a29"
    assert decode_envelope(body) == Envelope(5, COMMAND_ENQUEUE, [[7, 1, "j"]], 41)


def test_envelope_without_a_synced_seq_is_version_1_and_claims_nothing() -> None:
    body = encode_envelope(5, COMMAND_ENQUEUE, [[7, 1, "j"]])
    assert body[:2] == b"\x94\x01"
    assert decode_envelope(body).synced_seq is None


@pytest.mark.parametrize("synced_seq", [-1, True, 1.0, "1"])
def test_encode_refuses_a_bad_synced_seq(synced_seq: Any) -> None:
    with pytest.raises(ValueError, match="synced_seq"):
        encode_envelope(5, COMMAND_ENQUEUE, [], synced_seq)


def test_command_kinds_are_one_to_thirteen() -> None:
    assert sorted(COMMAND_KINDS) == list(range(1, 14))
    assert COMMAND_KIND_NAMES[2] == "enqueue_atomic"
    assert COMMAND_KIND_NAMES[10] == "requeue_dead_letters"
    assert COMMAND_KIND_NAMES[11] == "release"
    assert COMMAND_KIND_NAMES[12] == "admin"
    assert COMMAND_KIND_NAMES[13] == "leader_change"


# ---------------------------------------------------------------- decode errors

VALID = encode_envelope(T, COMMAND_ENQUEUE, [[7, 1, JOB]])

BAD_ENVELOPES = [
    ("empty", b"", "envelope is not valid msgpack"),
    ("never-used byte", b"\xc1", "envelope is not valid msgpack"),
    ("truncated", VALID[:-3], "envelope is not valid msgpack"),
    ("array header only", b"\x94", "envelope is not valid msgpack"),
    ("huge array length", b"\xdd\xff\xff\xff\xff", "envelope is not valid msgpack"),
    ("huge map length", b"\xdf\xff\xff\xff\xff", "envelope is not valid msgpack"),
    ("nesting too deep", b"\x91" * 5000 + b"\xc0", "envelope is not valid msgpack"),
    (
        "bad utf-8",
        pack([1, 0, 1, [[7, 1, "x"]]]).replace(b"\xa1x", b"\xa1\xff"),
        "envelope is not valid msgpack",
    ),
    (
        "unhashable map key",
        b"\x94\x01\x00\x01\x91\x93\x07\x01\x81\x90\xc0",
        "envelope is not valid msgpack",
    ),
    ("bad timestamp", b"\xd7\xff" + b"\xff" * 8, "envelope is not valid msgpack"),
    ("trailing byte", VALID + b"\x00", "trailing bytes after envelope"),
    ("two envelopes", VALID + VALID, "trailing bytes after envelope"),
    (
        "ext type",
        pack([1, 0, 1, [[7, 1, msgpack.ExtType(5, b"x")]]]),
        "msgpack extension type 5 in envelope",
    ),
    ("map", pack({"v": 1}), "envelope is not an array of 4 or 5 elements"),
    ("short array", pack([1, 0, 1]), "envelope is not an array of 4 or 5 elements"),
    ("long array", pack([2, 0, 1, [], 0, 0]), "envelope is not an array of 4 or 5 elements"),
    ("nil", pack(None), "envelope is not an array of 4 or 5 elements"),
    (
        "version 1 with 5",
        pack([1, 0, 1, [], 0]),
        "envelope version 1 is not an array of 4 elements",
    ),
    ("version 2 with 4", pack([2, 0, 1, []]), "envelope version 2 is not an array of 5 elements"),
    ("version 3", pack([3, 0, 1, [], 0]), "unsupported envelope version 3"),
    ("synced_seq negative", pack([2, 0, 1, [], -1]), "bad envelope synced_seq -1"),
    ("synced_seq nil", pack([2, 0, 1, [], None]), "bad envelope synced_seq None"),
    ("synced_seq true", pack([2, 0, 1, [], True]), "bad envelope synced_seq True"),
    ("version true", pack([True, 0, 1, []]), "unsupported envelope version True"),
    ("version str", pack(["1", 0, 1, []]), "unsupported envelope version '1'"),
    ("negative time", pack([1, -1, 1, []]), "bad envelope time_ms -1"),
    ("float time", pack([1, 1.5, 1, []]), "bad envelope time_ms 1.5"),
    ("bool time", pack([1, False, 1, []]), "bad envelope time_ms False"),
    ("command 0", pack([1, 0, 0, []]), "unknown command kind 0"),
    ("command 14", pack([1, 0, 14, []]), "unknown command kind 14"),
    ("command true", pack([1, 0, True, []]), "unknown command kind True"),
    ("command nil", pack([1, 0, None, []]), "unknown command kind None"),
    ("events map", pack([1, 0, 1, {}]), "envelope events is not an array"),
    ("events bin", pack([1, 0, 1, b""]), "envelope events is not an array"),
    ("event int", pack([1, 0, 1, [5]]), "event is not an array of at least 2 elements"),
    ("event short", pack([1, 0, 1, [[1]]]), "event is not an array of at least 2 elements"),
    ("event map", pack([1, 0, 1, [{1: 1, 2: 2}]]), "event is not an array of at least 2 elements"),
]


@pytest.mark.parametrize(
    ("body", "reason"),
    [(body, reason) for _, body, reason in BAD_ENVELOPES],
    ids=[name for name, _, _ in BAD_ENVELOPES],
)
def test_bad_envelope_raises_format_error_with_reason(body: bytes, reason: str) -> None:
    with pytest.raises(FormatError) as excinfo:
        decode_envelope(body)
    assert excinfo.value.reason == reason


def test_long_reasons_are_clipped() -> None:
    with pytest.raises(FormatError) as excinfo:
        decode_envelope(pack([1, 0, "x" * 10_000, []]))
    assert len(excinfo.value.reason) < 80


# ---------------------------------------------------------------- the writer


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-1, 1, []), "time_ms"),
        ((1.0, 1, []), "time_ms"),
        ((True, 1, []), "time_ms"),
        ((0, 0, []), "command kind"),
        ((0, 14, []), "command kind"),
        ((0, True, []), "command kind"),
        ((0, [1], []), "command kind"),
        ((0, 1, ()), "events must be a list"),
        ((0, 1, [[1]]), "an event must be"),
        ((0, 1, [(1, 1)]), "an event must be"),
        ((0, 1, ["ab"]), "an event must be"),
    ],
)
def test_writer_refuses_what_the_reader_would_reject(args: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        encode_envelope(*args)


def test_writer_lets_msgpack_refuse_unencodable_values() -> None:
    with pytest.raises(TypeError):
        encode_envelope(0, 1, [[1, 1, object()]])
    with pytest.raises(OverflowError):
        encode_envelope(0, 1, [[1, 1, 2**64]])


def test_encoding_from_several_threads_gives_identical_bytes() -> None:
    expected = encode_envelope(T, COMMAND_SWEEP, ONE_OF_EACH_EVENT)
    results: list[bytes] = []

    def work() -> None:
        for _ in range(200):
            results.append(encode_envelope(T, COMMAND_SWEEP, ONE_OF_EACH_EVENT))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 800
    assert set(results) == {expected}


# ---------------------------------------------------------------- the writer, in parts

BIG = ENVELOPE_PART_BYTES_MIN


def test_envelope_parts_join_to_exactly_the_envelope(rng: random.Random) -> None:
    for _ in range(200):
        events: list[Any] = []
        for _ in range(rng.randint(0, 20)):
            event: list[Any] = [rng.randint(1, 9), 1]
            for _ in range(rng.randint(0, 6)):
                event.append(
                    rng.choice(
                        [
                            rng.randbytes(rng.choice((0, 5, 300, BIG - 1, BIG, BIG + 70000))),
                            "s" * rng.choice((1, 40, BIG)),
                            rng.randint(-(2**40), 2**64 - 1),
                            None,
                            {"k": [1, b"v"]},
                        ]
                    )
                )
            events.append(event)
        synced_seq = rng.choice((None, 0, 255, 2**40))
        time_ms = rng.choice((0, 0x90, 2**33 + 0x90, T))
        parts = encode_envelope_parts(time_ms, COMMAND_ENQUEUE, events, synced_seq)
        assert b"".join(parts) == encode_envelope(time_ms, COMMAND_ENQUEUE, events, synced_seq)
        large = [f for e in events for f in e if type(f) is bytes and len(f) >= BIG]
        assert len(parts) == (2 * len(large) + 1 if large else 1)


def test_a_large_bytes_field_is_a_part_of_its_own_not_a_copy() -> None:
    payload = bytes(range(256)) * (BIG // 256)
    parts = encode_envelope_parts(T, COMMAND_ENQUEUE, [[1, 1, JOB, payload, "raw"]], 7)
    assert len(parts) == 3 and parts[1] is payload
    assert list(decode_envelope(b"".join(parts)).events) == [[1, 1, JOB, payload, "raw"]]
    # Below the threshold: one part.
    assert len(encode_envelope_parts(T, COMMAND_ENQUEUE, [[1, 1, payload[:-1]]], 7)) == 1


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-1, 1, [[1, 1, b"x" * BIG]]), "time_ms"),
        ((0, 0, [[1, 1, b"x" * BIG]]), "command kind"),
        ((0, 1, [[1], [1, 1, b"x" * BIG]]), "an event must be"),
        ((0, 1, [[1, 1, b"x" * BIG], (1, 1)]), "an event must be"),
        ((0, 1, [[1, 1, b"x" * BIG]], -1), "synced_seq"),
        ((0, 1, ()), "events must be a list"),
    ],
)
def test_the_parts_writer_refuses_what_the_envelope_writer_refuses(args: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        encode_envelope_parts(*args)
    with pytest.raises(TypeError):
        encode_envelope_parts(0, 1, [[1, 1, b"x" * BIG, object()]])
