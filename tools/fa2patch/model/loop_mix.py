# SPDX-License-Identifier: BSD-3-Clause
"""What one warp issues per iteration of a hot loop (``LoopMix``), the pipe cycles it needs on a V100
sub-partition, and its shared-memory bank passes; the V100 cycle model (v100model.py) times launches of
such loops. Mixes come from a kernel's SASS (sass_mix.py) or from the anchors' data (``mix_from_data``)."""

from dataclasses import dataclass

SUBPARTITIONS = 4


@dataclass(frozen=True)
class LoopMix:
    """What one warp issues per iteration of a loop (every instruction once, both sides of a
    branch). ``load_use_gaps``: for each round of global loads whose results the same
    iteration uses, the warp's instructions between the round's first load and the first use.
    ``critical_cycles``: one iteration of a CTA whose ``critical_warps`` warps per sub-partition
    run in phase, timed from the SASS (phases.lockstep_cycles); 0 where the SASS is not known.
    ``dram_rounds``: how many cycles that critical path grows per cycle of global-load latency (its
    load rounds waited for in turn): a loop that streams from DRAM waits the DRAM latency instead of
    the L2 hit's it was timed with (v100model, memory.py).
    For code that runs once per CTA (an epilogue), the time of that code."""

    instructions: float = 0
    hmma_f32_steps: float = 0  # HMMA.884.F32.*: 4 steps of 2 clocks per mma.m8n8k4
    hmma_f16_steps: float = 0  # HMMA.884.F16.*: 2 steps of 4 clocks per mma.m8n8k4
    shared_passes: float = 0  # bank passes (wavefronts) of LDS/STS
    shared_bytes: float = 0  # all lanes; for the report (passes bind)
    fp32: float = 0
    mufu: float = 0
    load_use_gaps: tuple = ()
    shuffles: float = 0  # SHFL: one shared-memory pass each
    critical_cycles: float = 0
    critical_warps: int = 0
    dram_rounds: float = 0  # critical-path cycles per cycle of global-load latency (streaming loops)

    def pipes(self, warps: float, v100: dict) -> dict[str, float]:
        """Cycles of one sub-partition while ``warps`` warps each run one iteration."""
        return {
            "tensor": warps
            * (self.hmma_f32_steps * v100["mma884_clocks"] / 4 + self.hmma_f16_steps * v100["mma884_clocks"] / 2),
            "issue": warps * self.instructions / v100["issue_per_clock_per_subpartition"],
            "shared_memory": warps
            * (self.shared_passes + self.shuffles)
            * SUBPARTITIONS
            / v100["shared_passes_per_clock_per_sm"],
            "fp32": warps * self.fp32 * 32 / v100["fp32_lanes_per_subpartition"],
            "mufu": warps * self.mufu * 32 / v100["mufu_lanes_per_subpartition"],
        }

    def sustained_pipes(self, warps: float, v100: dict) -> dict[str, float]:
        """``pipes`` with the tensor pipe at the rate ``warps`` warps sustain: one warp issues an
        mma no faster than every four_chain_mma884_issue_cycles, more warps fill the pipe's mma884_clocks."""
        pipes = self.pipes(warps, v100)
        lone = v100["four_chain_mma884_issue_cycles"] / (v100["mma884_clocks"] * warps) if warps else 1.0
        return {**pipes, "tensor": pipes["tensor"] * max(1.0, lone)}

    def exposed_latency(self, warps: float, v100: dict) -> float:
        """Cycles per iteration spent waiting on global loads that ``warps`` warps of a
        sub-partition cannot cover by issuing other instructions."""
        latency = v100["dependent_ldg_l2_hit_cycles"]
        return sum(max(0.0, latency - warps * gap) for gap in self.load_use_gaps)

    def iteration_cycles(self, warps: int, v100: dict) -> float:
        """One CTA's iteration with ``warps`` warps per sub-partition: the SASS-timed critical
        path where known for these warps, else the pipe time plus the exposed latency."""
        if self.critical_cycles and self.critical_warps == warps:
            return self.critical_cycles
        return max(self.sustained_pipes(warps, v100).values()) + self.exposed_latency(warps, v100)

    def once_cycles(self, warps: int, v100: dict) -> float:
        """The same code run once per CTA (an epilogue): timed where known, else its pipe time."""
        if self.critical_cycles and self.critical_warps == warps:
            return self.critical_cycles
        return max(self.sustained_pipes(warps, v100).values())


def shared_passes(accesses: list[dict]) -> tuple[float, float]:
    """(bank passes, bytes) of a loop's shared-memory accesses, each group given as
    {count, bytes_per_lane} (warp-wide accesses of one width) or {count, total_bytes[, narrow,
    narrow_bytes_per_lane]}: ``narrow`` of the accesses are 8- or 16-bit (one pass each), the rest
    32 bits or wider (one pass per 128 bytes)."""
    passes = total = 0.0
    for a in accesses:
        if "bytes_per_lane" in a:
            passes += a["count"] * access_passes(a["bytes_per_lane"])
            total += a["count"] * 32 * a["bytes_per_lane"]
        else:
            narrow = a.get("narrow", 0)
            narrow_bytes = narrow * 32 * a.get("narrow_bytes_per_lane", 0)
            passes += narrow + (a["total_bytes"] - narrow_bytes) / 128
            total += a["total_bytes"]
    return passes, total


def access_passes(bytes_per_lane: int) -> int:
    """Bank passes of one warp-wide shared access without bank conflicts: 32 lanes x width over
    32 banks of 4 bytes, at least one (a 16-bit access of 32 lanes still takes a pass)."""
    return max(1, 32 * bytes_per_lane // 128)


def mix_from_data(d: dict) -> LoopMix:
    """A LoopMix from anchors.toml: counts, shared accesses (``shared``, see ``shared_passes``),
    SHFL (``shuffles`` or ``shfl``), and where the kernel's SASS was timed, ``critical_cycles`` for
    ``critical_warps``."""
    passes, total = shared_passes(d.get("shared", []))
    return LoopMix(
        instructions=d.get("instructions", 0),
        hmma_f32_steps=d.get("hmma_f32_steps", 0),
        hmma_f16_steps=d.get("hmma_f16_steps", 0),
        shared_passes=passes + d.get("shared_passes", 0),
        shared_bytes=total,
        fp32=d.get("fp32", 0),
        mufu=d.get("mufu", 0),
        load_use_gaps=tuple(d.get("load_use_gaps", ())),
        shuffles=d.get("shuffles", d.get("shfl", 0)),
        critical_cycles=d.get("critical_cycles", 0),
        critical_warps=d.get("critical_warps", 0),
        dram_rounds=d.get("dram_rounds", 0),
    )
