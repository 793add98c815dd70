# SPDX-License-Identifier: BSD-3-Clause
"""The memory side of the model (tools/fa2patch/model/memory.py) against the V100 measurements it
stands on (data/dram.toml): a pointer-chase latency, gpu-stream's read curve, and the anchors' card
peak that Nsight Compute's throughput / share-of-peak pairs imply."""

import math

import pytest
from tests.model.test_anchor_sources import quote_problems, quotes_number

from fa2patch.model import memory
from fa2patch.model.loop_mix import LoopMix
from fa2patch.model.v100model import Card, KernelLaunch, estimate_launch, load_v100, route_timer

DRAM = memory.load_dram()


def test_the_pointer_chase_and_the_read_curve_agree_on_the_latency():
    # Little's law inverted on the read kernel at 12.5% occupancy (one 8-byte load per thread,
    # 128 threads per SM): an independent measurement of the same latency.
    row = next(r for r in DRAM["read"] if r["threads"] == 10240)
    in_flight = row["threads"] / DRAM["read_sms"] * DRAM["read_bytes_per_thread"] * DRAM["read_sms"]
    little_ns = in_flight / row["read_gbs"]
    assert little_ns == pytest.approx(memory.latency_ns(), rel=0.02)
    assert memory.latency_ns() == pytest.approx(434.4 / 1.380)


def test_one_exponent_reproduces_the_read_curve():
    fit = memory.read_fit()
    assert 2.0 < fit["exponent"] < 4.0
    for r in fit["rows"]:
        occupancy = r["threads"] / DRAM["read_sms"] / 1024
        # from 12.5% occupancy (4 warps per SM) on within 5%; below, the blocks' turnover shows (10%)
        assert abs(r["residual"]) <= (0.05 if occupancy >= 0.125 else 0.10), r


def test_the_fit_is_the_least_squares_exponent():
    n = memory.read_fit()["exponent"]

    def cost(x):
        return sum(math.log(memory.read_model(r, x, DRAM) / r["read_gbs"]) ** 2 for r in DRAM["read"])

    assert cost(n) <= min(cost(n - 0.05), cost(n + 0.05))


def test_blend_is_a_soft_maximum():
    n = 3.0
    assert memory.blend(2.0, 0.0, n) == 2.0
    assert memory.blend(1.0, 1.0, n) == pytest.approx(2 ** (1 / 3))
    assert 5.0 < memory.blend(5.0, 1.0, n) < 5.05
    assert memory.blend(1.0, 5.0, n) == memory.blend(5.0, 1.0, n)


def test_every_read_row_quotes_its_threads_and_rate():
    for r in DRAM["read"]:
        assert quotes_number(r["quote"], r["threads"], {None}) and quotes_number(r["quote"], r["read_gbs"], {None})
    src = DRAM["read_source"]
    assert quote_problems("read", {**src, "quote": src["kernel"]["quote"]}) == []


def test_the_latency_and_the_ceiling_quote_their_values():
    lat, ceiling = DRAM["latency"], DRAM["ceiling"]
    assert quote_problems("latency", lat["source"], lat["cycles"], {None}) == []
    assert quotes_number(lat["source"]["quote"], lat["mhz"], {None})
    assert quote_problems("ceiling", ceiling["source"], ceiling["read_gbs"], {None}) == []


def test_the_anchor_card_peak_is_the_mean_of_its_quoted_pairs():
    card = DRAM["card_peaks"]["PG503-216"]
    src = card["source"]
    assert quote_problems("card peak", src) == []
    text = " ".join([src["quote"], *src["context"]])
    for p in card["pairs"]:
        assert f"{p['gbs']} GB/s" in text and f"{p['share'] * 100:.2f}%" in text
    peaks = [p["gbs"] / p["share"] for p in card["pairs"]]
    assert card["gbs"] == pytest.approx(sum(peaks) / len(peaks), abs=0.5)
    assert max(peaks) / min(peaks) < 1.01  # the pairs agree: one peak, not a per-kernel ratio
    assert memory.card_peak("PG503-216", load_v100()) == card["gbs"]
    assert memory.card_peak(None, load_v100()) == 900
    with pytest.raises(ValueError, match="no card 'X'"):
        memory.card_peak("X", load_v100())


def test_a_streaming_launch_blends_its_limits_and_reads_at_most_the_ceiling():
    v100 = load_v100()
    card = Card(80, 1530.0)
    gigabyte = 1e9
    loop = LoopMix(instructions=10)
    streaming = KernelLaunch("s", loop, (1,) * 80, 4, 1, hbm_bytes=gigabyte, streams=True)
    plain = KernelLaunch("p", loop, (1,) * 80, 4, 1, hbm_bytes=gigabyte)
    s, p = estimate_launch(streaming, card, v100), estimate_launch(plain, card, v100)
    assert p["ms"] == pytest.approx(gigabyte / 900e9 * 1e3)  # the peak, as before
    ceiling_ms = gigabyte / (900e9 * 866 / 900) * 1e3
    assert s["ms"] > ceiling_ms  # never faster than the sustained ceiling
    assert s["ms"] == pytest.approx(route_timer([streaming], card, v100)(), rel=1e-9)
    faster = estimate_launch(streaming, Card(80, 1530.0, 1128.5), v100)
    assert faster["ms"] < s["ms"]
