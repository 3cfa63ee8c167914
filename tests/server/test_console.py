"""The web console (issue 16) over HTTP, without a browser: login and sessions,
the cross-site check, the Content-Security-Policy, escaping, roles (a viewer's
controls disabled), the search box, payload decoding and the stats history.
The browser tests are tests/server/test_console_browser.py."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import ssl
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import aiohttp
import pytest
from aiohttp import web

from sepp.admin import console
from sepp.admin.app import build_app
from sepp.admin.console import CSP, SESSION_COOKIE, StatsHistory, payload_view
from sepp.server.config import AdminKey
from sepp.server.job_timeline import job_timeline
from tests.inprocess import address_of, in_process, in_process_config
from tests.server.conftest import connect
from tests.server.test_admin_api import (
    ADMIN_KEY,
    ADMIN_ON,
    KEYS_TOML,
    OPERATOR_KEY,
    RETAIN,
    VIEWER_KEY,
    Api,
    enqueue_native,
)
from tests.support import self_signed_certificate

pytestmark = pytest.mark.usefixtures("in_process_env")


class Browserish:
    """An HTTP client of the console that keeps the session cookie by hand (a
    cookie jar refuses cookies of an IP address) and sends what a browser sends
    from the console's own pages (Sec-Fetch-Site: same-origin)."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.base = api.base
        self.cookie: str | None = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        site: str | None = "same-origin",
        headers: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> tuple[int, str, aiohttp.ClientResponse]:
        sent = dict(headers or {})
        if site is not None:
            sent["Sec-Fetch-Site"] = site
        if self.cookie is not None:
            sent["Cookie"] = f"{SESSION_COOKIE}={self.cookie}"
        async with self.api.session.request(
            method, self.base + path, headers=sent, allow_redirects=False, **kwargs
        ) as response:
            return response.status, await response.text(), response

    async def login(self, name: str, key: str) -> aiohttp.ClientResponse:
        status, _text, response = await self.request(
            "POST", "/login", data={"name": name, "key": key, "next": "/"}
        )
        if status == 302:
            self.cookie = response.cookies[SESSION_COOKIE].value
        return response


@contextlib.asynccontextmanager
async def console_server(**env: str) -> AsyncIterator[Browserish]:
    config = in_process_config(**{**ADMIN_ON, **RETAIN, **env})
    async with in_process(config) as server, aiohttp.ClientSession() as session:
        yield Browserish(Api(server, session))


# -- login and sessions ----------------------------------------------------------------------


async def test_a_login_sets_an_httponly_samesite_strict_cookie_that_is_not_secure_over_plain_http():
    async with console_server(admin__keys=KEYS_TOML) as b:
        response = await b.login("ada", ADMIN_KEY)
        assert response.status == 302 and response.headers["Location"] == "/"
        set_cookie = response.headers["Set-Cookie"]
        assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
        assert "Path=/" in set_cookie and "Secure" not in set_cookie
        assert f"Max-Age={12 * 3600}" in set_cookie
        status, text, _ = await b.request("GET", "/")
        assert status == 200 and "ada (admin)" in text


async def test_a_wrong_key_or_a_wrong_name_is_refused_without_a_cookie():
    async with console_server(admin__keys=KEYS_TOML) as b:
        for name, key in (("ada", "not-the-key"), ("vera", ADMIN_KEY)):
            response = await b.login(name, key)
            assert response.status == 401
            assert SESSION_COOKIE not in response.cookies
        assert b.cookie is None


async def test_a_page_without_a_session_redirects_to_the_login_with_the_page_to_come_back_to():
    async with console_server(admin__keys=KEYS_TOML) as b:
        status, _text, response = await b.request("GET", "/queues/q?state=ready")
        assert status == 302
        location = urlsplit(response.headers["Location"])
        assert location.path == "/login"
        assert parse_qs(location.query) == {"next": ["/queues/q?state=ready"]}


async def test_a_login_only_follows_a_next_page_on_this_listener():
    async with console_server(admin__keys=KEYS_TOML) as b:
        status, _text, response = await b.request(
            "POST", "/login", data={"name": "ada", "key": ADMIN_KEY, "next": "//evil.example/"}
        )
        assert (status, response.headers["Location"]) == (302, "/")


async def test_the_session_cookie_authenticates_the_json_api_and_bearer_keys_still_work():
    async with console_server(admin__keys=KEYS_TOML) as b:
        await b.login("otto", OPERATOR_KEY)
        status, text, _ = await b.request("POST", "/admin/api/v1/queues/q:pause", json={})
        assert status == 200, text
        # A script: a Bearer key, no cookie, no browser headers.
        b.cookie = None
        status, text, _ = await b.request(
            "GET", "/", site=None, headers={"Authorization": f"Bearer {VIEWER_KEY}"}
        )
        assert status == 200 and "vera (viewer)" in text
        api = b.api
        status, body, _ = await api.call("POST", "/queues/q:resume", {}, key=OPERATOR_KEY)
        assert status == 200, body


async def test_a_cross_site_mutation_with_the_cookie_is_refused_and_a_same_origin_one_is_not():
    async with console_server(admin__keys=KEYS_TOML) as b:
        await b.login("otto", OPERATOR_KEY)
        path = "/admin/api/v1/queues/q:pause"
        for site in ("cross-site", "same-site"):
            status, text, _ = await b.request("POST", path, site=site, json={})
            assert status == 403 and "cross-site" in text
        # No Sec-Fetch-Site (an older browser): the Origin decides.
        status, _text, _ = await b.request(
            "POST", path, site=None, headers={"Origin": "http://evil.example"}, json={}
        )
        assert status == 403
        status, _text, _ = await b.request(
            "POST", path, site=None, headers={"Origin": b.base}, json={}
        )
        assert status == 200
        # Reads are not mutations: a cross-site GET with the cookie is answered.
        status, _text, _ = await b.request("GET", "/admin/api/v1/queues", site="cross-site")
        assert status == 200


async def test_a_cross_site_mutation_of_an_open_loopback_listener_is_refused():
    async with console_server() as b:
        status, _text, _ = await b.request(
            "POST", "/admin/api/v1/queues/q:pause", site="cross-site", data=b"{}"
        )
        assert status == 403
        status, text, _ = await b.request("GET", "/")
        assert status == 200 and "local (admin)" in text


async def test_a_cross_site_login_is_refused():
    async with console_server(admin__keys=KEYS_TOML) as b:
        status, _text, response = await b.request(
            "POST", "/login", site="cross-site", data={"name": "ada", "key": ADMIN_KEY}
        )
        assert status == 403 and SESSION_COOKIE not in response.cookies


async def test_changing_a_keys_secret_ends_its_sessions_and_a_role_change_applies_at_once():
    async with console_server(admin__keys=KEYS_TOML) as b:
        await b.login("vera", VIEWER_KEY)
        service = b.api.server.service
        keys = list(service.admin_keys)
        service.admin_keys = tuple(
            AdminKey(k.name, k.key, "operator") if k.name == "vera" else k for k in keys
        )
        status, text, _ = await b.request("GET", "/")
        assert status == 200 and "vera (operator)" in text
        service.admin_keys = tuple(
            AdminKey(k.name, "a-new-secret", k.role) if k.name == "vera" else k for k in keys
        )
        status, _text, _ = await b.request("GET", "/")
        assert status == 302


async def test_logging_out_ends_the_session():
    async with console_server(admin__keys=KEYS_TOML) as b:
        await b.login("ada", ADMIN_KEY)
        status, _text, _ = await b.request("POST", "/logout")
        assert status == 302
        status, _text, _ = await b.request("GET", "/")
        assert status == 302


async def test_a_session_expires_after_session_ttl_ms():
    async with console_server(admin__keys=KEYS_TOML, admin__session_ttl_ms="60000") as b:
        await b.login("ada", ADMIN_KEY)
        service = b.api.server.service  # the sessions read the service's clock
        now = service.now_ms()
        original = service.now_ms
        service.now_ms = lambda: now + 60_000  # type: ignore[method-assign]
        try:
            status, _text, _ = await b.request("GET", "/")
        finally:
            service.now_ms = original  # type: ignore[method-assign]
        assert status == 302


# -- pages -----------------------------------------------------------------------------------

PAGES = ("/", "/queues/q", "/dead-letters", "/schedules", "/enqueue", "/audit", "/login")


async def test_every_page_has_the_strict_csp_and_no_inline_script():
    async with console_server() as b:
        await enqueue_native(b.api, "q", 1)
        for path in PAGES:
            status, text, response = await b.request("GET", path)
            assert status == 200, path
            assert response.headers["Content-Security-Policy"] == CSP
            assert "default-src 'self'" in CSP and "script-src 'self'" in CSP
            for tag in re.findall(r"<script[^>]*>", text):
                assert 'src="/static/console.js"' in tag, (path, tag)
            assert not re.search(r"<[^>]+\son[a-z]+=", text), path  # no inline handlers
            assert "http://" not in text and "https://" not in text, path


async def test_values_from_jobs_are_escaped():
    async with console_server() as b:
        ids = await enqueue_native(b.api, "q", 1, job_type="<script>alert(1)</script>")
        for path in ("/queues/q", f"/jobs/{ids[0]}"):
            _status, text, _ = await b.request("GET", path)
            assert "<script>alert" not in text
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text


async def test_a_viewer_sees_the_mutation_controls_disabled():
    async with console_server(admin__keys=KEYS_TOML) as b:
        await enqueue_native(b.api, "q", 1)
        await b.login("vera", VIEWER_KEY)
        _status, text, _ = await b.request("GET", "/queues/q")
        buttons = re.findall(r'<button class="act[^"]*"[^>]*>', text)
        assert len(buttons) == 3 and all("disabled" in tag for tag in buttons), buttons
        _status, text, _ = await b.request("GET", "/enqueue")
        assert "<fieldset disabled>" in text
        status, text, _ = await b.request("GET", "/audit")
        assert status == 403 and "needs role admin" in text
        await b.login("otto", OPERATOR_KEY)
        _status, text, _ = await b.request("GET", "/queues/q")
        buttons = re.findall(r'<button class="act[^"]*"[^>]*>', text)
        assert len(buttons) == 3 and not any("disabled" in tag for tag in buttons), buttons


async def test_the_job_page_shows_every_field_the_decoded_payload_and_the_custom_map():
    async with console_server() as b:
        body = json.dumps({"order": 42, "items": ["a"]}).encode()
        ids = await enqueue_native(
            b.api,
            "q",
            1,
            payload={"data": body, "encoding": "application/json"},
            custom={"tenant": "acme"},
        )
        status, text, _ = await b.request("GET", f"/jobs/{ids[0]}")
        assert status == 200
        for field in ("job_id", "queue", "job_type", "state", "attempt", "enqueued_at"):
            assert f'data-field="{field}"' in text
        assert "shown as json" in text
        assert "&quot;order&quot;: 42" in text
        assert "tenant" in text and "acme" in text
        status, _text, _ = await b.request("GET", "/jobs/no-such-job")
        assert status == 404


async def test_the_search_box_finds_a_job_by_id_and_by_queue_and_idempotency_key():
    async with console_server() as b:
        ids = await enqueue_native(b.api, "q", 1, idempotency_key="order-7")
        for q in (ids[0], "q:order-7"):
            status, _text, response = await b.request("GET", "/search", params={"q": q})
            assert (status, response.headers["Location"]) == (302, f"/jobs/{ids[0]}")
        status, _text, _ = await b.request("GET", "/search", params={"q": "q:nothing"})
        assert status == 404


async def test_the_dashboard_has_a_card_per_queue_with_paused_queues_marked():
    async with console_server() as b:
        await enqueue_native(b.api, "alpha", 2)
        await enqueue_native(b.api, "beta", 1)
        status, body, _ = await b.api.call("POST", "/queues/beta:pause", {})
        assert status == 200, body
        _status, text, _ = await b.request("GET", "/")
        assert 'data-queue="alpha"' in text and 'data-queue="beta"' in text
        assert 'class="card is-paused" data-queue="beta"' in text
        assert 'class="card" data-queue="alpha"' in text


async def test_history_json_is_for_a_logged_in_user_only():
    async with console_server(admin__keys=KEYS_TOML) as b:
        status, _text, _ = await b.request("GET", "/console/history?window=60000")
        assert status == 401
        await b.login("vera", VIEWER_KEY)
        status, text, _ = await b.request("GET", "/console/history?window=60000")
        assert status == 200 and json.loads(text)["window_ms"] == 60000


# -- schedules (issue 17) and the queue's flow control -------------------------------------------

BEAT = {"queue": "q", "job_type": "tick", "every_ms": 60_000, "catch_up": "all"}


async def test_the_schedules_page_lists_each_schedule_with_its_next_fire_time_escaped():
    async with console_server() as b:
        nasty = '<i>"x"&'
        cron = {"queue": nasty, "job_type": nasty, "cron": "0 2 * * *", "timezone": "Europe/Berlin"}
        status, body, _ = await b.api.call("PUT", f"/schedules/{quote(nasty, safe='')}", cron)
        assert status == 201, body
        status, body, _ = await b.api.call("PUT", "/schedules/beat", BEAT)
        assert status == 201, body
        status, body, _ = await b.api.call("POST", "/schedules/beat:pause")
        assert status == 200, body
        _status, listed, _ = await b.api.call("GET", "/schedules")
        next_ms = {s["name"]: s["next_ms"] for s in listed["schedules"]}
        status, text, _ = await b.request("GET", "/schedules")
        assert status == 200
        shown = "&lt;i&gt;&quot;x&quot;&amp;"
        assert "<i>" not in text and text.count(shown) >= 4  # name, data-schedule, queue, type
        rows = dict(re.findall(r'<tr data-schedule="([^"]*)">(.*?)</tr>', text))
        assert sorted(rows) == [shown, "beat"]
        nightly, beat = rows[shown], rows["beat"]
        assert "<code>0 2 * * *</code> (Europe/Berlin)" in nightly and "active" in nightly
        assert console.fmt_ms(next_ms[nasty]) in nightly
        assert "every 60000 ms" in beat and 'class="badge paused"' in beat
        assert console.fmt_ms(next_ms["beat"]) in beat and ">all<" in beat
        # A paused schedule offers Resume, an active one Pause; both Delete.
        assert 'data-action="schedule-resume" data-schedule="beat"' in beat
        assert 'data-action="schedule-pause"' in nightly
        assert (
            'data-action="schedule-delete"' in beat and 'data-action="schedule-delete"' in nightly
        )
        assert '<a href="/schedules">Schedules</a>' in text


async def test_the_schedules_page_without_schedules_says_so_and_offers_the_form():
    async with console_server() as b:
        status, text, _ = await b.request("GET", "/schedules")
        assert status == 200
        assert '<p id="no-schedules">No schedules yet.</p>' in text
        assert 'id="schedules"' not in text
        assert '<form id="schedule-form" class="form"><fieldset>' in text


async def test_a_viewer_sees_the_schedule_controls_disabled_and_an_operator_cannot_delete():
    async with console_server(admin__keys=KEYS_TOML) as b:
        status, body, _ = await b.api.call("PUT", "/schedules/beat", BEAT, key=ADMIN_KEY)
        assert status == 201, body
        for name, key, enabled in (
            ("vera", VIEWER_KEY, set()),
            ("otto", OPERATOR_KEY, {"schedule-pause"}),
            ("ada", ADMIN_KEY, {"schedule-pause", "schedule-delete"}),
        ):
            await b.login(name, key)
            status, text, _ = await b.request("GET", "/schedules")
            assert status == 200, name
            buttons = re.findall(
                r'<button class="act[^"]*" data-action="([^"]*)"[^>]*?( disabled)?>', text
            )
            assert sorted(a for a, _ in buttons) == ["schedule-delete", "schedule-pause"], name
            assert {a for a, off in buttons if not off} == enabled, (name, buttons)
            # Creating one is an admin's (put_schedule).
            form_off = "<fieldset disabled>" in text.split('id="schedule-form"')[1]
            assert form_off == (name != "ada"), name


async def test_the_queue_page_shows_the_queues_flow_control():
    async with console_server() as b:
        await enqueue_native(b.api, "plain", 1)
        _status, text, _ = await b.request("GET", "/queues/plain")
        assert '<td data-field="max_in_flight">unlimited</td>' in text
        assert '<td data-field="rate_limit">unlimited</td>' in text
        assert '<td data-field="weight">1</td>' in text
        overrides = {"max_in_flight": 5, "rate_limit_jobs": 10, "rate_limit_per_ms": 1000}
        status, body, _ = await b.api.call("PUT", "/queues/limited", {"overrides": overrides})
        assert status == 201, body
        _status, text, _ = await b.request("GET", "/queues/limited")
        assert '<td data-field="max_in_flight">5</td>' in text
        assert '<td data-field="rate_limit">10 jobs per 1000 ms</td>' in text


# -- payload decoding: one test per row --------------------------------------------------------


def test_payload_row_json_encoding_and_valid_json_is_pretty_printed():
    assert payload_view(b'{"a":[1,2]}', "application/json") == (
        "json",
        '{\n  "a": [\n    1,\n    2\n  ]\n}',
    )


def test_payload_row_json_encoding_but_not_json_is_shown_as_text():
    assert payload_view(b"{oops", "application/json") == ("text", "{oops")


def test_payload_row_text_encoding_and_utf8_is_text():
    assert payload_view("grüße\n".encode(), "text/plain; charset=utf-8") == ("text", "grüße\n")


def test_payload_row_binary_or_undecodable_is_a_hex_dump():
    kind, text = payload_view(b"\x00\xffAB", "application/octet-stream")
    assert kind == "hex" and text.startswith("00000000  00 ff 41 42") and text.endswith("..AB")
    assert payload_view(b"\xff\xfe", "text/plain")[0] == "hex"


# -- stats history -----------------------------------------------------------------------------


class _FakeMetrics:
    def __init__(self) -> None:
        self.enqueued: dict[str, int] = {}


class _FakeService:
    def __init__(self, history_ms: int) -> None:
        self.history_ms = history_ms
        self.engine: object | None = None
        self.metrics = _FakeMetrics()

        class Config:
            def get(_self, section: str, key: str) -> int:
                return history_ms

        self.config = Config()


def test_the_history_is_bounded_by_stats_history_ms_and_averaged_down_to_the_spark_points():
    history = StatsHistory(_FakeService(120_000))  # type: ignore[arg-type]
    assert history.capacity == 120
    ring = history.rings["q"] = console.array("i", bytes(4 * 120))
    for second in range(300):  # more samples than the ring holds
        ring[second % 120] = second
        history.samples += 1
    series = history.series("q", 60_000)
    assert series == list(range(240, 300))
    # A window longer than the history is the history; 120 points fit unaveraged.
    assert history.series("q", 21_600_000) == list(range(180, 300))


def test_the_history_never_keeps_more_than_six_hours():
    assert StatsHistory(_FakeService(10**9)).capacity == 6 * 3600  # type: ignore[arg-type]


# -- the job's timeline from the log -----------------------------------------------------------


def _timeline_events(text: str) -> list[str]:
    match = re.search(r'<ol id="timeline"[^>]*>(.*?)</ol>', text, re.S)
    assert match is not None, text
    return re.findall(r'<li data-event="([A-Za-z]+)">', match.group(1))


async def test_the_job_page_shows_the_jobs_whole_life_from_the_log():
    async with console_server() as b:
        (job_id,) = await enqueue_native(b.api, "q", 1)
        client = await connect(address_of(b.api.server))
        try:
            (delivered,) = await client.reserve(["q"])
            await client.nack(delivered, reason="boom")
        finally:
            await client.close()
        api = b.api
        status, body, _ = await api.call(
            "POST", "/queues/q/jobs:dead-letter", {"ids": [job_id], "reason": "triage"}
        )
        assert status == 200, body
        status, body, _ = await api.call(
            "POST", "/queues/q/dead-letters:requeue", {"ids": [job_id]}
        )
        assert status == 200, body
        status, text, _ = await b.request("GET", f"/jobs/{job_id}")
        assert status == 200
        assert _timeline_events(text) == [
            "JobEnqueued",
            "JobReserved",
            "JobNacked",
            "AdminAction",
            "JobDeadLettered",
            "AdminAction",
            "DeadLetterRequeued",
        ]
        assert "<b>reason</b>=boom" in text  # the nack's reason
        assert "<b>actor</b>=local" in text and "<b>reason</b>=triage" in text
        assert "<b>cause</b>=admin" in text  # the cause by name
        assert "earlier events" not in text


async def test_an_acked_job_has_no_state_but_its_page_still_shows_its_history():
    async with console_server() as b:
        (job_id,) = await enqueue_native(b.api, "q", 1)
        client = await connect(address_of(b.api.server))
        try:
            (delivered,) = await client.reserve(["q"])
            await client.ack(delivered)
        finally:
            await client.close()
        status, text, _ = await b.request("GET", f"/jobs/{job_id}")
        assert status == 200 and "This job is gone" in text
        assert _timeline_events(text) == ["JobEnqueued", "JobReserved", "JobAcked"]


async def test_the_timeline_is_capped_at_max_entries_and_says_so():
    async with console_server() as b:
        (job_id,) = await enqueue_native(b.api, "q", 1)
        client = await connect(address_of(b.api.server))
        try:
            for _ in range(2):
                (delivered,) = await client.reserve(["q"])
                await client.nack(delivered, reason="again")
        finally:
            await client.close()
        service = b.api.server.service
        timeline = await job_timeline(service, job_id, max_entries=3)
        assert timeline.capped and [e.name for e in timeline.entries] == [
            "JobEnqueued",
            "JobReserved",
            "JobNacked",
        ]
        full = await job_timeline(service, job_id)
        assert not full.capped and len(full.entries) == 5 and full.complete
        assert (await job_timeline(service, "no-such-job")).entries == []


def test_a_sample_records_each_labels_enqueues_of_the_last_second():
    service = _FakeService(60_000)
    service.engine = object()
    history = StatsHistory(service)  # type: ignore[arg-type]
    service.metrics.enqueued["a"] = 5
    history.sample()
    service.metrics.enqueued["a"] = 7
    service.metrics.enqueued["_other"] = 3  # queues past the label limit, summed
    history.sample()
    history.sample()
    assert history.series("a", 60_000) == [5, 2, 0]
    assert history.series("_other", 60_000) == [0, 3, 0]
    assert sorted(history.rings) == ["_other", "a"]  # one ring per label, not per queue


async def test_the_session_cookie_is_secure_when_the_listener_terminates_tls(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = self_signed_certificate(tmp_path / "cert.pem", tmp_path / "key.pem")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    config = in_process_config(admin__keys=KEYS_TOML)
    async with in_process(config) as server, aiohttp.ClientSession() as session:
        runner = web.AppRunner(build_app(server.service, api=True), handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            async with session.post(
                f"https://127.0.0.1:{port}/login",
                data={"name": "ada", "key": ADMIN_KEY},
                headers={"Sec-Fetch-Site": "same-origin"},
                allow_redirects=False,
                ssl=False,
            ) as response:
                assert response.status == 302
                set_cookie = response.headers["Set-Cookie"]
        finally:
            await runner.cleanup()
    assert "Secure" in set_cookie and "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
