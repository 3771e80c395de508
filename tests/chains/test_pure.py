"""Pure chain logic without I/O: cron due-times (incl. DST), step references, the guard."""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfo

import pytest

from chains.cron import CronError, fires_between, latest_fire, next_fire, parse
from chains.guard import is_empty_output
from chains.refs import StepRefs, UnresolvedReference, resolve_input, static_errors

NY = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")
SH = ZoneInfo("Asia/Shanghai")


def ts(tz: tzinfo, *args: int, fold: int = 0) -> float:
    return datetime(*args, tzinfo=tz, fold=fold).timestamp()  # type: ignore[misc]


def local(t: float, tz: tzinfo) -> str:
    return datetime.fromtimestamp(t, tz).strftime("%Y-%m-%d %H:%M %Z")


# --- cron: parsing ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("0 25 * * *", "cron field 2 (hour) value 25 is out of range 0-23"),
        ("60 * * * *", "cron field 1 (minute) value 60 is out of range 0-59"),
        ("* * 0 * *", "cron field 3 (day of month) value 0 is out of range 1-31"),
        ("* * * 13 *", "cron field 4 (month) value 13 is out of range 1-12"),
        ("* * * * 8", "cron field 5 (day of week) value 8 is out of range 0-7"),
        ("* * *", "has 3 fields; expected 5"),
        ("* * * * * *", "has 6 fields"),
        ("*/0 * * * *", "step '0' must be a positive number"),
        ("5-1 * * * *", "range '5-1' runs backwards"),
        ("0 0 * foo *", "cron field 4 (month) value 'foo' is not a number"),
        ("0 0 * * mon,", "empty list item"),
        ("0 0 30 2 *", "can never fire"),
    ],
)
def test_bad_expressions_name_the_problem(expr: str, message: str) -> None:
    with pytest.raises(CronError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(expr)


def test_field_syntax() -> None:
    c = parse("*/15 9-17/4 1,15 jan-mar,dec mon-fri")
    assert c.minutes == {0, 15, 30, 45}
    assert c.hours == {9, 13, 17}
    assert c.days == {1, 15}
    assert c.months == {1, 2, 3, 12}
    assert c.weekdays == {1, 2, 3, 4, 5}
    assert parse("0 0 * * 7").weekdays == {0}
    assert parse("0 0 * * SUN").weekdays == {0}
    assert parse("5/20 * * * *").minutes == {5, 25, 45}


def test_next_fire_basic_and_strictly_after() -> None:
    t0 = ts(UTC, 2026, 1, 5, 8, 59, 30)
    assert local(next_fire("0 9 * * 1-5", UTC, t0), UTC) == "2026-01-05 09:00 UTC"
    at_nine = ts(UTC, 2026, 1, 5, 9, 0)
    # exactly at a fire time → the next one
    assert local(next_fire("0 9 * * 1-5", UTC, at_nine), UTC) == "2026-01-06 09:00 UTC"
    # Friday 9:00 → Monday 9:00
    fri = ts(UTC, 2026, 1, 9, 9, 0)
    assert local(next_fire("0 9 * * 1-5", UTC, fri), UTC) == "2026-01-12 09:00 UTC"


def test_timezone_is_applied() -> None:
    after = ts(UTC, 2026, 6, 1, 0, 0)
    fire = next_fire("0 9 * * *", SH, after)
    assert local(fire, SH) == "2026-06-01 09:00 CST"
    assert datetime.fromtimestamp(fire, UTC).hour == 1


def test_vixie_day_of_month_or_day_of_week() -> None:
    # both restricted → OR: the 13th of each month and every Friday
    start = ts(UTC, 2026, 2, 1, 0, 0)
    days = [
        datetime.fromtimestamp(t, UTC).day
        for t in fires_between("0 0 13 * fri", UTC, start, start + 28 * 86400)
    ]
    assert days == [6, 13, 20, 27]
    # dom star-ish → AND with dow
    days = [
        datetime.fromtimestamp(t, UTC).day
        for t in fires_between("0 0 */1 * fri", UTC, start, start + 28 * 86400)
    ]
    assert days == [6, 13, 20, 27]
    days = [
        datetime.fromtimestamp(t, UTC).day
        for t in fires_between("0 0 13 * *", UTC, start, start + 28 * 86400)
    ]
    assert days == [13]


def test_leap_day_and_month_ends() -> None:
    after = ts(UTC, 2026, 3, 1, 0, 0)
    assert local(next_fire("0 0 29 2 *", UTC, after), UTC) == "2028-02-29 00:00 UTC"
    after = ts(UTC, 2026, 4, 1, 0, 0)
    assert local(next_fire("0 0 31 * *", UTC, after), UTC) == "2026-05-31 00:00 UTC"


# --- cron: daylight saving ----------------------------------------------------------------


def test_spring_forward_nonexistent_time_fires_once_after_the_gap() -> None:
    # 2026-03-08 02:00 → 03:00 in New York; 02:30 does not exist that day.
    start = ts(NY, 2026, 3, 7, 12, 0)
    fires = fires_between("30 2 * * *", NY, start, start + 2.5 * 86400)
    assert [local(t, NY) for t in fires] == [
        "2026-03-08 03:00 EDT",
        "2026-03-09 02:30 EDT",
    ]


def test_spring_forward_gap_collapses_to_one_fire() -> None:
    start = ts(NY, 2026, 3, 8, 1, 0)
    fires = fires_between("*/15 * * * *", NY, start, ts(NY, 2026, 3, 8, 3, 30))
    names = [local(t, NY) for t in fires]
    assert names == [
        "2026-03-08 01:15 EST",
        "2026-03-08 01:30 EST",
        "2026-03-08 01:45 EST",
        "2026-03-08 03:00 EDT",
        "2026-03-08 03:15 EDT",
        "2026-03-08 03:30 EDT",
    ]
    assert len(set(fires)) == len(fires)


def test_fall_back_ambiguous_time_fires_once_at_first_occurrence() -> None:
    # 2026-10-25 03:00 CEST → 02:00 CET in Berlin; 02:30 happens twice.
    start = ts(BERLIN, 2026, 10, 24, 12, 0)
    fires = fires_between("30 2 * * *", BERLIN, start, start + 2 * 86400)
    assert [local(t, BERLIN) for t in fires] == ["2026-10-25 02:30 CEST", "2026-10-26 02:30 CET"]
    first = ts(BERLIN, 2026, 10, 25, 2, 30, fold=0)
    assert fires[0] == first
    # asking from inside the second pass of the hour does not fire it again
    second = ts(BERLIN, 2026, 10, 25, 2, 10, fold=1)
    assert local(next_fire("30 2 * * *", BERLIN, second), BERLIN) == "2026-10-26 02:30 CET"


def test_fall_back_hourly_counts() -> None:
    start = ts(NY, 2026, 10, 31, 23, 59)
    fires = fires_between("0 * * * *", NY, start, ts(NY, 2026, 11, 1, 3, 30))
    assert [local(t, NY) for t in fires] == [
        "2026-11-01 00:00 EDT",
        "2026-11-01 01:00 EDT",
        "2026-11-01 02:00 EST",
        "2026-11-01 03:00 EST",
    ]
    assert fires == sorted(set(fires))


def test_latest_fire_coalesces() -> None:
    since = ts(UTC, 2026, 1, 1, 0, 0)
    now = since + 3 * 86400 + 125
    assert latest_fire("* * * * *", UTC, since, now) == ts(UTC, 2026, 1, 4, 0, 2)
    assert latest_fire("0 9 1 1 *", UTC, since - 1, now) == ts(UTC, 2026, 1, 1, 9, 0)
    assert latest_fire("0 9 * * *", UTC, since, now) == ts(UTC, 2026, 1, 3, 9, 0)
    assert latest_fire("0 9 1 6 *", UTC, since, now) is None
    # a yearly schedule missed long ago is still found
    assert latest_fire("0 0 1 1 *", UTC, since - 1, since + 200 * 86400) == since


# --- references ---------------------------------------------------------------------------


def steps(*defs: tuple[str, dict, dict] | tuple[str, dict, dict, bool]) -> list[StepRefs]:
    return [StepRefs(d[0], d[1], d[2], *(d[3:])) for d in defs]


FETCH_OUT = {
    "ok": True,
    "data": {"rows": [{"id": 7, "sku": "A"}, {"id": 9, "sku": "B"}], "day": "2026-01-01"},
    "n": 2,
}


def test_whole_string_reference_keeps_json_type() -> None:
    s = steps(
        ("fetch", {}, {}),
        (
            "b",
            {"rows": "$steps.fetch.data.rows", "n": "$prev.n", "all": "$prev", "ok": "$steps.0.ok"},
            {},
        ),
    )
    got = resolve_input(1, s, [FETCH_OUT])
    assert got == {"rows": FETCH_OUT["data"]["rows"], "n": 2, "all": FETCH_OUT, "ok": True}


def test_interpolation_inside_longer_strings() -> None:
    s = steps(
        ("fetch", {}, {}),
        (
            "b",
            {
                "msg": "Got $prev.n rows for $steps.fetch.data.day.",
                "first": "row $prev.data.rows[0]",
            },
            {},
        ),
    )
    got = resolve_input(1, s, [FETCH_OUT])
    assert got["msg"] == "Got 2 rows for 2026-01-01."
    assert got["first"] == 'row {"id": 7, "sku": "A"}'


def test_paths_through_lists_and_nested_values() -> None:
    s = steps(
        ("fetch", {}, {}),
        ("x", {}, {}),
        (
            "c",
            {
                "ids": ["$steps.fetch.data.rows.1.id", {"sku": "$steps.fetch.data.rows[0].sku"}],
                "prev": "$prev.v",
            },
            {},
        ),
    )
    got = resolve_input(2, s, [FETCH_OUT, {"v": None}])
    assert got == {"ids": [9, {"sku": "A"}], "prev": None}


def test_reference_by_index() -> None:
    s = steps(("a", {}, {}), ("b", {}, {}), ("c", {"x": "$steps.0.n", "y": "$steps.1"}, {}))
    assert resolve_input(2, s, [FETCH_OUT, [1, 2]]) == {"x": 2, "y": [1, 2]}


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("$steps.fetch.data.missing", "$steps.fetch.data.missing"),
        ("$steps.fetch.data.rows.5.id", "$steps.fetch.data.rows.5.id"),
        ("$steps.fetch.n.deeper", "$steps.fetch.n.deeper"),
        ("total: $prev.nothing here", "$prev.nothing"),
        ("hello {name}", "{name}"),
        ("see $steps.", "$steps."),
    ],
)
def test_missing_path_is_unresolved_and_named(value: str, named: str) -> None:
    s = steps(("fetch", {}, {}), ("b", {"v": value}, {}))
    with pytest.raises(UnresolvedReference) as err:
        resolve_input(1, s, [FETCH_OUT])
    assert err.value.reference == named
    assert named in str(err.value)


def test_template_filled_from_previous_output_then_own_input() -> None:
    s = steps(
        ("fetch", {}, {}),
        (
            "r",
            {"day": "today"},
            {"title": "Sales for {day}: {n} rows ({data.rows[1].sku})", "count": "{n}"},
        ),
    )
    got = resolve_input(1, s, [FETCH_OUT])
    assert got["title"] == "Sales for today: 2 rows (B)"
    assert got["count"] == 2  # whole placeholder keeps the type
    assert got["day"] == "today"
    with pytest.raises(UnresolvedReference, match=r"\{nope\}"):
        resolve_input(1, steps(("f", {}, {}), ("r", {}, {"t": "x {nope}"})), [FETCH_OUT])


def test_template_prefers_previous_output() -> None:
    s = steps(("fetch", {}, {}), ("r", {"n": 99}, {"title": "{n} rows"}))
    got = resolve_input(1, s, [FETCH_OUT])
    assert got == {"title": "2 rows", "n": 99}


def test_precedence_explicit_over_template_over_passthrough() -> None:
    s = steps(("fetch", {}, {}), ("r", {"n": "explicit"}, {"n": "tmpl", "day": "T {n}"}, True))
    got = resolve_input(1, s, [FETCH_OUT])
    assert got["n"] == "explicit"
    assert got["day"] == "T 2"
    assert got["data"] == FETCH_OUT["data"]  # from passthrough
    # a non-dict previous output passes through as "result"
    s2 = steps(("a", {}, {}), ("b", {}, {}, True))
    assert resolve_input(1, s2, [[1, 2]]) == {"result": [1, 2]}


def test_values_from_outputs_are_not_rescanned() -> None:
    out = {"text": "literal {braces} and $steps.x in data"}
    s = steps(("a", {}, {}), ("b", {"t": "$prev.text", "u": "say: $prev.text"}, {}))
    got = resolve_input(1, s, [out])
    assert got["t"] == out["text"]
    assert got["u"] == "say: " + out["text"]


def test_json_like_literals_are_not_placeholders() -> None:
    s = steps(("a", {"q": '{"a": 1}', "price": "$5", "prev_word": "$previous"}, {}))
    assert resolve_input(0, s, []) == {"q": '{"a": 1}', "price": "$5", "prev_word": "$previous"}


def test_static_errors_name_unknown_and_later_steps() -> None:
    s = steps(
        ("a", {"x": "$steps.b.y", "p": "$prev.q"}, {}, True),
        ("b", {"q": "$steps.zzz.x", "self": "$steps.b", "i": "$steps.9"}, {"t": "{x} $steps.c.k"}),
        ("c", {"ok": "$steps.a.x and $steps.1.y"}, {}),
    )
    errs = "\n".join(static_errors(s))
    assert "step 0 (a): $steps.b.y refers to later step 'b'" in errs
    assert "step 0 (a): $prev.q" in errs
    assert "step 0 (a): passthrough needs a previous step" in errs
    assert "$steps.zzz.x refers to unknown step 'zzz'" in errs
    assert "$steps.b refers to itself" in errs
    assert "$steps.9 refers to unknown step '9'" in errs
    assert "$steps.c.k refers to later step 'c'" in errs
    assert "step 2" not in errs
    assert static_errors(steps(("a", {}, {}), ("b", {"v": "$steps.a.x"}, {}))) == []


# --- empty-result guard (SPEC §11) --------------------------------------------------------


@pytest.mark.parametrize(
    "out",
    [
        None,
        "",
        [],
        {},
        {"ok": True, "data": {"rows": []}},
        {"ok": True},
        {"success": True, "warning": "nothing", "completed": True, "rows": []},
        {
            "ok": True,
            "error_type": None,
            "action_note": "n/a",
            "display_only": True,
            "offloaded": False,
            "_hint": "x",
            "items": None,
        },
        {"data": {"rows": [], "meta": {}}, "text": ""},
    ],
)
def test_empty_outputs(out: object) -> None:
    assert is_empty_output(out) is True


@pytest.mark.parametrize(
    "out",
    [
        {"ok": True, "message": "no rows today"},
        {"ok": True, "data": {"rows": [{"id": 1}]}},
        {"count": 0},
        {"flag": False},
        0,
        False,
        "x",
        [None],
        {"data": {"rows": [], "total": 0}},
    ],
)
def test_non_empty_outputs(out: object) -> None:
    assert is_empty_output(out) is False
