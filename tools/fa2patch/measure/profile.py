# SPDX-License-Identifier: BSD-3-Clause
"""Routing profiles (format 1; README "Tuning routing for your card"):
the decisions `fa2patch tune` derives from its measurements, and the Python validator of a
profile file (``tune --check``, tests). The extension reads the same files (patch 0004).

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
"""

import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

from fa2patch.common.errors import CheckFailed
from fa2patch.common.routes import EXACT, GQA, SPLITKV

FORMAT = "fa2patch-routing-profile/1"
ROUTES = (EXACT, GQA)  # the names a decision may carry (build_info()'s route names)
TOP_LEVEL = {"format", "device", "extension_sha256", "software", "clocks_seen", "measured", "decisions"}
REQUIRED = ("format", "device", "extension_sha256", "decisions")
DEVICE_KEYS = ("name", "sms", "capability")
DECISION_KEYS = {"group", "head_dim", "q", "kv", "route", "splits"}
MAX_SPLITS = 16
# The extension's reader's bounds (patch 0004, profile.cpp): the same file gets the same answer.
MAX_HEAD_DIM, MAX_GROUP, MAX_SMS, MAX_RANGE_END = 256, 1 << 16, 1 << 20, 1 << 62


class ProfileRefused(CheckFailed):
    """A profile the router must refuse; ``reason`` is one of: unreadable, invalid_json,
    wrong_format, unknown_key, bad_field, unknown_route, device_mismatch, extension_mismatch."""

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


def decisions(measured: list[dict], rows_per_cta: int, max_model_len: int) -> list[dict]:
    """Profile decisions from tune's measured rows (each with q, kv, group, head_dim, route, splits,
    times_ms, ok): one winner per point, merged into KV ranges per Q point."""
    points: dict[tuple, dict[int, list]] = {}
    for r in measured:
        points.setdefault((r["group"], r["head_dim"], r["q"]), {}).setdefault(r["kv"], []).append(r)
    out = []
    for (group, d, q), by_kv in sorted(points.items(), key=lambda x: (x[0][0], x[0][1], -x[0][2])):
        labelled = []
        for kv, rows in by_kv.items():
            if not any(r["route"] == EXACT and r.get("splits", 1) == 1 and r.get("ok") for r in rows):
                continue  # no exact-route measurement: nothing to compare with, no decision
            w = winner(rows)
            labelled.append((kv, (w["route"], w["splits"])))
        qlo, qhi = q_range(q, rows_per_cta)
        for lo, hi, (route, splits) in kv_ranges(labelled, max_model_len + 1):
            entry = {"group": group, "head_dim": d, "q": [qlo, qhi], "kv": [lo, hi], "route": route}
            if splits > 1:
                entry["splits"] = splits
            out.append(entry)
    return out


# --- validating ----------------------------------------------------------------------------------


def load(path: Path) -> dict:
    """The profile's JSON object, or ProfileRefused (unreadable, invalid_json)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileRefused("unreadable", f"{path}: cannot read it: {exc}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ProfileRefused("invalid_json", f"{path}: not valid JSON: {exc}") from None


def validate(doc, where: str = "profile", device: dict | None = None, sha256: str | None = None) -> dict:
    """Raise ProfileRefused on the first problem the spec refuses a profile for; with ``device``
    ({name, sms, capability}) and ``sha256`` (of the extension that would use it) also on another
    device or extension. Returns the document."""
    if not isinstance(doc, dict):
        raise ProfileRefused("bad_field", f"{where}: expected a JSON object, got {type(doc).__name__}")
    if doc.get("format") != FORMAT:
        raise ProfileRefused("wrong_format", f"{where}: format: expected {FORMAT!r}, actual {doc.get('format')!r}")
    unknown = sorted(set(doc) - TOP_LEVEL)
    if unknown:
        raise ProfileRefused(
            "unknown_key", f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(TOP_LEVEL))})"
        )
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        raise ProfileRefused("bad_field", f"{where}: missing {', '.join(missing)}")
    _device(doc["device"], where)
    sha = doc["extension_sha256"]
    if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise ProfileRefused(
            "bad_field", f"{where}: extension_sha256: expected 64 lowercase hex digits, actual {sha!r}"
        )
    for key, kind in (("software", dict), ("clocks_seen", dict), ("measured", list)):
        if key in doc and not isinstance(doc[key], kind):
            raise ProfileRefused(
                "bad_field",
                f"{where}: {key}: expected a JSON {'object' if kind is dict else 'array'}"
                f", actual {type(doc[key]).__name__}",
            )
    if not isinstance(doc["decisions"], list):
        raise ProfileRefused("bad_field", f"{where}: decisions: expected an array")
    for i, d in enumerate(doc["decisions"]):
        _decision(d, f"{where}: decisions[{i}]")
    if device is not None:
        dev = doc["device"]
        for key in DEVICE_KEYS:
            if dev[key] != device[key]:
                raise ProfileRefused(
                    "device_mismatch",
                    f"{where}: device {key}: expected {device[key]!r} (this GPU), actual {dev[key]!r} (the profile)",
                )
    if sha256 is not None and sha != sha256:
        raise ProfileRefused(
            "extension_mismatch",
            f"{where}: extension_sha256: expected {sha256} (the loaded extension), actual {sha} (the profile)",
        )
    return doc


def _int(value, low: int, high: int | None = None) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)


def _device(dev, where: str) -> None:
    if not isinstance(dev, dict):
        raise ProfileRefused("bad_field", f"{where}: device: expected an object")
    unknown = sorted(set(dev) - set(DEVICE_KEYS))
    if unknown:
        raise ProfileRefused("unknown_key", f"{where}: device: unknown key(s) {', '.join(unknown)}")
    if not isinstance(dev.get("name"), str) or not dev["name"]:
        raise ProfileRefused(
            "bad_field", f"{where}: device.name: expected a non-empty string, actual {dev.get('name')!r}"
        )
    if not _int(dev.get("sms"), 1, MAX_SMS):
        raise ProfileRefused(
            "bad_field", f"{where}: device.sms: expected an integer 1..{MAX_SMS}, actual {dev.get('sms')!r}"
        )
    cap = dev.get("capability")
    if not (isinstance(cap, list) and len(cap) == 2 and all(_int(c, 0) for c in cap)):
        raise ProfileRefused("bad_field", f"{where}: device.capability: expected [major, minor], actual {cap!r}")


def _decision(d, where: str) -> None:
    if not isinstance(d, dict):
        raise ProfileRefused("bad_field", f"{where}: expected an object")
    unknown = sorted(set(d) - DECISION_KEYS)
    if unknown:
        raise ProfileRefused("unknown_key", f"{where}: unknown key(s) {', '.join(unknown)}")
    for key, high in (("group", MAX_GROUP), ("head_dim", MAX_HEAD_DIM)):
        if not _int(d.get(key), 1, high):
            raise ProfileRefused("bad_field", f"{where}.{key}: expected an integer 1..{high}, actual {d.get(key)!r}")
    for key in ("q", "kv"):
        r = d.get(key)
        if not (isinstance(r, list) and len(r) == 2 and all(_int(x, 0, MAX_RANGE_END) for x in r) and r[0] < r[1]):
            raise ProfileRefused(
                "bad_field", f"{where}.{key}: expected [lo, hi] integers with 0 <= lo < hi <= 2^62, actual {r!r}"
            )
    route = d.get("route")
    if not isinstance(route, str):
        raise ProfileRefused("bad_field", f"{where}.route: expected a string, actual {route!r}")
    if route not in ROUTES:
        raise ProfileRefused("unknown_route", f"{where}.route: {route!r} is not one of {', '.join(ROUTES)}")
    if "splits" in d:
        if route != EXACT:
            raise ProfileRefused("bad_field", f"{where}.splits: allowed only with route {EXACT!r}, not {route!r}")
        if not _int(d["splits"], 1, MAX_SPLITS):
            raise ProfileRefused(
                "bad_field", f"{where}.splits: expected an integer 1..{MAX_SPLITS}, actual {d['splits']!r}"
            )


def check_file(path: Path, device: dict | None = None, sha256: str | None = None) -> dict:
    """Load and validate a profile file; ProfileRefused naming the file and the reason."""
    return validate(load(path), str(path), device, sha256)


def summary(doc: dict) -> str:
    """One paragraph: the device, the extension and the decisions as a table."""
    dev = doc["device"]
    lines = [
        f"profile for {dev['name']} ({dev['sms']} SMs, capability {dev['capability'][0]}.{dev['capability'][1]}), "
        f"extension sha256 {doc['extension_sha256'][:16]}..., {len(doc['decisions'])} decision(s)"
    ]
    for d in doc["decisions"]:
        route = table_route(d["route"], d.get("splits", 1))
        lines.append(
            f"  group {d['group']}, D={d['head_dim']}, Q [{d['q'][0]}, {d['q'][1]}), "
            f"KV [{d['kv'][0]}, {d['kv'][1]}): {route}{' x' + str(d['splits']) if d.get('splits', 1) > 1 else ''}"
        )
    return "\n".join(lines)
