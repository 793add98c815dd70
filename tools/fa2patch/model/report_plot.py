# SPDX-License-Identifier: BSD-3-Clause
"""`fa2patch report --plot FILE.svg|png`: three pictures drawn from report's own JSON, nothing else.

``picture_data(report)`` picks, from the JSON object that ``report --json`` prints, exactly the numbers
the pictures show (each with the JSON row it came from); ``draw(data)`` draws them with matplotlib
(the optional ``plot`` extra, imported only here, inside the functions); ``write(report, path)`` writes
the pictures that the report's shapes give and the plotted numbers beside them:

- ``<stem>-routes<ext>``: per prefill shape (Q > 1), each route's calibrated time with its range and
  the shape's floor (``floor_ms``: any tensor-core kernel doing the useful FLOPs at full tensor duty);
- ``<stem>-routing<ext>``: a routing map over Q x KV for the head configuration with the most (Q, KV)
  cells, each cell coloured by the route the built-in rule takes (routing's rule from the call's
  host-side properties: ``rule_route``), cells whose route's range does not separate from the
  runner-up marked with an x;
- ``<stem>-decode<ext>``: per decode configuration (Q = 1) each route's time and the K/V bandwidth it
  achieves (the K and V bytes the call reads over its calibrated time) against KV length, with the
  card's DRAM peak;
- ``<stem>-data.json``: ``picture_data``'s result, the numbers plotted.

Estimates of the V100 model, not measurements (docs/report-model.md).
"""

import json
import re
from pathlib import Path
from typing import Any

from fa2patch.common import routes
from fa2patch.common.errors import EnvironmentProblem
from fa2patch.model.exact_route import prefill_splits

PICTURES = ("routes", "routing", "decode")
SUFFIXES = (".svg", ".png")

# Routing's built-in rule (patch 0004, routing.h / routing.cpp), as route_stats() reports it: the
# long-prefill range and the split rule's constants (tests/cli/test_report_plot.py reads them from
# the patch). The long-prefill route also needs its op to take the call, which report's JSON says
# (a sm70-gqa-prefill row); the decode kernel's rule is the JSON's own ``builtin_rule``.
LONG_PREFILL_MIN_Q = 1024
LONG_PREFILL_MIN_KV = 16384

COLOURS = {
    routes.EXACT: "#4c72b0",
    routes.SPLITKV: "#8172b2",
    f"{routes.SPLITKV} x2": "#8172b2",
    f"{routes.SPLITKV} x3": "#b07cc6",
    f"{routes.SPLITKV} x4": "#64b5cd",
    routes.GQA: "#55a868",
    routes.DECODE: "#dd8452",
    "v100-backend": "#937860",
    "floor": "#222222",
}
LABEL = re.compile(
    r"^(?:B=(?P<b>\d+) )?Q=(?P<q>\d+) KV=(?P<kv>\d+) Hq=(?P<hq>\d+) Hkv=(?P<hkv>\d+) D=(?P<d>\d+)"
    r"(?P<causal> causal)?(?P<rest>.*)$"
)


def parse_label(label: str) -> dict[str, Any]:
    """A prediction's shape from its label (common.shapes.Shape.label): b, q, kv, hq, hkv, d, causal,
    and ``extra`` (decode rows, page) where the label has more."""
    m = LABEL.match(label)
    if m is None:
        raise EnvironmentProblem(f"--plot: cannot read the shape of report row {label!r}")
    out: dict[str, Any] = {k: int(m[k]) for k in ("q", "kv", "hq", "hkv", "d")}
    out.update(b=int(m["b"] or 1), causal=bool(m["causal"]), extra=m["rest"].strip())
    return out


def series_name(row: dict) -> str:
    """A route's name in the pictures: split-KV rows with their split count."""
    if row["route"] == routes.SPLITKV:
        return f"{routes.SPLITKV} x{row['plan']['splits']}"
    return row["route"]


def _time(row: dict) -> dict:
    return {
        "route": row["route"],
        "name": series_name(row),
        "ms": row["calibrated_ms"],
        "low": row["calibrated_ms_low"],
        "high": row["calibrated_ms_high"],
    }


def _by_label(report: dict) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = {}
    for row in report.get("predictions", []):
        rows.setdefault(row["label"], []).append(row)
    return rows


def dense_geometry(report: dict, d: int) -> dict | None:
    """The exact route's kernel for head dim ``d`` in the JSON's kernel rows (the smallest head dim
    >= d): its geometry and CTAs per SM."""
    dense = [
        k
        for k in report.get("kernels", [])
        if (k.get("geometry") or {}).get("route") == routes.EXACT and k.get("occupancy")
    ]
    dense.sort(key=lambda k: k["geometry"]["head_dim"])
    return next((k for k in dense if k["geometry"]["head_dim"] >= d), None)


def builtin_splits(shape: dict, kernel: dict | None, sms: int) -> int:
    """Routing's built-in split-KV rule (exact_route.prefill_splits) for one causal sequence on the
    exact route of the kernel row ``kernel``; 1 for any other call."""
    if shape["b"] != 1 or not shape["causal"] or shape["q"] < 2 or shape["kv"] <= 0 or kernel is None:
        return 1
    geo, slots = kernel["geometry"], sms * kernel["occupancy"]["blocks_per_sm"]
    ctas = -(-shape["q"] // geo["rows_per_cta"]) * shape["hq"]
    return prefill_splits(ctas, -(-shape["kv"] // geo["keys_per_iteration"]), slots)


def rule_route(report: dict, rows: list[dict]) -> dict:
    """The route routing's built-in rule takes for one shape's call (no routing profile, switches
    unset) and whether report's ranges separate it from the runner-up: the rule's route against the
    exact route, or, where the rule keeps the exact route, the fastest other route against it
    (``vs_dense_verdict``). {route, splits, row (the rule's JSON row), separated}."""
    shape = parse_label(rows[0]["label"])
    by_route = {series_name(r): r for r in rows}
    exact = by_route[routes.EXACT]
    pick, splits = exact, 1
    decode = by_route.get(routes.DECODE)
    gqa = by_route.get(routes.GQA)
    if decode is not None and decode.get("builtin_rule"):
        pick = decode
    elif (
        gqa is not None and shape["b"] == 1 and shape["q"] >= LONG_PREFILL_MIN_Q and shape["kv"] >= LONG_PREFILL_MIN_KV
    ):
        pick = gqa
    else:
        splits = builtin_splits(shape, dense_geometry(report, shape["d"]), report["card"]["sms"])
        pick = by_route.get(f"{routes.SPLITKV} x{splits}", exact) if splits > 1 else exact
    if pick is exact:
        others = [r for r in rows if r is not exact and r["route"] != "v100-backend"]
        rival = min(others, key=lambda r: r["calibrated_ms"], default=None)
        separated = rival is None or rival.get("vs_dense_verdict") != "not separated"
    else:
        separated = pick.get("vs_dense_verdict") != "not separated"
    return {"route": pick["route"], "name": series_name(pick), "splits": splits, "separated": separated}


def routing_config(report: dict) -> tuple | None:
    """The head configuration (Hq, Hkv, D) whose single-sequence calls cover the most (Q, KV) cells,
    at least two Q values and two KV values; None without one."""
    cells: dict[tuple, set] = {}
    for label in _by_label(report):
        s = parse_label(label)
        if s["b"] == 1 and not s["extra"]:
            cells.setdefault((s["hq"], s["hkv"], s["d"]), set()).add((s["q"], s["kv"]))
    usable = {k: v for k, v in cells.items() if len({q for q, _ in v}) >= 2 and len({kv for _, kv in v}) >= 2}
    return max(usable, key=lambda k: len(usable[k])) if usable else None


def picture_data(report: dict) -> dict:
    """The numbers the three pictures show, each taken from ``report`` (report --json's object):
    ``routes`` (prefill shapes), ``routing`` (the map) and ``decode`` (sweeps by configuration);
    an empty list or None where the shapes give no such picture."""
    by_label = _by_label(report)
    card = report["card"]
    prefill: dict[str, list] = {}
    decode: dict[str, list] = {}
    for label, rows in by_label.items():
        s = parse_label(label)
        heads = f"Hq={s['hq']} Hkv={s['hkv']} D={s['d']}{' ' + s['extra'] if s['extra'] else ''}"
        if s["q"] > 1:
            batch = f"B={s['b']} " if s["b"] > 1 else ""
            panel = f"{batch}Q={s['q']} {heads}"
            prefill.setdefault(panel, []).append(
                {"label": label, "kv": s["kv"], "floor_ms": rows[0]["floor_ms"], "routes": [_time(r) for r in rows]}
            )
        elif not s["extra"]:
            kv_bytes = 2 * 2 * s["b"] * s["kv"] * s["hkv"] * s["d"]  # K and V, fp16
            decode.setdefault(f"B={s['b']} {heads}", []).append(
                {
                    "label": label,
                    "kv": s["kv"],
                    "kv_bytes": kv_bytes,
                    "routes": [
                        {**_time(r), "gbs": kv_bytes / (r["calibrated_ms"] * 1e6)}
                        for r in rows
                        if r["route"] in (routes.EXACT, routes.DECODE)
                    ],
                }
            )
    config = routing_config(report)
    routing = None
    if config is not None:
        hq, hkv, d = config
        cells = []
        for label, rows in by_label.items():
            s = parse_label(label)
            if (s["hq"], s["hkv"], s["d"]) == config and s["b"] == 1 and not s["extra"]:
                cells.append({"label": label, "q": s["q"], "kv": s["kv"], **rule_route(report, rows)})
        routing = {
            "config": f"Hq={hq} Hkv={hkv} D={d}",
            "q": sorted({c["q"] for c in cells}),
            "kv": sorted({c["kv"] for c in cells}),
            "cells": cells,
        }
    sweeps = [{"config": k, "points": sorted(v, key=lambda p: p["kv"])} for k, v in decode.items()]
    return {
        "artifact": report.get("artifact"),
        "card": card,
        "routes": [{"config": k, "points": sorted(v, key=lambda p: p["kv"])} for k, v in prefill.items()],
        "routing": routing,
        "decode": sweeps,
    }


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise EnvironmentProblem(
            "--plot needs matplotlib: pip install 'fa2patch[plot]' (or matplotlib itself)"
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "fa2patch", "svg.fonttype": "none", "font.size": 9})
    return plt


def _card_title(card: dict) -> str:
    return f"V100 model, {card['sms']} SMs, {card['clock_mhz']:g} MHz, {card['dram_gbs']:g} GB/s"


def _grid(plt, n: int, rows_per_panel: int = 1, width: float = 4.2, height: float = 3.0):
    cols = min(n, 3)
    lines = -(-n // cols)
    fig, axes = plt.subplots(
        lines * rows_per_panel, cols, figsize=(width * cols, height * lines * rows_per_panel), squeeze=False
    )
    return fig, axes, cols


def _errorbars(ax, xs: list, rows: list[dict], name: str, fmt: str = "o-") -> None:
    ax.errorbar(
        xs,
        [r["ms"] for r in rows],
        yerr=[[r["ms"] - r["low"] for r in rows], [r["high"] - r["ms"] for r in rows]],
        fmt=fmt,
        ms=3,
        capsize=2,
        lw=1,
        label=name,
        color=COLOURS.get(name, COLOURS.get(name.split(" ")[0])),
    )


def draw_routes(data: dict, plt) -> Any:
    """One panel per prefill configuration and Q: each route's calibrated time against KV with its
    range (error bars: the held-out fits), and the shape's floor (dashed)."""
    panels = data["routes"]
    fig, axes, cols = _grid(plt, len(panels))
    for i, panel in enumerate(panels):
        ax = axes[i // cols][i % cols]
        points = panel["points"]
        names = list(dict.fromkeys(r["name"] for p in points for r in p["routes"]))
        for name in names:
            pts = [(p["kv"], r) for p in points for r in p["routes"] if r["name"] == name]
            _errorbars(ax, [kv for kv, _ in pts], [r for _, r in pts], name)
        ax.plot(
            [p["kv"] for p in points],
            [p["floor_ms"] for p in points],
            "--",
            color=COLOURS["floor"],
            lw=1,
            label="floor",
        )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(panel["config"], fontsize=8)
        ax.set_xlabel("KV (keys)")
        ax.set_ylabel("calibrated ms")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for j in range(len(panels), len(axes) * cols):
        axes[j // cols][j % cols].set_visible(False)
    fig.suptitle(
        f"Each route's calibrated time with its range, and the floor (full tensor duty): {_card_title(data['card'])}",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def draw_routing(data: dict, plt) -> Any:
    """The routing map: one cell per (Q, KV), coloured by the built-in rule's route; x on cells
    whose route the ranges do not separate from the runner-up."""
    from matplotlib.patches import Patch, Rectangle

    grid = data["routing"]
    qs, kvs = grid["q"], grid["kv"]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.75 * len(kvs) + 2.5), max(3.0, 0.45 * len(qs) + 1.8)))
    seen = {}
    for c in grid["cells"]:
        x, y = kvs.index(c["kv"]), qs.index(c["q"])
        colour = COLOURS.get(c["name"], COLOURS[c["route"]])
        ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=colour, edgecolor="white", gid=f"cell-{c['label']}"))
        seen[c["name"]] = colour
        if not c["separated"]:
            ax.plot([x], [y], "x", color="black", ms=8, mew=1.5, gid=f"not-separated-{c['label']}")
    ax.set_xlim(-0.5, len(kvs) - 0.5)
    ax.set_ylim(-0.5, len(qs) - 0.5)
    ax.set_xticks(range(len(kvs)), [f"{k:,}" for k in kvs], rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(len(qs)), [f"{q:,}" for q in qs], fontsize=7)
    ax.set_xlabel("KV (keys)")
    ax.set_ylabel("Q (query rows)")
    handles = [Patch(facecolor=c, label=n) for n, c in seen.items()]
    handles.append(ax.plot([], [], "x", color="black", label="ranges do not separate")[0])
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"Built-in rule's route, {grid['config']}: {_card_title(data['card'])}", fontsize=9)
    fig.tight_layout()
    return fig


def draw_decode(data: dict, plt) -> Any:
    """Per decode configuration: each route's time (with its range) and its achieved K/V bandwidth
    against KV length, with the card's DRAM peak."""
    sweeps = data["decode"]
    fig, axes, cols = _grid(plt, len(sweeps), rows_per_panel=2)
    for i, sweep in enumerate(sweeps):
        t_ax, b_ax = axes[2 * (i // cols)][i % cols], axes[2 * (i // cols) + 1][i % cols]
        names = list(dict.fromkeys(r["name"] for p in sweep["points"] for r in p["routes"]))
        for name in names:
            pts = [(p["kv"], r) for p in sweep["points"] for r in p["routes"] if r["name"] == name]
            xs = [kv for kv, _ in pts]
            _errorbars(t_ax, xs, [r for _, r in pts], name)
            b_ax.plot(xs, [r["gbs"] for _, r in pts], "o-", ms=3, lw=1, label=name, color=COLOURS.get(name))
        b_ax.axhline(data["card"]["dram_gbs"], color=COLOURS["floor"], ls="--", lw=1, label="DRAM peak")
        for ax in (t_ax, b_ax):
            ax.set_xscale("log", base=2)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6)
        t_ax.set_yscale("log")
        t_ax.set_ylabel("calibrated ms")
        t_ax.set_title(f"Decode, {sweep['config']}", fontsize=8)
        b_ax.set_ylabel("K/V bytes / time, GB/s")
        b_ax.set_xlabel("KV (keys per sequence)")
    for j in range(len(sweeps), len(axes) // 2 * cols):
        axes[2 * (j // cols)][j % cols].set_visible(False)
        axes[2 * (j // cols) + 1][j % cols].set_visible(False)
    fig.suptitle(f"Decode time and achieved bandwidth: {_card_title(data['card'])}", fontsize=9)
    fig.tight_layout()
    return fig


def draw(data: dict) -> dict[str, Any]:
    """The figures ``data`` (picture_data's result) gives, by picture name."""
    plt = _pyplot()
    out = {}
    if data["routes"]:
        out["routes"] = draw_routes(data, plt)
    if data["routing"]:
        out["routing"] = draw_routing(data, plt)
    if data["decode"]:
        out["decode"] = draw_decode(data, plt)
    return out


def paths(path: Path) -> dict[str, Path]:
    """The files ``--plot path`` writes: one per picture and the data beside them."""
    if path.suffix not in SUFFIXES:
        raise EnvironmentProblem(f"--plot: {path}: expected a .svg or .png file name")
    stem = path.with_suffix("")
    out = {name: stem.parent / f"{stem.name}-{name}{path.suffix}" for name in PICTURES}
    return {**out, "data": stem.parent / f"{stem.name}-data.json"}


def write_data(data: dict, path: Path) -> list[Path]:
    """Draw ``data`` into the files of ``paths(path)``; the files written (pictures the data gives
    no numbers for are not written, and an older file of that name is removed)."""
    plt = _pyplot()
    targets = paths(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = []
    figures = draw(data)
    for name in PICTURES:
        target = targets[name]
        if name not in figures:
            target.unlink(missing_ok=True)
            continue
        figures[name].savefig(target, metadata={"Date": None} if target.suffix == ".svg" else None, dpi=110)
        plt.close(figures[name])
        written.append(target)
    targets["data"].write_text(json.dumps(data, indent=1) + "\n")
    return [*written, targets["data"]]


def write(report: dict, path: Path) -> list[Path]:
    """``report --plot path``: the pictures of ``report`` and their numbers."""
    data = picture_data(report)
    if not (data["routes"] or data["routing"] or data["decode"]):
        raise EnvironmentProblem("--plot: the shapes give nothing to plot (give --shapes)")
    return write_data(data, path)
