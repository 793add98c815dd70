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
from pathlib import Path

from fa2patch.model import memory
from fa2patch.model.loop_mix import mix_from_data
from fa2patch.model.nelder_mead import nelder_mead
from fa2patch.model.ranges import route_ranges, spread
from fa2patch.model.v100model import (
    Calibration,
    Card,
    KernelLaunch,
    fa2_grid_iterations,
    gemm_launch,
    load_data,
    load_v100,
    peak_tflops,
    route_timer,
)

MODEL = Calibration()  # the model itself


def anchor_card(anchor: dict, v100: dict | None = None) -> Card:
    """The card an anchor ran on: its SMs, its clock and, where the record names the card
    (``card.dram``), that card's DRAM peak (memory.card_peak)."""
    card = anchor["card"]
    peak = memory.card_peak(card["dram"], v100 or load_v100()) if "dram" in card else None
    return Card(card["sms"], card["clock_mhz"], peak)


def kernel_code(kernel: dict) -> dict:
    """A recorded kernel's hot loop, its code outside the loop (run once per CTA) and the
    global-load rounds each CTA waits for before its first iteration (0 where the code outside
    the loop was timed from the SASS: its loads are in it)."""
    if "outside" in kernel:
        return {
            "loop": mix_from_data(kernel["loop"]),
            "epilogue": mix_from_data(kernel["outside"]),
            "prologue_load_rounds": 0,
        }
    return {
        "loop": mix_from_data(kernel["loop"]),
        "epilogue": mix_from_data(kernel.get("epilogue", {})),
        "prologue_load_rounds": kernel.get("prologue_load_rounds", 1),
    }


def kernel_sass(kernel: dict, scratch: Path) -> tuple[Path, str]:
    """Where an anchor kernel's SASS was written when it was compiled (its mix_source's ``sass``: a
    file in the scratch folder, common.project.scratch_dir) and the part of the function name that
    picks its function there."""
    where = kernel["mix_source"]["sass"]
    return scratch / where["file"], where["function"]


def anchor_launches(anchor: dict, kernels: dict) -> list[KernelLaunch]:
    """The launches an anchor's measurement covers, rebuilt from its recorded workload."""
    work = anchor["workload"]
    if work["kind"] == "fa2-forward":
        kernel = kernels[anchor["kernel"]]
        its = fa2_grid_iterations(
            work["q"], work["kv"], work["causal"], kernel["rows_per_cta"], kernel["keys_per_iteration"], work["hq"]
        )
        code = kernel_code(kernel)
        return [
            KernelLaunch(
                anchor["kernel"],
                code["loop"],
                tuple(its),
                kernel["warps"],
                kernel["ctas_per_sm"],
                code["epilogue"],
                code["prologue_load_rounds"],
                fused=True,
            )
        ]
    if work["kind"] == "kv-blocked-gemms":
        qk, pv = kernels[work["qk_kernel"]], kernels[work["pv_kernel"]]
        qk_code, pv_code = kernel_code(qk), kernel_code(pv)
        rows, d = work["q"] * work["hq"] // work["hkv"], work["d"]
        launches = []
        prefix = work["kv"] - work["q"]
        for start in range(0, prefix, work["block_keys"]):
            n = min(work["block_keys"], prefix - start)
            scores = rows * n * 2
            launches.append(
                gemm_launch(
                    work["qk_kernel"],
                    qk_code["loop"],
                    qk,
                    rows,
                    n,
                    d,
                    scores + rows * d * 2 + n * d * 2,
                    qk_code["epilogue"],
                    qk_code["prologue_load_rounds"],
                )
            )
            launches.append(
                gemm_launch(
                    work["pv_kernel"],
                    pv_code["loop"],
                    pv,
                    rows,
                    d,
                    n,
                    scores + n * d * 2,
                    pv_code["epilogue"],
                    pv_code["prologue_load_rounds"],
                )
            )
        return launches
    if work["kind"] == "paged-decode":
        return decode_launches(anchor["kernel"], work, kernels)
    raise ValueError(f"anchor {anchor['name']}: unknown workload kind {work['kind']!r}")


def decode_launches(name: str, work: dict, kernels: dict) -> list[KernelLaunch]:
    """A decode anchor's launches: the partition kernel (one CTA per partition of its keys, one
    iteration per 128-key tile, streaming K and V from DRAM) and, for a whole call, its reducers
    (over the partitions; they read partials just written, from L2)."""
    kernel = kernels[name]
    keys, size = work["keys"], kernel["partition_keys"]
    parts = -(-keys // size)
    tiles = [-(-min(size, keys - p * size) // kernel["keys_per_iteration"]) for p in range(parts)]
    code = kernel_code(kernel)
    group, d = 6, 256  # the anchors' shape: 6 query heads per KV head, head dim 256
    kv_bytes = keys * d * 2 * 2
    partials = parts * group * (d * 2 + 8)  # fp16 partial O, fp32 max and sum per partition and head
    launches = [
        KernelLaunch(
            name,
            code["loop"],
            tuple(tiles),
            kernel["warps"],
            kernel["ctas_per_sm"],
            code["epilogue"],
            code["prologue_load_rounds"],
            hbm_bytes=kv_bytes + partials,
            streams=True,
        )
    ]
    for reducer in work.get("reducers", []):
        r = kernels[reducer]
        rcode = kernel_code(r)
        trips = -(-parts // r["partitions_per_iteration"])
        launches.append(
            KernelLaunch(
                reducer, rcode["loop"], (trips,) * r["ctas"], r["warps"], r["ctas_per_sm"], rcode["epilogue"], 0
            )
        )
    return launches


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
