"""Tracing (jobs.telemetry): one trace per job through the real dispatcher and the real arq
worker, in the SDK's in-memory exporter; chain runs as one trace with a span per step;
configured by the standard OTEL_* variables (a real OTLP/HTTP export to a loopback
collector); off, and importable, without configuration or without the extra."""

from __future__ import annotations

import asyncio
import http.server
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from chains import runs, schedules
from chains.schedules import validate
from jobs import telemetry
from jobs.models import Job
from jobs.queue.dispatcher import Dispatcher
from jobs.services import Services
from tests.helpers.jobs import dispatch, drain, job_and_attempts
from tests.helpers.settings import ADMIN_AUTH, FAKE_SKILLS, JOB_SKILLS, ROOT, make_settings

TG_CTX = {"channel": "telegram", "actor_key": "1001", "role_id": "r1", "session_id": "s-t"}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use(provider)
    yield exporter
    telemetry.disable()
    provider.shutdown()


@pytest.fixture
async def svc(tmp_path: Path, database_url: str, redis_server_url: str, redis_prefix: str, tg):  # type: ignore[no-untyped-def]
    settings = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=database_url,
        skills_path=os.pathsep.join([str(JOB_SKILLS), str(FAKE_SKILLS)]),
        telegram_bot_token=tg.token,
        telegram_api_base=tg.url,
        retry_backoff_sec=0.05,
    )
    services = await Services.open(settings)
    yield services
    if services.redis is not None:
        keys = [k async for k in services.redis.scan_iter(count=1000, match=f"{redis_prefix}*")]
        if keys:
            await services.redis.delete(*keys)
    await services.close()


def _by_name(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        out.setdefault(span.name, []).append(span)
    return out


def _parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


@pytest.mark.slow
async def test_one_trace_per_job_with_the_workers_spans_under_the_dispatch(
    svc: Services, spans: InMemorySpanExporter, tg: Any
) -> None:
    job_id = await dispatch(svc, "bg_report", {"message": "Your report"}, TG_CTX)
    dispatched = _by_name(spans)
    [root] = dispatched["skilljobs.dispatch"]
    assert set(dispatched) == {"skilljobs.dispatch", "skilljobs.enqueue"}  # no worker yet
    job, _ = await job_and_attempts(svc, job_id)
    trace_hex = f"{root.context.trace_id:032x}"
    assert job.traceparent.startswith(f"00-{trace_hex}-{root.context.span_id:016x}-")

    await drain(svc)  # the real arq worker, in another task: the record carries the context
    got = _by_name(spans)
    assert len({s.context.trace_id for ss in got.values() for s in ss}) == 1
    [enqueue] = got["skilljobs.enqueue"]
    [wait] = got["skilljobs.queue_wait"]
    [run] = got["skilljobs.run"]
    [finish] = got["skilljobs.finish"]
    [materialize] = got["skilljobs.materialize"]
    deliveries = got["skilljobs.deliver"]
    assert root.parent is None and root.attributes["skilljobs.job.id"] == job_id
    for span in (enqueue, wait, run, finish):
        assert _parent_id(span) == root.context.span_id, span.name
    assert run.parent is not None and run.parent.is_remote  # joined through the job record
    assert root.end_time <= run.start_time  # the dispatch was over when the worker started
    assert wait.start_time <= wait.end_time <= run.start_time
    assert run.attributes["skilljobs.attempt"] == 1
    assert finish.attributes["skilljobs.outcome"] == "succeeded"
    assert _parent_id(materialize) == finish.context.span_id
    # the text with the report as its caption: one message, a document, sent
    assert len(deliveries) == len(tg.sent) >= 1
    for d in deliveries:
        assert _parent_id(d) == finish.context.span_id
        assert d.attributes["skilljobs.channel"] == "telegram"
        assert d.attributes["skilljobs.delivery.status"] == "sent"


@pytest.mark.slow
async def test_each_run_of_a_retried_job_is_in_its_trace(
    svc: Services, spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    inp = {"counter": str(tmp_path / "runs"), "fail_times": 1}
    job_id = await dispatch(svc, "bg_flaky", inp, TG_CTX)
    await drain(svc)
    job, attempts = await job_and_attempts(svc, job_id)
    assert job.status == "succeeded" and len(attempts) == 2
    got = _by_name(spans)
    [root] = got["skilljobs.dispatch"]
    runs_ = sorted(got["skilljobs.run"], key=lambda s: s.start_time)
    assert [r.attributes["skilljobs.attempt"] for r in runs_] == [1, 2]
    assert [r.attributes["skilljobs.outcome"] for r in runs_] == ["retrying", "succeeded"]
    assert len(got["skilljobs.queue_wait"]) == 2
    for span in [*runs_, *got["skilljobs.queue_wait"]]:
        assert span.context.trace_id == root.context.trace_id
        assert _parent_id(span) == root.context.span_id


@pytest.mark.slow
async def test_a_job_dispatched_untraced_still_gets_one_trace(
    svc: Services, spans: InMemorySpanExporter
) -> None:
    telemetry.disable()
    job_id = await dispatch(svc, "bg_ctx", {}, TG_CTX)
    job, _ = await job_and_attempts(svc, job_id)
    assert job.traceparent is None
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    telemetry.use(provider)
    await drain(svc)
    got = _by_name(spans)
    assert "skilljobs.dispatch" not in got
    worker_spans = [*got["skilljobs.queue_wait"], *got["skilljobs.run"], *got["skilljobs.finish"]]
    assert len({s.context.trace_id for s in worker_spans}) == 1
    # every worker derives the same trace from the job id
    assert f"{worker_spans[0].context.trace_id:032x}" == telemetry.parent_of(job).split("-")[1]


@pytest.mark.slow
async def test_a_chain_run_is_one_trace_with_a_span_per_step(
    svc: Services, spans: InMemorySpanExporter
) -> None:
    spec = {
        "name": "traced-chain",
        "cron": "0 9 * * *",
        "identity": {"role_id": "r1", "org_id": "o1", "session_id": "s1"},
        "steps": [
            {"id": "first", "skill": "sync_echo", "input": {"n": 1}},
            {"id": "second", "skill": "sync_echo", "input": {"n": "$steps.first.echo.n"}},
        ],
    }
    row = await schedules.create(svc, validate(spec, svc.registry))
    run_id = await runs.trigger_manual(svc, row.id)
    await drain(svc)
    got = _by_name(spans)
    [run] = got["skilljobs.chain_run"]
    steps = sorted(got["skilljobs.chain_step"], key=lambda s: s.start_time)
    assert run.attributes["skilljobs.chain_run.id"] == run_id
    # its trace id comes from the run id: a run resumed by another worker stays in it
    assert f"{run.context.trace_id:032x}" == telemetry.derived(run_id).split("-")[1]
    assert run.attributes["skilljobs.outcome"] == "succeeded"
    assert [s.attributes["skilljobs.step.id"] for s in steps] == ["first", "second"]
    for step in steps:
        assert step.context.trace_id == run.context.trace_id
        assert _parent_id(step) == run.context.span_id


@pytest.mark.slow
async def test_off_without_configuration(svc: Services) -> None:
    telemetry.disable()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    assert _in_subprocess("print(telemetry.setup())", env) == "False"
    res = await Dispatcher(svc).dispatch("bg_ctx", {}, TG_CTX)
    async with svc.sessionmaker() as s:
        job = await s.get(Job, res.body["job_id"])
    assert job is not None and job.traceparent is None
    assert telemetry.traceparent() is None
    coro = _answer()
    assert telemetry.traced("x", coro) is coro  # the caller's coroutine, untouched
    assert await coro == 42


async def _answer() -> int:
    return 42


def _in_subprocess(code: str, env: dict[str, str], prelude: str = "") -> str:
    script = f"{prelude}\nfrom jobs import telemetry\n{code}\n"
    res = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip() + res.stderr.strip()


def test_importable_and_off_without_the_extra() -> None:
    """With the opentelemetry packages unimportable, an OTLP endpoint set only warns."""
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    block = (
        "import sys\nfor m in ('opentelemetry', 'opentelemetry.trace'):\n    sys.modules[m] = None"
    )
    out = _in_subprocess(
        "import asyncio, logging\nlogging.basicConfig()\n"
        "print('on' if telemetry.setup() else 'off')\n"
        "async def f(): return 7\n"
        "print(asyncio.run(telemetry.traced('x', f())), telemetry.traceparent())",
        env,
        prelude=block,
    )
    assert "off\n7 None" in out
    assert "skilljobs[otel]" in out  # the warning names the extra to install


class _Collector(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.received.append((self.path, self.headers.get("content-type", ""), body))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.slow
def test_otel_variables_export_over_otlp_http() -> None:
    """A loopback OTLP/HTTP collector gets the spans of a process configured only by the
    standard variables, with the service name they give."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Collector.received.clear()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{server.server_port}",
            OTEL_SERVICE_NAME="skilljobs-test-worker",
        )
        out = _in_subprocess(
            "import asyncio\nassert telemetry.setup('skilljobs-worker')\n"
            "async def f(): return telemetry.traceparent()\n"
            "print(asyncio.run(telemetry.traced('skilljobs.dispatch', f())))",
            env,
        )
    finally:
        server.shutdown()
    assert out.startswith("00-")  # a traceparent while inside the span
    [(path, ctype, body)] = _Collector.received  # flushed when the process exited
    assert path == "/v1/traces" and ctype == "application/x-protobuf"
    assert b"skilljobs.dispatch" in body and b"skilljobs-test-worker" in body


def test_a_provider_installed_by_the_host_is_used() -> None:
    """An application (or opentelemetry-instrument) that set its own provider gets the
    spans there, without any OTEL_* exporter variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = _in_subprocess(
        "import asyncio\n"
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter\n"
        "exporter = InMemorySpanExporter()\n"
        "provider = TracerProvider()\n"
        "provider.add_span_processor(SimpleSpanProcessor(exporter))\n"
        "trace.set_tracer_provider(provider)\n"
        "assert telemetry.setup()\n"
        "async def f(): return 1\n"
        "asyncio.run(telemetry.traced('skilljobs.enqueue', f()))\n"
        "print([s.name for s in exporter.get_finished_spans()])",
        env,
    )
    assert out == "['skilljobs.enqueue']"


def test_otel_sdk_disabled_wins() -> None:
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    env["OTEL_SDK_DISABLED"] = "true"
    assert _in_subprocess("print(telemetry.setup(), telemetry.enabled())", env) == "False False"


@pytest.mark.slow
async def test_a_dispatch_over_http_continues_the_callers_trace(
    svc: Services, spans: InMemorySpanExporter
) -> None:
    """The chat platform sends its ``traceparent``: the dispatch and the worker's spans are
    in the platform's trace, under its span."""
    import httpx

    from dashboard.app import create_app

    caller_trace, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    app = create_app(svc.settings, services=svc)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers=ADMIN_AUTH,
    ) as client:
        res = await client.post(
            "/api/v1/dispatch",
            json={"skill": "bg_ctx", "input": {}, "context": TG_CTX},
            headers={"traceparent": f"00-{caller_trace}-{caller_span}-01"},
        )
    assert res.status_code == 202, res.text
    await drain(svc)
    got = _by_name(spans)
    [root] = got["skilljobs.dispatch"]
    assert f"{root.context.trace_id:032x}" == caller_trace
    assert root.parent is not None and f"{root.parent.span_id:016x}" == caller_span
    [run] = got["skilljobs.run"]
    assert f"{run.context.trace_id:032x}" == caller_trace
    assert _parent_id(run) == root.context.span_id
    # the job's detail names its trace, to look it up in the tracing backend
    app_client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers=ADMIN_AUTH,
    )
    async with app_client as client:
        detail = (await client.get(f"/api/v1/jobs/{res.json()['job_id']}")).json()
    assert detail["trace_id"] == caller_trace


@pytest.mark.slow
async def test_a_worker_process_exports_its_spans_into_the_dispatchers_trace(
    tmp_path: Path, pg_url: str, redis_server_url: str, redis_prefix: str, tg: Any, spans
) -> None:
    """Across processes: dispatched here (in-memory exporter), run by a real `skilljobs
    worker` configured only by OTEL_* variables, whose spans reach a loopback OTLP/HTTP
    collector under the dispatch span."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    from tests.helpers.jobs import wait_status
    from tests.helpers.workers import WorkerProcess

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Collector.received.clear()
    settings = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=pg_url,
        skills_path=os.pathsep.join([str(JOB_SKILLS), str(FAKE_SKILLS)]),
    )
    env = {
        "SKILLJOBS_TELEGRAM_BOT_TOKEN": tg.token,
        "SKILLJOBS_TELEGRAM_API_BASE": tg.url,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    svc = await Services.open(settings)
    worker = WorkerProcess(settings, tmp_path / "worker.log", **env)
    try:
        job_id = await dispatch(svc, "bg_report", {"message": "Your report"}, TG_CTX)
        job = await wait_status(svc, job_id, {"succeeded", "failed"}, limit=60)
        assert job.status == "succeeded", job.error
        [root] = _by_name(spans)["skilljobs.dispatch"]
        names: dict[str, Any] = {}
        deadline = time.monotonic() + 30  # the batch processor exports every 100 ms
        while time.monotonic() < deadline:
            for _path, _ctype, body in list(_Collector.received):
                request = ExportTraceServiceRequest.FromString(body)
                for rs in request.resource_spans:
                    for ss in rs.scope_spans:
                        names.update({s.name: s for s in ss.spans})
            if "skilljobs.finish" in names and "skilljobs.deliver" in names:
                break
            await asyncio.sleep(0.1)
    finally:
        worker.stop()
        server.shutdown()
        await svc.close()
    for name in ("skilljobs.queue_wait", "skilljobs.run", "skilljobs.finish"):
        span = names[name]
        assert span.trace_id == root.context.trace_id.to_bytes(16, "big"), name
        assert span.parent_span_id == root.context.span_id.to_bytes(8, "big"), name
    assert names["skilljobs.deliver"].parent_span_id == names["skilljobs.finish"].span_id
