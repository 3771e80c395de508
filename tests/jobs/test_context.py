"""Runtime context: fixed segment, config layers, background context, workspace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.context import (
    ACTOR_KEYS,
    FIXED_SEGMENT,
    background_context,
    fixed_segment,
    flatten_configs,
    lookup_config,
    normalize_attachment,
    workspace_dir,
)


def test_fixed_segment_typed_empties_and_vocabulary_only() -> None:
    seg = fixed_segment({"foo": 1, "emp_no": "E1", "role_id": "r"})
    assert seg == FIXED_SEGMENT
    assert set(seg) == set(FIXED_SEGMENT)
    assert isinstance(seg["triggered_at"], float)
    assert seg["attachments"] == [] and seg["actor_tags"] == []
    # typed empties are fresh objects, not the shared defaults
    seg["actor_tags"].append("x")
    assert FIXED_SEGMENT["actor_tags"] == []


def test_fixed_segment_values_and_triggered_at_str() -> None:
    seg = fixed_segment(
        {
            "raw_input": "make a report",
            "actor_name": "Li Lei",
            "actor_emp_no": 1001,
            "actor_tags": "sales, vip",
            "channel": "feishu",
            "triggered_at": "1700000000",
            "actor_is_admin": "false",
            "actor_key": "ou_1",
        }
    )
    assert seg["actor_emp_no"] == "1001"
    assert seg["actor_tags"] == ["sales", "vip"]
    assert seg["triggered_at"] == 1700000000.0
    assert seg["triggered_at_str"] == "2023-11-14 22:13"
    assert seg["actor_is_admin"] is False
    assert seg["actor_key"] == "ou_1"


def test_triggered_at_from_str_only() -> None:
    seg = fixed_segment({"triggered_at_str": "2023-11-14 22:13"})
    assert seg["triggered_at"] == 1700000000.0 - 20.0


def test_admin_proxy_fill_clears_identity_keeps_audit_keys() -> None:
    raw = dict.fromkeys(ACTOR_KEYS, "v")
    raw.update(actor_tags=["a"], actor_id="u1", actor_is_admin=True)
    seg = fixed_segment(raw)
    for k in (
        "actor_title",
        "actor_department",
        "actor_department_path",
        "actor_position",
        "actor_key",
        "actor_id",
        "actor_emp_no",
    ):
        assert seg[k] == "", k
    assert seg["actor_tags"] == []
    assert seg["actor_name"] == seg["actor_phone"] == seg["actor_email"] == "v"
    assert seg["actor_is_admin"] is True


def test_attachments_normalized() -> None:
    seg = fixed_segment(
        {
            "attachments": [
                {"att_type": "image", "local_path": "/w/a.png", "source": "upload", "turn": 3},
                {"type": "file", "filename": "r.pdf", "url": "https://x/r.pdf"},
                "https://x/y/z.mp4?sig=1",
                42,
            ]
        }
    )
    a, b, c, d = seg["attachments"]
    assert a == {
        "type": "image",
        "att_type": "image",
        "filename": "a.png",
        "local_path": "/w/a.png",
        "url": "",
    }
    assert b["type"] == b["att_type"] == "file" and b["filename"] == "r.pdf"
    assert c["filename"] == "z.mp4" and c["url"].startswith("https://")
    assert set(d) == {"type", "att_type", "filename", "local_path", "url"}
    assert normalize_attachment(None)["type"] == "file"


def test_flatten_configs_four_layers() -> None:
    flat = flatten_configs("fetch_price", {"--api-token": "t", "limit": 5, "role_id": "evil"})
    assert flat["skill_configs"]["fetch_price"] == {"api_token": "t", "limit": 5, "role_id": "evil"}
    assert flat["skill_configs"]["api_token"] == "t"
    assert flat["skill_args"]["limit"] == 5
    assert flat["api_token"] == "t"
    assert "role_id" not in flat  # configs never shadow platform keys at top level


def test_lookup_config_order_and_normalization_never_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctx = {
        "skill_configs": {"s": {"api_token": "nested"}, "api_token": "flat", "region": ""},
        "skill_args": {"api_token": "args", "region": "eu", "limit": 0},
        "api_token": "top",
        "only_top": "T",
    }
    assert lookup_config(ctx, "s", "--api-token") == "nested"
    assert lookup_config(ctx, "other", "api_token") == "flat"
    assert lookup_config(ctx, "s", "region") == "eu"  # empty string is not a value
    assert lookup_config(ctx, "s", "limit") == 0
    assert lookup_config(ctx, "s", "only-top") == "T"
    # the worker's environment is never a skill's configuration, nor are its own settings
    monkeypatch.setenv("SJT_ONLY_ENV", "from-env")
    assert lookup_config(ctx, "s", "SJT_ONLY_ENV") is None
    assert lookup_config({"SKILLJOBS_SECRET_KEY": "k"}, "s", "SKILLJOBS_SECRET_KEY") is None
    assert lookup_config(ctx, "s", "missing", "dflt") == "dflt"
    assert lookup_config({"API_KEY": "x"}, "s", "API-KEY") == "x"
    # vocabulary keys are not configs
    assert lookup_config({"channel": "web"}, "s", "channel") is None


def test_background_context_exact_shape() -> None:
    origin = {
        "role_id": "r1",
        "org_id": "o1",
        "session_id": "s1",
        "is_admin": False,
        "user_id": "u-secret",
        "team_id": "t1",
        "team_role": "owner",
        "request": object(),
        "channel_registry": object(),
        "db": object(),
        "channel": "telegram",
        "actor_key": "12345",
        "emp_no": "E1",
        "chat_mode": False,
        "allow_sql": False,  # not part of the background context (never injected today)
    }
    ctx = background_context(origin, skill="gen", configs={"api_key": "k", "style": "x"})
    assert ctx["role_id"] == "r1" and ctx["org_id"] == "o1" and ctx["session_id"] == "s1"
    assert ctx["chat_mode"] is True and ctx["is_admin"] is False
    assert ctx["user_id"] == "" and ctx["team_id"] == ""
    assert "abort_signal" in ctx and ctx["abort_signal"] is None
    for absent in ("team_role", "request", "channel_registry", "db", "emp_no", "provider"):
        assert absent not in ctx
    assert ctx["channel"] == "telegram" and ctx["actor_key"] == "12345"
    assert set(FIXED_SEGMENT) <= set(ctx)
    assert ctx["skill_configs"]["gen"] == {"api_key": "k", "style": "x"}
    assert ctx["skill_args"] == {"api_key": "k", "style": "x"} and ctx["style"] == "x"
    expected = (
        set(FIXED_SEGMENT)
        | {"role_id", "org_id", "session_id", "is_admin", "chat_mode", "user_id", "team_id"}
        | {"abort_signal", "skill_configs", "skill_args", "api_key", "style"}
    )
    assert set(ctx) == expected
    assert json.loads(json.dumps(ctx)) == ctx


def test_background_context_configs_cannot_override_identity() -> None:
    ctx = background_context(
        {"role_id": "r1"}, skill="s", configs={"role_id": "r2", "chat_mode": False}
    )
    assert ctx["role_id"] == "r1" and ctx["chat_mode"] is True


def test_workspace_dir(tmp_path: Path) -> None:
    assert workspace_dir(tmp_path, "r1", "s1") == tmp_path / "r1" / "s1"
    assert workspace_dir(tmp_path, "r1", "") == tmp_path / "r1" / "shared"
    assert workspace_dir(tmp_path, "r1", None) == tmp_path / "r1" / "shared"
    assert workspace_dir(tmp_path, "", "s1") is None
    escaped = workspace_dir(tmp_path, "../..", "../x")
    assert escaped is not None and escaped.resolve().is_relative_to(tmp_path.resolve())


def test_secret_values_and_scrub() -> None:
    from jobs.context import scrub, secret_values

    ctx = {
        "actor_key": "ou_123456789",  # vocabulary, not a secret value
        "api_token": "tok-ABCDEFG",
        "short_key": "abc",  # too short to scrub safely
        "skill_configs": {"s": {"db_password": "pw-12345678"}, "other": {"x": 1}},
        "skill_args": {"client_secret": "sec-long-value"},
        "region": "eu-west-1",
    }
    assert secret_values(ctx, "s") == ["sec-long-value", "pw-12345678", "tok-ABCDEFG"]
    got = scrub({"a": ["x tok-ABCDEFG y", {"b": "pw-12345678"}], "n": 1}, secret_values(ctx, "s"))
    assert got == {"a": ["x •••••• y", {"b": "••••••"}], "n": 1}


def test_resolve_file_params(tmp_path: Path) -> None:
    from jobs.context import resolve_file_params

    (tmp_path / "in.csv").write_text("a,b\n")
    (tmp_path / "b.png").write_text("x")
    data = {
        "file": "some/dir/in.csv",  # model-built prefix dropped, file exists in the workspace
        "image": "missing.png",  # does not exist: kept (the skill reports a clearer error)
        "images": ["b.png", "x/b.png", "/abs/c.png"],
        "output": "report.xlsx",  # to be written: always in the workspace
        "dst": "json",  # not file-like: a format switch, left alone
        "path": "/etc/hosts",
        "src": "https://example.com/a.png",
        "title": "in.csv",  # not a file field
    }
    got = resolve_file_params(data, str(tmp_path))
    assert got == {
        "file": str(tmp_path / "in.csv"),
        "image": "missing.png",
        "images": [str(tmp_path / "b.png"), "/abs/c.png"],
        "output": str(tmp_path / "report.xlsx"),
        "dst": "json",
        "path": "/etc/hosts",
        "src": "https://example.com/a.png",
        "title": "in.csv",
    }
    assert data["file"] == "some/dir/in.csv"  # the caller's dict is untouched
    assert resolve_file_params({"file": "x"}, None) == {"file": "x"}
