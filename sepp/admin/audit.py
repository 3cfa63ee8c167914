"""`GET /admin/api/v1/audit?limit=&before=&actor=&action_prefix=` (admin role): the
operators' actions, newest first, from the log.

Owns: `audit_handler`, the front of `sepp.server.audit_trail.AuditTrail` (which
reads the log without blocking the loop; its docstring has the promises): it
checks the role and the query, and answers
`{"entries": [{seq, time, time_ms, actor, role, action, reason, queue, job_ids,
changes}], "next_before", "truncated_before_seq"}`. `limit` is 1..1000 (default
100); pass `next_before` back as `before`; null means the oldest entry was
reached, and a short page that still has one means the scan was capped.
`truncated_before_seq` is the first seq still in the log when retention deleted
older segments (their actions are gone), else null. 400 for a bad parameter, 403
below the admin role, 500 (logged) when the log cannot be read.

Must not import: storage, log_format, the native wire, the client.
"""

from __future__ import annotations

import logging

from aiohttp import web

from sepp.admin.auth import ApiError, Handler, require
from sepp.server.audit_trail import (
    AUDIT_LIMIT_DEFAULT,
    AUDIT_LIMIT_MAX,
    AuditError,
    AuditTrail,
)
from sepp.server.service import SeppService

log = logging.getLogger("sepp.admin")

__all__ = ["audit_handler"]


# -- the HTTP handler -----------------------------------------------------------------------


def _int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    text = request.query.get(name, "")
    if text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ApiError(
            400, "invalid_argument", f"{name} must be an integer, got {text[:40]!r}"
        ) from None
    if not low <= value <= high:
        raise ApiError(400, "invalid_argument", f"{name} must be in {low}..{high}, got {value}")
    return value


def audit_handler(service: SeppService) -> Handler:
    """The handler of `GET /admin/api/v1/audit?limit=&before=&actor=&action_prefix=`
    (admin role): `{"entries": [...], "next_before", "truncated_before_seq"}`."""
    trail = AuditTrail(service)

    async def audit(request: web.Request) -> web.StreamResponse:
        require(request, "audit")
        limit = _int_param(request, "limit", AUDIT_LIMIT_DEFAULT, 1, AUDIT_LIMIT_MAX)
        before = _int_param(request, "before", 0, 1, 2**63 - 1)
        try:
            page = await trail.page(
                limit=limit,
                before=before or None,
                actor=request.query.get("actor") or None,
                action_prefix=request.query.get("action_prefix") or None,
            )
        except (AuditError, OSError) as exc:
            log.error("audit: the log could not be read: %s", exc)
            raise ApiError(500, "internal", f"the log could not be read: {exc}") from None
        return web.json_response(page.data())

    return audit
