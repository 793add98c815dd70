# SPDX-License-Identifier: BSD-3-Clause
"""report on kernels compiled here for sm_70 (known HMMA forms and loops) and on the real build."""

import json
import textwrap

import pytest

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.routes import DECODE, EXACT, GQA, SPLITKV
from fa2patch.compile import sass, toolchain
from fa2patch.model.report import kernel_rows
from fa2patch.model.v100model import load_v100, occupancy
from helpers import MMA, compile_cu, cpp_head_dims

MMA_F16 = (
    'asm volatile("mma.sync.aligned.m8n8k4.row.col.f16.f16.f16.f16 {%0,%1,%2,%3}, {%4,%5}, {%6,%7}, '
    '{%0,%1,%2,%3};" : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3]) : "r"(a[0]), "r"(a[1]), '
    '"r"(b[0]), "r"(b[1]));'
)


def test_occupancy_by_hand():
    v100 = load_v100()
    # 255 registers x 128 threads: 2 blocks by registers; 72 KB of shared memory: 1 block.
    occ = occupancy(255, 72 * 1024, 128, v100)
    assert (occ["blocks_per_sm"], occ["warps_per_sm"], occ["limited_by"]) == (1, 4, "shared_memory")
    assert occupancy(64, 0, 256, v100)["blocks_per_sm"] == 4  # 64 regs x 256 threads = 16K regs


def test_step_forms_of_both_accumulators_and_their_tensor_cycles(clang_cuda, tmp_path):
    """One mma.m8n8k4 is 4 HMMA.884.F32 steps with FP32 accumulators and 2 HMMA.884.F16 steps with
    FP16 accumulators (CUDA 12.8); both hold the tensor pipe 8 clocks."""
    src = textwrap.dedent(f"""
        __global__ void f32_loop(const unsigned* in, float* out) {{
          unsigned a[2] = {{in[threadIdx.x], in[threadIdx.x + 32]}};
          unsigned b[2] = {{in[threadIdx.x + 64], in[threadIdx.x + 96]}};
          float d[8] = {{0.f}};
          for (int it = 0; it < in[0]; ++it) {{ {MMA} {MMA} }}
          for (int i = 0; i < 8; ++i) out[threadIdx.x * 8 + i] = d[i];
        }}
        __global__ void f16_loop(const unsigned* in, unsigned* out) {{
          unsigned a[2] = {{in[threadIdx.x], in[threadIdx.x + 32]}};
          unsigned b[2] = {{in[threadIdx.x + 64], in[threadIdx.x + 96]}};
          unsigned c[4] = {{0u, 0u, 0u, 0u}};
          for (int it = 0; it < in[0]; ++it) {{ {MMA_F16} {MMA_F16} }}
          for (int i = 0; i < 4; ++i) out[threadIdx.x * 4 + i] = c[i];
        }}
        __global__ void no_mma(float* out) {{ out[threadIdx.x] = 2.f * threadIdx.x; }}
    """)
    obj, _ = compile_cu(clang_cuda, src, tmp_path)
    funcs = {
        f.name.split("P")[0]: f
        for f in sass.parse_sass(toolchain.cuobjdump(toolchain.find_cuda12_binutil("cuobjdump"), ["-sass"], obj))
    }
    forms = {name: sorted({op for op in f.opcodes if op.startswith("HMMA")}) for name, f in funcs.items()}
    assert forms["_Z8f32_loop"] == [f"HMMA.884.F32.F32.STEP{i}" for i in range(4)]
    assert forms["_Z8f16_loop"] == ["HMMA.884.F16.F16.STEP0", "HMMA.884.F16.F16.STEP1"]
    rows = {r["kernel"].split("(")[0]: r for r in kernel_rows(obj, "sm_70", {"*_loop*": (32, 0)})}
    f32, f16 = rows["f32_loop"]["hot_loops"][0], rows["f16_loop"]["hot_loops"][0]
    # Two mma per iteration: 8 F32 steps or 4 F16 steps, 16 tensor clocks per warp either way;
    # 32-thread blocks: the 32-blocks-per-SM limit binds, 8 warps share each sub-partition.
    assert rows["f32_loop"]["warps_per_subpartition"] == rows["f16_loop"]["warps_per_subpartition"] == 8
    assert (f32["model_mix"]["hmma_f32_steps"], f32["model_mix"]["hmma_f16_steps"]) == (8, 0)
    assert (f16["model_mix"]["hmma_f32_steps"], f16["model_mix"]["hmma_f16_steps"]) == (0, 4)
    assert f32["cycles"]["tensor"] == f16["cycles"]["tensor"] == 8 * 16
    assert rows["no_mma"]["hot_loops"] == []
    # A tensor-core kernel without a launch configuration is an error naming it, not a row
    # without occupancy.
    with pytest.raises(
        EnvironmentProblem,
        match=r"no launch configuration .* for the tensor-core kernel\(s\) "
        r"f32_loop\(unsigned int const\*, float\*\)",
    ):
        kernel_rows(obj, "sm_70", {"*f16_loop*": (32, 0)})


# --- The real sm_70 build -------------------------------------------------------------------------


def real_geometry(artifact, route=EXACT):
    """The build's kernels of a route with the geometry its build_info() declares."""
    from fa2patch.compile.extension import load_build_info
    from fa2patch.model.report import route_geometry

    return route_geometry(load_build_info(artifact), artifact, route)


def real_rows(artifact):
    """Report rows of every kernel the build declares (launches from build_info()), with both
    routes' geometry."""
    from fa2patch.compile.extension import launches_of, load_build_info

    geometry = real_geometry(artifact) + real_geometry(artifact, GQA)
    return kernel_rows(artifact, "sm_70", launches_of(load_build_info(artifact)), geometry)


def test_real_hot_loops_agree_with_the_declared_geometry(built_sm70, real_workspace):
    """Per warp-iteration, the kernel's HMMA steps must equal the work its geometry declares
    (QK and PV: 2 x rows/warps x keys x head_dim FMAs, 1,024 per mma, 4 F32 steps each), and the
    next block's K and V must be loaded ahead: unrolled in the loop body (no copy loop), one
    round of global loads whose use comes late enough that the warps of a scheduler cover the
    load latency (the model charges the iteration no exposed latency)."""
    from fa2patch.model.v100model import load_v100

    artifact = built_sm70 / "_vllm_fa2_C.abi3.so"
    rows = [r for r in real_rows(artifact) if r["geometry"] and r["geometry"]["route"] == EXACT]
    assert sorted(r["geometry"]["head_dim"] for r in rows) == cpp_head_dims(real_workspace)
    latency = load_v100()["dependent_ldg_l2_hit_cycles"]
    for r in rows:
        g = r["geometry"]
        steps = 4 * 2 * g["rows_per_cta"] // g["warps"] * g["keys_per_iteration"] * g["head_dim"] // 1024
        assert g["warps"] == 8 and r["occupancy"]["warps_per_sm"] >= 8, (g["kernel"], r["occupancy"])
        for lp in r["hot_loops"]:
            assert lp["model_mix"]["hmma_f32_steps"] == steps, (g["kernel"], lp["start"])
            gaps = lp["model_mix"]["load_use_gaps"]
            assert len(gaps) == 1 and r["warps_per_subpartition"] * gaps[0] >= latency, (g["kernel"], gaps)
            assert lp["shared_passes"] > 0
    # D=256: tensor-bound, two warps per scheduler; 2 x 32 keys x 256 dims x 2 B over 256
    # threads = 8 16-byte loads a thread, plus the two page ids of the block after next.
    d256 = next(r for r in rows if r["geometry"]["head_dim"] == 256)
    assert d256["warps_per_subpartition"] == 2
    plain = min(d256["hot_loops"], key=lambda lp: lp["instructions"])
    assert plain["binding"] == "tensor" and plain["mix"]["ldg"] == 8 + 2, plain["mix"]


def test_real_exact_route_hot_loops_hold_no_inner_loop(built_sm70, real_workspace):
    """report counts every instruction of a hot loop once per iteration: exact for the forward
    kernels, whose hot loops hold no loop (the K/V tiles are copied by unrolled code, not by a copy
    loop whose trip count the SASS does not say). The long-prefill kernel's qk loop holds one short
    loop (the page step of the paged K walk, a few instructions, counted once)."""
    artifact = built_sm70 / "_vllm_fa2_C.abi3.so"
    listing = toolchain.cuobjdump(toolchain.find_cuda12_binutil("cuobjdump"), ["-sass"], artifact)
    functions = [f for f in sass.parse_sass(listing) if f.arch == "sm_70"]
    pretty = toolchain.demangle([f.name for f in functions])
    forward = [f for f in functions if "flash_fwd_sm70_kernel<" in pretty[f.name]]
    assert len(forward) == len(cpp_head_dims(real_workspace)) and all(f.hot_loops() for f in forward)
    for f in forward:
        for hot in f.hot_loops():
            inside = [
                (lp.start, lp.end)
                for lp in f.loops()
                if hot.start <= lp.start and lp.end <= hot.end and (lp.start, lp.end) != (hot.start, hot.end)
            ]
            assert inside == [], (pretty[f.name], hot.start)


def test_real_long_prefill_loops_agree_with_its_tiles(built_sm70):
    """The long-prefill kernel has one hot loop per tile, each doing per warp-iteration the work
    its tile declares (rows x keys x head dims per iteration / warps FMAs, 4 F32 steps per 1,024);
    the pv loop exponentiates each of its rows x keys scores once (MUFU.EX2 per thread: rows x
    keys / threads), the qk loop none; each tile's code outside its loop is found and runs its
    own global loads; two CTAs per SM, tensor-bound."""
    from fa2patch.model.gqa_route import tile_loops as gqa_loops

    artifact = built_sm70 / "_vllm_fa2_C.abi3.so"
    (row,) = [r for r in real_rows(artifact) if r["geometry"] and r["geometry"]["route"] == GQA]
    g = row["geometry"]
    tiles = {t["kind"]: t for t in g["tiles"]}
    loops = gqa_loops(row)
    for kind in ("qk", "pv"):
        t = tiles[kind]
        fma = t["rows_per_cta"] * t["keys_per_iteration"] * t["head_dims_per_iteration"] // g["warps"]
        lp = loops[kind]
        assert lp["model_mix"]["hmma_f32_steps"] == 4 * fma // 1024, (kind, lp["mix"])
        assert lp["binding"] == "tensor", (kind, lp["cycles"])
        assert lp["outside"]["mix"].get("ldg", 0) > 0 and lp["outside"]["load_rounds"] >= 1, lp["outside"]
    assert loops["qk"]["mix"].get("mufu", 0) == 0
    assert loops["pv"]["mix"]["mufu"] == tiles["pv"]["rows_per_cta"] * tiles["pv"]["keys_per_iteration"] // g["threads"]
    assert row["occupancy"]["blocks_per_sm"] == 2 and row["warps_per_subpartition"] == 2


def test_report_command_on_the_real_build(built_sm70, real_project):
    proc = real_project.run("report", "--arch", "sm_70", "--json")
    out = json.loads(proc.stdout)
    assert out["ok"] is True and out["arch"] == "sm_70"
    assert any("flash_fwd_sm70_kernel<256>" in k["kernel"] and k["hot_loops"] for k in out["kernels"])
    shapes = "q=8192,kv=8192,hq=6,hkv=1,d=256;q=1,kv=4096,hq=32,hkv=8,d=128,b=8;q=1024,kv=16384,hq=6,hkv=1,d=256"
    proc = real_project.run("report", "--arch", "sm_70", "--sms", "72", "--shapes", shapes)
    assert "calibrated: the model with cycle factor" in proc.stdout and "split-D Q=KV=8192" in proc.stdout
    assert GQA in proc.stdout and "qk tensor, pv tensor" in proc.stdout
    proc = real_project.run("report", "--arch", "sm_70", "--sms", "72", "--shapes", shapes, "--json")
    out = json.loads(proc.stdout)
    assert out["card"]["sms"] == 72 and out["calibration"]["within_targets"]
    assert all({"source", "loo_residual", "residual", "measured"} <= set(a) for a in out["calibration"]["anchors"])
    assert all(isinstance(a["source"], dict) and a["source"]["quote"] for a in out["calibration"]["anchors"])
    # Both routes for the causal D=256 shapes (the long-prefill one with its A/B) and split-KV x2..4
    # (the default --splits) on the prefill shapes; for decode the exact route and the decode kernel,
    # its split filling its CTA slots in one wave (B=8 x 8 KV heads = 64 CTAs).
    splits = [(label, SPLITKV, s) for label in ("Q=8192 KV=8192", "Q=1024 KV=16384") for s in (2, 3, 4)]
    (decoder,) = [k for k in out["kernels"] if "decode_sm70_kernel<128, 4>" in k["kernel"]]
    decode_splits = min(72 * decoder["occupancy"]["blocks_per_sm"] // 64, 4096 // 16, 128)
    assert [(p["label"].split(" Hq")[0], p["route"], p["plan"].get("splits", 1)) for p in out["predictions"]] == [
        ("Q=8192 KV=8192", EXACT, 1),
        ("Q=8192 KV=8192", GQA, 1),
        *splits[:3],
        ("B=8 Q=1 KV=4096", EXACT, out["predictions"][5]["plan"]["splits"]),
        ("B=8 Q=1 KV=4096", DECODE, decode_splits),
        ("Q=1024 KV=16384", EXACT, 1),
        ("Q=1024 KV=16384", GQA, 1),
        *splits[3:],
    ]
    prefill, gqa, decode, kernel = (out["predictions"][i] for i in (0, 1, 5, 6))
    for p in (prefill, gqa, decode, kernel):
        lo, hi = out["calibration"]["route_ranges"][p["route"]]  # its kernel class's range
        assert p["bound_ms"] < p["model_ms"]
        assert p["floor_ms"] < p["calibrated_ms"]
        assert p["calibrated_ms_low"] == pytest.approx(p["calibrated_ms"] * min(1, 1 + lo))
        assert p["calibrated_ms_high"] == pytest.approx(p["calibrated_ms"] * max(1, 1 + hi))
    assert gqa["vs_dense"] == prefill["calibrated_ms"] / gqa["calibrated_ms"]
    separated = (
        gqa["calibrated_ms_high"] < prefill["calibrated_ms_low"]
        or prefill["calibrated_ms_high"] < gqa["calibrated_ms_low"]
    )
    assert (gqa["vs_dense_verdict"] == "not separated") == (not separated)
    # One launch per KV step: Q=8192 in blocks of plan["block_keys"] keys, plus the last pv step.
    assert len(gqa["launches"]) == gqa["plan"]["blocks"] + 1 == -(-8192 // gqa["plan"]["block_keys"]) + 1
    assert decode["plan"]["swapped"] and decode["plan"]["splits"] >= 1


def test_real_serial_phase_of_the_exact_route_and_the_long_prefill_tiles(built_sm70):
    """On the shipped SASS: the D=256 exact-route loop has its serial phase (the longest HMMA-free
    run: the row max and sum by SHFL, the P exchange between barriers, MUFU), which costs one CTA's
    iteration more than its busiest pipe and less than all its pipes end to end; the long-prefill
    tiles, two CTAs per SM, are bound by their pipes (the other CTA fills each one's serial phase)."""
    from fa2patch.model.exact_route import cheapest_hot_loop
    from fa2patch.model.gqa_route import tile_loops as gqa_loops
    from fa2patch.model.v100model import LoopMix, load_v100

    v100 = load_v100()
    rows = real_rows(built_sm70 / "_vllm_fa2_C.abi3.so")
    d256 = next(
        r for r in rows if r["geometry"] and r["geometry"]["route"] == EXACT and r["geometry"]["head_dim"] == 256
    )
    lp = cheapest_hot_loop(d256)
    serial = lp["serial_runs"][0]
    assert serial["instructions"] >= 200 and serial["shuffles"] >= 8 and serial["barriers"] >= 1 and serial["mufu"] >= 8
    pipes = LoopMix(**lp["model_mix"]).sustained_pipes(lp["critical_warps"], v100)
    assert max(pipes.values()) < lp["critical_cycles"] < sum(pipes.values())
    assert d256["outside"]["cycles"] > 0 and d256["outside"]["instructions"] > 0
    (gqa,) = [r for r in rows if r["geometry"] and r["geometry"]["route"] == GQA]
    k = gqa["occupancy"]["blocks_per_sm"]
    for name, lp in gqa_loops(gqa).items():
        pipes = LoopMix(**lp["model_mix"]).sustained_pipes(lp["critical_warps"], v100)
        assert k * max(pipes.values()) >= lp["critical_cycles"], (name, pipes, lp["critical_cycles"])


def test_real_split_kv_route(built_sm70):
    """The split route on the shipped SASS: the combine kernel's column loop is found and timed
    (no HMMA; its code outside the loop too); a split prediction is the forward kernel with
    splits x the unsplit CTAs and the same key blocks, then one combine launch of one warp per
    output row; its verdicts follow its ranges."""
    from fa2patch.common.shapes import Shape
    from fa2patch.model.calibration import calibrate
    from fa2patch.model.gqa_route import read_plans
    from fa2patch.model.report import predict_routes
    from fa2patch.model.v100model import Card, load_v100

    artifact = built_sm70 / "_vllm_fa2_C.abi3.so"
    rows = real_rows(artifact)
    (combine,) = [r["combine"] for r in rows if "combine" in r]
    assert combine["threads"] == 128 and combine["loop"]["critical_cycles"] > 0
    assert combine["loop"]["mix"].get("hmma", 0) == 0 and combine["loop"]["mix"].get("ldg", 0) > 0
    assert combine["outside"]["cycles"] > 0
    v100 = load_v100()
    cal = calibrate(v100)
    shape = Shape(4096, 32768, 6, 1, 256, True, 0.0625)
    plans = read_plans(artifact, [shape])[1]
    dense, gqa, *splits = predict_routes(shape, rows, Card(72, 1530), v100, cal, artifact, (2, 3, 4), plans)
    forward = dense["launches"][0]
    assert forward["ctas"] == 64 * 6 and gqa["route"] == GQA
    for s, p in zip((2, 3, 4), splits, strict=True):
        fwd, comb = p["launches"]
        assert (p["route"], p["plan"]["splits"]) == (SPLITKV, s)
        assert fwd["ctas"] == s * forward["ctas"] and fwd["cta_iterations"] == forward["cta_iterations"]
        assert comb["ctas"] == 6 * 4096 // 4 and comb["name"] == "splitkv_combine_sm70_kernel"
        assert p["plan"]["partial_bytes"] == s * 6 * 4096 * (256 * 4 + 4)
        for key, other in (("vs_dense", dense), ("vs_gqa", gqa)):
            apart = (
                p["calibrated_ms_high"] < other["calibrated_ms_low"]
                or other["calibrated_ms_high"] < p["calibrated_ms_low"]
            )
            assert p[key] == other["calibrated_ms"] / p["calibrated_ms"]
            assert (p[key + "_verdict"] == "not separated") == (not apart)


def test_report_anchors_on_the_real_build(built_sm70, real_project, tmp_path):
    """`report --anchors`: a bench file whose cases are the model's own times at (1.3, 20,000)
    on this build (our routes' launches, 80 SMs, the NVML clock) joins the calibration: the report
    lists each user anchor with its file, route and clock, the fit before and after, and residuals;
    a file from another GPU is refused naming it."""
    from dataclasses import asdict

    from fa2patch.common.shapes import Shape
    from fa2patch.model.gqa_route import read_plans
    from fa2patch.model.report import route_launches
    from fa2patch.model.v100model import Calibration, Card, estimate_route, load_v100

    artifact = built_sm70 / "_vllm_fa2_C.abi3.so"
    rows = real_rows(artifact)
    cases = []
    for shape, route, clock in (
        (Shape(8192, 8192, 6, 1, 256, True, 0.0625), EXACT, 1440.0),
        (Shape(8192, 8192, 6, 1, 256, True, 0.0625), GQA, 1320.0),
        (Shape(1024, 16384, 4, 1, 256, True, 0.0625), EXACT, 1500.0),
    ):
        card = Card(80, clock)
        plans = read_plans(artifact, [shape])[1]
        ms = estimate_route(
            route_launches(shape, rows, route, card, artifact, plans), card, load_v100(), Calibration(1.3, 20000), clock
        )["ms"]
        cases.append(
            {
                "route": route,
                "shape": asdict(shape),
                "label": shape.label,
                "median_ms": ms,
                "clocks": {"sm_clock_mhz": {"min": clock, "median": clock, "max": clock}},
            }
        )
    bench = tmp_path / "v100.json"
    bench.write_text(json.dumps({"gpu": "Tesla V100-SXM2-16GB", "capability": "sm_70", "sms": 80, "results": cases}))
    proc = real_project.run(
        "report",
        "--arch",
        "sm_70",
        "--sms",
        "72",
        "--anchors",
        str(bench),
        "--json",
        "--shapes",
        "q=4096,kv=32768,hq=6,hkv=1,d=256",
    )
    out = json.loads(proc.stdout)
    fit = out["anchor_fit"]
    assert fit["files"] == [str(bench)] and fit["after"]["anchors"] == fit["before"]["anchors"] + 3
    assert [(a["route"], a["clock_mhz"], a["card"]["sms"]) for a in fit["user_anchors"]] == [
        (EXACT, 1440.0, 80),
        (GQA, 1320.0, 80),
        (EXACT, 1500.0, 80),
    ]
    users = [a for a in out["calibration"]["anchors"] if a["kind"] == "user"]
    assert len(users) == 3 and all({"residual", "loo_residual", "file", "clock_source"} <= set(a) for a in users)
    assert out["calibration"]["parameters"] == fit["after"]["parameters"] != fit["before"]["parameters"]
    text = real_project.run("report", "--arch", "sm_70", "--sms", "72", "--anchors", str(bench)).stdout
    assert "The fit with users' anchors" in text and "v100.json" in text
    h200 = tmp_path / "h200.json"
    h200.write_text(json.dumps({"gpu": "NVIDIA H200", "capability": "sm_90", "sms": 132, "results": cases}))
    proc = real_project.run("report", "--arch", "sm_70", "--anchors", str(h200), check_rc=None)
    assert proc.returncode != 0 and "h200.json: expected a bench file from an sm_70 card" in proc.stderr + proc.stdout
    assert "'sm_90'" in proc.stderr + proc.stdout


def test_real_decode_route(built_sm70):
    """The decode kernel on the shipped SASS (no HMMA): each instantiation's key loop is timed with its
    inner loops repeated, so one iteration (32 keys per warp) holds at least the 2 x rows x D FMAs per
    lane that its keys need (scores: one key per lane; P V: D / 8 lanes per key); a decode shape gets
    its prediction (one CTA per sequence, KV head and split -- two, half the rows each, for 9 to 16
    rows; the split fills the CTA slots in one wave, at most 128; every key visited), others do not."""
    from fa2patch.common.shapes import Shape
    from fa2patch.model import decode_route
    from fa2patch.model.calibration import calibrate
    from fa2patch.model.gqa_route import read_plans
    from fa2patch.model.report import predict_routes
    from fa2patch.model.v100model import Card, load_v100

    artifact = built_sm70 / "_vllm_fa2_C.abi3.so"
    rows = real_rows(artifact)
    shape = Shape(1, 131072, 6, 1, 256, True, 0.0625)
    others = [
        Shape(1, 4096, 17, 1, 128, True, 0.09),  # 17 rows per KV head: more than two row blocks
        Shape(1, 4096, 6, 1, 96, True, 0.1),  # head dim 96
        Shape(2, 4096, 6, 1, 256, True, 0.0625),  # two query rows
    ]
    plans = read_plans(artifact, [shape, *others])[1]
    decode = {decode_route.instantiation(r["kernel"]): r for r in rows if decode_route.instantiation(r["kernel"])}
    assert sorted(decode) == [(d, r) for d in (64, 128, 256) for r in (1, 2, 4, 6, 8)]
    for (d, r), row in decode.items():
        assert row["hmma_total"] == 0 and "decode" in row, row["kernel"]
        loop = row["decode"]["loop"]
        assert loop["mix"]["fp32"] >= 2 * r * d and loop["mix"]["ldg"] > 0 and loop["critical_cycles"] > 0
    v100 = load_v100()
    cal = calibrate(v100)
    card = Card(72, 1530)
    preds = {p["route"]: p for p in predict_routes(shape, rows, card, v100, cal, artifact, (), plans)}
    p, dense = preds[DECODE], preds[EXACT]
    slots = 72 * decode[(256, 6)]["occupancy"]["blocks_per_sm"]
    splits = min(slots, 131072 // decode_route.SPLIT_KEYS, 128)
    assert p["plan"]["splits"] == splits and p["launches"][0]["ctas"] == splits
    assert p["plan"]["keys_per_split"] * splits >= 131072
    assert p["launches"][1]["name"] == "splitkv_combine_sm70_kernel"
    apart = p["calibrated_ms_high"] < dense["calibrated_ms_low"] or dense["calibrated_ms_high"] < p["calibrated_ms_low"]
    assert p["vs_dense"] == dense["calibrated_ms"] / p["calibrated_ms"]
    assert (p["vs_dense_verdict"] == "not separated") == (not apart)
    # 12 rows: two row blocks of 6 (the <128, 6> kernel), each streaming the K/V (no L2 credit)
    twelve = Shape(1, 4096, 12, 1, 128, True, 0.09)
    plans12 = read_plans(artifact, [twelve])[1]
    p12 = {x["route"]: x for x in predict_routes(twelve, rows, card, v100, cal, artifact, (), plans12)}[DECODE]
    blocks = 72 * decode[(128, 6)]["occupancy"]["blocks_per_sm"] // 2
    assert p12["kernel"] == decode[(128, 6)]["kernel"] and p12["plan"]["row_blocks"] == 2
    assert p12["plan"]["splits"] == min(blocks, 4096 // decode_route.SPLIT_KEYS, 128)
    assert p12["launches"][0]["ctas"] == 2 * p12["plan"]["splits"]
    for other in others:
        assert DECODE not in {x["route"] for x in predict_routes(other, rows, card, v100, cal, artifact, (), plans)}
