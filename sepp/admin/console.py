"""The web console (issue 16): server-rendered pages on the admin listener.

Owns: the page routes (`add_console_routes`: `/` dashboard, `/queues/{name}`,
`/jobs/{id}`, `/dead-letters`, `/schedules`, `/enqueue`, `/audit`, `/search`, `/login`,
`/logout`, `/console/history`, `/static/console.{js,css}`), the browser sessions
(`SessionStore`), the cross-site check of cookie-authenticated mutations
(`same_origin`), and the in-memory stats history of the dashboard
(`StatsHistory`, `[admin] stats_history_ms`).

Pages are HTML built from Python strings; every value from a job, a queue or a
request goes through `esc` (html.escape). One static JavaScript module
(static/console.js) does the live parts: the dashboard's EventSource on
/admin/api/v1/events, the window picker, and every mutation, which it sends to
the JSON admin API (api.py) with the session cookie: the console keeps no rule of
its own, the service's role table and the core's validation answer. The schedules
page (issue 17) lists every schedule with its next fire time; its Pause / Resume /
Delete buttons and its create form go to /admin/api/v1/schedules/{name} the same
way (a control the role may not use is drawn disabled, as on every page). Every page
carries a Content-Security-Policy that allows only this origin's script and
styles and no inline script, and no request leaves the origin. Written for current
Chromium and Firefox; tests/server/test_console_browser.py runs every page in
both and fails on any console error, an uncaught promise rejection included
(Firefox reports one for a fetch cut short by a navigation, Chromium does not).

Sessions: `POST /login` with a key's name and key sets `sepp_session`
(HttpOnly; SameSite=Strict; Path=/; Secure when the listener terminates TLS),
valid for `[admin] session_ttl_ms`, kept in memory (a restart logs everyone out).
A session stays valid only while its key's name and secret are unchanged in the
live key table (changing a key's secret ends its sessions); the role is read
live. A failed login is answered after LOGIN_FAILURE_DELAY_S. A request that
presents `Authorization` is authenticated by its Bearer key only (scripts);
without keys on a loopback listener everyone is the local admin (no login).

Cross-site: a mutation (any method but GET/HEAD/OPTIONS) authenticated by the
cookie is refused (403) unless `Sec-Fetch-Site` is same-origin / none, or, when
the browser sends no Sec-Fetch-Site, `Origin` is this listener's own origin.

Must not import: storage, the native wire, the client.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import json
import logging
import secrets
import time
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

from aiohttp import web

from sepp.admin.auth import (
    LOOPBACK_KEY,
    SERVICE_KEY,
    SESSION_LOOKUP_KEY,
    ApiError,
    Handler,
    bearer_token,
    match_key,
)
from sepp.core.events import CAUSE_NAMES
from sepp.core.reads import JobInfo, JobPage, QueueInfo, ScheduleInfo
from sepp.core.results import CommandError
from sepp.server.job_timeline import Timeline, job_timeline
from sepp.server.service import LOCAL_ADMIN, Principal, SeppService, role_allows

log = logging.getLogger("sepp.admin")

__all__ = [
    "CSP",
    "LOGIN_FAILURE_DELAY_S",
    "SESSIONS_KEY",
    "SESSION_COOKIE",
    "SessionStore",
    "StatsHistory",
    "add_console_routes",
    "payload_view",
    "same_origin",
]

SESSION_COOKIE = "sepp_session"
LOGIN_FAILURE_DELAY_S = 0.5
SESSION_TTL_MS_DEFAULT = 12 * 3600 * 1000
STATS_HISTORY_MS_DEFAULT = 3600 * 1000
STATS_HISTORY_MS_MAX = 6 * 3600 * 1000
STATS_SAMPLE_INTERVAL_S = 1.0
# Points a sparkline is drawn with at most (a longer window is averaged down).
SPARK_POINTS_MAX = 120
WINDOWS_MS = (60_000, 300_000, 900_000, 3_600_000, 21_600_000)
WINDOW_LABELS = ("1 min", "5 min", "15 min", "1 h", "6 h")
PAGE_LIMIT = 50
# Bytes of a payload shown on a job page (the rest is cut, and said so).
PAYLOAD_SHOWN_BYTES_MAX = 64 * 1024
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; "
    "object-src 'none'"
)
STATES = (("ready", "Ready"), ("scheduled", "Scheduled"), ("inflight", "In flight"))
CAUSES = ("attempts_exhausted", "rejected", "lease_expired", "admin")


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def setting(service: SeppService, key: str, default: int) -> int:
    """An [admin] setting, read live (a hot reload replaces the config)."""
    try:
        value = service.config.get("admin", key)
    except KeyError:
        return default
    return default if value is None else int(value)


# -- sessions ------------------------------------------------------------------------------


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


@dataclass
class Session:
    name: str
    key_digest: bytes
    expires_ms: int


class SessionStore:
    """Browser sessions in memory: token -> Session."""

    def __init__(self, service: SeppService) -> None:
        self.service = service
        self.sessions: dict[str, Session] = {}

    def login(self, name: str, key: str) -> str | None:
        """A new session's token for a key whose name is `name`, or None."""
        entry = match_key(self.service.admin_keys, key)
        if entry is None or not secrets.compare_digest(entry.name, name):
            return None
        self._expire()
        token = secrets.token_urlsafe(32)
        ttl = setting(self.service, "session_ttl_ms", SESSION_TTL_MS_DEFAULT)
        self.sessions[token] = Session(entry.name, _digest(entry.key), self.service.now_ms() + ttl)
        return token

    def principal(self, token: str | None) -> Principal | None:
        """The live principal of a session, or None (unknown, expired, its key
        renamed, changed or removed)."""
        if not token:
            return None
        session = self.sessions.get(token)
        if session is None:
            return None
        if self.service.now_ms() >= session.expires_ms:
            del self.sessions[token]
            return None
        for entry in self.service.admin_keys:
            if entry.name == session.name and secrets.compare_digest(
                _digest(entry.key), session.key_digest
            ):
                return Principal(entry.name, entry.role)
        del self.sessions[token]
        return None

    def logout(self, token: str | None) -> None:
        if token:
            self.sessions.pop(token, None)

    def _expire(self) -> None:
        now = self.service.now_ms()
        for token in [t for t, s in self.sessions.items() if now >= s.expires_ms]:
            del self.sessions[token]


SESSIONS_KEY = web.AppKey("sepp_console_sessions", SessionStore)


def same_origin(request: web.Request) -> bool:
    """Whether a browser sent `request` from this listener's own pages."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = request.headers.get("Origin")
    if origin is None:
        return False
    return origin == f"{request.scheme}://{request.host}"


def session_principal(request: web.Request) -> Principal | None:
    """The principal of the request's session cookie (auth.py's middleware asks
    this when no Authorization header is sent); ApiError 403 for a cross-site
    mutation."""
    if "Authorization" in request.headers:
        return None
    # A cookie (or, without keys, the loopback listener itself) would let a page
    # of another site act: only a browser sends a cookie or Sec-Fetch-Site.
    if (
        request.method not in SAFE_METHODS
        and not same_origin(request)
        and (SESSION_COOKIE in request.cookies or "Sec-Fetch-Site" in request.headers)
    ):
        raise ApiError(403, "permission_denied", "cross-site request refused")
    if not request.app[SERVICE_KEY].admin_keys:
        return None
    return request.app[SESSIONS_KEY].principal(request.cookies.get(SESSION_COOKIE))


def page_principal(request: web.Request) -> Principal | None:
    """Who looks at a page: the local admin (no keys, loopback listener), a
    session, or a Bearer key; None when nobody (the page redirects to /login)."""
    service = request.app[SERVICE_KEY]
    keys = service.admin_keys
    if not keys:
        return LOCAL_ADMIN if request.app[LOOPBACK_KEY] else None
    token = bearer_token(request.headers.get("Authorization"))
    if token is not None:
        entry = match_key(keys, token)
        return None if entry is None else Principal(entry.name, entry.role)
    return request.app[SESSIONS_KEY].principal(request.cookies.get(SESSION_COOKIE))


# -- stats history -------------------------------------------------------------------------


class StatsHistory:
    """Per queue, the jobs enqueued in each second, for `stats_history_ms` (at
    most 6 h) in a ring of int32 (101 labels x 6 h: 8.7 MB at most). Sampled once
    a second by a task of the listener's app (from the counters /events reads)."""

    def __init__(self, service: SeppService) -> None:
        self.service = service
        self.rings: dict[str, array[int]] = {}  # queue label -> ring of per-second counts
        self.last: dict[str, int] = {}
        self.samples = 0
        self.capacity = self._capacity()
        self._task: asyncio.Task[None] | None = None

    def _capacity(self) -> int:
        ms = min(
            STATS_HISTORY_MS_MAX,
            setting(self.service, "stats_history_ms", STATS_HISTORY_MS_DEFAULT),
        )
        return max(60, int(ms / 1000 / STATS_SAMPLE_INTERVAL_S))

    def sample(self) -> None:
        capacity = self._capacity()
        if capacity != self.capacity:
            self.rings.clear()
            self.capacity = capacity
            self.samples = 0
        if self.service.engine is None:
            return
        # Keyed like /metrics and /events: the first QUEUE_LABELS_MAX queues that
        # enqueued, then "_other" -- so the history is bounded however many queues.
        enqueued = self.service.metrics.enqueued
        slot = self.samples % self.capacity
        for name, total in enqueued.items():
            ring = self.rings.get(name)
            if ring is None:
                ring = self.rings[name] = array("i", bytes(4 * self.capacity))
                self.last[name] = 0  # counted since start: the first second shows them
            ring[slot] = min(total - self.last[name], 2**31 - 1)
            self.last[name] = total
        self.samples += 1

    def series(self, queue: str, window_ms: int) -> list[int]:
        """The enqueues per second of `queue` over the last `window_ms`, averaged
        down to at most SPARK_POINTS_MAX points (oldest first)."""
        ring = self.rings.get(queue)
        count = min(self.samples, self.capacity, max(1, int(window_ms / 1000)))
        if ring is None or count == 0:
            return []
        end = self.samples
        values = [ring[i % self.capacity] for i in range(end - count, end)]
        step = max(1, -(-len(values) // SPARK_POINTS_MAX))
        return [
            round(sum(values[i : i + step]) / len(values[i : i + step]))
            for i in range(0, len(values), step)
        ]

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            try:
                self.sample()
            except Exception:  # a bug here must not end the dashboard's history
                log.exception("stats history sample failed")
            due += STATS_SAMPLE_INTERVAL_S
            await asyncio.sleep(max(0.0, due - loop.time()))

    async def start(self, app: web.Application) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self, app: web.Application) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


HISTORY_KEY = web.AppKey("sepp_console_history", StatsHistory)


def sparkline(values: list[int], width: int = 120, height: int = 28) -> str:
    """An inline SVG polyline of `values` (the JS redraws it the same way)."""
    top = max(values) if values else 0
    n = len(values)
    points = " ".join(
        f"{round(i * width / max(1, n - 1), 1)},{round(height - (v / top * height if top else 0), 1)}"
        for i, v in enumerate(values)
    )
    return (
        f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="enqueued per second"><polyline points="{points}"/></svg>'
    )


# -- payloads ------------------------------------------------------------------------------


def hex_dump(data: bytes) -> str:
    lines = []
    for offset in range(0, len(data), 16):
        chunk = data[offset : offset + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:08x}  {hexes:<47}  {text}")
    return "\n".join(lines)


def payload_view(data: bytes, encoding: str | None) -> tuple[str, str]:
    """(kind, text) of a payload: "json" pretty-printed when its encoding says
    JSON and it parses, "text" when it is UTF-8 text, else "hex" (a dump)."""
    enc = (encoding or "").lower()
    if "json" in enc:
        try:
            return "json", json.dumps(json.loads(data), indent=2, ensure_ascii=False)
        except (ValueError, RecursionError):
            pass
    if enc.startswith("text/") or "json" in enc or "xml" in enc or enc in ("", "utf-8"):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return "hex", hex_dump(data)
        if all(ch.isprintable() or ch in "\n\r\t" for ch in text):
            return "text", text
    return "hex", hex_dump(data)


# -- pages ---------------------------------------------------------------------------------


def fmt_ms(ms: int | None) -> str:
    if ms is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def layout(title: str, principal: Principal, body: str, *, query: str = "") -> str:
    can_mutate = "true" if role_allows(principal.role, "requeue_dead_letters") else "false"
    nav = [
        ("/", "Dashboard"),
        ("/dead-letters", "Dead letters"),
        ("/schedules", "Schedules"),
        ("/enqueue", "Enqueue"),
    ]
    if role_allows(principal.role, "audit"):
        nav.append(("/audit", "Audit"))
    links = "".join(f'<a href="{href}">{label}</a>' for href, label in nav)
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · sepp</title>"
        '<link rel="icon" href="data:,">'
        '<link rel="stylesheet" href="/static/console.css">'
        '<script type="module" src="/static/console.js"></script></head>'
        f'<body data-role="{esc(principal.role)}" data-operator="{can_mutate}">'
        '<header><a class="brand" href="/">sepp</a>'
        f'<nav aria-label="main">{links}</nav>'
        '<form class="search" role="search" action="/search" method="get">'
        '<label for="q">Search</label>'
        f'<input id="q" name="q" placeholder="job id, or queue:idempotency key" value="{esc(query)}">'
        '<button type="submit">Go</button></form>'
        f'<span class="who">{esc(principal.actor)} ({esc(principal.role)})</span>'
        '<form method="post" action="/logout"><button type="submit">Log out</button></form>'
        f"</header><main><h1>{esc(title)}</h1>{body}</main>"
        '<dialog id="confirm"><form method="dialog"><p id="confirm-text"></p>'
        '<label for="confirm-reason">Reason (optional)</label><input id="confirm-reason">'
        '<menu><button value="cancel">Cancel</button>'
        '<button value="ok" id="confirm-ok">Confirm</button></menu></form></dialog>'
        '<p id="flash" role="status" aria-live="polite"></p></body></html>'
    )


def html_response(text: str, status: int = 200) -> web.Response:
    return web.Response(
        status=status,
        text=text,
        content_type="text/html",
        headers={"Cache-Control": "no-store"},
    )


def disabled(principal: Principal, operation: str) -> str:
    return "" if role_allows(principal.role, operation) else " disabled"


async def _call(service: SeppService, outcome: tuple[Any, int]) -> Any:
    result, barrier = outcome
    await service.durable(barrier)
    return result


def queue_card(q: QueueInfo, spark: list[int]) -> str:
    paused = ' <span class="badge paused">paused</span>' if q.paused else ""
    name = esc(q.name)
    cells = "".join(
        f'<div><dt>{label}</dt><dd data-field="{field}">{value}</dd></div>'
        for field, label, value in (
            ("ready", "ready", q.ready),
            ("scheduled", "scheduled", q.scheduled),
            ("inflight", "in flight", q.inflight),
            ("dead_letter", "dead", q.dead_letter),
            ("enqueued_per_s", "enq/s", 0),
            ("acked_per_s", "ack/s", 0),
            ("dead_lettered_per_s", "dead/s", 0),
        )
    )
    return (
        f'<section class="card{" is-paused" if q.paused else ""}" data-queue="{name}">'
        f'<h2><a href="/queues/{quote(q.name, safe="")}">{name}</a>'
        f'<span class="pause-mark">{paused}</span></h2>'
        f"<dl>{cells}</dl>{sparkline(spark)}</section>"
    )


async def dashboard(request: web.Request) -> web.StreamResponse:
    principal = _principal_or_login(request)
    service = request.app[SERVICE_KEY]
    queues = await _read(service, service.list_queues(principal))
    history = request.app[HISTORY_KEY]
    window = _int(request.query.get("window"), WINDOWS_MS[0])
    options = "".join(
        f'<option value="{ms}"{" selected" if ms == window else ""}>{label}</option>'
        for ms, label in zip(WINDOWS_MS, WINDOW_LABELS, strict=True)
    )
    cards = "".join(queue_card(q, history.series(q.name, window)) for q in queues)
    body = (
        '<div class="toolbar"><label for="window">Window</label>'
        f'<select id="window">{options}</select>'
        '<span id="live" class="live" aria-live="polite">connecting…</span>'
        '<span id="rates"></span></div>'
        f'<div id="cards" class="cards">{cards}</div>'
        + ("" if queues else '<p id="no-queues">No queues yet.</p>')
    )
    return html_response(layout("Dashboard", principal, body))


async def history_json(request: web.Request) -> web.StreamResponse:
    principal = _principal_or_login(request, api=True)
    del principal
    history = request.app[HISTORY_KEY]
    window = _int(request.query.get("window"), WINDOWS_MS[0])
    body = {name: history.series(name, window) for name in sorted(history.rings)}
    return web.json_response({"window_ms": window, "series": body})


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text else default
    except ValueError:
        return default


async def _read(service: SeppService, outcome: tuple[Any, int]) -> Any:
    result = await _call(service, outcome)
    if isinstance(result, CommandError):
        raise web.HTTPForbidden(text=result.message)
    return result


def _principal_or_login(request: web.Request, *, api: bool = False) -> Principal:
    if request.app[SERVICE_KEY].engine is None:
        raise web.HTTPServiceUnavailable(text="the server is recovering its data")
    principal = page_principal(request)
    if principal is None:
        if api:
            raise web.HTTPUnauthorized()
        target = "/login?" + urlencode({"next": request.path_qs})
        raise web.HTTPFound(target)
    return principal


def job_rows(jobs: Iterable[JobInfo], *, select: bool) -> str:
    rows = []
    for info in jobs:
        jid = esc(info.job_id)
        check = (
            f'<td><input type="checkbox" class="pick" value="{jid}" aria-label="select {jid}"></td>'
            if select
            else ""
        )
        rows.append(
            f'<tr>{check}<td><a href="/jobs/{quote(info.job_id, safe="")}">{jid}</a></td>'
            f"<td>{esc(info.job_type)}</td><td>{info.priority}</td>"
            f"<td>{info.attempt}/{info.max_attempts}</td><td>{esc(fmt_ms(info.enqueued_at))}</td>"
            f"<td>{esc(info.dead_letter_cause or info.worker_id or '')}</td>"
            f"<td>{esc(info.last_reason or '')}</td></tr>"
        )
    head = (
        '<th scope="col"><input type="checkbox" id="pick-all" aria-label="select all"></th>'
        if select
        else ""
    )
    return (
        f'<table class="jobs"><thead><tr>{head}<th scope="col">id</th><th scope="col">type</th>'
        '<th scope="col">priority</th><th scope="col">attempt</th><th scope="col">enqueued</th>'
        '<th scope="col">worker / cause</th><th scope="col">last reason</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def next_link(page: JobPage, params: dict[str, str]) -> str:
    if page.next_cursor is None:
        return ""
    return f'<a class="next" href="?{esc(urlencode({**params, "cursor": page.next_cursor}))}">Next page →</a>'


async def queue_page(request: web.Request) -> web.StreamResponse:
    principal = _principal_or_login(request)
    service = request.app[SERVICE_KEY]
    name = request.match_info["name"]
    q = await _call(service, service.queue_info(principal, name))
    if isinstance(q, CommandError):
        return html_response(layout(name, principal, f"<p>{esc(q.message)}</p>"), 404)
    state = request.query.get("state", "ready")
    if state not in dict(STATES):
        state = "ready"
    cursor = request.query.get("cursor") or None
    page = await _read(service, service.list_jobs(principal, name, state, cursor, PAGE_LIMIT))
    tabs = "".join(
        f'<a href="?state={s}"{" aria-current=page" if s == state else ""}>'
        f"{label} ({getattr(q, s)})</a>"
        for s, label in STATES
    )
    tabs += (
        f'<a href="/dead-letters?queue={quote(name, safe="")}">Dead letters ({q.dead_letter})</a>'
    )
    pending = q.ready + q.scheduled
    qn = esc(name)
    flow = (
        f'<button class="act" data-action="resume" data-queue="{qn}"'
        f"{disabled(principal, 'resume_queue')}>Resume</button>"
        if q.paused
        else f'<button class="act" data-action="pause" data-queue="{qn}"'
        f"{disabled(principal, 'pause_queue')}>Pause</button>"
    )
    mark = '<p class="badge paused" id="paused-mark">paused</p>' if q.paused else ""
    controls = (
        f'<div class="toolbar">{flow}'
        f'<button class="act danger" data-action="purge" data-queue="{qn}" data-count="{pending}"'
        f"{disabled(principal, 'purge_queue')}>Purge ready and scheduled</button>"
        + (
            f'<button class="act" data-action="dead-letter" data-queue="{qn}"'
            f"{disabled(principal, 'dead_letter_jobs')}>Dead-letter selected</button>"
            if state != "dead_letter"
            else ""
        )
        + "</div>"
    )
    body = (
        f"{mark}{controls}{flow_settings(q)}"
        f'<nav class="tabs" aria-label="states">{tabs}</nav>'
        + job_rows(page.jobs, select=True)
        + next_link(page, {"state": state})
    )
    return html_response(layout(f"Queue {name}", principal, body))


def flow_settings(q: QueueInfo) -> str:
    """The queue's flow control in force (issue 17): max_in_flight, the rate
    limit on deliveries and its weight in a fair reserve."""
    policy = q.policy
    in_flight = "unlimited" if policy.max_in_flight is None else str(policy.max_in_flight)
    if policy.rate_limit_jobs is None or policy.rate_limit_per_ms is None:
        rate = "unlimited"
    else:
        rate = f"{policy.rate_limit_jobs} jobs per {policy.rate_limit_per_ms} ms"
    rows = "".join(
        f'<tr><th scope="row">{label}</th><td data-field="{field}">{esc(value)}</td></tr>'
        for field, label, value in (
            ("max_in_flight", "max in flight", in_flight),
            ("rate_limit", "rate limit", rate),
            ("weight", "weight (fair reserve)", policy.weight),
        )
    )
    return f'<table id="flow-control" class="fields" aria-label="flow control">{rows}</table>'


async def dead_letters_page(request: web.Request) -> web.StreamResponse:
    principal = _principal_or_login(request)
    service = request.app[SERVICE_KEY]
    queues = await _read(service, service.list_queues(principal))
    name = request.query.get("queue") or next(
        (q.name for q in queues if q.dead_letter), queues[0].name if queues else ""
    )
    cause = request.query.get("cause") or None
    if cause not in CAUSES:
        cause = None
    queue_options = "".join(
        f'<option value="{esc(q.name)}"{" selected" if q.name == name else ""}>'
        f"{esc(q.name)} ({q.dead_letter})</option>"
        for q in queues
    )
    cause_options = '<option value="">any cause</option>' + "".join(
        f'<option value="{c}"{" selected" if c == cause else ""}>{c}</option>' for c in CAUSES
    )
    filters = (
        '<form class="toolbar" method="get"><label for="dq">Queue</label>'
        f'<select id="dq" name="queue">{queue_options}</select>'
        f'<label for="dc">Cause</label><select id="dc" name="cause">{cause_options}</select>'
        '<button type="submit">Show</button></form>'
    )
    if not name:
        return html_response(layout("Dead letters", principal, filters + "<p>No queues.</p>"))
    cursor = request.query.get("cursor") or None
    page = await _read(
        service, service.list_dead_letters(principal, name, cause, cursor, PAGE_LIMIT)
    )
    qn = esc(name)
    actions = (
        '<div class="toolbar">'
        f'<button class="act" data-action="requeue" data-queue="{qn}"'
        f"{disabled(principal, 'requeue_dead_letters')}>Requeue selected</button>"
        f'<button class="act danger" data-action="delete" data-queue="{qn}"'
        f"{disabled(principal, 'delete_dead_letters')}>Delete selected</button></div>"
    )
    params = {"queue": name, **({"cause": cause} if cause else {})}
    body = filters + actions + job_rows(page.jobs, select=True) + next_link(page, params)
    return html_response(layout("Dead letters", principal, body))


def field_rows(info: JobInfo) -> str:
    rows = []
    for field in JobInfo._fields:
        if field in ("payload_data", "custom"):
            continue
        value = getattr(info, field)
        if field.endswith("_at") and isinstance(value, int):
            shown = f"{fmt_ms(value)} ({value})"
        else:
            shown = "" if value is None else str(value)
        rows.append(
            f'<tr><th scope="row">{esc(field)}</th><td data-field="{esc(field)}">{esc(shown)}</td></tr>'
        )
    return f'<table class="fields">{"".join(rows)}</table>'


def timeline_value(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and name.endswith("_at"):
        return fmt_ms(value)
    if name == "cause" and isinstance(value, int):
        return CAUSE_NAMES.get(value, str(value))
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, dict | list):
        return json.dumps(value, default=repr, ensure_ascii=False)
    return str(value)


def timeline_html(timeline: Timeline) -> str:
    """The job's events from the log, oldest first (job_timeline.py)."""
    items = []
    for entry in timeline.entries:
        details = " ".join(
            f'<span class="kv"><b>{esc(k)}</b>={esc(timeline_value(k, v))}</span>'
            for k, v in entry.fields.items()
            if v is not None
        )
        items.append(
            f'<li data-event="{esc(entry.name)}"><time>{esc(fmt_ms(entry.time_ms))}</time> '
            f"<strong>{esc(entry.name)}</strong> <small>seq {entry.seq}</small> {details}</li>"
        )
    notes = []
    if timeline.entries and not timeline.complete:
        notes.append("<p>The log's retention removed this job's earlier events.</p>")
    if timeline.capped:
        notes.append(f"<p>The first {len(timeline.entries)} events are shown.</p>")
    if not timeline.entries:
        notes.append("<p>No event of this job is in the durable log.</p>")
    return f'<ol id="timeline" class="timeline">{"".join(items)}</ol>{"".join(notes)}'


async def job_page(request: web.Request) -> web.StreamResponse:
    principal = _principal_or_login(request)
    service = request.app[SERVICE_KEY]
    job_id = request.match_info["id"]
    info = await _read(service, service.get_job(principal, job_id))
    timeline = await job_timeline(service, job_id)
    history = "<h2>Timeline</h2>" + timeline_html(timeline)
    if info is None:
        if timeline.entries:
            body = "<p>This job is gone (acked, deleted or drained); its history:</p>" + history
            return html_response(layout(f"Job {job_id}", principal, body))
        body = f"<p>No job {esc(job_id)} (never enqueued, or gone: acked, deleted).</p>"
        return html_response(layout(f"Job {job_id}", principal, body), 404)
    parts = [field_rows(info), history, "<h2>Payload</h2>"]
    if info.payload_data is None:
        parts.append("<p>none</p>")
    else:
        shown = info.payload_data[:PAYLOAD_SHOWN_BYTES_MAX]
        kind, text = payload_view(shown, info.payload_encoding)
        cut = len(info.payload_data) - len(shown)
        parts.append(
            f"<p>{len(info.payload_data)} bytes, {esc(info.payload_encoding or 'no encoding')}, "
            f"shown as {kind}{f' (first {len(shown)} bytes)' if cut else ''}</p>"
            f'<pre id="payload" class="payload {kind}">{esc(text)}</pre>'
        )
    parts.append("<h2>Custom</h2>")
    if info.custom:
        rows = "".join(
            f'<tr><th scope="row">{esc(k)}</th><td>{esc(json.dumps(v, default=repr))}</td></tr>'
            for k, v in sorted(info.custom.items())
        )
        parts.append(f'<table class="custom">{rows}</table>')
    else:
        parts.append("<p>none</p>")
    return html_response(layout(f"Job {job_id}", principal, "".join(parts)))


def schedule_row(info: ScheduleInfo, principal: Principal) -> str:
    name = esc(info.name)
    if info.cron is not None:
        timing = f"<code>{esc(info.cron)}</code> ({esc(info.timezone)})"
    else:
        timing = f"every {esc(info.every_ms)} ms"
    flow = (
        f'<button class="act" data-action="schedule-resume" data-schedule="{name}"'
        f"{disabled(principal, 'resume_schedule')}>Resume</button>"
        if info.paused
        else f'<button class="act" data-action="schedule-pause" data-schedule="{name}"'
        f"{disabled(principal, 'pause_schedule')}>Pause</button>"
    )
    delete = (
        f'<button class="act danger" data-action="schedule-delete" data-schedule="{name}"'
        f"{disabled(principal, 'delete_schedule')}>Delete</button>"
    )
    state = '<span class="badge paused">paused</span>' if info.paused else "active"
    return (
        f'<tr data-schedule="{name}"><td data-field="name">{name}</td>'
        f'<td data-field="queue"><a href="/queues/{quote(info.queue, safe="")}">'
        f"{esc(info.queue)}</a></td>"
        f'<td data-field="job_type">{esc(info.job_type)}</td>'
        f'<td data-field="timing">{timing}</td>'
        f'<td data-field="catch_up">{esc(info.catch_up)}</td>'
        f'<td data-field="state">{state}</td>'
        f'<td data-field="next"><time>{esc(fmt_ms(info.next_ms))}</time></td>'
        f'<td class="actions">{flow}{delete}</td></tr>'
    )


async def schedules_page(request: web.Request) -> web.StreamResponse:
    principal = _principal_or_login(request)
    service = request.app[SERVICE_KEY]
    schedules: tuple[ScheduleInfo, ...] = await _read(service, service.list_schedules(principal))
    rows = "".join(schedule_row(info, principal) for info in schedules)
    table = (
        '<table id="schedules" class="schedules"><thead><tr><th scope="col">name</th>'
        '<th scope="col">queue</th><th scope="col">job type</th>'
        '<th scope="col">cron (time zone) or interval</th><th scope="col">catch-up</th>'
        '<th scope="col">state</th><th scope="col">next fire (UTC)</th>'
        f'<th scope="col">actions</th></tr></thead><tbody>{rows}</tbody></table>'
        if schedules
        else '<p id="no-schedules">No schedules yet.</p>'
    )
    off = disabled(principal, "put_schedule")
    catch_up = "".join(
        f'<option value="{c}"{" selected" if c == "one" else ""}>{c}</option>'
        for c in ("one", "none", "all")
    )
    form = (
        f'<h2>New schedule</h2><form id="schedule-form" class="form"><fieldset{off}>'
        '<label for="s-name">Name</label><input id="s-name" name="name" required>'
        '<label for="s-queue">Queue</label><input id="s-queue" name="queue" required>'
        '<label for="s-type">Job type</label><input id="s-type" name="job_type" required>'
        '<label for="s-cron">Cron (5 fields; or an interval below)</label>'
        '<input id="s-cron" name="cron" placeholder="*/5 * * * *">'
        '<label for="s-tz">Time zone of the cron (IANA)</label>'
        '<input id="s-tz" name="timezone" value="UTC">'
        '<label for="s-every">Or every (ms)</label>'
        '<input id="s-every" name="every_ms" type="number" min="1">'
        '<label for="s-kind">Payload as</label><select id="s-kind" name="kind">'
        '<option value="text">text</option><option value="json">JSON</option>'
        '<option value="base64">base64</option></select>'
        '<label for="s-payload">Payload (empty: none)</label>'
        '<textarea id="s-payload" name="payload" rows="4"></textarea>'
        '<label for="s-encoding">Encoding</label>'
        '<input id="s-encoding" name="encoding" placeholder="text/plain; charset=utf-8">'
        '<label for="s-catch-up">Catch-up of ticks missed while down</label>'
        f'<select id="s-catch-up" name="catch_up">{catch_up}</select>'
        '<button type="submit">Create</button></fieldset>'
        '<p id="schedule-result" role="alert"></p></form>'
    )
    return html_response(layout("Schedules", principal, table + form))


async def enqueue_page(request: web.Request) -> web.StreamResponse:
    principal = _principal_or_login(request)
    off = disabled(principal, "enqueue_jobs")
    queue = esc(request.query.get("queue", ""))
    body = (
        f'<form id="enqueue" class="form"><fieldset{off}>'
        f'<label for="e-queue">Queue</label><input id="e-queue" name="queue" required value="{queue}">'
        '<label for="e-type">Job type</label><input id="e-type" name="job_type" required>'
        '<label for="e-kind">Payload as</label><select id="e-kind" name="kind">'
        '<option value="json">JSON</option><option value="text">text</option>'
        '<option value="base64">base64</option></select>'
        '<label for="e-payload">Payload</label><textarea id="e-payload" name="payload" rows="6"></textarea>'
        '<label for="e-encoding">Encoding</label>'
        '<input id="e-encoding" name="encoding" placeholder="application/json">'
        '<label for="e-priority">Priority (0 to 9)</label>'
        '<input id="e-priority" name="priority" type="number" min="0" max="9" value="0">'
        '<label for="e-max">Max attempts</label><input id="e-max" name="max_attempts" type="number" min="1">'
        '<label for="e-at">Schedule at (UTC)</label><input id="e-at" name="scheduled_at" type="datetime-local">'
        '<label for="e-key">Idempotency key</label><input id="e-key" name="idempotency_key">'
        '<label for="e-custom">Custom (JSON object)</label>'
        '<textarea id="e-custom" name="custom" rows="3" placeholder="{}"></textarea>'
        '<button type="submit">Enqueue</button></fieldset>'
        '<p id="enqueue-result" role="alert"></p></form>'
    )
    return html_response(layout("Enqueue", principal, body))


async def audit_page(request: web.Request) -> web.StreamResponse:
    principal = _principal_or_login(request)
    if not role_allows(principal.role, "audit"):
        body = f"<p>The audit trail needs role admin; {esc(principal.actor)} is {esc(principal.role)}.</p>"
        return html_response(layout("Audit", principal, body), 403)
    actor = request.query.get("actor", "")
    action = request.query.get("action", "")
    body = (
        '<form id="audit-filter" class="toolbar">'
        f'<label for="a-actor">Actor</label><input id="a-actor" name="actor" value="{esc(actor)}">'
        f'<label for="a-action">Action</label><input id="a-action" name="action" value="{esc(action)}">'
        '<button type="submit">Filter</button></form>'
        '<table class="audit"><thead><tr><th scope="col">seq</th><th scope="col">time</th>'
        '<th scope="col">actor</th><th scope="col">role</th><th scope="col">action</th>'
        '<th scope="col">queue</th><th scope="col">ids</th><th scope="col">reason</th></tr></thead>'
        '<tbody id="audit-rows"></tbody></table>'
        '<button id="audit-more" type="button" hidden>Older entries</button>'
    )
    return html_response(layout("Audit", principal, body))


async def search(request: web.Request) -> web.StreamResponse:
    principal = _principal_or_login(request)
    service = request.app[SERVICE_KEY]
    q = request.query.get("q", "").strip()
    if q:
        info = await _read(service, service.get_job(principal, q))
        if info is not None:
            raise web.HTTPFound("/jobs/" + quote(q, safe=""))
        queue, sep, key = q.partition(":")
        if sep:
            found = await _read(service, service.job_by_idempotency_key(principal, queue, key))
            if found is not None:
                raise web.HTTPFound("/jobs/" + quote(found.job_id, safe=""))
    body = (
        f"<p>Nothing found for <code>{esc(q)}</code>: give a job id, or queue:idempotency-key.</p>"
    )
    return html_response(layout("Search", principal, body, query=q), 404)


LOGIN_FORM = (
    '<!doctype html><html lang="en"><head><meta charset="utf-8">'
    '<meta name="viewport" content="width=device-width, initial-scale=1">'
    '<title>Log in · sepp</title><link rel="icon" href="data:,">'
    '<link rel="stylesheet" href="/static/console.css"></head><body class="login">'
    '<main><h1>sepp console</h1><form method="post" action="/login" class="form">'
    '<input type="hidden" name="next" value="{next}">'
    '<label for="name">Name</label><input id="name" name="name" autocomplete="username" required autofocus>'
    '<label for="key">Key</label><input id="key" name="key" type="password" '
    'autocomplete="current-password" required>'
    '<button type="submit">Log in</button><p id="login-error" role="alert">{error}</p>'
    "</form></main></body></html>"
)


def _safe_next(target: str | None) -> str:
    if not target or not target.startswith("/") or target.startswith("//"):
        return "/"
    return target


async def login_page(request: web.Request) -> web.StreamResponse:
    nxt = _safe_next(request.query.get("next"))
    return html_response(LOGIN_FORM.format(next=esc(nxt), error=""))


async def login(request: web.Request) -> web.StreamResponse:
    if not same_origin(request):
        return html_response(LOGIN_FORM.format(next="/", error="cross-site login refused"), 403)
    form = await request.post()
    name, key = str(form.get("name", "")), str(form.get("key", ""))
    nxt = _safe_next(str(form.get("next", "/")))
    token = request.app[SESSIONS_KEY].login(name, key) if name and key else None
    if token is None:
        log.warning("session.login_failed name=%r peer=%s", name, request.remote)
        await asyncio.sleep(LOGIN_FAILURE_DELAY_S)  # a deliberate delay, not a wait
        error = "Unknown name or key."
        return html_response(LOGIN_FORM.format(next=esc(nxt), error=error), 401)
    log.info("session.login name=%r peer=%s", name, request.remote)
    response = web.HTTPFound(nxt)
    ttl_s = setting(request.app[SERVICE_KEY], "session_ttl_ms", SESSION_TTL_MS_DEFAULT) // 1000
    response.set_cookie(
        SESSION_COOKIE,
        token,
        httponly=True,
        samesite="Strict",
        secure=request.secure,
        path="/",
        max_age=ttl_s,
    )
    raise response


async def logout(request: web.Request) -> web.StreamResponse:
    if not same_origin(request):
        raise web.HTTPForbidden(text="cross-site request refused")
    request.app[SESSIONS_KEY].logout(request.cookies.get(SESSION_COOKIE))
    response = web.HTTPFound("/login")
    response.del_cookie(SESSION_COOKIE, path="/")
    raise response


def _static(name: str, content_type: str) -> web.Response:
    data = resources.files("sepp.admin").joinpath("static", name).read_bytes()
    return web.Response(body=data, content_type=content_type, headers={"Cache-Control": "no-cache"})


async def static_js(request: web.Request) -> web.StreamResponse:
    return _static("console.js", "text/javascript")


async def static_css(request: web.Request) -> web.StreamResponse:
    return _static("console.css", "text/css")


@web.middleware
async def console_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The Content-Security-Policy (and friends) on every answer of the listener."""
    response = await handler(request)
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    return response


def add_console_routes(app: web.Application, service: SeppService) -> None:
    """The console's routes, its sessions and its stats history on `app`."""
    app[SESSIONS_KEY] = SessionStore(service)
    app[SESSION_LOOKUP_KEY] = session_principal
    history = app[HISTORY_KEY] = StatsHistory(service)
    app.on_startup.append(history.start)
    app.on_shutdown.append(history.stop)
    r = app.router
    r.add_get("/", dashboard)
    r.add_get("/queues/{name}", queue_page)
    r.add_get("/jobs/{id}", job_page)
    r.add_get("/dead-letters", dead_letters_page)
    r.add_get("/schedules", schedules_page)
    r.add_get("/enqueue", enqueue_page)
    r.add_get("/audit", audit_page)
    r.add_get("/search", search)
    r.add_get("/login", login_page)
    r.add_post("/login", login)
    r.add_post("/logout", logout)
    r.add_get("/console/history", history_json)
    r.add_get("/static/console.js", static_js)
    r.add_get("/static/console.css", static_css)
