# SPDX-License-Identifier: BSD-3-Clause
"""What fused kernels lose between their pipes: one CTA's iteration timed from the SASS.

The pipe model (loop_mix.LoopMix.pipes) sums each pipe over an iteration as if everything
overlapped. It does not when the warps of a CTA run in phase: a CTA barrier per iteration keeps
the W warps of one scheduler at the same place in the code, so the instructions between the last
S HMMA and the first PV HMMA (row max and sum by SHFL, the P exchange through shared memory
between barriers, MUFU) leave the tensor pipe idle unless another CTA on the SM is elsewhere.
``lockstep_cycles`` times that: the W warps of one scheduler issue each instruction together
(W issue slots), each instruction waits for the registers it reads, for its pipe, and a barrier
for the shared-memory stores before it; three iterations run back to back and the last one's
length is the answer (loop-carried registers included). What it charges:

- (a) the serial phase: instructions that no HMMA of the same warps overlaps cost their issue
  slots, their pipes and their dependency chains in full;
- (b) SHFL on the shared-memory pipe: one pass (32 lanes x 4 bytes) like a 32-bit LDS, with the
  LDS latency;
- (c) dependent HMMA: a step that reads the accumulator of an earlier step waits for it
  (``dependent_mma884_cycles`` per mma.m8n8k4, measured), so few independent accumulators in
  flight cost more than the 8-clock throughput; and one warp issues independent mma no faster
  than ``four_chain_mma884_issue_cycles`` (measured), so a lone warp cannot fill the tensor pipe;
- global loads whose data the iteration waits for (``dependent_ldg_l2_hit_cycles``).

Latencies and pipe rates are data/v100.toml's (each with its source). Predicate registers are
not tracked; every listed instruction runs (both sides of a branch), as everywhere in the model.
"""

import itertools
import math
import re
from collections import Counter
from dataclasses import dataclass

from fa2patch.compile import sass
from fa2patch.model.loop_mix import SUBPARTITIONS

_REG = re.compile(r"\bR(\d+)\b")
NO_RESULT = (
    "STS",
    "STG",
    "STL",
    "ST",
    "BAR",
    "BRA",
    "BSSY",
    "BSYNC",
    "EXIT",
    "RET",
    "JMP",
    "CALL",
    "NOP",
    "BMOV",
    "WARPSYNC",
    "BREAK",
    "MEMBAR",
    "RED",
    "ATOM",
    "YIELD",
    "DEPBAR",
    "KILL",
    "BPT",
)
CONTROL = ("BRA", "BSSY", "BSYNC", "EXIT", "RET", "JMP", "CALL", "NOP", "BMOV", "WARPSYNC", "BREAK", "YIELD")
FP32 = ("FADD", "FMUL", "FFMA", "FMNMX", "FSETP", "FSEL", "FCHK", "FRND", "F2F")


@dataclass(frozen=True)
class Timing:
    """How one warp-instruction uses the scheduler: its pipe (or None), the cycles it holds that
    pipe, and the cycles until a reader of its result may issue."""

    pipe: str | None
    occupancy: float
    latency: float


def base(op: str) -> str:
    return op.split(".")[0]


def width(op: str) -> int:
    """32-bit registers a load or a wide result writes."""
    parts = op.split(".")
    if "128" in parts:
        return 4
    if "64" in parts or "WIDE" in parts:
        return 2
    return 1


def access_passes(op: str) -> int:
    """Bank passes of a warp-wide shared access: 32 lanes x width over 32 banks x 4 bytes."""
    parts = op.split(".")
    size = 16 if "128" in parts else 8 if "64" in parts else 4
    return max(1, 32 * size // 128)


def operands(ins: sass.Instr) -> tuple[set[int], set[int]]:
    """(registers read, registers written). The first operand is the result (SHFL: the second,
    after its predicate), except for instructions without one (stores, barriers, branches) or
    whose first operand is a predicate (ISETP, FSETP), whose registers are all read. An HMMA step
    writes a register pair; a load its width; CS2R a pair."""
    b = base(ins.op)
    fields = ins.args.split(",")
    if b == "SHFL" and len(fields) > 1:  # SHFL.BFLY PT, R196, R196, 0x8, 0x1f: the result is second
        fields = fields[1:]
    result = _REG.search(fields[0]) if fields else None
    if b in NO_RESULT or result is None or fields[0].strip().startswith("["):
        return {int(r) for r in _REG.findall(ins.args)}, set()
    first = int(result.group(1))
    n = 2 if b in ("HMMA", "CS2R") else width(ins.op)
    return {int(r) for r in _REG.findall(",".join(fields[1:]))}, set(range(first, first + n))


def timing(ins: sass.Instr, v100: dict) -> Timing:
    b = base(ins.op)
    shared_pass = SUBPARTITIONS / v100["shared_passes_per_clock_per_sm"]  # cycles of one scheduler's share
    lds = v100["dependent_lds_cycles"]
    if b == "HMMA":
        steps_per_mma = 4 if ".F32" in ins.op else 2
        return Timing("tensor", v100["mma884_clocks"] / steps_per_mma, v100["dependent_mma884_cycles"])
    if b == "LDS":
        return Timing("shared", access_passes(ins.op) * shared_pass, lds)
    if b == "STS":
        return Timing("shared", access_passes(ins.op) * shared_pass, v100["sts_lds_warpsync_roundtrip_cycles"] - lds)
    if b == "SHFL":
        return Timing("shared", shared_pass, lds)
    if b in ("LDG", "LD", "LDL"):
        return Timing(None, 0, v100["dependent_ldg_l2_hit_cycles"])
    if b == "MUFU":
        occ = 32 / v100["mufu_lanes_per_subpartition"]
        return Timing("mufu", occ, v100["alu_latency_cycles"] + occ)
    if b in FP32:
        return Timing("fp32", 32 / v100["fp32_lanes_per_subpartition"], v100["alu_latency_cycles"])
    if b in CONTROL:
        return Timing(None, 0, 0)
    return Timing(None, 0, v100["alu_latency_cycles"])


def barrier_threads(ins: sass.Instr) -> int | None:
    """The thread count a BAR names (BAR.SYNC 0x1, 0x40: 64 threads), None for the whole CTA."""
    fields = [f.strip() for f in ins.args.split(",")]
    return int(fields[1], 0) if len(fields) > 1 and fields[1].startswith("0x") else None


@dataclass
class Warp:
    """One warp's place in the code, when its registers may be read, when its last shared store
    lands, and whether it waits at a barrier."""

    pc: int = 0
    stores: float = 0.0
    waiting: bool = False
    hmma: float = 0.0  # the earliest its next HMMA step may issue

    def __post_init__(self):
        self.ready: dict[int, float] = {}


def simulate(instrs: list[sass.Instr], warps: int, v100: dict, iterations: int) -> dict:
    """``warps`` warps of one CTA on one scheduler run ``instrs`` ``iterations`` times. Each cycle
    at most one instruction issues: the one that can issue earliest (its registers ready, its
    pipe free), the lowest warp first on a tie (greedy: a warp keeps issuing until it stalls, so
    warps drift apart between barriers). A barrier over the whole CTA holds every warp until all
    have arrived and their shared stores have landed; a barrier over fewer threads (a warp pair)
    waits for the warp's own stores (its partner, on another scheduler, keeps the same pace). The
    other schedulers run the same warps in phase: they share the SM's shared-memory passes.
    Returns the time each iteration ended (its last warp's last issue) and each one's tensor-busy
    time."""
    n = len(instrs)
    total = n * iterations
    ws = [Warp() for _ in range(warps)]
    pipes: dict[str, float] = {}
    port = 0.0
    ends, busy = [0.0] * iterations, [0.0] * iterations
    timings = [timing(i, v100) for i in instrs]
    ops = [operands(i) for i in instrs]
    bars = [base(i.op) == "BAR" for i in instrs]
    whole = [bars[k] and barrier_threads(instrs[k]) is None for k in range(n)]
    arrived: list[float] = []
    while True:
        best: Warp | None = None
        best_t = math.inf
        for w in ws:
            if w.pc >= total or w.waiting:
                continue
            k = w.pc % n
            t = max([port, *(w.ready.get(r, 0.0) for r in ops[k][0])])
            pipe = timings[k].pipe
            if pipe is not None:
                t = max(t, pipes.get(pipe, 0.0))
            if pipe == "tensor":
                t = max(t, w.hmma)
            if bars[k]:
                t = max(t, w.stores)
            if t < best_t:
                best, best_t = w, t
        if best is None:
            if arrived:  # everyone waits at a CTA barrier: release them
                release = max(arrived)
                for w in ws:
                    w.waiting = False
                    w.pc += 1
                port = max(port, release)
                arrived = []
                continue
            break
        k = best.pc % n
        tm = timings[k]
        it = best.pc // n
        if tm.pipe is not None:
            pipes[tm.pipe] = best_t + tm.occupancy
            if tm.pipe == "tensor":
                busy[it] += tm.occupancy
                best.hmma = best_t + tm.occupancy * v100["four_chain_mma884_issue_cycles"] / v100["mma884_clocks"]
        port = best_t + 1
        for r in ops[k][1]:
            best.ready[r] = best_t + tm.latency
        if base(instrs[k].op) == "STS":
            best.stores = max(best.stores, best_t + tm.latency)
        ends[it] = max(ends[it], best_t + 1)
        if whole[k]:
            best.waiting = True
            arrived.append(best_t + 1)
            if len(arrived) == sum(1 for w in ws if w.pc < total):
                release = max(arrived)
                for w in ws:
                    if w.waiting:
                        w.waiting = False
                        w.pc += 1
                port = max(port, release)
                arrived = []
            continue
        best.pc += 1
    return {"ends": ends, "tensor_busy": busy}


def lockstep_cycles(instrs: list[sass.Instr], warps: int, v100: dict, iterations: int = 4) -> dict:
    """Cycles of one iteration of ``instrs`` (one warp's instructions, in order) on a scheduler
    running ``warps`` warps of one CTA (``simulate``), in the steady state: the finish time of
    ``iterations`` back-to-back runs less that of one fewer (registers carried over; start-up and
    the last iteration's early finish cancel; warps that drift apart without a barrier are
    counted by when all are done); and its tensor-pipe duty."""
    more, fewer = (simulate(instrs, warps, v100, n) for n in (iterations, iterations - 1))
    cycles = max(more["ends"]) - max(fewer["ends"])
    busy = sum(more["tensor_busy"]) - sum(fewer["tensor_busy"])
    return {"cycles": cycles, "tensor_duty": busy / cycles if cycles else 0.0}


def once_cycles(instrs: list[sass.Instr], warps: int, v100: dict) -> float:
    """Cycles of code that runs once per CTA (a prologue or an epilogue), from an idle start."""
    return simulate(instrs, warps, v100, 1)["ends"][0] if instrs else 0.0


def serial_runs(instrs: list[sass.Instr], shortest: int = 16) -> list[dict]:
    """The iteration's HMMA-free runs of at least ``shortest`` instructions, the loop's wrap
    (the tail after the last HMMA and the head before the first) included: where the serial
    phase is. {start: index of its first instruction, instructions, shuffles, barriers, mufu}."""
    at = [n for n, i in enumerate(instrs) if base(i.op) == "HMMA"]
    if not at:
        return []
    gaps = [(a + 1, b - a - 1) for a, b in itertools.pairwise(at)] + [(at[-1] + 1, len(instrs) - 1 - at[-1] + at[0])]
    out = []
    for first, n in gaps:
        if n < shortest:
            continue
        count = Counter(base(instrs[(first + k) % len(instrs)].op) for k in range(n))
        out.append(
            {
                "start": first,
                "instructions": n,
                "shuffles": count["SHFL"],
                "barriers": count["BAR"],
                "mufu": count["MUFU"],
                "shared_stores": count["STS"],
                "shared_loads": count["LDS"],
            }
        )
    return sorted(out, key=lambda r: -r["instructions"])
