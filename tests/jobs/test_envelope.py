"""Result envelope rules (SPEC §5, §11): normalization, fake-success flip, offload."""

from __future__ import annotations

import base64
import datetime as dt
import enum
import json
import re
import uuid
from decimal import Decimal
from pathlib import Path

import pytest

from jobs.envelope import (
    failure,
    is_failure,
    is_non_retriable,
    is_partial,
    is_recoverable,
    normalize,
    offload,
    to_jsonable,
)

# --------------------------------------------------------------------------- normalize


@pytest.mark.parametrize("value", [5, "text", [1, 2], None, 1.5, True])
def test_non_dict_is_wrapped_in_result(value):
    assert normalize(value, "s") == {"result": value, "ok": True}


def test_success_gets_ok_true_and_keeps_fields():
    assert normalize({"data": {"rows": [1]}}, "s") == {"data": {"rows": [1]}, "ok": True}
    assert normalize({"success": True, "x": 1}, "s") == {"success": True, "x": 1, "ok": True}


@pytest.mark.parametrize("raw", [{"ok": None}, {"success": None}, {}, {"code": 2, "msg": "x"}])
def test_missing_none_or_nonzero_code_is_not_failure(raw):
    env = normalize(raw, "s")
    assert env["ok"] is True and not is_failure(env)


def test_ok_false_reason_precedence_error_then_msg():
    env = normalize({"ok": False, "error": "bad input", "msg": "m", "stderr": "s"}, "s")
    assert env["ok"] is False and env["error"] == "bad input"
    env = normalize({"ok": False, "error": "", "msg": "from msg", "stderr": "s"}, "s")
    assert env["error"] == "from msg"
    # ok=False does not read stderr / user_message: the reason becomes a meaningful default.
    env = normalize({"ok": False, "stderr": "trace", "user_message": "sorry"}, "fetch")
    assert "fetch" in env["error"] and "ok: false" in env["error"]


def test_success_false_reason_precedence():
    full = {"success": False, "stderr": "E", "error": "R", "msg": "M", "user_message": "U"}
    assert normalize(full, "s")["error"] == "E"
    assert normalize({**full, "stderr": "  "}, "s")["error"] == "R"
    assert normalize({**full, "stderr": None, "error": None}, "s")["error"] == "M"
    only_user = {"success": False, "user_message": "Please add the employee number."}
    env = normalize(only_user, "s")
    assert env["error"] == "Please add the employee number." and env["ok"] is False


def test_empty_reason_replaced_by_one_naming_the_skill():
    env = normalize({"success": False, "error": "", "msg": None}, "sales_report")
    assert env["ok"] is False
    assert "sales_report" in env["error"] and "success: false" in env["error"]


def test_ok_true_with_success_false_is_a_failure_and_consistent():
    env = normalize({"ok": True, "success": False, "error": "quota"}, "s")
    assert env["ok"] is False and env["error"] == "quota" and is_failure(env)


def test_ok_false_with_success_true_is_made_consistent():
    env = normalize({"ok": False, "success": True, "error": "x"}, "s")
    assert env["ok"] is False and env["success"] is False


def test_non_string_reason_is_rendered():
    env = normalize({"ok": False, "error": {"code": 7, "why": "denied"}}, "s")
    assert json.loads(env["error"]) == {"code": 7, "why": "denied"}


# --------------------------------------------------------------------------- serialization


class Color(enum.Enum):
    RED = "red"


def test_values_made_json_serializable(tmp_path):
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    uid = uuid.UUID(int=1)
    raw = {
        "when": when,
        "day": dt.date(2026, 1, 2),
        "whole": Decimal("12"),
        "price": Decimal("19.99"),
        "precise": Decimal("0.1000000000000000055511151231257827"),
        "nan": Decimal("NaN"),
        "fnan": float("inf"),
        "tags": {"b", "a"},
        "pair": (1, 2),
        "path": tmp_path / "x.txt",
        "uid": uid,
        "color": Color.RED,
        "elapsed": dt.timedelta(seconds=90),
        3: "int key",
        "blob": b"\x00\x01hi",
    }
    env = normalize(raw, "s")
    json.dumps(env, allow_nan=False)
    assert env["when"] == "2026-01-02T03:04:05+00:00" and env["day"] == "2026-01-02"
    assert env["whole"] == 12 and isinstance(env["whole"], int)
    assert env["price"] == 19.99
    assert env["precise"] == "0.1000000000000000055511151231257827"
    assert env["nan"] == "NaN" and env["fnan"] == "inf"
    assert env["tags"] == ["a", "b"] and env["pair"] == [1, 2]
    assert env["path"] == str(tmp_path / "x.txt") and env["uid"] == str(uid)
    assert env["color"] == "red" and env["elapsed"] == 90.0 and env["3"] == "int key"
    assert env["blob"]["encoding"] == "base64" and env["blob"]["bytes"] == 4
    assert base64.b64decode(env["blob"]["data"]) == b"\x00\x01hi"
    assert "base64" in env["blob"]["note"]


def test_arbitrary_objects_are_refused_clearly():
    class Thing:
        pass

    env = normalize({"rows": [{"obj": Thing()}]}, "lister")
    assert env["ok"] is False and env["error_type"] == "config"
    assert "lister" in env["error"] and "result.rows[0].obj" in env["error"]
    assert "Thing" in env["error"]


def test_circular_reference_and_huge_bytes_are_refused():
    loop: dict = {}
    loop["self"] = loop
    env = normalize(loop, "s")
    assert env["ok"] is False and "circular" in env["error"]
    env = normalize({"pdf": b"x" * 2_000_001}, "s")
    assert env["ok"] is False and "write it to a file in the workspace" in env["error"]


def test_normalize_copies_plain_data():
    raw = {"rows": [{"a": 1}]}
    env = normalize(raw, "s")
    env["rows"].append({"a": 2})
    assert raw == {"rows": [{"a": 1}]}
    assert to_jsonable({"a": (1, 2)}) == {"a": [1, 2]}


# --------------------------------------------------------------------------- predicates


def test_failure_helper():
    env = failure("skill ran over 5 s and was stopped", error_type="transient", skill="x")
    assert env == {
        "ok": False,
        "error": "skill ran over 5 s and was stopped",
        "error_type": "transient",
        "skill": "x",
    }
    assert failure("")["error"] and "error_type" not in failure("boom")
    assert is_failure(env) and not is_recoverable(env)


@pytest.mark.parametrize(
    "env",
    [
        {"ok": False, "error": "x", "error_type": "recoverable"},
        {"ok": False, "error": "x", "error_type": "retryable"},
        {"ok": False, "error": "x", "error_type": "need_input"},
        {"ok": False, "error": "x", "error_type": "need_param"},
        {"success": False, "error": "x", "need_param": "actor_title"},
        {"ok": False, "error": "x", "recoverable": True},
    ],
)
def test_recoverable_failures(env):
    assert is_recoverable(env)
    assert not is_non_retriable({**env, "non_retriable": True})  # ignored when recoverable


@pytest.mark.parametrize("kind", ["config", "transient", None])
def test_not_recoverable(kind):
    env = failure("x", error_type=kind, non_retriable=True)
    assert not is_recoverable(env) and is_non_retriable(env)
    assert not is_recoverable({"ok": True, "error_type": "recoverable"})  # not a failure


def test_partial_success():
    assert is_partial({"success": True, "completed": False})
    assert is_partial({"success": True, "warning": "3 of 10 rows skipped"})
    assert not is_partial({"success": True, "warning": ""})
    assert not is_partial({"success": True, "completed": True})
    assert not is_partial({"success": False, "completed": False})


# --------------------------------------------------------------------------- offload


def big_result() -> dict:
    return {
        "ok": True,
        "message": "exported 400 rows",
        "total": 400,
        "ratio": 0.5,
        "done": True,
        "nothing": None,
        "rows": [{"id": i, "text": "y" * 40} for i in range(400)],
        "long_rows": ["z" * 1000] * 4,
        "empty": [],
        "small": {"a": 1},
        "big_dict": {f"k{i}": "v" * 50 for i in range(100)},
        "long_text": "x" * 600,
        "display_md": "| a |\n" * 4000,
        "filename": "export.csv",
        "local_path": "/ws/export.csv",
        "media": "file",
        "files": [{"filename": "export.csv", "local_path": "/ws/export.csv"}],
        "images": [{"url": "https://x/" + "p" * 20_000}],
    }


def test_offload_receipt_shape_exactly(tmp_path):
    env = normalize(big_result(), "exporter")
    receipt = offload(env, tmp_path, "exporter")
    path = Path(receipt["path"])
    assert re.fullmatch(r"toolout_exporter_[0-9a-f]{8}\.json", path.name)
    assert path.parent == tmp_path / ".toolout"
    assert json.loads(path.read_text(encoding="utf-8")) == env  # the full result
    assert receipt["chars"] == len(path.read_text(encoding="utf-8")) > 12_000
    assert set(receipt) == {
        "ok",
        "offloaded",
        "skill",
        "path",
        "chars",
        "schema_keys",
        "_hint",
        "message",
        "total",
        "ratio",
        "done",
        "nothing",
        "rows_count",
        "rows_sample",
        "long_rows_count",
        "long_rows_sample",
        "empty",
        "small",
        "display_md",
        "filename",
        "local_path",
        "media",
        "files",
        "images_count",
        "images_sample",
    }
    assert receipt["ok"] is True and receipt["offloaded"] is True
    assert receipt["skill"] == "exporter" and str(path) in receipt["_hint"]
    assert receipt["schema_keys"] == list(env)[:20]
    assert receipt["rows_count"] == 400 and receipt["rows_sample"] == env["rows"][:3]
    assert receipt["long_rows_count"] == 4
    assert [len(s) for s in receipt["long_rows_sample"]] == [301, 301, 301]  # 300 + "…"
    assert len(receipt["display_md"]) == 15_000
    assert receipt["files"] == env["files"]
    # Bounded whatever the content; the workspace path (twice: path and hint) is the test's.
    assert len(json.dumps(receipt).replace(json.dumps(str(path))[1:-1], "")) < 20_000


def test_offload_schema_keys_capped_at_20(tmp_path):
    env = {f"k{i:02d}": "v" * 499 for i in range(40)}
    receipt = offload(normalize(env, "s"), tmp_path, "s")
    assert receipt["schema_keys"] == [f"k{i:02d}" for i in range(20)]
    assert all(receipt[f"k{i:02d}"] == "v" * 499 for i in range(40))


def test_offload_leaves_small_results_failures_and_no_workspace_alone(tmp_path):
    small = normalize({"rows": [1, 2, 3]}, "s")
    assert offload(small, tmp_path, "s") is small
    fail = normalize({"ok": False, "error": "x", "rows": ["y" * 100] * 500}, "s")
    assert offload(fail, tmp_path, "s") is fail
    big = normalize(big_result(), "s")
    assert offload(big, None, "s") is big
    assert not (tmp_path / ".toolout").exists()


def test_offload_threshold_is_exact(tmp_path):
    def sized(n: int) -> dict:
        base = {"ok": True, "t": ""}
        base["t"] = "a" * (n - len(json.dumps(base, separators=(",", ":"))))
        return base

    assert offload(sized(12_000), tmp_path, "s").get("offloaded") is None
    assert offload(sized(12_001), tmp_path, "s")["offloaded"] is True


def test_offload_counts_characters_not_bytes(tmp_path):
    env = {"ok": True, "t": "数" * 5000}  # 15,000 UTF-8 bytes, ~5,000 characters
    assert offload(env, tmp_path, "s") is env
    env = {"ok": True, "t": "数" * 13_000}
    receipt = offload(env, tmp_path, "s")
    assert receipt["chars"] == len(json.dumps(env, ensure_ascii=False, separators=(",", ":")))


def test_offload_sanitizes_skill_name_in_file_name(tmp_path):
    receipt = offload(normalize(big_result(), "s"), tmp_path, "../evil name")
    assert Path(receipt["path"]).parent == tmp_path / ".toolout"
    assert re.fullmatch(r"toolout_evil_name_[0-9a-f]{8}\.json", Path(receipt["path"]).name)
