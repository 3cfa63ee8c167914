"""Auth of the admin HTTP API (issue 15, item 4): who asks, and may they.

Owns: the middleware for every path under API_PREFIX (`api_middleware`): it
turns `Authorization: Bearer <key>` into a `Principal` (the key's name and role)
before any handler runs, and renders every refusal under the prefix as JSON
(`{"error": {"code", "message"}}`, `ApiError`); `principal_of(request)` and
`require(request, operation)` for the handlers (and the other admin modules:
audit, events, backup).

Decision table (`authenticate`, one test per row in tests/server/test_admin_api.py):

| admin keys configured | Authorization header           | result                      |
|-----------------------|--------------------------------|-----------------------------|
| none, loopback listener | anything                     | Principal("local", "admin") |
| none, other listener  | anything                       | 401 (keys were removed by a reload: fails closed, restart required) |
| some                  | missing / not `Bearer <key>`   | 401, `WWW-Authenticate: Bearer` |
| some                  | a key that is none of them     | 401, `WWW-Authenticate: Bearer` |
| some                  | one of them                    | Principal(its name, its role) |

Then a role too low for the operation is 403: the service's admin methods
refuse with PermissionDenied (ROLE_REQUIRED), and routes that call none of them
call `require`. 401 and 403 never mix: an unknown key is never told whether it
would have had the role.

Promises: the key table is read from `service.admin_keys` on every request (a
tuple a hot reload replaces whole); the presented key is compared with every
configured key by `hmac.compare_digest`, with no early exit, so the time taken
tells nothing about which key matched or how much of one; keys never appear in a
log line, an answer or the audit trail (the key's name does). /livez, /readyz and
/metrics are outside the prefix and need no auth.

Must not import: storage, the native wire, the client.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from aiohttp import web

from sepp.server.service import LOCAL_ADMIN, ROLE_REQUIRED, Principal, SeppService, role_allows

API_PREFIX = "/admin/api/v1"

SERVICE_KEY = web.AppKey("sepp_service", SeppService)
# Whether the listener is bound to a loopback address (set by build_app).
LOOPBACK_KEY = web.AppKey("sepp_admin_loopback", bool)
# Where the middleware puts the request's Principal (aiohttp < 3.12 has no
# RequestKey: a string key there).
PRINCIPAL_KEY: Any = (
    web.RequestKey("sepp_principal", Principal) if hasattr(web, "RequestKey") else "sepp_principal"
)

BEARER = "bearer"
# WWW-Authenticate of a 401 (RFC 6750): the scheme, the realm, and for a key
# that was sent but is not known, error="invalid_token".
REALM = 'Bearer realm="sepp admin"'


class AdminKeyLike(Protocol):
    """One [admin] keys entry (sepp.server.config.AdminKey)."""

    @property
    def name(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def role(self) -> str: ...


class ApiError(Exception):
    """A refusal of the admin API: rendered as `{"error": {"code", "message"}}`
    with `status` (and `headers`) by the middleware."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        headers: dict[str, str] | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}
        self.details = details or {}


def error_response(error: ApiError) -> web.Response:
    body: dict[str, Any] = {"code": error.code, "message": error.message, **error.details}
    return web.Response(
        status=error.status,
        text=json.dumps({"error": body}),
        content_type="application/json",
        headers=error.headers,
    )


def is_loopback_address(host: str) -> bool:
    """True for a loopback IP address (127.0.0.0/8, ::1) or "localhost"."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def bearer_token(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header, or None (no header,
    another scheme, an empty key)."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != BEARER or not token:
        return None
    return token


def match_key(
    keys: Sequence[AdminKeyLike],
    presented: str,
    compare: Callable[[bytes, bytes], bool] = hmac.compare_digest,
) -> AdminKeyLike | None:
    """The configured key equal to `presented`, compared with every one of
    `keys` in constant time (no early exit: the loop always runs to the end)."""
    candidate = presented.encode("utf-8", "surrogatepass")
    found: AdminKeyLike | None = None
    for entry in keys:
        if compare(candidate, entry.key.encode("utf-8", "surrogatepass")) and found is None:
            found = entry
    return found


def authenticate(
    keys: Sequence[AdminKeyLike], authorization: str | None, loopback: bool
) -> Principal:
    """The decision table above: a Principal, or ApiError 401."""
    if not keys:
        if loopback:
            return LOCAL_ADMIN
        raise ApiError(
            401,
            "unauthenticated",
            "this admin listener is not on a loopback address and has no admin keys "
            "(admin.keys was emptied): restart required",
            {"WWW-Authenticate": REALM},
        )
    presented = bearer_token(authorization)
    if presented is None:
        raise ApiError(
            401,
            "unauthenticated",
            "send an admin key: Authorization: Bearer <key>",
            {"WWW-Authenticate": REALM},
        )
    entry = match_key(keys, presented)
    if entry is None:
        raise ApiError(
            401,
            "unauthenticated",
            "unknown admin key",
            {"WWW-Authenticate": REALM + ', error="invalid_token"'},
        )
    return Principal(entry.name, entry.role)


def principal_of(request: web.Request) -> Principal:
    """Who sent `request` (set by the middleware for every path under the prefix)."""
    principal = request.get(PRINCIPAL_KEY)
    if not isinstance(principal, Principal):
        raise RuntimeError(f"{request.path} is not under {API_PREFIX}: no principal")
    return principal


def forbidden(principal: Principal, operation: str) -> ApiError:
    return ApiError(
        403,
        "permission_denied",
        f"{operation} needs role {ROLE_REQUIRED[operation]}; "
        f"{principal.actor} has role {principal.role}",
    )


def require(request: web.Request, operation: str) -> Principal:
    """The request's principal, if its role may perform `operation` (a
    ROLE_REQUIRED key); else ApiError 403."""
    principal = principal_of(request)
    if not role_allows(principal.role, operation):
        raise forbidden(principal, operation)
    return principal


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# The console's session lookup (console.session_principal): the principal of the
# request's session cookie, or None; raises ApiError for a cross-site mutation.
SessionLookup = Callable[[web.Request], "Principal | None"]
SESSION_LOOKUP_KEY: web.AppKey[SessionLookup] = web.AppKey("sepp_session_lookup")


@web.middleware
async def api_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Auth first (before the body is read: a 401 never reads a large body), then
    the handler; every refusal under the prefix becomes a JSON error."""
    if not (request.path == API_PREFIX or request.path.startswith(API_PREFIX + "/")):
        return await handler(request)
    app = request.app
    try:
        # A browser's session cookie (the console, console.py) when it sends no
        # Authorization header; it refuses a browser's cross-site mutation (403).
        lookup = app.get(SESSION_LOOKUP_KEY)
        session = lookup(request) if lookup is not None else None
        request[PRINCIPAL_KEY] = session or authenticate(
            app[SERVICE_KEY].admin_keys, request.headers.get("Authorization"), app[LOOPBACK_KEY]
        )
        if app[SERVICE_KEY].engine is None:
            # The listener starts before recovery (/readyz says 503 "recovering"):
            # nothing to read or change yet.
            raise ApiError(503, "unavailable", "the server is recovering its data")
        return await handler(request)
    except ApiError as error:
        return error_response(error)
    except web.HTTPException as exc:
        # aiohttp's own: an unknown path (404), a method not allowed (405), a
        # body over client_max_size (413).
        if exc.status < 400:
            raise
        code = {
            404: "not_found",
            405: "method_not_allowed",
            413: "payload_too_large",
        }.get(exc.status, "invalid_argument")
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return error_response(ApiError(exc.status, code, exc.reason, headers))
