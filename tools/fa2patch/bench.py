# SPDX-License-Identifier: BSD-3-Clause
"""bench: time two routes of the extension on a GPU over a shape sweep, with numerics.

Each (route, shape) runs in its own subprocess with the route's environment (the lab switch is
read once per process). Timing: CUDA events around each call after warm-up; median, min, max.
Numerics: the last output against a chunked FP32 reference, judged against both bench's looser
envelope and the numerics contract (both in ``fa2patch.numerics``).
The card: NVML samples (``gpu_clocks``: SM and memory clock, power, temperature, throttle reasons)
taken by a thread every few milliseconds around each case's timed calls, summarized beside its
timings; a case that ran with a throttle reason other than idle or the applications-clocks
setting is flagged. On an SM70 card each time is shown beside ``report``'s calibrated estimate for
the same shape and route (measured/model). ``markdown`` writes the summary a user pastes into an
issue report. On a GPU other than a V100 the timings of SM70 code do not represent V100
(docs/DESIGN.md §5).
"""

import contextlib
import json
import sys
from dataclasses import asdict
from pathlib import Path

from . import __version__, gpu_clocks, numerics
from .calibration import range_text, separated
from .errors import EnvironmentProblem, Fa2PatchError, NothingToLaunch
from .extension import mhz, pin_route, probe_gpu, python_json, require_build_info, routes_of, smi
from .routes import EXACT
from .shapes import Shape, useful_flops
from .tables import table

DEFAULT_SHAPES = "q=8000,kv=40000:128000:8000,hq=6,hkv=1,d=256,causal=1,scale=0.0625"


def judge(numbers: dict) -> dict:
    """The envelope and the contract verdicts for one comparison (``reference.compare`` keys)."""
    return {
        "envelope_ok": numerics.within_envelope(numbers["max_abs"], numbers["rel_l2"], numbers["finite"]),
        "contract_ok": numerics.meets_contract(
            numbers["max_abs"], numbers["bar"], numbers["rel_l2"], numbers["finite"]
        ),
    }


def gpu_or_nothing() -> dict:
    """This machine's GPU (smoke's probe); NothingToLaunch without one."""
    gpu = probe_gpu()
    if "error" in gpu or not gpu.get("cuda"):
        raise NothingToLaunch("nothing timed: torch sees no CUDA GPU on this machine")
    return gpu


def bench(
    gpu: dict,
    artifact: Path,
    manifest_sha256: str,
    routes: list[str] | None,
    shapes: list[Shape],
    warmup: int,
    reps: int,
    progress=lambda items: items,
) -> dict:
    """``routes``: one or two route names; None: sm70-dense and the first other route."""
    info = require_build_info(artifact)
    known = routes_of(info)
    routes = routes or [EXACT, *[n for n in known if n != EXACT][:1]]
    unknown = [r for r in routes if r not in known]
    if unknown:
        raise EnvironmentProblem(
            f"{artifact}: no route {', '.join(unknown)}; it registers {', '.join(known) or 'none'}"
        )
    if any(s.b != 1 or s.decode for s in shapes):
        raise EnvironmentProblem(
            "--shapes: b (batch) and decode are for `report` only; bench times one sequence per shape"
        )
    idle, max_clock, driver = ([*smi("clocks.sm,clocks.max.sm,driver_version").split(","), "", ""])[:3]
    results = []
    for shape, route in progress([(s, r) for s in shapes for r in routes]):
        r = python_json(
            "from fa2patch.bench import worker; worker()",
            str(artifact),
            json.dumps(
                {
                    **asdict(shape),
                    "warmup": warmup,
                    "reps": reps,
                    "op": known[route]["op"],
                    "pin_splits": known[route].get("pin_splits"),
                }
            ),
            env=known[route].get("env"),
        )
        if "error" not in r:
            r.update(judge(r["numerics"]))
            r["tflops"] = useful_flops(shape) / (r["median_ms"] * 1e-3) / 1e12
            r["throttled"] = (r.get("clocks") or {}).get("throttled")
        results.append({"route": route, "shape": asdict(shape), "label": shape.label, **r})
    nvml = next((r["nvml"] for r in results if r.get("nvml")), {"available": False, "note": "no case ran"})
    for r in results:
        r.pop("nvml", None)
    return {
        "gpu": gpu["name"],
        "capability": gpu["capability"],
        "sms": gpu.get("sms"),
        "torch": gpu.get("torch"),
        "cuda": gpu.get("cuda_version"),
        "fa2patch": __version__,
        "sm_clock_idle": idle.strip(),
        "sm_clock_max": max_clock.strip(),
        "driver": driver.strip() or (nvml.get("driver") or ""),
        "manifest_sha256": manifest_sha256,
        "routes": routes,
        "is_v100": gpu["capability"] == "sm_70",
        "nvml": nvml,
        "throttle_rule": THROTTLE_RULE,
        "results": results,
    }


THROTTLE_RULE = (
    "throttled: NVML reported a clock event reason other than gpu_idle or applications_clocks_setting "
    "during the timed calls (power cap, thermal or hardware slowdown, sync boost, display clocks; "
    "fa2patch/gpu_clocks.py says why)"
)


def attach_model(result: dict, artifact: Path, arch: str = "sm_70") -> None:
    """On an SM70 card: ``report``'s calibrated estimate for each case's shape and route on a V100
    with this card's SM count and maximum SM clock, and measured/model. The estimate is a point
    (``calibrated_ms``) or, where report gives one, a range (``calibrated_ms_low`` ..
    ``calibrated_ms_high``). Where report cannot run, ``result["model_note"]`` says why."""
    from . import report
    from .v100model import Card

    shapes = list({Shape(**r["shape"]): None for r in result["results"] if "error" not in r})
    if not shapes:
        return
    clock = (result.get("nvml") or {}).get("max_sm_clock_mhz") or mhz(result.get("sm_clock_max")) or 1530.0
    card = Card(int(result.get("sms") or 80), float(clock))
    try:
        predictions = report.report(artifact, arch, {}, shapes, card)["predictions"]
    except Fa2PatchError as exc:
        result["model_note"] = f"no model estimate: {exc}"
        return
    by_key = {(p["label"], p["route"]): p for p in predictions}
    result["model_card"] = {"sms": card.sms, "clock_mhz": card.clock_mhz}
    for r in result["results"]:
        p = by_key.get((r["label"], r["route"]))
        if p is None or "median_ms" not in r:
            continue
        model = {k: p[k] for k in ("calibrated_ms", "calibrated_ms_low", "calibrated_ms_high", "model_ms") if k in p}
        r["model"] = model
        r["measured_over_model"] = model_ratio(r["median_ms"], model)


def model_ratio(measured_ms: float, model: dict) -> dict:
    """measured / model: a point, and where the model gives a range, measured/high .. measured/low."""
    out = {"point": measured_ms / model["calibrated_ms"]}
    if "calibrated_ms_low" in model and "calibrated_ms_high" in model:
        out.update(low=measured_ms / model["calibrated_ms_high"], high=measured_ms / model["calibrated_ms_low"])
    return out


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


def worker() -> None:
    """Subprocess side: time one shape through the route's op and compare the output. varlen_fwd
    takes vLLM's 22 arguments; gqa_prefill_fwd (one causal sequence) a workspace allocated once,
    as a persistent one would be."""
    import torch

    from .reference import attention_ref_chunked, compare

    artifact, spec = sys.argv[1], json.loads(sys.argv[2])
    torch.ops.load_library(artifact)
    ops = torch.ops._vllm_fa2_C
    name = spec.get("op", "varlen_fwd")
    op = getattr(ops, name)
    pin_route(ops, spec)
    if name != "varlen_fwd" and not spec["causal"]:
        raise ValueError(f"{name} computes causal attention only; the shape is not causal")
    torch.manual_seed(0)
    q = torch.randn(spec["q"], spec["hq"], spec["d"], dtype=torch.float16, device="cuda")
    k = torch.randn(spec["kv"], spec["hkv"], spec["d"], dtype=torch.float16, device="cuda")
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    cu_q = torch.tensor([0, spec["q"]], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, spec["kv"]], dtype=torch.int32, device="cuda")

    if name == "varlen_fwd":

        def call():
            op(
                q,
                k,
                v,
                out,
                cu_q,
                cu_k,
                None,
                None,
                None,
                None,
                spec["q"],
                spec["kv"],
                0.0,
                spec["scale"],
                False,
                spec["causal"],
                -1,
                -1,
                0.0,
                False,
                0,
                None,
            )
    else:
        ws = torch.empty(
            ops.gqa_prefill_workspace_bytes(spec["q"], spec["kv"], spec["hq"], spec["hkv"]),
            dtype=torch.uint8,
            device="cuda",
        )

        def call():
            op(q, k, v, out, None, spec["kv"], spec["scale"], ws)

    for _ in range(spec["warmup"]):
        call()
    torch.cuda.synchronize()
    nvml, handle, nvml_info = gpu_clocks.open_for_torch(torch)
    sampler = gpu_clocks.Sampler(nvml, handle) if nvml else None
    times = []
    with sampler or contextlib.nullcontext():
        for _ in range(spec["reps"]):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    clock = smi("clocks.sm")  # right after the timed calls: the clock they ran at, near enough
    times.sort()
    ref, _ = attention_ref_chunked(q, k, v, spec["scale"], spec["causal"], max_elems=1 << 28)
    ref16, _ = attention_ref_chunked(
        q, k, v, spec["scale"], spec["causal"], compute_dtype=torch.float16, max_elems=1 << 28
    )
    numerics = compare(out, ref, ref16)
    numerics["mean_abs"] = (out.float() - ref).abs().mean().item()
    print(
        json.dumps(
            {
                "median_ms": times[len(times) // 2],
                "min_ms": times[0],
                "max_ms": times[-1],
                "sm_clock_after": clock.strip(),
                "numerics": numerics,
                "clocks": sampler.summary() if sampler else None,
                "nvml": nvml_info,
            }
        )
    )


WARNING = (
    "WARNING: this GPU is not a V100 (sm_70): timings of SM70 code here do not represent "
    "V100 (the H200 emulates Volta's mma.m8n8k4)."
)


def render(result: dict) -> str:
    """The A/B table: per shape, median ms of each route with its range over the repetitions
    (min-max; * when the case ran throttled), speedup and latency reduction of B over A and
    whether the two ranges separate (the rule `report` compares routes by:
    calibration.separated), useful causal TFLOP/s, the numerics verdicts (envelope / contract)
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
        lines.append(f"* ran throttled ({result.get('throttle_rule', THROTTLE_RULE)})")
    if modelled:
        card = result.get("model_card", {})
        lines.append(
            f"model ms: report's calibrated estimate for a V100 with {card.get('sms')} SMs at "
            f"{card.get('clock_mhz', 0):g} MHz (an estimate, not a measurement; docs/report-model.md)"
        )
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
    lines += ["", f"- {result.get('throttle_rule', THROTTLE_RULE)}."]
    if modelled:
        card = result.get("model_card", {})
        lines.append(
            f"- model ms: `fa2patch report`'s calibrated estimate for a V100 with {card.get('sms')} SMs at "
            f"{card.get('clock_mhz', 0):g} MHz (an estimate, not a measurement)."
        )
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
