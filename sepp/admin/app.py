"""The admin HTTP listener: an aiohttp app in the server's own event loop.

Owns: `AdminListener` (bind, start, stop), the route table (`build_app`): the
admin API under /admin/api/v1 (api.py, behind auth.py's middleware; on the admin
listener only), and the routes that need no auth:
- `GET /livez`: 200 while the process answers;
- `GET /readyz`: 200 once recovery is done and while serving; 503 (with the
  reason as text) while recovery runs ("recovering": the listener starts before
  it, SeppServer.start), once shutdown began or storage failed; the admin API
  answers 503 too until recovery is done;
- `GET /metrics`: Prometheus text (metrics.py), read at scrape time.

Promises: a request never waits for storage or for the commit pipeline; the
listener closes at the end of shutdown, so /readyz answers 503 while it runs.
Started only by SeppServer.start when [admin] listen_addr is not "off"; a
non-loopback address without admin keys never gets here (config.py refuses it;
if a reload empties the keys later, auth.py answers 401: it fails closed).
"""

from __future__ import annotations

import logging
import socket
import ssl

from aiohttp import web

from sepp.admin.api import add_api_routes
from sepp.admin.audit import audit_handler
from sepp.admin.auth import (
    API_PREFIX,
    LOOPBACK_KEY,
    SERVICE_KEY,
    api_middleware,
    is_loopback_address,
)
from sepp.admin.backup import add_backup_routes
from sepp.admin.console import add_console_routes, console_headers
from sepp.admin.events import EVENTS_KEY, events_handler
from sepp.admin.metrics import CONTENT_TYPE, metrics_registry, render_metrics
from sepp.server.service import SeppService

log = logging.getLogger("sepp.admin")

# True when the listener serving the app terminates TLS ([admin] tls_cert_path).
TLS_KEY = web.AppKey("sepp.tls", bool)


def build_app(service: SeppService, *, api: bool = False, loopback: bool = True) -> web.Application:
    """The app of one listener: /livez, /readyz, /metrics, and with `api` the
    admin API (`loopback`: the listener's address is a loopback one, which a
    server without admin keys needs, auth.py). A request body may be at most
    limits.max_message_bytes (413 past it), like a native frame."""
    registry = metrics_registry(service)

    async def livez(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        if service.engine is None:
            return web.Response(status=503, text="recovering\n")
        health = service.health()
        if not health.serving:
            return web.Response(status=503, text=f"{health.reason}\n")
        return web.Response(text="ready\n")

    async def metrics(request: web.Request) -> web.Response:
        body = render_metrics(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    app = web.Application(
        middlewares=[console_headers, api_middleware],
        client_max_size=service.config.get("limits", "max_message_bytes"),
    )
    app[SERVICE_KEY] = service
    app[LOOPBACK_KEY] = loopback
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    if api:
        # The admin API: every route under API_PREFIX is authenticated by
        # api_middleware and checks its role (auth.require or the service). Each
        # module adds its own routes here (the audit trail, the event stream and
        # the backup come next to these).
        add_api_routes(app, API_PREFIX)
        app.router.add_get(API_PREFIX + "/audit", audit_handler(service))
        events = app[EVENTS_KEY] = events_handler(service)
        app.router.add_get(API_PREFIX + "/events", events.handle)
        app.on_shutdown.append(events.on_shutdown)  # ends the streams
        add_backup_routes(app, service)
        add_console_routes(app, service)  # the web console (console.py): /, /jobs/...
    return app


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 = any free port."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class AdminListener:
    """The admin app on one address, in the running loop. `name` ("admin", or
    "metrics" for the metrics-only listener of [metrics] listen_addr) names it in
    log lines and errors; both serve the routes that need no auth, and only
    "admin" the admin API."""

    def __init__(
        self, service: SeppService, name: str = "admin", ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.service = service
        self.name = name
        # [admin] tls_cert_path / tls_key_path: the listener terminates TLS (https).
        self.ssl_context = ssl_context
        self.address: tuple[str, int] | None = None
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen; returns the bound (host, port). Raises OSError."""
        sock = bind_socket(host, port)
        app = build_app(
            self.service,
            api=self.name == "admin",
            loopback=is_loopback_address(sock.getsockname()[0]),
        )
        # Whether this listener terminates TLS (a session cookie is then Secure).
        app[TLS_KEY] = self.ssl_context is not None
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        try:
            await runner.setup()
            await web.SockSite(runner, sock, ssl_context=self.ssl_context).start()
        except BaseException:
            await runner.cleanup()
            sock.close()
            raise
        self._runner = runner
        bound = sock.getsockname()
        self.address = (bound[0], bound[1])
        tls = " (TLS)" if self.ssl_context is not None else ""
        log.info("%s listening on %s:%d%s", self.name, *self.address, tls)
        return self.address

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
