"""Tracing with OpenTelemetry: one trace per job, one per chain run.

A job's trace holds its dispatch (and the enqueue), its queue wait, each run, its
finishing stage with the materialization and each delivery. The dispatcher stores the
W3C ``traceparent`` of its span in the job record (``jobs.traceparent``), so the spans of
whichever worker runs the job, however many runs later, join the dispatcher's trace. A
job recorded without one (dispatched while tracing was off) still gets one trace: its id
is derived from the job id. A chain run is one trace with a span per step, its id derived
from the run id (a run resumed by another worker stays in it).

Off unless configured (:func:`setup`): the ``skilljobs[otel]`` extra installed, and
either the standard ``OTEL_*`` variables naming an exporter (``OTEL_EXPORTER_OTLP_ENDPOINT``
/ ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, or ``OTEL_TRACES_EXPORTER``), or a tracer
provider the host process installed (``opentelemetry-instrument``, a test's in-memory
exporter). ``OTEL_SDK_DISABLED=true`` turns it off. While off, each hook is one check of a
module global that hands the caller's coroutine straight back: nothing is imported,
built or stored, and this module imports without the extra.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:  # the extra is imported only when tracing is set up
    from opentelemetry.trace import TracerProvider

log = logging.getLogger("skilljobs.telemetry")

T = TypeVar("T")
Attrs = Mapping[str, str | int | float | bool]


class Traced(Protocol):
    """What the spans of a job read of it (a job row; ``traceparent`` and ``queued_at``
    when it has them)."""

    @property
    def id(self) -> str: ...
    @property
    def skill(self) -> str: ...


#: the tracer while tracing is on, else None (the one thing every hook checks)
_tracer: Any = None
_propagator: Any = None

_TRUE = ("1", "true", "yes", "on")
OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def enabled() -> bool:
    return _tracer is not None


# --- switching it on and off (at the edge: worker, web, up) ---------------------------------


def setup(service_name: str = "skilljobs") -> bool:
    """Turn tracing on as the environment configures it; True when it is on. Safe to call
    more than once (the first provider stays)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        disable()
        return False
    wanted = _exporter_names()
    try:
        from opentelemetry import trace
    except ImportError:
        if wanted:
            log.warning(
                "OTEL_* variables ask for traces but the otel extra is not installed "
                "(pip install 'skilljobs[otel]'): tracing stays off"
            )
        return False
    if _tracer is not None:
        return True
    provider = trace.get_tracer_provider()
    if not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return use(provider)  # installed by the host process (opentelemetry-instrument, an app)
    if not wanted:
        return False
    built = _provider_from_env(service_name, wanted)
    if built is None:
        return False
    trace.set_tracer_provider(built)  # (the SDK flushes it when the process exits)
    return use(built)


def use(provider: TracerProvider) -> bool:
    """Trace through ``provider`` (a ``TracerProvider``), e.g. a test's in-memory one."""
    global _tracer, _propagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _propagator = TraceContextTextMapPropagator()
    _tracer = provider.get_tracer("skilljobs", _version())
    return True


def disable() -> None:
    global _tracer
    _tracer = None


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("skilljobs")
    except PackageNotFoundError:
        return None


def _exporter_names() -> list[str]:
    names = [
        n.strip().lower()
        for n in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")
        if n.strip() and n.strip().lower() != "none"
    ]
    if not names and any(os.environ.get(v) for v in OTLP_ENDPOINTS):
        names = ["otlp"]
    return names


def _provider_from_env(service_name: str, names: list[str]) -> Any:
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("the OpenTelemetry SDK is not installed (skilljobs[otel]): tracing is off")
        return None
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    provider = TracerProvider(resource=resource)
    exporters = [e for e in (_exporter(n) for n in names) if e is not None]
    if not exporters:
        return None
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("tracing on: %s exporter(s), service %s", ",".join(names), service_name)
    return provider


def _exporter(name: str) -> Any:
    """The span exporter ``OTEL_TRACES_EXPORTER`` names; it reads its own ``OTEL_EXPORTER_*``
    settings (endpoint, headers, timeout, certificates)."""
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        log.warning("OTEL_TRACES_EXPORTER %r is not supported (otlp, console): ignored", name)
        return None
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )

            return GrpcExporter()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    except ImportError:
        package = "grpc" if protocol == "grpc" else "http"
        log.warning(
            "OTLP over %s needs opentelemetry-exporter-otlp-proto-%s: tracing is off",
            protocol,
            package,
        )
        return None


# --- the hooks ---------------------------------------------------------------------------------


def incoming(header: str | None) -> contextlib.AbstractContextManager[None]:
    """Continue the caller's trace (a request's ``traceparent`` header) in what runs inside,
    unless a span is current already (an instrumented server made one from the header)."""
    if _tracer is None or not header:
        return contextlib.nullcontext()
    from opentelemetry import context, trace

    if trace.get_current_span().get_span_context().is_valid:
        return contextlib.nullcontext()
    return _attached(context, _context(header))


@contextlib.contextmanager
def _attached(context: ModuleType, ctx: object) -> Iterator[None]:
    token = context.attach(ctx)
    try:
        yield
    finally:
        context.detach(token)


def traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span (stored with a new job), None when off."""
    if _tracer is None:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


def traced(
    name: str,
    coro: Coroutine[Any, Any, T],
    *,
    parent: str | None = None,
    attrs: Attrs | None = None,
    outcome: Callable[[T], Attrs] | None = None,
) -> Coroutine[Any, Any, T]:
    """``coro`` run inside span ``name`` (a child of ``parent``, a ``traceparent``, or of the
    current span); ``outcome`` turns the result into attributes. Off: ``coro`` itself."""
    if _tracer is None:
        return coro
    return _in_span(name, coro, parent, attrs, outcome)


def job_span(
    name: str,
    coro: Coroutine[Any, Any, T],
    job: Traced,
    *,
    attempt: int | None = None,
) -> Coroutine[Any, Any, T]:
    """:func:`traced` in the trace of ``job`` (a job row), with its id and skill, and the
    status it ended with (:func:`outcome_of`)."""
    if _tracer is None:
        return coro
    attrs: dict[str, str | int] = {**_job_attrs(job)}
    if attempt is not None:
        attrs["skilljobs.attempt"] = attempt
    return _in_span(name, coro, parent_of(job), attrs, outcome_of)


def outcome_of(done: object) -> Attrs:
    """The attributes of a run's or a finishing stage's end: a status word, or an
    executor outcome."""
    status = done if isinstance(done, str) else getattr(done, "status", "")
    return {"skilljobs.outcome": str(status)}


def queue_wait(job: Traced, attempt: int) -> None:
    """Record the wait of ``job`` between its enqueue and now (its claim) as a span."""
    if _tracer is None:
        return
    start = float(getattr(job, "queued_at", None) or time.time())
    span = _tracer.start_span(
        "skilljobs.queue_wait",
        context=_context(parent_of(job)),
        attributes={**_job_attrs(job), "skilljobs.attempt": attempt},
        start_time=int(start * 1e9),
    )
    span.end(end_time=max(int(time.time() * 1e9), int(start * 1e9)))


def parent_of(job: Traced) -> str:
    """The ``traceparent`` the spans of ``job`` hang under: the one recorded at dispatch,
    else one derived from the job id (every worker derives the same)."""
    recorded = getattr(job, "traceparent", None)
    return str(recorded) if recorded else derived(str(job.id))


def derived(key: str) -> str:
    """A ``traceparent`` made from ``key`` (a job or chain run id): every process derives
    the same, so every attempt of that job or run is in one trace."""
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"00-{digest[:32]}-{digest[32:48]}-01"


def trace_id(job: Traced) -> str:
    """The id of the trace the spans of ``job`` are in (when tracing is on), 32 hex digits:
    what to look the job up by in the tracing backend."""
    return parent_of(job).split("-")[1]


def _job_attrs(job: Traced) -> dict[str, str]:
    return {"skilljobs.job.id": str(job.id), "skilljobs.skill": str(job.skill)}


def _context(parent: str | None) -> Any:
    return None if parent is None else _propagator.extract({"traceparent": parent})


async def _in_span(
    name: str,
    coro: Coroutine[Any, Any, T],
    parent: str | None,
    attrs: Attrs | None,
    outcome: Callable[[T], Attrs] | None,
) -> T:
    tracer = _tracer
    if tracer is None:  # switched off since the call
        return await coro
    with tracer.start_as_current_span(name, context=_context(parent), attributes=attrs) as span:
        result = await coro
        if outcome is not None:
            span.set_attributes(outcome(result))
        return result


__all__ = [
    "derived",
    "disable",
    "enabled",
    "incoming",
    "job_span",
    "outcome_of",
    "parent_of",
    "queue_wait",
    "setup",
    "trace_id",
    "traced",
    "traceparent",
    "use",
]
