"""The demo skills shipped in skills/ load cleanly, with the exec types they document."""

from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
import sys
import zlib

import pytest

from jobs.catalog.loader import load_registry, load_skill
from jobs.catalog.preflight import check_skill_dir
from jobs.settings import BUNDLED_SKILLS
from jobs.skill import ExecType, SkillType

EXPECTED = {
    "echo": ExecType.PYTHON,
    "word_count": ExecType.PYTHON,
    "sales_report": ExecType.PYTHON,
    "csv_stats": ExecType.PYTHON_CLI,
    "disk_usage": ExecType.SHELL,
    "cat_picture": ExecType.PYTHON,
    "summarize_pipeline": ExecType.PYTHON,
}


@pytest.mark.parametrize(("name", "exec_type"), sorted(EXPECTED.items()))
def test_bundled_skill_loads_cleanly(name, exec_type):
    skill = load_skill(BUNDLED_SKILLS / name)
    assert skill.error is None, skill.error
    assert skill.warnings == []
    assert skill.skill_type is SkillType.HANDLER and skill.exec_type is exec_type
    assert skill.description and skill.skill_md_chars < 8000
    if exec_type is ExecType.PYTHON:
        assert skill.entry_function == "execute" and skill.is_async_entry
        assert skill.required_positional == 2
    assert check_skill_dir(BUNDLED_SKILLS / name) == []


def test_registry_of_bundled_folder_has_every_demo_skill():
    reg = load_registry([BUNDLED_SKILLS])
    for name in EXPECTED:
        assert reg.get(name) is not None and reg.get(name).runnable


def test_declarations_the_platform_relies_on():
    sales = load_skill(BUNDLED_SKILLS / "sales_report")
    assert sales.is_async and sales.wall_sec == 300
    wc = load_skill(BUNDLED_SKILLS / "word_count")
    assert wc.input_schema is not None and wc.input_schema["required"] == ["text"]
    disk = load_skill(BUNDLED_SKILLS / "disk_usage")
    assert disk.entry == BUNDLED_SKILLS / "disk_usage" / "scripts" / "disk_usage.sh"
    assert disk.requires_bins == ["df", "du"] and disk.wall_sec == 30
    assert load_skill(BUNDLED_SKILLS / "csv_stats").entry.name == "csv_stats.py"
    for name in EXPECTED:
        if name != "sales_report":
            assert not load_skill(BUNDLED_SKILLS / name).is_async


def _module(name: str):
    path = BUNDLED_SKILLS / name / "handler.py"
    spec = importlib.util.spec_from_file_location(f"bundled_{name}", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sales_report_png_writer_produces_a_valid_png():
    data = _module("sales_report").bar_chart([3.0, 5.0, 1.0], ["01", "02", "03"], 120, 80)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc
        chunks[kind] = body
        pos += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (width, height, depth, color) == (120, 80, 8, 2)
    assert len(zlib.decompress(chunks[b"IDAT"])) == height * (1 + width * 3)
    assert b"IEND" in chunks


def test_command_line_skills_print_json(tmp_path):
    csv_script = BUNDLED_SKILLS / "csv_stats" / "csv_stats.py"
    out = subprocess.run(
        [sys.executable, str(csv_script), "--text", "day,orders\nmon,3\ntue,5\n"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["rows"] == 2 and result["numeric"]["orders"]["sum"] == 8
    sh = BUNDLED_SKILLS / "disk_usage" / "scripts" / "disk_usage.sh"
    out = subprocess.run(
        ["sh", str(sh), "--path", str(tmp_path)], capture_output=True, text=True, timeout=30
    )
    result = json.loads(out.stdout)
    assert result["ok"] is True and result["path"] == str(tmp_path) and result["total_kb"] > 0
    out = subprocess.run(
        ["sh", str(sh), "--path", str(tmp_path / 'no "such"')],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert json.loads(out.stdout)["error_type"] == "recoverable"
