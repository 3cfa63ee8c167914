"""`sepp schedules list|create|pause|resume|delete` (issue 17 item 2) against a
real server: the same options, exit codes and --json conventions as `sepp
queues ...`; `list` shows each schedule's next fire time."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest

from sepp.client.sync import SyncSeppClient
from tests.server.test_operator_admin_cli import lines, sepp
from tools.audit import admin_actions
from tools.datadir import open_data_dir


@pytest.fixture
def server(server_factory: Callable[..., Any]) -> Any:
    return server_factory()


@pytest.fixture
def client(server: Any) -> Iterator[SyncSeppClient]:
    c = SyncSeppClient.connect(server.address)
    yield c
    c.close()


def test_schedules_create_list_pause_resume_and_delete(
    capsys: pytest.CaptureFixture[str], server: Any, client: SyncSeppClient
) -> None:
    code, out, err = sepp(capsys, server, "schedules", "create", "digest", "--queue", "emails",
                          "--job-type", "send_digest", "--cron", "0 2 * * *", "--timezone",
                          "Europe/Berlin", "--payload", "{}", "--encoding", "application/json",
                          "--catch-up", "all", "--reason", "nightly", "--json")  # fmt: skip
    assert code == 0, err
    put = json.loads(out)
    assert (put["name"], put["created"], put["paused"]) == ("digest", True, False)
    code, out, _ = sepp(capsys, server, "schedules", "list", "--json")
    assert code == 0
    (doc,) = lines(out)
    assert (doc["name"], doc["queue"], doc["cron"], doc["timezone"], doc["catch_up"]) == (
        "digest", "emails", "0 2 * * *", "Europe/Berlin", "all"
    )  # fmt: skip
    assert doc["next_ms"] == put["next_ms"]
    assert datetime.fromisoformat(doc["next_fire_at"]).timestamp() * 1000 == doc["next_ms"]
    code, out, _ = sepp(capsys, server, "schedules", "list")
    assert code == 0 and "digest" in out and "0 2 * * * Europe/Berlin" in out
    assert doc["next_fire_at"] in out  # the next fire time, in the table too
    code, out, _ = sepp(capsys, server, "schedules", "pause", "digest", "--json")
    assert code == 0 and json.loads(out)["paused"] is True
    code, out, _ = sepp(capsys, server, "schedules", "pause", "digest")
    assert code == 0 and "paused (already)" in out
    code, out, _ = sepp(capsys, server, "schedules", "resume", "digest")
    assert code == 0 and "firing" in out
    assert sepp(capsys, server, "schedules", "delete", "digest")[0] == 2  # needs --yes
    assert [s.name for s in client.list_schedules()] == ["digest"]
    code, out, _ = sepp(capsys, server, "schedules", "delete", "digest", "--yes")
    assert code == 0 and "deleted" in out
    code, out, _ = sepp(capsys, server, "schedules", "list")
    assert code == 0 and "(no schedules)" in out
    actions = [
        (e.action, e.reason) for e in admin_actions(open_data_dir(str(server.data_dir))).entries
    ]
    assert ("schedule.put", "nightly") in actions


def test_schedules_create_every_ms_and_an_update_keeps_the_next_tick(
    capsys: pytest.CaptureFixture[str], server: Any
) -> None:
    argv = ("schedules", "create", "tick", "--queue", "q", "--job-type", "t",
            "--every-ms", "60000", "--json")  # fmt: skip
    code, out, _ = sepp(capsys, server, *argv)
    first = json.loads(out)
    assert code == 0 and first["created"] is True
    code, out, _ = sepp(capsys, server, *argv, "--priority", "3")
    again = json.loads(out)
    assert code == 0 and again["created"] is False and again["changed"] is True
    assert again["next_ms"] == first["next_ms"]
    code, out, _ = sepp(capsys, server, "schedules", "list")
    assert code == 0 and "every 60000 ms" in out


def test_a_bad_cron_or_an_unknown_time_zone_exits_1_naming_the_field(
    capsys: pytest.CaptureFixture[str], server: Any
) -> None:
    base = ("schedules", "create", "s", "--queue", "q", "--job-type", "t")
    code, _, err = sepp(capsys, server, *base, "--cron", "61 * * * *")
    assert code == 1 and "cron" in err and err.count("\n") == 1
    code, _, err = sepp(capsys, server, *base, "--cron", "0 * * * *", "--timezone", "Mars/Base")
    assert code == 1 and "time zone 'Mars/Base'" in err
    code, out, _ = sepp(capsys, server, "schedules", "list", "--json")
    assert code == 0 and out == ""


def test_schedules_commands_that_cannot_run_exit_2_or_1(
    capsys: pytest.CaptureFixture[str], server: Any
) -> None:
    base = ("schedules", "create", "s", "--queue", "q", "--job-type", "t")
    assert sepp(capsys, server, *base)[0] == 2  # neither --cron nor --every-ms
    assert sepp(capsys, server, *base, "--cron", "* * * * *", "--every-ms", "1000")[0] == 2
    code, _, err = sepp(capsys, server, "schedules", "pause", "nope")
    assert code == 1 and "nope" in err
    code, _, err = sepp(capsys, server, "schedules", "delete", "nope", "--yes")
    assert code == 1 and "nope" in err
