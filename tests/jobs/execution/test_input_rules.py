"""Input rules applied before a skill runs: attachment ids (img_1, file_2) and
force_raw_prompt (seed §3.3, §3.4) — pure logic, then through the real executor."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.catalog.loader import load_registry, load_skill
from jobs.execution import input_rules
from jobs.execution.executor import Executor
from tests.helpers.settings import MARKET_SKILLS, make_settings

MARKET = MARKET_SKILLS
CTX = {"role_id": "r1", "session_id": "s1", "org_id": "o1", "channel": "web"}
ATTS = [
    {"type": "image", "local_path": "/up/a.png"},
    {"type": "file", "local_path": "/up/report.pdf"},
    {"type": "image", "local_path": "/up/my photo.jpg"},
    {"type": "image", "local_path": "C:\\up\\win.png"},
]


def test_ids_numbered_per_kind_in_order() -> None:
    assert input_rules.attachment_ids(ATTS) == {
        "img_1": "/up/a.png",
        "file_1": "/up/report.pdf",
        "img_2": "/up/my photo.jpg",
        "img_3": "C:/up/win.png",  # POSIX slashes
    }


def test_explicit_id_wins() -> None:
    atts = [{"type": "image", "local_path": "/a.png", "id": "pic_a"}, ATTS[0]]
    assert input_rules.attachment_ids(atts) == {"pic_a": "/a.png", "img_2": "/up/a.png"}


def test_whole_values_lists_and_nesting() -> None:
    data = {
        "image": "img_1",
        "images": ["img_1", "img_2", "img_1"],
        "opts": {"mask": "file_1"},
        "caption": "compare img_1 and img_2",  # not a code field: left as written
        "n": 3,
    }
    out = input_rules.substitute_attachments(data, ATTS)
    assert out["image"] == "/up/a.png"
    assert out["images"] == ["/up/a.png", "/up/my photo.jpg"]  # de-duplicated
    assert out["opts"] == {"mask": "/up/report.pdf"}
    assert out["caption"] == "compare img_1 and img_2" and out["n"] == 3
    assert data["image"] == "img_1"  # the caller's input is not changed


def test_inside_code_fields_quoted_with_spaces() -> None:
    data = {
        "command": "convert img_2 -resize 50% img_1.out && cp file_1 .",
        "code": "open('img_2').read(); x = img_1",
        "bash": "ls img_10x",  # not an id (followed by letters)
    }
    atts = ATTS[:3]
    out = input_rules.substitute_attachments(data, atts)
    assert (
        out["command"]
        == 'convert "/up/my photo.jpg" -resize 50% /up/a.png.out && cp /up/report.pdf .'
    )
    assert out["code"] == "open('/up/my photo.jpg').read(); x = /up/a.png"  # already quoted
    assert out["bash"] == "ls img_10x"


@pytest.mark.parametrize(
    ("data", "field"),
    [({"image": "img_9"}, "image"), ({"cmd": "cat file_4"}, "cmd"), ({"x": ["img_5"]}, "x[0]")],
)
def test_unknown_id_is_refused(data: dict[str, object], field: str) -> None:
    skill = load_skill(MARKET / "img_edit")
    with pytest.raises(input_rules.Refused) as refused:
        input_rules.apply(skill, data, {"attachments": ATTS[:1]})
    env = refused.value.envelope
    assert env["error_type"] == "recoverable" and env["unknown_attachment"] in env["error"]
    assert field in env["error"] and "img_1" in env["error"]  # says what there is
    assert env["need_param"] == [field.split("[")[0]]


def test_first_required_string() -> None:
    schema = load_skill(MARKET / "raw_prompt_gen").input_schema
    assert input_rules.first_required_string(schema) == "prompt"  # size is an integer
    assert input_rules.first_required_string({"properties": {}}) is None


@pytest.mark.parametrize(
    ("ctx", "depth", "forced"),
    [
        ({"raw_input": "a red fox, watercolor"}, 0, True),
        ({"raw_input": "   "}, 0, False),
        ({"raw_input": "a red fox", "external_id": "orgdeleg:acme"}, 0, False),
        ({"raw_input": "a red fox", "delegated": True}, 0, False),
        ({"raw_input": "a red fox"}, 1, False),  # a call_skill callee
    ],
)
def test_force_raw_prompt(ctx: dict[str, object], depth: int, forced: bool) -> None:
    skill = load_skill(MARKET / "raw_prompt_gen")
    data = {"prompt": "fox (model's rewrite)", "size": 512, "style": "x"}
    out = input_rules.apply(skill, data, ctx, depth=depth)
    assert out["prompt"] == (ctx["raw_input"] if forced else "fox (model's rewrite)")
    assert out["size"] == 512


def test_force_raw_prompt_off_by_default() -> None:
    skill = load_skill(MARKET / "img_edit")
    out = input_rules.apply(skill, {"image": "/w/a.png"}, {"raw_input": "hello"})
    assert out == {"image": "/w/a.png"}


# --- through the executor --------------------------------------------------------------


@pytest.fixture
async def ex(tmp_path: Path):  # type: ignore[no-untyped-def]
    e = Executor(
        settings=make_settings(tmp_path, redis_url=None, prefix="t"),
        registry=load_registry([MARKET]),
        sessionmaker=None,
        box=None,
    )
    yield e
    await e.aclose()


async def test_executor_substitutes_attachment(ex: Executor, tmp_path: Path) -> None:
    pic = tmp_path / "uploads" / "cat picture.png"
    pic.parent.mkdir()
    pic.write_bytes(b"\x89PNG")
    ctx = dict(CTX, attachments=[{"type": "image", "local_path": str(pic)}])
    out = await ex.execute("img_edit", {"image": "img_1", "command": "identify img_1"}, ctx)
    assert out.status == "succeeded", out.result
    assert out.result["input"]["image"] == str(pic) and out.result["image_exists"]
    assert out.result["input"]["command"] == f'identify "{pic}"'


async def test_executor_refuses_unknown_attachment(ex: Executor) -> None:
    out = await ex.execute("img_edit", {"image": "img_2"}, dict(CTX, attachments=[]))
    assert out.status == "failed" and out.error_type == "recoverable"
    assert "'img_2'" in out.result["error"]


async def test_executor_forces_raw_prompt(ex: Executor) -> None:
    ctx = dict(CTX, raw_input="画一只在雪地里的狐狸")
    data = {"prompt": "a fox in snow", "size": 256, "style": "ink"}
    out = await ex.execute("raw_prompt_gen", data, ctx)
    assert out.result["input"]["prompt"] == "画一只在雪地里的狐狸"
    deleg = await ex.execute("raw_prompt_gen", data, dict(ctx, external_id="orgdeleg:acme"))
    assert deleg.result["input"]["prompt"] == "a fox in snow"


# --- cli_commands fan-out: <skill>__<sub> ----------------------------------------------------


async def test_fanout_name_runs_the_subcommand(ex: Executor) -> None:
    out = await ex.execute("deck_cli__add", {"front": "hola", "back": "hello"}, dict(CTX))
    assert out.status == "succeeded", out.result
    assert out.result["argv"] == ["add", "hola", "--back", "hello"]
    unknown = await ex.execute("deck_cli__remove", {}, dict(CTX))
    assert unknown.error_type == "config" and "unknown skill" in unknown.result["error"]


@pytest.mark.slow
async def test_fanout_dispatch_validates_the_subcommand_schema(market_services) -> None:  # type: ignore[no-untyped-def]
    from jobs.queue.dispatcher import Dispatcher

    web = {"channel": "web", "role_id": "r1", "session_id": "s1"}
    d = Dispatcher(market_services)
    missing = await d.dispatch("deck_cli__add", {"front": "hola"}, web)
    assert missing.status_code == 422 and "'back'" in missing.body["error"]
    extra = await d.dispatch("deck_cli__add", {"front": "a", "back": "b", "x": 1}, web)
    assert extra.status_code == 422
    ok = await d.dispatch("deck_cli__count", {"deck": "es"}, web)
    assert ok.status_code == 200 and ok.body["cmd"] == "count", ok.body
    assert ok.body["args"]["deck"] == "es"


def test_fanout_names_in_skills_list(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from jobs.cli.app import app

    monkeypatch.setenv("SKILLJOBS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SKILLJOBS_SKILLS_PATH", str(MARKET))
    monkeypatch.setenv("COLUMNS", "200")
    res = CliRunner().invoke(app, ["skills", "list", "--json"], catch_exceptions=False)
    rows = {r["name"]: r for r in json.loads(res.output)["items"]}
    assert rows["deck_cli"]["tools"] == ["deck_cli__add", "deck_cli__count"]
    table = CliRunner().invoke(app, ["skills", "list"], catch_exceptions=False)
    assert "deck_cli__add" in table.output and "deck_cli__count" in table.output


async def test_force_raw_prompt_skips_a_delegated_sync_dispatch(market_services) -> None:  # type: ignore[no-untyped-def]
    """``external_id`` given at the top level of the dispatch (not in the context) marks the
    request delegated on the sync line too: the upstream agent's prompt is kept."""
    from jobs.queue.dispatcher import Dispatcher

    d = Dispatcher(market_services)
    data = {"prompt": "a fox in snow", "size": 256, "style": "ink"}
    web = {"channel": "web", "role_id": "r1", "session_id": "s1", "raw_input": "画一只狐狸"}
    own = await d.dispatch("raw_prompt_gen", data, dict(web))
    assert own.status_code == 200 and own.body["input"]["prompt"] == "画一只狐狸"
    deleg = await d.dispatch("raw_prompt_gen", data, dict(web), external_id="orgdeleg:acme")
    assert deleg.status_code == 200 and deleg.body["input"]["prompt"] == "a fox in snow"
