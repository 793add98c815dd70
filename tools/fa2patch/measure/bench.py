# SPDX-License-Identifier: BSD-3-Clause
"""bench: time two routes of the extension on a GPU over a shape sweep, with numerics.

Each (route, shape) runs in its own subprocess with the route's environment (the lab switch is
read once per process). A varlen_fwd route runs ``b`` sequences of the shape in one call, K/V
contiguous or in a paged cache (``page``, blocks shuffled), and must be the route that route_stats()
counted for its calls (the decode kernel takes only calls of one query row per sequence; a case it
did not take is an error, not the exact route's time under its name). Timing: CUDA events around
each call after warm-up; median, min, max.
Numerics: the last output against a chunked FP32 reference, judged against both bench's looser
envelope and the numerics contract (both in ``fa2patch.common.numerics``).
The card: NVML samples (``gpu_clocks``: SM and memory clock, power, temperature, throttle reasons)
taken by a thread every few milliseconds around each case's timed calls, summarized beside its
timings; a case that ran with a throttle reason other than idle or the applications-clocks
setting is flagged. On an SM70 card each time is shown beside ``report``'s calibrated estimate for
the same shape and route (measured/model). bench_text.py renders the results: the table and the
Markdown summary a user pastes into an issue report. On a GPU other than a V100 the timings of SM70
code do not represent V100 (docs/DESIGN.md §5).
"""

import contextlib
import json
import sys
from dataclasses import asdict
from pathlib import Path

from fa2patch import __version__
from fa2patch.common import numerics
from fa2patch.common.errors import EnvironmentProblem, Fa2PatchError, NothingToLaunch
from fa2patch.common.routes import EXACT
from fa2patch.common.shapes import Shape, useful_flops
from fa2patch.compile.extension import (
    mhz,
    pin_route,
    probe_gpu,
    python_json,
    require_build_info,
    routes_of,
    smi,
    varlen_fwd,
)
from fa2patch.measure import gpu_clocks

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
    if any(s.q < 1 or s.kv < 1 for s in shapes):
        raise EnvironmentProblem("--shapes: bench needs q >= 1 and kv >= 1 (no kernel runs without them)")
    if any(s.decode for s in shapes):
        raise EnvironmentProblem("--shapes: decode (rows batched with a chunk) is for `report` only")
    own_op = [r for r in routes if known[r]["op"] != "varlen_fwd"]
    if own_op and any(s.b != 1 or s.page for s in shapes):
        raise EnvironmentProblem(
            f"--shapes: b (batch) and page are for varlen_fwd's routes; {', '.join(own_op)} "
            f"takes one contiguous sequence"
        )
    idle, max_clock, driver = ([*smi("clocks.sm,clocks.max.sm,driver_version").split(","), "", ""])[:3]
    results = []
    for shape, route in progress([(s, r) for s in shapes for r in routes]):
        r = python_json(
            "from fa2patch.measure.bench import worker; worker()",
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
        ran = r.get("routes_counted")
        if "error" not in r and ran is not None and set(ran) != {route}:
            r = {"error": f"{route} did not take this call: route_stats() counted {ran}"}
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
        "throttle_rule": gpu_clocks.THROTTLE_RULE,
        "results": results,
    }


def attach_model(result: dict, artifact: Path, arch: str = "sm_70") -> None:
    """On an SM70 card: ``report``'s calibrated estimate for each case's shape and route on a V100
    with this card's SM count and maximum SM clock, and measured/model. The estimate is a point
    (``calibrated_ms``) or, where report gives one, a range (``calibrated_ms_low`` ..
    ``calibrated_ms_high``). Where report cannot run, ``result["model_note"]`` says why."""
    from fa2patch.model import report
    from fa2patch.model.v100model import Card

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


def worker() -> None:
    """Subprocess side: time one shape through the route's op and compare the output. varlen_fwd
    takes vLLM's 22 arguments (``b`` sequences, K/V contiguous or paged) and reports the routes
    route_stats() counted for its calls; gqa_prefill_fwd (one causal sequence) a workspace
    allocated once, as a persistent one would be."""
    import torch

    from fa2patch.measure.reference import attention_ref_chunked, compare

    artifact, spec = sys.argv[1], json.loads(sys.argv[2])
    torch.ops.load_library(artifact)
    ops = torch.ops._vllm_fa2_C
    name = spec.get("op", "varlen_fwd")
    op = getattr(ops, name)
    pin_route(ops, spec)
    if name != "varlen_fwd" and not spec["causal"]:
        raise ValueError(f"{name} computes causal attention only; the shape is not causal")
    torch.manual_seed(0)
    b, sq, sk, hkv, d = spec["b"], spec["q"], spec["kv"], spec["hkv"], spec["d"]
    q = torch.randn(b * sq, spec["hq"], d, dtype=torch.float16, device="cuda")
    out = torch.empty_like(q)
    cu_q = torch.arange(b + 1, dtype=torch.int32, device="cuda") * sq
    cu_k = torch.arange(b + 1, dtype=torch.int32, device="cuda") * sk
    if spec.get("page"):
        k, v, table, keys_of = paged_cache(torch, b, sk, hkv, d, spec["page"])
        seqused = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    else:
        k = torch.randn(b * sk, hkv, d, dtype=torch.float16, device="cuda")
        v = torch.randn_like(k)
        table = seqused = None

        def keys_of(i):
            return k[i * sk : (i + 1) * sk], v[i * sk : (i + 1) * sk]

    if name == "varlen_fwd":

        def call():
            varlen_fwd(op, q, k, v, out, cu_q, cu_k, sq, sk, spec["scale"], spec["causal"], seqused, table)
    else:
        ws = torch.empty(
            ops.gqa_prefill_workspace_bytes(sq, sk, spec["hq"], hkv),
            dtype=torch.uint8,
            device="cuda",
        )

        def call():
            op(q, k, v, out, None, sk, spec["scale"], ws)

    before = json.loads(ops.route_stats())["devices"][str(torch.cuda.current_device())]["routes"]
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
    after = json.loads(ops.route_stats())["devices"][str(torch.cuda.current_device())]["routes"]
    times.sort()
    refs: list[list] = [[], []]
    for i in range(b):
        ki, vi = keys_of(i)
        for dtype, acc in ((torch.float32, refs[0]), (torch.float16, refs[1])):
            ref, _ = attention_ref_chunked(
                q[i * sq : (i + 1) * sq], ki, vi, spec["scale"], spec["causal"], compute_dtype=dtype, max_elems=1 << 28
            )
            acc.append(ref)
    ref, ref16 = torch.cat(refs[0]), torch.cat(refs[1])
    numerics = compare(out, ref, ref16)
    numerics["mean_abs"] = (out.float() - ref).abs().mean().item()
    counted = {r: n - before.get(r, 0) for r, n in after.items() if n != before.get(r, 0)}
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
                "routes_counted": counted if name == "varlen_fwd" else None,
            }
        )
    )


def paged_cache(torch, b: int, sk: int, hkv: int, d: int, page: int):
    """Subprocess side: K/V caches of ``b`` sequences of ``sk`` keys in blocks of ``page`` tokens,
    vLLM's layout [blocks, page, hkv, d], the blocks handed out in a shuffled order; (k, v, block
    table, keys_of(i) -> sequence i's keys and values, gathered back in order)."""
    per_seq = -(-sk // page)
    order = torch.randperm(b * per_seq, device="cuda")
    table = order.view(b, per_seq).to(torch.int32)
    k = torch.randn(b * per_seq, page, hkv, d, dtype=torch.float16, device="cuda")
    v = torch.randn_like(k)

    def keys_of(i):
        rows = table[i].long()
        return k[rows].reshape(-1, hkv, d)[:sk], v[rows].reshape(-1, hkv, d)[:sk]

    return k, v, table, keys_of
