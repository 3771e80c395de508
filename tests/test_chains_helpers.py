"""Helpers shared by the chain tests: services on real databases and Redis, test skills."""

from __future__ import annotations

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


async def close_services(svc: Services) -> None:
    await svc.http.aclose()
    await svc.engine.dispose()
