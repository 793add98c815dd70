# SPDX-License-Identifier: BSD-3-Clause
"""phases: one CTA's iteration timed from the SASS, on small synthetic loops whose cycles follow by
hand from data/v100.toml's rates and latencies: the serial phase between barriers (a), SHFL on the
shared-memory pipe (b), dependent HMMA chains (c), and loads waited for."""

import pytest

from fa2patch.compile import sass
from fa2patch.model import phases
from fa2patch.model.v100model import load_v100

V100 = load_v100()
STEP = V100["four_chain_mma884_issue_cycles"] / 4  # one HMMA.884.F32 step of a lone warp (measured issue rate)
PIPE = V100["mma884_clocks"] / 4  # one step on the tensor pipe
HMMA_LAT = V100["dependent_mma884_cycles"]
ALU = V100["alu_latency_cycles"]
LDS = V100["dependent_lds_cycles"]


def code(lines: list[str]) -> list[sass.Instr]:
    """Instructions from 'OP args' lines, 16 bytes apart."""
    out = []
    for n, line in enumerate(lines):
        op, _, args = line.partition(" ")
        out.append(sass.Instr(16 * n, op, None, args))
    return out


def cycles(lines, warps=1):
    return phases.lockstep_cycles(code(lines), warps, V100)["cycles"]


INDEPENDENT = [f"HMMA.884.F32.F32.STEP0 R{100 + 2 * i}, R200.ROW, R202.COL, RZ" for i in range(8)]
CHAIN = ["HMMA.884.F32.F32.STEP0 R0, R200.ROW, R202.COL, R0"] * 4


def test_one_warp_issues_independent_hmma_at_its_measured_rate_and_two_fill_the_pipe():
    # One warp: 8 steps of 2.095 cycles (8.38 per mma); two warps: 16 steps of the pipe's 2.
    assert cycles(INDEPENDENT) == pytest.approx(8 * STEP)
    assert cycles(INDEPENDENT, warps=2) == pytest.approx(16 * PIPE)
    assert phases.lockstep_cycles(code(INDEPENDENT), 2, V100)["tensor_duty"] == pytest.approx(1.0)


def test_dependent_hmma_waits_for_its_accumulator_and_other_warps_fill_the_pipe():
    """(c): each step reads the accumulator of the one before: 8.66 cycles a step, not 2.
    Other warps issue into the gaps until the pipe is full: 4 warps need 4 x 2 = 8 < 8.66 a step
    (still latency-bound), 5 warps 10 (pipe-bound)."""
    assert cycles(CHAIN) == pytest.approx(4 * HMMA_LAT)
    assert cycles(CHAIN, warps=2) == pytest.approx(4 * HMMA_LAT)
    assert cycles(CHAIN, warps=4) == pytest.approx(4 * HMMA_LAT)
    assert cycles(CHAIN, warps=5) == pytest.approx(4 * 5 * PIPE)


def test_a_shuffle_holds_the_shared_memory_pipe_and_waits_like_a_shared_load():
    """(b): a SHFL is one shared-memory pass (4 cycles of a scheduler's share: 4 schedulers, one
    pass per clock); a chain of them waits the LDS latency each."""
    independent = [f"SHFL.BFLY PT, R{2 * i}, R{2 * i + 1}, 0x1, 0x1f" for i in range(8)]
    assert cycles(independent) == pytest.approx(8 * 4)
    assert cycles([f"IADD3 R{2 * i}, R{2 * i + 1}, 0x1, RZ" for i in range(8)]) == pytest.approx(8)
    assert cycles(["SHFL.BFLY PT, R0, R0, 0x1, 0x1f"] * 4) == pytest.approx(4 * LDS)


SERIAL = INDEPENDENT + ["FADD R0, R0, R1"] * 10 + ["BAR.SYNC 0x0"]


def test_the_serial_phase_between_barriers_is_not_overlapped_by_the_same_warps():
    """(a): 8 HMMA steps, then a chain of 10 dependent FADDs, then a CTA barrier. One warp: the
    steps (7 x 2.095 after the first), one cycle to the first FADD, 9 x 4 along the chain, the
    barrier and one cycle: 53.665; summing pipes instead would say max(16.8, 19, 20) = 20. Only
    another CTA, elsewhere in its loop, overlaps such a phase (v100model: max(k x pipe, C))."""
    one = cycles(SERIAL)
    assert one == pytest.approx(7 * STEP + 1 + 9 * ALU + 1 + 1)
    # Two warps alternate on the tensor pipe and reach their chains together: both chains run
    # side by side after all 16 steps, none under an HMMA. Summing pipes would say
    # max(tensor 32, issue 38, FP32 40) = 40.
    two = cycles(SERIAL, warps=2)
    assert 16 * PIPE + 9 * ALU <= two <= 16 * PIPE + 9 * ALU + 8
    assert two > 40 + 25


def test_a_pair_barrier_waits_for_the_warps_own_stores_only():
    store_then_load = ["STS [R2], R4", "BAR.SYNC 0x1, 0x40", "LDS R6, [R2]", "FADD R7, R6, R6"]
    state = phases.simulate(code(store_then_load), 2, V100, 1)
    # The barrier issues once the warp's store has landed (33.56 - 26.44 cycles after it).
    sts_done = V100["sts_lds_warpsync_roundtrip_cycles"] - LDS
    assert state["ends"][0] >= sts_done + LDS
    assert phases.barrier_threads(code(store_then_load)[1]) == 64
    assert phases.barrier_threads(code(["BAR.SYNC 0x0"])[0]) is None


def test_code_run_once_waits_for_its_loads():
    once = phases.once_cycles(code(["LDG.E.SYS R4, [R2]", "FADD R5, R4, R4"]), 1, V100)
    assert once == pytest.approx(V100["dependent_ldg_l2_hit_cycles"] + 1)


@pytest.mark.parametrize(
    "line, reads, writes",
    [
        ("SHFL.BFLY PT, R196, R197, 0x8, 0x1f", {197}, {196}),
        ("ISETP.GE.AND P4, PT, R2, R217, PT", {2, 217}, set()),
        ("LDS.U.128 R164, [R184+0x40]", {184}, {164, 165, 166, 167}),
        ("HMMA.884.F32.F32.STEP2 R192, R12.reuse.ROW, R164.reuse.COL, R196", {12, 164, 196}, {192, 193}),
        ("STS.128 [R3+0x10], R12", {3, 12}, set()),
        ("IMAD.WIDE.U32 R6, R5, 0x4, R8", {5, 8}, {6, 7}),
    ],
)
def test_operands(line, reads, writes):
    assert phases.operands(code([line])[0]) == (reads, writes)


def test_serial_runs_find_the_hmma_free_stretches_including_the_wrap():
    lines = (
        ["IADD3 R1, R1, 0x1, RZ"] * 3
        + INDEPENDENT[:2]
        + ["SHFL.BFLY PT, R0, R0, 0x1, 0x1f"] * 2
        + ["MUFU.EX2 R3, R3"]
        + ["BAR.SYNC 0x0"]
        + ["FADD R0, R0, R1"] * 16
        + INDEPENDENT[:2]
        + ["NOP"] * 14
    )
    runs = phases.serial_runs(code(lines))
    assert [(r["start"], r["instructions"]) for r in runs] == [(5, 20), (27, 17)]
    assert (runs[0]["shuffles"], runs[0]["mufu"], runs[0]["barriers"]) == (2, 1, 1)
    assert phases.serial_runs(code(lines), shortest=18) == runs[:1]


def test_the_dram_slope_counts_the_load_rounds_an_iteration_waits_for_in_turn():
    """sass_mix.dram_rounds: two loads whose results feed the next load's address wait one after
    the other (2 cycles per cycle of latency); two independent loads used together wait once (1);
    code without global loads does not move (0)."""
    from fa2patch.model.sass_mix import dram_rounds

    chained = ["LDG.E.SYS R2, [R4]", "LDG.E.SYS R6, [R2]", "FADD R8, R6, R6"]
    together = ["LDG.E.SYS R2, [R4]", "LDG.E.SYS R6, [R10]", "FADD R8, R6, R2"]
    plain = ["FADD R8, R6, R2", "FADD R9, R8, R2"]
    slope = {
        name: dram_rounds(lambda v, lines=lines: phases.lockstep_cycles(code(lines), 1, v)["cycles"], V100)
        for name, lines in (("chained", chained), ("together", together), ("plain", plain))
    }
    assert slope == pytest.approx({"chained": 2.0, "together": 1.0, "plain": 0.0})
