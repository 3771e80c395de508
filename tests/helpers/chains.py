"""Helpers shared by the chain tests (and their skill bodies): services on real databases and Redis, test skills."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from jobs.catalog.loader import load_registry
from jobs.crypto import SecretBox, load_or_create_key
from jobs.db import create_engine, create_sessionmaker
from jobs.services import Services
from jobs.settings import BUNDLED_SKILLS, Settings


def write_skill(root: Path, name: str, body: str, *, frontmatter: str = "") -> Path:
    """A handler skill folder ``root/name`` whose handler module is ``body``."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: test skill {name}\n{frontmatter}---\n\n# {name}\n"
    )
    (folder / "handler.py").write_text(textwrap.dedent(body))
    return folder


def make_services(
    settings: Settings, redis: object | None, *, extra_skills: Path | None = None
) -> Services:
    engine = create_engine(settings.resolved_database_url)
    dirs = [BUNDLED_SKILLS] + ([extra_skills] if extra_skills else [])
    if extra_skills:  # the chain tests' own handlers (trusted): they run inside the worker
        listed = os.pathsep.join(p for p in (settings.trusted_skills, str(extra_skills)) if p)
        settings = settings.model_copy(update={"trusted_skills": listed})
    return Services(
        settings=settings,
        engine=engine,
        sessionmaker=create_sessionmaker(engine),
        box=SecretBox(
            load_or_create_key(
                settings.data_dir,
                settings.secret_key.get_secret_value() if settings.secret_key else None,
            )
        ),
        registry=load_registry(dirs),
        redis=redis,  # type: ignore[arg-type]
    )


def chain_workspace(settings: Settings, role_id: str = "r1", session_id: str = "s1") -> Path:
    """The workspace chain runs of that identity work in (file inputs must be inside it)."""
    folder = settings.resolved_workspace_root / role_id / session_id
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def close_services(svc: Services) -> None:
    await svc.http.aclose()
    await svc.engine.dispose()


# --- skill bodies the chain tests install with write_skill ------------------------------

COUNTER = """
import json, os, pathlib
def execute(input_data, ctx):
    path = pathlib.Path(input_data["counter_file"])
    n = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(n))
    return {"n": n, "value": input_data.get("value"), "rows": input_data.get("rows", [1, 2])}
"""
FAIL = """
def execute(input_data, ctx):
    return {"ok": False, "error": "upstream said no"}
"""
SLEEP_ONCE = """
import pathlib, time
def execute(input_data, ctx):
    marker = pathlib.Path(input_data["marker"])
    if not marker.exists():
        marker.write_text("slept")
        time.sleep(float(input_data.get("sec", 30)))
    return {"message": "woke up"}
"""
PROBE = """
def execute(input_data, ctx):
    keys = ("chat_mode", "channel", "triggered_at", "role_id", "org_id", "session_id", "region", "workspace_dir")
    return {"seen": {k: ctx.get(k) for k in keys}}
"""
FLAKY = """
import pathlib
def execute(input_data, ctx):
    path = pathlib.Path(input_data["counter_file"])
    n = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(n))
    if n < 3:
        raise ConnectionError("network blip")
    return {"runs": n}
"""
SLOW = """
import time
def execute(input_data, ctx):
    time.sleep(float(input_data.get("sec", 3)))
    return {"done": True}
"""
