"""One channel interface: the router plans and sends the same way on every channel (no
class checks, no attribute probing), sends return receipts, and a result's items go through
``Channel.send_batch`` — one by one through the ledger by default, stored together with
their ledger rows on the web."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

import delivery
import delivery.channels
from delivery.channels.base import Channel, Courier, Delivered, Receipt, Send
from delivery.channels.telegram import TelegramChannel
from delivery.channels.web import WebChannel, ensure_session, list_messages
from delivery.ledger import LeaseLost, ledger_key
from jobs.models import Delivery

ROOT = Path(delivery.__file__).parent


def _concrete_channels() -> set[str]:
    for mod in pkgutil.iter_modules(delivery.channels.__path__):
        importlib.import_module(f"delivery.channels.{mod.name}")
    found: set[str] = set()
    todo = [Channel]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("delivery."):
                found.add(sub.__name__)
            todo.append(sub)
    return found


def test_the_router_names_no_channel_class_and_probes_no_adapter() -> None:
    channels = _concrete_channels()
    assert {"TelegramChannel", "WebChannel", "LimitedChannel"} <= channels
    tree = ast.parse((ROOT / "router.py").read_text())
    named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    named |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not named & channels, "the router must not know which channel it drives"
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    probes = [
        ast.unparse(c)
        for c in calls
        if isinstance(c.func, ast.Name) and c.func.id in ("getattr", "hasattr", "isinstance")
    ]
    assert probes == [] or all("adapter" not in p for p in probes), probes


def test_nothing_in_delivery_probes_an_adapter_for_attributes() -> None:
    """Capabilities are typed attributes of ``Channel``: no ``getattr(adapter, …)``."""
    found = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and node.args
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id in ("adapter", "channel", "ch", "web")
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_declared_capabilities_match_what_each_channel_takes() -> None:
    """``voice_notes`` is declared where the channel has a voice rule, and only there."""
    from delivery.channels.limits import LimitedChannel

    _concrete_channels()
    limited = [c for c in _subclasses(LimitedChannel) if c.__module__.startswith("delivery.")]
    assert {c.name for c in limited} == {"telegram", "feishu", "wecom", "dingtalk"}
    for cls in limited:
        assert cls.voice_notes == ("voice" in cls.RULES), cls.name
        assert cls.splits_text and cls.replies and not cls.rich_text, cls.name
    assert WebChannel.rich_text and not WebChannel.splits_text and not WebChannel.replies


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def test_receipt_keeps_the_first_id_and_leaves_empty_ones_out() -> None:
    r = Receipt.of("", "7", "8", sent_as="file", note="not as an image")
    assert r.message_ids == ("7", "8") and r.message_id == "7"
    assert Receipt().message_id == "" and Receipt.of("").message_ids == ()


@pytest.fixture
async def http():
    async with httpx.AsyncClient(timeout=10.0) as client:
        yield client


async def test_a_split_text_has_every_message_in_its_receipt(tg, http) -> None:
    ch = TelegramChannel(http, tg.token, api_base=tg.url)
    receipt = await ch.send_text("1001", "\n\n".join(["word " * 600] * 3))
    ids = [str(m["message_id"]) for m in tg.sent]
    assert len(ids) > 1 and receipt.message_ids == tuple(ids)
    assert receipt.message_id == ids[0] and receipt.sent_as == ""


async def test_the_default_batch_sends_one_by_one_in_order(tg, http) -> None:
    ch = TelegramChannel(http, tg.token, api_base=tg.url)
    sends = [Send("text", f"t{i}", "1001", f"k{i}", text=f"m{i}") for i in range(3)]
    seen: list[str] = []

    async def one(send: Send) -> list[Delivered]:
        seen.append(send.item)
        receipt = await ch.send_text(send.contact, send.text or "")
        error = None if receipt.message_id else "no id"
        return [{"recipient": "telegram:1001", "kind": "text", "status": "sent", "error": error}]

    got = [d async for d in ch.send_batch(Courier("telegram:1001", "w#1"), sends, one)]
    assert seen == ["t0", "t1", "t2"] and [d["status"] for d in got] == ["sent"] * 3
    assert [m["text"] for m in tg.sent] == ["m0", "m1", "m2"]


async def test_web_stores_a_batch_with_its_ledger_rows_and_hands_on_the_rest(
    sessionmaker, redis, settings, tmp_path
) -> None:
    await ensure_session(sessionmaker, "s1")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "chart.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    outside = tmp_path / "elsewhere.pdf"
    outside.write_bytes(b"%PDF")
    web = WebChannel(sessionmaker, redis, settings).for_job("j1")

    def send(kind: str, item: str, path: Path | None = None, text: str | None = None) -> Send:
        key = ledger_key("j1", "web:s1", item)
        return Send(kind, item, "s1", key, text=text, path=path and str(path), workspace=ws)

    sends = [
        send("text", "text", text="the report"),
        send("image", f"image:{ws / 'chart.png'}", ws / "chart.png", "a chart"),
        send("file", f"file:{outside}", outside),
    ]
    handed: list[str] = []

    async def one(s: Send) -> list[Delivered]:
        handed.append(s.item)
        return [{"recipient": "web:s1", "kind": s.kind, "status": "failed", "error": "outside"}]

    courier = Courier("web:s1", "w#1", "web", job_id="j1")
    got = [d async for d in web.send_batch(courier, sends, one)]
    assert [(d["kind"], d["status"]) for d in got] == [
        ("text", "sent"),
        ("image", "sent"),
        ("file", "failed"),
    ]
    assert handed == [f"file:{outside}"]  # not attachable: on its own, through the ledger
    stored = await list_messages(sessionmaker, "s1")
    assert [m["text"] for m in stored] == ["the report", "a chart"]
    async with sessionmaker() as s:
        rows = {r.kind: r for r in (await s.scalars(select(Delivery))).all()}
    assert sorted(rows) == ["image", "text"]
    assert all(r.status == "sent" and r.job_id == "j1" for r in rows.values())
    # each ledger row has its stored message's id as its receipt
    assert [rows["text"].message_id, rows["image"].message_id] == [str(m["id"]) for m in stored]

    async def lost() -> bool:
        return False

    fenced = Courier("web:s1", "w#2", "web", job_id="j1", fence=lost)
    with pytest.raises(LeaseLost):
        _ = [d async for d in web.send_batch(fenced, [send("text", "t2", text="late")], one)]
    assert len(await list_messages(sessionmaker, "s1")) == 2  # nothing stored once it lost
