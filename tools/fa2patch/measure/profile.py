# SPDX-License-Identifier: BSD-3-Clause
"""Routing profiles (format 1; README "Tuning routing for your card"):
the decisions `fa2patch tune` derives from its measurements. Profile files are read and validated
by one reader, packaging/fa2patch_vllm/routing_profile.py, which the plugin ships and which hands the
checked decisions to the extension (patch 0004); ``tune --check`` and tune itself use it too.

Deciding (``winner``): at each measured point every route ran in interleaved rounds (one call of
each route per round, so a clock or temperature drift hits all routes alike). For a route R and
the exact route E, ratio_k = t_R,k / t_E,k in round k; the run-to-run spread is
max_k ratio_k - min_k ratio_k. R beats E only where 1 - median(ratio) > spread: its median gain is
larger than the whole spread of the paired ratios. Among the routes that beat E the one with the
lowest median ratio wins; where none does, E (the exact route) is the decision.

Merging (``kv_ranges``, ``q_range``): per Q point, adjacent KV points with the same winner form one
range; where neighbours differ, the boundary is their geometric mean (the grid is geometric, so
that is the midpoint in log KV). The first range starts at 0, the last ends past --max-model-len.
A Q point's range is the Q values that give the exact route the same number of row blocks (CTAs),
ceil(Q / rows_per_cta): what decides how its waves fill, and so which route wins.

Decode points (Q = 1, B sequences; tune_plan's ``decode_points``) decide between the decode kernel
(``sm70-decode``) and the exact kernel (``sm70-dense``), per B point: KV ranges merged as above, the
last ending past --max-model-len where the longest KV was measured, else at the geometric midpoint
to the next KV point the K/V budget left out (no decision beyond: the built-in rule). A B point's
``batch`` range reaches to the geometric midpoints to its neighbours (1 from the first, no end after
the last); its ``q`` range is [1, 2). Decode decisions come first (the first match wins).
"""

import functools
import importlib.util
import itertools
import math
import statistics
from pathlib import Path
from types import ModuleType
from typing import Any

from fa2patch.common.errors import CheckFailed, EnvironmentProblem
from fa2patch.common.routes import EXACT, SPLITKV
from fa2patch.measure.tune_plan import decode_kv_points


class ProfileRefused(CheckFailed):
    """A profile the reader refuses (exit 1); ``reason`` is the reader's (routing_profile.py)."""

    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason = reason


# --- deciding ------------------------------------------------------------------------------------


def table_route(route: str, splits: int) -> str:
    """The name tune's table and route_stats() use: the exact route with splits > 1 is sm70-dense-splitkv."""
    return SPLITKV if route == EXACT and splits > 1 else route


def paired_ratios(times: list[float], exact_times: list[float]) -> list[float]:
    return [t / e for t, e in zip(times, exact_times, strict=True)]


def winner(rows: list[dict]) -> dict:
    """The decision at one point from its rows ({route, splits, times_ms (per round), ok}): the
    fastest route that beats the exact route by more than the spread of their paired ratios, else
    the exact route. Returns {route, splits, median_ratio, spread}."""
    exact = next(r for r in rows if r["route"] == EXACT and r.get("splits", 1) == 1)
    best: dict[str, Any] = {"route": EXACT, "splits": 1, "median_ratio": 1.0, "spread": 0.0}
    for r in rows:
        if r is exact or not r.get("ok") or not r.get("times_ms"):
            continue
        ratios = paired_ratios(r["times_ms"], exact["times_ms"])
        med, spread = statistics.median(ratios), max(ratios) - min(ratios)
        if 1.0 - med > spread and med < best["median_ratio"]:
            best = {"route": r["route"], "splits": r.get("splits", 1), "median_ratio": med, "spread": spread}
    return best


def geometric_boundary(a: int, b: int) -> int:
    return round(math.sqrt(a * b))


def kv_ranges(points: list[tuple[int, tuple]], end: int) -> list[tuple[int, int, tuple]]:
    """[(lo, hi, label)] from [(kv, label)] sorted by kv: neighbours with one label merge; a change
    of label between kv_a and kv_b puts the boundary at sqrt(kv_a kv_b). Covers [0, end)."""
    points = sorted(points)
    starts: list[tuple[int, tuple]] = []  # (lo, label) where the label changes
    for i, (kv, label) in enumerate(points):
        if starts and starts[-1][1] == label:
            continue
        starts.append((0 if i == 0 else geometric_boundary(points[i - 1][0], kv), label))
    if not starts:
        return []
    ends = [lo for lo, _ in starts[1:]] + [max(end, points[-1][0] + 1)]
    return [(lo, hi, label) for (lo, label), hi in zip(starts, ends, strict=True)]


def q_range(q: int, rows_per_cta: int) -> tuple[int, int]:
    """The half-open range of Q with the same ceil(Q / rows_per_cta) as q."""
    blocks = -(-q // rows_per_cta)
    return rows_per_cta * (blocks - 1) + 1, rows_per_cta * blocks + 1


def labelled_points(by_kv: dict[int, list]) -> list[tuple[int, tuple]]:
    """[(kv, (route, splits))]: the winner at each KV point that has an exact-route measurement."""
    labelled = []
    for kv, rows in by_kv.items():
        if not any(r["route"] == EXACT and r.get("splits", 1) == 1 and r.get("ok") for r in rows):
            continue  # no exact-route measurement: nothing to compare with, no decision
        w = winner(rows)
        labelled.append((kv, (w["route"], w["splits"])))
    return labelled


def decode_end(kvs: list[int], max_model_len: int) -> int:
    """Where a decode B point's last KV range ends: past max_model_len if its longest KV point was
    measured, else the geometric midpoint to the next KV point."""
    grid = decode_kv_points(max_model_len)
    last = max(kvs)
    later = [kv for kv in grid if kv > last]
    return geometric_boundary(last, later[0]) if later else max_model_len + 1


def batch_ranges(batches: list[int]) -> dict[int, list[int]]:
    """{B: [lo, hi)}: 1 to the first midpoint, geometric midpoints between, no end after the last."""
    b = sorted(batches)
    bounds = [1] + [geometric_boundary(x, y) for x, y in itertools.pairwise(b)] + [reader().MAX_RANGE_END]
    return {x: [bounds[i], bounds[i + 1]] for i, x in enumerate(b)}


def decisions(measured: list[dict], rows_per_cta: int, max_model_len: int) -> list[dict]:
    """Profile decisions from tune's measured rows (each with q, kv, group, head_dim, route, splits,
    times_ms, ok; decode rows with batch): one winner per point, merged into KV ranges per Q point
    and per decode B point; the decode decisions first."""
    points: dict[tuple, dict[int, list]] = {}
    for r in measured:
        key = (r["group"], r["head_dim"], r["q"], r.get("batch", 0))  # 0: a prefill point
        points.setdefault(key, {}).setdefault(r["kv"], []).append(r)
    decode, prefill = [], []
    batches: dict[tuple, list[int]] = {}
    for group, d, _, b in points:
        if b:
            batches.setdefault((group, d), []).append(b)
    for (group, d, q, b), by_kv in sorted(points.items(), key=lambda x: (x[0][0], x[0][1], -x[0][2], x[0][3])):
        labelled = labelled_points(by_kv)
        if b:
            end = decode_end([kv for kv, _ in labelled], max_model_len) if labelled else 0
            span = batch_ranges(batches[(group, d)])[b]
            for lo, hi, (route, _) in kv_ranges(labelled, end):
                decode.append(
                    {"group": group, "head_dim": d, "q": [1, 2], "kv": [lo, hi], "batch": span, "route": route}
                )
            continue
        qlo, qhi = q_range(q, rows_per_cta)
        for lo, hi, (route, splits) in kv_ranges(labelled, max_model_len + 1):
            entry = {"group": group, "head_dim": d, "q": [qlo, qhi], "kv": [lo, hi], "route": route}
            if splits > 1:
                entry["splits"] = splits
            prefill.append(entry)
    return decode + prefill


# --- validating: the plugin's reader, the one reader of profile files ---------------------------


@functools.cache
def reader() -> ModuleType:
    """packaging/fa2patch_vllm/routing_profile.py, loaded from its file: the reader the plugin ships
    (standard library only; importing the fa2patch_vllm package would import torch)."""
    path = Path(__file__).resolve().parents[3] / "packaging" / "fa2patch_vllm" / "routing_profile.py"
    spec = importlib.util.spec_from_file_location("fa2patch_routing_profile", path)
    if spec is None or spec.loader is None:
        raise EnvironmentProblem(f"{path}: cannot load the routing-profile reader")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def validate(doc, where: str = "profile", device: dict | None = None, sha256: str | None = None) -> dict:
    """The reader's validate; a refusal is ProfileRefused (a CheckFailed, exit 1) with its reason."""
    try:
        return reader().validate(doc, where, device, sha256)
    except reader().ProfileRefused as exc:
        raise ProfileRefused(exc.reason, str(exc).removeprefix(exc.reason + ": ")) from None


def check_file(path: Path, device: dict | None = None, sha256: str | None = None) -> dict:
    """Load and validate a profile file; ProfileRefused naming the file and the reason."""
    try:
        return reader().check_file(path, device, sha256)
    except reader().ProfileRefused as exc:
        raise ProfileRefused(exc.reason, str(exc).removeprefix(exc.reason + ": ")) from None


def summary(doc: dict) -> str:
    """One paragraph: the device, the extension and the decisions as a table."""
    dev = doc["device"]
    lines = [
        f"profile for {dev['name']} ({dev['sms']} SMs, capability {dev['capability'][0]}.{dev['capability'][1]}), "
        f"extension sha256 {doc['extension_sha256'][:16]}..., {len(doc['decisions'])} decision(s)"
    ]
    for d in doc["decisions"]:
        route = table_route(d["route"], d.get("splits", 1))
        lo, hi = d.get("batch", reader().ALL_BATCHES)
        batch = "" if "batch" not in d else f", B >= {lo}" if hi == reader().MAX_RANGE_END else f", B [{lo}, {hi})"
        lines.append(
            f"  group {d['group']}, D={d['head_dim']}, Q [{d['q'][0]}, {d['q'][1]}), KV [{d['kv'][0]}, {d['kv'][1]})"
            f"{batch}: {route}{' x' + str(d['splits']) if d.get('splits', 1) > 1 else ''}"
        )
    return "\n".join(lines)
