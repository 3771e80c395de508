"""The web store's batch on both backends: each ledger row's receipt is its message's id,
given in the same write; on SQLite the batch goes through the one writer."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from delivery.channels.web import Outgoing, ensure_session, list_messages, post_messages
from delivery.ledger import LedgerEntry
from jobs.models import Delivery


@pytest.mark.slow
async def test_each_ledger_row_holds_its_messages_id(services) -> None:
    await ensure_session(services.sessionmaker, "R1")
    async with services.sessionmaker() as s:
        s.add(Delivery(ledger_key="k-pending", recipient="web:R1", channel="web", status="pending"))
        await s.commit()

    def out(key: str | None, session: str = "R1") -> Outgoing:
        entry = None if key is None else LedgerEntry(key=key, recipient="web:R1", owner="w1")
        return Outgoing(session, f"t-{key}", [{"name": "a.png"}], "job-r", entry)

    msgs = [out("k1"), out(None), out("k-ghost", "ghost"), out("k1"), out("k-pending"), out("k2")]
    res = await post_messages(services.sessionmaker, services.redis, services.settings, msgs)
    stored = await list_messages(services.sessionmaker, "R1")
    assert [m["text"] for m in stored] == ["t-k1", "t-None", "t-k-pending", "t-k2"]
    assert [m["attachments"] for m in stored] == [[{"name": "a.png"}]] * 4
    ids = [m["id"] for m in stored]
    assert ids == sorted(ids) and len(set(ids)) == 4
    assert [r["id"] for r in (res[0], res[1], res[4], res[5])] == ids  # type: ignore[index]
    async with services.sessionmaker() as s:
        rows = {d.ledger_key: d for d in await s.scalars(select(Delivery))}
    assert rows["k1"].message_id == str(ids[0]) and rows["k1"].verified is True
    assert rows["k-pending"].message_id == str(ids[2]) and rows["k-pending"].tries == 1
    assert rows["k2"].message_id == str(ids[3]) and rows["k2"].status == "sent"
    assert rows["k-ghost"].status == "failed" and rows["k-ghost"].message_id is None
    assert rows["k-ghost"].verified is None and rows["k1"].generation == 0
    # stored again later: ids keep growing, nothing delivered twice
    later = await post_messages(
        services.sessionmaker, services.redis, services.settings, [out("k1"), out("k3")]
    )
    assert later[0] is None and later[1]["id"] > ids[-1]  # type: ignore[index]
