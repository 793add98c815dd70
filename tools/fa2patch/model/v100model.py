# SPDX-License-Identifier: BSD-3-Clause
"""The V100 cycle model behind `fa2patch report`.

A route's time is the sum of its kernel launches' times. One launch (``KernelLaunch``) is a grid
of CTAs in launch order, each running some iterations of one hot loop (``LoopMix``: what one warp
issues per iteration), plus a prologue and an epilogue, and moving some bytes through HBM. A kernel
whose blockIdx picks one of several tiles has CTAs of several kinds (``CtaKind``, in
``KernelLaunch.more``), each with its own loop, prologue and epilogue.
``estimate_launch`` turns that into time on a ``Card`` (SM count, clock):

- pipes: per iteration, W warps of a sub-partition need W x (tensor: 2 clocks per
  HMMA.884.F32 step, 4 per HMMA.884.F16 step; issue: 1 instruction per clock; shared memory:
  4 sub-partitions share one 128-byte bank pass per clock, counted in passes, not bytes, SHFL
  one pass each; FP32: 16 lanes; MUFU: 4 lanes). The largest of these is the pipe time P;
- one CTA's iteration C: where the loop's SASS is known, the time of its warps run in phase
  (phases.lockstep_cycles: serial phases, dependency chains, loads waited for); otherwise P plus
  the exposed latency of the global-load rounds the iteration waits for;
- k CTAs per SM advance one iteration each in max(P of all their warps, C): only other CTAs
  fill a CTA's serial phase and waits;
- per CTA: the code outside its loop (prologue and epilogue, timed like C where known) runs
  once, added to the CTA's time (at 1 CTA per SM nothing overlaps it);
- the grid: CTAs are dispatched in launch order to SM slots (sms x ctas_per_sm) as slots free;
  the launch's compute time is the last slot's finish time (wave quantization and the causal
  tail included);
- the clock: a 300 W V100 holds its boost clock while its tensor pipes are busy at most
  ``duty_at_boost`` of the time and about 1,267 MHz at ``duty_at_power_cap``; in between the
  model interpolates (``clock_for_duty``); a locked lower clock caps it;
- HBM: the launch takes at least hbm_bytes / bandwidth; a launch that streams its bytes from DRAM
  (``KernelLaunch.streams``: decode) is timed with its loads waiting the DRAM latency and blends its
  compute time with the sustained ceiling's (memory.py).

``Calibration`` carries the fitted parameters (calibration.py fits them to published V100
measurements of open SM70 kernels, data/anchors.toml): the model's own time is estimate_launch
with ``Calibration()``. Parameters and their sources are in data/v100.toml; docs/report-model.md
describes the model, its anchors and its limits.
"""

import heapq
import math
import tomllib
from dataclasses import dataclass, field
from importlib import resources

from fa2patch.model import memory
from fa2patch.model.loop_mix import SUBPARTITIONS, LoopMix


def load_data(name: str) -> dict:
    return tomllib.loads(resources.files("fa2patch").joinpath(f"data/{name}").read_text())


def load_v100() -> dict:
    """V100 parameters (data/v100.toml): {name: value}."""
    return {k: v["value"] for k, v in load_data("v100.toml").items()}


@dataclass(frozen=True)
class Card:
    """A V100: its SM count, its boost (or locked) clock and its DRAM peak (GB/s; None: the
    whitepaper's, v100.toml). A kernel runs at the lower of that clock and what the 300 W cap
    allows at its tensor duty (``clock_for_duty``)."""

    sms: int = 80
    clock_mhz: float = 1530.0
    dram_gbs: float | None = None

    def dram_peak(self, v100: dict) -> float:
        return self.dram_gbs or v100["hbm_bandwidth_gbs"]

    def clock_at(self, duty: float, v100: dict) -> float:
        return min(self.clock_mhz, clock_for_duty(duty, v100))


def clock_for_duty(duty: float, v100: dict) -> float:
    """The clock a 300 W V100 holds while its tensor pipes are busy ``duty`` of the time: the
    boost clock up to ``duty_at_boost`` (split-D-class kernels scale with the clock), the
    power-capped clock from ``duty_at_power_cap`` (cuBLAS-class GEMMs), linear in between."""
    lo, hi = v100["duty_at_boost"], v100["duty_at_power_cap"]
    boost, capped = v100["boost_clock_mhz"], v100["sustained_tensor_clock_mhz"]
    x = min(1.0, max(0.0, (duty - lo) / (hi - lo)))
    return boost + (capped - boost) * x


@dataclass(frozen=True)
class Calibration:
    """Fitted parameters (calibration.py): ``cycle_factor`` multiplies every modelled cycle of a
    CTA (its iterations and its code outside the loop), ``cta_cycles`` adds cycles to every CTA
    of a fused attention kernel (an FA2-style grid: one CTA per query tile over its keys). The
    defaults are the model itself."""

    cycle_factor: float = 1.0
    cta_cycles: float = 0.0
    dram_latency_ns: float | None = None  # what a streaming launch's loads wait (None: memory.latency_ns)


def extra_latency(cal: Calibration, card: Card, v100: dict) -> float:
    """Cycles a streaming loop's load waits beyond the L2 hit it was timed with: the DRAM latency
    (``cal``'s, else the measured one) at the card's clock."""
    ns = cal.dram_latency_ns or memory.latency_ns()
    return ns * card.clock_mhz / 1e3 - v100["dependent_ldg_l2_hit_cycles"]


@dataclass(frozen=True)
class CtaKind:
    """CTAs of one kind: ``iterations`` of ``loop`` each (in launch order), ``epilogue`` issued by
    each warp once per CTA, ``prologue_load_rounds`` waited for before the first iteration."""

    loop: LoopMix
    iterations: tuple
    epilogue: LoopMix = field(default_factory=LoopMix)
    prologue_load_rounds: int = 1


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch. ``iterations``: hot-loop iterations of each CTA, in launch order
    (blockIdx.x fastest). ``epilogue``: what each warp issues once per CTA after its hot loop.
    ``prologue_load_rounds``: global-load rounds each CTA waits for before its first iteration.
    ``hbm_bytes``: DRAM traffic of the whole launch. ``more``: CTAs of other kinds that follow in
    the same grid (one kernel whose blockIdx picks the kind of tile it runs)."""

    name: str
    loop: LoopMix
    iterations: tuple
    warps_per_cta: int
    ctas_per_sm: int
    epilogue: LoopMix = field(default_factory=LoopMix)
    prologue_load_rounds: int = 1
    hbm_bytes: float = 0.0
    more: tuple = ()
    fused: bool = False  # an FA2-style grid (Calibration.cta_cycles applies)
    streams: bool = False  # reads its bytes from DRAM once (decode): memory.py's limits apply

    def kinds(self) -> list[CtaKind]:
        return [CtaKind(self.loop, self.iterations, self.epilogue, self.prologue_load_rounds), *self.more]


def occupancy(registers: int, shared: int, threads: int, v100: dict) -> dict:
    """CTAs per SM of a kernel with ``registers`` per thread, ``shared`` bytes per CTA (static and
    dynamic) and ``threads`` per CTA: the fewest that registers, shared memory, warps and the CTA
    limit allow, and which of them binds."""
    warps = -(-threads // 32)
    unit = v100["register_alloc_unit_per_warp"]
    regs_per_warp = -(-registers * 32 // unit) * unit
    limits = {
        "registers": v100["registers_per_sm"] // (regs_per_warp * warps) if registers else v100["max_blocks_per_sm"],
        "shared_memory": v100["shared_memory_per_sm"] // shared if shared else v100["max_blocks_per_sm"],
        "warps": v100["max_warps_per_sm"] // warps,
        "blocks": v100["max_blocks_per_sm"],
    }
    blocks = min(limits.values())
    return {
        "blocks_per_sm": blocks,
        "warps_per_sm": blocks * warps,
        "limited_by": min(limits, key=limits.__getitem__),
        "threads_per_block": threads,
        "shared_bytes": shared,
    }


def resident(launch: KernelLaunch, card: Card) -> int:
    """CTAs per SM that share its pipes: the launch's occupancy, or fewer where the grid does not
    fill it (a small grid spreads over the SMs)."""
    ctas = sum(len(kind.iterations) for kind in launch.kinds())
    return max(1, min(launch.ctas_per_sm, -(-ctas // card.sms)))


def binding(cycles: dict[str, float]) -> str:
    return max(cycles, key=cycles.__getitem__)


def makespan(durations, slots: int) -> float:
    """Finish time of the last CTA when CTAs start in order on the first free of ``slots``."""
    durations = list(durations)
    if durations and min(durations) == max(durations):  # equal CTAs: whole waves
        return -(-len(durations) // slots) * durations[0]
    free = [0.0] * slots
    for d in durations:
        heapq.heapreplace(free, free[0] + d)
    return max(free)


def estimate_launch(
    launch: KernelLaunch, card: Card, v100: dict, cal: Calibration = Calibration(), clock_mhz: float | None = None
) -> dict:
    """The time of one launch on ``card`` (see the module docstring), with the fitted parameters
    ``cal`` (the defaults: the model itself), at ``clock_mhz`` or else at the clock its own tensor
    duty allows. The details of the first kind of CTA are at the top level; ``kinds`` has each
    kind's."""
    k = launch.ctas_per_sm
    w_cta = math.ceil(launch.warps_per_cta / SUBPARTITIONS)  # warps of one CTA per scheduler
    extra = cal.cta_cycles if launch.fused else 0.0
    wait = extra_latency(cal, card, v100) if launch.streams else 0.0
    kinds, durations, tensor = [], [], 0.0
    for kind in launch.kinds():
        pipes = kind.loop.sustained_pipes(w_cta, v100)
        pipe = max(kind.loop.sustained_pipes(resident(launch, card) * w_cta, v100).values())  # resident CTAs' warps
        exposed = kind.loop.exposed_latency(w_cta, v100)
        critical = kind.loop.iteration_cycles(w_cta, v100) + kind.loop.dram_rounds * wait
        round_cycles = cal.cycle_factor * max(pipe, critical)  # every resident CTA, one iteration
        epilogue = kind.epilogue.once_cycles(w_cta, v100) + kind.epilogue.dram_rounds * wait
        fixed = cal.cycle_factor * (kind.prologue_load_rounds * v100["dependent_ldg_l2_hit_cycles"] + epilogue) + extra
        kinds.append(
            {
                "ctas": len(kind.iterations),
                "cta_iterations": sum(kind.iterations),
                "pipes_per_cta_iteration": pipes,
                "binding": binding(pipes),
                "exposed_latency": exposed,
                "critical_cycles": critical,
                "round_cycles": round_cycles,
                "fixed_cycles_per_cta": fixed,
            }
        )
        durations += [fixed + n * round_cycles for n in kind.iterations]
        tensor += kind.loop.pipes(w_cta, v100)["tensor"] * sum(kind.iterations)  # busy at the pipe's rate
    compute = makespan(durations, card.sms * k)
    duty = tensor / (compute * card.sms) if compute else 0.0
    clock = (clock_mhz or card.clock_at(duty, v100)) * 1e6
    hbm = hbm_seconds(launch, card, v100)
    seconds = launch_seconds(compute / clock, hbm, launch.streams)
    first = kinds[0]
    return {
        "name": launch.name,
        "ctas": len(durations),
        "cta_iterations": sum(x["cta_iterations"] for x in kinds),
        "ctas_per_sm": k,
        "warps_per_subpartition": k * w_cta,
        **{
            x: first[x]
            for x in (
                "pipes_per_cta_iteration",
                "binding",
                "exposed_latency",
                "critical_cycles",
                "round_cycles",
                "fixed_cycles_per_cta",
            )
        },
        "kinds": kinds,
        "compute_cycles": compute,
        "tensor_cycles": tensor / card.sms,
        "tensor_duty": duty,
        "clock_mhz": clock / 1e6,
        "hbm_ms": hbm * 1e3,
        "limited_by": "hbm" if hbm > compute / clock else "compute",
        "streams": launch.streams,
        "ms": seconds * 1e3,
    }


def hbm_seconds(launch: KernelLaunch, card: Card, v100: dict) -> float:
    """The launch's bytes at the card's DRAM peak, or for a streaming launch at the sustained
    ceiling (memory.ceiling_fraction of the peak)."""
    rate = card.dram_peak(v100) * (memory.ceiling_fraction() if launch.streams else 1.0)
    return launch.hbm_bytes / (rate * 1e9)


def launch_seconds(compute_s: float, hbm_s: float, streams: bool) -> float:
    """A launch's time from its compute and HBM times: the larger, or for a streaming launch their
    soft maximum (memory.blend)."""
    return memory.blend(compute_s, hbm_s, memory.exponent()) if streams else max(compute_s, hbm_s)


def estimate_route(
    launches: list[KernelLaunch],
    card: Card,
    v100: dict,
    cal: Calibration = Calibration(),
    clock_mhz: float | None = None,
) -> dict:
    """Launches run one after another at one clock: ``clock_mhz`` where it was measured (a user's
    anchor), else the one the route's tensor duty (tensor-busy over compute cycles, all launches
    together) allows; the 300 W cap acts on the power averaged over a call, whose launches
    alternate faster than that. {launches, duty, clock_mhz, ms}."""
    own = [estimate_launch(x, card, v100, cal) for x in launches]
    cycles = sum(x["compute_cycles"] for x in own)
    duty = sum(x["tensor_cycles"] for x in own) / cycles if cycles else 0.0
    clock = clock_mhz or card.clock_at(duty, v100)
    details = [at_clock(x, clock) for x in own]
    return {"launches": details, "tensor_duty": duty, "clock_mhz": clock, "ms": sum(x["ms"] for x in details)}


def route_timer(launches: list[KernelLaunch], card: Card, v100: dict, clock_mhz: float | None = None):
    """``estimate_route(launches, card, v100, cal, clock_mhz)["ms"]`` as a function of ``cal``,
    with everything that does not depend on it worked out once (a fit evaluates it hundreds of
    times). A launch without the per-CTA cost and the DRAM latency scales with the cycle factor as
    a whole: its schedule is the same at every factor."""
    parts = []
    for x in launches:
        k, w_cta = x.ctas_per_sm, math.ceil(x.warps_per_cta / SUBPARTITIONS)
        # per CTA: [pipe, critical, critical per cycle of DRAM wait] of its loop, its fixed cycles and their DRAM slope
        loops, fixed, tensor = [], [], 0.0
        for kind in x.kinds():
            pipe = max(kind.loop.sustained_pipes(resident(x, card) * w_cta, v100).values())
            loops += [(pipe, kind.loop.iteration_cycles(w_cta, v100), kind.loop.dram_rounds)] * len(kind.iterations)
            once = kind.prologue_load_rounds * v100["dependent_ldg_l2_hit_cycles"] + kind.epilogue.once_cycles(
                w_cta, v100
            )
            fixed += [(once, kind.epilogue.dram_rounds)] * len(kind.iterations)
            tensor += kind.loop.pipes(w_cta, v100)["tensor"] * sum(kind.iterations)
        its = [n for kind in x.kinds() for n in kind.iterations]
        slots = card.sms * k
        fixed_at = CtaCycles(loops, fixed, its, x.streams, x.fused)
        base = None if x.fused or x.streams else makespan(fixed_at(0.0, 1.0, 0.0), slots)
        parts.append((fixed_at, slots, base, tensor / card.sms, hbm_seconds(x, card, v100), x.streams))

    def ms(cal: Calibration = Calibration()) -> float:
        wait = extra_latency(cal, card, v100)
        computes = [
            cal.cycle_factor * base
            if base is not None
            else makespan(durations(wait, cal.cycle_factor, cal.cta_cycles), slots)
            for durations, slots, base, *_ in parts
        ]
        cycles = sum(computes)
        duty = sum(p[3] for p in parts) / cycles if cycles else 0.0
        clock = (clock_mhz or card.clock_at(duty, v100)) * 1e6
        return sum(launch_seconds(c / clock, p[4], p[5]) for c, p in zip(computes, parts, strict=True)) * 1e3

    return ms


@dataclass(frozen=True)
class CtaCycles:
    """Each CTA's cycles of one launch as a function of the DRAM wait (streaming launches only),
    the cycle factor and the per-CTA cost (fused launches only): route_timer's inner loop."""

    loops: list
    fixed: list
    its: list
    streams: bool
    fused: bool

    def __call__(self, wait: float, factor: float, cta: float) -> list[float]:
        wait = wait if self.streams else 0.0
        cta = cta if self.fused else 0.0
        return [
            factor * (once + slope_f * wait) + cta + n * factor * max(pipe, crit + slope * wait)
            for (pipe, crit, slope), (once, slope_f), n in zip(self.loops, self.fixed, self.its, strict=True)
        ]


def at_clock(estimate: dict, clock_mhz: float) -> dict:
    """A launch's estimate with its compute cycles at another clock (its cycles do not depend on it)."""
    compute_ms = estimate["compute_cycles"] / (clock_mhz * 1e3)
    return {
        **estimate,
        "clock_mhz": clock_mhz,
        "ms": launch_seconds(compute_ms, estimate["hbm_ms"], estimate.get("streams", False)),
        "limited_by": "hbm" if estimate["hbm_ms"] > compute_ms else "compute",
    }


def lower_bound(launch: KernelLaunch, card: Card, v100: dict) -> dict:
    """A bound, not an estimate: pipes only (no latency, prologue or epilogue) at the card's own
    clock; the larger of all SMs busy all along (throughput), whole CTAs per SM (for every j,
    some SM runs j+1 of the j*sms+1 longest CTAs), and HBM bytes at full bandwidth."""
    w_cta = math.ceil(launch.warps_per_cta / SUBPARTITIONS)
    longest = sorted(
        (n * max(kind.loop.pipes(w_cta, v100).values()) for kind in launch.kinds() for n in kind.iterations),
        reverse=True,
    )
    sms = card.sms
    cycles = {
        "throughput": sum(longest) / sms,
        "cta_granularity": max(((j + 1) * longest[j * sms] for j in range(-(-len(longest) // sms))), default=0.0),
    }
    seconds = {name: c / (card.clock_mhz * 1e6) for name, c in cycles.items()}
    seconds["hbm"] = launch.hbm_bytes / (card.dram_peak(v100) * 1e9)
    limit = binding(seconds)
    return {"cycles": cycles, "limited_by": limit, "ms": seconds[limit] * 1e3}


def peak_tflops(card: Card, clock_mhz: float, v100: dict) -> float:
    """FP16 tensor peak: one mma.m8n8k4 (fma_per_mma884 FMAs) per mma884_clocks per sub-partition."""
    return card.sms * SUBPARTITIONS * 2 * v100["fma_per_mma884"] / v100["mma884_clocks"] * clock_mhz * 1e6 / 1e12


# --- Workloads shared by the routes and the anchors --------------------------------------------


def fa2_grid_iterations(
    q: int, kv: int, causal: bool, rows_per_cta: int, keys_per_iteration: int, heads: int, batch: int = 1
) -> list[int]:
    """Hot-loop iterations of each CTA of an FA2-style forward grid (blockIdx.x = query block m,
    then batch, then head; every sequence q x kv): CTA m holds rows m*rows .. (m+1)*rows-1 and
    visits ceil(kv / keys) key blocks, with the bottom-right causal mask no more than
    ceil(((m+1)*rows + kv - q) / keys) (a partial last CTA counts as a whole one) and none when
    that is <= 0."""
    blocks = -(-kv // keys_per_iteration)
    per_head = [
        max(0, min(blocks, -(-((m + 1) * rows_per_cta + kv - q) // keys_per_iteration))) if causal else blocks
        for m in range(-(-q // rows_per_cta))
    ]
    return per_head * (batch * heads)


def gemm_launch(
    name: str,
    loop: LoopMix,
    tile: dict,
    m: int,
    n: int,
    k: int,
    hbm_bytes: float,
    epilogue: LoopMix = LoopMix(),
    prologue_load_rounds: int = 1,
) -> KernelLaunch:
    """A tiled GEMM (m x n x k): one CTA per tile_m x tile_n output tile, each iterating over k in
    steps of tile_k. ``tile``: tile_m, tile_n, tile_k, warps, ctas_per_sm."""
    ctas = -(-m // tile["tile_m"]) * -(-n // tile["tile_n"])
    return KernelLaunch(
        name,
        loop,
        (-(-k // tile["tile_k"]),) * ctas,
        tile["warps"],
        tile["ctas_per_sm"],
        epilogue,
        prologue_load_rounds,
        hbm_bytes,
    )
