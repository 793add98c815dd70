# SPDX-License-Identifier: BSD-3-Clause
"""The long-prefill route's launches (sm70-gqa-prefill), from the plan the extension runs.

The op's block plan and launch sequence exist once, in its C++ (gqa_prefill_api.cpp make_plan and
make_steps), and ``report`` reads them from the extension without a GPU: its CPU op
``gqa_prefill_plan(seqlen_q, seqlen_k, num_heads_q, num_heads_k)`` (extension.read_extension)
gives the block size and, per launch (one per KV step s = 0 .. blocks), the pv CTAs of block s-1
and the qk CTAs of block s with their blocks' keys, and every CTA's kind and main-loop iterations
in blockIdx order as runs of [kind, count, iterations] ("idle": a CTA that returns at once).

What this module adds is the model's side: which shapes report asks the op about (``eligible``),
the kernel's two hot loops told apart (``tile_loops``), each launch's HBM bytes
(``step_hbm_bytes``) and the launches (``launches``).
"""

from dataclasses import replace
from pathlib import Path

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.shapes import Shape
from fa2patch.compile.extension import read_extension
from fa2patch.model.loop_mix import LoopMix
from fa2patch.model.v100model import CtaKind, KernelLaunch


def sizes(shape: Shape) -> tuple[int, int, int, int]:
    """gqa_prefill_plan's arguments for a shape: seqlen_q, seqlen_k, num_heads_q, num_heads_k."""
    return shape.q, shape.kv, shape.hq, shape.hkv


def may_take(shape: Shape) -> bool:
    """What the op's interface takes whatever the build: one causal sequence without decode rows,
    whole groups, KV >= Q > 0 (the op itself also refuses groups larger than it supports)."""
    return (
        shape.causal
        and shape.b == 1
        and not shape.decode
        and shape.hkv > 0
        and shape.hq % shape.hkv == 0
        and shape.kv >= shape.q > 0
    )


def eligible(shape: Shape, geometry: dict) -> bool:
    """``may_take`` at the kernel's head dim."""
    return may_take(shape) and shape.d == geometry["head_dim"]


def tile_loops(kernel: dict) -> dict:
    """The long-prefill kernel's two hot loops, told apart by what the geometry says each does
    per warp-iteration: the pv loop exponentiates its rows x keys scores (MUFU), the qk loop none."""
    loops = kernel["hot_loops"]
    pv = [lp for lp in loops if lp["mix"].get("mufu", 0)]
    qk = [lp for lp in loops if not lp["mix"].get("mufu", 0)]
    if len(pv) != 1 or len(qk) != 1 or any("outside" not in lp for lp in loops):
        raise EnvironmentProblem(
            f"kernel {kernel['kernel']}: expected one qk hot loop (no MUFU) and one pv hot loop "
            f"(MUFU), each with its tile's code; got {len(qk)} and {len(pv)}"
        )
    return {"qk": qk[0], "pv": pv[0]}


def step_hbm_bytes(step: dict, plan: dict, tiles: dict, shape: Shape) -> int:
    """One launch's DRAM bytes: V of its pv block and K of its qk block once (the CTAs of a block
    share them in L2), Q once per qk row tile (its key tiles share it); per qk CTA its scores (fp16)
    and its row maxima (fp32) written; per pv CTA the scores and maxima it reads (``chunks`` of the
    pv tile's keys; one maximum per qk tile of keys, so qk keys must be a multiple of pv keys), its
    FP32 state (accumulator, m, l) read unless the block is the first and written unless it is the
    last, and with the last block O (fp16) and the LSE (fp32) of its rows."""
    qk, pv = tiles["qk"], tiles["pv"]
    per_max = qk["keys_per_iteration"] // pv["keys_per_iteration"]
    if per_max * pv["keys_per_iteration"] != qk["keys_per_iteration"]:
        raise EnvironmentProblem(
            f"long-prefill tiles: qk keys {qk['keys_per_iteration']} are not a multiple of pv keys "
            f"{pv['keys_per_iteration']} (the traffic model reads one maximum per qk tile)"
        )
    d, hkv = shape.d, shape.hkv
    state = pv["rows_per_cta"] * (d * 4 + 2 * 4)
    ctas = [(kind, its) for kind, count, its in step["runs"] for _ in range(count)]
    total = 0
    if step["pv"] is not None:
        block = step["pv"]
        total += block["num_keys"] * hkv * d * 2
        for kind, chunks in ctas:
            if kind == "pv":
                total += pv["rows_per_cta"] * (chunks * pv["keys_per_iteration"] * 2 + -(-chunks // per_max) * 4)
                total += state * ((not block["first"]) + (not block["last"]))
        if block["last"]:
            total += hkv * plan["rows"] * (d * 2 + 4)
    if step["qk"] is not None:
        block = step["qk"]
        total += block["num_keys"] * hkv * d * 2
        total += sum(qk["rows_per_cta"] * (qk["keys_per_iteration"] * 2 + 4) for kind, _ in ctas if kind == "qk")
        first_row, end = (
            block["row_tile0"] * qk["rows_per_cta"],
            (block["row_tile0"] + block["row_tiles"]) * qk["rows_per_cta"],
        )
        total += hkv * max(0, min(plan["rows"], end) - first_row) * d * 2  # the real rows of its row tiles
    return total


def launches(shape: Shape, kernel: dict, plan: dict) -> tuple[list[KernelLaunch], dict]:
    """The route's launches for ``shape`` from the op's ``plan`` (gqa_prefill_plan's JSON): per
    step one launch whose CTAs are runs of pv, qk and idle tiles (``KernelLaunch.more``); each
    tile's code outside its hot loop is charged once per CTA (its pipes as the epilogue, its load
    rounds as the prologue)."""
    g = kernel["geometry"]
    tiles = {t["kind"]: t for t in g["tiles"]}
    kinds = {
        name: CtaKind(LoopMix(**lp["model_mix"]), (), LoopMix(**lp["outside"]["model_mix"]), 0)
        for name, lp in tile_loops(kernel).items()
    }
    kinds["idle"] = CtaKind(LoopMix(), (), LoopMix(), 0)
    out = []
    for step in plan["steps"]:
        runs: list[tuple[str, list[int]]] = []  # consecutive CTAs of one kind
        for kind, count, its in step["runs"]:
            if runs and runs[-1][0] == kind:
                runs[-1][1].extend([its] * count)
            else:
                runs.append((kind, [its] * count))
        if not runs:
            continue
        parts = [replace(kinds[name], iterations=tuple(its)) for name, its in runs]
        head = parts[0]
        out.append(
            KernelLaunch(
                kernel["kernel"],
                head.loop,
                head.iterations,
                g["warps"],
                kernel["occupancy"]["blocks_per_sm"],
                head.epilogue,
                head.prologue_load_rounds,
                step_hbm_bytes(step, plan, tiles, shape),
                tuple(parts[1:]),
            )
        )
    return out, {"block_keys": plan["block_keys"], "blocks": plan["num_blocks"], "splits": 1}


def read_plans(artifact: Path, shapes: list[Shape], plans: dict | None = None) -> tuple[dict, dict]:
    """build_info() and the long-prefill op's plans for the ``shapes`` it may take
    (may_take) that ``plans`` lacks, read in one subprocess (extension.read_extension):
    (build_info or {error}, plans by sizes including ``plans``)."""
    plans = dict(plans or {})
    chunks = [replace(s, decode=0, decode_kv=0) for s in shapes if s.decode]  # predict_per_request's
    wanted = list(dict.fromkeys(sizes(s) for s in [*shapes, *chunks] if may_take(s)))
    wanted = [s for s in wanted if s not in plans]
    got = read_extension(artifact, wanted)
    if "error" in got:
        return got, plans
    return got["build_info"], {**plans, **dict(zip(wanted, got["gqa_plans"], strict=True))}
