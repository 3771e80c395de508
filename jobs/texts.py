"""User-facing texts in every language we speak (SPEC C14), and the helpers that keep
failure texts short and meaningful.

The language is ``SKILLJOBS_LANGUAGE`` (``en`` | ``zh``, default ``en``); a dispatch
context ``locale`` (``zh-CN``, ``en_US``, ``zh``…) overrides it for that call and for the
background job it starts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from jobs.settings import Settings

LANGUAGES = ("en", "zh")
DEFAULT_LANGUAGE = "en"

TEXTS: dict[str, dict[str, str]] = {
    "receipt": {
        "en": (
            "This will take a while, so it is running in the background. "
            "The result will be sent to this chat when it is ready."
        ),
        "zh": "这个任务需要一些时间，已在后台运行。完成后结果会发送到这个对话。",
    },
    "receipt_scheduled": {
        "en": "Scheduled: it will run at {when}; the result will be sent to this chat.",
        "zh": "已安排：将在 {when} 运行，结果会发送到这个对话。",
    },
    "finished": {"en": "{name} finished.", "zh": "{name} 已完成。"},
    "the_task": {"en": "The task", "zh": "任务"},
    "partial": {
        "en": "⚠ Partial result: {reason}",
        "zh": "⚠ 部分结果：{reason}",
    },
    "partial_default": {
        "en": "the task did not complete everything",
        "zh": "任务没有全部完成",
    },
    "truncated": {
        "en": "… (cut here: too long for one message)",
        "zh": "……（内容过长，此处截断）",
    },
    "rest_in_file": {
        "en": "… (continued: the whole text is in the attached file {name})",
        "zh": "……（未完：完整内容见附件 {name}）",
    },
    "full_result_file": {
        "en": "The full result is in the attached file {name}.",
        "zh": "完整结果见附件 {name}。",
    },
    "not_set_up": {
        "en": "Sorry, {name} is not set up yet (missing: {missing}). Nothing was done.",
        "zh": "抱歉，{name} 尚未配置（缺少：{missing}），未执行任何操作。",
    },
    "failed_reason": {
        "en": "Sorry, {name} could not finish: {reason}.",
        "zh": "抱歉，{name} 未能完成：{reason}。",
    },
    "failed": {
        "en": "Sorry, {name} could not finish. You can try again in a moment.",
        "zh": "抱歉，{name} 未能完成，请稍后再试。",
    },
    # the reason in "Sorry, {name} could not finish: {reason}." of failures outside the skill
    "internal_reason": {
        "en": "an internal error stopped it",
        "zh": "系统故障导致任务中断",
    },
    "lost_reason": {
        "en": "it was stopped every time it ran (the worker running it died or stalled)",
        "zh": "每次运行都被中断（运行它的工作进程崩溃或卡住）",
    },
    "notice_working": {
        "en": "{name} is still working on it; the result will be sent here when it is ready.",
        "zh": "{name} 仍在处理中，完成后结果会发送到这里。",
    },
    "notice_cancelled": {
        "en": "{name} was cancelled; no result will follow.",
        "zh": "{name} 已取消，不会再有结果。",
    },
    "items": {"en": "{n} items", "zh": "{n} 项"},
    "nothing": {"en": "none", "zh": "无"},
    "fields": {"en": "{n} fields", "zh": "{n} 个字段"},
    "more_lines": {"en": "… {n} more", "zh": "……另有 {n} 项"},
    "chain_empty": {
        "en": "{name}: nothing to report this time — {reason}.",
        "zh": "{name}：本次没有可报告的内容 — {reason}。",
    },
    "chain_empty_reason": {"en": "a step returned no data", "zh": "某个步骤没有返回数据"},
    "chain_failed": {"en": "{name} did not complete: {reason}", "zh": "{name} 未完成：{reason}"},
    "chain_failed_reason": {"en": "a step failed", "zh": "某个步骤失败"},
}


# --------------------------------------------------------------------------- our failure framings

# The English framings our executor puts around a failure (``error`` of its envelopes), in
# the other languages: ``(pattern, {lang: template})``; the template's ``{…}`` are the
# pattern's named groups (the skill's own words, names, numbers — kept as they are).
_Q = r"(?P<q>['\"])(?P<skill>.+?)(?P=q)"
REASON_FORMS: list[tuple[re.Pattern[str], dict[str, str]]] = [
    (
        re.compile(r"skill ran over (?P<secs>[\d.]+) s and was stopped"),
        {"zh": "运行超过 {secs} 秒，已被停止"},
    ),
    (
        re.compile(rf"skill {_Q} raised (?P<exc>[\w.]+): (?P<msg>.+)", re.S),
        {"zh": "运行时出错：{msg}"},
    ),
    (re.compile(rf"skill {_Q} raised (?P<exc>[\w.]+)"), {"zh": "运行时出错（{exc}）"}),
    (
        re.compile(rf"skill {_Q} exited with code (?P<code>-?\d+) \(no output\)"),
        {"zh": "运行失败（退出码 {code}），没有输出"},
    ),
    (
        re.compile(rf"skill {_Q} exited with code (?P<code>-?\d+): (?P<msg>.+)", re.S),
        {"zh": "运行失败（退出码 {code}）：{msg}"},
    ),
    (
        re.compile(rf"skill {_Q} was killed by signal (?P<sig>\d+) \(no output\)"),
        {"zh": "运行被信号 {sig} 终止，没有输出"},
    ),
    (
        re.compile(rf"skill {_Q} was killed by signal (?P<sig>\d+): (?P<msg>.+)", re.S),
        {"zh": "运行被信号 {sig} 终止：{msg}"},
    ),
    (
        re.compile(rf"skill {_Q} reported a failure \((?P<flag>[^)]*)\) without saying why"),
        {"zh": "技能报告了失败，但没有说明原因"},
    ),
    (
        re.compile(r"skill printed more than (?P<mb>\d+) MB on (?P<stream>\w+) and was stopped.*"),
        {"zh": "输出超过 {mb} 兆字节，已被停止"},
    ),
    (
        re.compile(rf"unknown skill {_Q}.*", re.S),
        {"zh": "找不到这个技能"},
    ),
    (
        re.compile(rf"skill {_Q} failed to load: .*", re.S),
        {"zh": "技能加载失败，请检查它的配置"},
    ),
    (
        re.compile(rf"skill {_Q} is a \w+ document, not code.*", re.S),
        {"zh": "这个技能只是说明文档，没有可执行的代码"},
    ),
    (
        re.compile(rf"skill {_Q} is not configured: .*", re.S),
        {"zh": "尚未配置"},
    ),
    (
        re.compile(
            rf"skill {_Q} needs program\(s\) not installed on this host: (?P<bins>.+)", re.S
        ),
        {"zh": "运行所需的程序未安装：{bins}"},
    ),
    (
        re.compile(rf"skill {_Q} (?:could not be run|cannot start|cannot be imported)\b.*", re.S),
        {"zh": "无法启动"},
    ),
    (
        re.compile(r"input field (?P<q>['\"])(?P<field>.+?)(?P=q) was refused: (?P<why>.+)", re.S),
        {"zh": "输入字段 {field} 被拒绝：{why}"},
    ),
    (
        re.compile(r"input for (?P<q>['\"])(?P<skill>.+?)(?P=q) must be a JSON object.*", re.S),
        {"zh": "输入格式不对：需要一个键值对形式的对象"},
    ),
    (re.compile(r"the skill run failed"), {"zh": "运行失败"}),
    (
        re.compile(rf"skill {_Q}: its dependency environment could not be built: .*", re.S),
        {"zh": "技能的依赖环境无法构建"},
    ),
    (
        re.compile(
            rf"skill {_Q} needs the module (?P<mq>['\"])(?P<module>.+?)(?P=mq), which is not "
            r"installed: .*",
            re.S,
        ),
        {"zh": "缺少模块 {module}，它尚未安装"},
    ),
    (
        re.compile(rf"skill {_Q} called sys\.exit\(\) instead of returning a result: .*", re.S),
        {"zh": "技能提前退出，没有返回结果"},
    ),
    (
        re.compile(r".+ answered HTTP (?P<status>\d+): \(empty body\)", re.S),
        {"zh": "接口返回错误状态 {status}，内容为空"},
    ),
    (
        re.compile(r".+ answered HTTP (?P<status>\d+): (?P<body>.*)", re.S),
        {"zh": "接口返回错误状态 {status}：{body}"},
    ),
    (
        re.compile(r".+ refused by the outbound policy: .*", re.S),
        {"zh": "对外访问被安全策略拒绝"},
    ),
    (
        re.compile(r".+ answered with more than (?P<mb>\d+) MB"),
        {"zh": "接口返回的内容超过 {mb} 兆字节"},
    ),
    (
        re.compile(rf"HTTP skill {_Q}: (?P<msg>.+)", re.S),
        {"zh": "接口调用失败：{msg}"},
    ),
]


#: why an input was refused (the ``{why}`` of "input field … was refused: …")
REFUSAL_FORMS: list[tuple[re.Pattern[str], dict[str, str]]] = [
    (
        re.compile(
            r"(?P<value>.+) is outside this job(?:'s workspace)? \(files must be .*\)", re.S
        ),
        {"zh": "{value} 不在本任务的工作区内（文件必须在工作区中，或是本次对话的附件）"},
    ),
    (
        re.compile(r"nested deeper than (?P<n>\d+) levels"),
        {"zh": "嵌套超过 {n} 层"},
    ),
    (
        re.compile(r"input key (?P<key>.+?) cannot become a command-line flag.*", re.S),
        {"zh": "输入键 {key} 不能作为命令行参数名（只能用字母、数字、_ 和 -，并以字母或 _ 开头）"},
    ),
    (
        re.compile(r"the value (?P<value>.+?) of input (?P<key>.+?) would be read as a .*", re.S),
        {"zh": "输入 {key} 的值 {value} 会被当作命令行选项（值不能以 - 加字母开头）"},
    ),
    (re.compile(r"input keys must be strings"), {"zh": "输入键必须是字符串"}),
]
REASON_FORMS.append(
    (
        re.compile(
            r"input field (?P<q>['\"])(?P<field>.+?)(?P=q) names attachment (?P<ref>.+?), which "
            r"this turn does not have \(attachments: (?P<known>.*)\)",
            re.S,
        ),
        {"zh": "输入字段 {field} 引用的附件 {ref} 不在本次对话中（现有附件：{known}）"},
    )
)


def _refusal(why: str, lang: str) -> str:
    for pattern, forms in REFUSAL_FORMS:
        m = pattern.fullmatch(why.strip())
        if m is not None and lang in forms:
            return forms[lang].format(**m.groupdict())
    return why


#: a chain step's failure: ``step 2 (fetch, web_fetch): <reason>``
_STEP = re.compile(
    r"step (?P<n>\d+) \((?P<id>[^,()]+)(?:, (?P<skill>[^()]+))?\): (?:item (?P<item>\d+): )?"
    r"(?P<inner>.+)",
    re.S,
)
_STEP_FORM = {"zh": "第 {n} 步（{label}）：{reason}"}
#: a chain step that returned nothing
REASON_FORMS.append(
    (
        re.compile(r"step (?P<n>\d+) \((?P<label>[^()]+)\) returned nothing; chain stopped"),
        {"zh": "第 {n} 步（{label}）没有返回任何内容，流程已停止"},
    )
)
REASON_FORMS.append((re.compile(r"failed"), {"zh": "失败"}))


def localized_reason(reason: str, lang: str = DEFAULT_LANGUAGE) -> str:
    """``reason`` with our English framing of a failure said in ``lang`` (the skill's own
    words inside it stay as the skill wrote them); English, or a reason that is not one of
    ours, is returned as it is."""
    if lang == DEFAULT_LANGUAGE:
        return reason
    step = _STEP.fullmatch(reason.strip())
    if step is not None and lang in _STEP_FORM:  # a chain's step: its label, then its reason
        inner = localized_reason(step.group("inner"), lang)
        label = ", ".join(p for p in (step.group("id"), step.group("skill")) if p)
        return _STEP_FORM[lang].format(n=step.group("n"), label=label, reason=inner)
    for pattern, forms in REASON_FORMS:
        m = pattern.fullmatch(reason.strip())
        if m is not None and lang in forms:
            values = {k: v for k, v in m.groupdict().items() if v is not None}
            if values.get("known") == "none":
                values["known"] = text("nothing", lang)
            if "why" in values:
                values["why"] = _refusal(values["why"], lang)
            return forms[lang].format(**values)
    return reason


def language(configured: str | None = None, locale: object = None) -> str:
    """``zh`` or ``en``: the context ``locale`` when it names one, else the configured one."""
    for value in (locale, configured):
        if isinstance(value, str) and value.strip():
            code = value.strip().lower().replace("_", "-").split("-")[0]
            if code in LANGUAGES:
                return code
    return DEFAULT_LANGUAGE


def language_of(settings: Settings, ctx: Mapping[str, Any] | None = None) -> str:
    """The language for one call: ``ctx["locale"]`` over ``settings.language``."""
    locale = ctx.get("locale") if isinstance(ctx, Mapping) else None
    return language(getattr(settings, "language", None), locale)


def text(key: str, lang: str = DEFAULT_LANGUAGE, **values: Any) -> str:
    """The text ``key`` in ``lang`` (English when that language lacks it), filled in."""
    forms = TEXTS[key]
    template = forms.get(lang) or forms[DEFAULT_LANGUAGE]
    return template.format(**values) if values else template


# --------------------------------------------------------------------------- failure texts

# "please contact an administrator" and its Chinese forms add nothing for the person asking.
ADMIN_HINT = re.compile(
    r"[,;.，；。]?\s*(?:"
    r"(?:please\s+)?contact\s+(?:an?\s+|your\s+)?(?:system\s+)?(?:admin|administrator)\w*"
    r"|请?(?:联系|联络)(?:系统)?(?:管理员|客服|技术支持)(?:处理)?"
    r"|内部错误"
    r")",
    re.I,
)
TRACE_HINTS = ("Traceback (most recent call last)", 'File "', "\n  at ")
_ERROR_LINE = re.compile(r"^(?:[\w.\-/ ]+:\s*)?error:\s*\S", re.I)
_NOISE_LINE = re.compile(r"^\s*(?:usage:|at\s|File\s\"|Traceback\b|\^+$|~+$)")


def strip_admin_hints(reason: str) -> str:
    return ADMIN_HINT.sub("", reason).strip(" .,;:，；。：")


def meaningful_line(text: str) -> str:
    """The line of a failure output that says what went wrong: argparse's last
    ``error:`` line, else the last line that is not usage or a traceback frame."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return ""
    errors = [ln for ln in lines if _ERROR_LINE.match(ln)]
    if errors:
        return errors[-1]
    useful = [ln for ln in lines if not _NOISE_LINE.match(ln)]
    return (useful or lines)[-1]


# --------------------------------------------------------------------------- failure reasons

REASON_MAX = 600  # the block of a failure output kept as its reason

# Python ``warnings`` output (``file.py:12: FutureWarning: …`` and its source echo), npm and
# Node warnings: noise beside a failure, never its reason.
_PY_WARNING = re.compile(r"^\S.*:\d+: (?:\w+\.)*\w*Warning: ")
_WARNING_LINE = re.compile(
    r"^\s*(?:(?:\w+\.)*\w*Warning: |npm (?:WARN|warn)\b|warning: |WARNING: |\(node:\d+\) |"
    r"\(Use `node --trace-|warnings\.warn\()"
)
_TRACE_START = "Traceback (most recent call last)"
_FRAME = re.compile(r"^\s+(?:File \"|at\s)|^\s{4}\S|^\s+\^+\s*$|^\s+~+\s*$")
_USAGE = re.compile(r"^\s*usage:", re.I)
_FAILED_LINE = re.compile(
    r"\b(?:error|errors|failed|failure|fatal|invalid|not found|cannot|can't|could not|"
    r"denied|refused|missing|exception)\b|^\s*(?:✗|❌|✘|\[error\]|E:)",
    re.I,
)


def without_warnings(text: str) -> str:
    """``text`` without warning lines (Python ``warnings`` output and the source line it
    echoes, ``DeprecationWarning``…, npm ``WARN``, Node's ``(node:N)`` warnings)."""
    out: list[str] = []
    echo = False
    for line in text.splitlines():
        if echo and line.startswith((" ", "\t")):
            echo = False
            continue  # the source line a Python warning echoes
        echo = False
        if _PY_WARNING.match(line):
            echo = True
            continue
        if _WARNING_LINE.match(line):
            continue
        out.append(line)
    return "\n".join(out).strip("\n")


def _exception_lines(text: str) -> str:
    """A Python traceback → what the script said before it, and the exception's lines."""
    before, _, trace = text.rpartition(_TRACE_START)
    lines = trace.splitlines()[1:]
    i = 0
    while i < len(lines) and (_FRAME.match(lines[i]) or not lines[i].strip()):
        i += 1
    tail = "\n".join(ln for ln in lines[i:] if not _FRAME.match(ln)).strip()
    head = before.strip().split("\n\n")[-1].strip() if before.strip() else ""
    return "\n".join(p for p in (head, tail) if p)


def reason_block(text: str, limit: int = REASON_MAX) -> str:
    """The last meaningful block of a failure output (several lines, at most ``limit``
    characters): warnings removed, a traceback reduced to its exception, argparse's usage
    lines dropped; blocks are added from the end while they fit."""
    text = without_warnings(text)
    if _TRACE_START in text:
        text = _exception_lines(text)
    lines = [ln.rstrip() for ln in text.splitlines()]
    if any(_ERROR_LINE.match(ln.strip()) for ln in lines) and any(_USAGE.match(ln) for ln in lines):
        # argparse: the usage block is not the reason; its ``error:`` line is
        last = max(i for i, ln in enumerate(lines) if _ERROR_LINE.match(ln.strip()))
        lines = [ln.strip() for ln in lines[last:] if ln.strip()]
    blocks: list[list[str]] = [[]]
    for ln in lines:
        if ln.strip():
            blocks[-1].append(ln)
        elif blocks[-1]:
            blocks.append([])
    blocks = [b for b in blocks if b]
    if blocks and len(blocks[-1]) > 1:
        # the block from its first line that says something failed ("Scanning …" before
        # "Error: …" is progress, not the reason)
        first = next((i for i, ln in enumerate(blocks[-1]) if _FAILED_LINE.search(ln)), 0)
        blocks[-1] = blocks[-1][first:]
    picked: list[str] = []
    size = 0
    for block in reversed(blocks):
        chunk = "\n".join(block)
        if size + len(chunk) + 2 <= limit:
            picked.insert(0, chunk)
            size += len(chunk) + 2
            if sum(c.count("\n") + 1 for c in picked) >= 2:
                break  # a block of several lines says it; a one-line summary takes the one above
            continue
        if not picked:  # one block larger than the limit: its last lines
            kept: list[str] = []
            for ln in reversed(block):
                if size + len(ln) + 1 > limit:
                    break
                kept.insert(0, ln)
                size += len(ln) + 1
            picked = ["\n".join(kept)] if kept else [block[-1][-limit:]]
        break
    return "\n\n".join(picked).strip()
