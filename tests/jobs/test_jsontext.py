"""``jobs.jsontext``: the hot paths' JSON writer parses back to what ``json.dumps`` wrote."""

from __future__ import annotations

import json
from enum import StrEnum

import pytest

from jobs import jsontext


class Color(StrEnum):
    RED = "red"


VALUES = [
    {},
    [],
    {"skill_configs": {"noop": {}}, "attachments": [], "chat_mode": True, "abort_signal": None},
    {"text": '你好, мир, emoji 🎉, quote " backslash \\ slash /', "n": -3, "x": 0.1},
    {"nested": [[1, 2.5, "3"], {"deep": {"deeper": [None, False]}}]},
    {"big": 2**70, "neg": -(2**70)},  # past 64 bits: the standard library writes it
    {"nul": "a\x00b", "ctl": "\t\n\r\x1f"},
    {"status": Color.RED},
    [1e300, -1e-300, 1.5, 10**15],
]


@pytest.mark.parametrize("value", VALUES)
def test_parses_back_to_what_json_dumps_wrote(value: object) -> None:
    text = jsontext.dumps(value)
    assert json.loads(text) == json.loads(json.dumps(value, ensure_ascii=False))
    assert jsontext.dumpb(value) == text.encode()


def test_keys_that_are_not_strings_become_strings_as_json_makes_them() -> None:
    value = {1: "a", None: "b", False: "c", 2.5: "d"}
    assert json.loads(jsontext.dumps(value)) == json.loads(json.dumps(value))


def test_compact_and_non_ascii_as_is() -> None:
    assert jsontext.dumps({"t": "你好", "a": [1, 2]}) == '{"t":"你好","a":[1,2]}'


def test_non_finite_numbers_are_null() -> None:
    assert json.loads(jsontext.dumps([float("nan"), float("inf")])) == [None, None]


def test_what_json_refuses_is_still_refused() -> None:
    with pytest.raises(TypeError):
        jsontext.dumps({"x": object()})
    with pytest.raises(TypeError):
        jsontext.dumps({("a", "b"): 1})  # a tuple key: json.dumps refuses it too
