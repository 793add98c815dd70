# SPDX-License-Identifier: BSD-3-Clause
"""The plugin's route_stats() log (FA2PATCH_VLLM_ROUTE_STATS_SECONDS): one line per period with what
the extension returns, from a daemon thread; no thread when unset or 0; a bad value refused with the
variable, what it must be and what it was; a failing read said once, then no more lines."""

import logging
import sys
import threading

import pytest

from helpers import REPO

sys.path.insert(0, str(REPO / "packaging"))
from fa2patch_vllm import plugin

VAR = "FA2PATCH_VLLM_ROUTE_STATS_SECONDS"


def lines(caplog, text):
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_a_line_per_period_with_what_route_stats_returns(monkeypatch, caplog):
    monkeypatch.setenv(VAR, "0.01")
    reads = []
    three = threading.Event()

    def read():
        reads.append(1)
        if len(reads) == 3:
            three.set()
        return f'{{"routes": {{"sm70-decode": {len(reads)}}}}}'

    caplog.set_level(logging.INFO, logger="vllm.fa2patch_vllm")
    stop = plugin.start_route_stats_log(read)
    assert stop is not None and three.wait(5)
    assert [t.daemon for t in threading.enumerate() if t.name == "fa2patch-route-stats"] == [True]
    stop.set()
    logged = lines(caplog, "route_stats {")
    assert logged[:3] == [f'fa2patch-vllm: route_stats {{"routes": {{"sm70-decode": {n}}}}}' for n in (1, 2, 3)]
    assert lines(caplog, "logged every 0.01 s (FA2PATCH_VLLM_ROUTE_STATS_SECONDS)")


@pytest.mark.parametrize("value", [None, "0", " 0 "])
def test_no_thread_when_unset_or_zero(monkeypatch, caplog, value):
    if value is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, value)
    assert plugin.start_route_stats_log(lambda: pytest.fail("read without a period")) is None
    assert caplog.records == []


@pytest.mark.parametrize("value", ["-5", "abc", "nan", "inf", "1e400"])
def test_a_bad_period_is_refused_with_its_value(monkeypatch, caplog, value):
    monkeypatch.setenv(VAR, value)
    assert plugin.start_route_stats_log(lambda: pytest.fail("read after a refusal")) is None
    (message,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert f"{VAR} must be a number of seconds > 0" in message and repr(value) in message


def test_a_failing_read_is_said_once_and_stops(monkeypatch, caplog):
    monkeypatch.setenv(VAR, "0.01")
    failed = threading.Event()

    def read():
        failed.set()
        raise RuntimeError("extension gone")

    stop = plugin.start_route_stats_log(read)
    assert stop is not None and failed.wait(5)
    stop.wait(0.2)  # several periods: the thread must have stopped after the first failure
    stop.set()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    said = "fa2patch-vllm: route_stats() failed (RuntimeError('extension gone')): no more route_stats lines"
    assert warnings == [said]
