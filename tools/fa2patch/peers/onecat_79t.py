# SPDX-License-Identifier: BSD-3-Clause
"""Issue 27's peer: 1Cat-vLLM's FP32-accumulated long-prefill kernel (#628, the "79T" prefill), through
the same calibrated model as our routes.

One call (prefill.cu's sm70_d256_gqa_half2_family_fwd with the #628 recipe; data/peer_onecat_79t.toml):
the six query heads of the KV head packed into M (rows = 6 x Q); the prefix (the KV - Q keys before
the chunk) in blocks of 24,576 keys, each a cuBLAS QK GEMM into an FP16 score workspace, a sampled
row-maximum pass over it and a CUTLASS PV GEMM (FP32 accumulation, the scores exponentiated as they
are loaded) whose FP32 partial is merged into a running state; then the causal tail (the chunk's
own Q keys) as a triangle of 320-token tiles: one batched cuBLAS QK, a diagonal mask, a full
row-maximum pass, and seven rounds of PV tasks of up to four key tiles each; a final merge.

What is modelled: both PV kernels from their compiled sm_70 SASS (the records in the data file), the
QK GEMMs as tensor-bound cuBLAS GEMMs (the premise of the cuBLAS rate anchor), and every other kernel
as HBM traffic only (its bytes counted from the source). What is not: the V-statistics and transposes'
latency beyond their bytes, the dense repair of the first 64 tail tokens, host copies, launch gaps and
the overlap of the tail with the prefix on idle SMs. docs/peer-onecat-79t.md compares the estimate
with the published times.
"""

from collections.abc import Sequence
from dataclasses import replace

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.shapes import Shape
from fa2patch.model.calibration import calibrate, kernel_code
from fa2patch.model.loop_mix import SUBPARTITIONS, LoopMix
from fa2patch.model.report import route_estimate
from fa2patch.model.v100model import Card, KernelLaunch, gemm_launch, load_data, load_v100

NAME = "1cat-79t"
DATA = "peer_onecat_79t.toml"
PUBLISHED = "1Cat-vLLM #628: FP32-accumulated PV long prefill, Q=8000"  # anchors.toml [[unused]]
QUERY_TOKENS = 8000  # the recipe's compile-time chunk


def check(shape: Shape, plan: dict) -> None:
    """The shapes the recipe builds: Q = 8000, its head layout, causal, one sequence, no decode rows."""
    problems = [
        what
        for what, bad in (
            (f"Q={shape.q} (the recipe compiles Q={QUERY_TOKENS} only)", shape.q != QUERY_TOKENS),
            (
                f"Hq/Hkv={shape.hq}/{shape.hkv} (it runs {plan['group']} query heads on one KV head)",
                (shape.hq, shape.hkv) != (plan["group"], 1),
            ),
            (f"D={shape.d} (it is D={plan['head_dim']})", shape.d != plan["head_dim"]),
            ("not causal", not shape.causal),
            (f"B={shape.b} (one sequence)", shape.b != 1),
            (f"{shape.decode} decode rows", shape.decode),
            (f"KV={shape.kv} < Q", shape.kv < shape.q),
        )
        if bad
    ]
    if problems:
        raise EnvironmentProblem(f"--peer {NAME}: {shape.label}: the peer has no kernel for {'; '.join(problems)}")


def cublas_gemm(name: str, qk: dict, m: int, n: int, k: int, batch: int, hbm_bytes: float, v100: dict) -> KernelLaunch:
    """A cuBLAS FP16 GEMM (``batch`` of m x n x k) as the model takes a well-tiled one: per warp and
    k-step only HMMA (F16 accumulation; one warp's mma.m8n8k4 is fma_per_mma884 FMAs), the tile
    assumed in the data file."""
    mmas = qk["tile_m"] * qk["tile_n"] * qk["tile_k"] // v100["fma_per_mma884"] // qk["warps"]
    loop = LoopMix(instructions=mmas, hmma_f16_steps=2 * mmas)
    one = gemm_launch(name, loop, qk, m, n, k, hbm_bytes, prologue_load_rounds=0)
    return replace(one, iterations=one.iterations * batch)  # the batch's GEMMs in one grid


def traffic(name: str, hbm_bytes: float) -> KernelLaunch:
    """A kernel modelled by its HBM bytes alone."""
    return KernelLaunch(name, LoopMix(), (0,), SUBPARTITIONS, 1, prologue_load_rounds=0, hbm_bytes=hbm_bytes)


def tail_tasks(tiles: int, group_tiles: int) -> list[list[int]]:
    """The tail's PV rounds: round r holds, for every query tile i with i >= r x group_tiles, the task over
    key tiles r x group_tiles .. min(i, (r + 1) x group_tiles - 1); its value is that task's key-tile count."""
    rounds = -(-tiles // group_tiles)
    return [[min(group_tiles, i - r * group_tiles + 1) for i in range(r * group_tiles, tiles)] for r in range(rounds)]


def peer_launches(shape: Shape, data: dict | None = None, v100: dict | None = None) -> tuple[list[KernelLaunch], dict]:
    """The launches of one call for ``shape``, in order, and the plan's numbers."""
    data = data or load_data(DATA)
    v100 = v100 or load_v100()
    plan, qk = data["plan"], data["qk"]
    check(shape, plan)
    kernels = {k["name"]: k for k in data["kernel"]}
    d, rows = plan["head_dim"], shape.q * plan["group"]
    half, single = 2, 4
    prefix = shape.kv - shape.q
    launches = [
        traffic("stable V statistics and scaling", 3 * shape.kv * d * half),
        traffic("Q and K transposes", 2 * (rows * d + shape.kv * d) * half),
    ]
    pv = kernels["prefix PV"]
    pv_code = kernel_code(pv)
    blocks = []
    for start in range(0, prefix, plan["block_keys"]):
        n = min(plan["block_keys"], prefix - start)
        blocks.append(n)
        scores = rows * n * half
        launches += [
            cublas_gemm("prefix QK (cuBLAS)", qk, rows, n, d, 1, scores + (rows + n) * d * half, v100),
            traffic("prefix row maximum (sampled)", scores // plan["row_max_sample_stride"]),
            gemm_launch(
                "prefix PV",
                pv_code["loop"],
                pv,
                rows,
                d,
                n,
                scores + n * d * half + rows * d * single,
                pv_code["epilogue"],
                pv_code["prologue_load_rounds"],
            ),
            traffic("prefix merge", 3 * rows * d * single),
        ]
    tokens = plan["tail_tile_tokens"]
    tiles = -(-shape.q // tokens)
    tile_rows = tokens * plan["group"]
    pairs = tiles * (tiles + 1) // 2  # (query tile, key tile) pairs of the causal triangle
    tail_scores = pairs * tile_rows * tokens * half
    launches += [
        cublas_gemm(
            "tail QK (cuBLAS, batched)",
            qk,
            tile_rows,
            tokens,
            d,
            pairs,
            tail_scores + pairs * (tile_rows + tokens) * d * half,
            v100,
        ),
        traffic("tail diagonal mask", 2 * tiles * tile_rows * tokens * half),
        traffic("tail row maximum", tail_scores),
    ]
    tail = kernels["tail PV"]
    tail_code = kernel_code(tail)
    row_tiles = -(-tile_rows // tail["tile_m"])
    steps = -(-tokens // tail["tile_k"])
    rounds = tail_tasks(tiles, plan["fine_pv_group_tiles"])
    for r, tasks in enumerate(rounds):
        its = tuple(n * steps for n in tasks for _ in range(row_tiles))
        key_tiles = sum(tasks)
        hbm = key_tiles * (tile_rows * tokens * half + tokens * d * half) + len(tasks) * tile_rows * d * half
        launches.append(
            KernelLaunch(
                f"tail PV round {r}",
                tail_code["loop"],
                its,
                tail["warps"],
                tail["ctas_per_sm"],
                tail_code["epilogue"],
                tail_code["prologue_load_rounds"],
                hbm,
            )
        )
    launches.append(traffic("final merge", rows * d * (single + 2 * half)))
    return launches, {
        "rows": rows,
        "prefix_blocks": blocks,
        "tail_tiles": tiles,
        "tail_pairs": pairs,
        "tail_rounds": [len(t) for t in rounds],
        "tail_pv_ctas": sum(len(t) for t in rounds) * row_tiles,
    }


def published(shape: Shape) -> float | None:
    """The time #628's VALIDATION.md publishes for ``shape`` (anchors.toml [[unused]]), if any."""
    entry = next(u for u in load_data("anchors.toml")["unused"] if u["name"] == PUBLISHED)
    return entry["values_ms"].get(f"Q={shape.q} KV={shape.kv}") if shape.hq == 6 and shape.hkv == 1 else None


def peer_estimate(
    shape: Shape, card: Card, data: dict | None = None, v100: dict | None = None, *, calibration: dict | None = None
) -> dict:
    """The peer's call for ``shape`` on ``card``: model and calibrated time with its range (the routes'
    own calibration and range rule: report.route_estimate; ``calibration``: report's, e.g. refitted
    with --anchors; default: the published anchors' fit), the plan, and the published time where
    there is one (never fitted)."""
    calibration = calibration or (calibrate(v100) if v100 else calibrate())
    v100 = v100 or load_v100()
    launches, plan = peer_launches(shape, data, v100)
    est = route_estimate(launches, card, v100, calibration, NAME)
    return {
        "peer": NAME,
        "label": shape.label,
        "card": {"sms": card.sms, "clock_mhz": card.clock_mhz},
        "plan": plan,
        "published_ms": published(shape),
        "tensor_cores": True,
        **est,
    }


def render(rows: list[dict], predictions: Sequence[dict] = ()) -> str:
    """The peer's section of `report`: per shape its calibrated time with its range beside each of our
    routes', and whether the ranges separate."""
    from fa2patch.common.tables import table
    from fa2patch.model.ranges import range_text
    from fa2patch.peers.beside import our_routes

    cells = [
        [
            e["label"],
            range_text(e["calibrated_ms"], e["calibrated_ms_low"], e["calibrated_ms_high"], 2),
            "-" if e["published_ms"] is None else f"{e['published_ms']:.2f}",
            our_routes(e, predictions, 2),
        ]
        for e in rows
    ]
    card = rows[0]["card"] if rows else {"sms": "-", "clock_mhz": "-"}
    head = (
        f"Peer {NAME}: 1Cat-vLLM #628's long prefill (cuBLAS FP16-accumulated QK, CUTLASS FP32-accumulated PV "
        f"from its compiled sm_70 SASS), calibrated like our routes, {card['sms']} SMs at {card['clock_mhz']:g} MHz; "
        f"published: its VALIDATION.md (72-SM V100, clock not published), never fitted. docs/peer-onecat-79t.md."
    )
    return "\n".join(
        [
            head,
            table(
                cells, ["shape", "peer calibrated ms (range)", "published ms (72 SMs)", "our routes (range): verdict"]
            ),
        ]
    )
