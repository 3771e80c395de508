"""Skill loader: skill folders → ``Skill`` objects, without importing any skill code.

``load_skill`` never raises: a folder that cannot load becomes a ``Skill`` with a
one-line ``error``; non-fatal problems go to ``warnings``. ``load_registry`` loads every
folder it finds, so one broken skill never hides the others.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml

from jobs.catalog.pyscan import ENTRY_NAMES, entry_arity_problem, inspect_python
from jobs.settings import BUNDLED_SKILLS
from jobs.skill import MAX_WALL_SEC, ExecType, Skill, SkillRegistry, SkillType

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_\-]*$")
BUILTIN_SKILLS = ("notify", "send_message")
CATEGORIES = (
    "office finance ecommerce marketing promotion trading data crm channel media "
    "integration compliance general"
).split()
COST_TIERS = ("zero", "low", "medium", "high")
TOP_LEVEL_ONLY = (
    "category cost-tier version tags skill_type env async wall_sec timeout_sec force_raw_prompt"
).split()
SCRIPT_TYPES = {
    "shell": ExecType.SHELL,
    "node": ExecType.NODE,
    "ruby": ExecType.RUBY,
    "go": ExecType.GO,
}
SUFFIX_TYPES = {
    ".sh": ExecType.SHELL,
    ".js": ExecType.NODE,
    ".mjs": ExecType.NODE,
    ".rb": ExecType.RUBY,
    ".go": ExecType.GO,
    ".toml": ExecType.HTTP,
}
EXEC_TYPES = ("python", "shell", "inline_shell", "node", "ruby", "go", "http")

# Keyword → category, used when a skill declares no (or an unknown) category.
CATEGORY_WORDS: dict[str, tuple[str, ...]] = {
    cat: tuple(words.split())
    for cat, words in {
        "office": "office document docx excel spreadsheet pdf meeting calendar email 文档 办公 会议",
        "finance": "finance invoice accounting expense budget tax payment reimburse 财务 报销 发票",
        "ecommerce": "ecommerce e-commerce shop order product sku cart 电商 订单 商品",
        "marketing": "marketing campaign seo advert brand 营销 广告",
        "promotion": "promotion coupon discount promo 促销 优惠",
        "trading": "trading trade stock crypto kline forex 交易 行情",
        "data": "data csv sql analytics statistics stats report chart table query count 数据 报表 统计",
        "crm": "crm customer lead 客户",
        "channel": "channel message notify notification telegram feishu wecom dingtalk 消息 通知",
        "media": "media image video audio picture photo music 图片 视频 音频",
        "integration": "integration api webhook http sync 集成 接口",
        "compliance": "compliance audit gdpr legal privacy 合规 审计",
    }.items()
}


def _inside(folder: Path, rel: str) -> Path | None:
    """``folder/rel`` if it stays inside ``folder`` (no ``..`` escapes), else None."""
    try:
        target = (folder / rel).resolve()
        target.relative_to(folder.resolve())
    except (ValueError, OSError):
        return None
    return target


# --------------------------------------------------------------------------- frontmatter


def split_frontmatter(text: str) -> tuple[str | None, str]:
    """(frontmatter text or None, body) of a Markdown document."""
    text = text.lstrip("\ufeff")
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        return None, text
    for i in range(1, len(lines)):
        if lines[i].strip() in ("---", "..."):
            return "".join(lines[1:i]), "".join(lines[i + 1 :])
    return None, text


def parse_frontmatter(fm: str) -> tuple[dict[str, Any], list[str]]:
    """YAML first; on failure line-by-line ``k: v`` with a warning naming what was lost."""
    problem = ""
    try:
        data = yaml.safe_load(fm)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = f"is not valid YAML{where}: {getattr(exc, 'problem', None) or exc}"
    else:
        if data is None:
            return {}, []
        if isinstance(data, dict):
            return {str(k): v for k, v in data.items()}, []
        problem = f"is a YAML {type(data).__name__}, not a mapping of keys"

    out: dict[str, Any] = {}
    lost: list[str] = []
    current: str | None = None
    for raw in fm.splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        if raw[0] in " \t" or raw.lstrip().startswith("- "):
            if current and current not in lost:
                lost.append(current)
            continue
        key, sep, value = raw.partition(":")
        if not sep or not key.strip():
            continue
        current = key.strip()
        value = value.strip()
        if not value:
            out[current] = None
            continue
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            parsed = None
        # "a: b" inside an unquoted value is text, not a nested mapping.
        out[current] = value.strip("'\"") if parsed is None or isinstance(parsed, dict) else parsed
    msg = f"SKILL.md frontmatter {problem}; read line by line instead"
    if lost:
        msg += f" — lost the nested blocks/lists under: {', '.join(lost)}"
        msg += " (quote values that contain ': ')"
    return out, [msg]


# --------------------------------------------------------------------------- python source


def _as_list(value: object) -> list[Any]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, list | tuple | set):
        return list(value)
    return [value]


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _as_bool(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"true", "yes", "on", "1"}
    return bool(value)


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0", ""}


def _strict_bool(value: object) -> bool | None:
    """A YAML boolean, or a string/number that clearly says one; None for anything else
    (``async: maybe`` must not silently mean false)."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    return None


def _names(value: object) -> list[str]:
    """``[X, Y]`` or ``[{name: X, required: true}]`` → required names."""
    out = []
    for item in _as_list(value):
        if isinstance(item, dict):
            if item.get("name") and item.get("required", True) is not False:
                out.append(str(item["name"]))
        elif item not in (None, ""):
            out.append(str(item))
    return out


def _env_spec(value: object) -> dict[str, Any]:
    """Top-level ``env`` in any of its shapes → ``{name: {description, required, ...}}``."""
    if isinstance(value, dict):
        return {
            str(k): (v if isinstance(v, dict) else {"description": v}) for k, v in value.items()
        }
    out: dict[str, Any] = {}
    for item in _as_list(value):
        if isinstance(item, dict) and item.get("name"):
            out[str(item["name"])] = {k: v for k, v in item.items() if k != "name"}
        elif isinstance(item, str):
            out[item] = {}
    return out


def guess_category(tags: list[str], description: str) -> str:
    words = " ".join(str(t).lower() for t in tags)
    desc = description.lower()
    best, score = "general", 0
    for cat, keys in CATEGORY_WORDS.items():
        s = sum(
            2 * (k in words) + (re.search(rf"\b{re.escape(k)}", desc) is not None) for k in keys
        )
        if s > score:
            best, score = cat, s
    return best


def _number(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        n = float(str(value).strip().rstrip("s"))
    except ValueError:
        return None
    return n if n > 0 else None


# --------------------------------------------------------------------------- SKILL.md


def find_skill_md(folder: Path, name: str) -> tuple[Path | None, dict[str, Any], list[str]]:
    """Locate the skill document (SPEC §1 order). Returns (path, stub frontmatter, warnings);
    the stub is the frontmatter of ``<folder>/SKILL.md`` when it only redirects."""
    warnings: list[str] = []
    stub: dict[str, Any] = {}
    root_md = folder / "SKILL.md"
    if root_md.is_file():
        fm, _ = split_frontmatter(root_md.read_text(encoding="utf-8", errors="replace"))
        if fm is not None:
            stub, _ = parse_frontmatter(fm)
    candidates: list[Path | None] = []
    redirect = stub.get("skill_md")
    if isinstance(redirect, str) and redirect.strip():
        target = _inside(folder, redirect.strip())
        if target is None:
            warnings.append(f"skill_md {redirect!r} points outside the skill folder; ignored")
        candidates.append(target)
    else:
        redirect = None
        candidates += [root_md, folder / "skill.md"]
    origin = stub.get("origin_path")
    if isinstance(origin, str) and origin.strip():
        base = _inside(folder, origin.strip())
        if base is None:
            warnings.append(f"origin_path {origin!r} points outside the skill folder; ignored")
        else:
            candidates += [base / "SKILL.md", base / "skill.md"]
    for sub in ("optional-skills", "docs"):
        candidates += [
            folder / sub / name / "SKILL.md",
            folder / sub / f"{name}.md",
            folder / sub / name,
        ]
    candidates.append(folder / "README.md")
    for cand in candidates:
        if cand is not None and cand.is_file():
            return cand, stub, warnings
    if redirect and root_md.is_file():
        warnings.append(f"skill_md {redirect!r} does not exist; using SKILL.md")
        return root_md, stub, warnings
    return None, stub, warnings


# --------------------------------------------------------------------------- exec type


def _exec_spec(skill: Skill, fm: dict[str, Any]) -> tuple[dict[str, Any], str | None] | None:
    """(exec.primary, exec.config) of the frontmatter; None (and an error) when malformed."""
    spec = fm.get("exec")
    if spec is None:
        return {}, None
    if not isinstance(spec, dict):
        skill.error = "exec must be a mapping with primary.type / primary.entry / config"
        return None
    primary = _mapping(spec.get("primary"))
    if isinstance(spec.get("primary"), str):
        primary = {"type": spec["primary"]}
    return primary, (str(spec["config"]) if spec.get("config") else None)


def _detect_exec(skill: Skill, fm: dict[str, Any]) -> None:
    """Fill exec_type / entry / entry function (SPEC §2 table and §11)."""
    parsed = _exec_spec(skill, fm)
    if parsed is None:
        return
    primary, config = parsed
    kind = str(primary.get("type") or "").strip().lower()
    if kind and kind not in EXEC_TYPES:
        skill.error = f"exec.primary.type {kind!r} is not one of {', '.join(EXEC_TYPES)}"
        return
    if kind == "inline_shell":
        command = primary.get("command")
        if not isinstance(command, str) or not command.strip():
            skill.error = "exec.primary.type inline_shell needs exec.primary.command"
            return
        skill.exec_type, skill.command = ExecType.INLINE_SHELL, command
        return
    entry = _entry_file(skill, primary, config, kind, declared="exec" in fm)
    if entry is None:
        return
    skill.entry = entry
    if not kind:
        found = ExecType.PYTHON if entry.suffix == ".py" else SUFFIX_TYPES.get(entry.suffix.lower())
        if found is None:
            skill.error = (
                f"cannot tell how to run {entry.name}: declare exec.primary.type "
                f"({', '.join(EXEC_TYPES)})"
            )
            return
        kind = found.value
    if kind == "http":
        try:
            tomllib.loads(entry.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            skill.error = f"{entry.name} is not valid TOML: {exc}"
            return
        skill.exec_type = ExecType.HTTP
    elif kind != "python":
        skill.exec_type = SCRIPT_TYPES[kind]
    else:
        _detect_python(skill, entry)


def _entry_file(
    skill: Skill, primary: dict[str, Any], config: str | None, kind: str, *, declared: bool
) -> Path | None:
    """The file to run: the declared entry, else ``handler.py`` / a ``*.toml``. A SKILL.md
    with neither an exec block nor an entry file is a document skill (C7)."""
    folder = skill.path
    entry_rel = str(primary.get("entry") or config or "").strip()
    if entry_rel:
        entry = _inside(folder, entry_rel)
        if entry is None or not entry.is_file():
            where = "exec.primary.entry" if primary.get("entry") else "exec.config"
            skill.error = f"{where} {entry_rel!r} is not a file inside the skill folder"
            return None
        return entry
    if kind in ("", "python") and (folder / "handler.py").is_file():
        return folder / "handler.py"
    if kind in ("", "http") and (tomls := sorted(folder.glob("*.toml"))):
        return tomls[0]
    if kind or declared:
        skill.error = f"exec.primary.type {kind or '(none)'} needs exec.primary.entry (a script in the folder)"
        return None
    _as_document(skill)
    return None


SCRIPT_SUFFIXES = (".py", ".sh", ".js", ".mjs", ".rb", ".go")


def _as_document(skill: Skill) -> None:
    """Nothing to run: loaded as a ``skill_md`` document, with the one line that would make
    it runnable (OpenClaw and Anthropic skills describe their scripts/ in prose). The line
    names a script only when the SKILL.md itself runs it in a command example; otherwise
    the rule alone (guessing could name the wrong script, e.g. one that deletes files)."""
    skill.skill_type, skill.exec_type = SkillType.SKILL_MD, ExecType.NONE
    scripts = sorted(
        p.relative_to(skill.path).as_posix()
        for sub in ("scripts", ".")
        if (skill.path / sub).is_dir()
        for p in (skill.path / sub).iterdir()
        if p.is_file() and p.suffix.lower() in SCRIPT_SUFFIXES and p.name != "__init__.py"
    )
    example = _script_in_examples(skill, scripts)
    if example:
        skill.hint = (
            "to make it runnable add one line to its SKILL.md frontmatter: "
            f"exec: {{primary: {{entry: {example}}}}}"
        )
    else:
        skill.hint = (
            "to make it runnable name the script to run in its SKILL.md frontmatter: "
            "exec: {primary: {entry: scripts/<the script to run>}}"
        )
    found = f", {', '.join(scripts[:5])} found" if scripts else ""
    skill.warnings.append(
        f"loaded as a document skill (skill_md: no exec block, no handler.py{found}); " + skill.hint
    )


_RUNNERS = r"(?:python3?|uv run|node|bash|sh|ruby|go run|npx tsx|deno run)"
_COMMAND = re.compile(
    rf"(?:^|[\s`$(]){_RUNNERS}\s+(?:-\S+\s+)*(?:\{{\w+\}}/|\$\{{?\w+\}}?/|\./|~/)?"
    r"([\w./-]+\.(?:py|sh|js|mjs|rb|go))"
    r"|(?:^|[\s`])\./([\w./-]+\.(?:sh|py|js|rb))",
    re.M,
)


def _script_in_examples(skill: Skill, scripts: list[str]) -> str | None:
    """The first of ``scripts`` that the SKILL.md runs in a command example."""
    md = skill.skill_md_path
    if md is None or not scripts:
        return None
    try:
        body = md.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for m in _COMMAND.finditer(body):
        mentioned = (m.group(1) or m.group(2) or "").lstrip("./")
        for script in scripts:
            if mentioned == script or mentioned.endswith("/" + script):
                return script
    return None


def _detect_python(skill: Skill, entry: Path) -> None:
    try:
        info = inspect_python(entry)
    except SyntaxError as exc:
        skill.error = f"{entry.name} has a syntax error at line {exc.lineno}: {exc.msg}"
        return
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        skill.error = f"cannot read {entry.name}: {exc}"
        return
    if info["schema_problem"]:
        skill.warnings.append(info["schema_problem"])
    if skill.input_schema is None and isinstance(info["schema"], dict):
        skill.input_schema = info["schema"]
    elif skill.input_schema is not None and info["schema"] is not None:
        skill.warnings.append(f"schema.json is used; in-code {info['schema_name']} is ignored")
    if info["is_cli"]:
        skill.exec_type = ExecType.PYTHON_CLI
        skill.cli_reason = info["cli_reason"]
        if info["entry"] == "execute":
            skill.warnings.append(
                f"{entry.name} defines execute() but is a command-line script "
                f"({info['cli_reason']}); it runs as a subprocess"
            )
        return
    name = info["entry"]
    if name is None:
        skill.error = (
            f"{entry.name} has no entry function (define async def execute(input_data, "
            f"runtime_context); also accepted: {', '.join(ENTRY_NAMES[1:])})"
        )
        return
    fn = info["functions"][name]
    problem = entry_arity_problem(name, fn)
    if problem is not None:
        skill.error = problem
        return
    skill.exec_type = ExecType.PYTHON
    skill.entry_function = name
    skill.is_async_entry = fn["is_async"]
    skill.required_positional = max(fn["required"], 0)


# --------------------------------------------------------------------------- one skill


def load_skill(path: Path, *, builtin: bool = False) -> Skill:
    """Load one skill folder. Never raises: problems end up in ``error`` / ``warnings``."""
    path = Path(path)
    skill = Skill(name=path.name, path=path, builtin=builtin)
    try:
        _load_into(skill)
    except Exception as exc:  # the loader must survive any folder content
        log.exception("unexpected failure loading skill %s", path)
        skill.error = f"unexpected loader failure: {type(exc).__name__}: {exc}"
    return skill


def _load_into(skill: Skill) -> None:
    folder = skill.path
    if not folder.is_dir():
        skill.error = f"{folder} is not a folder"
        return
    md_path, stub, warns = find_skill_md(folder, folder.name)
    skill.warnings += warns
    if md_path is None:
        skill.error = "no SKILL.md in the skill folder"
        return
    text = md_path.read_text(encoding="utf-8", errors="replace")
    skill.skill_md_path, skill.skill_md_chars = md_path, len(text)
    fm_text, _ = split_frontmatter(text)
    if fm_text is None and text.lstrip("\ufeff").startswith("---"):
        skill.error = f"{md_path.name} frontmatter starts with --- but has no closing --- line"
        return
    fm: dict[str, Any] = dict(stub)
    if fm_text is not None:
        parsed, warns = parse_frontmatter(fm_text)
        skill.warnings += warns
        fm.update(parsed)
    skill.frontmatter = fm

    name = fm.get("name")
    if name in (None, ""):
        skill.error = (
            f"{md_path.name} has no name in its frontmatter (expected name: {folder.name})"
        )
        return
    name = str(name).strip()
    if not NAME_RE.match(name):
        skill.error = f"name {name!r} is invalid: use lowercase letters, digits, _ and - (^[a-z0-9][a-z0-9_\\-]*$)"
        return
    if name != folder.name:
        skill.error = f"name {name!r} does not match its folder name {folder.name!r}"
        return

    skill.description = str(fm.get("description") or "").strip()
    skill.version = str(fm.get("version") or "")
    skill.tags = [str(t) for t in _as_list(fm.get("tags"))]
    _read_flags(skill, fm)
    if skill.error:
        return

    schema_file = folder / "schema.json"
    if schema_file.is_file():
        try:
            schema = json.loads(schema_file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            skill.error = f"schema.json is not valid JSON: {exc}"
            return
        if not isinstance(schema, dict):
            skill.error = "schema.json must be a JSON object (a JSON Schema)"
            return
        skill.input_schema = schema

    if skill.skill_type is not SkillType.HANDLER:
        skill.exec_type = ExecType.NONE
        return
    _detect_exec(skill, fm)


def _read_wall(skill: Skill, fm: dict[str, Any], openclaw: dict[str, Any]) -> None:
    for label, value in (
        ("wall_sec", fm.get("wall_sec")),
        ("timeout_sec", fm.get("timeout_sec")),
        ("metadata.openclaw.timeout", openclaw.get("timeout")),
    ):
        if value is None:
            continue
        seconds = _number(value)
        if seconds is None:
            skill.warnings.append(f"{label} {value!r} is not a positive number of seconds; ignored")
            continue
        if seconds > MAX_WALL_SEC:
            skill.warnings.append(
                f"{label} {seconds:g} s is above the {MAX_WALL_SEC:g} s cap; capped at run time"
            )
        skill.wall_sec = seconds
        break


KNOWN_METADATA = frozenset({"openclaw", *TOP_LEVEL_ONLY})
OS_NAMES = {"darwin": "darwin", "macos": "darwin", "mac": "darwin", "osx": "darwin"}
OS_NAMES |= {"linux": "linux", "win32": "win32", "windows": "win32", "win": "win32"}


def _ignored_frontmatter(
    skill: Skill, fm: dict[str, Any], meta: dict[str, Any], openclaw: dict[str, Any]
) -> None:
    """Warnings for frontmatter that skilljobs does not act on (C7): an ``os`` list that
    excludes this host, metadata namespaces other than ``openclaw``."""
    wanted = [str(o).strip().lower() for o in _as_list(fm.get("os") or openclaw.get("os"))]
    if wanted:
        here = "darwin" if sys.platform == "darwin" else sys.platform
        here = "linux" if here.startswith("linux") else here
        if here not in {OS_NAMES.get(o, o) for o in wanted}:
            skill.warnings.append(
                f"os: {', '.join(wanted)} does not include this host ({here}); the skill "
                "loads, but its scripts may not work here"
            )
    for key, value in meta.items():
        if key not in KNOWN_METADATA and isinstance(value, dict):
            skill.warnings.append(
                f"metadata.{key} is not read by skilljobs (only metadata.openclaw is); ignored"
            )


def _read_flags(skill: Skill, fm: dict[str, Any]) -> None:
    meta = _mapping(fm.get("metadata"))
    for key in TOP_LEVEL_ONLY:
        if key in meta and key not in fm:
            skill.warnings.append(f"metadata.{key} is ignored; put {key} at the top level")

    raw_type = str(fm.get("skill_type") or "handler").strip().lower()
    try:
        skill.skill_type = SkillType(raw_type)
    except ValueError:
        skill.error = f"skill_type {raw_type!r} is not one of handler, skill_md, knowledge"
        return

    cat = str(fm.get("category") or "").strip().lower()
    if cat in CATEGORIES:
        skill.category = cat
    else:
        skill.category = guess_category(skill.tags, skill.description)
        if cat:
            skill.warnings.append(f"category {cat!r} is unknown; using {skill.category!r}")
    tier = str(fm.get("cost-tier") or fm.get("cost_tier") or "").strip().lower()
    if tier in COST_TIERS:
        skill.cost_tier = tier
    elif tier:
        skill.warnings.append(
            f"cost-tier {tier!r} is not one of {', '.join(COST_TIERS)}; using 'low'"
        )

    is_async = _strict_bool(fm.get("async", False))
    if is_async is None:
        skill.error = (
            f"async: {fm.get('async')!r} is not true or false (async: true runs the skill "
            "as a background job; async: false answers in the chat turn)"
        )
        return
    skill.is_async = is_async
    skill.force_raw_prompt = _as_bool(fm.get("force_raw_prompt", False))
    openclaw = _mapping(meta.get("openclaw"))
    _read_wall(skill, fm, openclaw)
    _ignored_frontmatter(skill, fm, meta, openclaw)
    requires = _mapping(openclaw.get("requires"))
    skill.requires_env = _names(requires.get("env"))
    skill.requires_bins = _names(requires.get("bins"))

    for key in ("env", "environment_variables", "requires-env", "secrets", "inputs"):
        if fm.get(key):
            skill.env = _env_spec(fm[key])
            break
    skill.exec_mode = str(fm.get("exec_mode") or "").strip().lower()
    cmds = fm.get("cli_commands")
    if isinstance(cmds, dict):
        skill.cli_commands = [str(k) for k in cmds]
        skill.cli_command_schemas = {str(k): v for k, v in cmds.items() if isinstance(v, dict)}
    elif cmds:
        skill.cli_commands = [str(c) for c in _as_list(cmds)]
    if len(skill.cli_commands) > 45:
        skill.warnings.append(
            f"{len(skill.cli_commands)} cli_commands: at most 45 fan out as tools"
        )


# --------------------------------------------------------------------------- registry


def _is_skill_folder(path: Path) -> bool:
    return any((path / f).is_file() for f in ("SKILL.md", "skill.md", "handler.py"))


def _visible(path: Path) -> bool:
    return path.is_dir() and not path.name.startswith((".", "_"))


def skill_folders(root: Path) -> list[Path]:
    """``root`` itself when it is one skill folder, else its visible sub-folders."""
    if _is_skill_folder(root):
        return [root]
    return sorted(p for p in root.iterdir() if _visible(p))


def load_registry(dirs: list[Path]) -> SkillRegistry:
    """Every skill folder under ``dirs`` (each a skill folder or a folder of them), plus the
    built-in ``notify`` / ``send_message`` unless a folder of that name is given."""
    registry = SkillRegistry()
    origin: dict[str, Path] = {}
    bundled = BUNDLED_SKILLS.resolve()
    for root in dirs:
        root = Path(root).expanduser()
        if not root.is_dir():
            registry.problems.append(f"skills folder {root} does not exist")
            log.warning("skills folder %s does not exist", root)
            continue
        for folder in skill_folders(root):
            if folder.name in origin:
                kept = registry.get(folder.name)
                if kept is not None:
                    kept.warnings.append(
                        f"another folder named {folder.name} at {folder} was ignored"
                    )
                continue
            builtin = folder.name in BUILTIN_SKILLS and folder.resolve().parent == bundled
            registry.add(load_skill(folder, builtin=builtin))
            origin[folder.name] = folder
    for name in BUILTIN_SKILLS:
        folder = BUNDLED_SKILLS / name
        if name not in origin and folder.is_dir():
            registry.add(load_skill(folder, builtin=True))
    return registry
