"""The corpus of realistic skills (``tests/real_skills``) run on both lines: one sync
answer, one background job per origin, and what reached each origin."""

from __future__ import annotations

from typing import Any

from delivery.channels.web import list_messages
from jobs.queue import store
from jobs.queue.dispatcher import Dispatcher
from tests.helpers.jobs import drain
from tests.helpers.settings import TESTS

REAL_SKILLS = TESTS / "real_skills"

# skill → its input in the corpus run
CORPUS: dict[str, dict[str, Any]] = {
    "standup_notes": {"team": "core"},
    "dupe_finder": {"folder": "nope"},
    "flashcards": {"deck": "spanish"},
    "sysinfo_report": {},
    "model_costs": {},
    "bench_table": {},
    "site_crawl": {"budget": 50},
    "clip_frames": {"duration_sec": 10, "fps": 24},
}


def web_ctx(session: str, **extra: Any) -> dict[str, Any]:
    """A web chat session: ``async: true`` skills run synchronously here."""
    return {"channel": "web", "session_id": session, "role_id": "r1", "org_id": "o1", **extra}


def orgdeleg_ctx(session: str, **extra: Any) -> dict[str, Any]:
    """An orgdeleg web session: background job, delivered to the session."""
    return {**web_ctx(session, **extra), "external_id": f"orgdeleg:{session}"}


def tg_ctx(chat: str, **extra: Any) -> dict[str, Any]:
    return {"channel": "telegram", "actor_key": chat, "role_id": "r1", "org_id": "o1", **extra}


async def sync_answer(svc: Any, skill: str, inp: dict[str, Any], ctx: dict[str, Any]) -> Any:
    res = await Dispatcher(svc).dispatch(skill, inp, ctx)
    assert res.status_code == 200, (skill, res.status_code, res.body)
    return res.body


async def background(
    svc: Any, runs: list[tuple[str, dict[str, Any], dict[str, Any]]]
) -> tuple[list[str], list[dict[str, Any]]]:
    """Dispatch every ``(skill, input, ctx)`` to the background, drain with a real worker;
    returns the job ids and each job's receipt."""
    ids, receipts = [], []
    for skill, inp, ctx in runs:
        res = await Dispatcher(svc).dispatch(skill, inp, ctx)
        assert res.status_code == 202, (skill, res.body)
        ids.append(res.body["job_id"])
        receipts.append(res.body)
    await drain(svc)
    return ids, receipts


async def job_json(svc: Any, job_id: str) -> dict[str, Any]:
    """The job as the HTTP API shows it (SPEC §10 job shape)."""
    from dashboard.shapes import job_dict

    job = await store.get_job(svc.sessionmaker, job_id)
    return job_dict(job, [], [])


async def session_texts(svc: Any, session: str) -> list[str]:
    return [m["text"] for m in await list_messages(svc.sessionmaker, session)]


def chat_texts(tg: Any, chat: str) -> list[str]:
    return [m.get("text") or m.get("caption") or "" for m in tg.sent if m["chat_id"] == chat]
