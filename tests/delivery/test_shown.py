"""Readable renderings and what they leave out; plain text through Markdown; failure
reasons; host paths (pure logic)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from delivery.dialects import TELEGRAM
from delivery.fitting import scrub_paths
from delivery.render import render_result
from delivery.richtext import pieces
from delivery.shown import aligned_columns, escape_markdown, result_file, shown
from jobs.texts import reason_block, without_warnings


def test_what_fits_is_not_lossy_and_what_is_cut_is() -> None:
    assert not shown({"total": 3, "period": {"from": "a", "to": "b"}}).lossy
    assert shown({"note": "x" * 500}).lossy
    assert shown({"rows": [{"id": i} for i in range(21)]}).lossy  # 20 rows shown
    assert not shown({"rows": [{"id": i} for i in range(20)]}).lossy
    assert shown({"rows": [{"id": 1, "tags": ["a"]}]}).lossy  # a list in a record
    nested = {"rows": [{"name": "a", "metrics": {"rating": 4.5}}]}
    got = shown(nested)
    assert not got.lossy and "| metrics.rating |" in got.text


def test_an_authored_text_is_what_the_person_reads() -> None:
    assert not render_result({"message": "Crawled", "pages": ["/a", "/b"]}).lossy
    assert not render_result({"message": "Saved", "id": 42}).lossy
    # data under another text key beside the message is not in it
    assert render_result({"message": "Exported 2", "result": [{"a": 1}, {"a": 2}]}).lossy


def test_result_files() -> None:
    name, data = result_file("orders", {"ok": True, "result": [{"id": 1, "paid": True}]})
    assert name == "orders-result.csv"
    assert list(csv.DictReader(io.StringIO(data.decode()))) == [{"id": "1", "paid": "true"}]
    name, data = result_file("recipes", {"result": [{"title": "x", "tags": ["a"]}]})
    assert name == "recipes-result.json" and json.loads(data) == [{"title": "x", "tags": ["a"]}]
    name, data = result_file("s", {"ok": True, "message": "m", "pages": [1]})
    assert json.loads(data) == {"message": "m", "pages": [1]}


def test_escaped_plain_text_shows_unchanged() -> None:
    plain = "Report\n======\n1. first *one*\n1. second [x]\n    indented_name\n# hash\n- dash"
    (piece,) = pieces(escape_markdown(plain), TELEGRAM, 4096)
    assert piece.plain.replace("\u00a0", " ") == plain


def test_aligned_columns() -> None:
    table = "name    qty   price\napple     3    1.20\npear     10    0.80\n"
    assert aligned_columns(table)
    assert not aligned_columns("just\nsome\nplain lines here\n")


def test_reason_blocks() -> None:
    noise = "x.py:3: DeprecationWarning: old\n  import imp\n(node:12) Warning: y\nnpm WARN z\n"
    assert without_warnings(noise) == ""
    assert reason_block(noise) == ""
    audit = "Auditing 3 files\n\nsrc/a.py:1: eval() (error)\n\nSummary: 1 error(s)."
    assert reason_block(audit) == "src/a.py:1: eval() (error)\n\nSummary: 1 error(s)."
    long = "\n".join(f"ERROR line {i} " + "x" * 50 for i in range(40))
    assert len(reason_block(long)) <= 600 and reason_block(long).endswith("x" * 50)


def test_host_paths() -> None:
    ws = Path("/tmp/ws/r1/s1")
    text = "wrote /tmp/ws/r1/s1/out/report.pdf and read /home/ann/data/in.csv; GET /api/v1/x"
    assert scrub_paths(text, ws) == "wrote report.pdf and read …/in.csv; GET /api/v1/x"
    assert scrub_paths("see https://example.com/a/b.png", ws) == "see https://example.com/a/b.png"


def test_exit_failure_prefers_the_stdout_envelope_then_clean_stderr() -> None:
    from jobs.execution.skill_output import exit_failure

    warn = b"lib.py:9: FutureWarning: the default will change\n  warnings.warn(\n"
    env = exit_failure("s", 1, b'{"ok": false, "error": "quota exceeded"}\n', warn)
    assert env["user_message"] == "quota exceeded"
    env = exit_failure("s", 1, b"Detected image-based PDF, use --vision mode\n", warn)
    assert env["user_message"] == "Detected image-based PDF, use --vision mode"
    assert "FutureWarning" in env["stderr_tail"]
    env = exit_failure(
        "s", 2, b"", b"usage: x [-h]\nx: error: the following arguments are required: --deck\n"
    )
    assert env["user_message"] == "x: error: the following arguments are required: --deck"
