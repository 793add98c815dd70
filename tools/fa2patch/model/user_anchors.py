# SPDX-License-Identifier: BSD-3-Clause
"""Users' bench files as calibration anchors: `fa2patch report --anchors FILE...`.

Each case of a bench JSON file (``fa2patch bench --json-file``) run on an SM70 card becomes an
anchor: measured = the case's median time; workload = our own route's launches at that shape on
that card (report.route_launches, with the file's SM count); clock = the median SM clock NVML
sampled during the case's timed calls (``clocks.sm_clock_mhz.median``), or where NVML was not
sampled the SM clock nvidia-smi read right after them (``sm_clock_after``). The model runs the
anchor at that measured clock, not at the one its tensor duty would allow (v100model.route_timer).
A file from another GPU is refused, and so is one whose cases are not what bench writes (check_case:
the field, what it takes and its value); a case without a time or a clock is left out and listed.

The user anchors are fitted together with the published ones (calibration.calibrate), one
weight each; ``movement`` says how the parameters and the range moved, and each user anchor's
residual and leave-one-out residual.
"""

import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.shapes import Shape
from fa2patch.common.tables import table
from fa2patch.common.values import finite_number, whole_number
from fa2patch.compile.extension import mhz
from fa2patch.model.v100model import Card


def read_bench(path: Path) -> dict:
    """A bench JSON file from an SM70 card, with its SM count; refused otherwise."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: arrays nested too deep
        raise EnvironmentProblem(f"--anchors {path}: cannot read it as JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise EnvironmentProblem(
            f"--anchors {path}: not a bench JSON file (expected an object with 'results', "
            f"as `fa2patch bench --json-file` writes)"
        )
    if doc.get("capability") != "sm_70":
        raise EnvironmentProblem(
            f"--anchors {path}: expected a bench file from an sm_70 card (a V100), actual "
            f"{doc.get('capability')!r} ({doc.get('gpu', 'unknown GPU')}): timings of the SM70 "
            f"kernels on another GPU say nothing about a V100"
        )
    sms = doc.get("sms")
    if not whole_number(sms, 1):
        raise EnvironmentProblem(f"--anchors {path}: the file records no SM count ('sms': {sms!r})")
    for i, case in enumerate(doc["results"]):
        check_case(case, f"--anchors {path}: results[{i}]")
    return doc


# A case's shape as bench writes it (dataclasses.asdict(Shape)): these keys, each at least its minimum
# (b, decode, decode_kv and page may be left out: Shape's defaults).
SHAPE_MINIMUM = {"q": 1, "kv": 1, "hq": 1, "hkv": 1, "d": 1, "b": 1, "decode": 0, "decode_kv": 0, "page": 0}
SHAPE_REQUIRED = ("q", "kv", "hq", "hkv", "d", "causal", "scale")


def check_case(case, where: str) -> None:
    """Refuse a case whose fields anchors_from reads are not what bench writes, naming the field,
    what it takes and its value. A case without a time or a clock is well formed (it is left out)."""
    if not isinstance(case, dict):
        raise EnvironmentProblem(f"{where}: expected an object (a bench case), actual {case!r}")
    shape = case.get("shape")
    if not isinstance(shape, dict):
        raise EnvironmentProblem(
            f"{where}.shape: expected an object with {', '.join(SHAPE_REQUIRED)}, actual {shape!r}"
        )
    unknown = sorted(set(shape) - set(SHAPE_MINIMUM) - set(SHAPE_REQUIRED))
    missing = [k for k in SHAPE_REQUIRED if k not in shape]
    if unknown or missing:
        raise EnvironmentProblem(f"{where}.shape: unknown key(s) {unknown}, missing key(s) {missing}")
    for key, low in SHAPE_MINIMUM.items():
        value = shape.get(key, low)
        if not whole_number(value, low):
            raise EnvironmentProblem(f"{where}.shape.{key}: expected an integer >= {low}, actual {value!r}")
    if not isinstance(shape["causal"], bool):
        raise EnvironmentProblem(f"{where}.shape.causal: expected true or false, actual {shape['causal']!r}")
    if not finite_number(shape["scale"]) or shape["scale"] <= 0:
        raise EnvironmentProblem(f"{where}.shape.scale: expected a positive finite number, actual {shape['scale']!r}")
    for key in ("label", "route", "error", "sm_clock_after"):
        if case.get(key) is not None and not isinstance(case[key], str):
            raise EnvironmentProblem(f"{where}.{key}: expected null or a string, actual {case[key]!r}")
    if case.get("median_ms") is not None and not finite_number(case["median_ms"]):
        raise EnvironmentProblem(
            f"{where}.median_ms: expected null or a finite number (ms), actual {case['median_ms']!r}"
        )
    clocks = case.get("clocks")
    sm = clocks.get("sm_clock_mhz") if isinstance(clocks, dict) else None
    median = sm.get("median") if isinstance(sm, dict) else None
    if clocks is not None and (not isinstance(clocks, dict) or (sm is not None and not isinstance(sm, dict))):
        raise EnvironmentProblem(
            f"{where}.clocks: expected null or an object whose sm_clock_mhz is null or an object, actual {clocks!r}"
        )
    if median is not None and (not finite_number(median) or median < 0):
        raise EnvironmentProblem(
            f"{where}.clocks.sm_clock_mhz.median: expected null or a finite number >= 0 (MHz), actual {median!r}"
        )


def case_clock(case: dict) -> tuple[float, str] | None:
    """(MHz, source) of the SM clock a case ran at, or None when nothing measured it."""
    sm = ((case.get("clocks") or {}).get("sm_clock_mhz") or {}).get("median")
    if sm:
        return float(sm), "NVML median during the timed calls"
    after = mhz(case.get("sm_clock_after"))
    return (after, "nvidia-smi right after the timed calls") if after else None


def anchors_from(path: Path, doc: dict, launches_for) -> tuple[list[dict], list[dict]]:
    """(anchors, skipped cases with the reason) of one bench file. ``launches_for(shape, route,
    card)``: our route's launches for the case (report.route_launches)."""
    anchors, skipped = [], []
    for case in doc["results"]:
        label, route = case.get("label", "?"), case.get("route", "?")
        why = None
        if not isinstance(case.get("median_ms"), (int, float)) or case["median_ms"] <= 0:
            why = f"no time ({(case.get('error') or 'no median_ms').splitlines()[-1][:80]})"
        clock = case_clock(case)
        if why is None and clock is None:
            why = "no clock: NVML was not sampled and nvidia-smi gave none"
        elif why is None and clock is not None:
            shape = Shape(**case["shape"])
            card = Card(doc["sms"], clock[0])
            try:
                launches = launches_for(shape, route, card)
            except EnvironmentProblem as exc:
                why = str(exc)
        if why is not None or clock is None:  # no clock: always with its reason
            skipped.append({"file": str(path), "label": label, "route": route, "reason": why})
            continue
        anchors.append(
            {
                "name": f"{label} {route}",
                "kind": "user",
                "source": {
                    "file": str(path),
                    "gpu": doc.get("gpu"),
                    "driver": doc.get("driver"),
                    "manifest_sha256": doc.get("manifest_sha256"),
                    "fa2patch": doc.get("fa2patch"),
                },
                "card": {"sms": doc["sms"], "clock_mhz": clock[0]},
                "measured_ms": case["median_ms"],
                "workload": {"kind": "route", "launches": launches, "clock_mhz": clock[0]},
                "file": str(path),
                "shape": case["shape"],
                "label": label,
                "route": route,
                "clock_mhz": clock[0],
                "clock_source": clock[1],
                "throttled": case.get("throttled"),
            }
        )
    return anchors, skipped


def shapes_of(paths: Sequence[Path]) -> list[Shape]:
    """The shapes of every case of the bench files (for what report reads from the extension first)."""
    return [Shape(**case["shape"]) for p in paths for case in read_bench(p)["results"] if "shape" in case]


def load(paths: Sequence[Path], launches_for) -> tuple[list[dict], list[dict]]:
    """Every file's anchors and skipped cases; an unreadable or non-SM70 file refuses the run."""
    docs = [(Path(p), read_bench(p)) for p in paths]
    anchors, skipped = [], []
    for path, doc in docs:
        a, s = anchors_from(path, doc, launches_for)
        anchors += a
        skipped += s
    return anchors, skipped


def summary(cal: dict) -> dict:
    keys = ("parameters", "residual_range", "loo_range", "loko_range", "range", "route_ranges")
    return {k: cal.get(k, {}) for k in keys} | {"anchors": len(cal["anchors"])}


def movement(before: dict, after: dict, files: Sequence[Path], skipped: list[dict]) -> dict:
    """How the fit moved: the published anchors' fit, the fit with the user anchors, each user
    anchor (file, shape, route, clock, measured, calibrated, residual, leave-one-out and
    leave-one-kernel-out residuals)."""
    user = [
        {
            k: a.get(k)
            for k in (
                "name",
                "file",
                "label",
                "route",
                "card",
                "clock_mhz",
                "clock_source",
                "throttled",
                "measured",
                "model",
                "calibrated",
                "residual",
                "loo_residual",
                "loko_residual",
            )
        }
        for a in after["anchors"]
        if a["kind"] == "user"
    ]
    return {
        "files": [str(f) for f in files],
        "before": summary(before),
        "after": summary(after),
        "user_anchors": user,
        "skipped": skipped,
        "median_user_residual": statistics.median(a["residual"] for a in user) if user else None,
    }


def render_calibration(result: dict) -> list[str]:
    """The anchors' table (published and users') and, with user anchors, how the fit moved."""
    cal = result["calibration"]
    lines = [
        "",
        "Calibration anchors (published V100 measurements of open SM70 kernels, "
        "tools/fa2patch/data/anchors.toml, and users' bench files given with --anchors), recomputed now:",
    ]
    lines.append(
        table(
            [
                [
                    a["name"],
                    Path(a["file"]).name if a["kind"] == "user" else "published",
                    f"{a['card']['sms']}, {a['card']['clock_mhz']:g}",
                    f"{a['measured']:.4g} {a['unit']}",
                    f"{a['model']:.4g}",
                    f"{a['calibrated']:.4g}",
                    f"{a['residual']:+.1%}",
                    f"{a['loo_residual']:+.1%}",
                    f"{a['loko_residual']:+.1%}" if a["loko_residual"] is not None else "-",
                    a["class"],
                    a["outlier"] or ("throttled" if a.get("throttled") else ""),
                ]
                for a in cal["anchors"]
            ],
            [
                "anchor",
                "from",
                "SMs, MHz",
                "measured",
                "model",
                "calibrated",
                "residual",
                "leave-one-out",
                "leave-one-kernel-out",
                "kernel class",
                "note",
            ],
        )
    )
    t = cal["targets"]
    if not cal["within_targets"]:
        lines.append(
            f"WARNING: a published anchor not marked outlier lies outside +-{t['residual']:.0%} (residual) "
            f"or +-{t['loo']:.0%} (leave-one-out)"
        )
    if not cal["loko_within_target"]:
        lines.append(
            f"WARNING: a kernel class of two published anchors or more has one outside +-{t['loko']:.0%} "
            f"left out by kernel (the classes' ranges are in the header)"
        )
    fit = result.get("anchor_fit")
    if fit:
        b, a = fit["before"], fit["after"]
        pct = lambda r: f"{r[0]:+.1%} .. {r[1]:+.1%}"  # noqa: E731
        pb, pa = b["parameters"], a["parameters"]
        lines += [
            "",
            f"The fit with users' anchors ({', '.join(fit['files'])}): {b['anchors']} -> {a['anchors']} "
            f"anchors; cycle factor {pb['cycle_factor']:.3f} -> {pa['cycle_factor']:.3f}, "
            f"cycles per fused CTA {pb['cta_cycles']:,.0f} -> {pa['cta_cycles']:,.0f}; "
            f"residuals {pct(b['residual_range'])} -> {pct(a['residual_range'])}; leave-one-out "
            f"{pct(b['loo_range'])} -> {pct(a['loo_range'])}; leave-one-kernel-out {pct(b['loko_range'])} -> "
            f"{pct(a['loko_range'])}; the range of a route of no class {pct(b['range'])} -> {pct(a['range'])}"
            + "".join(
                f"; {route} {pct(b['route_ranges'][route])} -> {pct(r)}"
                for route, r in a["route_ranges"].items()
                if route in b["route_ranges"]
            )
            + ". A user anchor runs at its measured clock (the clock column above).",
        ]
        for s in fit["skipped"]:
            lines.append(f"left out: {Path(s['file']).name}: {s['label']} {s['route']}: {s['reason']}")
    return lines
