"""Skill loader rules (SPEC §1, §2, §11) against fixture folders in tests/skill_fixtures."""

from __future__ import annotations

import json
import shutil

import pytest

from jobs.catalog.loader import (
    BUILTIN_SKILLS,
    load_registry,
    load_skill,
    parse_frontmatter,
    skill_folders,
    split_frontmatter,
)
from jobs.settings import BUNDLED_SKILLS
from jobs.skill import ExecType, SkillType
from tests.helpers.settings import SKILL_FIXTURES

FIX = SKILL_FIXTURES


def load(name: str):
    return load_skill(FIX / name)


# --------------------------------------------------------------------------- frontmatter


def test_good_handler_reads_top_level_frontmatter():
    s = load("good_handler")
    assert s.error is None and s.warnings == []
    assert s.exec_type is ExecType.PYTHON and s.skill_type is SkillType.HANDLER
    assert (s.entry_function, s.is_async_entry, s.required_positional) == ("execute", True, 2)
    assert s.entry == FIX / "good_handler" / "handler.py"
    assert (s.category, s.cost_tier, s.version) == ("data", "medium", "2.1")
    assert s.tags == ["csv", "stats"]
    assert s.env == {"REPORT_API_KEY": {"required": True, "description": "key for the report API"}}
    assert s.input_schema == {
        "type": "object",
        "properties": {"q": {"type": "string", "description": "query"}},
        "required": ["q"],
    }
    md = FIX / "good_handler" / "SKILL.md"
    assert s.skill_md_path == md and s.skill_md_chars == len(md.read_text())
    assert s.runnable and not s.is_async and s.wall_sec is None


def test_malformed_yaml_falls_back_line_by_line_and_names_the_losses():
    s = load("bad_yaml")
    assert s.error is None  # top-level k: v lines still load the skill
    assert s.is_async is True
    assert s.description == "counts things: words and lines"
    assert s.tags == [] and s.wall_sec is None  # the nested blocks are gone
    [warning] = s.warnings
    assert "not valid YAML" in warning and "line by line" in warning
    assert "tags" in warning and "metadata" in warning


def test_parse_frontmatter_non_mapping_is_reported():
    data, warnings = parse_frontmatter("just a sentence\n")
    assert data == {} and "not a mapping" in warnings[0]


def test_split_frontmatter_handles_bom_and_missing_block():
    fm, body = split_frontmatter("\ufeff---\nname: x\n---\nbody\n")
    assert fm == "name: x\n" and body == "body\n"
    assert split_frontmatter("# no frontmatter\n") == (None, "# no frontmatter\n")


def test_metadata_nested_keys_are_ignored_with_a_warning():
    s = load("metadata_nested")
    assert s.error is None
    assert s.is_async is False and s.wall_sec is None and s.cost_tier == "low"
    assert s.category == "finance"  # guessed from "invoice" in the description
    joined = " ".join(s.warnings)
    for key in ("category", "async", "wall_sec", "cost-tier"):
        assert f"metadata.{key} is ignored" in joined


def test_unknown_category_is_guessed_and_unknown_cost_tier_defaults():
    s = load("guess_category")
    assert s.category == "finance"  # tags: invoice, expense
    assert s.cost_tier == "low"
    assert any("'workflow' is unknown" in w for w in s.warnings)
    assert any("'enormous'" in w for w in s.warnings)


def test_openclaw_timeout_and_requires():
    s = load("openclaw")
    assert s.error is None and s.wall_sec == 45
    assert s.requires_env == ["PRICE_API_KEY", "PRICE_REGION"]  # required: false left out
    assert s.requires_bins == ["curl", "jq"]
    assert s.effective_wall_sec(900) == 45


def test_declared_wall_clock_async_and_flags():
    s = load("wall_declared")
    assert s.is_async and s.wall_sec == 120 and s.force_raw_prompt and s.exec_mode == "shell"


# --------------------------------------------------------------------------- names & lookup


def test_a_skill_md_with_nothing_to_run_is_a_document_with_a_hint():
    s = load("no_code")
    assert s.error is None and s.skill_type is SkillType.SKILL_MD
    assert s.exec_type is ExecType.NONE and "exec: {primary: {entry:" in s.hint
    assert any("document skill" in w for w in s.warnings)


@pytest.mark.parametrize(
    ("folder", "fragment"),
    [
        ("no_skill_md", "no SKILL.md"),
        ("bad_name", "'Bad Name' is invalid"),
        ("name_mismatch", "does not match its folder name 'name_mismatch'"),
        ("no_name", "no name in its frontmatter"),
        ("no_entry", "no entry function"),
        ("bad_skill_type", "skill_type 'macro'"),
        ("bad_toml", "not valid TOML"),
        ("missing_entry_file", "'nope.sh' is not a file"),
        ("unknown_exec_type", "'cobol' is not one of"),
        ("escape_path", "not a file inside the skill folder"),
        ("syntax_error", "syntax error at line 1"),
    ],
)
def test_broken_skills_get_one_clear_error(folder, fragment):
    s = load(folder)
    assert s.error is not None and fragment in s.error
    assert "\n" not in s.error
    assert s.name == folder and not s.runnable


def test_skill_md_lookup_order(tmp_path):
    assert load("readme_only").skill_md_path == FIX / "readme_only" / "README.md"
    assert load("redirect_md").skill_md_path == FIX / "redirect_md" / "GUIDE.md"
    assert load("docs_lookup").skill_md_path == FIX / "docs_lookup" / "docs" / "docs_lookup.md"
    # A redirect to a missing file falls back to SKILL.md itself, with a warning.
    folder = tmp_path / "gone"
    folder.mkdir()
    (folder / "SKILL.md").write_text(
        "---\nname: gone\nskill_md: NOPE.md\nskill_type: skill_md\n---\n"
    )
    s = load_skill(folder)
    assert s.error is None and s.skill_md_path == folder / "SKILL.md"
    assert any("NOPE.md" in w for w in s.warnings)


def test_origin_path_lookup(tmp_path):
    folder = tmp_path / "orig"
    (folder / "upstream").mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        "---\nname: orig\nskill_md: missing.md\norigin_path: upstream\n---\n"
    )
    (folder / "upstream" / "skill.md").write_text("---\nname: orig\nskill_type: knowledge\n---\n")
    s = load_skill(folder)
    assert s.skill_md_path == folder / "upstream" / "skill.md"
    assert s.skill_type is SkillType.KNOWLEDGE


# --------------------------------------------------------------------------- exec types


def test_schema_json_wins_over_in_code_schema():
    s = load("schema_precedence")
    assert s.input_schema is not None and "from_file" in s.input_schema["properties"]
    assert any("in-code input_schema is ignored" in w for w in s.warnings)


def test_non_literal_in_code_schema_is_not_executed():
    s = load("code_schema_nonliteral")
    assert s.error is None and s.input_schema is None
    assert any("not a literal" in w for w in s.warnings)


def test_invalid_schema_json_is_an_error(tmp_path):
    folder = tmp_path / "broken_schema"
    shutil.copytree(FIX / "good_handler", folder)
    (folder / "SKILL.md").write_text("---\nname: broken_schema\n---\n")
    (folder / "schema.json").write_text("{not json")
    assert "schema.json is not valid JSON" in load_skill(folder).error
    (folder / "schema.json").write_text("[1, 2]")
    assert "must be a JSON object" in load_skill(folder).error


def test_python_cli_detection():
    tool = load("cli_tool")
    assert tool.exec_type is ExecType.PYTHON_CLI and tool.entry == FIX / "cli_tool" / "tool.py"
    assert tool.entry_function is None  # a CLI's main() is not an in-process entry
    assert tool.cli_commands == ["add", "remove"]
    assert tool.cli_command_schemas["add"]["properties"] == {"x": {"type": "integer"}}
    assert load("cli_sysexit").exec_type is ExecType.PYTHON_CLI


def test_sync_entry_and_entry_order():
    s = load("sync_entry")
    # run comes before handle in execute/run/handler/main/handle; helper is not an entry.
    assert (s.entry_function, s.is_async_entry, s.required_positional) == ("run", False, 1)


def test_script_http_and_document_types():
    shell = load("shell_skill")
    assert shell.exec_type is ExecType.SHELL
    assert shell.entry == (FIX / "shell_skill" / "scripts" / "run.sh").resolve()
    inline = load("inline_shell")
    assert inline.exec_type is ExecType.INLINE_SHELL and "$SKILL_INPUT" in inline.command
    assert load("node_by_suffix").exec_type is ExecType.NODE
    http = load("http_toml")
    assert http.exec_type is ExecType.HTTP and http.entry.name == "api.toml"
    for name, kind in (("doc_skill", SkillType.SKILL_MD), ("knowledge_base", SkillType.KNOWLEDGE)):
        s = load(name)
        assert s.error is None and s.skill_type is kind and s.exec_type is ExecType.NONE
        assert s.loaded and not s.runnable


def test_load_skill_never_raises(tmp_path):
    assert "is not a folder" in load_skill(tmp_path / "missing").error
    f = tmp_path / "file.txt"
    f.write_text("x")
    assert load_skill(f).error
    weird = tmp_path / "weird"
    weird.mkdir()
    (weird / "SKILL.md").write_bytes(b"---\nname: weird\n---\n\xff\xfe\x00binary")
    (weird / "handler.py").write_bytes(b"\xff\xfe not python")
    s = load_skill(weird)
    assert s.error and "handler.py" in s.error
    exec_list = tmp_path / "exec_list"
    exec_list.mkdir()
    (exec_list / "SKILL.md").write_text("---\nname: exec_list\nexec: [a, b]\n---\n")
    assert "exec must be a mapping" in load_skill(exec_list).error


# --------------------------------------------------------------------------- registry


def test_registry_one_broken_skill_among_good_ones(tmp_path):
    for name in ("good_handler", "no_entry", "shell_skill"):
        shutil.copytree(FIX / name, tmp_path / name)
    reg = load_registry([tmp_path])
    assert {"good_handler", "no_entry", "shell_skill"} <= {s.name for s in reg}
    assert reg.get("good_handler").runnable and reg.get("shell_skill").runnable
    assert set(reg.errors()) & {"good_handler", "no_entry", "shell_skill"} == {"no_entry"}


def test_registry_skips_hidden_and_underscore_folders():
    names = {p.name for p in skill_folders(FIX)}
    assert ".hidden_skill" not in names and "_private" not in names
    assert "good_handler" in names
    reg = load_registry([FIX])
    assert ".hidden_skill" not in reg and "_private" not in reg
    assert len(reg.errors()) >= 11  # every broken fixture is listed, none hides others


def test_registry_accepts_single_skill_folders_and_reports_missing_dirs(tmp_path):
    reg = load_registry([FIX / "good_handler", FIX / "http_toml", tmp_path / "nowhere"])
    assert reg.get("good_handler").loaded and reg.get("http_toml").loaded
    assert any("nowhere" in p for p in reg.problems)


def test_registry_first_folder_wins_on_duplicate_names(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(FIX / "good_handler", a / "good_handler")
    shutil.copytree(FIX / "good_handler", b / "good_handler")
    reg = load_registry([a, b])
    kept = reg.get("good_handler")
    assert kept.path == a / "good_handler"
    assert any("was ignored" in w for w in kept.warnings)


def test_builtin_delivery_skills_always_loaded_unless_overridden(tmp_path):
    present = [n for n in BUILTIN_SKILLS if (BUNDLED_SKILLS / n).is_dir()]
    if not present:
        pytest.skip("the bundled notify/send_message folders are not in this tree")
    reg = load_registry([FIX / "good_handler"])
    for name in present:
        s = reg.get(name)
        assert s is not None and s.builtin and s.path == BUNDLED_SKILLS / name
    # A folder with the same name in the given dirs replaces the built-in.
    own = tmp_path / present[0]
    own.mkdir()
    (own / "SKILL.md").write_text(f"---\nname: {present[0]}\n---\n")
    (own / "handler.py").write_text(
        "async def execute(input_data, runtime_context):\n    return {}\n"
    )
    reg = load_registry([tmp_path])
    assert reg.get(present[0]).path == own and not reg.get(present[0]).builtin


def test_frontmatter_kept_json_serializable_enough():
    s = load("openclaw")
    assert s.frontmatter["metadata"]["openclaw"]["primaryEnv"] == "PRICE_API_KEY"
    json.dumps(s.frontmatter)


def test_unclosed_frontmatter_and_wall_clock_above_cap(tmp_path):
    open_fm = tmp_path / "open_fm"
    open_fm.mkdir()
    (open_fm / "SKILL.md").write_text("---\nname: open_fm\ndescription: x\n")
    assert "no closing ---" in load_skill(open_fm).error
    slow = tmp_path / "slow"
    shutil.copytree(FIX / "good_handler", slow)
    (slow / "SKILL.md").write_text("---\nname: slow\nwall_sec: 7200\n---\n")
    s = load_skill(slow)
    assert s.wall_sec == 7200 and s.effective_wall_sec() == 1800
    assert any("above the 1800 s cap" in w for w in s.warnings)
    (slow / "SKILL.md").write_text("---\nname: slow\nwall_sec: soon\n---\n")
    s = load_skill(slow)
    assert s.wall_sec is None and any("not a positive number" in w for w in s.warnings)
