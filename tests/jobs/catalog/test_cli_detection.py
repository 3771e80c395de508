"""Which ``.py`` files are command-line scripts, decided when the skill loads (C6)."""

from __future__ import annotations

import textwrap

import pytest

from jobs.catalog.loader import load_skill
from jobs.skill import ExecType

MAIN_NO_INPUT = """
import sys
def main():
    print("hi")
    sys.exit(0)
if __name__ == "__main__":
    main()
"""
READS_ARGV = """
import sys
async def execute(input_data, runtime_context):
    return {"argv": sys.argv[1:]}
"""
FROM_SYS_ARGV = """
from sys import argv
def run(input_data):
    return {"n": len(argv)}
"""
NO_ENTRY_SCRIPT = """
if __name__ == "__main__":
    print("done")
"""
HANDLER_WITH_TEST_HARNESS = """
import asyncio, json, sys
async def execute(input_data, runtime_context):
    return {"ok": True}
if __name__ == "__main__":
    print(asyncio.run(execute(json.loads(sys.argv[1]), {})))
"""
PLAIN_HANDLER = """
async def execute(input_data, runtime_context):
    return {"ok": True}
"""


@pytest.mark.parametrize(
    ("body", "cli_reason"),
    [
        (MAIN_NO_INPUT, "__main__ block, main() takes no input"),
        (READS_ARGV, "reads sys.argv"),
        (FROM_SYS_ARGV, "reads sys.argv"),
        (NO_ENTRY_SCRIPT, "__main__ block, no entry function"),
        (HANDLER_WITH_TEST_HARNESS, ""),
        (PLAIN_HANDLER, ""),
    ],
)
def test_scripts_are_cli_skills_and_handlers_stay_in_process(tmp_path, body, cli_reason):
    folder = tmp_path / "probe"
    folder.mkdir()
    (folder / "SKILL.md").write_text("---\nname: probe\ndescription: probe\n---\n# probe\n")
    (folder / "handler.py").write_text(textwrap.dedent(body))
    skill = load_skill(folder)
    assert skill.error is None, skill.error
    assert skill.cli_reason == cli_reason
    want = ExecType.PYTHON_CLI if cli_reason else ExecType.PYTHON
    assert skill.exec_type is want
