# SPDX-License-Identifier: BSD-3-Clause
"""`fa2patch tune`: measure every route on this GPU over the calls a vLLM deployment makes, and
write a routing profile (``profile``) keyed by the device and the extension.

The calls (``tune_plan``): one rank's heads from the model's config.json and --tp, vLLM's prefill
chunks (--max-num-batched-tokens) over KV up to --max-model-len, on a grid of representative
points. Each point runs in one worker process (``tune_worker.worker``) with vLLM's KV-cache layout (pages of
--block-size tokens, K and V as views of one (blocks, kv heads, page, 2 D) tensor, a shuffled
block table), and every route it can take: the exact route ``sm70-dense``, the exact route with
split-KV for each of --splits (``sm70-dense-splitkv``), and the long-prefill op where it takes the
call (``sm70-gqa-prefill``); at each decode point (Q = 1, B sequences: tune_plan's
``decode_points``) the exact kernel and the decode kernel (``sm70-decode``). Timing: CUDA events
around each call, warm-up calls first, then --reps rounds of one call of each route (in rotated
order), median per route; NVML samples the card during the rounds (``gpu_clocks``). Numerics
(untimed): each route's output against the exact route's on the same inputs (finite, relative L2
within the contract's bound).

How a route is forced is in ONE function, ``tune_worker.run_route``: the exact route through
VLLM_FLASH_V100_PREFILL_D256_GQA_ARCH_128K_EXPERIMENTAL=0 (read on every call; README "Routing")
with FA2PATCH_SM70_DECODE=0, the decode kernel with it at 1,
the long-prefill route through its explicit op ``gqa_prefill_fwd`` with a workspace sized by
``gqa_prefill_workspace_bytes`` (as tests/gpu/prefill_cases.py calls it), split-KV through the
extension's test hook ``_routing_prefill_splits_for_testing(splits)`` (patch 0004: while > 0, every
call split-KV can take runs the exact route with that many splits, 1 = unsplit, before the profile
and the built-in rule; 0 = off). Where the hook exists the exact route is taken with it at 1 too,
so no built-in split can creep in; a build without it has no split-KV route to measure. After the
warm-up calls of a varlen route at each point, route_stats() must have counted that route: a route
that was not really forced is an error, not a measurement.
The worker runs with FA2PATCH_FORCE_SM70=1 (the lab switch: the SM70 kernels on any GPU; a no-op
on a V100) and without FA2PATCH_ROUTING_PROFILE (a profile must not steer its own measurement).
Off a V100 the timings are not V100 timings; the profile and the output say so.
"""

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from fa2patch import __version__
from fa2patch.common.errors import EnvironmentProblem, Fa2PatchError
from fa2patch.common.routes import DECODE, EXACT, GQA, SPLITKV
from fa2patch.common.tables import table
from fa2patch.compile.extension import PIN_SPLITS_HOOK
from fa2patch.measure import gpu_clocks, profile
from fa2patch.measure.tune_plan import Plan, RankHeads
from fa2patch.measure.tune_worker import ENV_EXACT

LAB_NOTE = (
    "timings on {name} ({cap}) with the SM70 kernels forced (FA2PATCH_FORCE_SM70=1): not V100 timings; "
    "this profile proves the mechanism, its decisions say nothing about a V100"
)


# --- the estimate ---------------------------------------------------------------------------------


def estimate(plan: Plan, sm70_artifact: Path | None, card, gqa_head_dim: int = 256) -> dict:
    """The run's GPU time by report's calibrated V100 model: per point and route, (warm-up + reps +
    1 numerics call) x the route's estimated time: the exact route, split-KV at each of the plan's
    split counts (report's sm70-dense-splitkv), the long-prefill route where it takes the point. A
    route report does not estimate for the point (a build without the split-KV combine, a
    long-prefill call report does not take) is charged the exact route's time, and the note says so."""
    from fa2patch.common.shapes import Shape
    from fa2patch.model import report

    if sm70_artifact is None:
        return {"available": False, "note": "no estimate: report needs an sm_70 build (fa2patch build --arch sm_70)"}
    h = plan.heads
    label = f"V100 with {card.sms} SMs at {card.clock_mhz:g} MHz"
    scale = h.d**-0.5
    shapes = [Shape(q, kv, h.hq, h.hkv, h.d, True, scale) for q, kv in plan.points]
    shapes += [Shape(1, kv, h.hq, h.hkv, h.d, True, scale, b) for kv, b in plan.decode_points]
    try:
        predictions = report.report(Path(sm70_artifact), "sm_70", {}, shapes, card, tuple(plan.splits))["predictions"]
    except Fa2PatchError as exc:
        return {"available": False, "note": f"no estimate: {exc}"}
    by_key = {
        (p["label"], p["route"], p["plan"].get("splits", 1) if p["route"] == SPLITKV else 1): p["calibrated_ms"]
        for p in predictions
    }
    calls = plan.warmup + plan.reps + 1
    total = 0.0
    per_route: dict[str, float] = {}
    stand_in: set[str] = set()
    gqa = {"head_dim": gqa_head_dim, "max_group": 16}
    for shape in shapes:
        dense = by_key[(shape.label, EXACT, 1)]
        routes = plan.routes_at(shape.q, shape.kv, gqa) if shape.q > 1 else plan.decode_routes
        for route, splits in routes:
            name = profile.table_route(route, splits)
            ms = by_key.get((shape.label, name, splits))
            if ms is None:
                ms = dense
                stand_in.add(name)
            per_route[name] = per_route.get(name, 0.0) + calls * ms / 1e3
            total += calls * ms / 1e3
    charged = "; ".join(
        f"{name} charged at the exact route's time where report has no estimate" for name in sorted(stand_in)
    )
    return {
        "available": True,
        "seconds": total,
        "per_route_seconds": per_route,
        "card": label,
        "calls_per_route_and_point": calls,
        "note": (
            f"ESTIMATE of the GPU time: {len(shapes)} points x their routes x {calls} calls "
            f"({plan.warmup} warm-up, {plan.reps} timed, 1 numerics check) x report's calibrated time on a "
            f"{label}{'; ' + charged if charged else ''}; process start and input set-up not included"
        ),
    }


# --- running ----------------------------------------------------------------------------------------


def run(artifact: Path, plan: Plan, progress=None) -> dict:
    """Run the worker over the plan's points; returns {"start": ..., "points": [...], "stderr": ...}."""
    spec = {**asdict(plan), "heads": asdict(plan.heads), "points": plan.points, "decode_points": plan.decode_points}
    env = {**os.environ, "FA2PATCH_FORCE_SM70": "1"}
    env.pop("FA2PATCH_ROUTING_PROFILE", None)
    env.pop(ENV_EXACT, None)
    start, points = None, []
    # The with block closes the pipe and waits for the worker also when reading its output fails.
    with (
        tempfile.TemporaryFile("w+") as err,
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from fa2patch.measure.tune_worker import worker; worker()",
                str(artifact),
                json.dumps(spec),
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
        ) as proc,
    ):
        if proc.stdout is None:  # stdout=PIPE always gives one
            raise EnvironmentProblem("tune's worker started without a pipe for its output")
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            if event["event"] == "start":
                start = event
            elif event["event"] == "point":
                points.append(event)
                if progress:
                    progress(event)
        rc = proc.wait()
        err.seek(0)
        stderr = err.read()
    if start is None or rc != 0:
        raise EnvironmentProblem(f"tune's worker failed (exit {rc}) after {len(points)} point(s):\n{stderr[-3000:]}")
    return {"start": start, "points": points, "stderr": stderr[-3000:]}


def measured_rows(plan: Plan, points: list[dict]) -> list[dict]:
    """The profile's measured table: one row per point and route."""
    h = plan.heads
    rows = []
    for p in points:
        exact = next((r for r in p["rows"] if r["route"] == EXACT and r["splits"] == 1), None)
        for r in p["rows"]:
            row = {
                "q": p["q"],
                "kv": p["kv"],
                **({"batch": p["batch"]} if "batch" in p else {}),
                "hq": h.hq,
                "hkv": h.hkv,
                "group": h.group,
                "head_dim": h.d,
                "route": r["route"],
                "splits": r["splits"],
                "name": profile.table_route(r["route"], r["splits"]),
                **{k: r[k] for k in ("median_ms", "min_ms", "max_ms", "times_ms", "ok", "numerics", "error") if k in r},
            }
            if exact and exact.get("times_ms") and r.get("times_ms") and r is not exact:
                ratios = profile.paired_ratios(r["times_ms"], exact["times_ms"])
                row["ratio_to_exact"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
            row["clocks"] = p.get("clocks")
            rows.append(row)
    return rows


def build_profile(plan: Plan, start: dict, rows: list[dict]) -> dict:
    dev = start["device"]
    software = {**start["software"], "fa2patch": __version__}
    if tuple(dev["capability"]) != (7, 0):
        software["notes"] = LAB_NOTE.format(name=dev["name"], cap=f"sm_{dev['capability'][0]}{dev['capability'][1]}")
    clocks = gpu_clocks.merge([p.get("clocks") for p in _points_of(rows)])
    doc = {
        "format": profile.reader().FORMAT,
        "device": dev,
        "extension_sha256": start["extension"]["sha256"],
        "software": software,
        "clocks_seen": clocks or {"note": start.get("nvml", {}).get("note") or "no NVML samples"},
        "measured": rows,
        "decisions": profile.decisions(rows, start["rows_per_cta"], plan.max_model_len),
    }
    return profile.validate(doc, "the profile tune built")


def _points_of(rows: list[dict]) -> list[dict]:
    seen, out = set(), []
    for r in rows:
        if _point(r) not in seen:
            seen.add(_point(r))
            out.append(r)
    return out


def _point(r: dict) -> tuple[int, int, int]:
    """A measured row's point: (Q, KV, B), B 0 for a prefill point."""
    return r["q"], r["kv"], r.get("batch", 0)


def default_name(device_name: str, heads: RankHeads) -> str:
    """vLLM-style device-keyed file name: routing-profile,device_name=Tesla_V100-SXM2-32GB,hq=6,hkv=1,d=256.json"""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", device_name.replace(" ", "_"))
    return f"routing-profile,device_name={name},hq={heads.hq},hkv={heads.hkv},d={heads.d}.json"


def render(result: dict) -> str:
    """The measured table (per point: the exact route's ms, each other route's median ratio to it,
    the winner) and the decisions."""
    names = []
    for r in result["measured"]:
        if r["name"] != EXACT and (r["name"], r["splits"]) not in names:
            names.append((r["name"], r["splits"]))
    by_point: dict[tuple, dict] = {}
    for r in result["measured"]:
        by_point.setdefault(_point(r), {})[(r["name"], r["splits"])] = r
    others = [f"{n}{' x' + str(s) if s > 1 else ''} / exact" for n, s in names]
    header = ["Q", "KV", "B", "exact ms", *others, "SM MHz"]
    rows = []
    for (q, kv, b), per in by_point.items():
        exact = per.get((EXACT, 1), {})
        cells = [q, kv, b or 1, f"{exact['median_ms']:.3f}" if "median_ms" in exact else exact.get("error", "-")[:30]]
        for key in names:
            r = per.get(key)
            if r is None:
                cells.append("-")
            elif "ratio_to_exact" in r:
                x = r["ratio_to_exact"]
                cells.append(f"{x['median']:.3f} ({x['min']:.3f}-{x['max']:.3f}){'' if r.get('ok') else ' NUMERICS'}")
            else:
                cells.append((r.get("error") or "failed").splitlines()[-1][:40])
        clocks = exact.get("clocks") or {}
        sm = clocks.get("sm_clock_mhz")
        cells.append(f"{sm['median']:g}{' throttled' if clocks.get('throttled') else ''}" if sm else "-")
        rows.append(cells)
    lines = [table(rows, header)]
    lines += [
        "",
        "ratio: median of the paired per-round ratios to the exact route (min-max); a route wins where "
        "1 - median > max - min",
        "",
        profile.summary(result["profile"]),
    ]
    return "\n".join(lines)


# --- the command ---------------------------------------------------------------------------------------


def describe_plan(plan: Plan, model, tp: int) -> str:
    h = plan.heads
    by_q: dict[int, list[int]] = {}
    for q, kv in plan.points:
        by_q.setdefault(q, []).append(kv)
    lines = [
        f"model: {model.heads} query heads, {model.kv_heads} KV heads, head dim {model.head_dim} ({model.source}); "
        f"--tp {tp}: one rank's call has Hq={h.hq} Hkv={h.hkv} D={h.d} (group {h.group})",
        f"chunked prefill: chunks of {plan.chunk} tokens, KV up to {plan.max_model_len}; "
        f"{len(plan.points)} grid points:",
    ]
    lines += [f"  Q={q}: KV {', '.join(map(str, kvs))}" for q, kvs in by_q.items()]
    by_b: dict[int, list[int]] = {}
    for kv, b in plan.decode_points:
        by_b.setdefault(b, []).append(kv)
    lines.append(f"decode (Q=1), {len(plan.decode_points)} points:" if by_b else "decode: no points")
    lines += [f"  B={b}: KV {', '.join(map(str, kvs))}" for b, kvs in by_b.items()]
    lines.append(
        f"routes: {EXACT}, {SPLITKV} x {', '.join(map(str, plan.splits))}, and {GQA} "
        f"where its op takes the call; at decode points {EXACT} and {DECODE}; "
        f"{plan.warmup} warm-up calls, {plan.reps} timed rounds"
    )
    return "\n".join(lines)


def describe_estimate(est: dict) -> str:
    if not est.get("available"):
        return est["note"]
    per = ", ".join(f"{k} {v:.1f} s" for k, v in est["per_route_seconds"].items())
    return f"estimated GPU time: {est['seconds']:.1f} s ({per}).\n{est['note']}"


def tune(artifact: Path, plan: Plan, out: Path | None, progress=None) -> dict:
    """Measure, decide, write the profile; the command's result."""
    t0 = time.monotonic()
    ran = run(artifact, plan, progress)
    start = ran["start"]
    rows = measured_rows(plan, ran["points"])
    doc = build_profile(plan, start, rows)
    path = Path(out) if out else Path.cwd() / default_name(start["device"]["name"], plan.heads)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    broken = [
        f"Q={r['q']} KV={r['kv']} {r['name']}{' x' + str(r['splits']) if r['splits'] > 1 else ''}"
        for r in rows
        if "numerics" in r and not r["numerics"]["ok"]
    ]
    failed = [f"Q={r['q']} KV={r['kv']} {r['name']}: {r['error']}" for r in rows if r.get("error")]
    notes = []
    if "notes" in doc["software"]:
        notes.append("WARNING: " + doc["software"]["notes"])
    if not start["split_hook"]:
        notes.append(f"this extension has no {PIN_SPLITS_HOOK}: split-KV was not measured")
    if plan.decode_points and not start.get("decode_kernel"):
        notes.append(f"this extension has no {DECODE} route: the decode points were not measured")
    if not start.get("nvml", {}).get("available"):
        notes.append(start.get("nvml", {}).get("note") or "NVML not sampled")
    return {
        "ok": not broken,
        "profile_path": str(path),
        "device": start["device"],
        "extension": start["extension"],
        "wall_s": time.monotonic() - t0,
        "numerics_failures": broken,
        "route_errors": failed,
        "notes": notes,
        "measured": rows,
        "profile": doc,
    }


def render_tune(result: dict) -> str:
    lines = [render(result), ""]
    lines += [
        f"NUMERICS: {x} differs from the exact route beyond the contract's relative L2 bound; it is never a decision"
        for x in result["numerics_failures"]
    ]
    errors = result["route_errors"]
    if errors:
        lines.append(f"{len(errors)} route run(s) failed, e.g. {errors[0]}")
    lines += result["notes"]
    lines.append(f"tuned in {result['wall_s']:.0f} s; profile written to {result['profile_path']}")
    lines.append(f"use it: export FA2PATCH_ROUTING_PROFILE={result['profile_path']}")
    return "\n".join(lines)
