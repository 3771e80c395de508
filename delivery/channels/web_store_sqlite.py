""":func:`delivery.channels.web_store.store_batch` on SQLite (the embedded default): the
sessions check, the ledger rule, the messages and their receipts as one write transaction
in one call to the writer's thread (:func:`jobs.db.sqlite_write`).

Through the ORM the batch was a dozen hand-offs between the event loop and a connection
thread (a message insert each, since SQLite cannot return the ids of a multi-row insert in
order), with the write lock held across all of them. Here the write lock is taken first,
so what is read is what the writes apply to: message ids are drawn up front (for every
message of a known session, in order, as on PostgreSQL: a skipped one leaves a gap), and
each ledger row is written with its message id as its receipt.
"""

from __future__ import annotations

import sqlite3

from sqlalchemy.ext.asyncio import AsyncEngine

from delivery.channels.web_store import Outgoing, _storable
from delivery.ledger import LedgerEntry
from jobs import storable
from jobs.db import sqlite_write
from jobs.models import FAILED, SENT, SessionMessage

_NEW_DELIVERY = """INSERT INTO deliveries (ledger_key, job_id, chain_run_id, recipient,
  channel, kind, item, status, error, tries, claimed_by, created_at, updated_at, sent_at,
  generation, message_id, verified)
VALUES (?, ?, ?, ?, 'web', ?, ?, ?, ?, 1, ?, ?, ?, ?, 0, ?, ?)
ON CONFLICT (ledger_key) DO NOTHING"""

# a pending or failed row taken over; the receipt only when the message is stored
_TAKE_OVER = """UPDATE deliveries SET tries = tries + 1, status = ?, error = ?,
  claimed_by = ?, sent_at = ?, updated_at = ?,
  message_id = CASE WHEN ? THEN ? ELSE message_id END,
  verified = CASE WHEN ? THEN 1 ELSE verified END
WHERE ledger_key = ? AND status <> 'sent'"""

_NEW_MESSAGE = """INSERT INTO session_messages (id, session_id, text, attachments, job_id,
  created_at) VALUES (?, ?, ?, ?, ?, ?)"""


def _placeholders(n: int) -> str:
    return ", ".join("?" for _ in range(n))


async def store_batch_sqlite(
    engine: AsyncEngine, messages: list[Outgoing], now: float
) -> tuple[set[str], set[int], list[int]]:
    """Sessions that exist, indexes delivered already, ids of the stored messages (in
    order): what ``store_batch`` returns, with the same ledger rule."""
    messages = [_storable(m) for m in messages]
    attachments = SessionMessage.__table__.c.attachments.type.dialect_impl(engine.dialect)
    to_json = attachments.bind_processor(engine.dialect)
    packed = [
        to_json(list(m.attachments or [])) if to_json else list(m.attachments or [])
        for m in messages
    ]
    session_ids = sorted({m.session_id for m in messages if m.session_id})
    keys = sorted({m.ledger.key for m in messages if m.ledger})

    def run(db: sqlite3.Connection) -> tuple[set[str], set[int], list[int]]:
        known: set[str] = set()
        if session_ids:
            known = {
                r[0]
                for r in db.execute(
                    "SELECT session_id FROM chat_sessions WHERE session_id IN "
                    f"({_placeholders(len(session_ids))})",
                    session_ids,
                )
            }
        existing: dict[str, str] = {}
        if keys:
            existing = dict(
                db.execute(
                    "SELECT ledger_key, status FROM deliveries WHERE ledger_key IN "
                    f"({_placeholders(len(keys))})",
                    keys,
                ).fetchall()
            )
        top = db.execute("SELECT coalesce(max(id), 0) FROM session_messages").fetchone()[0]
        ids: dict[int, int] = {}
        for i, m in enumerate(messages):
            if m.session_id in known:
                top += 1
                ids[i] = top
        dup: set[int] = set()
        seen: set[str] = set()
        for i, m in enumerate(messages):
            e = m.ledger
            if e is None:
                continue
            if e.key in seen or existing.get(e.key) == SENT:
                dup.add(i)
                continue
            seen.add(e.key)
            if not _record(db, e, m.session_id, known, ids.get(i), e.key in existing, now):
                dup.add(i)
        stored = [i for i in ids if i not in dup]
        db.executemany(
            _NEW_MESSAGE,
            [
                (ids[i], messages[i].session_id, messages[i].text or "", packed[i],
                 messages[i].job_id, now)
                for i in stored
            ],
        )  # fmt: skip
        return known, dup, [ids[i] for i in stored]

    return await sqlite_write(engine, run)


def _record(
    db: sqlite3.Connection,
    e: LedgerEntry,
    session_id: str,
    known: set[str],
    message_id: int | None,
    exists: bool,
    now: float,
) -> bool:
    """The ledger row of one web message: ``sent`` with its receipt when its session is
    known, ``failed`` when not; False when the row is not this batch's to write."""
    ok = session_id in known
    status = SENT if ok else FAILED
    error = None if ok else storable.text(f"unknown session {session_id!r}", cap=2000)
    receipt = str(message_id) if ok else None
    sent_at = now if ok else None
    if exists:
        cur = db.execute(
            _TAKE_OVER,
            (status, error, e.owner, sent_at, now, ok, receipt, ok, e.key),
        )
    else:
        cur = db.execute(
            _NEW_DELIVERY,
            (e.key, e.job_id, e.chain_run_id, e.recipient[:512], e.kind, e.item, status,
             error, e.owner, now, now, sent_at, receipt, True if ok else None),
        )  # fmt: skip
    return cur.rowcount == 1
