"""When each ``sleep100_traced`` run started and ended (``time.perf_counter``), for
:mod:`bench.sleepers`: the skill appends here; a module of its own so that the skill and the
benchmark running as ``__main__`` share one list."""

from __future__ import annotations

SPANS: list[tuple[float, float]] = []
