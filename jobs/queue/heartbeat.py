"""The leases of the jobs a worker holds (``jobs.queue.lease``): renewed by its heartbeat,
checked before each send, given up when the process was paused past them; the take-over
of the jobs of peers presumed dead; cancels asked of running jobs."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable

from jobs.db import db_unavailable
from jobs.execution import subproc
from jobs.models import JobRow
from jobs.queue import broker, lease, prefetch, store
from jobs.queue.runstate import RunnerState

log = logging.getLogger("skilljobs.worker")


class LeaseKeeper(RunnerState):
    """The worker's side of the leases of its jobs."""

    def cancel_local(self, job_id: str) -> bool:
        task = self.inner.get(job_id)
        if task is None or task.done():
            if self.gate is not None and self.gate.refuse(job_id, prefetch.CANCEL):
                self.cancel_asked.add(job_id)  # claimed ahead: recorded cancelled, never run
                return True
            return False
        self.cancel_asked.add(job_id)
        task.cancel()
        return True

    def resumed(self) -> None:
        """This process was continued after a stop (SIGCONT). When it was stopped long
        enough for peers to presume it dead, its skills must not go on to complete as if
        nothing happened (a peer may be running them again): they are stopped before they
        take another step, and their jobs handed back (fenced)."""
        gap = time.time() - self.last_beat
        if gap < self.missing_after - 0.5:  # (the key expires 3 intervals + 1 s after its write)
            return
        for job_id in list(self.held):
            if self.gate is not None and self.gate.refuse(job_id, prefetch.SUSPECT):
                self.suspect.add(job_id)  # claimed ahead, not started: given back unstarted
        # Before anything else: a peer may be running these jobs again already.
        subproc.kill_owned(job_id for job_id, task in self.inner.items() if not task.done())
        for job_id, task in list(self.inner.items()):
            if not task.done():
                log.warning(
                    "job %s: this worker was paused %.1fs (peers may have taken over), "
                    "stopping its run",
                    job_id,
                    gap,
                )
                self.suspect.add(job_id)
                task.cancel()
                for inner in self.skill_tasks.get(job_id, ()):
                    inner.cancel()  # now, before their own wake-ups run

    async def heartbeat_once(self) -> None:
        s = self.svc.settings
        if self.svc.redis is not None:
            # First and on its own: a database outage must not silence it, or peers
            # would take over the jobs of a worker that is alive.
            try:
                await broker.beat(
                    self.svc,
                    self.worker_id,
                    {
                        "id": self.worker_id,
                        "running": sorted(self.held),
                        "at": time.time(),
                        "stalls": self.stall.stalls if self.stall else 0,
                        "max_lag_s": round(self.stall.max_lag, 3) if self.stall else 0.0,
                        **self.vitals(),
                    },
                    self.missing_after,
                )
                self.last_beat = time.time()
            except Exception as exc:
                log.warning("heartbeat key not written: %s: %s", type(exc).__name__, exc)
        held = dict(self.held)
        asked_at = time.time()
        found = await store.renew_leases(
            self.svc.sessionmaker, self.worker_id, held, s.worker_lease_sec
        )
        still, cancel = found.still, found.cancel
        for job_id in still:
            if job_id in self.lease_until:
                self.lease_until[job_id] = asked_at + self.certain_for
        for job_id in held:
            if job_id in still or job_id in found.busy:
                continue  # (busy: locked by a finish in flight; neither renewed nor lost)
            if job_id in self.held and self.held[job_id] == held[job_id]:
                # Someone else owns it now (we were presumed dead): stop, record nothing.
                self.lost.add(job_id)
                task = self.inner.get(job_id)
                if task and not task.done():
                    subproc.kill_owned([job_id])  # now: the new owner may have started it
                    task.cancel()
                elif self.gate is not None:
                    self.gate.refuse(job_id, prefetch.LOST)  # claimed ahead, not started
        for job_id in cancel:
            self.cancel_local(job_id)
        await store.worker_heartbeat(
            self.svc.sessionmaker,
            self.worker_id,
            socket.gethostname(),
            os.getpid(),
            sorted(self.held),
            stalls=(self.stall.stalls, round(self.stall.max_lag, 3)) if self.stall else None,
        )

    async def take_over_once(self) -> int:
        """Re-run the jobs of peers presumed dead (:func:`jobs.queue.lease.presumed_dead`:
        heartbeat key gone *and* leases unrenewed for :attr:`missing_after` seconds),
        without waiting for their leases. The take-over is fenced like a lease expiry.
        """
        svc = self.svc
        before, dead = await lease.presumed_dead(
            svc, store.LEASES, me=self.worker_id, missing_after=self.missing_after
        )
        if not dead:
            return 0
        n = 0
        failed: list[str] = []
        for job_id, token in await store.expire_leases(
            svc.sessionmaker, owners=dead, before=before, why="missed 3 heartbeats", failed=failed
        ):
            log.warning("job %s: its worker missed 3 heartbeats, re-run here", job_id)
            await self._enqueue(job_id, token)
            n += 1
        self.tell_lost(failed)
        return n

    async def peer_just_gone(self) -> bool:
        """Has a live peer's heartbeat key gone within the last 2 s? Looked at between the
        take-over passes (once a second: their read of the jobs table costs more than a
        Redis lookup), so that the worker can run them at once — a dead peer's leases go
        stale with its key, and the job of a worker killed with -9 is re-run within a
        quarter of a second of its death being certain (8.5 s after its last beat at the
        default heartbeat), not up to a second later. A key gone for longer is left to the
        regular passes (a Redis flush takes every key while the leases stay fresh: the
        take-over then finds nothing to do)."""
        svc = self.svc
        now = time.monotonic()
        if now - self._peers_read >= 1.0:
            self._peers_read = now
            since = time.time() - svc.settings.worker_lease_sec - self.missing_after
            self._peers = await store.live_peers(
                svc.sessionmaker, exclude=self.worker_id, since=since
            )
        if not self._peers:
            self._gone_since.clear()
            return False
        alive = await broker.alive(svc, self._peers)
        gone = {p for p, up in zip(self._peers, alive, strict=True) if not up}
        self._gone_since = {p: self._gone_since.get(p, now) for p in gone}
        return any(now - t <= 2.0 for t in self._gone_since.values())

    async def _still_held(self, job: JobRow) -> bool:
        """Does this attempt still hold ``job``'s lease? While the database is away too, it is
        taken to (nobody can take a job over without the database)."""
        token = self.held.get(job.id)
        if token is None:
            return False
        try:
            return await store.holds_lease(self.svc.sessionmaker, job.id, token)
        except Exception as exc:
            if db_unavailable(exc):
                return True
            raise

    def _fence(self, job: JobRow, token: int) -> Callable[[], Awaitable[bool]]:
        """Whether this attempt still holds the job's lease (checked before each send)."""
        margin = self.certain_for / 3  # room for clock skew between hosts

        async def fence() -> bool:
            # Nobody can take a lease before it expires or before our heartbeat has been
            # missing for 3 intervals, so while both are comfortably ahead the answer is
            # known without asking the database.
            if job.id in self.lost:
                return False
            if time.time() < self.lease_until.get(job.id, 0.0) - margin:
                return True
            return await store.holds_lease(self.svc.sessionmaker, job.id, token)

        return fence
