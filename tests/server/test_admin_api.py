"""The admin HTTP API (issue 15, items 2 and 4): every route of /admin/api/v1 on a
real server in process (the admin listener on 127.0.0.1:0), its statuses (one
test per row of API_STATUS), the roles (401 vs 403), the auth decision table, the
[admin] keys setting, the audit trail and a restart."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sepp.admin import auth
from sepp.admin.api import API_STATUS, answer, command_api_error
from sepp.admin.auth import ApiError, authenticate, match_key
from sepp.core.config import ConfigError
from sepp.core.results import (
    AttemptMismatch,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    QueueInUse,
    QueueNotFound,
    TooManyIds,
)
from sepp.server.config import AdminKey, load_config
from sepp.server.server import SeppServer
from sepp.server.service import LOCAL_ADMIN, Overloaded, Principal
from sepp.storage.faultfs import FaultyFileSystem
from tests.inprocess import address_of, in_process, in_process_config
from tests.server.conftest import connect, job
from tools.audit import admin_actions
from tools.datadir import open_data_dir

pytestmark = pytest.mark.usefixtures("in_process_env")

PREFIX = "/admin/api/v1"
VIEWER_KEY, OPERATOR_KEY, ADMIN_KEY = "viewer-secret", "operator-secret", "admin-secret"
KEYS_TOML = (
    f'[{{name = "vera", key = "{VIEWER_KEY}", role = "viewer"}}, '
    f'{{name = "otto", key = "{OPERATOR_KEY}", role = "operator"}}, '
    f'{{name = "ada", key = "{ADMIN_KEY}"}}]'
)
ADMIN_ON = {"admin__listen_addr": "127.0.0.1:0"}
# Dead letters are kept only with a retention (the default keeps none).
RETAIN = {"storage__dead_letter_retention_ms": "3600000"}


class Api:
    """An HTTP client of one server's admin API."""

    def __init__(self, server: SeppServer, session: aiohttp.ClientSession) -> None:
        assert server.admin_address is not None
        host, port = server.admin_address
        self.base = f"http://{host}:{port}"
        self.session = session
        self.server = server

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        key: str | None = None,
        data: bytes | None = None,
        params: dict[str, str] | None = None,
    ) -> tuple[int, Any, dict[str, str]]:
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        kwargs: dict[str, Any] = {"headers": headers, "params": params}
        if data is not None:
            kwargs["data"] = data
        elif body is not None:
            kwargs["json"] = body
        url = self.base + PREFIX + path
        async with self.session.request(method, url, **kwargs) as response:
            text = await response.text()
            try:
                parsed = json.loads(text) if text else None
            except ValueError:
                parsed = text
            return response.status, parsed, dict(response.headers)


@contextlib.asynccontextmanager
async def admin_api(fs: FaultyFileSystem | None = None, **env: str) -> AsyncIterator[Api]:
    config = in_process_config(**{**ADMIN_ON, **env})
    async with in_process(config, fs) as server, aiohttp.ClientSession() as session:
        yield Api(server, session)


async def enqueue_native(api: Api, queue: str, count: int = 1, **fields: Any) -> list[str]:
    client = await connect(address_of(api.server))
    try:
        return list(await client.enqueue_ids(*(job(queue, **fields) for _ in range(count))))
    finally:
        await client.close()


async def dead_letters(api: Api, queue: str, count: int) -> list[str]:
    """`count` dead letters of cause admin in `queue`, through the API."""
    ids = await enqueue_native(api, queue, count)
    status, body, _ = await api.call("POST", f"/queues/{queue}/jobs:dead-letter", {"ids": ids})
    assert status == 200, body
    return ids


# -- the status table: one test per row ----------------------------------------------------


async def test_status_row_invalid_argument_is_400_for_a_body_that_is_not_json():
    async with admin_api() as api:
        status, body, _ = await api.call("POST", "/queues/q/jobs", data=b"{not json")
        assert status == API_STATUS["invalid_argument"] == 400
        assert body["error"]["code"] == "invalid_argument"
        # And for input the core refuses: a page limit past PAGE_JOBS_MAX.
        status, body, _ = await api.call("GET", "/queues/q/jobs", params={"limit": "100000"})
        assert (status, body["error"]["code"]) == (400, "invalid_argument")


async def test_status_row_unauthenticated_is_401_with_www_authenticate_bearer():
    async with admin_api(admin__keys=KEYS_TOML) as api:
        for key in (None, "not-a-key"):
            status, body, headers = await api.call("GET", "/queues", key=key)
            assert status == API_STATUS["unauthenticated"] == 401
            assert body["error"]["code"] == "unauthenticated"
            assert headers["WWW-Authenticate"].startswith("Bearer")


async def test_status_row_permission_denied_is_403():
    async with admin_api(admin__keys=KEYS_TOML) as api:
        status, body, _ = await api.call("POST", "/queues/q:pause", key=VIEWER_KEY)
        assert status == API_STATUS["permission_denied"] == 403
        assert "needs role operator" in body["error"]["message"]


async def test_status_row_not_found_is_404_for_an_unknown_job_and_queue():
    async with admin_api() as api:
        status, body, _ = await api.call("GET", "/jobs/no-such-job")
        assert status == API_STATUS["not_found"] == 404
        assert body["error"]["code"] == "not_found"
        status, body, _ = await api.call("GET", "/queues/nowhere")
        assert (status, body["error"]["queue"]) == (404, "nowhere")
        assert (await api.call("GET", "/no-such-route"))[0] == 404


async def test_status_row_failed_precondition_is_409():
    assert command_api_error(AttemptMismatch("moved on", 2)).status == 409
    assert command_api_error(FailedPrecondition("undeclared", ("q",))).status == 409
    assert API_STATUS["failed_precondition"] == 409


async def test_status_row_queue_in_use_is_409_for_deleting_a_queue_with_jobs_in_flight():
    async with admin_api() as api:
        status, _, _ = await api.call("PUT", "/queues/busy", {"overrides": {}})
        assert status == 201
        await enqueue_native(api, "busy")
        client = await connect(address_of(api.server))
        assert len(await client.reserve(["busy"])) == 1
        await client.close()
        status, body, _ = await api.call("DELETE", "/queues/busy")
        assert status == API_STATUS["queue_in_use"] == 409
        assert (body["error"]["code"], body["error"]["queue"]) == ("queue_in_use", "busy")


async def test_status_row_resource_exhausted_is_409_when_the_commit_backlog_is_full():
    class FakeService:
        async def durable(self, barrier: int) -> None:
            raise AssertionError("never reached")

    def overloaded() -> tuple[Any, int]:
        raise Overloaded("the commit backlog is full")

    with pytest.raises(ApiError) as refused:
        await answer(FakeService(), overloaded, dict)  # type: ignore[arg-type]
    assert (refused.value.status, refused.value.code) == (409, "resource_exhausted")
    assert API_STATUS["resource_exhausted"] == 409


async def test_status_row_payload_too_large_is_413_past_max_message_bytes():
    async with admin_api(
        limits__max_message_bytes="65536", limits__max_payload_bytes="1024"
    ) as api:
        big = {"job_type": "t", "payload": {"data": "A" * 70_000, "encoding": "x"}}
        status, body, _ = await api.call("POST", "/queues/q/jobs", big)
        assert status == API_STATUS["payload_too_large"] == 413
        assert body["error"]["code"] == "payload_too_large"


async def test_status_row_unavailable_is_503_once_shutdown_began():
    async with admin_api() as api:
        api.server.stopping = True  # the state shutdown sets first
        api.server.service.stopping = True
        try:
            for method, path in (("GET", "/overview"), ("POST", "/queues/q:pause")):
                status, body, _ = await api.call(method, path)
                assert status == API_STATUS["unavailable"] == 503, (path, body)
        finally:
            api.server.stopping = False
            api.server.service.stopping = False


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (PermissionDenied("no"), 403),
        (QueueInUse("busy", "q"), 409),
        (QueueNotFound("none", "q"), 404),
        (NotFound("none"), 404),
        (TooManyIds("too many", 1000, 1001), 400),
        (InvalidArgument("bad"), 400),
    ],
)
def test_each_refusal_of_the_core_has_its_status(error, status):
    assert command_api_error(error).status == status


# -- auth: the decision table -----------------------------------------------------------------

KEYS = (
    AdminKey("vera", VIEWER_KEY, "viewer"),
    AdminKey("otto", OPERATOR_KEY, "operator"),
    AdminKey("ada", ADMIN_KEY, "admin"),
)


def test_auth_row_no_keys_on_loopback_is_the_local_admin():
    assert authenticate((), None, loopback=True) == LOCAL_ADMIN == Principal("local", "admin")


def test_auth_row_no_keys_on_another_address_fails_closed():
    with pytest.raises(ApiError) as refused:
        authenticate((), f"Bearer {ADMIN_KEY}", loopback=False)
    assert refused.value.status == 401 and "restart required" in refused.value.message


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer   ", f"Basic {ADMIN_KEY}"])
def test_auth_row_keys_and_no_bearer_key_is_401(header):
    with pytest.raises(ApiError) as refused:
        authenticate(KEYS, header, loopback=True)
    assert refused.value.status == 401
    assert refused.value.headers["WWW-Authenticate"].startswith("Bearer")


def test_auth_row_keys_and_an_unknown_key_is_401_invalid_token():
    with pytest.raises(ApiError) as refused:
        authenticate(KEYS, "Bearer admin-secreT", loopback=True)
    assert refused.value.status == 401
    assert 'error="invalid_token"' in refused.value.headers["WWW-Authenticate"]


def test_auth_row_a_known_key_is_its_name_and_role():
    assert authenticate(KEYS, f"Bearer {OPERATOR_KEY}", loopback=False) == ("otto", "operator")
    assert authenticate(KEYS, f"bearer {VIEWER_KEY}", loopback=True) == ("vera", "viewer")


def test_the_key_is_compared_with_every_configured_key_even_after_a_match():
    compared: list[bytes] = []

    def compare(candidate: bytes, known: bytes) -> bool:
        compared.append(known)
        return auth.hmac.compare_digest(candidate, known)

    assert match_key(KEYS, VIEWER_KEY, compare) == KEYS[0]  # the first one matches
    assert compared == [k.key.encode() for k in KEYS]
    assert match_key.__defaults__ == (auth.hmac.compare_digest,)


# -- roles end to end: 401 and 403 distinct --------------------------------------------------------


async def test_a_viewer_reads_but_may_not_requeue():
    async with admin_api(admin__keys=KEYS_TOML, **RETAIN) as api:
        ids = await enqueue_native(api, "q")
        assert (await api.call("GET", "/queues", key=VIEWER_KEY))[0] == 200
        assert (await api.call("GET", f"/jobs/{ids[0]}", key=VIEWER_KEY))[0] == 200
        assert (await api.call("GET", "/queues/q/jobs", key=VIEWER_KEY))[0] == 200
        requeue = ("POST", "/queues/q/dead-letters:requeue", {"ids": ids})
        assert (await api.call(*requeue, key=VIEWER_KEY))[0] == 403
        assert (await api.call(*requeue, key="wrong"))[0] == 401
        assert (await api.call(*requeue))[0] == 401
        enqueue = ("POST", "/queues/q/jobs", {"job_type": "t"})
        assert (await api.call(*enqueue, key=VIEWER_KEY))[0] == 403


async def test_an_operator_requeues_but_may_not_delete_a_queue_and_an_admin_may():
    async with admin_api(admin__keys=KEYS_TOML, **RETAIN) as api:
        assert (await api.call("PUT", "/queues/q", {}, key=ADMIN_KEY))[0] == 201
        assert (await api.call("PUT", "/queues/q", {}, key=OPERATOR_KEY))[0] == 403
        ids = await enqueue_native(api, "q")
        dead = ("POST", "/queues/q/jobs:dead-letter", {"ids": ids})
        assert (await api.call(*dead, key=OPERATOR_KEY))[0] == 200
        requeue = ("POST", "/queues/q/dead-letters:requeue", {"ids": ids})
        status, body, _ = await api.call(*requeue, key=OPERATOR_KEY)
        assert (status, body["outcomes"]) == (200, [{"id": ids[0], "outcome": "done"}])
        assert (await api.call("DELETE", "/queues/q", key=OPERATOR_KEY))[0] == 403
        status, body, _ = await api.call("POST", "/queues/q:purge", key=OPERATOR_KEY)
        assert (status, body["purged"]) == (200, 1)
        status, body, _ = await api.call("DELETE", "/queues/q", key=ADMIN_KEY)
        assert (status, body["queue"]) == (200, "q")


async def test_health_and_metrics_need_no_key_when_keys_are_configured():
    async with admin_api(admin__keys=KEYS_TOML) as api:
        for path in ("/livez", "/readyz", "/metrics"):
            async with api.session.get(api.base + path) as response:
                assert response.status == 200, path


async def test_the_metrics_listener_serves_no_admin_api():
    config = in_process_config(metrics__listen_addr="127.0.0.1:0")
    async with in_process(config) as server, aiohttp.ClientSession() as session:
        assert server.admin is None and server.metrics_listener is not None
        host, port = server.metrics_listener.address
        async with session.get(f"http://{host}:{port}{PREFIX}/queues") as response:
            assert response.status == 404


# -- every route's success --------------------------------------------------------------------------


async def test_overview_and_server_info_and_queue_listings():
    async with admin_api() as api:
        await enqueue_native(api, "emails", 2)
        await enqueue_native(api, "reports", 1, scheduled_at_ms=api.server.clock() + 3_600_000)
        status, body, _ = await api.call("GET", "/overview")
        assert status == 200
        assert body["totals"] == {
            "queues": 2,
            "ready": 2,
            "scheduled": 1,
            "inflight": 0,
            "dead_letter": 0,
        }
        assert [q["name"] for q in body["queues"]] == ["emails", "reports"]
        assert body["server"]["serving"] is True
        status, info, _ = await api.call("GET", "/server-info")
        assert status == 200 and info["max_message_bytes"] == 16 * 1024 * 1024
        status, body, _ = await api.call("GET", "/queues")
        assert status == 200 and [q["name"] for q in body["queues"]] == ["emails", "reports"]
        status, body, _ = await api.call("GET", "/queues/emails")
        assert status == 200 and (body["queue"]["ready"], body["queue"]["paused"]) == (2, False)
        assert "default_max_attempts" in body["queue"]["settings"]


async def test_put_creates_then_updates_a_queue_and_delete_removes_it():
    async with admin_api() as api:
        status, body, _ = await api.call(
            "PUT", "/queues/q", {"overrides": {"default_priority": 5}, "reason": "new"}
        )
        assert status == 201 and body["created"] and body["settings"]["default_priority"] == 5
        status, body, _ = await api.call("PUT", "/queues/q", {"overrides": {"default_priority": 7}})
        assert status == 200 and not body["created"] and body["changed"]
        status, body, _ = await api.call("GET", "/queues/q")
        assert body["queue"]["overrides"] == {"default_priority": 7}
        status, body, _ = await api.call("PUT", "/queues/q", {"overrides": {"no_such": 1}})
        assert status == 400
        status, body, _ = await api.call("PUT", "/queues/q", {"overrides": {"x": True}})
        assert status == 400
        status, body, _ = await api.call("DELETE", "/queues/q", params={"reason": "done"})
        assert status == 200 and body["queue"] == "q"


async def test_enqueue_one_job_and_a_batch_with_base64_and_json_payloads():
    async with admin_api() as api:
        data = bytes(range(256))
        one = {
            "job_type": "resize",
            "payload": {"data": base64.b64encode(data).decode(), "encoding": "image/png"},
            "priority": 3,
            "custom": {"tenant": "acme", "n": 1},
        }
        status, body, _ = await api.call("POST", "/queues/images/jobs", one)
        assert status == 200, body
        (result,) = body["results"]
        job_id = result["job_id"]
        status, body, _ = await api.call("GET", f"/jobs/{job_id}")
        assert status == 200
        got = body["job"]
        assert (got["queue"], got["job_type"], got["state"], got["priority"]) == (
            "images",
            "resize",
            "ready",
            3,
        )
        assert base64.b64decode(got["payload"]["data"]) == data
        assert got["payload"]["encoding"] == "image/png"
        assert got["custom"] == {"tenant": "acme", "n": 1}

        batch = {
            "jobs": [
                {"job_type": "a", "payload": {"json": {"to": "x@example.com"}}},
                {"job_type": "b", "payload": {"data": "not base64!"}},
                {"job_type": 7},
                {"job_type": "c", "queue": "elsewhere"},
                {"job_type": "d", "priority": 2**70},
            ]
        }
        status, body, _ = await api.call("POST", "/queues/images/jobs", batch)
        assert status == 200
        results = body["results"]
        assert "job_id" in results[0]
        for rejected in results[1:]:
            assert rejected["rejection"]["reason"] == "invalid_request", rejected
        status, body, _ = await api.call("GET", f"/jobs/{results[0]['job_id']}")
        payload = body["job"]["payload"]
        assert payload["encoding"] == "application/json"
        assert json.loads(base64.b64decode(payload["data"])) == {"to": "x@example.com"}


async def test_enqueue_is_refused_by_the_core_like_the_native_enqueue():
    async with admin_api() as api:
        big = base64.b64encode(b"x" * (1_048_576 + 1)).decode()
        job_ = {"job_type": "t", "payload": {"data": big, "encoding": "application/octet-stream"}}
        status, body, _ = await api.call("POST", "/queues/q/jobs", job_)
        assert status == 200
        assert body["results"][0]["rejection"]["reason"] == "payload_too_large"
        batch = {"jobs": [{"job_type": "t"}, {"job_type": ""}], "atomic": True}
        status, body, _ = await api.call("POST", "/queues/q/jobs", batch)
        assert status == 200 and [f["index"] for f in body["failures"]] == [1]


async def test_jobs_are_paged_by_state_with_a_cursor():
    async with admin_api(**RETAIN) as api:
        ids = await enqueue_native(api, "q", 5)
        await enqueue_native(api, "q", 1, scheduled_at_ms=api.server.clock() + 3_600_000)
        client = await connect(address_of(api.server))
        (leased,) = await client.reserve(["q"])
        await client.close()
        await api.call("POST", "/queues/q/jobs:dead-letter", {"ids": [ids[1]]})
        seen: list[str] = []
        cursor = None
        while True:
            params = {"state": "ready", "limit": "2", **({"cursor": cursor} if cursor else {})}
            status, body, _ = await api.call("GET", "/queues/q/jobs", params=params)
            assert status == 200 and len(body["jobs"]) <= 2
            seen += [j["id"] for j in body["jobs"]]
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert seen == ids[2:]
        for state, expected in (("inflight", [leased["id"]]), ("dead_letter", [ids[1]])):
            status, body, _ = await api.call("GET", "/queues/q/jobs", params={"state": state})
            assert [j["id"] for j in body["jobs"]] == expected
        status, body, _ = await api.call(
            "GET", "/queues/q/jobs", params={"state": "dead_letter", "cause": "admin"}
        )
        assert [(j["id"], j["dead_letter_cause"]) for j in body["jobs"]] == [(ids[1], "admin")]
        status, body, _ = await api.call(
            "GET", "/queues/q/jobs", params={"state": "dead_letter", "cause": "rejected"}
        )
        assert body["jobs"] == []
        status, body, _ = await api.call("GET", "/queues/q/jobs", params={"state": "scheduled"})
        assert len(body["jobs"]) == 1
        assert (await api.call("GET", "/queues/q/jobs", params={"state": "done"}))[0] == 400


async def test_dead_letter_and_cancel_by_ids_with_per_id_outcomes():
    async with admin_api(**RETAIN) as api:
        ids = await enqueue_native(api, "q", 3)
        (other,) = await enqueue_native(api, "other")
        status, body, _ = await api.call(
            "POST",
            "/queues/q/jobs:dead-letter",
            {"ids": [ids[0], "no-such-job", other], "reason": "poison"},
        )
        assert status == 200
        assert {o["id"]: o["outcome"] for o in body["outcomes"]} == {
            ids[0]: "done",
            "no-such-job": "not_found",
            other: "not_found",  # a job of another queue than the path's
        }
        status, body, _ = await api.call("POST", "/queues/q/jobs:cancel", {"ids": ids[1:]})
        assert [o["outcome"] for o in body["outcomes"]] == ["done", "done"]
        assert (await api.call("GET", f"/jobs/{ids[1]}"))[0] == 404
        assert (await api.call("GET", f"/jobs/{other}"))[1]["job"]["state"] == "ready"
        too_many = {"ids": [f"id-{i}" for i in range(1001)]}
        status, body, _ = await api.call("POST", "/queues/q/jobs:cancel", too_many)
        assert status == 400 and "at most 1000" in body["error"]["message"]
        assert (await api.call("POST", "/queues/q/jobs:cancel", {"ids": "x"}))[0] == 400


async def test_dead_letters_requeue_and_delete_by_ids_and_by_filter():
    async with admin_api(**RETAIN) as api:
        ids = await dead_letters(api, "q", 4)
        status, body, _ = await api.call(
            "POST", "/queues/q/dead-letters:requeue", {"ids": [ids[0], "gone"]}
        )
        assert [o["outcome"] for o in body["outcomes"]] == ["done", "not_found"]
        job_ = (await api.call("GET", f"/jobs/{ids[0]}"))[1]["job"]
        assert (job_["state"], job_["attempt"]) == ("ready", 1)
        status, body, _ = await api.call("POST", "/queues/q/dead-letters:delete", {"ids": [ids[1]]})
        assert [o["outcome"] for o in body["outcomes"]] == ["done"]
        status, body, _ = await api.call(
            "POST", "/queues/q/dead-letters:requeue", {"cause": "admin", "reason": "fixed"}
        )
        assert status == 200 and sorted(o["id"] for o in body["outcomes"]) == sorted(ids[2:])
        assert body["remaining"] == 0
        await dead_letters(api, "q", 2)
        status, body, _ = await api.call("POST", "/queues/q/dead-letters:delete")
        assert status == 200 and len(body["outcomes"]) == 2
        status, body, _ = await api.call(
            "POST", "/queues/q/dead-letters:delete", {"cause": "no-such-cause"}
        )
        assert status == 400


async def test_pause_resume_and_purge_a_queue():
    async with admin_api() as api:
        await enqueue_native(api, "q", 3)
        status, body, _ = await api.call("POST", "/queues/q:pause", {"reason": "deploy"})
        assert (status, body) == (200, {"queue": "q", "paused": True, "changed": True})
        client = await connect(address_of(api.server))
        assert await client.reserve(["q"]) == []
        status, body, _ = await api.call("POST", "/queues/q:resume")
        assert (status, body["paused"]) == (200, False)
        assert len(await client.reserve(["q"])) == 1
        await client.close()
        status, body, _ = await api.call("POST", "/queues/q:purge")
        assert (status, body["purged"], body["remaining"]) == (200, 2, 0)


async def test_a_queue_name_with_a_colon_is_reachable():
    async with admin_api() as api:
        await enqueue_native(api, "a:b")
        status, body, _ = await api.call("POST", "/queues/a:b:pause")
        assert (status, body["queue"]) == (200, "a:b")
        assert (await api.call("GET", "/queues/a:b"))[1]["queue"]["paused"] is True


# -- durability, the audit trail -----------------------------------------------------------------


async def test_a_mutation_through_the_api_survives_a_restart():
    fs = FaultyFileSystem()
    async with admin_api(fs) as api:
        await enqueue_native(api, "q", 2)
        assert (await api.call("POST", "/queues/q:pause"))[0] == 200
        assert (await api.call("PUT", "/queues/r", {"overrides": {"default_priority": 4}}))[
            0
        ] == 201
    async with admin_api(fs) as api:
        status, body, _ = await api.call("GET", "/queues/q")
        assert (status, body["queue"]["paused"], body["queue"]["ready"]) == (200, True, 2)
        assert (await api.call("GET", "/queues/r"))[1]["queue"]["overrides"] == {
            "default_priority": 4
        }


async def test_the_local_actor_and_the_key_names_are_recorded_in_the_audit_trail(tmp_path: Path):
    data_dir = tmp_path / "data"
    for env in ({}, {"SEPP_ADMIN__KEYS": KEYS_TOML}):
        config = load_config(
            None,
            env={"SEPP_ADMIN__LISTEN_ADDR": "127.0.0.1:0", **env},
            overrides={
                ("server", "data_dir"): str(data_dir),
                ("server", "listen_addr"): "127.0.0.1:0",
            },
        )
        server = SeppServer(config)
        await server.start()
        try:
            async with aiohttp.ClientSession() as session:
                api = Api(server, session)
                await enqueue_native(api, "q")
                key = None if not env else OPERATOR_KEY
                status, _, _ = await api.call(
                    "POST", "/queues/q:pause", {"reason": "maintenance"}, key=key
                )
                assert status == 200
                await api.call("POST", "/queues/q:resume", key=key)
        finally:
            await server.shutdown()
            await asyncio.wait_for(server.wait_stopped(), 30)
    entries = admin_actions(open_data_dir(str(data_dir))).entries
    assert [(e.action, e.actor, e.role, e.reason) for e in entries] == [
        ("queue.pause", "local", "admin", "maintenance"),
        ("queue.resume", "local", "admin", None),
        ("queue.pause", "otto", "operator", "maintenance"),
        ("queue.resume", "otto", "operator", None),
    ]


# -- configuration: [admin] keys ------------------------------------------------------------------


def test_a_non_loopback_admin_listener_with_admin_keys_is_accepted():
    config = load_config(
        None, env={"SEPP_ADMIN__LISTEN_ADDR": "0.0.0.0:9465", "SEPP_ADMIN__KEYS": KEYS_TOML}
    )
    assert config.admin_listen == ("0.0.0.0", 9465)
    assert config.admin_keys == list(KEYS)


@pytest.mark.parametrize("keys", [None, "[]"])
def test_a_non_loopback_admin_listener_without_admin_keys_is_still_refused(keys):
    env = {"SEPP_ADMIN__LISTEN_ADDR": "0.0.0.0:9465"}
    if keys is not None:
        env["SEPP_ADMIN__KEYS"] = keys
    with pytest.raises(ConfigError) as refused:
        load_config(None, env=env)
    assert refused.value.key == "admin.listen_addr"
    assert "admin.keys" in str(refused.value)


def test_admin_keys_come_from_the_config_file_with_admin_the_default_role(tmp_path: Path):
    path = tmp_path / "sepp.toml"
    path.write_text(
        '[admin]\nlisten_addr = "10.0.0.1:9465"\n'
        '[[admin.keys]]\nname = "ci"\nkey = "k1"\nrole = "viewer"\n'
        '[[admin.keys]]\nname = "root"\nkey = "k2"\n'
    )
    config = load_config(str(path), env={})
    assert config.admin_keys == [AdminKey("ci", "k1", "viewer"), AdminKey("root", "k2", "admin")]


@pytest.mark.parametrize(
    ("keys", "where", "says"),
    [
        ('"k"', "admin.keys", "must be a list"),
        ('[{name = "a"}]', "admin.keys[0]", "non-empty"),
        ('[{name = "", key = "k"}]', "admin.keys[0]", "non-empty"),
        ('[{name = "a", key = "k", role = "root"}]', "admin.keys[0].role", "viewer"),
        ('[{name = "a", key = "k", extra = 1}]', "admin.keys[0]", "must be"),
        ('[{name = "a", key = "k1"}, {name = "a", key = "k2"}]', "admin.keys", "names"),
        ('[{name = "a", key = "k"}, {name = "b", key = "k"}]', "admin.keys", "unique"),
    ],
)
def test_a_bad_admin_keys_value_is_refused_naming_admin_keys(keys, where, says):
    with pytest.raises(ConfigError) as refused:
        load_config(None, env={"SEPP_ADMIN__KEYS": keys})
    assert refused.value.key == where
    assert says in str(refused.value)
