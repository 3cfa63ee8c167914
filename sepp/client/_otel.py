"""Optional OpenTelemetry glue: trace propagation, spans and worker metrics.

Owns: every use of the ``opentelemetry`` packages. They are not a dependency;
when they are not installed each function here is a no-op (returns ``None``, a
null context manager, or no metrics). The host application owns providers and
exporters; this module only emits into whatever is configured.

The packages are loaded with `importlib` on first use, so nothing imports them at
module load and type checkers do not need them.

Must not import: sepp.core, sepp.storage, sepp.server.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

_UNLOADED: Any = object()
_api: Any = _UNLOADED


class _Api:
    """The loaded opentelemetry modules and the objects built from them once."""

    def __init__(self) -> None:
        self.trace = importlib.import_module("opentelemetry.trace")
        self.context = importlib.import_module("opentelemetry.context")
        self.metrics = importlib.import_module("opentelemetry.metrics")
        tracecontext = importlib.import_module("opentelemetry.trace.propagation.tracecontext")
        self.propagator = tracecontext.TraceContextTextMapPropagator()
        self.tracer = self.trace.get_tracer("sepp.client")


def api() -> Any:
    """The loaded OpenTelemetry API, or ``None`` if it is not installed."""
    global _api
    if _api is _UNLOADED:
        try:
            _api = _Api()
        except ImportError:
            _api = None
    return _api


def missing() -> bool:
    """True once OpenTelemetry was looked for and is not installed (`api` is
    None): callers skip their spans and trace headers without asking again."""
    return _api is None


def reset_for_tests(value: Any = _UNLOADED) -> None:
    """Forget (or replace) the loaded API; tests use it to inject a fake."""
    global _api
    _api = value


def current_trace_headers() -> tuple[str, str | None] | None:
    """``(traceparent, tracestate)`` of the current span, or ``None``."""
    otel = api()
    if otel is None:
        return None
    carrier: dict[str, str] = {}
    otel.propagator.inject(carrier)
    traceparent = carrier.get("traceparent")
    if traceparent is None:
        return None
    return traceparent, carrier.get("tracestate") or None


def _extract(otel: Any, traceparent: str, tracestate: str | None) -> Any:
    carrier = {"traceparent": traceparent}
    if tracestate is not None:
        carrier["tracestate"] = tracestate
    return otel.propagator.extract(carrier)


@contextlib.contextmanager
def attach_trace_context(traceparent: str, tracestate: str | None) -> Iterator[None]:
    otel = api()
    if otel is None:
        yield
        return
    token = otel.context.attach(_extract(otel, traceparent, tracestate))
    try:
        yield
    finally:
        otel.context.detach(token)


def span_context(traceparent: str, tracestate: str | None) -> Any:
    otel = api()
    if otel is None:
        return None
    ctx = _extract(otel, traceparent, tracestate)
    found = otel.trace.get_current_span(ctx).get_span_context()
    return found if found.is_valid else None


# What `client_span` returns without OpenTelemetry: one shared no-op context
# manager, so a call pays no generator and no context-manager object for it.
_NO_SPAN: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()


def client_span(name: str) -> contextlib.AbstractContextManager[Any]:
    """A CLIENT span around one call to the server (a shared no-op without
    OpenTelemetry)."""
    otel = api()
    if otel is None:
        return _NO_SPAN
    span: contextlib.AbstractContextManager[Any] = otel.tracer.start_as_current_span(
        name, kind=otel.trace.SpanKind.CLIENT
    )
    return span


@contextlib.contextmanager
def consumer_span(name: str, producer: tuple[str, str | None] | None) -> Iterator[None]:
    """A CONSUMER span around one job's processing, linked to the producer's
    trace when the job carries one."""
    otel = api()
    if otel is None:
        yield
        return
    links = []
    if producer is not None:
        found = span_context(*producer)
        if found is not None:
            links.append(otel.trace.Link(found))
    with otel.tracer.start_as_current_span(name, kind=otel.trace.SpanKind.CONSUMER, links=links):
        yield


class OtelInstruments:
    """The worker's counters, named as in sepp-py so dashboards carry over."""

    def __init__(self, otel: Any) -> None:
        meter = otel.metrics.get_meter("sepp")
        self.processed = meter.create_counter("sepp.jobs.processed", description="Jobs acked.")
        self.nacked = meter.create_counter(
            "sepp.jobs.nacked", description="Jobs nacked; attribute outcome=retry|dead_letter."
        )
        self.in_flight = meter.create_up_down_counter(
            "sepp.jobs.in_flight", description="Jobs whose handler is running."
        )
        self.reserves_completed = meter.create_counter(
            "sepp.reserves.completed", description="Reserves answered; attribute jobs=some|empty."
        )
        self.reserves_failed = meter.create_counter(
            "sepp.reserves.failed", description="Reserves that failed."
        )


def instruments() -> OtelInstruments | None:
    otel = api()
    return None if otel is None else OtelInstruments(otel)
