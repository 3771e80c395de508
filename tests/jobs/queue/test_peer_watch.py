"""The peer watch between take-over passes (``JobRunner.peer_just_gone``), on SQLite and
PostgreSQL with real Redis: a live peer whose heartbeat key goes is noticed at the next
look; a key gone for longer than 2 s, a stopped peer and a peer that is still beating are
not reasons to take over."""

from __future__ import annotations

import asyncio

import pytest

from delivery import notices
from delivery.pipeline import postprocess
from jobs.queue import broker, store
from jobs.queue.broker import WORKER_HEARTBEAT
from jobs.queue.runner import JobRunner


@pytest.mark.slow
async def test_a_peers_heartbeat_key_going_is_noticed_at_the_next_look(services) -> None:
    alone = JobRunner(services, services.executor, "me", finisher=postprocess, notices=notices)
    assert await alone.peer_just_gone() is False  # no peers at all
    await store.worker_heartbeat(services.sessionmaker, "peer", "host", 1, [])
    await store.worker_heartbeat(services.sessionmaker, "me", "host", 2, [])
    await broker.beat(services, "peer", {"id": "peer"}, 30)
    me = JobRunner(services, services.executor, "me", finisher=postprocess, notices=notices)
    assert await me.peer_just_gone() is False  # beating
    await services.redis.delete(services.settings.key(WORKER_HEARTBEAT, "peer"))
    assert await me.peer_just_gone() is True  # gone: take over now
    assert await me.peer_just_gone() is True  # and at each look for 2 s
    await asyncio.sleep(2.1)
    assert await me.peer_just_gone() is False  # left to the once-a-second passes


@pytest.mark.slow
async def test_a_stopped_peer_is_not_watched(services) -> None:
    me = JobRunner(services, services.executor, "me", finisher=postprocess, notices=notices)
    await store.worker_heartbeat(services.sessionmaker, "peer", "host", 1, [])
    await store.worker_heartbeat(services.sessionmaker, "peer", "host", 1, [], stopped=True)
    assert await me.peer_just_gone() is False  # its key is gone, but it stopped cleanly
