# SPDX-License-Identifier: BSD-3-Clause
"""bench's results as text: the A/B table with the card's samples (``render``, what `fa2patch bench`
prints) and the Markdown summary a user pastes into an issue report (``markdown``)."""

from fa2patch import __version__
from fa2patch.common.tables import table
from fa2patch.measure import gpu_clocks
from fa2patch.model.ranges import range_text, separated


def model_card_note(result: dict) -> str:
    """What the "model ms" column is, for the table and the Markdown alike."""
    card = result.get("model_card", {})
    return (
        f"model ms: `fa2patch report`'s calibrated estimate for a V100 with {card.get('sms')} SMs at "
        f"{card.get('clock_mhz', 0):g} MHz (an estimate, not a measurement; docs/report-model.md)"
    )


def model_text(model: dict | None) -> str:
    if not model:
        return "-"
    if "calibrated_ms_low" in model and "calibrated_ms_high" in model:
        return f"{model['calibrated_ms_low']:.2f}-{model['calibrated_ms_high']:.2f}"
    return f"{model['calibrated_ms']:.2f}"


def ratio_text(ratio: dict | None) -> str:
    if not ratio:
        return "-"
    if "low" in ratio:
        return f"{ratio['low']:.2f}-{ratio['high']:.2f}"
    return f"{ratio['point']:.2f}"


WARNING = (
    "WARNING: this GPU is not a V100 (sm_70): timings of SM70 code here do not represent "
    "V100 (the H200 emulates Volta's mma.m8n8k4)."
)


def render(result: dict) -> str:
    """The A/B table: per shape, median ms of each route with its range over the repetitions
    (min-max; * when the case ran throttled), speedup and latency reduction of B over A and
    whether the two ranges separate (ranges.separated, the rule `report` compares routes of two
    kernels by), useful causal TFLOP/s, the numerics verdicts (envelope / contract)
    and, on an SM70 card, report's estimate and measured/model; then the card during each timed
    case."""
    routes = result["routes"]
    loaded = sorted({r["sm_clock_after"] for r in result["results"] if r.get("sm_clock_after")})
    lines = [
        f"GPU {result['gpu']} ({result['capability']}), SM clock {result['sm_clock_idle']} idle, "
        f"{result['sm_clock_max']} max, {' / '.join(loaded) or 'unknown'} right after the timed calls; "
        f"driver {result['driver']}, build manifest sha256 {result['manifest_sha256'][:16]}"
    ]
    if not result["is_v100"]:
        lines.append(WARNING)
    by_shape: dict[str, dict] = {}
    for r in result["results"]:
        by_shape.setdefault(r["label"], {})[r["route"]] = r
    modelled = any("model" in r for r in result["results"])
    header = ["shape"] + [f"{x} ms, median (min-max)" for x in routes]
    if len(routes) == 2:
        header += ["speedup", "latency -", "ranges"]
    header += [f"{x} TFLOP/s" for x in routes] + [f"{x} env/contract" for x in routes]
    if modelled:
        header += [f"{x} model ms" for x in routes] + [f"{x} measured/model" for x in routes]
    rows = []
    for label, per in by_shape.items():
        cells = [label]
        got = [per.get(x, {}) for x in routes]
        ms = [r.get("median_ms") for r in got]
        cells += [
            (
                range_text(r["median_ms"], r.get("min_ms", r["median_ms"]), r.get("max_ms", r["median_ms"]), 2)
                + ("*" if r.get("throttled") else "")
                if r.get("median_ms")
                else "error"
            )
            for r in got
        ]
        if len(routes) == 2:
            ok = all(ms)
            spans = [
                {
                    "calibrated_ms_low": r.get("min_ms", r.get("median_ms")),
                    "calibrated_ms_high": r.get("max_ms", r.get("median_ms")),
                }
                for r in got
            ]
            cells += [
                f"{ms[0] / ms[1]:.2f}x" if ok else "-",
                f"{1 - ms[1] / ms[0]:.0%}" if ok else "-",
                ("separated" if separated(*spans) else "not separated") if ok else "-",
            ]
        cells += [f"{per[x]['tflops']:.1f}" if "tflops" in per.get(x, {}) else "-" for x in routes]
        cells += [
            ("ok" if per[x]["envelope_ok"] else "FAIL") + "/" + ("ok" if per[x]["contract_ok"] else "FAIL")
            if "envelope_ok" in per.get(x, {})
            else per.get(x, {}).get("error", "-")[:40]
            for x in routes
        ]
        if modelled:
            cells += [model_text(per.get(x, {}).get("model")) for x in routes]
            cells += [ratio_text(per.get(x, {}).get("measured_over_model")) for x in routes]
        rows.append(cells)
    lines.append(table(rows, header))
    if any(r.get("throttled") for r in result["results"]):
        lines.append(f"* ran throttled ({result.get('throttle_rule', gpu_clocks.THROTTLE_RULE)})")
    if modelled:
        lines.append(model_card_note(result))
    elif result.get("model_note"):
        lines.append(result["model_note"])
    lines += ["", "The card during each timed case (NVML):"]
    nvml = result.get("nvml") or {}
    if not nvml.get("available"):
        lines.append(nvml.get("note") or "NVML not sampled")
    else:
        lines.append(
            table(
                [[r["label"], r["route"], gpu_clocks.describe(r.get("clocks"))] for r in result["results"]],
                ["shape", "route", "samples"],
            )
        )
    return "\n".join(lines)


def markdown(result: dict) -> str:
    """The run as Markdown for an issue report: the machine, then one row per case with its
    timings, the card's clocks, power, temperature and throttle reasons during the timed calls,
    the numerics verdicts and, on an SM70 card, report's estimate and measured/model."""
    nvml = result.get("nvml") or {}
    facts = [
        ("GPU", f"{result['gpu']} ({result['capability']}, {result.get('sms') or '?'} SMs)"),
        ("driver", result.get("driver") or "?"),
        ("torch / CUDA", f"{result.get('torch') or '?'} / {result.get('cuda') or '?'}"),
        ("fa2patch", result.get("fa2patch") or __version__),
        ("build manifest sha256", f"`{result['manifest_sha256']}`"),
        ("SM clock (nvidia-smi)", f"{result['sm_clock_idle'] or '?'} idle, {result['sm_clock_max'] or '?'} max"),
        (
            "NVML",
            f"sampled every {nvml.get('interval_ms', 0):g} ms ({nvml.get('device')}); power limit "
            f"{nvml.get('power_limit_w') or '?'} W"
            if nvml.get("available")
            else nvml.get("note") or "not sampled",
        ),
    ]
    lines = [f"### fa2patch bench: {result['gpu']}", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in facts]
    header = [
        "shape",
        "route",
        "median ms",
        "min-max ms",
        "TFLOP/s",
        "SM MHz min-med-max",
        "mem MHz",
        "power W",
        "temp C",
        "throttle reasons",
        "throttled",
        "envelope/contract",
    ]
    modelled = any("model" in r for r in result["results"])
    if modelled:
        header += ["model ms (V100)", "measured/model"]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in result["results"]:
        c = r.get("clocks") or {}
        if "median_ms" not in r:
            row = [r["label"], r["route"], "error: " + r.get("error", "?").splitlines()[-1][:80]] + [""] * (
                len(header) - 3
            )
        else:
            row = [
                r["label"],
                r["route"],
                f"{r['median_ms']:.3f}",
                f"{r['min_ms']:.3f}-{r['max_ms']:.3f}",
                f"{r.get('tflops', 0):.1f}",
                _md_range(c.get("sm_clock_mhz")),
                _md_range(c.get("mem_clock_mhz")),
                _md_range(c.get("power_w")),
                _md_range(c.get("temperature_c")),
                ", ".join(c.get("throttle_reasons_seen") or []) or "-",
                {True: "**yes**", False: "no", None: "?"}[r.get("throttled")],
                ("ok" if r.get("envelope_ok") else "FAIL") + "/" + ("ok" if r.get("contract_ok") else "FAIL"),
            ]
            if modelled:
                row += [model_text(r.get("model")), ratio_text(r.get("measured_over_model"))]
        lines.append("| " + " | ".join(str(x) for x in row) + " |")
    lines += ["", f"- {result.get('throttle_rule', gpu_clocks.THROTTLE_RULE)}."]
    if modelled:
        lines.append(f"- {model_card_note(result)}.")
    elif result.get("model_note"):
        lines.append(f"- {result['model_note']}")
    if not result["is_v100"]:
        lines.append(f"- {WARNING}")
    return "\n".join(lines) + "\n"


def _md_range(s: dict | None) -> str:
    if not s:
        return "-"
    lo, mid, hi = (f"{round(s[k], 1):g}" for k in ("min", "median", "max"))
    return lo if lo == hi else f"{lo}-{mid}-{hi}"
