# SPDX-License-Identifier: BSD-3-Clause
"""The decode kernel's launches (sm70-decode, patch 0002; where routing's rule or FA2PATCH_SM70_DECODE=1
sends a call), as the extension runs a call of one query row per sequence (docs/report-model.md, "The decode kernel").

- **Its SASS** (``key_loop``, ``outside``; report.kernel_rows times them): no tensor cores, so no
  HMMA hot loop; its key loop is the loop holding the maxima's butterfly (SHFL.BFLY) and two inner
  loops, the scores' chunks of a K row and P V's groups of V loads, run ``trips`` times per
  iteration (the kernel's constants, mirrored below; a loop of one trip leaves no loop in the
  SASS): the iteration is timed with the inner loops' instructions repeated that often. Of the two
  such loops (with and without softcap/ALiBi) the shorter, the common case, is charged.
- **Its launch** (``launch``): one CTA per (sequence, KV head, split) -- two for groups of 9-16 rows
  (``row_blocks``: half the rows each, adjacent in the grid) -- the split filling the kernel's CTA
  slots in one wave (patch 0004's routing::decode_splits: slots / CTAs, at most one per 128 keys and
  128), each split ceil(keys / splits) rounded up to 16 keys and at least 128 (kSplitKeys: one
  iteration of every warp), kWarps x kKeysPerWarp keys per iteration; a split past the sequence's
  keys writes only its LSE and exits (no iteration, no partial O);
  K/V streamed from DRAM (memory.py) once per row block (the row blocks read the same K/V at about the
  same time, so L2 may serve the second read: not credited, a conservative choice), no fused per-CTA
  term (the decode anchors reject it for kernels built like this one); then the exact route's
  combine, charged its bytes (report.predict_decode).
"""

import re

from fa2patch.common.routes import DECODE_HEAD_DIMS, DECODE_MAX_ROWS
from fa2patch.common.shapes import Shape
from fa2patch.compile import sass
from fa2patch.model.loop_mix import LoopMix
from fa2patch.model.v100model import KernelLaunch

KERNEL = re.compile(r"decode_sm70_kernel<(\d+), (\d+)>")
# decode_sm70.h / decode_sm70.cu (a CPU test reads them from the series): threads per CTA, keys per
# warp iteration; 16-byte loads in flight per lane in the scores' and P V's inner loops (LOADS_IN_FLIGHT,
# or LOADS_IN_FLIGHT_MANY_ROWS from MANY_ROWS rows below head dim 256: in_flight); the fewest keys of
# a split (kSplitKeys, also routing's kDecodeKeysPerSplit) and the granularity of a split's share;
# the most rows one CTA holds (kRows.back()) and the most a call may have (kMaxRows: row blocks of
# CTA_ROWS).
THREADS, KEYS_PER_WARP = 128, 32
LOADS_IN_FLIGHT, LOADS_IN_FLIGHT_MANY_ROWS, MANY_ROWS = 16, 8, 6
SPLIT_KEYS, SPLIT_ROUND = THREADS // 32 * KEYS_PER_WARP, 16
CTA_ROWS, MAX_ROWS, HEAD_DIMS = 8, DECODE_MAX_ROWS, DECODE_HEAD_DIMS
# Patch 0004's built-in rule (routing.cpp decode_kernel_rule, kDecodeRuleBytes; a CPU test reads it
# from the series and tests/model/test_decode_rule.py checks each bound on this model): no softcap or
# ALiBi (the model times the plain key loop; a Shape has neither), one query row per sequence, rows
# in a class below (the upper ends: 1, 2-4, 5-6, 7-8), and K/V bytes per wave of the exact route's
# CTAs at most RULE_MIB[row class][head dim's index in RULE_DIMS] MiB.
RULE_ROWS, RULE_DIMS = (1, 4, 6, 8), (64, 128, 256)
RULE_MIB = ((64, 4, 4), (32, 32, 32), (16, 32, 32), (16, 16, 16))


def instantiation(name: str) -> tuple[int, int] | None:
    """(head dim, rows) of a decode kernel's demangled name, else None."""
    m = KERNEL.search(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def in_flight(head_dim: int, rows: int) -> tuple[int, int]:
    """16-byte loads in flight per lane of the ``<head_dim, rows>`` instantiation (decode_sm70.cu
    Lanes): of a K row's head_dim / 8 chunks, and of the 32 / (32 / (head_dim / 8)) V loads of an
    iteration, at most kInFlight each."""
    wide = LOADS_IN_FLIGHT_MANY_ROWS if head_dim < 256 and rows >= MANY_ROWS else LOADS_IN_FLIGHT
    chunks = head_dim // 8
    return min(chunks, wide), min(KEYS_PER_WARP // (32 // chunks), wide)


def trips(head_dim: int, rows: int) -> tuple[int, int]:
    """The inner loops' trips per key-loop iteration: K chunks (head_dim / 8 per row) and V loads
    (32 / (head_dim / 8) keys each), each in groups of in_flight."""
    chunks = head_dim // 8
    k_group, v_group = in_flight(head_dim, rows)
    return chunks // k_group, KEYS_PER_WARP // ((32 // chunks) * v_group)


def key_loop(function: sass.SassFunction, head_dim: int, rows: int) -> sass.Loop | None:
    """The key loop's iteration, its inner loops' instructions repeated as often as they run (for
    sass_mix.loop_row), or None where the SASS has no such loop. Candidates: loops holding the maxima's
    butterfly with as many nested load loops as the inner loops have trips above one, expanded; kept
    where the expansion holds a key iteration's FMAs (a lane's key against every row, head_dim each,
    and its P V share, head_dim x rows: 2 x head_dim x rows); the shortest (the copy without softcap
    and ALiBi). The FMA test leaves out the backward branches ptxas lays across the loop's copies."""
    loops = function.loops()
    repeats = [n for n in trips(head_dim, rows) if n > 1]  # a loop of one trip is not one in the SASS

    def inner(a, b):  # the K-row and V-row loads' loops (other backward branches load nothing)
        loads = any(op.startswith("LDG") for op in a.opcodes)
        return a is not b and b.start <= a.start and a.end <= b.end and len(a.instrs) > 8 and loads

    def nested(lp):
        return sorted((x for x in loops if inner(x, lp)), key=lambda x: x.start)

    def expand(outer):
        expanded, done = [], -1
        for lp, n in zip(nested(outer), repeats, strict=True):
            expanded += [i for i in outer.instrs if done < i.addr < lp.start] + lp.instrs * n
            done = lp.end
        expanded += [i for i in outer.instrs if i.addr > done]
        return sass.Loop(outer.start, outer.end, expanded)

    keyed = [
        expand(lp)
        for lp in loops
        if any(op.startswith("SHFL.BFLY") for op in lp.opcodes) and len(nested(lp)) == len(repeats)
    ]
    fmas = 2 * head_dim * rows
    full = [lp for lp in keyed if sum(op.startswith("FFMA") for op in lp.opcodes) >= fmas]
    return min(full, key=lambda lp: len(lp.instrs)) if full else None


def outside(function: sass.SassFunction) -> list[sass.Instr]:
    """The code outside every loop: run once per CTA."""
    looped = {i.addr for lp in function.loops() for i in lp.instrs}
    return [i for i in function.instrs if i.addr not in looped]


def row_blocks(rows: int) -> tuple[int, int]:
    """(CTAs per sequence, KV head and split; rows of each but the last) for ``rows`` rows per KV head
    (decode_sm70.h row_blocks / block_rows)."""
    blocks = -(-rows // CTA_ROWS)
    return blocks, -(-rows // blocks)


def kernel_for(shape: Shape, rows: list[dict]) -> dict | None:
    """The report row of the decode kernel that takes ``shape`` (one query row per sequence, no
    decode rows beside it, head dim instantiated exactly, the smallest instantiation holding the
    group's rows or, past CTA_ROWS, its row blocks' rows), or None: the exact route runs it."""
    if shape.q != 1 or shape.decode or shape.hkv < 1 or shape.hq % shape.hkv or shape.hq // shape.hkv > MAX_ROWS:
        return None
    per_cta = row_blocks(shape.hq // shape.hkv)[1]
    fits = [
        (inst[1], r)
        for r in rows
        if "decode" in r and (inst := instantiation(r["kernel"])) and inst[0] == shape.d and inst[1] >= per_cta
    ]
    return min(fits, key=lambda x: x[0])[1] if fits else None


def ctas(shape: Shape) -> int:
    """CTAs per key split: sequences x KV heads x row blocks (the split itself: report.decode_launches,
    routing's one-wave rule, which lives in exact_route)."""
    return shape.b * shape.hkv * row_blocks(shape.hq // shape.hkv)[0]


def launch(shape: Shape, kernel: dict, n: int) -> tuple[KernelLaunch, dict]:
    """The decode kernel's launch for ``shape`` split ``n`` ways (report.decode_launches), and its plan: the
    splits, the row blocks and, where split, the bytes the combine moves (the partials read, O
    written)."""
    d = kernel["decode"]
    blocks = row_blocks(shape.hq // shape.hkv)[0]
    share = -(-shape.kv // n)
    per = max(SPLIT_KEYS, -(-share // SPLIT_ROUND) * SPLIT_ROUND)
    warps = THREADS // 32
    keys = [max(0, min(shape.kv, (s + 1) * per) - s * per) for s in range(n)]
    its = [-(-k // (warps * KEYS_PER_WARP)) for k in keys for _ in range(shape.b * shape.hkv * blocks)]
    q_bytes = shape.b * shape.hq * shape.d * 2
    kv_bytes = 2 * shape.b * shape.kv * shape.hkv * shape.d * 2 * blocks
    # Every split writes its LSE; only the splits with keys their O (the combine reads those).
    live = sum(1 for k in keys if k > 0)
    partials = shape.b * shape.hq * (live * shape.d * 4 + n * 4) if n > 1 else 0
    forward = KernelLaunch(
        kernel["kernel"],
        LoopMix(**d["loop"]["model_mix"]),
        tuple(its),
        warps,
        kernel["occupancy"]["blocks_per_sm"],
        LoopMix(**d["outside"]["model_mix"]),
        0,
        hbm_bytes=2 * q_bytes + shape.b * shape.hq * 4 + kv_bytes + partials,
        streams=True,
    )
    plan = {"splits": n, "keys_per_split": per, "rows": shape.hq // shape.hkv, "row_blocks": blocks}
    return forward, {**plan, "combine_bytes": partials + q_bytes if n > 1 else 0}


def rule_bound(rows: int, head_dim: int) -> int | None:
    """The K/V bytes per exact-route wave up to which the built-in rule sends a decode call of ``rows``
    rows per KV head at ``head_dim`` to the decode kernel; None: it never does."""
    if head_dim not in RULE_DIMS or not 1 <= rows <= RULE_ROWS[-1]:
        return None
    row_class = next(i for i, top in enumerate(RULE_ROWS) if rows <= top)
    return RULE_MIB[row_class][RULE_DIMS.index(head_dim)] << 20


def rule_takes(shape: Shape, exact_slots: int, capturing: bool = False) -> bool:
    """Whether the built-in rule sends ``shape`` to the decode kernel, on a device whose exact route
    holds ``exact_slots`` CTAs at once (SMs x its CTAs per SM): its K/V bytes over the waves of the
    exact route's b x KV heads CTAs within rule_bound; under CUDA graph capture (``capturing``) every
    shape of a row class and head dim the rule knows, whatever its length."""
    if shape.q != 1 or shape.decode or shape.hkv < 1 or shape.hq % shape.hkv:
        return False
    bound = rule_bound(shape.hq // shape.hkv, shape.d)
    if capturing:
        return bound is not None
    ctas = shape.b * shape.hkv
    waves = -(-ctas // max(1, exact_slots))
    return bound is not None and ctas * shape.kv * shape.d * 4 <= bound * waves
