# SPDX-License-Identifier: BSD-3-Clause
"""report --shapes for the sm70-gqa-prefill route on the CPU: the tests' oracle of the op's plan
against launches counted by hand, the route's HBM traffic walked by hand for a plan, launches that
mix two kinds of CTA, the prediction beside the dense route, and the geometry checks. (The real op's
plan against the oracle: test_real_series.)"""

from pathlib import Path

import pytest

import gqa_oracle
from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.routes import EXACT, GQA
from fa2patch.common.shapes import Shape
from fa2patch.model import gqa_route
from fa2patch.model.loop_mix import LoopMix
from fa2patch.model.report import PER_REQUEST, predict_routes, route_geometry, route_launches
from fa2patch.model.v100model import Card, CtaKind, KernelLaunch, estimate_launch, load_v100, lower_bound

ARTIFACT = Path("/nowhere/_vllm_fa2_C.abi3.so")
V100 = load_v100()
CAL = {"parameters": {"cycle_factor": 1.5, "cta_cycles": 0.0}, "range": [-0.1, 0.1]}


def gqa_geometry():
    """A build_info() entry of the long-prefill kernel as the extension declares it (report reads
    its tiles; the block plan comes from the op)."""
    return {
        "kernel": "sm70_gqa_prefill_kernel",
        "threads": 128,
        "dynamic_smem": 44032,
        "route": GQA,
        "head_dim": 256,
        "rows_per_cta": 64,
        "keys_per_iteration": 32,
        "warps": 4,
        "tiles": [
            {"kind": "qk", "rows_per_cta": 128, "keys_per_iteration": 128, "head_dims_per_iteration": 32},
            {"kind": "pv", "rows_per_cta": 64, "keys_per_iteration": 32, "head_dims_per_iteration": 256},
        ],
    }


def test_the_oracle_walk_counted_by_hand():
    """Q=256, KV=640, 2/1: 512 packed rows, one block of 640 keys; packed row r sees key
    j <= r // 2 + 384. Launch 0, qk: row tile t's last row sees up to 64 t + 447, so key tile 4
    (keys 512..) is idle for row tiles 0 and 1; launch 1, pv (first and last block): pv tile t's
    last row sees 32 t + 416 keys: 13 .. 20 chunks of 32."""
    p = gqa_oracle.plan(256, 640, 2, 1)
    assert (p["rows_pad"], p["block_keys"], p["num_blocks"]) == (512, 640, 1)
    assert [s["runs"] for s in p["steps"]] == [
        [["qk", 4, 8], ["idle", 1, 0], ["qk", 4, 8], ["idle", 1, 0], ["qk", 10, 8]],
        [["pv", 1, n] for n in range(13, 21)],
    ]
    # Q=KV=512, 1/1: row r sees key j <= r. Key tile k of row tile t runs where k <= t; pv tile t
    # sees 64 t + 64 keys.
    p = gqa_oracle.plan(512, 512, 1, 1)
    assert [s["runs"] for s in p["steps"]] == [
        [["qk", 1, 8], ["idle", 3, 0], ["qk", 2, 8], ["idle", 2, 0], ["qk", 3, 8], ["idle", 1, 0], ["qk", 4, 8]],
        [["pv", 1, n] for n in range(2, 17, 2)],
    ]
    # Q=64, KV=8,448, 1/1: blocks of 8,192 (the largest) and 256 keys; 64 rows padded to 128, the
    # padding rows seeing as far as row 63 and beyond (clamped to the last key).
    p = gqa_oracle.plan(64, 8448, 1, 1)
    assert (p["rows_pad"], p["block_keys"], p["num_blocks"]) == (128, 8192, 2)
    assert [s["runs"] for s in p["steps"]] == [[["qk", 64, 8]], [["pv", 2, 256], ["qk", 2, 8]], [["pv", 2, 8]]]
    assert [(s["pv"] or {}).get("last") for s in p["steps"]] == [None, False, True]


# A plan as the op describes it, for Q=256, KV=640, 2/1 in blocks of 256 keys (3 blocks: 256, 256,
# 128 keys), counted by hand: step 0: qk of block 0: 4 row tiles x 2 key tiles, all seen; step 1:
# pv of block 0 (8 row tiles x 8 chunks), qk of block 1 (8 tiles, all seen); step 2: pv of block 1:
# row tile t sees min(256, 32 t + 160) keys: 5, 6, 7, 8 x 5 chunks; qk of block 2 (key 512): rows
# below 2 x (512 - 384) = 256 see none: row tiles 2, 3; step 3: pv of block 2 (last): row tile t
# sees max(0, 32 t - 96) keys: 0 x 4, 1, 2, 3, 4.
def _block(b, key0, keys, **more):
    return {"block": b, "key0": key0, "num_keys": keys, **more}


HAND_PLAN = {
    "group": 2,
    "rows": 512,
    "rows_pad": 512,
    "block_keys": 256,
    "num_blocks": 3,
    "steps": [
        {"pv": None, "qk": _block(0, 0, 256, tiles=2, row_tile0=0, row_tiles=4), "runs": [["qk", 8, 8]]},
        {
            "pv": _block(0, 0, 256, first=True, last=False),
            "qk": _block(1, 256, 256, tiles=2, row_tile0=0, row_tiles=4),
            "runs": [["pv", 8, 8], ["qk", 8, 8]],
        },
        {
            "pv": _block(1, 256, 256, first=False, last=False),
            "qk": _block(2, 512, 128, tiles=1, row_tile0=2, row_tiles=2),
            "runs": [["pv", 1, 5], ["pv", 1, 6], ["pv", 1, 7], ["pv", 5, 8], ["qk", 2, 8]],
        },
        {
            "pv": _block(2, 512, 128, first=False, last=True),
            "qk": None,
            "runs": [["pv", 4, 0], ["pv", 1, 1], ["pv", 1, 2], ["pv", 1, 3], ["pv", 1, 4]],
        },
    ],
}


def test_launches_and_traffic_of_a_plan_walked_by_hand():
    """Bytes, by hand: a qk tile writes 128 x (128 x 2 + 4); Q is read once per row tile (128 x
    512 B), K and V once per block (keys x 512 B); a pv tile reads 64 x (chunks x 64 + tiles x 4)
    of scores and maxima and reads / writes the state 64 x (1024 + 8) unless first / last; the last
    writes out and lse, 64 x (512 + 4). Launches: one per step, its CTAs in the plan's order."""
    shape = Shape(256, 640, 2, 1, 256, True, 0.0625)
    kernel = {
        "kernel": "gqa",
        "geometry": gqa_geometry(),
        "occupancy": {"blocks_per_sm": 2},
        "hot_loops": [loop(16), loop(0)],
    }
    launches, plan = gqa_route.launches(shape, kernel, HAND_PLAN)
    assert plan == {"block_keys": 256, "blocks": 3, "splits": 1}
    kinds = [[(k.loop.mufu, n) for k in x.kinds() for n in k.iterations] for x in launches]
    assert kinds == [
        [(0, 8)] * 8,
        [(16, 8)] * 8 + [(0, 8)] * 8,
        [(16, n) for n in (5, 6, 7, 8, 8, 8, 8, 8)] + [(0, 8)] * 2,
        [(16, n) for n in (0, 0, 0, 0, 1, 2, 3, 4)],
    ]
    qk_tile, q_tile, state, out = 128 * 260, 128 * 512, 64 * 1032, 64 * 516
    step0 = 8 * qk_tile + 4 * q_tile + 256 * 512
    step1 = 8 * (64 * (8 * 64 + 2 * 4) + state) + 256 * 512 + step0
    pv1 = sum(64 * (c * 64 + 2 * 4) for c in (5, 6, 7)) + 5 * 64 * (8 * 64 + 2 * 4) + 8 * 2 * state
    step2 = pv1 + 256 * 512 + 2 * qk_tile + 2 * q_tile + 128 * 512
    pv2 = sum(64 * (c * 64 + 4) for c in (1, 2, 3, 4)) + 8 * (state + out)
    step3 = pv2 + 128 * 512
    assert [x.hbm_bytes for x in launches] == [step0, step1, step2, step3]


def test_a_launch_with_two_kinds_of_cta():
    """Kind A: 3 iterations of 50 HMMA steps (104.785 tensor cycles: a lone warp issues an mma
    every 8.382812 cycles; 100 at the peak, for the bound); kind B: two CTAs of 5 iterations of 40
    issue cycles; one warp per scheduler, no latency, no epilogue. One slot: 314.36 + 200 + 200
    cycles; two SMs: the B CTAs queue behind each other on the slot that frees first: 400."""
    a = LoopMix(hmma_f32_steps=50)  # 50 steps x 2 clocks
    b = LoopMix(instructions=40)
    launch = KernelLaunch("k", a, (3,), 4, 1, prologue_load_rounds=0, more=(CtaKind(b, (5, 5), LoopMix(), 0),))
    one = estimate_launch(launch, Card(1, 1000), V100)
    assert one["compute_cycles"] == pytest.approx(3 * 50 * 8.382812 / 4 + 400) and one["ctas"] == 3
    assert one["cta_iterations"] == 13
    assert [k["binding"] for k in one["kinds"]] == ["tensor", "issue"]
    two = estimate_launch(launch, Card(2, 1000), V100)
    assert two["compute_cycles"] == 400
    bound = lower_bound(launch, Card(2, 1000), V100)
    assert bound["cycles"] == {"throughput": 350, "cta_granularity": 400}


def loop(mufu, hmma_steps=512, instructions=700):
    mix = {**vars(LoopMix()), "instructions": instructions, "hmma_f32_steps": hmma_steps, "mufu": mufu}
    outside = {
        "instructions": 1000,
        "mix": {},
        "load_rounds": 2,
        "model_mix": {**vars(LoopMix()), "instructions": 1000, "load_use_gaps": ()},
    }
    return {
        "mix": {"hmma": hmma_steps, "mufu": mufu},
        "model_mix": mix,
        "binding": "tensor",
        "outside": outside,
        "cycles": LoopMix(**mix).pipes(1, V100),
    }


def gqa_rows():
    dense_geo = {
        "kernel": "flash_fwd_sm70_kernel<256>",
        "threads": 128,
        "dynamic_smem": 1,
        "route": EXACT,
        "head_dim": 256,
        "rows_per_cta": 64,
        "keys_per_iteration": 32,
        "warps": 4,
    }
    dense = {"kernel": "dense", "geometry": dense_geo, "occupancy": {"blocks_per_sm": 1}, "hot_loops": [loop(0)]}
    gqa = {
        "kernel": "gqa",
        "geometry": gqa_geometry(),
        "occupancy": {"blocks_per_sm": 2},
        "hot_loops": [loop(16), loop(0)],
    }
    return dense, gqa


def test_route_estimate_and_ab_against_the_dense_route():
    """Both routes are predicted for an eligible shape, with the dense route's calibrated time
    over the long-prefill one; the long-prefill kernel's launches are one per step of the op's plan."""
    dense, gqa = gqa_rows()
    shape = Shape(1024, 4096, 6, 1, 256, True, 0.0625)
    plans = {gqa_route.sizes(shape): gqa_oracle.plan(1024, 4096, 6, 1)}
    d, g = predict_routes(
        shape, [dense, gqa], Card(80, 1000), V100, CAL, ARTIFACT, (), plans
    )  # locked below every duty clock
    assert (d["route"], g["route"]) == (EXACT, GQA)
    assert g["vs_dense"] == pytest.approx(d["calibrated_ms"] / g["calibrated_ms"])
    # Ranges of +-10%: separated only where one route is more than 1.1 / 0.9 = 1.22x faster.
    expected = "faster" if g["vs_dense"] > 1.1 / 0.9 else "slower" if g["vs_dense"] < 0.9 / 1.1 else "not separated"
    assert g["vs_dense_verdict"] == expected
    # Each route with its own class's range (anchors.toml [route_class]): a narrow one for the
    # long-prefill route separates it at a smaller margin.
    by_class = {**CAL, "route_ranges": {GQA: [-0.01, 0.01]}}
    d2, g2 = predict_routes(shape, [dense, gqa], Card(80, 1000), V100, by_class, ARTIFACT, (), plans)
    assert (g2["calibrated_ms_low"], g2["calibrated_ms_high"]) == (
        pytest.approx(0.99 * g2["calibrated_ms"]),
        pytest.approx(1.01 * g2["calibrated_ms"]),
    )
    assert d2["calibrated_ms_high"] == pytest.approx(1.1 * d2["calibrated_ms"])
    ratio = g2["vs_dense"]
    assert g2["vs_dense_verdict"] == (
        "faster" if ratio > 1.01 / 0.9 else "slower" if ratio < 0.99 / 1.1 else "not separated"
    )
    assert g["calibrated_ms"] == pytest.approx(1.5 * g["model_ms"]) and g["bound_ms"] < g["model_ms"]
    assert len(g["launches"]) == g["plan"]["blocks"] + 1 == len(plans[gqa_route.sizes(shape)]["steps"])
    # Not eligible: non-causal, another head dim, a batch: the dense route alone (no plan asked for).
    dense_geo = dense["geometry"]
    for other in (
        Shape(1024, 4096, 6, 1, 256, False, 0.0625),
        Shape(1024, 4096, 6, 1, 128, True, 0.1),
        Shape(1024, 4096, 6, 1, 256, True, 0.0625, b=2),
    ):
        kernels = [dense, gqa] if other.d == 256 else [{**dense, "geometry": {**dense_geo, "head_dim": 128}}, gqa]
        assert [p["route"] for p in predict_routes(other, kernels, Card(80), V100, CAL, ARTIFACT)] == [EXACT]


def test_a_batch_with_decode_rows_split_as_the_v100_backend_runs_it():
    """A chunk with decode rows (vLLM's scheduler batch): besides the whole batch on the exact route,
    the V100 backend's split: the chunk's long-prefill launches (as the chunk alone has them) then the
    decode rows' exact-route launches (as a batch of single-query sequences alone has them)."""
    dense, gqa = gqa_rows()
    batch = Shape(1024, 4096, 6, 1, 256, True, 0.0625, decode=8, decode_kv=2048)
    chunk, decodes = Shape(1024, 4096, 6, 1, 256, True, 0.0625), Shape(1, 2048, 6, 1, 256, True, 0.0625, b=8)
    plans = {gqa_route.sizes(chunk): gqa_oracle.plan(1024, 4096, 6, 1)}
    card = Card(80, 1000)
    whole, split = predict_routes(batch, [dense, gqa], card, V100, CAL, ARTIFACT, (), plans)
    (alone_chunk_dense, alone_chunk) = predict_routes(chunk, [dense, gqa], card, V100, CAL, ARTIFACT, (), plans)
    (alone_decodes,) = predict_routes(decodes, [dense, gqa], card, V100, CAL, ARTIFACT, (), plans)
    assert (whole["route"], split["route"]) == (EXACT, PER_REQUEST)
    names = lambda p: [x["name"] for x in p["launches"]]  # noqa: E731
    assert names(split) == names(alone_chunk) + names(alone_decodes)
    assert split["plan"] == {"chunk": alone_chunk["plan"], "decodes": alone_decodes["plan"]}
    assert split["vs_dense"] == pytest.approx(whole["calibrated_ms"] / split["calibrated_ms"])
    assert split["useful_flops"] == whole["useful_flops"]
    # No split where the chunk is not the long-prefill op's (head dim 128) or there are no decode rows.
    dense_geo = {**dense["geometry"], "head_dim": 128}
    other = Shape(1024, 4096, 6, 1, 128, True, 0.1, decode=8)
    routes = [
        p["route"] for p in predict_routes(other, [{**dense, "geometry": dense_geo}, gqa], card, V100, CAL, ARTIFACT)
    ]
    assert routes == [EXACT] and PER_REQUEST not in [p["route"] for p in (alone_chunk_dense, alone_chunk)]


def test_what_the_op_refuses_is_no_route_and_a_missing_plan_is_an_error():
    """A shape the op refuses (gqa_prefill_plan raised: 32 query heads per KV head) has no long-prefill
    prediction; an extension without the plan op, or a plan never read, is an error naming it."""
    dense, gqa = gqa_rows()
    shape = Shape(100, 300, 32, 1, 256, True, 0.0625)
    refused = {gqa_route.sizes(shape): {"error": "ValueError: ... at most 16 query heads per KV head", "refused": True}}
    assert [p["route"] for p in predict_routes(shape, [dense, gqa], Card(80), V100, CAL, ARTIFACT, (), refused)] == [
        EXACT
    ]
    with pytest.raises(EnvironmentProblem, match=r"no model of route 'sm70-gqa-prefill'"):
        route_launches(shape, [dense, gqa], GQA, Card(80), ARTIFACT, refused)
    missing = {gqa_route.sizes(shape): {"error": "this extension has no gqa_prefill_plan op (a build before it)"}}
    for plans, why in ((missing, "this extension has no gqa_prefill_plan op"), ({}, "not read")):
        with pytest.raises(EnvironmentProblem, match=rf"no long-prefill plan for Q=100 KV=300 .*: {why}"):
            predict_routes(shape, [dense, gqa], Card(80), V100, CAL, ARTIFACT, (), plans)


def test_gqa_geometry_is_checked():
    info = {"kernels": [gqa_geometry()]}
    assert route_geometry(info, ARTIFACT, GQA)[0]["tiles"][0]["kind"] == "qk"
    no_pv = {"kernels": [{**gqa_geometry(), "tiles": gqa_geometry()["tiles"][:1]}]}
    with pytest.raises(EnvironmentProblem, match=r"lacks tiles\[pv\].rows_per_cta"):
        route_geometry(no_pv, ARTIFACT, GQA)


def test_each_tile_is_charged_the_code_its_ctas_can_reach():
    """A dispatch branch (0x10) sends tile B's CTAs past tile A's loop; tile A's epilogue sits at
    the end of the function (0xc0), after tile B's code, as the compiler may place it. Every
    other branch counts both ways; an unpredicated BRA or EXIT does not fall through."""
    from fa2patch.compile import sass
    from fa2patch.model.sass_mix import tile_code

    def ins(addr, op, target=None, predicated=False):
        return sass.Instr(addr, op, target, "", predicated)

    f = sass.SassFunction(
        "k",
        "sm_70",
        [
            ins(0x00, "S2R"),
            ins(0x10, "BRA", 0x70, True),
            ins(0x20, "HMMA.884.F32.F32.STEP0"),
            ins(0x30, "BRA", 0x20, True),  # loop A
            ins(0x40, "BRA", 0x60, True),
            ins(0x50, "FADD"),
            ins(0x60, "BRA", 0xC0),
            ins(0x70, "HMMA.884.F32.F32.STEP0"),
            ins(0x80, "BRA", 0x70, True),  # loop B
            ins(0x90, "FMUL"),
            ins(0xA0, "EXIT"),
            ins(0xB0, "FFMA"),  # 0xb0: dead
            ins(0xC0, "STG.E.SYS"),
            ins(0xD0, "EXIT"),
        ],
    )
    loops = sorted(f.hot_loops(), key=lambda lp: lp.start)
    a, b = tile_code(f, loops)
    assert [i.addr for i in a] == [0x00, 0x10, 0x40, 0x50, 0x60, 0xC0, 0xD0]
    assert [i.addr for i in b] == [0x00, 0x10, 0x90, 0xA0]
    # Without a branch that separates the loops, the report refuses to guess.
    f.instrs[1] = ins(0x10, "BRA", 0x40, True)
    with pytest.raises(EnvironmentProblem, match="cannot tell the tiles' code apart"):
        tile_code(f, sorted(f.hot_loops(), key=lambda lp: lp.start))
