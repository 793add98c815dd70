# SPDX-License-Identifier: BSD-3-Clause
"""Where the long-prefill route's range separates from the exact route's (issue 15 item 5).

Reads `fa2patch report --json` outputs (one per SM count) for shapes that the long-prefill op
takes and prints, per (Q, Hq/Hkv), the exact route's CTAs, their average wave fill
CTAs / (waves x SMs), the range of exact / long-prefill calibrated ratios over the KV values, and
the verdicts: F = long-prefill faster (ranges separate), S = slower (separate), - = not separated.

    fa2patch report --arch sm_70 --sms 72 --json --shapes "$(cat docs/report/routing-shapes.txt)" > r72.json
    fa2patch report --arch sm_70 --sms 80 --json --shapes "$(cat docs/report/routing-shapes.txt)" > r80.json
    python docs/report/routing_grid.py r72.json r80.json
"""

import json
import re
import sys
from collections import defaultdict
from pathlib import Path


def rows(path):
    out = json.loads(Path(path).read_text())
    sms = out["card"]["sms"]
    by = defaultdict(dict)
    for p in out["predictions"]:
        by[p["label"]][p["route"]] = p
    for label, routes in by.items():
        if "sm70-gqa-prefill" not in routes:
            continue
        q, kv, hq, hkv = (int(x) for x in re.match(r"Q=(\d+) KV=(\d+) Hq=(\d+) Hkv=(\d+)", label).groups())
        if q < 1024 or kv < 16384:  # routing.h: the long-prefill range
            continue
        g = routes["sm70-gqa-prefill"]
        yield sms, (q, hq, hkv), kv, g["vs_dense"], g["vs_dense_verdict"]


def main(paths):
    table = defaultdict(lambda: defaultdict(list))
    for path in paths:
        for sms, key, kv, ratio, verdict in rows(path):
            table[key][sms].append((kv, ratio, verdict))
    print(
        "| Q, Hq/Hkv | exact route's CTAs | average wave fill, 72 / 80 SMs | 72 SMs: ratio, verdicts by KV | "
        "80 SMs: ratio, verdicts by KV |"
    )
    print("|---|---|---|---|---|")
    for (q, hq, hkv), per in sorted(table.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        ctas = -(-q // 64) * hq
        fills = []
        for sms in (72, 80):
            waves = -(-ctas // sms)
            fills.append(f"{ctas / (waves * sms):.2f}" if waves > 1 else "one wave")
        cells = []
        for sms in (72, 80):
            got = sorted(per.get(sms, []))
            if not got:
                cells.append("-")
                continue
            lo, hi = min(r for _, r, _ in got), max(r for _, r, _ in got)
            marks = "".join({"faster": "F", "slower": "S", "not separated": "-"}[v] for _, _, v in got)
            cells.append(f"{lo:.2f}-{hi:.2f} {marks}")
        print(f"| {q:,}, {hq}/{hkv} | {ctas} | {fills[0]} / {fills[1]} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main(sys.argv[1:])
