"""The dashboard's own messages in Chinese: every text the script builds goes through
``t()`` with a Chinese form, and no confirmation or notice is an English template."""

from __future__ import annotations

import re
from pathlib import Path

STATIC = Path(__file__).resolve().parents[2] / "dashboard" / "static"
APP = (STATIC / "app.js").read_text(encoding="utf-8")
I18N = (STATIC / "i18n.js").read_text(encoding="utf-8")
ZH_KEYS = set(re.findall(r'"((?:[^"\\]|\\.)*)"\s*:', I18N))
#: ``t("…")`` with a literal key
T_CALL = re.compile(r'\bt\(\s*"((?:[^"\\]|\\.)*)"')
#: the start of what a person is told or asked: a notice, a confirmation, a title
TOLD = re.compile(r"(?:flash|window\.confirm|showLogin)\(\s*`|\.textContent\s*=\s*`")
WORD = re.compile(r"[A-Za-z]{2,}")


def test_every_script_message_has_a_chinese_form() -> None:
    keys = set(T_CALL.findall(APP))
    assert keys, "the script says nothing through t()?"
    assert sorted(keys - ZH_KEYS) == []


def test_no_notice_or_question_is_an_english_template() -> None:
    english = []
    for m in TOLD.finditer(APP):
        template = APP[m.end() : APP.index("`", m.end())]
        if WORD.findall(re.sub(r"\$\{[^}]*\}", "", template).replace("#/jobs/", "")):
            english.append(template)
    assert english == []


def test_the_chinese_forms_of_built_messages_keep_their_placeholders() -> None:
    pairs = dict(re.findall(r'"((?:[^"\\]|\\.)*)"\s*:\s*\n?\s*"((?:[^"\\]|\\.)*)"', I18N))
    for key in set(T_CALL.findall(APP)):
        if "{" in key:
            assert set(re.findall(r"\{\w+\}", key)) == set(re.findall(r"\{\w+\}", pairs[key])), key
