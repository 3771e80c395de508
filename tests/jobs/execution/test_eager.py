"""Tasks started eagerly (``jobs.eager``) and the slot freed at a skill's end
(``inprocess.SKILL_ENDED``)."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from jobs import eager
from jobs.execution.inprocess import SKILL_ENDED, Raised, WallExpired, with_wall

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_eager_var", default="caller")


async def test_the_first_step_runs_before_start_returns() -> None:
    steps: list[str] = []

    async def work() -> str:
        steps.append("first")
        await asyncio.sleep(0)
        steps.append("second")
        return "done"

    task = eager.start(work())
    assert steps == ["first"] and not task.done()
    assert await task == "done"
    assert steps == ["first", "second"]


async def test_the_first_step_is_the_task_itself_in_its_own_context() -> None:
    seen: dict[str, object] = {}

    async def work() -> None:
        seen["task"] = asyncio.current_task()
        VAR.set("task")
        async with asyncio.timeout(5):  # (it finds its task from the first step)
            await asyncio.sleep(0.01)
        seen["after"] = asyncio.current_task()

    caller = asyncio.current_task()
    task = eager.start(work())
    assert seen["task"] is task
    assert asyncio.current_task() is caller  # given back to the caller
    assert VAR.get() == "caller"  # the task's own context, not the caller's
    await task
    assert seen["after"] is task


async def test_a_coroutine_that_ends_in_its_first_step() -> None:
    async def quick() -> int:
        return 7

    async def broken() -> None:
        raise ValueError("bad input")

    assert await eager.start(quick()) == 7
    task = eager.start(broken())
    with pytest.raises(ValueError, match="bad input"):
        await task


async def test_a_cancel_before_the_tasks_own_step_reaches_the_coroutine() -> None:
    steps: list[str] = []

    async def work() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            steps.append("cancelled at its wait")
            raise

    task = eager.start(work())
    task.cancel()  # (the task has not stepped on its own yet)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps == ["cancelled at its wait"] and task.cancelled()


async def test_a_cancel_after_the_coroutine_ended_keeps_its_result() -> None:
    async def quick() -> str:
        return "kept"

    task = eager.start(quick())
    task.cancel()
    assert await task == "kept"


async def test_a_skills_end_frees_its_slot_once_and_nested_runs_do_not() -> None:
    ended: list[str] = []

    async def nested() -> str:
        await asyncio.sleep(0)
        return "inner"

    async def skill() -> str:
        inner = await with_wall(nested(), 5)  # a call_skill-like nested run
        ended.append(f"body done, slot calls so far {len(calls)}")
        await asyncio.sleep(0)
        return inner

    calls: list[str] = []
    SKILL_ENDED.set(lambda: calls.append("ended"))
    assert await with_wall(skill(), 5) == "inner"
    assert ended == ["body done, slot calls so far 0"] and calls == ["ended"]


async def test_a_skill_ends_its_slot_on_failure_and_on_expiry() -> None:
    calls: list[str] = []
    SKILL_ENDED.set(lambda: calls.append("ended"))

    async def fails() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("boom")

    async def hangs() -> None:
        await asyncio.sleep(10)

    with pytest.raises(Raised) as raised:
        await with_wall(fails(), 5)
    assert isinstance(raised.value.__cause__, RuntimeError)
    with pytest.raises(WallExpired):
        await with_wall(hangs(), 0.05)
    assert calls == ["ended", "ended"]


async def test_a_skill_that_exits_or_cancels_itself_is_a_failure_not_a_stop() -> None:
    async def exits() -> None:
        raise SystemExit(3)  # in its first step: still no exit of this process

    async def cancels_itself() -> None:
        await asyncio.sleep(0)
        raise asyncio.CancelledError

    with pytest.raises(Raised) as raised:
        await with_wall(exits(), 5)
    assert isinstance(raised.value.__cause__, SystemExit)
    with pytest.raises(Raised) as raised:
        await with_wall(cancels_itself(), 5)
    assert "cancelled itself" in str(raised.value.__cause__)


async def test_a_skill_that_ends_in_its_first_step_leaves_the_slot_to_its_caller() -> None:
    """Nothing to gain there: the caller gives the slot back in the same turn of the loop."""
    calls: list[str] = []
    SKILL_ENDED.set(lambda: calls.append("ended"))

    async def quick() -> str:
        return "at once"

    assert await with_wall(quick(), 5) == "at once"
    assert calls == []
