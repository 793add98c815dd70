# SPDX-License-Identifier: BSD-3-Clause
"""An estimate's range and the verdict between two routes (docs/report-model.md, top).

- A route's range (``route_ranges``, ``with_range``): the point x (1 + the smallest) .. (1 + the
  largest) of every anchor's leave-one-out residual and the leave-one-kernel-out residuals of the
  kernel class(es) the route shares its structure with (anchors.toml ``[route_class]``, with users'
  anchors of the route); a route of no class takes every class's.
- Two routes of different kernels are separated where their ranges do not overlap (``versus``).
- Two routes of one kernel (the exact route split and unsplit) by their ratio under every held-out
  parameter set against the class's leave-one-out margin (``versus_one_kernel``): their errors are
  the same kernel's, so their ranges are not independent.
"""


def spread(values) -> list[float]:
    """[smallest, largest] of the values that exist ([0, 0] where none does)."""
    values = [v for v in values if v is not None]
    return [min(values), max(values)] if values else [0.0, 0.0]


def classes_of(route_class: dict, known, route: str) -> list[str] | None:
    """The kernel classes whose held-out residuals apply to ``route``: its [route_class] entry's and,
    where ``known`` (the calibration's class names) has them, its users' anchors' (`report
    --anchors`); None for a route of no class (every class's)."""
    listed = route_class.get(route, {}).get("classes")
    users = [f"fa2patch {route}"] if f"fa2patch {route}" in known else []
    return None if listed is None else [*listed, *users]


def route_ranges(route_class: dict, classes: list[dict]) -> dict:
    """{route: [lo, hi]} for every route of anchors.toml's [route_class]: the span of its classes'
    ranges (``classes_of``). A class that no anchor measures is an error in the data."""
    by_name = {c["class"]: c["range"] for c in classes}
    out = {}
    for route in route_class:
        names = classes_of(route_class, by_name, route) or []
        missing = [c for c in names if c not in by_name]
        if missing:
            raise ValueError(
                f"anchors.toml [route_class] {route}: no anchor of class {missing[0]!r} (classes: {sorted(by_name)})"
            )
        out[route] = spread([x for c in names for x in by_name[c]])
    return out


def with_range(ms: float, calibration: dict, route: str | None = None) -> dict:
    """An estimate of ``route`` with its range (``calibrate``'s range rule: the route's class's, or
    every class's for a route of none); the range always holds the point."""
    lo, hi = calibration.get("route_ranges", {}).get(route, calibration["range"])
    return {
        "calibrated_ms": ms,
        "calibrated_ms_low": ms * min(1.0, 1.0 + lo),
        "calibrated_ms_high": ms * max(1.0, 1.0 + hi),
    }


def separated(a: dict, b: dict) -> bool:
    """Whether two estimates' ranges do not overlap."""
    return a["calibrated_ms_high"] < b["calibrated_ms_low"] or b["calibrated_ms_high"] < a["calibrated_ms_low"]


def faster_if_separated(a: dict, b: dict) -> str:
    """'a' or 'b' where one route's range lies wholly below the other's, else 'not separated'."""
    if not separated(a, b):
        return "not separated"
    return "a" if a["calibrated_ms_high"] < b["calibrated_ms_low"] else "b"


def range_text(point: float, low: float, high: float, digits: int = 3) -> str:
    """ "3.12 (2.78-3.45)": a point with its range."""
    return f"{point:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


VERDICT = {"a": "faster", "b": "slower", "not separated": "not separated"}


def versus(p: dict, other: dict, key: str) -> dict:
    """``key``: other's calibrated time over p's (> 1: p is faster); ``key``_verdict: "faster" or
    "slower" where their ranges separate, else "not separated"."""
    return {key: other["calibrated_ms"] / p["calibrated_ms"], f"{key}_verdict": VERDICT[faster_if_separated(p, other)]}


def held_out_parameters(calibration: dict) -> list[dict]:
    """Every held-out fit of the calibration ({cycle_factor, cta_cycles}): one per anchor left out,
    one per kernel class left out (where other classes remain)."""
    loo = [a["loo_parameters"] for a in calibration.get("anchors", [])]
    return loo + [c["parameters"] for c in calibration.get("classes", []) if c["parameters"]]


def versus_one_kernel(p: dict, other: dict, key: str, ratios: list[float], calibration: dict) -> dict:
    """``versus`` for two routes of one kernel (the exact route split and unsplit), whose errors are
    not independent: the yardstick is their ratio (other's time over p's) under every held-out
    parameter set, ``ratios`` in ``held_out_parameters`` order (``key``_held_out: its least and
    largest; the fits put the cost per fused CTA between 0, without split-D's anchors, and about
    57,000 cycles, the term shorter CTAs pay more of; a kernel paying more than that per CTA is not
    covered), against how far the model's errors on two configurations of one kernel differ: (1 +
    the largest) / (1 + the smallest) leave-one-out residual of the route's kernel class
    (``key``_needs). "faster" or "slower" where the ratio clears that margin under every set.
    Without held-out fits (a hand-made calibration), the ranges."""
    out = versus(p, other, key)
    if not ratios:
        return out
    lo, hi = min(ratios), max(ratios)
    margin = one_kernel_margin(calibration, p["route"])
    verdict = "faster" if lo > margin else "slower" if hi < 1 / margin else "not separated"
    return {**out, f"{key}_verdict": verdict, f"{key}_held_out": [lo, hi], f"{key}_needs": margin}


def one_kernel_margin(calibration: dict, route: str) -> float:
    """(1 + the largest) / (1 + the smallest) leave-one-out residual of the anchors of ``route``'s
    kernel classes (``classes_of``; every anchor's for a route of none)."""
    known = {c["class"] for c in calibration.get("classes", [])}
    classes = classes_of(calibration.get("route_class", {}), known, route)
    loo = [a["loo_residual"] for a in calibration["anchors"] if classes is None or a["class"] in classes]
    return (1 + max(loo)) / (1 + min(loo))
