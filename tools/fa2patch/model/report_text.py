# SPDX-License-Identifier: BSD-3-Clause
"""`fa2patch report`'s text: the kernel table, the routes' table per shape with its calibration
paragraph, and the calibration anchors (user_anchors.render_calibration). ``render`` takes
report.report's result, as ``report --json`` prints it."""

from fa2patch.common import routes
from fa2patch.common.tables import table
from fa2patch.model import memory
from fa2patch.model.ranges import range_text
from fa2patch.model.user_anchors import render_calibration


def render(result: dict) -> str:
    """The report as text: the kernel table; with predictions, the shape table and the anchors."""
    lines = [
        "Static report from the sm_70 SASS (V100 parameters: tools/fa2patch/data/v100.toml); bounds and "
        "model estimates, not measurements. Counts per warp-iteration: every instruction of the loop once "
        "(both sides of a branch)."
    ]
    cells = []
    for k in result["kernels"]:
        occ = k["occupancy"]
        occ_text = f"{occ['blocks_per_sm']} blk, {occ['warps_per_sm']} warps ({occ['limited_by']})" if occ else "-"
        for lp in k["hot_loops"] or [None]:
            serial = lp and (lp["serial_runs"][0]["instructions"] if lp["serial_runs"] else 0)
            cells.append(
                [
                    k["kernel"][:60],
                    k["registers"],
                    occ_text,
                    lp and lp["instructions"],
                    lp and lp["mix"].get("hmma", 0),
                    lp and f"{lp['shared_passes']:g}",
                    lp and lp["mix"].get("shuffle", 0),
                    lp and lp["load_rounds"],
                    lp and lp["binding"],
                    lp and f"{max(lp['cycles'].values()):.0f}",
                    lp and f"{lp['critical_cycles']:.0f}",
                    serial,
                    lp and f"{lp['tensor_utilization_bound']:.0%}",
                    lp and f"{lp['tflops_bound']:.1f}",
                ]
            )
    lines.append(
        table(
            [[("-" if c is None else c) for c in r] for r in cells],
            [
                "kernel",
                "regs",
                "occupancy",
                "loop instr",
                "HMMA",
                "smem passes",
                "SHFL",
                "load rounds",
                "binding",
                "pipe cycles",
                "CTA iteration cycles",
                "serial run",
                "tensor util <=",
                "TFLOP/s <=",
            ],
        )
    )
    lines.append(
        "pipe cycles: the binding pipe per iteration at the kernel's occupancy (all its warps per "
        "scheduler); CTA iteration cycles: one CTA's iteration with its warps in phase, timed from the SASS "
        "(serial phases, dependency chains, loads waited for); serial run: the longest HMMA-free run of "
        "instructions in the loop."
    )
    if "calibration" not in result:
        return "\n".join(lines)
    cal, card = result["calibration"], result["card"]
    if result["predictions"]:
        lines += [
            "",
            f"Routes on a V100 with {card['sms']} SMs at {card['clock_mhz']:g} MHz and "
            f"{card.get('dram_gbs', 900):g} GB/s of DRAM (useful causal FLOPs). "
            f"bound: pipes only at the peak tensor rate and {card['clock_mhz']:g} MHz (ms >=, TFLOP/s <=). "
            f"model: one CTA's iteration timed from the SASS, prologue/epilogue, dispatch tail and HBM, at the "
            f"clock the route's tensor duty allows under the 300 W cap (MHz). "
            + header_text(cal)
            + " vs dense / vs long-prefill: that route's calibrated time over this one's (> 1: this one is "
            "faster), and whether their ranges separate; split-KV against the unsplit exact route (one kernel) "
            "by their ratio under every held-out fit against the class's leave-one-out margin. (rule): the "
            f"decode kernel takes the call by routing's built-in rule ({routes.DECODE_ENV} unset). JSON floor_ms: "
            "any tensor-core kernel doing the useful FLOPs at full tensor duty.",
        ]
        lines.append(
            table(
                [
                    [
                        p["label"],
                        p["route"] + (" (rule)" if p.get("builtin_rule") else ""),
                        p["plan"].get("splits", 1),
                        f"{p['bound_ms']:.3f}",
                        _num(p["tflops_upper_bound"]),
                        f"{p['model_ms']:.3f}",
                        f"{p['clock_mhz']:.0f}",
                        range_text(p["calibrated_ms"], p["calibrated_ms_low"], p["calibrated_ms_high"]),
                        range_text(p["calibrated_tflops"], p["calibrated_tflops_low"], p["calibrated_tflops_high"], 1),
                        _versus(p, "vs_dense"),
                        _versus(p, "vs_gqa"),
                        _limits(p),
                    ]
                    for p in result["predictions"]
                ],
                [
                    "shape",
                    "route",
                    "splits",
                    "bound ms",
                    "TFLOP/s <=",
                    "model ms",
                    "MHz",
                    "calibrated ms (range)",
                    "calibrated TFLOP/s (range)",
                    "vs dense",
                    "vs long-prefill",
                    "limited by",
                ],
            )
        )
    lines += render_calibration(result)
    return "\n".join(lines)


def _versus(p: dict, key: str) -> str:
    return f"{p[key]:.2f}x, {p[key + '_verdict']}" if key in p else "-"


def _limits(p: dict) -> str:
    """What limits the route: per hot loop its binding pipe; per launch compute or HBM (the
    dense route: "compute" for the first launch, "<kernel> hbm" for the others)."""
    launches = p["launches"]
    if "binding_per_loop" not in p and p["plan"].keys() == {"chunk", "decodes"}:  # report.PER_REQUEST
        hbm = f"hbm binds {p['hbm_limited_launches']} of {len(launches)} launches"
        return f"the chunk on {routes.GQA}, the decode rows on {routes.EXACT}; {hbm}"
    if p["route"] == routes.GQA:
        loops = ", ".join(f"{name} {pipe}" for name, pipe in p["binding_per_loop"].items())
        return f"{loops}; hbm binds {p['hbm_limited_launches']} of {len(launches)} launches"
    return ", ".join(
        x["limited_by"] if i == 0 else f"{x['name'].split('(')[0].split('::')[-1]} {x['limited_by']}"
        for i, x in enumerate(launches)
    )


def _num(x) -> str:
    return "-" if x is None else f"{x:.1f}"


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
