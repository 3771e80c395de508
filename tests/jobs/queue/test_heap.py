"""The worker's collector policy: the heap frozen and the young generation widened while a
worker runs, everything given back when the last worker of the process stops."""

from __future__ import annotations

import gc

from jobs.queue import heap


def test_settle_and_restore_nest() -> None:
    before = gc.get_threshold()
    heap.settle()
    try:
        assert gc.get_threshold() == heap.THRESHOLDS
        assert gc.get_freeze_count() > 0
        heap.settle()  # a second worker in the same process
        heap.restore()
        assert gc.get_threshold() == heap.THRESHOLDS  # the first one still runs
        assert gc.get_freeze_count() > 0
    finally:
        heap.restore()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    heap.restore()  # more stops than starts: nothing to undo
    assert gc.get_threshold() == before


def test_cyclic_garbage_is_still_collected() -> None:
    class Node:
        other: object = None

    heap.settle()
    try:
        a, b = Node(), Node()
        a.other, b.other = b, a
        del a, b
        assert gc.collect() > 0
    finally:
        heap.restore()
