"""Hypothesis against a live server: arbitrary msgpack values as frames, and valid
frames with bytes flipped, cut or spliced. The server's only allowed reactions are
well-formed responses (a typed error, or ok for what happens to be valid) and
closing the connection; it never crashes, and keeps serving afterwards.

Each example runs on its own connection and ends with a half-close, so the server
must either answer or close; the answers are read until end of stream.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sepp.protocol import errors as perr
from sepp.protocol import messages as pm
from sepp.protocol.framing import FRAME_BYTES_CEILING, FrameReader, encode_frame

# Parked reserves and the handshake timer must not outlive an example by much.
FUZZ_ENV = {
    "SEPP_LIMITS__MAX_WAIT_TIMEOUT_MS": "50",
    "SEPP_LIMITS__MAX_MESSAGE_BYTES": "65536",
    "SEPP_LIMITS__MAX_PAYLOAD_BYTES": "32768",
    "SEPP_STORAGE__DEAD_LETTER_RETENTION_MS": "60000",
}
EXAMPLES = 150
FIELDS = [
    "protocol", "api_key", "client", "jobs", "atomic", "queue", "job_type", "payload", "data",
    "encoding", "idempotency_key", "priority", "max_attempts", "scheduled_at_ms",
    "trace_context", "traceparent", "tracestate", "custom", "queues", "lease_ms", "wait_ms",
    "max_jobs", "worker_id", "job_id", "attempt", "retry", "delay_ms", "reason", "max",
]  # fmt: skip
SUFFICIENT = settings(
    max_examples=EXAMPLES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.sampled_from(["fuzz-q", "default", "delay", "dead_letter", "v1", "", "t"]),
    st.integers(min_value=-2, max_value=10),
)
keys = st.one_of(st.sampled_from(FIELDS), st.text(max_size=8))
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(keys, children, max_size=6)
    ),
    max_leaves=25,
)
ops = st.one_of(st.sampled_from(pm.OPS), st.text(max_size=12), scalars)
request_ids = st.one_of(st.integers(min_value=0, max_value=2**64 - 1), scalars)
envelopes = st.tuples(
    request_ids, ops, st.one_of(st.dictionaries(keys, values, max_size=8), values)
)
msgpack_values = st.one_of(values, envelopes.map(list))


def valid_requests(queue: str) -> list[list[Any]]:
    uuid = "00000000-0000-4000-8000-000000000000"
    return [
        [1, "hello", {"protocol": 1, "client": "fuzz"}],
        [2, "health", {}],
        [
            3,
            "enqueue",
            {
                "jobs": [
                    {
                        "queue": queue,
                        "job_type": "t",
                        "payload": {"data": b"payload", "encoding": "bin"},
                        "priority": 3,
                        "custom": {"a": 1, "b": "x"},
                        "idempotency_key": "k",
                    }
                ],
                "atomic": True,
            },
        ],
        [4, "reserve", {"queues": [queue], "lease_ms": 1000, "wait_ms": 10, "max_jobs": 2}],
        [5, "ack", {"job_id": uuid, "attempt": 1}],
        [6, "nack", {"job_id": uuid, "attempt": 1, "retry": "delay", "delay_ms": 5}],
        [7, "extend", {"job_id": uuid, "attempt": 1, "lease_ms": 100}],
        [8, "drain_dead_letters", {"queue": queue, "max": 2}],
        [9, "server_info", {}],
        [10, "queue_stats", {"queues": [queue]}],
    ]


class Mutation:
    """Byte-level edits of a valid stream of frames."""

    @staticmethod
    def apply(data: bytes, edits: list[tuple[str, int, int]]) -> bytes:
        buf = bytearray(data)
        for kind, position, value in edits:
            if not buf:
                break
            i = position % len(buf)
            if kind == "flip":
                buf[i] ^= 1 << (value % 8)
            elif kind == "set":
                buf[i] = value % 256
            elif kind == "delete":
                del buf[i : i + 1 + value % 8]
            elif kind == "insert":
                buf[i:i] = bytes([value % 256]) * (1 + value % 4)
            elif kind == "truncate":
                del buf[i:]
            elif kind == "length":
                # Rewrite a 4-byte window as a length prefix.
                buf[i : i + 4] = struct.pack(">I", value % (2**32))
        return bytes(buf)


edits = st.lists(
    st.tuples(
        st.sampled_from(["flip", "set", "delete", "insert", "truncate", "length"]),
        st.integers(min_value=0, max_value=10_000),
        st.integers(min_value=0, max_value=2**32 - 1),
    ),
    min_size=1,
    max_size=6,
)


def exchange(address: str, data: bytes, *, hello: bool) -> tuple[list[pm.Response], bool]:
    """Send `data` (after a hello, if asked), half-close, and read until the server
    closes. Returns the responses after the hello and whether the stream ended
    with a reset."""
    host, _, port = address.rpartition(":")
    reader = FrameReader(FRAME_BYTES_CEILING)
    responses: list[pm.Response] = []
    reset = False
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        if hello:
            # A round trip of its own: the hello must not share a read with the
            # fuzzed bytes (see test_in_process: frames before a broken one).
            sock.sendall(encode_frame(pm.encode_request(0, "hello", {"protocol": 1})))
            while not responses:
                chunk = sock.recv(65536)
                assert chunk, "closed after hello"
                responses.extend(pm.decode_response(f) for f in reader.feed(chunk))
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while chunk := sock.recv(65536):
                for frame in reader.feed(chunk):
                    responses.append(pm.decode_response(frame))
        except (ConnectionResetError, BrokenPipeError):
            reset = True
    assert reader.buffered == 0 or reset, "the server sent a partial frame and closed"
    if hello:
        assert responses and responses[0].id == 0 and responses[0].status == perr.OK
        responses = responses[1:]
    for response in responses:
        assert response.status in perr.STATUSES
        if response.status != perr.OK:
            assert isinstance(response.body["message"], str)
    return responses, reset


# Longer than any generated text: no fuzzed request can name it.
BYSTANDER_QUEUE = "bystander-queue-that-no-generated-name-can-match"


def plant_bystander_jobs(server) -> list[str]:
    stream = encode_frame(
        pm.encode_request(1, "enqueue", {"jobs": [{"queue": BYSTANDER_QUEUE, "job_type": "t"}] * 3})
    )
    responses, _ = exchange(server.address, stream, hello=True)
    return [r["job_id"] for r in responses[0].body["results"]]


def assert_still_serving(server, queue: str, bystander_ids: list[str]) -> None:
    """The process is alive, a fresh connection runs a job through, and the jobs
    planted before the fuzzing are all still there, untouched."""
    assert server.proc.poll() is None, server.log()
    stream = encode_frame(
        pm.encode_request(
            9, "reserve", {"queues": [BYSTANDER_QUEUE], "lease_ms": 60_000, "max_jobs": 10}
        )
    )
    responses, _ = exchange(server.address, stream, hello=True)
    jobs = responses[0].body["jobs"]
    assert sorted(j["id"] for j in jobs) == sorted(bystander_ids)
    assert all(j["attempt"] == 1 for j in jobs)
    stream = b"".join(
        encode_frame(pm.encode_request(i, op, body))
        for i, op, body in [
            (1, "enqueue", {"jobs": [{"queue": queue + "-check", "job_type": "t"}]}),
            (2, "reserve", {"queues": [queue + "-check"], "lease_ms": 60_000}),
            (3, "health", {}),
        ]
    )
    responses, reset = exchange(server.address, stream, hello=True)
    assert not reset
    by_id = {r.id: r for r in responses}
    job_id = by_id[1].body["results"][0]["job_id"]
    assert [j["id"] for j in by_id[2].body["jobs"]] == [job_id]
    assert by_id[3].body == {"status": "serving"}


def test_arbitrary_msgpack_values_as_frames_get_typed_answers_or_a_close(server_factory):
    server = server_factory(env=FUZZ_ENV)
    bystander_ids = plant_bystander_jobs(server)

    @SUFFICIENT
    @given(frames=st.lists(msgpack_values, min_size=1, max_size=4), hello=st.booleans())
    def run(frames: list[Any], hello: bool) -> None:
        data = b"".join(encode_frame(pm.pack(value)) for value in frames)
        exchange(server.address, data, hello=hello)

    run()
    assert_still_serving(server, "fuzz-values", bystander_ids)
    assert "Traceback" not in server.log()


def test_mutated_valid_frames_get_typed_answers_or_a_close(server_factory):
    server = server_factory(env=FUZZ_ENV)
    bystander_ids = plant_bystander_jobs(server)
    requests = valid_requests("fuzz-q")
    frames = [encode_frame(pm.pack(r)) for r in requests]

    @SUFFICIENT
    @given(
        picked=st.lists(st.integers(min_value=1, max_value=len(frames) - 1), max_size=6),
        edits=edits,
        hello=st.booleans(),
    )
    def run(picked: list[int], edits: list[tuple[str, int, int]], hello: bool) -> None:
        stream = b"".join([frames[0]] * (not hello) + [frames[i] for i in picked])
        exchange(server.address, Mutation.apply(stream, edits), hello=hello)

    run()
    assert_still_serving(server, "fuzz-mutations", bystander_ids)
    assert "Traceback" not in server.log()


def test_unmutated_valid_frames_are_all_answered_ok_or_with_a_typed_error(server_factory):
    """The control for the mutation test: the corpus itself is well-formed."""
    server = server_factory(env=FUZZ_ENV)
    requests = valid_requests("fuzz-control")
    stream = b"".join(encode_frame(pm.pack(r)) for r in requests[1:])
    responses, reset = exchange(server.address, stream, hello=True)
    assert not reset
    statuses = {r.id: r.status for r in responses}
    assert statuses == {
        2: "ok",
        3: "ok",
        4: "ok",
        5: "not_found",
        6: "not_found",
        7: "not_found",
        8: "ok",
        9: "ok",
        10: "ok",
    }
