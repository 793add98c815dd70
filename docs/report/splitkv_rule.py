# SPDX-License-Identifier: BSD-3-Clause
"""Where the exact route with split-KV separates from the unsplit exact route (issue 17 item 4), and
how a rule on host-side call properties agrees with it.

Runs report's model in-process on the sm_70 build (its SASS read once) over a grid of calls on 72
and 80 SMs: single prefill sequences (heads x head dim x Q x KV) and batches of one prefill chunk
with decode rows (decode=N, dkv=K). Per call and split count: the exact route's and the split
route's calibrated times, their ratio and verdict (ranges.versus_one_kernel: the ratio under every
held-out parameter set against the split-D class's leave-one-out margin), and the ratio's spread over the 14
leave-one-out parameter sets and over the 3 leave-one-kernel-out ones (the model's parameter
uncertainty for two routes that share one kernel; without split-D's anchors the cost per fused CTA
is 0). Then the proposed rule
(``rule``) against the verdicts: calls it splits whose ranges do not separate (must be none),
and separated calls it leaves unsplit.

    PYTHONPATH=tools python docs/report/splitkv_rule.py build/sm_70/_vllm_fa2_C.abi3.so > splitkv-rule.jsonl
    python docs/report/splitkv_rule.py --summary splitkv-rule.jsonl
"""

import json
import sys
from pathlib import Path

from fa2patch.model.exact_route import SPLIT_CANDIDATES as SPLITS, SPLIT_MIN_GAIN as MIN_GAIN, prefill_splits

ROWS_PER_CTA, KEYS_PER_BLOCK = 64, 32  # build_info(): every sm70-dense kernel


def rule(heads_q: int, max_seqlen_q: int, max_seqlen_k: int, batch: int, sms: int, ctas_per_sm: int) -> int:
    """The built-in rule (exact_route.prefill_splits): splits for a call the exact route takes (1:
    none). One sequence only (a batch's sequence lengths are on the device)."""
    if batch != 1 or max_seqlen_q < 2:
        return 1
    ctas = -(-max_seqlen_q // ROWS_PER_CTA) * heads_q
    return prefill_splits(ctas, -(-max_seqlen_k // KEYS_PER_BLOCK), sms * ctas_per_sm)


def shapes():
    from fa2patch.common.shapes import Shape

    heads = {
        256: [(1, 1), (2, 1), (4, 1), (6, 1), (8, 1), (12, 2), (16, 2), (32, 4)],
        128: [(4, 1), (8, 2), (16, 4), (32, 8)],
        64: [(8, 2), (32, 8)],
    }
    for d, hs in heads.items():
        for hq, hkv in hs:
            for q in (64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096):
                for kv in sorted({q, 4096, 16384, 65536, 131072}):
                    if kv >= q:
                        yield Shape(q, kv, hq, hkv, d, True, d**-0.5)
    for d, hq, hkv in ((256, 6, 1), (128, 32, 8), (128, 8, 2)):
        for q in (256, 512, 1024, 2048, 4096):
            for kv in (16384, 131072):
                for decode in (1, 4, 16, 64, 256):
                    for dkv in (1024, 4096, 32768):
                        yield Shape(q, kv, hq, hkv, d, True, d**-0.5, 1, decode, dkv)


def run(artifact: Path) -> None:
    from fa2patch.compile.extension import launches_of, load_build_info
    from fa2patch.model import report
    from fa2patch.model.calibration import calibrate
    from fa2patch.model.ranges import held_out_parameters, versus_one_kernel
    from fa2patch.model.v100model import Calibration, Card, load_v100, route_timer

    v100 = load_v100()
    cal = calibrate(v100)
    info = load_build_info(artifact)
    rows = report.kernel_rows(artifact, "sm_70", launches_of(info), report.route_geometry(info, artifact))
    held_out = [Calibration(**x) for x in held_out_parameters(cal)]  # leave-one-out, then by kernel
    loo, loko = held_out[: len(cal["anchors"])], held_out[len(cal["anchors"]) :]
    for sms in (72, 80):
        card = Card(sms, 1530)
        for shape in shapes():
            dense = report.predict(shape, rows, card, v100, cal, artifact)
            kernel = report.dense_kernel(shape, rows, artifact)
            dense_timer = route_timer(report.dense_launches(shape, kernel, card)[0], card, v100)
            out = {
                "sms": sms,
                "label": shape.label,
                "q": shape.q,
                "kv": shape.kv,
                "hq": shape.hq,
                "hkv": shape.hkv,
                "d": shape.d,
                "decode": shape.decode,
                "dkv": shape.dkv if shape.decode else 0,
                "ctas_per_sm": kernel["occupancy"]["blocks_per_sm"],
                "dense_ms": dense["calibrated_ms"],
                "rule": rule(
                    shape.hq,
                    shape.q,
                    max(shape.kv, shape.dkv if shape.decode else 0),
                    shape.b + shape.decode,
                    sms,
                    kernel["occupancy"]["blocks_per_sm"],
                ),
                "splits": {},
            }
            for s in SPLITS:
                split = report.predict_split(shape, rows, card, v100, cal, artifact, s)
                launches = report.splitkv_launches(
                    shape, kernel, next(k["combine"] for k in rows if "combine" in k), s
                )[0]
                timer = route_timer(launches, card, v100)
                spread = [dense_timer(c) / timer(c) for c in loo]
                by_kernel = [dense_timer(c) / timer(c) for c in loko]
                v = versus_one_kernel(split, dense, "vs_dense", spread + by_kernel, cal)  # held_out_parameters' order
                out["splits"][s] = {
                    "ms": split["calibrated_ms"],
                    "ratio": v["vs_dense"],
                    "verdict": v["vs_dense_verdict"],
                    "loo_ratio": [min(spread), max(spread)],
                    "loko_ratio": [min(by_kernel), max(by_kernel)],
                }
            print(json.dumps(out), flush=True)


def summary(path: Path) -> None:
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    wrong, missed, agreed = [], [], []
    for r in recs:
        faster = {int(s): x for s, x in r["splits"].items() if x["verdict"] == "faster"}
        if r["rule"] > 1 and r["rule"] not in faster:
            wrong.append(r)
        elif r["rule"] == 1 and faster:
            missed.append(r)
        elif r["rule"] > 1:
            agreed.append(r)
    best = lambda r: max(r["splits"].items(), key=lambda kv: kv[1]["ratio"])  # noqa: E731
    print(
        f"{len(recs)} calls; the rule splits {len(agreed) + len(wrong)}: separated in its favour {len(agreed)} "
        f"(the model's best split count: {sum(int(best(r)[0]) == r['rule'] for r in agreed)}), NOT separated "
        f"{len(wrong)}; separated calls it leaves unsplit: {len(missed)} "
        f"({sum(1 for r in missed if r['decode'])} of them batches with decode rows)"
    )
    ratios = sorted((r["splits"][str(r["rule"])]["ratio"], r["sms"], r["label"]) for r in agreed)
    print(
        f"exact / split where the rule splits: {ratios[0][0]:.3f} ({ratios[0][1]} SMs {ratios[0][2]}) .. "
        f"{ratios[-1][0]:.3f}"
    )
    split = [r["splits"][str(r["rule"])] for r in agreed + wrong]
    low = min(split, key=lambda x: min(x["loo_ratio"] + x["loko_ratio"]), default=None)
    if low:
        print(
            f"where the rule splits, exact / split over every held-out parameter set (leave-one-out and "
            f"leave-one-kernel-out): at least {min(low['loo_ratio'] + low['loko_ratio']):.3f}; below {MIN_GAIN} "
            f"under some set: {sum(min(x['loo_ratio'] + x['loko_ratio']) < MIN_GAIN for x in split)} calls"
        )
    for name, group in (
        ("rule splits, NOT separated", wrong),
        ("one sequence, separated, rule does not split", [r for r in missed if not r["decode"]]),
    ):
        print(f"\n{name}:")
        for r in group:
            s, x = best(r)
            print(
                f"  {r['sms']} SMs {r['label']}: rule x{r['rule']}; best x{s} {x['ratio']:.3f} ({x['verdict']}; "
                f"over the held-out parameters {min(x['loo_ratio'] + x['loko_ratio']):.3f}-"
                f"{max(x['loo_ratio'] + x['loko_ratio']):.3f})"
            )
    print(
        "\nBatches (one prefill chunk + decode rows): decode-row counts at which a split count separates in "
        "favour of split-KV (best split, exact/split), else -"
    )
    rows = {}
    for r in (r for r in recs if r["decode"]):
        key = (f"{r['hq']}/{r['hkv']}, {r['d']}", r["q"], r["kv"], r["dkv"])
        s, x = best(r)
        mark = f"{r['decode']}: x{s} {x['ratio']:.2f}" if x["verdict"] == "faster" else None
        rows.setdefault(key, {}).setdefault(r["sms"], []).append(mark)
    print("| Hq/Hkv, D | Q | KV | decode rows' KV | 72 SMs | 80 SMs |\n|---|---|---|---|---|---|")
    for (heads, q, kv, dkv), per in rows.items():
        cells = ["; ".join(m for m in per.get(sms, []) if m) or "-" for sms in (72, 80)]
        print(f"| {heads} | {q:,} | {kv:,} | {dkv:,} | {cells[0]} | {cells[1]} |")
    slower = sum(1 for r in recs for x in r["splits"].values() if x["verdict"] == "slower")
    print(f"\n(call, split count) pairs separated against split-KV: {slower}")


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        summary(Path(sys.argv[2]))
    else:
        run(Path(sys.argv[1]))
