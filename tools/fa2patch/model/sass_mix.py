# SPDX-License-Identifier: BSD-3-Clause
"""From a kernel's SASS to the model's mixes (loop_mix.LoopMix): the category counts of one
warp-iteration of a hot loop (``mix_of``: HMMA step forms, shared-memory bank passes, FP32, MUFU,
SHFL, the rounds of global loads the iteration waits for), the loop timed with one CTA's warps in
phase (phases.lockstep_cycles), the code outside it run once per CTA (``outside_row``), each kind
of tile's code in a kernel whose blockIdx picks one of two tiles (``tile_code``), the split-KV
combine's row (``combine_row``), and what anchors.toml records of a kernel compiled from an
anchor's open source (``sass_record``). Every listed instruction counts once, both sides of a
branch.
"""

import math
from collections import Counter
from dataclasses import replace

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.compile import sass
from fa2patch.model import phases
from fa2patch.model.loop_mix import LoopMix, access_passes
from fa2patch.model.v100model import Card, binding, load_v100, peak_tflops

CATEGORIES = {
    "HMMA": "hmma",
    "LDS": "lds",
    "STS": "sts",
    "LDG": "ldg",
    "STG": "stg",
    "MUFU": "mufu",
    "FADD": "fp32",
    "FMUL": "fp32",
    "FFMA": "fp32",
    "FMNMX": "fp32",
    "FSETP": "fp32",
    "FSEL": "fp32",
    "FCHK": "fp32",
    "FRND": "fp32",
    "F2F": "fp32",
    "BRA": "branch",
    "BSSY": "branch",
    "BSYNC": "branch",
    "BMOV": "branch",
    "EXIT": "branch",
    "JMP": "branch",
    "CALL": "branch",
    "RET": "branch",
    "BREAK": "branch",
    "BAR": "barrier",
    "WARPSYNC": "barrier",
    "SHFL": "shuffle",
    # FP16x2 arithmetic (HADD2.F32 is also how sm_70 converts fp16 to fp32): GV100 runs it on
    # its own FP16 pipe, at the FFMA instruction rate, and the model charges it issue only
    # (docs/peer-vllm-triton.md). LDL/STL: local memory (register spills), issue only.
    "HADD2": "fp16",
    "HMUL2": "fp16",
    "HFMA2": "fp16",
    "HSETP2": "fp16",
    "HSET2": "fp16",
    "HMNMX2": "fp16",
    "LDL": "local",
    "STL": "local",
}

WIDTH = {"8": 1, "U8": 1, "S8": 1, "16": 2, "U16": 2, "S16": 2, "64": 8, "128": 16}


def access_bytes(op: str) -> int:
    """Bytes per lane of a load or store opcode (LDS.U.128 -> 16; no width suffix -> 4)."""
    return next((WIDTH[p] for p in op.split(".")[1:] if p in WIDTH), 4)


def base(op: str) -> str:
    return op.split(".")[0]


def load_use_gaps(instrs: list[sass.Instr]) -> list[int]:
    """Rounds of global loads whose data the same iteration waits for: for each, the instructions
    between the round's first load and the first instruction that names a register it loads.
    Loads still pending at the end of the iteration are issued ahead (used by the next one) and
    cost no round. Every listed instruction counts (both sides of a branch)."""
    gaps: list[int] = []
    pending: set[int] = set()
    first: int | None = None  # the round's first load: set whenever pending is not empty
    for i, ins in enumerate(instrs):
        if pending and first is not None and ins.registers & pending:
            gaps.append(i - first)
            pending, first = set(), None
        if base(ins.op) == "LDG":
            pending |= ins.loaded_registers()
            first = i if first is None else first
    return gaps


def mix_of(instrs: list[sass.Instr]) -> tuple[dict, LoopMix]:
    """The category counts of an instruction sequence (one warp-iteration) and its model mix."""
    counts = Counter(CATEGORIES.get(base(i.op), "int_other") for i in instrs)
    shared = [i.op for i in instrs if base(i.op) in ("LDS", "STS")]
    f32 = sum(1 for i in instrs if i.op.startswith("HMMA.884.F32"))
    mix = LoopMix(
        instructions=len(instrs),
        hmma_f32_steps=f32,
        hmma_f16_steps=counts["hmma"] - f32,  # HMMA.884.F16.*: the 2-step form
        shared_passes=sum(access_passes(access_bytes(op)) for op in shared),
        shared_bytes=sum(32 * access_bytes(op) for op in shared),
        fp32=counts["fp32"],
        mufu=counts["mufu"],
        load_use_gaps=tuple(load_use_gaps(instrs)),
        shuffles=counts["shuffle"],
    )
    return dict(sorted(counts.items())), mix


ENDS_PATH = ("EXIT", "RET", "BRA", "JMP", "KILL")


def reachable(function: sass.SassFunction, forced: dict[int, bool]) -> set[int]:
    """Addresses of the instructions reachable from the function's entry: every branch both ways
    (as the model counts them), except the branches in ``forced`` ({address: taken}); an
    unpredicated EXIT, RET, BRA or JMP does not fall through."""
    at = {i.addr: n for n, i in enumerate(function.instrs)}
    seen, todo = set(), [0]
    while todo:
        n = todo.pop()
        if n >= len(function.instrs) or function.instrs[n].addr in seen:
            continue
        ins = function.instrs[n]
        seen.add(ins.addr)
        taken = forced.get(ins.addr)
        if ins.target is not None and taken is not False and ins.target in at:
            todo.append(at[ins.target])
        if taken is not True and not (base(ins.op) in ENDS_PATH and not ins.predicated):
            todo.append(n + 1)
    return seen


def tile_code(function: sass.SassFunction, loops: list[sass.Loop]) -> list[list[sass.Instr]]:
    """For a kernel whose blockIdx picks one of two kinds of tile, each with its own hot loop (in
    address order): per loop, the instructions its tile's CTAs can run outside it. The dispatch
    is the first conditional branch before the first loop whose two ways separate the loops:
    not taken reaches only the first, taken only the second. A tile's code is what is reachable
    from the entry with the dispatch going its way (its epilogue may lie anywhere)."""
    first, second = loops
    addrs = [{i.addr for i in lp.instrs} for lp in loops]
    for d in (i for i in function.instrs if i.target is not None and i.predicated and i.addr < first.start):
        ways = [reachable(function, {d.addr: taken}) for taken in (False, True)]
        if all(addrs[n] <= ways[n] and not addrs[1 - n] & ways[n] for n in (0, 1)):
            inside = addrs[0] | addrs[1]
            return [[i for i in function.instrs if i.addr in way and i.addr not in inside] for way in ways]
    raise EnvironmentProblem(
        f"{function.name}: no branch before the hot loop at {first.start:#x} separates it from "
        f"the hot loop at {second.start:#x}: cannot tell the tiles' code apart"
    )


def outside_mix(instrs: list[sass.Instr]) -> dict:
    """A CTA's code outside its hot loop, run once per CTA, untimed: its mix (every instruction
    once) and the rounds of global loads it waits for (the peer model's record of it)."""
    counts, mix = mix_of(instrs)
    return {
        "instructions": len(instrs),
        "mix": counts,
        "load_rounds": len(mix.load_use_gaps),
        "model_mix": {**vars(mix), "load_use_gaps": ()},
    }


# Two global-load latencies, both beyond an L2 hit, at which code is timed again: the slope of its
# time in the latency is what it waits per cycle of DRAM latency (LoopMix.dram_rounds).
SLOPE_LATENCIES = (400.0, 800.0)


def dram_rounds(timer, v100: dict) -> float:
    """How many cycles ``timer(v100)`` grows per cycle of global-load latency (its load rounds
    waited for in turn), from two latencies beyond an L2 hit's."""
    lo, hi = (timer({**v100, "dependent_ldg_l2_hit_cycles": x}) for x in SLOPE_LATENCIES)
    return (hi - lo) / (SLOPE_LATENCIES[1] - SLOPE_LATENCIES[0])


def outside_row(instrs: list[sass.Instr], warps: int, v100: dict) -> dict:
    """``outside_mix`` and the code's time with ``warps`` warps per sub-partition in phase
    (phases.once_cycles, the loads it waits for included), and its DRAM slope (``dram_rounds``)."""
    row = outside_mix(instrs)
    once = phases.once_cycles(instrs, warps, v100)
    slope = dram_rounds(lambda v: phases.once_cycles(instrs, warps, v), v100)
    return {
        **{k: row[k] for k in ("instructions", "mix", "load_rounds")},
        "cycles": once,
        "model_mix": {**row["model_mix"], "critical_cycles": once, "critical_warps": warps, "dram_rounds": slope},
    }


def loop_row(loop: sass.Loop, v100: dict, warps_per_subpartition: int, cta_warps: int | None = None) -> dict:
    """A hot loop: its mix per warp-iteration (every instruction once), its pipes at the kernel's
    occupancy, and one CTA's iteration timed from the SASS with the ``cta_warps`` warps per
    sub-partition of one CTA in phase (phases.lockstep_cycles; ``critical_cycles``), its tensor duty
    and its serial runs."""
    instrs = loop.instrs
    counts, mix = mix_of(instrs)
    cycles = mix.pipes(warps_per_subpartition, v100)
    bound = binding(cycles)
    util = cycles["tensor"] / cycles[bound] if cycles[bound] else 0.0
    peak = peak_tflops(Card(v100["sm_count"], v100["boost_clock_mhz"]), v100["boost_clock_mhz"], v100)
    w = cta_warps or warps_per_subpartition
    timed = phases.lockstep_cycles(instrs, w, v100)
    slope = dram_rounds(lambda v: phases.lockstep_cycles(instrs, w, v)["cycles"], v100)
    mix = replace(mix, critical_cycles=timed["cycles"], critical_warps=w, dram_rounds=slope)
    return {
        "start": loop.start,
        "end": loop.end,
        "instructions": len(instrs),
        "mix": counts,
        "model_mix": vars(mix),
        "shared_bytes": mix.shared_bytes,
        "shared_passes": mix.shared_passes,
        "load_rounds": len(mix.load_use_gaps),
        "cycles": cycles,
        "binding": bound,
        "tensor_utilization_bound": util,
        "tflops_bound": util * peak,
        "critical_cycles": timed["cycles"],
        "critical_warps": w,
        "critical_tensor_duty": timed["tensor_duty"],
        "serial_runs": phases.serial_runs(instrs),
    }


def combine_row(
    function: sass.SassFunction, threads: int, blocks_per_sm: int, warps: int, cta_warps: int, v100: dict
) -> dict:
    """What report needs of the split-KV combine kernel's SASS: its main loop (``loop_row`` at the
    kernel's ``warps`` per scheduler, timed with one CTA's ``cta_warps``; its inner loops once)
    and everything else (``outside_row``), timed once."""
    loop = function.main_loop()
    if loop is None:
        raise EnvironmentProblem(f"{function.name}: the split-KV combine has no loop (expected its column loop)")
    inside = {i.addr for i in loop.instrs}
    return {
        "threads": threads,
        "blocks_per_sm": blocks_per_sm,
        "loop": loop_row(loop, v100, warps, cta_warps),
        "outside": outside_row([i for i in function.instrs if i.addr not in inside], cta_warps, v100),
    }


def sass_record(function, warps_per_cta: int, v100: dict | None = None) -> dict:
    """What anchors.toml records of a kernel compiled from an anchor's open source: its hot loop's
    mix and timed iteration (``critical_cycles`` for ``critical_warps`` warps of one CTA per
    sub-partition), and its code outside the loop timed once (``[kernel.outside]``), every
    instruction once, both sides of a branch, as for our own kernels. ``function``: a
    sass.SassFunction with one hot loop."""
    v100 = v100 or load_v100()
    (loop,) = function.hot_loops()
    w = math.ceil(warps_per_cta / 4)
    inside = {i.addr for i in loop.instrs}
    outside = [i for i in function.instrs if i.addr not in inside]
    _counts, mix = mix_of(loop.instrs)
    return {
        "loop": {
            "instructions": mix.instructions,
            "hmma_f32_steps": mix.hmma_f32_steps,
            "hmma_f16_steps": mix.hmma_f16_steps,
            "shared_passes": mix.shared_passes,
            "shuffles": mix.shuffles,
            "fp32": mix.fp32,
            "mufu": mix.mufu,
            "load_use_gaps": list(mix.load_use_gaps),
            "critical_cycles": round(phases.lockstep_cycles(loop.instrs, w, v100)["cycles"], 1),
            "critical_warps": w,
        },
        "outside": {
            "instructions": len(outside),
            "critical_cycles": round(phases.once_cycles(outside, w, v100), 1),
            "critical_warps": w,
        },
    }
