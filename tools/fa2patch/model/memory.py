# SPDX-License-Identifier: BSD-3-Clause
"""The memory side of the V100 model (data/dram.toml; docs/report-model.md, "The memory side").

A launch that streams its bytes from DRAM (decode: every K/V byte is read once, nothing is re-read
from L2) is held back two ways:

- latency (Little's law): an SM with B bytes of loads in flight reads at most B / L, L the DRAM
  latency (a pointer chase: 434.4 cycles at 1380 MHz, 315 ns). In the cycle model this is the hot
  loop's iteration timed from the SASS with its global loads waiting L (``dram_v100``): what the
  loop keeps in flight, over the time one iteration takes;
- bandwidth: no faster than the sustained ceiling, the read kernel's best at full occupancy (866 of
  900 GB/s), as a fraction of the card's DRAM peak (``card_peak``).

Near the ceiling every load queues longer, so the two do not meet at a corner: the launch takes the
soft maximum t = (t_latency^n + t_bandwidth^n)^(1/n) (``blend``). n is fitted to gpu-stream's read
curve on a V100 (``read_fit``: one 8-byte load per thread, one block per SM, 3% to 100% occupancy),
with the latency and the ceiling held at their measured values; it is refitted on every run.
"""

import math
import tomllib
from functools import cache
from importlib import resources


@cache
def load_dram() -> dict:
    return tomllib.loads(resources.files("fa2patch").joinpath("data/dram.toml").read_text())


def latency_ns(dram: dict | None = None) -> float:
    """The DRAM latency in nanoseconds (cycles at the clock they were counted at)."""
    lat = (dram or load_dram())["latency"]
    return lat["cycles"] / lat["mhz"] * 1e3


def ceiling_fraction(dram: dict | None = None) -> float:
    """The sustained read bandwidth as a fraction of its card's DRAM peak."""
    c = (dram or load_dram())["ceiling"]
    return c["read_gbs"] / c["peak_gbs"]


def card_peak(name: str | None, v100: dict, dram: dict | None = None) -> float:
    """The DRAM peak (GB/s) of a card: the whitepaper V100's (v100.toml) where ``name`` is None,
    else the one dram.toml derives for that card; an unknown card is an error in the data."""
    if name is None:
        return v100["hbm_bandwidth_gbs"]
    peaks = (dram or load_dram())["card_peaks"]
    if name not in peaks:
        raise ValueError(f"dram.toml [card_peaks]: no card {name!r} (cards: {sorted(peaks)})")
    return peaks[name]["gbs"]


def little_gbs(bytes_in_flight_per_sm: float, sms: int, latency: float) -> float:
    """Little's law: the read rate (GB/s) of ``sms`` SMs that each keep ``bytes_in_flight_per_sm``
    in flight, every byte returning ``latency`` ns after it was asked for."""
    return bytes_in_flight_per_sm * sms / latency


def blend(latency_s: float, bandwidth_s: float, exponent: float) -> float:
    """The soft maximum of the two limits' times (see the module docstring)."""
    if latency_s <= 0 or bandwidth_s <= 0:
        return max(latency_s, bandwidth_s)
    hi = max(latency_s, bandwidth_s)
    return hi * ((latency_s / hi) ** exponent + (bandwidth_s / hi) ** exponent) ** (1.0 / exponent)


def read_model(row: dict, exponent: float, dram: dict) -> float:
    """The model's rate (GB/s) of one gpu-stream read row: Little's law with the row's bytes in
    flight, blended with the ceiling."""
    sms = dram["read_sms"]
    in_flight = row["threads"] / sms * dram["read_bytes_per_thread"]
    ceiling = ceiling_fraction(dram) * dram["ceiling"]["peak_gbs"]
    # the same bytes through each limit: time is bytes / rate, so blend the inverse rates
    return 1.0 / blend(1.0 / little_gbs(in_flight, sms, latency_ns(dram)), 1.0 / ceiling, exponent)


def read_fit(dram: dict | None = None) -> dict:
    """The exponent that fits gpu-stream's read curve best (least squares of log(model / measured),
    golden-section search on 1..8) and each row's residual. {exponent, rows: [{threads, measured,
    model, residual}]}."""
    dram = dram or load_dram()
    rows = dram["read"]

    def cost(n: float) -> float:
        return sum(math.log(read_model(r, n, dram) / r["read_gbs"]) ** 2 for r in rows)

    lo, hi = 1.0, 8.0
    g = (math.sqrt(5) - 1) / 2
    for _ in range(80):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if cost(a) < cost(b):
            hi = b
        else:
            lo = a
    n = (lo + hi) / 2
    return {
        "exponent": n,
        "rows": [
            {
                "threads": r["threads"],
                "measured": r["read_gbs"],
                "model": read_model(r, n, dram),
                "residual": read_model(r, n, dram) / r["read_gbs"] - 1.0,
            }
            for r in rows
        ],
    }


@cache
def exponent() -> float:
    """The fitted exponent of the default data (``read_fit``)."""
    return read_fit()["exponent"]


def dram_cycles(v100: dict, clock_mhz: float | None = None) -> float:
    """The DRAM latency in cycles at ``clock_mhz`` (default: the boost clock: a streaming kernel's
    tensor pipes are nearly idle, so the 300 W cap leaves it at boost)."""
    return latency_ns() * (clock_mhz or v100["boost_clock_mhz"]) / 1e3


def dram_v100(v100: dict, clock_mhz: float | None = None) -> dict:
    """``v100`` with global loads waiting the DRAM latency instead of an L2 hit's: the parameters a
    streaming loop's SASS is timed with (phases.py reads ``dependent_ldg_l2_hit_cycles``)."""
    return {**v100, "dependent_ldg_l2_hit_cycles": dram_cycles(v100, clock_mhz)}
