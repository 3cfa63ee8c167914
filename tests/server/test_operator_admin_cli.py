"""The admin commands of `sepp` (issue 15 items 2 and 3: jobs, dead-letters, queues,
the drain that never loses a record, TLS options) against a real server.

Most run `sepp.server.cli.main` in-process (stdout captured); the drain's pipe
cases run `sepp` as a child process writing into a real pipe."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sepp import EnqueueRequest
from sepp.client import Payload, TraceContext
from sepp.client.sync import SyncSeppClient
from sepp.server.cli import main
from tests.server.test_tls import certificate  # noqa: F401 - a fixture
from tools.audit import admin_actions
from tools.datadir import open_data_dir

RETENTION = {"SEPP_STORAGE__DEAD_LETTER_RETENTION_MS": "3600000"}
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def server(server_factory: Callable[..., Any]) -> Any:
    return server_factory(env=RETENTION)


@pytest.fixture
def client(server: Any) -> Iterator[SyncSeppClient]:
    c = SyncSeppClient.connect(server.address)
    yield c
    c.close()


def sepp(capsys: pytest.CaptureFixture[str], server: Any, *argv: str) -> tuple[int, str, str]:
    """`sepp ARGV --addr SERVER` in-process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main([*argv, "--addr", server.address])
    out, err = capsys.readouterr()
    return code, out, err


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def enqueue(client: SyncSeppClient, queue: str, n: int, **extra: Any) -> list[str]:
    ids: list[str] = []
    for start in range(0, n, 200):
        batch = [EnqueueRequest(queue, "t", **extra) for _ in range(min(200, n - start))]
        ids += [ack.job_id for ack in client.enqueue_batch(batch)]  # type: ignore[union-attr]
    return ids


def dead_letters(client: SyncSeppClient, queue: str, n: int, **extra: Any) -> list[str]:
    """`n` dead letters of `queue` (dead-lettered by an operator: cause admin)."""
    ids = enqueue(client, queue, n, **extra)
    assert client.dead_letter_jobs(ids).done == ids
    return ids


def dead_count(client: SyncSeppClient, queue: str) -> int:
    return client.queue_info(queue).dead_letter


# -- jobs ----------------------------------------------------------------------------------


def test_jobs_get_shows_a_job_with_its_payload_and_an_unknown_id_exits_1(
    capsys: pytest.CaptureFixture[str], server: Any, client: SyncSeppClient
) -> None:
    (job_id,) = enqueue(
        client,
        "q",
        1,
        payload=Payload(b"\x00\xffbin", "application/octet-stream"),
        custom={"tenant": "a", "n": 3},
        trace_context=TraceContext(TRACEPARENT),
        priority=7,
    )
    code, out, _ = sepp(capsys, server, "jobs", "get", job_id, "--json")
    assert code == 0
    doc = json.loads(out)
    assert (doc["id"], doc["queue"], doc["state"], doc["priority"]) == (job_id, "q", "ready", 7)
    assert base64.b64decode(doc["payload"]["data_base64"]) == b"\x00\xffbin"
    assert doc["custom"] == {"tenant": "a", "n": 3}
    assert doc["trace_context"]["traceparent"] == TRACEPARENT
    code, out, _ = sepp(capsys, server, "jobs", "get", job_id)
    assert code == 0 and "state              ready" in out
    code, out, err = sepp(capsys, server, "jobs", "get", "no-such-job")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and "no job no-such-job" in err


def test_jobs_list_gives_a_page_and_its_cursor_and_all_walks_every_page(
    capsys: pytest.CaptureFixture[str], server: Any, client: SyncSeppClient
) -> None:
    ids = enqueue(client, "q", 5)
    code, out, err = sepp(capsys, server, "jobs", "list", "q", "--state", "ready", "--limit", "2",
                          "--json")  # fmt: skip
    assert code == 0
    assert [j["id"] for j in lines(out)] == ids[:2]
    cursor = err.split("--cursor ")[1].strip()
    code, out, _ = sepp(capsys, server, "jobs", "list", "q", "--state", "ready", "--limit", "2",
                        "--cursor", cursor, "--json")  # fmt: skip
    assert [j["id"] for j in lines(out)] == ids[2:4]
    code, out, err = sepp(capsys, server, "jobs", "list", "q", "--state", "ready", "--limit", "2",
                          "--all", "--json")  # fmt: skip
    assert code == 0 and err == ""
    assert [j["id"] for j in lines(out)] == ids
    code, out, _ = sepp(capsys, server, "jobs", "list", "q", "--state", "scheduled")
    assert code == 0 and "(0 job(s))" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["jobs", "list", "q"],
        ["jobs", "list", "q", "--state", "ready", "--limit", "0"],
        ["jobs", "list", "q", "--state", "ready", "--limit", "1001"],
        ["jobs", "list", "q", "--state", "gone"],
        ["jobs", "list", "q", "--state", "ready", "--cause", "admin"],
        ["dead-letters", "list", "--cursor", "c"],
        ["dead-letters", "requeue", "q"],
        ["dead-letters", "requeue", "q", "some-id", "--all"],
        ["queues", "update", "q", "--max-attempts", "three"],
    ],
    ids=[
        "no state",
        "limit 0",
        "limit over 1000",
        "unknown state",
        "cause of live jobs",
        "cursor without queue",
        "requeue of nothing",
        "ids and a filter",
        "not a number",
    ],
)
def test_an_argument_the_command_cannot_use_exits_2_without_connecting(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    # Port 1: nothing listens, so a connection attempt would be exit 1.
    try:
        code = main([*argv, "--addr", "127.0.0.1:1"])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code  # type: ignore[assignment]
    assert code == 2
    assert "cannot reach" not in capsys.readouterr().err


def test_jobs_cancel_needs_yes_and_touches_only_ids_of_the_named_queue(
    capsys: pytest.CaptureFixture[str], server: Any, client: SyncSeppClient
) -> None:
    (ours,) = enqueue(client, "q", 1)
    (theirs,) = enqueue(client, "other", 1)
    code, _, err = sepp(capsys, server, "jobs", "cancel", "q", ours)
    assert code == 2 and "--yes" in err
    assert client.get_job(ours) is not None
    code, out, err = sepp(capsys, server, "jobs", "cancel", "q", ours, theirs, "--yes", "--json")
    assert code == 1 and err.count("\n") == 1
    assert json.loads(out)["outcomes"] == [
        {"id": ours, "outcome": "done"},
        {"id": theirs, "outcome": "not_found"},
    ]
    assert client.get_job(ours) is None
    assert client.get_job(theirs) is not None


# -- dead letters --------------------------------------------------------------------------


def test_dead_letters_list_and_show_consume_nothing_and_filter_by_cause(
    capsys: pytest.CaptureFixture[str], server: Any, client: SyncSeppClient
) -> None:
    a = dead_letters(client, "a", 2)
    b = dead_letters(client, "b", 1)
    code, out, _ = sepp(capsys, server, "dead-letters", "list", "--json")
    assert code == 0
    assert sorted(j["id"] for j in lines(out)) == sorted(a + b)
    assert {j["dead_letter_cause"] for j in lines(out)} == {"admin"}
    code, out, _ = sepp(capsys, server, "dead-letters", "list", "--queue", "a", "--cause",
                        "lease_expired", "--json")  # fmt: skip
    assert (code, out) == (0, "")
    code, out, err = sepp(capsys, server, "dead-letters", "list", "--limit", "1", "--json")
    assert code == 0 and len(lines(out)) == 1 and "more jobs" in err
    code, out, _ = sepp(capsys, server, "dead-letters", "show", b[0], "--json")
    assert code == 0 and json.loads(out)["state"] == "dead_letter"
    assert dead_count(client, "a") == 2 and dead_count(client, "b") == 1
    (live,) = enqueue(client, "a", 1)
    assert sepp(capsys, server, "dead-letters", "show", live)[0] == 1


def test_dead_letters_requeue_by_ids_and_by_filter(
    capsys: pytest.CaptureFixture[str], server: Any, client: SyncSeppClient
) -> None:
    ids = dead_letters(client, "q", 4)
    code, out, _ = sepp(capsys, server, "dead-letters", "requeue", "q", ids[0], "--reason", "fixed",
                        "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["done"] == 1
    info = client.get_job(ids[0])
    assert info is not None and (info.state, info.attempt) == ("ready", 1)
    code, out, _ = sepp(capsys, server, "dead-letters", "requeue", "q", "--all", "--json")
    assert code == 0 and json.loads(out)["requeued"] == 3
    assert client.queue_info("q").ready == 4
    actions = admin_actions(open_data_dir(str(server.data_dir))).entries
    requeue = [e for e in actions if e.reason == "fixed"]
    assert [(e.job_ids, e.actor) for e in requeue] == [((ids[0],), "local")]


def test_dead_letters_delete_needs_yes_then_deletes_by_cause(
    capsys: pytest.CaptureFixture[str], server: Any, client: SyncSeppClient
) -> None:
    dead_letters(client, "q", 3)
    assert sepp(capsys, server, "dead-letters", "delete", "q", "--all")[0] == 2
    assert dead_count(client, "q") == 3
    code, out, _ = sepp(capsys, server, "dead-letters", "delete", "q", "--cause", "admin", "--yes")
    assert code == 0 and "deleted 3" in out
    assert client.list_queues() == []  # emptied, so forgotten


# -- the drain -----------------------------------------------------------------------------


def test_drain_writes_every_field_to_a_file_then_deletes_and_the_lines_enqueue_again(
    capsys: pytest.CaptureFixture[str], server: Any, client: SyncSeppClient, tmp_path: Path
) -> None:
    ids = dead_letters(
        client,
        "q",
        3,
        payload=Payload(b'{"x": 1}', "application/json"),
        custom={"k": "v"},
        trace_context=TraceContext(TRACEPARENT, "a=b"),
        idempotency_key=None,
        priority=4,
        max_attempts=5,
    )
    out_file = tmp_path / "dead.jsonl"
    code, out, _ = sepp(capsys, server, "dead-letters", "drain", "--max", "2", "--out",
                        str(out_file), "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["written"] == 2
    records = lines(out_file.read_text())
    assert [r["id"] for r in records] == ids[:2]
    assert dead_count(client, "q") == 1
    record = records[0]
    assert (record["queue"], record["job_type"], record["priority"], record["max_attempts"]) == (
        "q", "t", 4, 5,
    )  # fmt: skip
    assert record["payload"] == {"encoding": "application/json",
                                 "data_base64": base64.b64encode(b'{"x": 1}').decode()}  # fmt: skip
    assert record["trace_context"] == {"traceparent": TRACEPARENT, "tracestate": "a=b"}
    assert (record["dead_letter_cause"], record["final_attempt"]) == ("admin", 1)
    code, out, _ = sepp(capsys, server, "enqueue", "--from-jsonl", str(out_file), "--json")
    assert code == 0
    replayed = [client.get_job(r["job_id"]) for r in lines(out)]
    assert all(j is not None and j.state == "ready" for j in replayed)
    again = replayed[0]
    assert again is not None and again.job_id not in ids
    assert again.payload == Payload(b'{"x": 1}', "application/json")
    assert (again.custom, again.priority, again.max_attempts) == ({"k": "v"}, 4, 5)
    assert again.trace_context == TraceContext(TRACEPARENT, "a=b")


def test_drain_with_max_below_1_is_refused_and_deletes_nothing(
    capsys: pytest.CaptureFixture[str], server: Any, client: SyncSeppClient
) -> None:
    dead_letters(client, "q", 2)
    for bad in ("0", "-1"):
        with pytest.raises(SystemExit) as exited:
            main(["dead-letters", "drain", "--max", bad, "--addr", server.address])
        assert exited.value.code == 2
    assert dead_count(client, "q") == 2


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_drain_to_a_full_disk_deletes_nothing_and_exits_1(
    capsys: pytest.CaptureFixture[str], server: Any, client: SyncSeppClient
) -> None:
    dead_letters(client, "q", 3)
    code, out, err = sepp(capsys, server, "dead-letters", "drain", "--out", "/dev/full")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "No space left on device" in err
    assert dead_count(client, "q") == 3


def sepp_process(*argv: str, stdout: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "sepp.server.cli", *argv], stdout=stdout, stderr=subprocess.PIPE
    )


def test_drain_into_a_pipe_whose_reader_leaves_after_one_line_deletes_only_that_line(
    server: Any, client: SyncSeppClient
) -> None:
    ids = dead_letters(client, "q", 300)
    proc = sepp_process("dead-letters", "drain", "--addr", server.address, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    got = b""
    while not got.endswith(b"\n"):
        chunk = os.read(proc.stdout.fileno(), 65536)
        assert chunk, "the drain wrote nothing"
        got += chunk
    proc.stdout.close()  # the reader goes away after one line
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert err.count(b"\n") == 1 and b"reader went away" in err
    (record,) = [json.loads(line) for line in got.splitlines()]
    assert record["id"] == ids[0]
    # Exactly the record read is gone; every other one is still there.
    assert dead_count(client, "q") == 299
    assert client.get_job(ids[0]) is None


@pytest.mark.skipif(shutil.which("head") is None, reason="needs head")
def test_drain_piped_into_head_1_deletes_only_the_line_head_printed(
    server: Any, client: SyncSeppClient
) -> None:
    dead_letters(client, "q", 300)
    command = (
        f"{sys.executable} -m sepp.server.cli dead-letters drain --addr {server.address} | head -1"
    )
    result = subprocess.run(["sh", "-c", command], capture_output=True, timeout=60)
    (printed,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert dead_count(client, "q") == 299
    assert client.get_job(printed["id"]) is None


def test_drain_into_a_pipe_read_to_the_end_deletes_everything_written(
    server: Any, client: SyncSeppClient
) -> None:
    ids = dead_letters(client, "a", 150) + dead_letters(client, "b", 2)
    proc = sepp_process("dead-letters", "drain", "--addr", server.address, stdout=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert sorted(json.loads(line)["id"] for line in out.splitlines()) == sorted(ids)
    assert b"drained 152 dead letter(s)" in err
    assert client.list_queues() == []


# -- queues --------------------------------------------------------------------------------


def test_queues_pause_resume_create_update_purge_and_delete(
    capsys: pytest.CaptureFixture[str], server: Any, client: SyncSeppClient
) -> None:
    code, out, _ = sepp(capsys, server, "queues", "create", "q", "--max-attempts", "7",
                        "--retry-backoff", "exponential", "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["created"] is True
    assert sepp(capsys, server, "queues", "create", "q")[0] == 1  # exists: use update
    code, out, _ = sepp(capsys, server, "queues", "update", "q", "--retry-delay-ms", "50",
                        "--unset", "retry_backoff", "--json")  # fmt: skip
    assert code == 0
    assert client.queue_info("q").overrides == {"default_max_attempts": 7, "retry_delay_ms": 50}
    code, out, _ = sepp(capsys, server, "queues", "pause", "q", "--reason", "deploy", "--json")
    assert code == 0 and json.loads(out) == {"queue": "q", "paused": True, "changed": True}
    enqueue(client, "q", 3)
    code, out, _ = sepp(capsys, server, "queues", "list", "--json")
    (q,) = lines(out)
    assert (q["name"], q["paused"], q["ready"]) == ("q", True, 3)
    assert q["settings"]["default_max_attempts"] == 7
    code, out, _ = sepp(capsys, server, "queues", "resume", "q")
    assert code == 0 and "delivering" in out
    assert sepp(capsys, server, "queues", "purge", "q")[0] == 2
    code, out, _ = sepp(capsys, server, "queues", "purge", "q", "--yes", "--json")
    assert code == 0 and json.loads(out)["purged"] == 3
    assert sepp(capsys, server, "queues", "delete", "q")[0] == 2
    code, out, _ = sepp(capsys, server, "queues", "delete", "q", "--yes")
    assert code == 0 and "deleted" in out
    code, _, err = sepp(capsys, server, "queues", "update", "q", "--max-attempts", "2")
    assert code == 1 and err.count("\n") == 1
    actions = [
        (e.action, e.reason) for e in admin_actions(open_data_dir(str(server.data_dir))).entries
    ]
    assert ("queue.pause", "deploy") in actions


# -- TLS -----------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_tls_ca_verifies_a_tls_server_and_nothing_skips_verification(
    capsys: pytest.CaptureFixture[str],
    server_factory: Callable[..., Any],
    certificate: tuple[Path, Path],  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    cert, key = certificate
    tls_server = server_factory(
        env={"SEPP_SERVER__TLS_CERT_PATH": str(cert), "SEPP_SERVER__TLS_KEY_PATH": str(key)}
    )
    code, out, err = sepp(capsys, tls_server, "queues", "list", "--tls-ca", str(cert), "--json")
    assert (code, out) == (0, ""), err
    code, _, err = sepp(capsys, tls_server, "jobs", "get", "x", "--tls-ca", str(cert))
    assert code == 1 and "no job x" in err  # it got an answer
    # Plain TCP to a TLS server, and TLS with the system CAs: refused, exit 1.
    assert sepp(capsys, tls_server, "queues", "list")[0] == 1
    capsys.readouterr()
    assert main(["queues", "list", "--addr", f"tls://{tls_server.address}"]) == 1
    assert "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err
    missing = tmp_path / "missing.pem"
    code, _, err = sepp(capsys, tls_server, "queues", "list", "--tls-ca", str(missing))
    assert code == 1 and f"--tls-ca {missing}" in err
    with pytest.raises(SystemExit) as exited:
        main(["queues", "list", "--tls-insecure", "--addr", tls_server.address])
    assert exited.value.code == 2


def test_a_change_made_with_an_api_key_is_audited_as_that_keys_actor_with_its_reason(
    capsys: pytest.CaptureFixture[str], server_factory: Callable[..., Any], tmp_path: Path
) -> None:
    # The native front names an API-key connection `api-key:<8 hex digits of the
    # key's SHA-256>` (PROTOCOL.md 5.14), never the key.
    keyed = server_factory(env={"SEPP_AUTH__API_KEYS": '[{name = "ops", key = "s3cret"}]'})
    key_file = tmp_path / "key"
    key_file.write_text("s3cret\n")
    code, _, err = sepp(capsys, keyed, "queues", "pause", "q", "--reason", "incident 7",
                        "--api-key-file", str(key_file))  # fmt: skip
    assert code == 0, err
    (entry,) = admin_actions(open_data_dir(str(keyed.data_dir))).entries
    digest = hashlib.sha256(b"s3cret").hexdigest()[:8]
    assert (entry.action, entry.actor, entry.reason) == ("queue.pause", f"api-key:{digest}",
                                                         "incident 7")  # fmt: skip
    assert sepp(capsys, keyed, "queues", "resume", "q", "--api-key", "wrong")[0] == 1
