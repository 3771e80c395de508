"""What a drain costs, per job: the CPU of each process it uses and what it writes.

* CPU: this process (the worker: ``time.process_time``), the PostgreSQL backends connected
  to the bench's database and the Redis server (``psutil`` cpu_times of those processes,
  before and after; a backend that appeared meanwhile counts in full). Redis is the
  server's whole CPU: on a shared server others' commands are in it (``--own-redis``).
* Statements: counted where asyncpg sends them (one per execution; an ``executemany`` of
  n rows is n executions in one round trip), transaction control (BEGIN/COMMIT) apart.
  pg_stat_statements would need a server restart on a shared host.
* Rows and transactions: ``pg_stat_database`` / ``pg_stat_user_tables`` of the bench's
  database. Backends report their counters when they exit, so the pool is emptied before
  and after the measured drain.
* WAL: ``pg_current_wal_lsn()`` before and after (the whole cluster: others' writes too)
  and, with pg_walinspect, the bytes of the records that touch the bench's database plus
  the commit records of their transactions.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "START")


@dataclass
class Statements:
    """Executions and round trips seen by asyncpg while :meth:`counting`."""

    executions: int = 0
    round_trips: int = 0
    control: int = 0
    by_verb: dict[str, int] = field(default_factory=dict)

    def _note(self, query: str, n: int = 1) -> None:
        verb = query.lstrip().split(None, 1)[0].upper() if query.strip() else "?"
        if verb.startswith(_CONTROL):
            self.control += 1
            return
        if verb == "WITH":  # a CTE: name it by what its outer statement does
            verb = next((v for v in ("INSERT", "UPDATE", "DELETE") if v in query.upper()), "SELECT")
        self.executions += n
        self.round_trips += 1
        self.by_verb[verb] = self.by_verb.get(verb, 0) + n

    @contextlib.contextmanager
    def counting(self) -> Iterator[Statements]:
        """Count the statements of every asyncpg connection of this process meanwhile."""
        from asyncpg.connection import Connection
        from asyncpg.prepared_stmt import PreparedStatement

        me = self

        async def _execute(self: Any, query: str, args: Any, *a: Any, **kw: Any) -> Any:
            me._note(query)
            return await saved[(Connection, "_execute")](self, query, args, *a, **kw)

        async def _executemany(self: Any, query: str, args: Any, *a: Any, **kw: Any) -> Any:
            args = list(args)
            me._note(query, len(args))
            return await saved[(Connection, "_executemany")](self, query, args, *a, **kw)

        async def execute(self: Any, query: str, *args: Any, **kw: Any) -> Any:
            if not args:  # (with args it goes through _execute)
                me._note(query)
            return await saved[(Connection, "execute")](self, query, *args, **kw)

        async def bind_execute(self: Any, args: Any, *a: Any, **kw: Any) -> Any:
            me._note(self._query)
            return await saved[(PreparedStatement, "_PreparedStatement__bind_execute")](
                self, args, *a, **kw
            )

        async def executemany(self: Any, args: Any, *a: Any, **kw: Any) -> Any:
            args = list(args)
            me._note(self._query, len(args))
            return await saved[(PreparedStatement, "executemany")](self, args, *a, **kw)

        wrappers = {
            (Connection, "_execute"): _execute,
            (Connection, "_executemany"): _executemany,
            (Connection, "execute"): execute,
            (PreparedStatement, "_PreparedStatement__bind_execute"): bind_execute,
            (PreparedStatement, "executemany"): executemany,
        }
        saved: dict[tuple[type, str], Any] = {key: vars(key[0])[key[1]] for key in wrappers}
        for (cls, name), fn in wrappers.items():
            setattr(cls, name, fn)
        try:
            yield self
        finally:
            for (cls, name), fn in saved.items():
                setattr(cls, name, fn)


def _cpu(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
    return out


class Meter:
    """Around one drain: ``await start()``, the drain, ``await stop(n)`` -> per-job costs."""

    def __init__(self, engine: AsyncEngine | None, redis: Any) -> None:
        self.engine = engine  # None: no database (raw arq)
        self.redis = redis
        self.statements = Statements()
        self._counting: contextlib.AbstractContextManager[Statements] | None = None

    async def _redis_pid(self) -> int | None:
        with contextlib.suppress(Exception):
            info = await self.redis.info("server")
            return int(info["process_id"])
        return None

    async def _backends(self) -> list[int]:
        assert self.engine is not None
        async with self.engine.connect() as c:
            rows = await c.execute(
                text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid()"
                )
            )
            return [r[0] for r in rows]

    async def _db(self) -> dict[str, Any]:
        assert self.engine is not None
        async with self.engine.connect() as c:
            db = (
                await c.execute(
                    text(
                        "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated,"
                        " tup_deleted, pg_current_wal_lsn()::text"
                        " FROM pg_stat_database WHERE datname = current_database()"
                    )
                )
            ).one()
            tables = {
                r[0]: (r[1], r[2], r[3], r[4])
                for r in await c.execute(
                    text(
                        "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del"
                        " FROM pg_stat_user_tables"
                    )
                )
            }
            wal = (
                await c.execute(text("SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal"))
            ).one()
        return {"db": tuple(db), "tables": tables, "wal": tuple(float(v) for v in wal)}

    async def _settle(self) -> None:
        """Empty the pool: its backends exit and so report their counters."""
        assert self.engine is not None
        await self.engine.dispose()
        await asyncio.sleep(0.2)  # (the exiting backends' counters reach shared memory)

    async def start(self) -> None:
        self._rpid = await self._redis_pid()
        if self.engine is not None:
            with contextlib.suppress(Exception):  # (read at the end: not in the figures)
                async with self.engine.begin() as c:
                    await c.execute(text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))
            await self._keep_wal()
            await self._settle()
            self._db0 = await self._db()
            self._pg0 = _cpu(await self._backends())
        self._redis0 = _cpu([self._rpid]) if self._rpid else {}
        self._counting = self.statements.counting()
        self._counting.__enter__()
        self._t0 = time.process_time()

    async def stop(self, n: int) -> dict[str, Any]:
        worker = time.process_time() - self._t0
        assert self._counting is not None
        self._counting.__exit__(None, None, None)
        redis = sum(_cpu([self._rpid]).values()) - sum(self._redis0.values()) if self._rpid else 0
        us = 1e6 / n
        out: dict[str, Any] = {
            "cpu_us_per_job": {"worker": worker * us, "redis_server": redis * us},
        }
        if self.engine is None:
            out["cpu_us_per_job"]["total"] = (worker + redis) * us
            return out
        pg1 = _cpu(await self._backends())
        pg = sum(v - self._pg0.get(pid, 0.0) for pid, v in pg1.items())
        out["cpu_us_per_job"]["postgres_backends"] = pg * us
        out["cpu_us_per_job"]["total"] = (worker + redis + pg) * us
        await self._settle()
        db1 = await self._db()
        d0, d1 = self._db0["db"], db1["db"]
        st = self.statements
        out["db_per_job"] = {
            "statements": st.executions / n,
            "round_trips": st.round_trips / n,
            "transaction_control": st.control / n,
            "statements_by_verb": {k: round(v / n, 3) for k, v in sorted(st.by_verb.items())},
            "transactions": (d1[0] - d0[0] + d1[1] - d0[1]) / n,
            "rows_inserted": (d1[2] - d0[2]) / n,
            "rows_updated": (d1[3] - d0[3]) / n,
            "rows_deleted": (d1[4] - d0[4]) / n,
            "rows_by_table": _tables(self._db0["tables"], db1["tables"], n),
        }
        w0, w1 = self._db0["wal"], db1["wal"]
        out["wal_per_job"] = {
            "cluster_bytes": (w1[2] - w0[2]) / n,  # everyone's writes on this server
            "cluster_records": (w1[0] - w0[0]) / n,
            **await self._our_wal(d0[5], d1[5], n),
        }
        return out

    async def _keep_wal(self) -> None:
        """A temporary replication slot (dropped with its connection, after the WAL is
        read): a checkpoint must not recycle the drain's WAL before it is inspected."""
        import asyncpg

        assert self.engine is not None
        self._slot: Any = None
        try:
            url = self.engine.url.set(drivername="postgresql").render_as_string(False)
            self._slot = await asyncpg.connect(url)
            await self._slot.execute(
                "SELECT pg_create_physical_replication_slot($1, true, true)",
                f"bench_{uuid.uuid4().hex[:12]}",
            )
        except Exception:  # no slot (no privilege, none free): the WAL may be gone by then
            if self._slot is not None:
                await self._slot.close()
            self._slot = None

    async def _our_wal(self, lsn0: str, lsn1: str, n: int) -> dict[str, float]:
        try:
            return await self._inspect_wal(lsn0, lsn1, n)
        finally:
            if self._slot is not None:
                await self._slot.close()  # (the temporary slot goes with it)
                self._slot = None

    async def _inspect_wal(self, lsn0: str, lsn1: str, n: int) -> dict[str, float]:
        """The WAL of this database's records (and their commits), via pg_walinspect."""
        assert self.engine is not None
        try:
            async with self.engine.connect() as c:
                row = (
                    await c.execute(
                        text(
                            "WITH r AS (SELECT xid::text AS x, resource_manager AS rm,"
                            "  record_length AS len, fpi_length AS fpi,"
                            "  coalesce(block_ref, '') LIKE '%/' || d.oid || '/%' AS mine"
                            "  FROM pg_get_wal_records_info(CAST(CAST(:a AS text) AS pg_lsn),"
                            "   CAST(CAST(:b AS text) AS pg_lsn)), pg_database d"
                            "  WHERE d.datname = current_database()),"
                            " ours AS (SELECT DISTINCT x AS id FROM r WHERE mine AND x <> '0'),"
                            " o AS (SELECT * FROM r WHERE mine"
                            "  OR (rm = 'Transaction' AND x IN (SELECT id FROM ours)))"
                            " SELECT count(*), coalesce(sum(len), 0), coalesce(sum(fpi), 0),"
                            "  count(*) FILTER (WHERE rm = 'Transaction') FROM o"
                        ),
                        {"a": lsn0, "b": lsn1},
                    )
                ).one()
        except Exception as exc:  # no pg_walinspect (PostgreSQL < 15), or the WAL recycled
            reason = str(getattr(exc, "orig", exc)).splitlines()[0][:160]
            return {"database_bytes": float("nan"), "note": f"pg_walinspect: {reason}"}  # type: ignore[dict-item]
        return {
            "database_records": float(row[0]) / n,
            "database_bytes": float(row[1]) / n,
            "database_fpi_bytes": float(row[2]) / n,
            "database_commit_records": float(row[3]) / n,
        }


def _tables(
    t0: dict[str, tuple[int, ...]], t1: dict[str, tuple[int, ...]], n: int
) -> dict[str, dict[str, float]]:
    out = {}
    for name, v1 in sorted(t1.items()):
        v0 = t0.get(name, (0, 0, 0, 0))
        ins, upd, hot, dele = (b - a for a, b in zip(v0, v1, strict=True))
        if ins or upd or dele:
            row = {"ins": ins / n, "upd": upd / n, "hot_upd": hot / n, "del": dele / n}
            out[name] = {k: round(v, 3) for k, v in row.items() if v}
    return out


__all__ = ["Meter", "Statements"]
