"""notify through real Apprise to loopback webhook sinks (json:// and form://)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import time

import pytest

from delivery.notify import mask_url, notify
from tests.fakes.server import Response
from tests.fakes.sink import FakeSink
from tests.helpers.settings import make_settings


@pytest.fixture
def sink():
    with FakeSink() as server:
        yield server


@pytest.fixture
def report(tmp_path):
    path = tmp_path / "report.pdf"
    path.write_bytes(b"%PDF-1.4\n" + os.urandom(4096))
    return path


def settings_with(tmp_path, targets: dict, **kw) -> object:
    # the loopback sinks are allow-listed for the outbound policy, as an operator would
    return make_settings(
        tmp_path,
        redis_url=None,
        prefix="p",
        notify_targets=json.dumps(targets),
        fetch_allow_hosts="127.0.0.1",
        **kw,
    )


@pytest.mark.slow
async def test_alias_to_json_and_form_with_attachment(tmp_path, sink, report) -> None:
    port = sink.port
    s = settings_with(
        tmp_path,
        {"ops": [f"json://127.0.0.1:{port}/json-hook", f"form://127.0.0.1:{port}/form-hook"]},
    )
    r = await notify(
        s,
        "Machine 3 repaired",
        target="ops",
        title="Done",
        attach=[str(report)],
        workspace=tmp_path,
    )
    assert r["ok"] is True and not r["failed"]
    assert r["sent"] == [f"json://127.0.0.1:{port}/json-hook", f"form://127.0.0.1:{port}/form-hook"]
    (j,) = sink.calls("/json-hook")
    body = j.json
    assert (body["title"], body["message"]) == ("Done", "Machine 3 repaired")
    (att,) = body["attachments"]
    assert att["filename"] == "report.pdf"
    assert base64.b64decode(att["base64"]) == report.read_bytes()
    (f,) = sink.calls("/form-hook")
    assert f.form["message"] == "Machine 3 repaired" and f.form["title"] == "Done"
    (upload,) = f.files.values()
    assert upload.filename == "report.pdf" and upload.content == report.read_bytes()


async def test_bare_url_and_per_target_failure(tmp_path, sink) -> None:
    s = settings_with(
        tmp_path,
        {"ops": [f"json://127.0.0.1:{sink.port}/ok", f"json://127.0.0.1:{sink.port}/down"]},
        notify_allow_urls=f"json://127.0.0.1:{sink.port}",
    )
    sink.fail_next("/down", Response(500, {"error": "boom"}))
    r = await notify(s, "hello", target="ops", workspace=None)
    assert r["ok"] is False
    assert r["sent"] == [f"json://127.0.0.1:{sink.port}/ok"]
    assert r["failed"] == [
        {
            "target": f"json://127.0.0.1:{sink.port}/down",
            "error": "the service did not accept the notification",
        }
    ]
    bare = await notify(s, "direct", target=f"json://127.0.0.1:{sink.port}/bare", workspace=None)
    assert bare["ok"] and sink.calls("/bare")[0].json["message"] == "direct"


async def test_bad_targets_and_attachments_are_clear_failures(tmp_path, sink, report) -> None:
    s = settings_with(tmp_path, {"ops": [f"json://127.0.0.1:{sink.port}/x"]})
    r = await notify(s, "x", target="sales", workspace=tmp_path)
    assert not r["ok"] and "unknown notify target 'sales'" in r["failed"][0]["error"]
    assert "ops" in r["failed"][0]["error"]
    s = settings_with(
        tmp_path,
        {"ops": [f"json://127.0.0.1:{sink.port}/x"]},
        notify_allow_urls="nosuchscheme://abc",
    )
    r = await notify(s, "x", target="nosuchscheme://abc", workspace=tmp_path)
    assert not r["ok"] and "not a valid Apprise URL" in r["failed"][0]["error"]
    r = await notify(
        s, "x", target="ops", attach=[str(report), str(tmp_path / "gone.pdf")], workspace=tmp_path
    )
    assert not r["ok"] and r["failed"][0]["error"].startswith("attachment not found")
    r = await notify(s, "x", target="ops", attach="relative.pdf", workspace=tmp_path)
    assert r["failed"][0]["error"] == "attachment not found: relative.pdf"
    r = await notify(s, "", target="ops", workspace=tmp_path)
    assert r["failed"][0]["error"] == "empty message"
    assert sink.requests == []


async def test_credentials_are_masked(tmp_path, sink, caplog) -> None:
    url = f"json://alice:hunter2secret@127.0.0.1:{sink.port}/hook"
    sink.fail_next("/hook", Response(403, {"error": "no"}))
    s = settings_with(tmp_path, {"ops": [url]})
    with caplog.at_level(logging.DEBUG):
        r = await notify(s, "x", target="ops", workspace=None)
    assert not r["ok"]
    assert "hunter2secret" not in json.dumps(r)
    assert "hunter2secret" not in caplog.text
    assert sink.requests[0].headers["authorization"].startswith("Basic ")  # it was used
    assert "hunter2secret" not in mask_url("tgram://123456789:hunter2secretAAAAAAAA/1234")


@pytest.mark.slow
async def test_slow_target_times_out_without_blocking_the_loop(tmp_path) -> None:
    with FakeSink(delay=3.0) as slow:
        s = settings_with(tmp_path, {"ops": [f"json://127.0.0.1:{slow.port}/slow"]})
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        t = asyncio.create_task(ticker())
        t0 = time.monotonic()
        r = await notify(s, "x", target="ops", send_timeout=0.5, workspace=None)
        t.cancel()
        assert time.monotonic() - t0 < 2.5
        assert r["failed"][0]["error"] == "timed out after 0.5 s"
        assert ticks >= 5  # the event loop kept running while Apprise blocked its thread
