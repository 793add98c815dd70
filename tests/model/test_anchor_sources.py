# SPDX-License-Identifier: BSD-3-Clause
"""Every calibration anchor and every measured V100 parameter names its publication (repository,
path, 40-hex commit) and quotes it verbatim; the quote contains the recorded number as the
publication prints it (value and unit), and every anchor states its clock and how that clock is known.
The quotes themselves were checked against the files at those commits when recorded
(docs/anchor-sources.md); this test keeps the records self-consistent and complete."""

import re
import tomllib
from decimal import Decimal
from importlib import resources

import pytest

BASES = {"published", "locked", "power-capped", "assumed"}
HEX40 = re.compile(r"[0-9a-f]{40}")
REPO = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
# A number as printed (digits, optional thousands separators, optional decimals), then an optional
# closing backtick or space, then a unit.
NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?`?\s?(ms|us|TF/s|TFLOP/s|cycles|MHz|-MHz)?")
UNITS = {
    "measured_ms": {"ms"},
    "measured_us": {"us"},
    "measured_tflops": {"TF/s", "TFLOP/s"},
    "excluded_ms": {None, "ms"},
    "cycles": {"cycles"},
    "mhz": {"MHz", "-MHz"},
}


def data(name: str) -> dict:
    return tomllib.loads(resources.files("fa2patch").joinpath(f"data/{name}").read_text())


def printed_numbers(text: str) -> list[tuple[Decimal, str | None]]:
    """Each number in ``text`` as printed (thousands separators dropped) with the unit that follows it."""
    return [(Decimal((whole + frac).replace(",", "")), unit or None) for whole, frac, unit in NUMBER.findall(text)]


def quotes_number(text: str, value, units: set) -> bool:
    """Whether ``text`` prints ``value`` (same value, so as many digits as were recorded) followed by one
    of ``units`` (None: a bare number)."""
    want = Decimal(str(value))
    return any(n == want and u in units for n, u in printed_numbers(text))


def location_problems(where: str, src) -> list[str]:
    if not isinstance(src, dict):
        return [f"{where}: no source table"]
    out = []
    if not REPO.fullmatch(str(src.get("repo", ""))):
        out.append(f"{where}: repo {src.get('repo')!r} is not owner/name")
    if not (src.get("path") or src.get("paths")):
        out.append(f"{where}: no path")
    if not HEX40.fullmatch(str(src.get("commit", ""))):
        out.append(f"{where}: commit {src.get('commit')!r} is not 40 hex digits")
    return out


def quote_problems(where: str, src, value=None, units: set = frozenset()) -> list[str]:
    out = location_problems(where, src)
    if out:
        return out
    if not isinstance(src.get("quote"), str) or not src["quote"].strip():
        return [f"{where}: no quote"]
    if value is not None and not quotes_number(src["quote"], value, units):
        out.append(f"{where}: quote {src['quote']!r} does not print {value} {sorted(u or '' for u in units)}")
    if not all(isinstance(c, str) and c.strip() for c in src.get("context", [])):
        out.append(f"{where}: empty context quote")
    return out


def clock_problems(where: str, clock) -> list[str]:
    if not isinstance(clock, dict):
        return [f"{where}: no clock"]
    out = []
    if not isinstance(clock.get("mhz"), (int, float)) or clock["mhz"] <= 0:
        out.append(f"{where}: clock.mhz missing")
    if clock.get("basis") not in BASES:
        out.append(f"{where}: clock.basis {clock.get('basis')!r} not one of {sorted(BASES)}")
    evidence = clock.get("evidence") or []
    texts = [e if isinstance(e, str) else e.get("quote", "") for e in evidence]
    for e in evidence:
        if isinstance(e, dict):
            out += quote_problems(f"{where}: clock evidence", e)
    if not texts or not all(t.strip() for t in texts):
        out.append(f"{where}: clock without evidence")
    elif clock.get("basis") == "assumed" and not clock.get("reason"):
        out.append(f"{where}: an assumed clock needs a reason")
    elif clock.get("basis") in ("locked", "published") and not any(
        quotes_number(t, clock["mhz"], UNITS["mhz"]) for t in texts
    ):
        out.append(f"{where}: no evidence quote prints {clock['mhz']} MHz")
    elif clock.get("basis") == "power-capped" and not all(
        any(quotes_number(t, mhz, UNITS["mhz"] | {None}) for t in texts) for mhz in clock.get("sustained_mhz", [])
    ):
        out.append(f"{where}: the evidence does not print the sustained clock {clock.get('sustained_mhz')}")
    return out


def anchor_problems(a: dict, kernels: dict) -> list[str]:
    where = f"anchor {a.get('name')!r}"
    value_key = next((k for k in ("measured_ms", "measured_us", "measured_tflops") if k in a), None)
    if value_key is None:
        return [f"{where}: no published time or rate (measured_ms / measured_us / measured_tflops)"]
    out = quote_problems(f"{where} source", a.get("source"), a[value_key], UNITS[value_key])
    out += clock_problems(where, a.get("clock"))
    if "excluded_ms" in a:
        out += quote_problems(
            f"{where} excluded_source", a.get("excluded_source"), a["excluded_ms"], UNITS["excluded_ms"]
        )
    card_src = a.get("card_source")
    out += quote_problems(f"{where} card_source", card_src)
    if isinstance(card_src, dict) and not re.search(rf"\b{a['card']['sms']}[- ]SMs?\b", card_src.get("quote", "")):
        out.append(f"{where}: card_source does not state {a['card']['sms']} SMs")
    if isinstance(a.get("clock"), dict) and a["card"]["clock_mhz"] != a["clock"].get("mhz"):
        out.append(f"{where}: card.clock_mhz {a['card']['clock_mhz']} is not clock.mhz {a['clock'].get('mhz')}")
    if "ratio_to_bound" in a and "bound_source" not in a:
        out.append(f"{where}: a time rebuilt from a ratio needs the publication's own bound (bound_source)")
    for name in (a.get("kernel"), a["workload"].get("qk_kernel"), a["workload"].get("pv_kernel")):
        if name is not None and name not in kernels:
            out.append(f"{where}: kernel {name!r} is not recorded")
    return out


def kernel_problems(k: dict) -> list[str]:
    where = f"kernel {k.get('name')!r} mix_source"
    src = k.get("mix_source")
    out = location_problems(where, src)
    if not out and not (src.get("quote") or (src.get("toolchain") and src.get("command"))):
        out.append(f"{where}: neither a quote of the publication nor the toolchain and extraction command")
    return out


def parameter_problems(name: str, entry: dict) -> list[str]:
    src = entry.get("source")
    if not isinstance(src, dict):
        return []  # a whitepaper / model parameter: its source is a citation string
    if "quoted_values" in entry:  # derived from published values, each of which the quote prints
        out = quote_problems(f"v100 {name}", src)
        return out + [
            f"v100 {name}: quote does not print {v}"
            for v in entry["quoted_values"]
            if not quotes_number(src.get("quote", ""), v, UNITS["mhz"] | {None})
        ]
    units = UNITS["cycles"] if name.endswith("_cycles") else {None}
    return quote_problems(f"v100 {name}", src, entry["value"], units)


# --- The records ---------------------------------------------------------------------------------

ANCHORS = data("anchors.toml")
KERNELS = {k["name"]: k for k in ANCHORS["kernel"]}


@pytest.mark.parametrize("anchor", ANCHORS["anchor"], ids=lambda a: a["name"])
def test_every_anchor_quotes_its_number_and_states_its_clock(anchor):
    assert anchor_problems(anchor, KERNELS) == []


@pytest.mark.parametrize("kernel", ANCHORS["kernel"], ids=lambda k: k["name"])
def test_every_loop_mix_says_where_it_came_from(kernel):
    assert kernel_problems(kernel) == []


@pytest.mark.parametrize("name, entry", data("v100.toml").items())
def test_every_measured_v100_parameter_quotes_its_value(name, entry):
    assert parameter_problems(name, entry) == []


def test_the_measured_latencies_are_recorded_with_a_quote():
    measured = {n for n, e in data("v100.toml").items() if isinstance(e.get("source"), dict)}
    assert {
        "dependent_ldg_l2_hit_cycles",
        "dependent_lds_cycles",
        "dependent_mma884_cycles",
        "sts_lds_warpsync_roundtrip_cycles",
        "sustained_tensor_clock_mhz",
    } <= measured


@pytest.mark.parametrize("unused", ANCHORS.get("unused", []), ids=lambda u: u["name"])
def test_every_unused_measurement_says_why_and_quotes_one_of_its_values(unused):
    assert unused.get("reason", "").strip()
    assert quote_problems(f"unused {unused['name']!r}", unused.get("source")) == []
    assert any(quotes_number(unused["source"]["quote"], v, {None, "ms"}) for v in unused["values_ms"].values())


# --- The checks catch what they are for ----------------------------------------------------------


def anchor(**change) -> dict:
    a = next(x for x in ANCHORS["anchor"] if x["name"] == "split-D Q=4096 KV=32K")
    return {**a, **change}


def test_the_normaliser_reads_numbers_as_printed():
    assert printed_numbers("| 32K | 22.5864 ms | 21.0775 ms |") == [
        (Decimal("32"), None),
        (Decimal("22.5864"), "ms"),
        (Decimal("21.0775"), "ms"),
    ]
    assert quotes_number("measured `136.07628 -> 100.20284 ms` (`1.35801x`)", 100.20284, {"ms"})
    assert quotes_number("reached a best `83.45 TF/s` at", 83.45, {"TF/s"})
    assert quotes_number("| 128K | 174.9729 ms | 103.8420 ms |", 103.842, {"ms"})  # trailing zero
    assert quotes_number("the 40,000-key run took 5.0 ms", 40000, {None})
    assert quotes_number("the requested 1530-MHz clock", 1530, {"-MHz"})
    assert not quotes_number("| 1024 | 0.340 ms | 0.213 ms |", 0.2130001, {"ms"})
    assert not quotes_number("| 8192 | 7.043 ms | 5.425 ms |", 5.43, {"ms"})  # rounded: not as printed
    assert not quotes_number("took 22.5864 ms", 22.5864, {"cycles"})  # wrong unit
    assert not quotes_number("a 1024-row tile", 24, {None})  # part of a number


def test_an_anchor_without_source_or_clock_is_caught():
    assert any("no source table" in p for p in anchor_problems(anchor(source=None), KERNELS))
    assert any("no clock" in p for p in anchor_problems(anchor(clock=None), KERNELS))
    no_quote = {**anchor()["source"], "quote": ""}
    assert any("no quote" in p for p in anchor_problems(anchor(source=no_quote), KERNELS))
    short = {**anchor()["source"], "commit": "4b651a94"}
    assert any("40 hex" in p for p in anchor_problems(anchor(source=short), KERNELS))


def test_a_quote_without_the_recorded_number_is_caught():
    assert any("does not print" in p for p in anchor_problems(anchor(measured_ms=22.59), KERNELS))
    ratio = anchor(ratio_to_bound={"ratio": 1.6, "bound_cycles_per_warp_iteration": 1576, "bound_clock_mhz": 1312})
    assert any("bound_source" in p for p in anchor_problems(ratio, KERNELS))


def test_a_clock_must_be_backed_by_its_evidence():
    clock = anchor()["clock"]
    assert any("basis" in p for p in clock_problems("x", {**clock, "basis": "nominal"}))
    assert any("1530 MHz" in p for p in clock_problems("x", {**clock, "mhz": 1530}))
    assert any("reason" in p for p in clock_problems("x", {**clock, "basis": "assumed"}))
    assert any("without evidence" in p for p in clock_problems("x", {**clock, "evidence": []}))


def test_a_mix_without_provenance_is_caught():
    k = {**KERNELS["split-D D=256"]}
    assert kernel_problems({**k, "mix_source": None})
    assert any("toolchain" in p for p in kernel_problems({**k, "mix_source": {**k["mix_source"], "command": ""}}))
