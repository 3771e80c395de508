"""Every Chinese text a person can receive is Chinese: no English word of ours in a zh
template, and our English failure framings are said in Chinese around the skill's words."""

from __future__ import annotations

import re

import pytest

from delivery.channels.limits import LINK_NOTES
from delivery.render import failure_text
from jobs.envelope import failure
from jobs.execution.skill_output import exit_failure
from jobs.texts import _STEP_FORM, REASON_FORMS, REFUSAL_FORMS, TEXTS, localized_reason, text

#: an ASCII word outside a ``{placeholder}``
WORD = re.compile(r"[A-Za-z]{2,}")
PLACEHOLDER = re.compile(r"\{\w+\}")


def zh_templates() -> list[tuple[str, str]]:
    out = [(key, forms["zh"]) for key, forms in TEXTS.items()]
    out += [(f"link_note[{i}]", note) for i, note in enumerate(LINK_NOTES["zh"])]
    out += [(p.pattern, forms["zh"]) for p, forms in REASON_FORMS]
    out += [(p.pattern, forms["zh"]) for p, forms in REFUSAL_FORMS]
    out += [("step", _STEP_FORM["zh"])]
    return out


def test_every_text_has_a_chinese_form() -> None:
    assert [key for key, forms in TEXTS.items() if not forms.get("zh")] == []
    assert all("zh" in forms for _, forms in REASON_FORMS)


@pytest.mark.parametrize(("key", "template"), zh_templates())
def test_no_english_word_in_a_chinese_template(key: str, template: str) -> None:
    assert WORD.findall(PLACEHOLDER.sub("", template)) == [], key


def test_placeholders_are_the_same_in_both_languages() -> None:
    for key, forms in TEXTS.items():
        assert set(PLACEHOLDER.findall(forms["zh"])) == set(PLACEHOLDER.findall(forms["en"])), key
    assert set(PLACEHOLDER.findall(LINK_NOTES["zh"][0])) == {"{name}", "{size}"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            failure("skill ran over 1.5 s and was stopped", skill="slow", timed_out=True),
            "抱歉，slow 未能完成：运行超过 1.5 秒，已被停止。",
        ),
        (
            failure("skill 'flaky_job' raised ValueError: upstream said no", skill="flaky_job"),
            "抱歉，flaky_job 未能完成：运行时出错：upstream said no。",
        ),
        (
            failure("skill 'flaky_job' raised KeyError", skill="flaky_job"),
            "抱歉，flaky_job 未能完成：运行时出错（KeyError）。",
        ),
        (
            exit_failure("crawl", 3, b"", b""),
            "抱歉，crawl 未能完成：运行失败（退出码 3），没有输出。",
        ),
        (
            failure("skill 'crawl' was killed by signal 9 (no output)", skill="crawl"),
            "抱歉，crawl 未能完成：运行被信号 9 终止，没有输出。",
        ),
        (
            failure("skill 'x' reported a failure (ok: false) without saying why", skill="x"),
            "抱歉，x 未能完成：技能报告了失败，但没有说明原因。",
        ),
        (
            failure("skill 'x' needs program(s) not installed on this host: ffmpeg", skill="x"),
            "抱歉，x 未能完成：运行所需的程序未安装：ffmpeg。",
        ),
        (
            failure(
                "input field 'path' was refused: '/srv/a.txt' is outside this job's workspace "
                "(files must be in the workspace or be an attachment of this conversation)",
                skill="x",
            ),
            "抱歉，x 未能完成：输入字段 path 被拒绝：'/srv/a.txt' 不在本任务的工作区内"
            "（文件必须在工作区中，或是本次对话的附件）。",
        ),
        (
            failure(
                "input field 'doc' names attachment 'att-9', which this turn does not have "
                "(attachments: none)",
                skill="x",
            ),
            "抱歉，x 未能完成：输入字段 doc 引用的附件 'att-9' 不在本次对话中（现有附件：无）。",
        ),
        (
            failure("HTTP skill 'quotes' (GET https://q.example/v1): answered HTTP 503: busy"),
            "抱歉，任务 未能完成：接口返回错误状态 503：busy。",
        ),
        (
            failure(
                "skill 'pdf' needs the module 'fitz', which is not installed: declare it",
                skill="pdf",
            ),
            "抱歉，pdf 未能完成：缺少模块 fitz，它尚未安装。",
        ),
    ],
)
def test_our_failure_framings_are_said_in_chinese(env: dict, expected: str) -> None:
    assert failure_text(env.get("skill", ""), env, "zh") == expected


def test_the_skills_own_words_stay_and_english_texts_are_unchanged() -> None:
    env = exit_failure("dupe_finder", 1, b"", b"Error: folder not found: nope\n")
    assert failure_text("dupe_finder", env, "zh") == (
        "抱歉，dupe_finder 未能完成：Error: folder not found: nope。"
    )
    timed = failure("skill ran over 2 s and was stopped", skill="slow")
    assert failure_text("slow", timed, "en") == (
        "Sorry, slow could not finish: skill ran over 2 s and was stopped."
    )
    assert localized_reason("the upstream API is down", "zh") == "the upstream API is down"


def test_a_chain_steps_failure_is_framed_in_chinese() -> None:
    from chains.deliver import outcome_text

    got = outcome_text(
        "日报",
        "failed",
        None,
        "step 1 (fetch, web_fetch): skill 'web_fetch' raised OSError: 503",
        "zh",
    )
    assert got == "日报 未完成：第 1 步（fetch, web_fetch）：运行时出错：503"
    empty = outcome_text(
        "日报", "stopped_empty", None, "step 2 (pick, filter) returned nothing; chain stopped", "zh"
    )
    assert (
        empty
        == "日报：本次没有可报告的内容 — 第 2 步（pick, filter）没有返回任何内容，流程已停止。"
    )
    assert text("chain_failed", "en", name="Daily", reason="a step failed") == (
        "Daily did not complete: a step failed"
    )
