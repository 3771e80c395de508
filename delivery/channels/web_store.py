"""Storage of web-session messages in batches, each message with its delivery-ledger row
in the same write (a web delivery is recorded exactly once, with no window).

``store_batch`` (any backend: one transaction) and ``store_batch_pg`` (PostgreSQL: one
autocommitted statement) return the same thing: the sessions that exist, the indexes of the
messages delivered already, and the ids of the messages stored, in order. Each ledger row
gets its message's id as its receipt in the same write.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from delivery.ledger import LedgerEntry, record_web_deliveries, record_web_receipts
from jobs import storable
from jobs.db import raw_fetch
from jobs.models import ChatSession, SessionMessage


@dataclass
class Outgoing:
    """One message to store on a session (bulk API)."""

    session_id: str
    text: str = ""
    attachments: list[Any] = field(default_factory=list)
    job_id: str | None = None
    #: record the delivery in the ledger in the same transaction (exactly once, no window)
    ledger: LedgerEntry | None = None


def _storable(m: Outgoing) -> Outgoing:
    """The message with its text and attachments fit for storage (``jobs.storable``)."""
    text = storable.text(m.text or "", cap=storable.JSON_CAP) or ""
    attachments = storable.json_value(list(m.attachments or []))
    if text is m.text and attachments == list(m.attachments or []):
        return m
    return Outgoing(m.session_id, text, attachments, m.job_id, m.ledger)


async def store_batch(
    sessionmaker: async_sessionmaker[AsyncSession],
    messages: list[Outgoing],
    now: float,
) -> tuple[set[str], set[int], list[int]]:
    """Sessions that exist, indexes delivered already, ids of the stored messages (in order)."""
    messages = [_storable(m) for m in messages]
    ids = sorted({m.session_id for m in messages if m.session_id})
    async with sessionmaker() as s:
        known = set(
            (
                await s.execute(
                    select(ChatSession.session_id).where(ChatSession.session_id.in_(ids))
                )
            ).scalars()
        )
        keyed = [(i, m.session_id, m.ledger) for i, m in enumerate(messages) if m.ledger]
        dup = await record_web_deliveries(s, keyed, known, now) if keyed else set()
        rows = [
            {
                "session_id": m.session_id,
                "text": m.text or "",
                "attachments": list(m.attachments or []),
                "job_id": m.job_id,
                "created_at": now,
            }
            for i, m in enumerate(messages)
            if m.session_id in known and i not in dup
        ]
        new_ids: list[int] = []
        if rows:
            res = await s.execute(
                insert(SessionMessage).returning(SessionMessage.id, sort_by_parameter_order=True),
                rows,
            )
            new_ids = list(res.scalars())
        stored = [m for i, m in enumerate(messages) if m.session_id in known and i not in dup]
        receipts = [
            (m.ledger.key, str(n)) for m, n in zip(stored, new_ids, strict=True) if m.ledger
        ]
        if receipts:  # the stored message's id is the receipt, in the same transaction
            await record_web_receipts(s, receipts)
        await s.commit()
    return known, dup, new_ids


async def store_batch_pg(
    pg: AsyncEngine, messages: list[Outgoing], now: float
) -> tuple[set[str], set[int], list[int]]:
    """:func:`store_batch` on PostgreSQL: one autocommitted statement for the whole batch."""
    messages = [_storable(m) for m in messages]
    led = [m.ledger for m in messages]
    rows = await raw_fetch(
        pg,
        _PG_STORE,
        list(range(len(messages))),
        [m.session_id or "" for m in messages],
        [m.text or "" for m in messages],
        [json.dumps(list(m.attachments or []), ensure_ascii=False) for m in messages],
        [m.job_id for m in messages],
        [e.key if e else None for e in led],
        [e.job_id if e else None for e in led],
        [e.chain_run_id if e else None for e in led],
        [e.recipient[:512] if e else None for e in led],
        [e.kind if e else None for e in led],
        [e.item if e else None for e in led],
        [e.owner if e else None for e in led],
        now,
    )
    known: set[str] = set()
    dup: set[int] = set()
    new_ids: list[int] = []
    for idx, ok, fresh, new_id in sorted(tuple(r) for r in rows):
        if ok:
            known.add(messages[idx].session_id)
        if not fresh:
            dup.add(idx)
        elif new_id is not None:
            new_ids.append(new_id)
    return known, dup, new_ids


# The ledger rule of ``record_web_deliveries`` as one statement: the first message of each
# ledger key inserts its row or takes over a pending/failed one (ON CONFLICT locks it, like
# FOR UPDATE); a key already sent, or sent by a concurrent transaction, skips its message.
# Message ids are drawn up front (for every message of a known session, in order; a skipped
# one leaves a gap) so each input row learns its own and each ledger row its receipt.
_PG_STORE = """
WITH req AS (
  SELECT * FROM unnest(
    $1::int[], $2::text[], $3::text[],
    $4::text[], $5::text[], $6::text[],
    $7::text[], $8::text[], $9::text[],
    $10::text[], $11::text[], $12::text[]
  ) AS r(idx, session_id, text, attachments, job_id, lkey, ljob, lchain, lrecip, lkind,
         litem, lowner)
), known AS (
  SELECT req.*,
    EXISTS (SELECT 1 FROM chat_sessions cs WHERE cs.session_id = req.session_id) AS ok,
    row_number() OVER (PARTITION BY lkey ORDER BY idx) AS nth
  FROM req
), ids AS (
  SELECT idx, nextval(pg_get_serial_sequence('session_messages', 'id')) AS new_id
  FROM (SELECT idx FROM known WHERE ok ORDER BY idx) AS ordered
), led AS (
  INSERT INTO deliveries AS d (ledger_key, job_id, chain_run_id, recipient, channel, kind,
    item, status, error, tries, claimed_by, created_at, updated_at, sent_at, message_id,
    verified)
  SELECT lkey, ljob, lchain, lrecip, 'web', lkind, litem,
    CASE WHEN ok THEN 'sent' ELSE 'failed' END,
    CASE WHEN ok THEN NULL ELSE 'unknown session ' || quote_literal(session_id) END,
    1, lowner, $13::float8, $13::float8, CASE WHEN ok THEN $13::float8 END,
    ids.new_id::text, CASE WHEN ok THEN true END
  FROM known LEFT JOIN ids USING (idx) WHERE lkey IS NOT NULL AND nth = 1
  ORDER BY lkey
  ON CONFLICT (ledger_key) DO UPDATE SET status = EXCLUDED.status, error = EXCLUDED.error,
    claimed_by = EXCLUDED.claimed_by, sent_at = EXCLUDED.sent_at,
    updated_at = EXCLUDED.updated_at, tries = d.tries + 1,
    message_id = EXCLUDED.message_id, verified = EXCLUDED.verified
  WHERE d.status <> 'sent'
  RETURNING ledger_key
), judged AS (
  SELECT known.*,
    (lkey IS NULL OR (nth = 1 AND lkey IN (SELECT ledger_key FROM led))) AS fresh
  FROM known
), keep AS (
  SELECT judged.idx, session_id, text, attachments, job_id, ids.new_id
  FROM judged JOIN ids USING (idx) WHERE ok AND fresh
), msg AS (
  INSERT INTO session_messages (id, session_id, text, attachments, job_id, created_at)
  SELECT new_id, session_id, text, CAST(attachments AS JSONB), job_id, $13::float8
  FROM keep ORDER BY idx
  RETURNING id
)
SELECT judged.idx, judged.ok, judged.fresh, keep.new_id
FROM judged LEFT JOIN keep ON keep.idx = judged.idx"""
