# SPDX-License-Identifier: BSD-3-Clause
"""report --shapes for the sm70-gqa-prefill route on the CPU: its launch sequence and HBM traffic
walked by hand for a small shape, launches that mix two kinds of CTA, and the geometry checks."""

from pathlib import Path

import pytest

from fa2patch.bench import Shape
from fa2patch.errors import EnvironmentProblem
from fa2patch.report import GQA_ROUTE, gqa_launches, gqa_plan, gqa_steps, predict_routes, route_geometry
from fa2patch.v100model import Card, CtaKind, KernelLaunch, LoopMix, estimate_launch, load_v100, lower_bound

ARTIFACT = Path("/nowhere/_vllm_fa2_C.abi3.so")
V100 = load_v100()
CAL = {"parameters": {"cycle_factor": 1.5, "cta_cycles": 0.0}, "loo_range": [-0.1, 0.1]}


def gqa_geometry(min_keys=256, max_keys=8192, budget=768 << 20):
    """A build_info() entry of the long-prefill kernel as the extension declares it."""
    return {
        "kernel": "sm70_gqa_prefill_kernel",
        "threads": 128,
        "dynamic_smem": 44032,
        "route": GQA_ROUTE,
        "head_dim": 256,
        "rows_per_cta": 64,
        "keys_per_iteration": 32,
        "warps": 4,
        "tiles": [
            {"kind": "qk", "rows_per_cta": 128, "keys_per_iteration": 128, "head_dims_per_iteration": 32},
            {"kind": "pv", "rows_per_cta": 64, "keys_per_iteration": 32, "head_dims_per_iteration": 256},
        ],
        "block_plan": {"min_block_keys": min_keys, "max_block_keys": max_keys, "score_budget_bytes": budget},
    }


def test_block_plan_matches_the_ops_workspace_rule():
    # Q=8000, 6/1: rows_pad 48,000; 768 MiB / (2 x 48,000 x 2 B) = 4,194 keys -> 4,096 (the CPU
    # test of the op's workspace says N = 4,096 too).
    plan = gqa_plan(Shape(8000, 128000, 6, 1, 256, True, 0.0625), gqa_geometry())
    assert (plan["rows_pad"], plan["block_keys"], plan["num_blocks"]) == (48000, 4096, 32)
    # Q=1024: the budget allows more than 8,192 keys: capped; KV=200 rounds up to 256 keys.
    assert gqa_plan(Shape(1024, 262144, 6, 1, 256, True, 0.0625), gqa_geometry())["block_keys"] == 8192
    assert gqa_plan(Shape(100, 200, 1, 1, 256, True, 0.0625), gqa_geometry())["block_keys"] == 256


def test_launch_sequence_and_traffic_walked_by_hand():
    """Q=256, KV=640, 2/1, blocks of 256 keys (3 blocks: 256, 256, 128 keys); packed rows 512;
    shift 384, packed row r sees key j <= r // 2 + 384. Counted by hand:
    step 0: qk of block 0: 4 row tiles x 2 key tiles, all seen;
    step 1: pv of block 0 (8 row tiles x 8 chunks), qk of block 1 (8 tiles, all seen);
    step 2: pv of block 1: row tile t sees min(256, 32 t + 160) keys: 5, 6, 7, 8 x 5 chunks;
            qk of block 2 (key 512): rows below 2 x (512 - 384) = 256 see none: row tiles 2, 3;
    step 3: pv of block 2 (last): row tile t sees max(0, 32 t - 96) keys: 0 x 4, 1, 2, 3, 4."""
    shape = Shape(256, 640, 2, 1, 256, True, 0.0625)
    plan = gqa_plan(shape, gqa_geometry(max_keys=256))
    assert (plan["rows_pad"], plan["block_keys"], plan["num_blocks"]) == (512, 256, 3)
    steps = gqa_steps(shape, plan)
    kinds = [[(kind, its) for kind, its, _ in s["ctas"]] for s in steps]
    assert kinds == [
        [("qk", 8)] * 8,
        [("pv", 8)] * 8 + [("qk", 8)] * 8,
        [("pv", n) for n in (5, 6, 7, 8, 8, 8, 8, 8)] + [("qk", 8)] * 2,
        [("pv", n) for n in (0, 0, 0, 0, 1, 2, 3, 4)],
    ]
    # Bytes, by hand: a qk tile writes 128 x (128 x 2 + 4); Q is read once per row tile (128 x
    # 512 B), K and V once per block (keys x 512 B); a pv tile reads 64 x (chunks x 64 + tiles
    # x 4) of scores and maxima and reads / writes the state 64 x (1024 + 8) unless first / last;
    # the last writes out and lse, 64 x (512 + 4).
    qk_tile, q_tile, state, out = 128 * 260, 128 * 512, 64 * 1032, 64 * 516
    step0 = 8 * qk_tile + 4 * q_tile + 256 * 512
    step1 = 8 * (64 * (8 * 64 + 2 * 4) + state) + 256 * 512 + step0
    pv1 = sum(64 * (c * 64 + 2 * 4) for c in (5, 6, 7)) + 5 * 64 * (8 * 64 + 2 * 4) + 8 * 2 * state
    step2 = pv1 + 256 * 512 + 2 * qk_tile + 2 * q_tile + 128 * 512
    pv2 = sum(64 * (c * 64 + 4) for c in (1, 2, 3, 4)) + 8 * (state + out)
    step3 = pv2 + 128 * 512
    assert [s["hbm_bytes"] for s in steps] == [step0, step1, step2, step3]


def test_tiles_nobody_sees_are_idle_ctas():
    """Q=KV=512, 1/1, blocks of 256: packed row r sees key j <= r. Block 0: row tile 0 (rows
    0..127) does not reach key tile 1 (keys 128..255): idle. Block 1 (keys 256..511): qk from row
    tile 2, whose key tile 1 (384..) is idle; its pv tiles (the last block) all run, row tile t
    seeing max(0, 64 t + 64 - 256) keys."""
    plan = gqa_plan(Shape(512, 512, 1, 1, 256, True, 0.0625), gqa_geometry(max_keys=256))
    step0 = gqa_steps(Shape(512, 512, 1, 1, 256, True, 0.0625), plan)[0]["ctas"]
    assert [k for k, _, _ in step0] == ["qk", "idle", "qk", "qk", "qk", "qk", "qk", "qk"]
    # Block 1 (keys 256..511): rows below 256 see none of it: qk from row tile 2; its pv tiles
    # (step 2, the last block) run even where they see no key (they write the output).
    steps = gqa_steps(Shape(512, 512, 1, 1, 256, True, 0.0625), plan)
    assert [k for k, _, _ in steps[1]["ctas"]][8:] == ["qk", "idle", "qk", "qk"]
    assert [its for _, its, _ in steps[2]["ctas"]] == [0, 0, 0, 0, 2, 4, 6, 8]


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


def test_route_estimate_and_ab_against_the_dense_route():
    """Both routes are predicted for an eligible shape, with the dense route's calibrated time
    over the long-prefill one; the long-prefill kernel's launches are one per step."""
    dense_geo = {
        "kernel": "flash_fwd_sm70_kernel<256>",
        "threads": 128,
        "dynamic_smem": 1,
        "route": "sm70-dense",
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
    shape = Shape(1024, 4096, 6, 1, 256, True, 0.0625)
    d, g = predict_routes(shape, [dense, gqa], Card(80, 1000), V100, CAL, ARTIFACT)  # locked below every duty clock
    assert (d["route"], g["route"]) == ("sm70-dense", GQA_ROUTE)
    assert g["vs_dense"] == pytest.approx(d["calibrated_ms"] / g["calibrated_ms"])
    # Ranges of +-10%: separated only where one route is more than 1.1 / 0.9 = 1.22x faster.
    expected = "faster" if g["vs_dense"] > 1.1 / 0.9 else "slower" if g["vs_dense"] < 0.9 / 1.1 else "not separated"
    assert g["vs_dense_verdict"] == expected
    assert g["calibrated_ms"] == pytest.approx(1.5 * g["model_ms"]) and g["bound_ms"] < g["model_ms"]
    launches, plan = gqa_launches(shape, gqa)
    assert len(launches) == plan["blocks"] + 1 == len(g["launches"])
    # Not eligible: non-causal, another head dim, a batch: the dense route alone.
    for other in (
        Shape(1024, 4096, 6, 1, 256, False, 0.0625),
        Shape(1024, 4096, 6, 1, 128, True, 0.1),
        Shape(1024, 4096, 6, 1, 256, True, 0.0625, b=2),
    ):
        kernels = [dense, gqa] if other.d == 256 else [{**dense, "geometry": {**dense_geo, "head_dim": 128}}, gqa]
        assert [p["route"] for p in predict_routes(other, kernels, Card(80), V100, CAL, ARTIFACT)] == ["sm70-dense"]


def test_gqa_geometry_is_checked():
    info = {"kernels": [gqa_geometry()]}
    assert route_geometry(info, ARTIFACT, GQA_ROUTE)[0]["tiles"][0]["kind"] == "qk"
    no_plan = {"kernels": [{k: v for k, v in gqa_geometry().items() if k != "block_plan"}]}
    with pytest.raises(EnvironmentProblem, match=r"lacks block_plan.min_block_keys, block_plan.max_block_keys"):
        route_geometry(no_plan, ARTIFACT, GQA_ROUTE)
    no_pv = {"kernels": [{**gqa_geometry(), "tiles": gqa_geometry()["tiles"][:1]}]}
    with pytest.raises(EnvironmentProblem, match=r"lacks tiles\[pv\].rows_per_cta"):
        route_geometry(no_pv, ARTIFACT, GQA_ROUTE)


def test_each_tile_is_charged_the_code_its_ctas_can_reach():
    """A dispatch branch (0x10) sends tile B's CTAs past tile A's loop; tile A's epilogue sits at
    the end of the function (0xc0), after tile B's code, as the compiler may place it. Every
    other branch counts both ways; an unpredicated BRA or EXIT does not fall through."""
    from fa2patch import sass
    from fa2patch.report import tile_code

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
