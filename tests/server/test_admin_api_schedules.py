"""The admin HTTP API's schedule routes (issue 17 item 2): PUT creates (201) and
updates (200), GET lists each schedule with its next fire time, :pause and
:resume, DELETE; an unknown schedule is 404, a bad definition 400, a viewer may
not put one (403)."""

from __future__ import annotations

import base64

from tests.server.test_admin_api import KEYS_TOML, VIEWER_KEY, admin_api

BEAT = {"queue": "q", "job_type": "tick", "every_ms": 60_000, "catch_up": "all"}


async def test_a_schedule_is_put_listed_paused_resumed_and_deleted() -> None:
    async with admin_api() as api:
        nightly = {
            "queue": "q", "job_type": "digest", "cron": "0 2 * * *",
            "timezone": "Europe/Berlin", "reason": "digest",
            "payload": {"data": base64.b64encode(b"{}").decode(), "encoding": "application/json"},
        }  # fmt: skip
        status, body, _ = await api.call("PUT", "/schedules/nightly", nightly)
        assert status == 201, body
        assert body["schedule"]["created"] and body["schedule"]["next_ms"] > 0
        status, body, _ = await api.call("PUT", "/schedules/nightly", nightly)
        assert (status, body["schedule"]["changed"]) == (200, False)
        # The audit trail shows the put (its payload's bytes included).
        status, body, _ = await api.call("GET", "/audit")
        assert status == 200, body
        assert body["entries"][0]["action"] == "schedule.put"
        assert body["entries"][0]["reason"] == "digest"
        status, body, _ = await api.call("GET", "/schedules")
        assert status == 200
        (listed,) = body["schedules"]
        assert (listed["name"], listed["cron"], listed["timezone"]) == (
            "nightly", "0 2 * * *", "Europe/Berlin"
        )  # fmt: skip
        status, body, _ = await api.call("POST", "/schedules/nightly:pause")
        assert (status, body["schedule"]["paused"]) == (200, True)
        status, body, _ = await api.call("GET", "/schedules/nightly")
        assert body["schedule"]["paused"] is True
        status, body, _ = await api.call("POST", "/schedules/nightly:resume")
        assert (status, body["schedule"]["paused"]) == (200, False)
        status, body, _ = await api.call("DELETE", "/schedules/nightly")
        assert status == 200
        status, body, _ = await api.call("GET", "/schedules")
        assert body["schedules"] == []


async def test_an_unknown_schedule_is_404() -> None:
    async with admin_api() as api:
        for method, path in (
            ("GET", "/schedules/nope"),
            ("POST", "/schedules/nope:pause"),
            ("DELETE", "/schedules/nope"),
        ):
            status, body, _ = await api.call(method, path)
            assert (status, body["error"]["code"]) == (404, "not_found"), (method, path)


async def test_a_bad_schedule_definition_is_400() -> None:
    async with admin_api() as api:
        for bad in (
            {**BEAT, "every_ms": 10},
            {**BEAT, "cron": "* * * * *"},
            {**BEAT, "timezone": "Mars/Olympus"},
            {**BEAT, "colour": "red"},
        ):
            status, body, _ = await api.call("PUT", "/schedules/beat", bad)
            assert (status, body["error"]["code"]) == (400, "invalid_argument"), bad


async def test_a_viewer_may_list_schedules_but_not_put_one() -> None:
    async with admin_api(admin__keys=KEYS_TOML) as api:
        status, _, _ = await api.call("GET", "/schedules", key=VIEWER_KEY)
        assert status == 200
        status, body, _ = await api.call("PUT", "/schedules/beat", BEAT, key=VIEWER_KEY)
        assert (status, body["error"]["code"]) == (403, "permission_denied")
