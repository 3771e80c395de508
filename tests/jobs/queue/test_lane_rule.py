"""The one sync-or-background rule the dispatcher and the dashboard's fast lane share."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.queue.dispatcher import runs_now
from jobs.skill import Skill, SkillRegistry, SkillType

TG = {"channel": "telegram", "actor_key": "7"}
WEB = {"channel": "web", "session_id": "s1"}


def _registry() -> SkillRegistry:
    cli = Skill(name="deck", path=Path("deck"), is_async=True, cli_commands=["build", "lint"])
    quick = Skill(name="quick", path=Path("quick"), cli_commands=["go"])
    doc = Skill(name="guide", path=Path("guide"), skill_type=SkillType.KNOWLEDGE)
    broken = Skill(name="broken", path=Path("broken"), error="no entry point")
    return SkillRegistry({s.name: s for s in (cli, quick, doc, broken)})


@pytest.mark.parametrize(
    ("skill", "context", "external_id", "now"),
    [
        ("deck", TG, None, False),  # async skill from a chat channel: background
        ("deck__build", TG, None, False),  # its subcommand is the same skill: background
        ("deck__build", WEB, None, True),  # from a web session: runs now
        ("deck__build", WEB, "orgdeleg:acme", False),  # delegated: background again
        ("deck__build", {**WEB, "external_id": "orgdeleg:x"}, None, False),
        ("quick__go", TG, None, True),  # a sync skill's subcommand runs now
        ("quick__nope", TG, None, False),  # an undeclared subcommand is a refusal (404)
        ("nope", WEB, None, False),
        ("guide", WEB, None, False),  # a document is refused, not run
        ("broken", WEB, None, False),
    ],
)
def test_runs_now(skill: str, context: dict[str, str], external_id: str | None, now: bool) -> None:
    assert runs_now(_registry(), skill, context, external_id) is now


def test_a_deferred_call_never_runs_now() -> None:
    assert runs_now(_registry(), "quick__go", TG, None) is True
    assert runs_now(_registry(), "quick__go", TG, None, deferred=True) is False


def test_resolve_names_the_subcommand() -> None:
    registry = _registry()
    deck = registry.get("deck")
    assert registry.resolve("deck") == (deck, None)
    assert registry.resolve("deck__lint") == (deck, "lint")
    assert registry.resolve("deck__nope") is None
