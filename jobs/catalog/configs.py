"""Per-role skill configuration (skill spec §5): values by ``role_id + skill + key``.

Secret-named keys (``jobs.crypto.is_secret_key``) are stored only Fernet-encrypted in
``value_enc``; ``value`` holds non-secrets. Reads for execution decrypt; reads for people
(``masked``) never show a secret.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy import RowMapping, bindparam, select
from sqlalchemy.exc import IntegrityError

from jobs.context import config_key
from jobs.crypto import ENC_TAG, REDACTED, SecretBox, is_secret_key
from jobs.db import Sessions, autocommit, engine_of, raw_fetch
from jobs.models import SkillConfig, config_generation

MAX_ID = 128
MAX_VALUE_CHARS = 64_000


class ConfigChanged(Exception):
    """A write that depended on the configuration generation found another one current
    (``generation``): nothing was written."""

    def __init__(self, generation: int) -> None:
        super().__init__(f"the configurations are at generation {generation} now")
        self.generation = generation


def _check_id(what: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty string")
    text: str = value.strip()
    if len(text) > MAX_ID:
        raise ValueError(f"{what} is longer than {MAX_ID} characters")
    return text


def _check_key(key: object) -> str:
    if not isinstance(key, str):
        raise ValueError("config keys must be strings")
    k = config_key(key)
    if not k:
        raise ValueError(f"config key {key!r} is empty")
    if len(k) > MAX_ID:
        raise ValueError(f"config key {k[:20]!r}… is longer than {MAX_ID} characters")
    if k.upper().startswith("SKILLJOBS_"):
        raise ValueError(
            f"config key {k!r}: SKILLJOBS_* names are the worker's own settings and are "
            "never handed to a skill; give the skill its own credential under another name"
        )
    return k


def _check_value(key: str, value: object) -> None:
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"config {key!r}: value must be JSON data ({exc})") from None
    if len(text) > MAX_VALUE_CHARS:
        raise ValueError(f"config {key!r}: value is longer than {MAX_VALUE_CHARS} characters")


_cfg = SkillConfig.__table__
_GET = (
    select(_cfg.c.key, _cfg.c.value, _cfg.c.value_enc, _cfg.c.is_secret)
    .where(_cfg.c.role_id == bindparam("role"), _cfg.c.skill == bindparam("skill"))
    .order_by(_cfg.c.key)
)

# The configuration generation and the rows of the wanted pairs, in one statement (so
# one snapshot: the rows are those of that generation). The generation row always exists,
# so a read that finds no configuration still says at which generation.
_PG_SNAPSHOT = (
    "SELECT g.generation, c.role_id, c.skill, c.key, c.value, c.value_enc, c.is_secret "
    "FROM config_generation g LEFT JOIN skill_configs c "
    "ON c.role_id = ANY($1::text[]) AND c.skill = ANY($2::text[]) WHERE g.id = 1 ORDER BY c.key"
)
_gen = config_generation


class ConfigStore:
    """``set`` / ``replace`` / ``get`` / ``masked`` / ``prefetch`` on the ``skill_configs`` table."""

    def __init__(self, sessionmaker: Sessions, box: SecretBox) -> None:
        self.sessionmaker = sessionmaker
        self.box = box

    def _fill(self, row: SkillConfig, key: str, value: object) -> None:
        secret = is_secret_key(key)
        row.is_secret = secret
        row.updated_at = time.time()
        if secret:
            row.value = None
            row.value_enc = self.box.encrypt(value)[ENC_TAG]
        else:
            row.value = value
            row.value_enc = None

    async def set(self, role_id: str, skill: str, key: str, value: object) -> None:
        """Store one value (``None`` deletes the key)."""
        role_id, skill, key = (
            _check_id("role_id", role_id),
            _check_id("skill", skill),
            _check_key(key),
        )
        if value is not None:
            _check_value(key, value)
        for attempt in range(2):
            try:
                async with self.sessionmaker() as s, s.begin():
                    row = await s.scalar(
                        select(SkillConfig).where(
                            SkillConfig.role_id == role_id,
                            SkillConfig.skill == skill,
                            SkillConfig.key == key,
                        )
                    )
                    if value is None:
                        if row is not None:
                            await s.delete(row)
                        return
                    if row is None:
                        row = SkillConfig(role_id=role_id, skill=skill, key=key)
                        s.add(row)
                    self._fill(row, key, value)
                return
            except IntegrityError:
                if attempt:
                    raise  # a concurrent writer inserted the same key twice in a row

    async def replace(self, role_id: str, skill: str, values: Mapping[str, Any]) -> None:
        """Make ``values`` the skill's whole configuration for the role. A secret sent back
        masked (as ``masked`` shows it) keeps its stored value."""
        role_id, skill = _check_id("role_id", role_id), _check_id("skill", skill)
        if not isinstance(values, Mapping):
            raise ValueError("configuration must be an object of key → value")
        clean: dict[str, Any] = {}
        for raw_key, value in values.items():
            key = _check_key(raw_key)
            if value is None:
                continue
            if not (is_secret_key(key) and value == REDACTED):
                _check_value(key, value)
            clean[key] = value
        async with self.sessionmaker() as s, s.begin():
            rows = {
                r.key: r
                for r in await s.scalars(
                    select(SkillConfig).where(
                        SkillConfig.role_id == role_id, SkillConfig.skill == skill
                    )
                )
            }
            for key, row in rows.items():
                if key not in clean:
                    await s.delete(row)
            await s.flush()
            for key, value in clean.items():
                old = rows.get(key)
                if is_secret_key(key) and value == REDACTED:
                    if old is None or not old.is_secret:
                        raise ValueError(f"config {key!r}: send the secret itself, not the mask")
                    continue  # unchanged secret
                if old is None:
                    old = SkillConfig(role_id=role_id, skill=skill, key=key)
                    s.add(old)
                self._fill(old, key, value)

    async def _rows(self, role_id: str, skill: str | None) -> list[SkillConfig]:
        q = select(SkillConfig).where(SkillConfig.role_id == role_id)
        if skill is not None:
            q = q.where(SkillConfig.skill == skill)
        async with self.sessionmaker() as s:
            return list(await s.scalars(q.order_by(SkillConfig.skill, SkillConfig.key)))

    def _plain(self, row: RowMapping | Mapping[str, Any]) -> Any:
        if row["is_secret"] and row["value_enc"] is not None:
            return self.box.decrypt({ENC_TAG: row["value_enc"]})
        return row["value"]

    async def get(self, role_id: str, skill: str) -> dict[str, Any]:
        """The skill's configuration for the role, secrets decrypted (for execution only)."""
        if not role_id or not skill:
            return {}
        # On the dispatch hot path: a plain statement, one round trip on PostgreSQL.
        engine = engine_of(self.sessionmaker)
        params = {"role": role_id, "skill": skill}
        async with (autocommit(engine) or engine).connect() as conn:
            rows = (await conn.execute(_GET, params)).all()
        return {r.key: self._plain(r._mapping) for r in rows}

    async def get_many(self, wanted: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """:meth:`get` for several ``(role_id, skill)`` pairs in one statement, in order."""
        return (await self.snapshot(wanted))[1]

    async def snapshot(self, wanted: list[tuple[str, str]]) -> tuple[int, list[dict[str, Any]]]:
        """:meth:`get_many` and the configuration generation those values are of (one
        statement, so one snapshot). The generation moves on at every change of the
        table (a trigger): values cached with it are current while it has not moved."""
        pairs = sorted({(r, s) for r, s in wanted if r and s})
        found: dict[tuple[str, str], dict[str, Any]] = {p: {} for p in pairs}
        roles, skills = sorted({r for r, _ in pairs}), sorted({s for _, s in pairs})
        engine = engine_of(self.sessionmaker)
        pg = autocommit(engine)
        rows: Any
        if pg is not None:  # the dispatch hot path: straight on asyncpg
            rows = await raw_fetch(pg, _PG_SNAPSHOT, roles, skills)
        else:
            join = _cfg.c.role_id.in_(roles) & _cfg.c.skill.in_(skills)
            stmt = (
                select(_gen.c.generation, _cfg.c.role_id, _cfg.c.skill, *_GET.selected_columns)
                .select_from(_gen.outerjoin(_cfg, join))
                .where(_gen.c.id == 1)
                .order_by(_cfg.c.key)
            )
            async with engine.connect() as conn:
                rows = (await conn.execute(stmt)).mappings().all()
        if not rows:
            raise RuntimeError("config_generation has no row: run `skilljobs db upgrade`")
        generation = int(rows[0]["generation"])
        for r in rows:
            if r["key"] is not None and (r["role_id"], r["skill"]) in found:
                found[(r["role_id"], r["skill"])][r["key"]] = self._plain(r)
        return generation, [dict(found.get(p, {})) for p in wanted]

    async def masked(self, role_id: str, skill: str | None = None) -> dict[str, dict[str, Any]]:
        """``{skill: {key: value}}`` for people: secrets shown as ``••••••``."""
        out: dict[str, dict[str, Any]] = {}
        if not role_id:
            return out
        if skill is not None:
            out[skill] = {}
        for r in await self._rows(role_id, skill):
            out.setdefault(r.skill, {})[r.key] = REDACTED if r.is_secret else r.value
        return out

    async def prefetch(self, role_id: str, skill: str) -> dict[str, Any]:
        """What dispatch bakes into a background job's context (sealed there by the caller)."""
        return await self.get(role_id, skill)
