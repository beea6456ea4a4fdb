"""`OPLOOP_MEMTRACE`: the tracemalloc switch that names what makes an actor grow."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tracemalloc

import pytest

from actors.config import ConfigError
from actors.memtrace import growth_report, trace_memory
from actors.settings import load_settings

kept: list[bytes] = []


def _allocate() -> None:
    kept.extend(bytes(1000) for _ in range(500))  # this line is the growth


def test_the_report_names_the_line_that_grew():
    tracemalloc.start(2)
    try:
        before = tracemalloc.take_snapshot()
        _allocate()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
        kept.clear()
    lines = growth_report(before, after)
    assert lines and "test_memtrace.py:" in lines[0], lines
    assert lines[0].startswith("+")


def test_an_actor_with_the_switch_logs_its_growth(caplog):
    async def main() -> None:
        task = asyncio.create_task(trace_memory("tester", 0.01))
        try:
            while not any("tester:" in r.getMessage() for r in caplog.records):
                _allocate()
                await asyncio.sleep(0.005)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    caplog.set_level(logging.WARNING, logger="oploop.memtrace")
    try:
        asyncio.run(main())
    finally:
        tracemalloc.stop()
        kept.clear()
    report = next(r.getMessage() for r in caplog.records if "tester:" in r.getMessage())
    assert "MiB traced" in report and "grown most" in report


def test_the_switch_is_a_setting(tmp_path):
    base = {"OPLOOP_HOME": str(tmp_path)}
    assert load_settings(base).memtrace_s == 0  # off
    assert load_settings({**base, "OPLOOP_MEMTRACE": "30"}).memtrace_s == 30
    with pytest.raises(ConfigError, match="OPLOOP_MEMTRACE"):
        load_settings({**base, "OPLOOP_MEMTRACE": "often"})
