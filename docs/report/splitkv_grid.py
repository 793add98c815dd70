# SPDX-License-Identifier: BSD-3-Clause
"""The split-KV table of docs/report-model.md (issue 17 item 4), from `fa2patch report --json`.

Reads one report per SM count for the shapes of docs/report/splitkv-shapes.txt and prints, per
(heads, head dim, Q, decode rows), the exact route's CTAs that do work, and per card the split
count whose calibrated time is lowest at the longest KV, the exact / split ratio over the KV values
(point estimates), the verdicts by KV (F: split-KV faster, ranges separate; S: slower; -: not
separated) and, where the long-prefill route takes the call, long-prefill / split (> 1: split-KV
faster) with its verdicts (F: split-KV faster than long-prefill; S: slower).

    fa2patch report --arch sm_70 --sms 72 --json --shapes "$(cat docs/report/splitkv-shapes.txt)" > s72.json
    fa2patch report --arch sm_70 --sms 80 --json --shapes "$(cat docs/report/splitkv-shapes.txt)" > s80.json
    python docs/report/splitkv_grid.py s72.json s80.json
"""

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

MARK = {"faster": "F", "slower": "S", "not separated": "-"}
LABEL = re.compile(r"Q=(\d+) KV=(\d+) Hq=(\d+) Hkv=(\d+) D=(\d+) causal(?: \+(\d+) decode KV=(\d+))?")


def read(path):
    out = json.loads(Path(path).read_text())
    by = defaultdict(dict)
    for p in out["predictions"]:
        by[p["label"]][(p["route"], p["plan"].get("splits", 1))] = p
    table = defaultdict(list)
    for label, routes in by.items():
        q, kv, hq, hkv, d, decode, dkv = (int(x or 0) for x in LABEL.match(label).groups())
        table[(hq, hkv, d, q, decode, dkv)].append((kv, routes))
    return out["card"]["sms"], table


def cell(points):
    """The split count best at the longest KV, its ratios and verdicts over the KV values."""
    points = sorted(points, key=lambda x: x[0])
    splits = [r for r in points[-1][1].values() if r["route"] == "sm70-dense-splitkv"]
    best = max(splits, key=lambda p: p["vs_dense"])["plan"]["splits"]
    rows = [routes[("sm70-dense-splitkv", best)] for _, routes in points]
    ratios = [r["vs_dense"] for r in rows]
    text = f"x{best}: {min(ratios):.2f}-{max(ratios):.2f} {''.join(MARK[r['vs_dense_verdict']] for r in rows)}"
    gqa = [r for r in rows if "vs_gqa" in r]
    vs = "-"
    if gqa:
        g = [r["vs_gqa"] for r in gqa]  # long-prefill time / split time
        vs = f"{min(g):.2f}-{max(g):.2f} {''.join(MARK[r['vs_gqa_verdict']] for r in gqa)}"
    return text, vs


def main(paths):
    cards = dict(read(p) for p in paths)
    keys = sorted(
        set().union(*(t.keys() for t in cards.values())), key=lambda k: (k[4] > 0, -k[2], k[0], k[1], k[3], k[4], k[5])
    )
    print(
        "| Hq/Hkv, D | Q | decode rows (KV) | "
        + " | ".join(f"{sms} SMs: best split, exact/split by KV | {sms} SMs: long-prefill/split" for sms in cards)
        + " |"
    )
    print("|---|---|---|" + "---|---|" * len(cards))
    for key in keys:
        hq, hkv, d, q, decode, dkv = key
        cells = []
        for table in cards.values():
            cells += cell(table[key]) if key in table else ["-", "-"]
        dec = f"{decode} ({dkv:,})" if decode else "-"
        print(f"| {hq}/{hkv}, {d} | {q:,} | {dec} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
