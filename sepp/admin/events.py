"""`GET /admin/api/v1/events`: server-sent events for dashboards (viewer role).

Owns: `EventsHub` (one snapshot a second shared by every open stream),
`EventsRoute` (the aiohttp handler and its shutdown hook) and `events_handler`.

The stream (`text/event-stream`):
- `event: stats`, once every EVENTS_INTERVAL_S (and once at once when a stream
  opens): `{"time_ms", "interval_s", "serving", "durable_seq", "queues": {name:
  {"ready", "scheduled", "inflight", "dead_letter", "paused", "enqueued_per_s",
  "acked_per_s", "dead_lettered_per_s"}}, "rates": {"enqueued", "reserved", "acked", "nacked",
  "dead_lettered", "deduplicated", "rejected", "promoted", "lease_expired",
  "reserve_empty"}}`; rates are per second over the last interval, from the exact
  counters /metrics renders (sepp/server/metrics.py, counted by Engine.observer),
  so they agree with rate(sepp_..._total) over the same window; `queues` is keyed
  by the bounded queue label of /metrics (the first QUEUE_LABELS_MAX queues, then
  "_other" for the rest, summed);
- `event: heartbeat`, when a stream opens and every HEARTBEAT_INTERVAL_S:
  `{"time_ms", "serving"}` (a proxy that drops idle streams sees traffic, and a
  client can tell a stalled server from a quiet one).

Promises:
- One computation per interval however many streams are open (the ticker
  encodes the event once; each stream writes the same bytes); no ticker runs
  while no stream is open.
- A client that goes away is dropped at its next write, without an error log;
  its handler returns and leaves no task behind.
- Shutdown ends every stream (the app's on_shutdown hook), so the listener's
  cleanup never waits for one.
- A slow client slows only its own stream: it is sent the newest snapshot when it
  is ready for one, never a backlog.

Must not import: sepp.server.server (a front end), storage.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web

from sepp.admin.auth import ApiError, require
from sepp.server.service import SeppService

log = logging.getLogger("sepp.admin")

__all__ = [
    "EVENTS_INTERVAL_S",
    "EVENTS_KEY",
    "HEARTBEAT_INTERVAL_S",
    "EventsHub",
    "EventsRoute",
    "events_handler",
]

EVENTS_INTERVAL_S = 1.0
HEARTBEAT_INTERVAL_S = 15.0
# The counters behind "rates" (ServerMetrics attribute names; dicts are summed).
_RATES = (
    "enqueued",
    "reserved",
    "acked",
    "nacked",
    "dead_lettered",
    "deduplicated",
    "rejected",
    "promoted",
    "lease_expired",
    "reserve_empty",
)


def sse(event: str, data: dict[str, Any], event_id: int | None = None) -> bytes:
    """One server-sent event (the data is one JSON line)."""
    head = f"event: {event}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return (head + "data: " + json.dumps(data, separators=(",", ":")) + "\n\n").encode()


class EventsHub:
    """The shared snapshot of the open streams (loop thread only)."""

    def __init__(self, service: SeppService, interval_s: float = EVENTS_INTERVAL_S) -> None:
        self.service = service
        self.interval_s = interval_s
        self.streams = 0
        # Snapshots computed since start (one per interval while streams are open).
        self.computations = 0
        self.tick = 0
        self.payload = b""  # the newest `stats` event, encoded
        self.closed = False
        self._next = asyncio.Event()  # set (and replaced) by each tick and by close
        self._task: asyncio.Task[None] | None = None
        # (loop time, counters) of the previous snapshot, for the rates.
        # (loop time, totals, enqueued, dead-lettered, acked by queue) of the last tick
        self._previous: (
            tuple[float, dict[str, int], dict[str, int], dict[str, int], dict[str, int]] | None
        ) = None

    # -- streams -----------------------------------------------------------------------

    def join(self) -> None:
        self.streams += 1
        if self._task is None and not self.closed:
            self._compute()  # a new stream gets a snapshot at once
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sepp-events")

    def leave(self) -> None:
        self.streams -= 1
        if self.streams == 0 and self._task is not None:
            self._task.cancel()
            self._task = None
            self._previous = None

    async def wait_next(self, seen: int) -> int:
        """Wait for a snapshot newer than tick `seen` (or close); the newest tick."""
        while self.tick <= seen and not self.closed:
            await self._next.wait()
        return self.tick

    def close(self) -> None:
        self.closed = True
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._wake()

    def _wake(self) -> None:
        woken, self._next = self._next, asyncio.Event()
        woken.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            due += self.interval_s
            await asyncio.sleep(max(0.0, due - loop.time()))
            self._compute()

    # -- the snapshot --------------------------------------------------------------------

    def _compute(self) -> None:
        self.computations += 1
        self.tick += 1
        self.payload = sse("stats", self.snapshot(), self.tick)
        self._wake()

    def snapshot(self) -> dict[str, Any]:
        service = self.service
        m = service.metrics
        loop_time = asyncio.get_running_loop().time()
        totals = {name: _total(getattr(m, name)) for name in _RATES}
        enqueued = dict(m.enqueued)
        acked = dict(m.acked_by_queue)
        dead: dict[str, int] = {}
        for (queue, _cause), count in m.dead_lettered.items():
            dead[queue] = dead.get(queue, 0) + count
        previous = self._previous
        self._previous = (loop_time, totals, enqueued, dead, acked)
        elapsed = loop_time - previous[0] if previous is not None else 0.0

        def rate(now: int, before: int) -> float:
            return round((now - before) / elapsed, 3) if elapsed > 0 else 0.0

        rates = {
            name: rate(totals[name], previous[1][name] if previous else totals[name])
            for name in _RATES
        }
        queues: dict[str, dict[str, Any]] = {}
        engine = service.engine
        if engine is not None:
            state = engine.state
            label = m.queue_label
            for name, q in state.queues.items():
                key = label(name)
                row = queues.get(key)
                if row is None:
                    row = queues[key] = {
                        "ready": 0,
                        "scheduled": 0,
                        "inflight": 0,
                        "dead_letter": 0,
                        "paused": False,
                    }
                row["ready"] += q.ready_count
                row["scheduled"] += q.scheduled_count
                row["inflight"] += q.in_flight_count
                row["dead_letter"] += len(q.dead)
                row["paused"] = row["paused"] or q.paused
            for key, row in queues.items():
                row["enqueued_per_s"] = rate(
                    enqueued.get(key, 0),
                    previous[2].get(key, 0) if previous else enqueued.get(key, 0),
                )
                row["dead_lettered_per_s"] = rate(
                    dead.get(key, 0), previous[3].get(key, 0) if previous else dead.get(key, 0)
                )
                row["acked_per_s"] = rate(
                    acked.get(key, 0), previous[4].get(key, 0) if previous else acked.get(key, 0)
                )
        return {
            "time_ms": service.now_ms(),
            "interval_s": round(elapsed, 3),
            "serving": engine is not None and service.health().serving,
            "durable_seq": engine.durable_seq if engine is not None else 0,
            "queues": dict(sorted(queues.items())),
            "rates": rates,
        }

    def heartbeat(self) -> bytes:
        service = self.service
        return sse(
            "heartbeat",
            {
                "time_ms": service.now_ms(),
                "serving": service.engine is not None and service.health().serving,
            },
        )


def _total(value: int | dict[Any, int]) -> int:
    return sum(value.values()) if isinstance(value, dict) else value


class EventsRoute:
    """The handler of `GET /admin/api/v1/events` (`handle`) and its shutdown hook
    (`app.on_shutdown.append(route.on_shutdown)`)."""

    def __init__(self, service: SeppService, interval_s: float = EVENTS_INTERVAL_S) -> None:
        self.hub = EventsHub(service, interval_s)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        require(request, "events")
        hub = self.hub
        if hub.closed:
            raise ApiError(503, "unavailable", "the server is shutting down")
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        hub.join()
        try:
            await response.write(b"retry: 1000\n\n" + hub.heartbeat())
            heartbeat_due = loop.time() + HEARTBEAT_INTERVAL_S
            seen = 0
            while not hub.closed:
                seen = await hub.wait_next(seen)
                if hub.closed:
                    break
                data = hub.payload
                if loop.time() >= heartbeat_due:
                    heartbeat_due = loop.time() + HEARTBEAT_INTERVAL_S
                    data += hub.heartbeat()
                await response.write(data)
            await response.write_eof()
        except ConnectionError:
            # The client went away (aiohttp: ClientConnectionResetError on the
            # write): nothing to report.
            pass
        finally:
            hub.leave()
        return response

    async def on_shutdown(self, app: web.Application) -> None:
        self.hub.close()


# Where build_app keeps the route (tests read its hub).
EVENTS_KEY = web.AppKey("sepp_events", EventsRoute)


def events_handler(service: SeppService) -> EventsRoute:
    """The /events route of `service` (register `.on_shutdown` with the app)."""
    return EventsRoute(service)
