# SPDX-License-Identifier: BSD-3-Clause
"""Fitting the V100 model to published measurements of open SM70 kernels (data/anchors.toml).

Two parameters (v100model.Calibration), fitted by least squares on log(measured / estimate) over
every anchor:

- ``cycle_factor``: every modelled cycle of every kernel is this many real cycles: what the model
  does not see and all kernels share (register-bank and shared-memory bank conflicts, scheduling
  slack, warps drifting out of phase);
- ``cta_cycles``: cycles added to every CTA of a fused attention kernel (an FA2-style grid: one CTA
  per query tile over all its keys) beyond its code outside the loop. The split-D anchors need it:
  their short sequences (few iterations per CTA) run slower per iteration than their long ones,
  which only a cost per CTA explains (docs/report-model.md).

Every anchor is also predicted by a fit without it (leave-one-out) and by a fit without every
anchor of its kernel class (leave-one-kernel-out: the kernels' ``class`` in anchors.toml, a user's
anchor by its route). The second is the error that matters for our own kernels, which no anchor
measures; where the remaining anchors hold no fused kernel, ``cta_cycles`` is not identified and
that fit holds it at 0 (the term no remaining evidence asks for).

An estimate's range is the point times (1 + the smallest) .. (1 + the largest) held-out residual
that applies to it: every anchor's leave-one-out residual, and the leave-one-kernel-out residuals
of the kernel class its route shares its structure with (anchors.toml ``[route_class]``: a fused
FA2 grid, or KV-blocked GEMM tiles); a route of no class takes every class's. Two routes are
"separated" where their ranges do not overlap.
"""

import math
from collections.abc import Sequence

from fa2patch.model import memory
from fa2patch.model.anchor_launches import anchor_card, anchor_launches
from fa2patch.model.ranges import route_ranges, spread
from fa2patch.model.v100model import Calibration, load_data, load_v100, peak_tflops, route_timer

MODEL = Calibration()  # the model itself


def measured(anchor: dict) -> tuple[float, str]:
    """What was published, in its unit: ms (less ``excluded_ms``, a part of the measurement that
    is another kernel, measured separately) or TFLOP/s."""
    if anchor["workload"]["kind"] == "tensor-peak":
        return anchor["measured_tflops"], "TFLOP/s"
    if "measured_us" in anchor:  # Nsight Compute prints kernel durations in us
        return anchor["measured_us"] / 1e3, "ms"
    return anchor["measured_ms"] - anchor.get("excluded_ms", 0.0), "ms"


def anchor_timer(anchor: dict, kernels: dict, v100: dict):
    """The anchor's value (ms, or TFLOP/s for a rate anchor) as a function of a Calibration. A rate
    anchor (a well-tiled GEMM, tensor-bound, several warps per scheduler) keeps the tensor pipe busy
    1 / cycle_factor of the time, at the clock that duty allows. A user's anchor (kind "route",
    user_anchors.py) carries its launches, its card and the clock measured during its calls."""
    card = anchor_card(anchor, v100)
    work = anchor["workload"]
    if work["kind"] == "tensor-peak":

        def rate(cal: Calibration) -> float:
            duty = 1.0 / cal.cycle_factor
            return peak_tflops(card, card.clock_at(duty, v100), v100) * duty

        return rate
    if work["kind"] == "route":
        return route_timer(work["launches"], card, v100, work["clock_mhz"])
    timer = route_timer(anchor_launches(anchor, kernels), card, v100)
    nodes_ms = work.get("graph_nodes", 0) * load_data("anchors.toml")["graph_node"]["us"] / 1e3
    if not nodes_ms:
        return timer

    def with_nodes(cal: Calibration = MODEL) -> float:
        return timer(cal) + nodes_ms

    return with_nodes


def estimate(anchor: dict, kernels: dict, v100: dict, cal: Calibration) -> float:
    """The anchor's value as the model with ``cal`` estimates it (``anchor_timer``)."""
    return anchor_timer(anchor, kernels, v100)(cal)


def log_error(anchor: dict, value: float) -> float:
    """log of how much slower the kernel ran than estimated (> 0: slower)."""
    real, unit = measured(anchor)
    return math.log(value / real) if unit == "TFLOP/s" else math.log(real / value)


START = (0.0, 1.0, 0.0)  # log cycle_factor, cta_cycles / 10^4, log(DRAM latency / the pointer chase's)


def fit(
    anchors: list[dict],
    kernels: dict,
    v100: dict,
    timers: list | None = None,
    start: tuple = START,
    cta_free: bool = True,
    latency_free: bool | None = None,
) -> Calibration:
    """Least squares of log(measured / estimate) over ``anchors`` (Nelder-Mead from ``start`` on log
    cycle_factor, cta_cycles / 10^4 >= 0 where ``cta_free``, and log of the DRAM latency over the
    pointer chase's where ``latency_free``, by default where an anchor streams from DRAM; a
    parameter not free keeps the model's value: cta_cycles 0, the measured latency). ``timers``:
    the anchors' ``anchor_timer``s, where already made."""
    timers = timers or [anchor_timer(a, kernels, v100) for a in anchors]
    if latency_free is None:
        latency_free = any(has_streams(a, kernels) for a in anchors)
    free = [0] + [1] * cta_free + [2] * latency_free
    steps = (0.2, 2.0, 0.2)

    def cal_of(y):
        x = [start[0], 0.0, 0.0]
        for i, v in zip(free, y, strict=True):
            x[i] = v
        latency = memory.latency_ns() * math.exp(x[2]) if latency_free else None
        return Calibration(math.exp(x[0]), max(0.0, x[1]) * 1e4, latency), x[1]

    def cost(y):
        cal, cta = cal_of(y)
        return sum(log_error(a, t(cal)) ** 2 for a, t in zip(anchors, timers, strict=True)) + max(0.0, -cta) ** 2

    return cal_of(nelder_mead(cost, [start[i] for i in free], [steps[i] for i in free]))[0]


def has_streams(anchor: dict, kernels: dict) -> bool:
    """Whether the anchor's measurement holds a launch that streams from DRAM (the DRAM latency applies)."""
    work = anchor["workload"]
    if work["kind"] == "route":
        return any(x.streams for x in work["launches"])
    return kernels.get(anchor.get("kernel"), {}).get("streams", False)


def parameters_of(cal: Calibration) -> dict:
    return {
        "cycle_factor": cal.cycle_factor,
        "cta_cycles": cal.cta_cycles,
        "dram_latency_ns": cal.dram_latency_ns or memory.latency_ns(),
    }


def anchor_class(anchor: dict, kernels: dict) -> str:
    """The kernel class an anchor measures: its kernels' ``class``, a rate anchor's own, or for a
    user's anchor fa2patch's route."""
    work = anchor["workload"]
    if "class" in anchor:
        return anchor["class"]
    if work["kind"] == "route":
        return f"fa2patch {anchor.get('route', '?')}"
    return kernels[anchor.get("kernel") or work["qk_kernel"]]["class"]


def has_fused(anchor: dict) -> bool:
    """Whether the anchor's measurement holds a fused attention kernel (cta_cycles applies)."""
    work = anchor["workload"]
    return work["kind"] == "fa2-forward" or (work["kind"] == "route" and any(x.fused for x in work["launches"]))


def leave_kernel_out(anchors: list[dict], kernels: dict, v100: dict, timers: list, start) -> list[dict]:
    """Per kernel class: the fit without its anchors and its anchors' residuals under that fit
    (None where no other class remains). {class, anchors (indices), parameters, cta_identified,
    residuals}."""
    classes: dict[str, list[int]] = {}
    for i, a in enumerate(anchors):
        classes.setdefault(anchor_class(a, kernels), []).append(i)
    out = []
    for name, members in classes.items():
        rest = [i for i in range(len(anchors)) if i not in members]
        identified = any(has_fused(anchors[i]) for i in rest)
        latency = any(has_streams(anchors[i], kernels) for i in rest)
        cal = (
            fit([anchors[i] for i in rest], kernels, v100, [timers[i] for i in rest], start, identified, latency)
            if rest
            else None
        )
        out.append(
            {
                "class": name,
                "anchors": members,
                "parameters": cal and parameters_of(cal),
                "cta_identified": identified,
                "latency_identified": latency,
                "residuals": [cal and math.expm1(log_error(anchors[i], timers[i](cal))) for i in members],
            }
        )
    return out


def nelder_mead(f, x0: list[float], step: list[float], tol: float = 1e-7, iterations: int = 400) -> list[float]:
    """Minimise ``f`` from ``x0`` (the standard reflection / expansion / contraction / shrink)."""
    points = [list(x0)] + [[x + (s if i == j else 0.0) for j, x in enumerate(x0)] for i, s in enumerate(step)]
    values = [f(p) for p in points]
    for _ in range(iterations):
        order = sorted(range(len(points)), key=values.__getitem__)
        points, values = [points[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tol:
            break
        centre = [sum(c) / (len(points) - 1) for c in zip(*points[:-1], strict=True)]
        worst = points[-1]
        reflected = _toward(centre, worst, -1.0)
        fr = f(reflected)
        if fr < values[0]:
            expanded = _toward(centre, worst, -2.0)
            fe = f(expanded)
            points[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            points[-1], values[-1] = reflected, fr
        else:
            inner = _toward(centre, worst, 0.5)
            fi = f(inner)
            if fi < values[-1]:
                points[-1], values[-1] = inner, fi
            else:
                points = [points[0]] + [
                    [b + 0.5 * (p - b) for b, p in zip(points[0], q, strict=True)] for q in points[1:]
                ]
                values = [values[0]] + [f(p) for p in points[1:]]
    return points[min(range(len(points)), key=values.__getitem__)]


def _toward(centre: list[float], worst: list[float], t: float) -> list[float]:
    """The point ``t`` of the way from ``centre`` to ``worst`` (t < 0: beyond the centre, away from it)."""
    return [c + t * (w - c) for c, w in zip(centre, worst, strict=True)]


_CACHE: dict = {}


def calibrate(v100: dict | None = None, data: dict | None = None, user: Sequence[dict] = ()) -> dict:
    """The fitted parameters, each anchor (source, measured, model, calibrated, residual,
    leave-one-out residual) and the range rule. Refitted on every run (cached for the default
    data within one process). ``user``: anchors from users' bench files (user_anchors.py), fitted
    together with the published ones, each fit starting from the published anchors' parameters;
    ``within_targets`` judges the published anchors (issue 15's targets), the range all of them."""
    key = None if v100 is None and data is None and not user else id(data)
    if key is None and None in _CACHE:
        return _CACHE[None]
    v100 = v100 or load_v100()
    data = data or load_data("anchors.toml")
    kernels = {k["name"]: k for k in data["kernel"]}
    anchors = list(data["anchor"]) + list(user)
    timers = [anchor_timer(a, kernels, v100) for a in anchors]
    start = START
    if user:  # the published anchors' fit: a start near the answer (fewer steps for every fit)
        published = fit(anchors[: len(data["anchor"])], kernels, v100, timers[: len(data["anchor"])])
        start = (
            math.log(published.cycle_factor),
            published.cta_cycles / 1e4,
            math.log((published.dram_latency_ns or memory.latency_ns()) / memory.latency_ns()),
        )
    cal = fit(anchors, kernels, v100, timers, start)
    by_class = leave_kernel_out(anchors, kernels, v100, timers, start)
    loko = {i: (c["class"], r) for c in by_class for i, r in zip(c["anchors"], c["residuals"], strict=True)}
    rows = []
    for i, a in enumerate(anchors):
        real, unit = measured(a)
        timer = timers[i]
        loo = fit(anchors[:i] + anchors[i + 1 :], kernels, v100, timers[:i] + timers[i + 1 :], start)
        rows.append(
            {
                "name": a["name"],
                "kind": a.get("kind", "published"),
                "source": a["source"],
                "unit": unit,
                "measured": real,
                "card": a["card"],
                "model": timer(Calibration()),
                "calibrated": timer(cal),
                "residual": math.expm1(log_error(a, timer(cal))),
                "loo_residual": math.expm1(log_error(a, timer(loo))),
                "loo_parameters": parameters_of(loo),
                "class": loko[i][0],
                "loko_residual": loko[i][1],
                "outlier": a.get("outlier"),
                **{k: a[k] for k in USER_FIELDS if k in a},
            }
        )
    targets = {"residual": 0.10, "loo": 0.10, "loko": 0.15} | data.get("targets", {})
    held = [r for r in rows if not r["outlier"] and r["kind"] == "published"]
    loo_range = spread(r["loo_residual"] for r in rows)
    loko_range = spread(r["loko_residual"] for r in rows)
    classes = [
        {
            "class": c["class"],
            "anchors": [rows[i]["name"] for i in c["anchors"]],
            "parameters": c["parameters"],
            "cta_identified": c["cta_identified"],
            "latency_identified": c["latency_identified"],
            "loko_range": spread(c["residuals"]),
            # The range of an estimate of this class: its own held-out residuals and every anchor's
            # leave-one-out residual.
            "range": spread([*loo_range, *c["residuals"]]),
        }
        for c in by_class
    ]
    out = {
        "parameters": parameters_of(cal),
        "anchors": rows,
        "classes": classes,
        "targets": targets,
        "residual_range": spread(r["residual"] for r in rows),
        "loo_range": loo_range,
        "loko_range": loko_range,
        "range": [min(loo_range[0], loko_range[0]), max(loo_range[1], loko_range[1])],
        "route_class": data.get("route_class", {}),
        "route_ranges": route_ranges(data.get("route_class", {}), classes),
        "within_targets": all(
            abs(r["residual"]) <= targets["residual"] and abs(r["loo_residual"]) <= targets["loo"] for r in held
        ),
        "loko_within_target": loko_within(rows, targets["loko"]),
        "range_rule": "point x (1 + smallest) .. (1 + largest) of every anchor's leave-one-out residual and "
        "the leave-one-kernel-out residuals of the route's kernel class (anchors.toml [route_class]; a "
        "route of no class: every class's)",
    }
    if key is None:
        _CACHE[None] = out
    return out


def loko_within(rows: list[dict], target: float) -> bool:
    """Whether every published anchor (not an outlier) of a class of two or more such anchors has a
    leave-one-kernel-out residual within ``target``."""
    held = [r for r in rows if not r["outlier"] and r["kind"] == "published"]
    sizes = {c: sum(r["class"] == c for r in held) for c in {r["class"] for r in held}}
    return all(abs(r["loko_residual"]) <= target for r in held if sizes[r["class"]] >= 2)


USER_FIELDS = ("file", "shape", "label", "route", "clock_mhz", "clock_source", "throttled")


def header_text(calibration: dict) -> str:
    """One paragraph: the fitted parameters, the anchors' residuals, each kernel class's
    leave-one-kernel-out residuals and the range rule."""
    p, (lo, hi), (llo, lhi) = calibration["parameters"], calibration["residual_range"], calibration["loo_range"]
    rlo, rhi = calibration["range"]
    classes = "; ".join(class_text(c) for c in calibration["classes"])
    routes = ", ".join(f"{r} {lo:+.1%} .. {hi:+.1%}" for r, (lo, hi) in calibration.get("route_ranges", {}).items())
    target = calibration["targets"]["loko"]
    held = "held" if calibration["loko_within_target"] else "NOT held"
    return (
        f"calibrated: the model with cycle factor {p['cycle_factor']:.3f}, {p['cta_cycles']:,.0f} cycles per "
        f"fused-attention CTA and a DRAM latency of {p['dram_latency_ns']:.0f} ns for streaming loads, fitted to "
        f"{len(calibration['anchors'])} anchors (residuals {lo:+.1%} .. {hi:+.1%}, "
        f"leave-one-out {llo:+.1%} .. {lhi:+.1%}); leave-one-kernel-out by class: {classes} (target "
        f"+-{target:.0%} for a class of two anchors or more: {held}); range: the point x (1 + the smallest) .. "
        f"(1 + the largest) of every anchor's leave-one-out residual and the leave-one-kernel-out residuals of "
        f"the route's kernel class ({routes}; any other route: {rlo:+.1%} .. {rhi:+.1%}), how far off the model was "
        f"on each anchor or kernel class it was not fitted to; two routes are separated where their ranges do "
        f"not overlap."
    )


def class_text(c: dict) -> str:
    """ "split-D (11 anchors) -5.8% .. +40.3%, cycles per CTA not identified without it (0)"."""
    n = len(c["anchors"])
    if c["parameters"] is None:
        return f"{c['class']} ({n} anchors) no other class to fit"
    lo, hi = c["loko_range"]
    text = f"{c['class']} ({n} anchor{'s' * (n > 1)}) {lo:+.1%} .. {hi:+.1%}"
    if not c["cta_identified"]:
        text += ", cycles per CTA not identified without it (0)"
    if not c.get("latency_identified", True):
        text += f", DRAM latency not identified without it (the pointer chase's {memory.latency_ns():.0f} ns)"
    return text
