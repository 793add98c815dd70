# SPDX-License-Identifier: BSD-3-Clause
"""report: a static V100 performance report of the SM70 kernels, read from the sm_70 cubin.

Per kernel (``kernel_rows``): registers, stack and local-memory bytes (``cuobjdump
--dump-resource-usage``; spill counts are `verify`'s), static and dynamic shared memory, and
occupancy from the launch configuration that the extension's ``build_info()`` declares (or
``--launch``). Per hot loop (an outermost loop with HMMA): its mix per warp-iteration and its
cycles (sass_mix.loop_row), the binding resource and the implied tensor-utilization and TFLOP/s
ceilings. The kernels' geometry (``route``, ``head_dim``, ``rows_per_cta``, ``keys_per_iteration``,
``warps``, the long-prefill kernel's ``tiles``) comes from build_info() (``route_geometry``), never
restated here.

``predict_routes`` (``report --shapes``): per problem shape the exact route (exact_route.py: the
forward kernel's grid, FA2's decode split and its combine), where its op takes the shape the
long-prefill route (gqa_route.py: its launches from the plan the extension itself runs, read with
``gqa_prefill_plan`` in the same subprocess as build_info()), and the exact route with split-KV at
each of ``splits``, and where the decode kernel takes the shape that route (decode_route.py); per
route on a ``Card`` (80 or 72 SMs, a clock) a lower bound (pipes only, at the card's clock), the
model's time and the calibrated estimate with its range, the calibration refitted to the anchors
on every run (calibration.calibrate). report_text.py renders it.

Another route's time is the sum of its launches, one ``v100model.KernelLaunch`` each, timed by
``route_estimate``: docs/report-model.md ("Estimating another route") describes them and the model.
"""

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from fa2patch.common import routes
from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.shapes import Shape, useful_flops
from fa2patch.compile import sass, toolchain
from fa2patch.compile.extension import launches_of
from fa2patch.model import decode_route, gqa_route
from fa2patch.model.calibration import calibrate
from fa2patch.model.exact_route import COMBINE_KERNEL, combine_bytes, decode_splits, dense_launches, splitkv_launches
from fa2patch.model.ranges import held_out_parameters, versus, versus_one_kernel, with_range
from fa2patch.model.sass_mix import combine_row, loop_row, outside_row, tile_code
from fa2patch.model.v100model import (
    Calibration,
    Card,
    KernelLaunch,
    estimate_route,
    load_v100,
    lower_bound,
    occupancy,
    peak_tflops,
    route_timer,
)

GEOMETRY = ("head_dim", "rows_per_cta", "keys_per_iteration", "warps")
TILE_FIELDS = ("rows_per_cta", "keys_per_iteration", "head_dims_per_iteration")


def route_geometry(build_info: dict, artifact: Path, route: str = routes.EXACT) -> list[dict]:
    """A route's kernels with their geometry, from build_info()["kernels"]; an error naming what
    is missing when the build does not declare it (report never guesses). The long-prefill
    route's kernel also declares its tiles (qk, pv)."""
    if "error" in build_info:
        raise EnvironmentProblem(f"{artifact}: cannot load it for build_info(): {build_info['error']}")
    kernels = [k for k in build_info.get("kernels", []) if k.get("route") == route]
    if not kernels:
        fields = sorted({f for k in build_info.get("kernels", []) for f in k})
        raise EnvironmentProblem(
            f"{artifact}: build_info() declares no kernel of route {route}: its kernel entries have the fields "
            f"{', '.join(fields) or 'none'}; report needs route, {', '.join(GEOMETRY)} on each attention kernel "
            f"(rebuild from a patch series whose build_info() exports the kernel geometry)"
        )
    for k in kernels:
        missing = [f for f in GEOMETRY if not isinstance(k.get(f), int)]
        if route == routes.GQA:
            kinds = {t.get("kind"): t for t in k.get("tiles", [])}
            missing += [
                f"tiles[{kind}].{f}"
                for kind in ("qk", "pv")
                for f in TILE_FIELDS
                if not isinstance(kinds.get(kind, {}).get(f), int)
            ]
        if missing:
            raise EnvironmentProblem(
                f"{artifact}: build_info() kernel {k.get('kernel')!r} of route {route} lacks "
                f"{', '.join(missing)} (expected integers; got {k})"
            )
        if k.get("threads") != 32 * k["warps"]:
            raise EnvironmentProblem(
                f"{artifact}: build_info() kernel {k['kernel']!r}: threads expected "
                f"32 x warps = {32 * k['warps']}, actual {k.get('threads')}"
            )
    return sorted(kernels, key=lambda k: k["head_dim"])


def kernel_rows(
    artifact: Path, arch: str, launch: dict[str, tuple[int, int]], geometry: list[dict] | None = None
) -> list[dict]:
    """Per kernel of ``arch`` in ``artifact``: resources, occupancy and hot loops. ``launch`` maps
    a demangled-name glob to (threads per block, dynamic shared bytes); a tensor-core kernel
    without one is an error. ``geometry``: the route kernels' geometry (``route_geometry``): a
    kernel with one is charged its code outside the hot loops (per kind of tile where it has tiles)."""
    tool = toolchain.find_cuda12_binutil("cuobjdump")
    if tool is None:
        raise EnvironmentProblem(f"cuobjdump: not found\n  install: {toolchain.PIP_BUILD}")
    v100 = load_v100()
    res = {
        r.name: r
        for r in sass.parse_resource_usage(toolchain.cuobjdump(tool, ["--dump-resource-usage"], artifact))
        if r.arch == arch
    }
    functions = [f for f in sass.parse_sass(toolchain.cuobjdump(tool, ["-sass"], artifact)) if f.arch == arch]
    pretty = toolchain.demangle([f.name for f in functions])
    out, unlaunched = [], []
    for f in functions:
        r = res.get(f.name)
        name = pretty[f.name]
        threads, dynamic = sass.first_match(name, launch, (None, 0))
        if threads is None and f.hmma:
            unlaunched.append(name)
            continue
        occ = occupancy(r.registers, r.shared + dynamic, threads, v100) if r and threads else None
        w = max(1, occ["warps_per_sm"] // v100["subpartitions_per_sm"]) if occ else 1
        geo = next((g for g in geometry or [] if sass.kernel_matches(name, sass.name_part_glob(g["kernel"]))), None)
        cta_w = -(-threads // (32 * v100["subpartitions_per_sm"])) if threads else w  # one CTA's warps per scheduler
        hot = [loop_row(lp, v100, w, cta_w) for lp in f.hot_loops()]
        outside = None
        if geo and "tiles" in geo:  # one kernel, several kinds of tile
            for row, code in zip(hot, tile_code(f, sorted(f.hot_loops(), key=lambda lp: lp.start)), strict=True):
                row["outside"] = outside_row(code, cta_w, v100)
        elif geo and hot:  # one kind of CTA: everything outside its hot loops runs once
            inside = {i.addr for lp in f.hot_loops() for i in lp.instrs}
            outside = outside_row([i for i in f.instrs if i.addr not in inside], cta_w, v100)
        combine = decode = None
        if occ and sass.kernel_matches(name, sass.name_part_glob(COMBINE_KERNEL)):  # split-KV's combine
            combine = combine_row(f, threads, occ["blocks_per_sm"], w, cta_w, v100)
        inst = decode_route.instantiation(name)
        if occ and inst and (keys := decode_route.key_loop(f, *inst)):  # the decode kernel: no HMMA
            decode = {
                "loop": loop_row(keys, v100, w, cta_w),
                "outside": outside_row(decode_route.outside(f), cta_w, v100),
            }
        out.append(
            {
                "kernel": name,
                "registers": r.registers if r else None,
                "stack": r.stack if r else None,
                "static_shared": r.shared if r else None,
                "dynamic_shared": dynamic,
                "local": r.local if r else None,
                "occupancy": occ,
                "warps_per_subpartition": w,
                "hmma_total": f.hmma,
                "geometry": geo,
                "hot_loops": hot,
                "outside": outside,
                **({"combine": combine} if combine else {}),
                **({"decode": decode} if decode else {}),
            }
        )
    if unlaunched:
        raise EnvironmentProblem(
            f"{artifact}: no launch configuration (threads, dynamic shared memory) for the "
            f"tensor-core kernel(s) {', '.join(unlaunched)}: build_info() does not declare "
            f"them and no --launch matches"
        )
    return out


def route_estimate(
    launches: list[KernelLaunch], card: Card, v100: dict, calibration: dict, route: str | None = None
) -> dict:
    """Bound, model and calibrated time of a route made of ``launches`` (run one after another, at
    the clock the route's tensor duty allows); the calibrated time with the range of ``route``'s
    kernel class (ranges.with_range). ``calibration``: calibrate()'s result.
    Per launch: the model's details, its calibrated time with its range and what limits it once
    calibrated."""
    model = estimate_route(launches, card, v100)
    cal = estimate_route(launches, card, v100, Calibration(**calibration["parameters"]))
    details = [
        {
            **m,
            **with_range(c["ms"], calibration, route),
            "calibrated_clock_mhz": c["clock_mhz"],
            "limited_by": c["limited_by"],
            "bound": lower_bound(x, card, v100),
        }
        for x, m, c in zip(launches, model["launches"], cal["launches"], strict=True)
    ]
    return {
        "launches": details,
        "bound_ms": sum(x["bound"]["ms"] for x in details),
        "model_ms": model["ms"],
        "tensor_duty": cal["tensor_duty"],
        "clock_mhz": cal["clock_mhz"],
        **with_range(cal["ms"], calibration, route),
    }


def dense_kernel(shape: Shape, kernels: list[dict], artifact: Path) -> dict:
    """The sm70-dense kernel for the shape's head dim (the smallest head_dim >= d)."""
    route = [k for k in kernels if (k.get("geometry") or {}).get("route") == routes.EXACT]
    kernel = next(
        (k for k in sorted(route, key=lambda k: k["geometry"]["head_dim"]) if k["geometry"]["head_dim"] >= shape.d),
        None,
    )
    if kernel is None or shape.d % 8:
        dims = [k["geometry"]["head_dim"] for k in route]
        raise EnvironmentProblem(
            f"--shapes: d={shape.d}: {artifact} builds route {routes.EXACT} for head dims "
            f"that are multiples of 8 up to {max(dims, default=0)} (kernels: {dims})"
        )
    return kernel


def predict(shape: Shape, kernels: list[dict], card: Card, v100: dict, calibration: dict, artifact: Path) -> dict:
    """The sm70-dense route on ``card`` for ``shape``. ``kernels``: report rows (with geometry)."""
    kernel = dense_kernel(shape, kernels, artifact)
    launches, plan = dense_launches(shape, kernel, card)
    return prediction(shape, routes.EXACT, kernel, plan, launches, card, v100, calibration)


def predict_split(
    shape: Shape, kernels: list[dict], card: Card, v100: dict, calibration: dict, artifact: Path, splits: int
) -> dict | None:
    """The exact route with ``splits``-way split-KV (exact_route.splitkv_launches), or None where
    routing cannot split the call (fewer than two query rows: decode keeps FA2's own split) or the
    build has no combine kernel."""
    combine = next((k["combine"] for k in kernels if "combine" in k), None)
    if shape.q < 2 or shape.kv < 1 or combine is None:
        return None
    kernel = dense_kernel(shape, kernels, artifact)
    launches, plan = splitkv_launches(shape, kernel, combine, splits)
    return prediction(shape, routes.SPLITKV, kernel, plan, launches, card, v100, calibration)


def gqa_kernel_and_plan(shape: Shape, kernels: list[dict], plans: dict, artifact: Path) -> tuple[dict, dict] | None:
    """The long-prefill kernel and the op's plan for ``shape`` (``plans``: gqa_prefill_plan's
    answers by gqa_route.sizes), or None where the build has no such kernel or the op does not take
    the shape (outside its interface, or refused by the op: e.g. a larger group than it supports)."""
    kernel = next((k for k in kernels if (k.get("geometry") or {}).get("route") == routes.GQA), None)
    if kernel is None or not gqa_route.eligible(shape, kernel["geometry"]):
        return None
    plan = plans.get(gqa_route.sizes(shape))
    if plan is None or ("error" in plan and not plan.get("refused")):
        why = plan["error"] if plan else "not read"
        raise EnvironmentProblem(f"{artifact}: no long-prefill plan for {shape.label}: {why}")
    return None if plan.get("refused") else (kernel, plan)


def predict_gqa(
    shape: Shape, kernels: list[dict], card: Card, v100: dict, calibration: dict, plans: dict, artifact: Path
) -> dict | None:
    """The sm70-gqa-prefill route on ``card`` for ``shape`` (``gqa_kernel_and_plan``), or None."""
    found = gqa_kernel_and_plan(shape, kernels, plans, artifact)
    if found is None:
        return None
    kernel, op_plan = found
    launches, plan = gqa_route.launches(shape, kernel, op_plan)
    p = prediction(shape, routes.GQA, kernel, plan, launches, card, v100, calibration)
    return {**p, "binding_per_loop": {name: lp["binding"] for name, lp in gqa_route.tile_loops(kernel).items()}}


def decode_launches(shape: Shape, kernel: dict, sms: int) -> tuple[list, dict]:
    """The decode kernel's launches on ``sms`` SMs and its plan (decode_route.launch): split over its
    CTAs, 16-key blocks and slots by routing's one-wave rule under FA2's swap (grouped heads; other
    calls run unsplit), then the combine, charged its bytes, where split."""
    slots = sms * kernel["occupancy"]["blocks_per_sm"]
    grouped = shape.hq > shape.hkv
    n = decode_splits(decode_route.ctas(shape), shape.kv, decode_route.SPLIT_KEYS, slots) if grouped else 1
    forward, plan = decode_route.launch(shape, kernel, n)
    return ([forward, combine_bytes(plan["combine_bytes"])] if n > 1 else [forward]), plan


def predict_decode(shape: Shape, kernels: list[dict], card: Card, v100: dict, calibration: dict) -> dict | None:
    """The decode kernel (sm70-decode: FA2PATCH_SM70_DECODE=1, or routing's rule) where it can take ``shape``."""
    kernel = decode_route.kernel_for(shape, kernels)
    if kernel is None:
        return None
    launches, plan = decode_launches(shape, kernel, card.sms)
    return prediction(shape, routes.DECODE, kernel, plan, launches, card, v100, calibration)


# A batch of a prefill chunk and decode rows as fa2patch's V100 backend for vLLM runs it (README
# "Under load"): the chunk alone on the long-prefill route, the decode rows together in one call on
# the kernel routing gives it (the decode kernel where its rule takes the rows, else the exact route).
PER_REQUEST = "v100-backend"


def predict_per_request(
    shape: Shape, kernels: list[dict], card: Card, v100: dict, calibration: dict, plans: dict, artifact: Path
) -> dict | None:
    """``shape`` with decode rows (``decode=N``) as the V100 backend splits it (PER_REQUEST), or None
    where the long-prefill op does not take its chunk (the backend then makes vLLM's one call)."""
    if not shape.decode:
        return None
    chunk = replace(shape, decode=0, decode_kv=0)
    found = gqa_kernel_and_plan(chunk, kernels, plans, artifact)
    if found is None:
        return None
    kernel, op_plan = found
    launches, plan = gqa_route.launches(chunk, kernel, op_plan)
    decodes = replace(shape, q=1, kv=shape.dkv, b=shape.decode, decode=0, decode_kv=0)
    dense_row, decode_row = dense_kernel(decodes, kernels, artifact), decode_route.kernel_for(decodes, kernels)
    if decode_row and decode_route.rule_takes(decodes, card.sms * dense_row["occupancy"]["blocks_per_sm"]):
        rows_launches, rows_plan = decode_launches(decodes, decode_row, card.sms)
    else:
        rows_launches, rows_plan = dense_launches(decodes, dense_row, card)
    both = {"chunk": plan, "decodes": rows_plan}
    return prediction(shape, PER_REQUEST, kernel, both, launches + rows_launches, card, v100, calibration)


def prediction(
    shape: Shape,
    route: str,
    kernel: dict,
    plan: dict,
    launches: list[KernelLaunch],
    card: Card,
    v100: dict,
    calibration: dict,
) -> dict:
    est = route_estimate(launches, card, v100, calibration, route)
    flops = useful_flops(shape)
    tflops = lambda ms: flops / (ms * 1e-3) / 1e12 if ms else None  # noqa: E731
    # The calibrated floor of any tensor-core kernel: the useful FLOPs alone with the tensor pipes
    # busy every modelled cycle, so 1 / cycle_factor of the calibrated ones (the duty the clock rule
    # sees), at the clock that duty allows under the 300 W cap: the cuBLAS rate anchor's own formula
    # (calibration.anchor_timer). A route at its floor has nothing left to gain on this model.
    duty = 1 / calibration["parameters"]["cycle_factor"]
    floor_tflops = peak_tflops(card, card.clock_at(duty, v100), v100) * duty
    return {
        "label": shape.label,
        "route": route,
        "kernel": (kernel.get("geometry") or {}).get("kernel", kernel["kernel"]),
        "plan": plan,
        "card": {"sms": card.sms, "clock_mhz": card.clock_mhz, "dram_gbs": card.dram_gbs},
        "useful_flops": flops,
        **est,
        "tflops_upper_bound": tflops(est["bound_ms"]),
        "calibrated_tflops": tflops(est["calibrated_ms"]),
        "calibrated_tflops_low": tflops(est["calibrated_ms_high"]),
        "calibrated_tflops_high": tflops(est["calibrated_ms_low"]),
        "hbm_limited_launches": sum(x["limited_by"] == "hbm" for x in est["launches"]),
        "floor_ms": flops / (floor_tflops * 1e12) * 1e3,
        "floor_tflops": floor_tflops,
    }


def predict_routes(
    shape: Shape,
    rows: list[dict],
    card: Card,
    v100: dict,
    calibration: dict,
    artifact: Path,
    splits: tuple = (),
    gqa_plans: dict | None = None,
) -> list[dict]:
    """The sm70-dense prediction; where the long-prefill op takes the shape, its own with the
    ratio of the dense route's calibrated time to it (``vs_dense``) and whether their ranges
    separate (``vs_dense_verdict``: "faster", "slower" or "not separated"); and for each of
    ``splits`` the exact route with split-KV, with ``vs_dense`` (against the unsplit exact route)
    and, where the long-prefill op takes the shape, ``vs_gqa``. ``gqa_plans``: the op's plans
    (``gqa_route.read_plans``), needed where the build has the long-prefill kernel and its op may take
    the shape."""
    dense = predict(shape, rows, card, v100, calibration, artifact)
    gqa = predict_gqa(shape, rows, card, v100, calibration, gqa_plans or {}, artifact)
    out = [dense] + ([{**gqa, **versus(gqa, dense, "vs_dense")}] if gqa else [])
    kernel = dense_kernel(shape, rows, artifact)
    decode = predict_decode(shape, rows, card, v100, calibration)
    if decode is not None:  # builtin_rule: whether routing sends it there with FA2PATCH_SM70_DECODE unset
        rule = decode_route.rule_takes(shape, card.sms * kernel["occupancy"]["blocks_per_sm"])
        out.append({**decode, **versus(decode, dense, "vs_dense"), "builtin_rule": rule})
    split_batch = predict_per_request(shape, rows, card, v100, calibration, gqa_plans or {}, artifact)
    if split_batch is not None:
        out.append({**split_batch, **versus(split_batch, dense, "vs_dense")})
    # Split and unsplit are one kernel: their ratio under every held-out fit (ranges.versus_one_kernel).
    sets = [Calibration(**x) for x in held_out_parameters(calibration)]
    theirs = route_timer(dense_launches(shape, kernel, card)[0], card, v100)
    for n in splits:
        split = predict_split(shape, rows, card, v100, calibration, artifact, n)
        if split is not None:
            combine = next(k["combine"] for k in rows if "combine" in k)
            mine = route_timer(splitkv_launches(shape, kernel, combine, n)[0], card, v100)
            out.append(
                {
                    **split,
                    **versus_one_kernel(split, dense, "vs_dense", [theirs(c) / mine(c) for c in sets], calibration),
                    **(versus(split, gqa, "vs_gqa") if gqa else {}),
                }
            )
    return out


def route_launches(
    shape: Shape, rows: list[dict], route: str, card: Card, artifact: Path, gqa_plans: dict | None = None
) -> list[KernelLaunch]:
    """The launches of ``route`` for a shape on a card: what a user's bench case measured (user_anchors.py)."""
    if route == routes.EXACT:
        return dense_launches(shape, dense_kernel(shape, rows, artifact), card)[0]
    if route == routes.DECODE and (kernel := decode_route.kernel_for(shape, rows)):
        return decode_launches(shape, kernel, card.sms)[0]
    found = gqa_kernel_and_plan(shape, rows, gqa_plans or {}, artifact) if route == routes.GQA else None
    if found is not None:
        return gqa_route.launches(shape, *found)[0]
    raise EnvironmentProblem(f"{artifact}: no model of route {route!r} for {shape.label}")


def report(
    artifact: Path,
    arch: str,
    launch: dict[str, tuple[int, int]],
    shapes: list[Shape],
    card: Card,
    splits: tuple = (2, 3, 4),
    anchors: Sequence[Path] = (),
) -> dict:
    """The whole report: kernel rows and, for ``shapes``, predictions with their calibration (split-KV
    at each of ``splits`` on prefill shapes). ``anchors``: users' bench files joining the calibration
    (user_anchors.py; ``anchor_fit``: how the fit moved). ``launch`` (--launch) replaces build_info()'s
    launch configurations; build_info() must load unless it does, and declare the geometry for shapes."""
    from fa2patch.model import user_anchors

    info, plans = gqa_route.read_plans(artifact, shapes)
    if "error" in info and (shapes or anchors or not launch):
        raise EnvironmentProblem(f"{artifact}: cannot load it for build_info(): {info['error']}")
    declared = {k.get("route") for k in info.get("kernels", [])}
    geometry = route_geometry(info, artifact) if shapes or anchors or routes.EXACT in declared else None
    if geometry is not None and routes.GQA in declared:
        geometry += route_geometry(info, artifact, routes.GQA)
    launch = launch or launches_of(info)
    rows = kernel_rows(artifact, arch, launch, geometry)
    out: dict[str, Any] = {"arch": arch, "kernels": rows}
    if shapes or anchors:
        v100 = load_v100()
        calibration = calibrate(v100)
        if anchors:
            plans = gqa_route.read_plans(artifact, user_anchors.shapes_of(anchors), plans)[1]
            user, skipped = user_anchors.load(anchors, lambda s, r, c: route_launches(s, rows, r, c, artifact, plans))
            before, calibration = calibration, calibrate(v100, None, user) if user else calibration
            out["anchor_fit"] = user_anchors.movement(before, calibration, anchors, skipped)
        out.update(
            card={"sms": card.sms, "clock_mhz": card.clock_mhz, "dram_gbs": card.dram_peak(v100)},
            calibration=calibration,
            predictions=[
                p
                for s in shapes
                for p in predict_routes(s, rows, card, v100, calibration, artifact, tuple(splits), plans)
            ],
        )
    return out
