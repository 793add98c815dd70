# SPDX-License-Identifier: BSD-3-Clause
"""`fa2patch tune`'s worker: the subprocess that measures every route at each point of the plan on
this GPU, one JSON line per event (tune.run starts it and reads them). ``run_route`` is the one
place that knows how each route is forced, ``measure_point`` times one point's routes in rotated
rounds and checks each one's output against the exact route's (tune.py's docstring says how)."""

import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

from fa2patch.common import numerics
from fa2patch.common.digest import sha256_file
from fa2patch.common.routes import DECODE, DECODE_ENV, EXACT, GQA
from fa2patch.compile.extension import PIN_SPLITS_HOOK, routes_of
from fa2patch.measure import gpu_clocks, profile
from fa2patch.measure.tune_plan import Plan, RankHeads

ENV_EXACT = "VLLM_FLASH_V100_PREFILL_D256_GQA_ARCH_128K_EXPERIMENTAL"


def loaded_library(name: str = "_vllm_fa2_C") -> str | None:
    """The path of the loaded shared object whose file name contains ``name`` (/proc/self/maps):
    the file the process really mapped, whatever path it was loaded by."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and name in Path(parts[5]).name:
            return parts[5].strip()
    return None


class RouteNotForced(RuntimeError):
    pass


def split_hook(ops):
    return getattr(ops, PIN_SPLITS_HOOK) if hasattr(ops, PIN_SPLITS_HOOK) else None


def run_route(ops, route: str, splits: int, call, events=None) -> None:
    """Force ``route`` (with ``splits``) for one launch of ``call`` (a ``Call``); with ``events``
    (start, end CUDA events) record them around the launch only. The one place that knows how: the
    decode kernel through FA2PATCH_SM70_DECODE=1, the exact kernel with it at 0 (so that the decode
    kernel's rule cannot take a decode call the exact route is timed on)."""
    hook = None
    if route == GQA:
        launch = call.gqa
    else:
        os.environ[ENV_EXACT] = "0"
        os.environ[DECODE_ENV] = "1" if route == DECODE else "0"
        launch = call.varlen
        hook = split_hook(ops)
        if hook is None and splits > 1:
            raise RouteNotForced(f"this extension has no {PIN_SPLITS_HOOK}: no split-KV prefill to measure")
        if hook is not None:
            hook(splits)
    try:
        if events:
            events[0].record()
        launch()
        if events:
            events[1].record()
    finally:
        if hook is not None:
            hook(0)


class Call:
    """One point's inputs in vLLM's layout (``batch`` sequences of q_len queries and kv_len keys) and
    its two launches (varlen_fwd; gqa_prefill_fwd, one sequence only) into ``out``."""

    def __init__(self, torch, ops, q_len: int, kv_len: int, heads: dict, page: int, seed: int, batch: int = 1):
        hq, hkv, d = heads["hq"], heads["hkv"], heads["d"]
        gen = torch.Generator(device="cuda").manual_seed(seed)
        blocks = -(-kv_len // page)
        self.q = torch.randn(batch * q_len, hq, d, generator=gen, device="cuda", dtype=torch.float16)
        cache = torch.randn(batch * blocks, hkv, page, 2 * d, generator=gen, device="cuda", dtype=torch.float16)
        self.k, self.v = cache.transpose(1, 2).split(d, dim=-1)  # vLLM's views: row stride 2 D
        self.table = torch.randperm(batch * blocks, generator=gen, device="cuda").to(torch.int32).view(batch, -1)
        self.cu_q = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * q_len
        self.cu_k = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * kv_len
        self.q_len, self.kv_len, self.scale, self.ops, self.torch = q_len, kv_len, d**-0.5, ops, torch
        self.out = torch.empty_like(self.q)
        self.ws = None

    def varlen(self):
        self.ops.varlen_fwd(
            self.q,
            self.k,
            self.v,
            self.out,
            self.cu_q,
            self.cu_k,
            None,
            None,
            self.table,
            None,
            self.q_len,
            self.kv_len,
            0.0,
            self.scale,
            False,
            True,
            -1,
            -1,
            0.0,
            False,
            0,
            None,
        )

    def gqa(self):
        if self.ws is None:
            n = self.ops.gqa_prefill_workspace_bytes(self.q_len, self.kv_len, self.q.shape[1], self.k.shape[2])
            self.ws = self.torch.empty(n, dtype=self.torch.uint8, device="cuda")
        self.ops.gqa_prefill_fwd(self.q, self.k, self.v, self.out, self.table, self.kv_len, self.scale, self.ws)


def _route_counts(ops, device: int) -> dict:
    try:
        return json.loads(ops.route_stats())["devices"].get(str(device), {}).get("routes", {})
    except Exception:
        return {}


def measure_point(
    torch, ops, spec: dict, q_len: int, kv_len: int, routes: list, nvml, handle, batch: int | None = None
) -> dict:
    """Warm up, check each varlen route was forced, time ``reps`` rounds, then check numerics.
    ``batch``: a decode point's sequences (None: one prefill sequence)."""
    seed = q_len * 7919 + kv_len + 104729 * (batch or 0)
    call = Call(torch, ops, q_len, kv_len, spec["heads"], spec["block_size"], seed, batch or 1)
    device = torch.cuda.current_device()
    rows = {key: {"route": key[0], "splits": key[1], "times_ms": []} for key in routes}
    live = []
    for key in routes:
        route, splits = key
        try:
            before = _route_counts(ops, device)
            for _ in range(max(1, spec["warmup"])):
                run_route(ops, route, splits, call)
            torch.cuda.synchronize()
            after = _route_counts(ops, device)
            counted = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
            expected = profile.table_route(route, splits)
            if route != GQA and counted and expected not in counted:
                raise RouteNotForced(f"route_stats() counted {counted}, not {expected}")
            live.append(key)
        except Exception as exc:  # an op that refuses the call, an OOM, a route the build lacks
            rows[key]["error"] = f"{type(exc).__name__}: {exc}".strip()[:500]
    sampler = gpu_clocks.Sampler(nvml, handle) if nvml else None
    with sampler or contextlib.nullcontext():
        for k in range(spec["reps"]):
            order = live[k % len(live) :] + live[: k % len(live)] if live else []
            events = {
                key: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for key in order
            }
            for key in order:
                run_route(ops, key[0], key[1], call, events[key])
            torch.cuda.synchronize()
            for key in order:
                rows[key]["times_ms"].append(events[key][0].elapsed_time(events[key][1]))
    exact = None
    for key in live:
        call.out = torch.full_like(call.q, float("nan"))
        run_route(ops, key[0], key[1], call)
        torch.cuda.synchronize()
        if key == (EXACT, 1):
            exact = call.out
        rows[key]["numerics"] = _compare(torch, call.out, exact)
        rows[key]["ok"] = rows[key]["numerics"]["ok"]
    for key in live:
        t = sorted(rows[key]["times_ms"])
        rows[key].update(median_ms=statistics.median(t), min_ms=t[0], max_ms=t[-1])
    return {
        "event": "point",
        "q": q_len,
        "kv": kv_len,
        **({"batch": batch} if batch else {}),
        "rows": list(rows.values()),
        "clocks": sampler.summary() if sampler else None,
    }


def _compare(torch, out, exact) -> dict:
    finite = bool(torch.isfinite(out).all())
    if out is exact:
        return {"finite": finite, "against": "nothing (this is the exact route)", "ok": finite}
    if exact is None:
        return {"finite": finite, "against": "nothing: the exact route failed at this point", "ok": False}
    diff = out.float() - exact.float()
    rel = (torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(exact.float()).clamp_min(1e-30)).item()
    return {
        "finite": finite,
        "against": "the exact route",
        "max_abs": diff.abs().max().item(),
        "rel_l2": rel,
        "ok": finite and rel <= numerics.REL_L2_MAX,
    }


def worker() -> None:
    import torch

    artifact, spec = sys.argv[1], json.loads(sys.argv[2])
    torch.ops.load_library(artifact)
    ops = torch.ops._vllm_fa2_C
    loaded = loaded_library() or str(Path(artifact).resolve())
    info = json.loads(ops.build_info())
    stats = json.loads(ops.route_stats())
    h = spec["heads"]
    dense = sorted(
        (k for k in info.get("kernels", []) if k.get("route") == EXACT and k.get("head_dim", 0) >= h["d"]),
        key=lambda k: k["head_dim"],
    )
    gqa_kernel = next((k for k in info.get("kernels", []) if k.get("route") == GQA), None)
    gqa = (
        {"head_dim": gqa_kernel["head_dim"], "max_group": stats.get("long_prefill", {}).get("max_group", 16)}
        if gqa_kernel and hasattr(ops, "gqa_prefill_fwd")
        else None
    )
    decode_kernel = DECODE in routes_of(info)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    nvml, handle, nvml_info = gpu_clocks.open_for_torch(torch)
    driver = nvml_info.get("driver")
    plan = Plan(
        RankHeads(**h),
        spec["chunk"],
        spec["max_model_len"],
        spec["block_size"],
        spec["warmup"],
        spec["reps"],
        tuple(spec["splits"]),
        tuple(spec["decode_batches"]),
    )
    print(
        json.dumps(
            {
                "event": "start",
                "device": {
                    "name": props.name,
                    "sms": props.multi_processor_count,
                    "capability": [props.major, props.minor],
                },
                "software": {"torch": torch.__version__, "cuda": torch.version.cuda, "driver": driver},
                "extension": {"path": loaded, "sha256": sha256_file(Path(loaded))},
                "split_hook": split_hook(ops) is not None,
                "gqa": gqa,
                "rows_per_cta": dense[0]["rows_per_cta"] if dense else 64,
                "decode_kernel": decode_kernel,
                "nvml": nvml_info,
            }
        ),
        flush=True,
    )
    has_hook = split_hook(ops) is not None
    for q_len, kv_len in spec["points"]:
        t0 = time.monotonic()
        routes = [r for r in plan.routes_at(q_len, kv_len, gqa) if r[1] == 1 or has_hook]
        event = measure_point(torch, ops, spec, q_len, kv_len, routes, nvml, handle)
        event["wall_s"] = time.monotonic() - t0
        print(json.dumps(event), flush=True)
        torch.cuda.empty_cache()
    for kv_len, batch in spec["decode_points"] if decode_kernel else []:  # a build without it: nothing to compare
        t0 = time.monotonic()
        event = measure_point(torch, ops, spec, 1, kv_len, list(plan.decode_routes), nvml, handle, batch)
        event["wall_s"] = time.monotonic() - t0
        print(json.dumps(event), flush=True)
        torch.cuda.empty_cache()
