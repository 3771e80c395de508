"""The reconciler: what the database says must run but Redis no longer has is enqueued
again (expired leases, lost or stuck queue entries)."""

from __future__ import annotations

import logging

from jobs.queue import broker, store
from jobs.queue.runstate import RunnerState

log = logging.getLogger("skilljobs.worker")


class Reconciler(RunnerState):
    """Re-enqueues what Redis lost."""

    async def reconcile_once(self) -> int:
        """Re-enqueue what the database says must run but Redis no longer has.

        * running jobs whose lease expired (their worker died, e.g. ``kill -9``);
        * queued jobs whose arq entry is missing (Redis flushed or restarted without
          persistence) or stuck in-progress on a worker that died before claiming it (seen
          so at two passes in a row: a live worker's claim may be in flight at the first).
        """
        svc = self.svc
        redis = svc.redis
        assert redis is not None
        n = 0
        failed: list[str] = []
        for job_id, token in await store.expire_leases(svc.sessionmaker, failed=failed):
            await self._enqueue(job_id, token)
            n += 1
        self.tell_lost(failed)
        stale = await store.stale_queued(
            svc.sessionmaker, older_than=svc.settings.reconcile_stale_sec
        )
        if not stale:
            return n
        ids = [aid or store.arq_id(job_id, token) for job_id, token, aid in stale]
        states = await broker.entry_states(svc, ids)
        started_before, self._started_unclaimed = self._started_unclaimed, set()
        for (job_id, token, _), aid, (record, started) in zip(stale, ids, states, strict=True):
            if record and not started:
                continue  # waiting its turn in the queue
            if record and aid not in started_before:
                # Started but not claimed yet: a live worker claims within moments of
                # starting an entry (the read above may also predate its claim). Lost only
                # if it is still so at the next pass.
                self._started_unclaimed.add(aid)
                continue
            new = await store.bump_queued(svc.sessionmaker, job_id, token)
            if new is not None:
                log.info("job %s: lost from Redis, re-enqueued", job_id)
                await self._enqueue(job_id, new)
                n += 1
        return n
