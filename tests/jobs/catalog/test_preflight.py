"""Install preflight rules and the ``skilljobs skills list|check`` commands."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from jobs.catalog.loader import load_skill
from jobs.catalog.preflight import Finding, check_skill_dir, has_errors, is_credential_name
from jobs.cli.app import app
from tests.helpers.settings import SKILL_FIXTURES

FIX = SKILL_FIXTURES


def findings_for(name: str) -> list[Finding]:
    found = check_skill_dir(FIX / name)
    assert all(f.skill == name for f in found)
    return found


def messages(found: list[Finding], level: str) -> str:
    return " | ".join(f.message for f in found if f.level == level)


def test_clean_skill_has_no_findings():
    assert findings_for("good_handler") == []


def test_sync_entry_is_a_warning():
    found = findings_for("pf_sync")
    assert not has_errors(found)
    assert "plain def" in messages(found, "warning")


def test_arity_follows_the_runtime_rule():
    # SPEC §2: 0, 1 or 2 positional parameters bind; the loader and `skills check` agree.
    one = findings_for("pf_arity")
    assert not has_errors(one)
    assert "called as execute(input_data)" in messages(one, "warning")
    three = findings_for("pf_too_many")
    assert has_errors(three)
    assert "requires 3 positional parameters" in messages(three, "error")
    assert load_skill(FIX / "pf_too_many").error is not None
    assert load_skill(FIX / "pf_arity").runnable


def test_default_on_second_parameter_is_a_warning():
    found = findings_for("pf_default")
    assert not has_errors(found)
    assert "'runtime_context' a default" in messages(found, "warning")


def test_non_execute_entry_and_parameter_names_are_warnings():
    found = findings_for("sync_entry")
    text = messages(found, "warning")
    assert "entry function is run()" in text
    assert "called as run(input_data)" in text  # one parameter: bound, with a warning
    assert not has_errors(found)


def test_loader_errors_and_warnings_are_reported():
    assert "does not match its folder name" in messages(findings_for("name_mismatch"), "error")
    assert "no entry function" in messages(findings_for("no_entry"), "error")
    assert "not valid YAML" in messages(findings_for("bad_yaml"), "warning")


def test_secret_like_names_that_are_not_credentials_warn():
    found = findings_for("pf_names")
    text = messages(found, "warning")
    for name in ("keyword", "author", "tokenizer", "monkey"):
        assert f"name '{name}' contains" in text and "treated as a secret" in text
    assert "'PARAM_KEYS'" in text  # module constants are scanned by substring too
    assert "input field 'api_token' is a credential" in text
    assert "SERVICE_API_KEY" not in text  # a real credential declared in env is fine
    assert "'query'" not in text
    assert not has_errors(found)


@pytest.mark.parametrize(
    ("name", "credential"),
    [
        ("api_key", True),
        ("OPENAI_API_KEY", True),
        ("accessToken", True),
        ("client_secret", True),
        ("db_password", True),
        ("keyword", False),
        ("author", False),
        ("tokenizer", False),
        ("monkey", False),
        ("max_tokens", False),
    ],
)
def test_credential_name_rule(name, credential):
    assert is_credential_name(name) is credential


def test_schema_problems():
    found = findings_for("pf_bad_schema")
    text = messages(found, "warning")
    assert "'symbol' must be an object" in text and "'ghost'" in text
    assert "not a valid JSON Schema" in messages(findings_for("pf_invalid_schema"), "error")


def test_long_skill_md(tmp_path):
    doc = tmp_path / "long_doc"
    doc.mkdir()
    (doc / "SKILL.md").write_text("---\nname: long_doc\nskill_type: skill_md\n---\n" + "x" * 9000)
    found = check_skill_dir(doc)
    # `skills list` loads it, so `skills check` does not call it an error (they agree)
    assert not has_errors(found) and "last 1,044 chars" in messages(found, "warning")
    code = tmp_path / "long_code"
    shutil.copytree(FIX / "good_handler", code)
    text = (code / "SKILL.md").read_text().replace("good_handler", "long_code")
    (code / "SKILL.md").write_text(text + "y" * 9000)
    found = check_skill_dir(code)
    assert not has_errors(found) and "keep it under 8,000" in messages(found, "warning")


def test_folder_of_skills_and_bad_paths(tmp_path):
    for name in ("good_handler", "pf_arity"):
        shutil.copytree(FIX / name, tmp_path / name)
    found = check_skill_dir(tmp_path)
    assert {f.skill for f in found} == {"pf_arity"}
    assert check_skill_dir(tmp_path / "missing")[0].level == "error"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no skill folders" in check_skill_dir(empty)[0].message


# --------------------------------------------------------------------------- CLI

runner = CliRunner()


def test_cli_check_exit_codes(tmp_path):
    ok = runner.invoke(app, ["skills", "check", str(FIX / "good_handler")])
    assert ok.exit_code == 0, ok.output
    assert "✓ good_handler" in ok.output and "0 error(s)" in ok.output
    bad = runner.invoke(app, ["skills", "check", str(FIX / "pf_too_many")])
    assert bad.exit_code == 1 and "requires 3 positional parameters" in bad.output
    missing = runner.invoke(app, ["skills", "check", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "is not a folder" in missing.output


def test_cli_check_defaults_to_configured_folders(tmp_path, monkeypatch):
    for name in ("good_handler", "no_entry"):
        shutil.copytree(FIX / name, tmp_path / name)
    monkeypatch.setenv("SKILLJOBS_SKILLS_PATH", str(tmp_path))
    monkeypatch.setenv("SKILLJOBS_DATA_DIR", str(tmp_path / "data"))
    res = runner.invoke(app, ["skills", "check"])
    assert res.exit_code == 1
    assert "✗ no_entry" in res.output and "✓ good_handler" in res.output


@pytest.mark.slow
def test_cli_list_shows_load_errors_and_exits_zero(tmp_path, monkeypatch):
    for name in ("good_handler", "no_entry", "doc_skill"):
        shutil.copytree(FIX / name, tmp_path / name)
    monkeypatch.setenv("SKILLJOBS_SKILLS_PATH", str(tmp_path))
    monkeypatch.setenv("SKILLJOBS_DATA_DIR", str(tmp_path / "data"))
    res = runner.invoke(app, ["skills", "list"])
    assert res.exit_code == 0, res.output
    assert "no_entry" in res.output and "no entry function" in res.output
    assert "good_handler" in res.output and "skill_md" in res.output
    res = runner.invoke(app, ["skills", "list", "--json"])
    assert res.exit_code == 0
    items = {i["name"]: i for i in json.loads(res.output)["items"]}
    assert items["no_entry"]["error"] and items["good_handler"]["error"] is None
    assert items["good_handler"]["exec_type"] == "python"
    assert items["doc_skill"]["skill_type"] == "skill_md"


def test_a_requirements_file_beside_a_pep723_block_is_reported(tmp_path):
    skill = tmp_path / "pep_tool"
    skill.mkdir()
    (skill / "SKILL.md").write_text("---\nname: pep_tool\nexec: {primary: {entry: tool.py}}\n---\n")
    (skill / "tool.py").write_text(
        '# /// script\n# dependencies = ["rich"]\n# ///\nimport json\nprint(json.dumps({"ok": True}))\n'
    )
    (skill / "requirements.txt").write_text("requests\n")
    found = check_skill_dir(skill)
    assert not has_errors(found)
    assert "requirements.txt is ignored: tool.py has a PEP 723 block" in messages(found, "warning")
    (skill / "requirements.txt").unlink()
    assert "requirements.txt" not in messages(check_skill_dir(skill), "warning")


def test_the_runnable_hint_names_only_the_script_the_skill_md_runs(tmp_path):
    from jobs.catalog.loader import load_skill

    skill = tmp_path / "dedupe_photos"
    (skill / "scripts").mkdir(parents=True)
    for name in ("clean.sh", "__init__.py", "find_dupes.py"):
        (skill / "scripts" / name).write_text("echo\n")
    md = "---\nname: dedupe_photos\ndescription: find duplicate photos\n---\n"
    (skill / "SKILL.md").write_text(md + "Run `python3 {baseDir}/scripts/find_dupes.py <dir>`.\n")
    loaded = load_skill(skill)
    assert loaded.hint.endswith("exec: {primary: {entry: scripts/find_dupes.py}}")
    # no command example: no guess (clean.sh deletes files), just the rule
    (skill / "SKILL.md").write_text(md + "The scripts folder holds the tools.\n")
    loaded = load_skill(skill)
    assert "clean.sh" not in loaded.hint and "__init__" not in loaded.hint
    assert "entry: scripts/<the script to run>" in loaded.hint
