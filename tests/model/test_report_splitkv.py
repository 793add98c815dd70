# SPDX-License-Identifier: BSD-3-Clause
"""report's split-KV model of the exact route (exact_route.py) on the CPU: the grid against a
literal walk of the kernel's rule, the partial-buffer bytes and the combine kernel by hand, a
whole split route timed by hand, and the verdicts against the unsplit exact route and the
long-prefill route."""

import itertools
from dataclasses import replace
from pathlib import Path

import pytest

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.routes import EXACT, GQA, SPLITKV
from fa2patch.common.shapes import Shape, parse_shapes, useful_flops
from fa2patch.model import exact_route as x
from fa2patch.model.report import PER_REQUEST, predict_routes
from fa2patch.model.v100model import Card, LoopMix, fa2_grid_iterations, load_v100
from helpers import dense_geometry

ARTIFACT = Path("/nowhere/_vllm_fa2_C.abi3.so")
V100 = load_v100()
LATENCY = V100["dependent_ldg_l2_hit_cycles"]
CAL = {"parameters": {"cycle_factor": 1.5, "cta_cycles": 0.0}, "range": [-0.1, 0.2]}


def c_div(a: int, b: int) -> int:
    """C's integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def kernel_walk(shape: Shape, rows: int, keys: int, splits: int):
    """flash_fwd_sm70_kernel's grid as the CUDA code reads: grid (ceil(max_seqlen_q / rows), b,
    h x splits), blockIdx.x fastest; bidh = z % h, n_split = z / h; return when m x rows >=
    seqlen_q; mask.visible_blocks with window_right = 0 for causal (C division); split n takes
    [min + n per, min(max, min + n per + per)), per = ceil_div(max - min, splits)."""
    seqs = [(1, shape.dkv)] * shape.decode + [(shape.q, shape.kv)] * shape.b
    max_q = max(q for q, _ in seqs)
    its, idle = [], 0
    for z in range(shape.hq * splits):
        n_split = z // shape.hq
        for seqlen_q, seqlen_k in seqs:
            for m in range(c_div(max_q + rows - 1, rows)):
                if m * rows >= seqlen_q:
                    idle += 1
                    continue
                shift = seqlen_k - seqlen_q
                end = c_div(seqlen_k + keys - 1, keys)
                if shape.causal:
                    end = min(end, c_div((m + 1) * rows + shift + keys - 1, keys))
                begin = 0
                if splits > 1 and end > begin:
                    per = c_div(end - begin + splits - 1, splits)
                    begin += n_split * per
                    end = min(end, begin + per)
                its.append(max(0, end - begin))
    return its, idle


SHAPES = [
    Shape(1000, 31, 3, 1, 64, True, 0.1),
    Shape(100, 50, 2, 1, 64, True, 0.1),
    Shape(130, 7000, 2, 2, 64, True, 0.1),
    Shape(64, 64, 1, 1, 64, False, 0.1),
    Shape(8000, 40000, 6, 1, 256, True, 0.1),
    Shape(700, 333, 4, 2, 128, True, 0.1, b=3),
    Shape(2048, 32768, 6, 1, 256, True, 0.1, decode=5, decode_kv=4000),
    Shape(200, 900, 2, 1, 64, True, 0.1, b=2, decode=3),
    Shape(65, 1, 1, 1, 64, True, 0.1),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.label)
@pytest.mark.parametrize("splits", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("rows, keys", [(64, 32), (128, 64)])
def test_split_grid_is_the_kernels_rule(shape, splits, rows, keys):
    assert x.prefill_iterations(shape, rows, keys, splits) == kernel_walk(shape, rows, keys, splits)


@pytest.mark.parametrize("shape", [s for s in SHAPES if not s.decode], ids=lambda s: s.label)
def test_unsplit_grid_is_the_fa2_grid_of_the_anchors(shape):
    its, idle = x.prefill_iterations(shape, 64, 32, 1)
    assert idle == 0 and sorted(its) == sorted(
        fa2_grid_iterations(shape.q, shape.kv, shape.causal, 64, 32, shape.hq, shape.b)
    )


def test_splits_keep_every_key_block_once():
    shape = Shape(4096, 32768, 6, 1, 256, True, 0.0625)
    whole, _ = x.prefill_iterations(shape, 64, 32, 1)
    for s in (2, 3, 4):
        its, _ = x.prefill_iterations(shape, 64, 32, s)
        assert len(its) == s * len(whole) and sum(its) == sum(whole)
        # 384 CTAs: 5.33 waves on 72 SMs; x3: 1,152 CTAs = 16 waves (the example).
    assert len(whole) == 384 and len(x.prefill_iterations(shape, 64, 32, 3)[0]) == 16 * 72


def test_decode_rows_in_a_batch():
    # q=200 (4 blocks of 64) with 3 decode rows of 900 keys: per head and split the decode rows'
    # CTA 0 runs ceil(900 / 32) = 29 blocks split; their blocks 1..3 return at once.
    shape = parse_shapes("q=200,kv=900,hq=2,hkv=1,d=64,decode=3")[0]
    assert (shape.decode, shape.dkv) == (3, 900) and shape.label.endswith("+3 decode KV=900")
    its, idle = x.prefill_iterations(shape, 64, 32, 2)
    assert idle == 2 * 2 * 3 * 3
    assert its[:3] == [15, 15, 15] and its[3:7] == [ceil_share(m) for m in range(4)]
    # useful FLOPs: the chunk's causal pairs plus each decode row's 900 keys.
    pairs = sum(max(0, min(900, i + 900 - 200 + 1)) for i in range(200)) + 3 * 900
    assert useful_flops(shape) == 4.0 * 2 * 64 * pairs
    with pytest.raises(EnvironmentProblem, match="q must be >= 2"):
        parse_shapes("q=1,kv=900,hq=2,hkv=1,d=64,decode=3")


def ceil_share(m: int) -> int:
    """Split 0's share of CTA m of the q=200, kv=900 sequence: ceil(v / 2), v = its visible blocks."""
    v = min(29, -(-((m + 1) * 64 + 700) // 32))
    return -(-v // 2)


def combine_row(threads=128, blocks=2, loop_instructions=8):
    mix = {**vars(LoopMix()), "instructions": loop_instructions}
    return {
        "threads": threads,
        "blocks_per_sm": blocks,
        "loop": {"model_mix": mix},
        "outside": {"model_mix": vars(LoopMix())},
    }


def test_partial_bytes_and_the_combine_launch_by_hand():
    # Q=100 with 2 decode rows of 50 keys, 4/2 heads, d=64, 3 splits: 102 tokens x 4 heads = 408 rows.
    shape = Shape(100, 300, 4, 2, 64, True, 0.1, decode=2, decode_kv=50)
    kernel = kernel_row(64)
    launches, plan = x.splitkv_launches(shape, kernel, combine_row(), 3)
    q = 102 * 4 * 64 * 2
    partials = 3 * 408 * (64 * 4 + 4)
    kv = 2 * (300 + 2 * 50) * 2 * 64 * 2
    assert plan["partial_bytes"] == partials
    assert launches[0].hbm_bytes == 3 * q + kv + partials  # each split reads its Q, writes partials
    assert launches[1].hbm_bytes == partials + q + 408 * 4  # reads partials, writes O and the LSE
    # One warp per row: 4 rows per 128-thread CTA, ceil(64 / 64) = 1 trip of the column loop.
    comb = launches[1]
    assert (len(comb.iterations), set(comb.iterations), comb.warps_per_cta, comb.ctas_per_sm, comb.fused) == (
        102,
        {1},
        4,
        2,
        False,
    )
    assert (
        launches[0].fused
        and len(x.splitkv_launches(replace(shape, d=256), kernel_row(256), combine_row(), 3)[0][1].iterations) == 102
    )
    assert set(x.splitkv_launches(replace(shape, d=200), kernel_row(256), combine_row(), 3)[0][1].iterations) == {4}


def kernel_row(head_dim, instructions=600, **geo):
    mix = {**vars(LoopMix()), "instructions": instructions}
    loop = {"mix": {"hmma": 256}, "model_mix": mix, "cycles": LoopMix(**mix).pipes(1, V100)}
    return {
        "kernel": f"flash_fwd_sm70_kernel<{head_dim}>",
        "geometry": dense_geometry(head_dim, **geo),
        "occupancy": {"blocks_per_sm": 1},
        "hot_loops": [loop],
    }


def test_a_split_route_timed_by_hand():
    """Non-causal Q=320 (5 CTAs), KV=192 (6 blocks), one head, on 4 SMs at a locked 1,000 MHz,
    cycle factor 1.5: an iteration is 600 issue cycles (one warp per scheduler) x 1.5 = 900, a CTA
    waits one load round (L) before it. Unsplit: 5 CTAs of 6 iterations on 4 SMs = 2 waves;
    split 2: 10 CTAs of 3 on 4 = 3 waves, then the combine: 320 rows / 4 = 80 CTAs of one
    8-instruction trip, 2 per SM (8 slots): 10 waves of 1.5 x 2 x 8 = 24 cycles."""
    shape = Shape(320, 192, 1, 1, 64, False, 0.1)
    rows = [kernel_row(64), {"kernel": "combine", "combine": combine_row(), "hot_loops": []}]
    card = Card(4, 1000)
    dense, split = predict_routes(shape, rows, card, V100, CAL, ARTIFACT, (2,))
    assert dense["calibrated_ms"] == pytest.approx(2 * (1.5 * LATENCY + 6 * 900) / 1e6)
    assert split["calibrated_ms"] == pytest.approx((3 * (1.5 * LATENCY + 3 * 900) + 10 * 24) / 1e6)
    assert (split["route"], split["plan"]["splits"], split["vs_dense"]) == (
        SPLITKV,
        2,
        pytest.approx(dense["calibrated_ms"] / split["calibrated_ms"]),
    )


def test_split_rows_and_their_verdicts():
    """Split rows follow the exact and long-prefill rows on prefill shapes; vs_dense / vs_gqa are
    the other route's time over the split one's, "faster"/"slower" only where the ranges (x0.9 ..
    x1.2 here) do not overlap; no split row for decode (q=1) or without a combine kernel."""
    from test_report_gqa import gqa_geometry, loop as gqa_loop

    import gqa_oracle

    dense = kernel_row(256, instructions=2000, warps=8)
    gqa = {
        "kernel": "gqa",
        "geometry": gqa_geometry(),
        "occupancy": {"blocks_per_sm": 2},
        "hot_loops": [gqa_loop(16), gqa_loop(0)],
    }
    rows = [dense, gqa, {"kernel": "combine", "combine": combine_row(), "hot_loops": []}]
    shapes = (
        Shape(1024, 16384, 6, 1, 256, True, 0.0625),
        Shape(2048, 8192, 6, 1, 256, True, 0.0625, decode=40),
        Shape(4096, 32768, 6, 1, 256, True, 0.0625),
    )
    decode = Shape(1, 4096, 6, 1, 256, True, 0.0625)  # report models the long-prefill op at q=1 too
    plans = {(s.q, s.kv, s.hq, s.hkv): gqa_oracle.plan(s.q, s.kv, s.hq, s.hkv) for s in (*shapes, decode, SHAPES[4])}
    for shape in shapes:
        preds = predict_routes(shape, rows, Card(72, 1000), V100, CAL, ARTIFACT, (2, 3, 4), plans)
        routes = [(p["route"], p["plan"].get("splits", 1)) for p in preds]
        has_gqa = not shape.decode
        backend = [(PER_REQUEST, 1)] * (not has_gqa)  # the V100 backend's split of a batch with decode rows
        assert routes == [(EXACT, 1)] + [(GQA, 1)] * has_gqa + backend + [(SPLITKV, s) for s in (2, 3, 4)]
        d, g = preds[0], (preds[1] if has_gqa else None)
        for p in preds[1 + has_gqa + len(backend) :]:
            for key, other in (("vs_dense", d), ("vs_gqa", g)):
                if other is None:
                    assert key not in p
                    continue
                assert p[key] == pytest.approx(other["calibrated_ms"] / p["calibrated_ms"])
                ratio = p[key]
                assert p[f"{key}_verdict"] == (
                    "faster" if ratio > 1.2 / 0.9 else "slower" if ratio < 0.9 / 1.2 else "not separated"
                )
    assert [p["route"] for p in predict_routes(decode, rows, Card(72), V100, CAL, ARTIFACT, (2,), plans)] == [
        EXACT,
        GQA,
    ]
    no_combine = [dense, gqa]
    assert [p["route"] for p in predict_routes(SHAPES[4], no_combine, Card(72), V100, CAL, ARTIFACT, (2,), plans)] == [
        EXACT,
        GQA,
    ]


def test_split_and_unsplit_are_judged_by_their_ratio_under_every_held_out_fit():
    """Two routes of one kernel: the verdict is the ratio exact / split under each held-out parameter
    set (recomputed here with estimate_route), against (1 + the largest) / (1 + the smallest)
    leave-one-out residual of the route's class; the ranges play no part (x0.9 .. x1.2 here would
    need 1.33x)."""
    from fa2patch.model.report import dense_launches, splitkv_launches
    from fa2patch.model.v100model import Calibration, estimate_route

    dense = kernel_row(256, instructions=2000, warps=8)
    rows = [dense, {"kernel": "combine", "combine": combine_row(), "hot_loops": []}]
    card = Card(72, 1000)
    sets = [{"cycle_factor": 1.5, "cta_cycles": 0.0}, {"cycle_factor": 1.4, "cta_cycles": 60000.0}]
    residuals = [-0.05, 0.05]  # margin 1.05 / 0.95 = 1.105
    cal = {
        **CAL,
        "anchors": [
            {"loo_parameters": p, "loo_residual": r, "class": "fused"} for p, r in zip(sets, residuals, strict=True)
        ],
        "classes": [{"class": "fused", "parameters": None}],
        "route_class": {SPLITKV: {"classes": ["fused"]}},
    }
    verdicts = set()
    # Q=1,024: every split clears 1.105 under both sets (x2: 1.29-1.32, where the ranges would not
    # separate); Q=4,096: none does.
    for shape, n in itertools.product(
        (Shape(1024, 16384, 6, 1, 256, True, 0.0625), Shape(4096, 32768, 6, 1, 256, True, 0.0625)), (2, 3, 4)
    ):
        split = next(p for p in predict_routes(shape, rows, card, V100, cal, ARTIFACT, (n,)) if p["route"] == SPLITKV)
        ratios = [
            estimate_route(dense_launches(shape, dense, card)[0], card, V100, Calibration(**p))["ms"]
            / estimate_route(splitkv_launches(shape, dense, combine_row(), n)[0], card, V100, Calibration(**p))["ms"]
            for p in sets
        ]
        assert split["vs_dense_held_out"] == [pytest.approx(min(ratios)), pytest.approx(max(ratios))]
        assert split["vs_dense_needs"] == pytest.approx(1.05 / 0.95)
        lo, hi = min(ratios), max(ratios)
        expected = "faster" if lo > 1.05 / 0.95 else "slower" if hi < 0.95 / 1.05 else "not separated"
        assert split["vs_dense_verdict"] == expected
        verdicts.add((shape.q, expected))
    assert verdicts == {(1024, "faster"), (4096, "not separated")}
