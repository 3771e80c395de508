"""Leases: the one attempt working on a row (a job, a chain run) holds the row's lease.

An attempt *claims* a row with a conditional UPDATE that moves it to ``running`` under the
next ``lease_token`` and names its worker the owner until ``lease_expires_at``; the worker
*renews* the lease while it works (its heartbeat). Every later write on behalf of the
attempt is *fenced* by the token, so an attempt whose lease was taken over (its worker
paused, partitioned or presumed dead) can never record anything. A lease that ran out, or
whose owner's heartbeat key is gone from Redis, is *taken over*: the rows are found by
:meth:`Leases.expired` and handed to the next attempt by a fenced write.

One :class:`Leases` per leased table: ``jobs`` (``jobs.queue.store``, the only writer of
jobs) and ``chain_runs`` (``chains.runstore``). This module builds the statements and
runs the reads; each table's store runs the writes in its own transactions.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import TypeAlias, TypeVar, cast

from sqlalchemy import ColumnElement, Table, and_, literal_column, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.dml import Update
from sqlalchemy.sql.elements import BindParameter

from jobs.db import Sessions, rowcount
from jobs.models import Base
from jobs.queue import broker
from jobs.services import Services

T = TypeVar("T")
#: a value a statement is built with: known now, bound when it runs (a statement prepared
#: once), or a column expression
Bound: TypeAlias = T | BindParameter[T] | ColumnElement[T]


def table_of(model: type[Base]) -> Table:
    """The Core table of a mapped class (leases are written without the ORM's unit of work)."""
    return cast(Table, model.__table__)


@dataclass(frozen=True, slots=True)
class Leases:
    """The lease columns of one table (``id``, ``status``, ``lease_token``, ``lease_owner``,
    ``lease_expires_at``) and the status its rows have while their lease is held."""

    table: Table
    running: str

    def held(self, row_id: Bound[str], token: Bound[int]) -> ColumnElement[bool]:
        """The fence: ``row_id`` is running under the lease ``token``."""
        c = self.table.c
        return and_(c.id == row_id, c.lease_token == token, c.status == self.running)

    def claim(
        self,
        *where: ColumnElement[bool],
        owner: Bound[str],
        expires: Bound[float],
        **values: object,
    ) -> Update:
        """The claim of the rows matching ``where``: ``running`` under the next token, owned
        by ``owner`` until ``expires``; ``values``: more columns set with it. The status is
        rendered into the SQL (no anonymous parameter)."""
        c = self.table.c
        return (
            update(self.table)
            .where(*where)
            .values(
                status=literal_column(f"'{self.running}'"),
                lease_token=c.lease_token + literal_column("1"),
                lease_owner=owner,
                lease_expires_at=expires,
                **values,
            )
        )

    def fenced(self, row_id: Bound[str], token: Bound[int], *, running: bool = True) -> Update:
        """An UPDATE of ``row_id`` that writes nothing unless the attempt holding ``token``
        still holds its lease. ``running=False``: whatever the row's status (a chain run's
        writes after its final status, made by the attempt that set it)."""
        c = self.table.c
        if running:
            return update(self.table).where(self.held(row_id, token))
        return update(self.table).where(c.id == row_id, c.lease_token == token)

    def release(self, row_id: str, token: int, *, status: str, **values: object) -> Update:
        """The attempt holding ``token`` lets go of ``row_id``: ``status`` now, no owner, no
        expiry (fenced); ``values``: more columns set with it."""
        return self.fenced(row_id, token).values(
            status=status, lease_owner=None, lease_expires_at=None, **values
        )

    def renew(self, *where: ColumnElement[bool], expires: Bound[float]) -> Update:
        """The renewal of the leases matching ``where``: held until ``expires``."""
        return update(self.table).where(*where).values(lease_expires_at=expires)

    def expired(
        self, before: float, owners: Collection[str] | None = None
    ) -> list[ColumnElement[bool]]:
        """The conditions of the running rows whose lease ends before ``before`` (renewed
        longer ago than a live worker lets it be); ``owners``: of those workers only."""
        c = self.table.c
        found = [c.status == self.running, c.lease_expires_at < before]
        if owners is not None:
            found.append(c.lease_owner.in_(sorted(owners)))
        return found

    async def stale_owners(self, sm: Sessions, before: float, *, exclude: str) -> list[str]:
        """Workers other than ``exclude`` holding a lease that ends before ``before``."""
        c = self.table.c
        async with sm() as s:
            rows = await s.scalars(
                select(c.lease_owner)
                .where(*self.expired(before), c.lease_owner.is_not(None), c.lease_owner != exclude)
                .distinct()
            )
            return sorted(str(o) for o in rows if o)

    async def holds(self, sm: Sessions, row_id: str, token: int) -> bool:
        """The fence, asked of the database: does the attempt holding ``token`` still own
        ``row_id``?"""
        async with sm() as s:
            found = await s.scalar(select(self.table.c.id).where(self.held(row_id, token)))
            return found is not None


async def presumed_dead(
    services: Services, leases: Leases, *, me: str, missing_after: float
) -> tuple[float, set[str]]:
    """The peers of worker ``me`` presumed dead, whose leases of ``leases`` are taken over
    without waiting for them to run out; and ``before``, the bound of those leases' expiry.

    Two signs, both needed: the peer's heartbeat key is gone from Redis *and* its leases
    were last renewed more than ``missing_after`` seconds ago. A Redis flush (keys gone,
    leases fresh) or a database outage (renewals late, keys fresh) is never taken for a
    death."""
    before = time.time() + services.settings.worker_lease_sec - missing_after
    owners = await leases.stale_owners(services.sessionmaker, before, exclude=me)
    if not owners:
        return before, set()
    up = await broker.alive(services, owners)
    return before, {o for o, alive in zip(owners, up, strict=True) if not alive}


async def write_fenced(s: AsyncSession, stmt: Update) -> bool:
    """Run a fenced write of one row in ``s``: True when it was written, else the
    transaction is rolled back (the attempt no longer holds the lease)."""
    if rowcount(await s.execute(stmt)) == 1:
        return True
    await s.rollback()
    return False


__all__ = ["Bound", "Leases", "presumed_dead", "table_of", "write_fenced"]
