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


def test_script_shapes_of_the_world(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A top-level script (no function, no guard) and a bare ``main()`` call are scripts;
    a helper called at import beside an entry function is not."""
    from jobs.catalog.pyscan import inspect_python

    def reason(src: str) -> str:
        path = tmp_path / "x.py"
        path.write_text(src)
        return str(inspect_python(path)["cli_reason"])

    assert reason("import json\nprint(json.dumps({'a': 1}))\n") == (
        "top-level script (no entry function)"
    )
    assert reason("def main():\n    print(1)\n\nmain()\n") == "calls main() at import"
    assert reason("import asyncio\nasync def main():\n    pass\nasyncio.run(main())\n") == (
        "calls main() at import"
    )
    assert reason("import sys\ndef main():\n    return 0\nsys.exit(main())\n") == (
        "calls main() at import"
    )
    helper = "CACHE = {}\ndef setup():\n    CACHE['x'] = 1\nsetup()\n"
    assert reason(helper + "async def execute(i, c):\n    return CACHE\n") == ""
    assert reason("X = 1\nasync def run(i, c):\n    return X\n") == ""
