# SPDX-License-Identifier: BSD-3-Clause
"""The lab decode benchmark's pure parts (fa2patch.lab.decode_bench), by hand: the bytes a decode call
must read, bandwidth, the fixed-cost line and the replay bar."""

import pytest

from fa2patch.lab import decode_bench as db


def test_kv_bytes_are_k_and_v_in_fp16():
    s = db.DecodeShape(hq=6, hkv=1, d=256, b=1, kv=32768, page=784)
    assert s.kv_bytes == 2 * 32768 * 256 * 2 == 32 << 20  # the issue's 32 MiB row
    assert db.DecodeShape(32, 8, 128, 64, 32768, 16).kv_bytes == 8 << 30  # its 8 GiB row
    assert "6/1 x 256, B=1, 32768 keys" in s.label


def test_bandwidth_counts_bytes_per_microsecond():
    assert db.gbs(1e9, 1e6) == pytest.approx(1.0)  # 1 GB in 1 s
    assert db.gbs(32 << 20, 93.3) == pytest.approx(359.6, abs=0.1)  # the issue's 360 GB/s row


def test_fixed_cost_fit_recovers_a_line():
    # 10 us fixed plus 2 TB/s: t = 10 + bytes / 2e6 (us)
    points = [(b, 10.0 + b / 2e6) for b in (1 << 20, 32 << 20, 256 << 20)]
    fit = db.fixed_cost_fit(points)
    assert fit["fixed_us"] == pytest.approx(10.0)
    assert fit["marginal_gbs"] == pytest.approx(2000.0)
    with pytest.raises(ValueError, match="two points"):
        db.fixed_cost_fit(points[:1])


def test_replay_bar_is_ten_percent_over_eager():
    assert db.replay_within(109.9, 100.0)
    assert not db.replay_within(110.1, 100.0)
    assert db.replay_within(50.0, 100.0)  # faster than eager passes


def test_sweep_covers_the_issue_table():
    single = {(s.kv, s.page) for s in db.SINGLE}
    assert {(32768, 784), (131072, 784), (262080, 784)} <= single
    batched = {(s.hq, s.hkv, s.d, s.b, s.kv) for s in db.BATCHED}
    assert {(32, 8, 128, 64, 4096), (32, 8, 128, 64, 32768)} <= batched
    assert db.REPLAY_CAPTURE_KV == 40960 and db.REPLAY_KV == (1024, 8192, 40960)
