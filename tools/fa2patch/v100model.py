"""The V100 cycle model behind `fa2patch report`, and its calibration.

A route's time is the sum of its kernel launches' times. One launch (``KernelLaunch``) is a grid
of CTAs in launch order, each running some iterations of one hot loop (``LoopMix``: what one warp
issues per iteration), plus a prologue and an epilogue, and moving some bytes through HBM. A kernel
whose blockIdx picks one of several tiles has CTAs of several kinds (``CtaKind``, in
``KernelLaunch.more``), each with its own loop, prologue and epilogue.
``estimate_launch`` turns that into time on a ``Card`` (SM count, clock):

- pipes: per iteration, W warps of a sub-partition need W x (tensor: 2 clocks per
  HMMA.884.F32 step, 4 per HMMA.884.F16 step; issue: 1 instruction per clock; shared memory:
  4 sub-partitions share one 128-byte bank pass per clock, counted in passes, not bytes; FP32:
  16 lanes; MUFU: 4 lanes). The largest of these is the iteration's pipe time;
- latency: each round of global loads that the loop does not issue ahead of its use costs
  max(0, L - W x the instructions between load and use) cycles, hidden only by other CTAs on
  the SM: k CTAs per SM advance one iteration each in max(k x pipe, pipe + exposed);
- per CTA: prologue load rounds (exposed latency) and the epilogue's pipe time, added to the
  CTA's time (at 1 CTA per SM nothing overlaps them);
- the grid: CTAs are dispatched in launch order to SM slots (sms x ctas_per_sm) as slots free;
  the launch's compute time is the last slot's finish time (wave quantization and the causal
  tail included);
- HBM: the launch takes at least hbm_bytes / bandwidth;
- the clock: under sustained tensor load a 300 W V100 holds about 1,267 MHz, whatever its boost.

``calibrate`` recomputes published V100 measurements of open SM70 kernels (data/anchors.toml)
with the current model and returns the one factor that best explains them all, with each
anchor's residual; a calibrated estimate is model x factor. Parameters and their sources are in
data/v100.toml; docs/report-model.md describes the model, its anchors and its limits.
"""

import heapq
import math
import tomllib
from dataclasses import dataclass, field
from importlib import resources

SUBPARTITIONS = 4


def load_data(name: str) -> dict:
    return tomllib.loads(resources.files("fa2patch").joinpath(f"data/{name}").read_text())


def load_v100() -> dict:
    """V100 parameters (data/v100.toml): {name: value}."""
    return {k: v["value"] for k, v in load_data("v100.toml").items()}


@dataclass(frozen=True)
class Card:
    """A V100: its SM count and its boost (or locked) clock. Under sustained tensor load the
    model runs it at min(clock, the power-capped sustained clock)."""
    sms: int = 80
    clock_mhz: float = 1530.0

    def sustained_mhz(self, v100: dict) -> float:
        return min(self.clock_mhz, v100["sustained_tensor_clock_mhz"])

    def label(self, v100: dict) -> str:
        return (f"{self.sms} SMs, {self.clock_mhz:g} MHz (modelled at {self.sustained_mhz(v100):g} MHz "
                f"sustained)")


@dataclass(frozen=True)
class LoopMix:
    """What one warp issues per iteration of a loop (dynamic counts: inner loops times their
    trip counts). ``load_use_gaps``: for each round of global loads whose results the same
    iteration uses, the warp's instructions between the round's first load and the first use."""
    instructions: float = 0
    hmma_f32_steps: float = 0       # HMMA.884.F32.*: 4 steps of 2 clocks per mma.m8n8k4
    hmma_f16_steps: float = 0       # HMMA.884.F16.*: 2 steps of 4 clocks per mma.m8n8k4
    shared_passes: float = 0        # bank passes (wavefronts) of LDS/STS
    shared_bytes: float = 0         # all lanes; for the report (passes bind)
    fp32: float = 0
    mufu: float = 0
    load_use_gaps: tuple = ()

    def pipes(self, warps: float, v100: dict) -> dict[str, float]:
        """Cycles of one sub-partition while ``warps`` warps each run one iteration."""
        return {
            "tensor": warps * (self.hmma_f32_steps * v100["mma884_clocks"] / 4
                               + self.hmma_f16_steps * v100["mma884_clocks"] / 2),
            "issue": warps * self.instructions / v100["issue_per_clock_per_subpartition"],
            "shared_memory": warps * self.shared_passes * SUBPARTITIONS / v100["shared_passes_per_clock_per_sm"],
            "fp32": warps * self.fp32 * 32 / v100["fp32_lanes_per_subpartition"],
            "mufu": warps * self.mufu * 32 / v100["mufu_lanes_per_subpartition"],
        }

    def exposed_latency(self, warps: float, v100: dict) -> float:
        """Cycles per iteration spent waiting on global loads that ``warps`` warps of a
        sub-partition cannot cover by issuing other instructions."""
        latency = v100["global_load_latency_cycles"]
        return sum(max(0.0, latency - warps * gap) for gap in self.load_use_gaps)


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

    def kinds(self) -> list[CtaKind]:
        return [CtaKind(self.loop, self.iterations, self.epilogue, self.prologue_load_rounds), *self.more]


def binding(cycles: dict[str, float]) -> str:
    return max(cycles, key=cycles.get)


def makespan(durations, slots: int) -> float:
    """Finish time of the last CTA when CTAs start in order on the first free of ``slots``."""
    free = [0.0] * slots
    for d in durations:
        heapq.heapreplace(free, free[0] + d)
    return max(free)


def estimate_launch(launch: KernelLaunch, card: Card, v100: dict) -> dict:
    """The model's time for one launch on ``card`` (see the module docstring). The details of the
    first kind of CTA are at the top level; ``kinds`` has each kind's."""
    k = launch.ctas_per_sm
    w_cta = math.ceil(launch.warps_per_cta / SUBPARTITIONS)       # warps of one CTA per scheduler
    kinds, durations = [], []
    for kind in launch.kinds():
        pipes = kind.loop.pipes(w_cta, v100)
        pipe = max(pipes.values())
        exposed = kind.loop.exposed_latency(w_cta, v100)   # other CTAs fill it: round_cycles
        round_cycles = max(k * pipe, pipe + exposed)                  # every resident CTA, one iteration
        epilogue = max(kind.epilogue.pipes(w_cta, v100).values())
        fixed = kind.prologue_load_rounds * v100["global_load_latency_cycles"] + epilogue
        kinds.append({"ctas": len(kind.iterations), "cta_iterations": sum(kind.iterations),
                      "pipes_per_cta_iteration": pipes, "binding": binding(pipes), "exposed_latency": exposed,
                      "round_cycles": round_cycles, "fixed_cycles_per_cta": fixed})
        durations += [fixed + n * round_cycles for n in kind.iterations]
    clock = card.sustained_mhz(v100) * 1e6
    compute = makespan(durations, card.sms * k)
    hbm = launch.hbm_bytes / (v100["hbm_bandwidth_gbs"] * 1e9)
    seconds = max(compute / clock, hbm)
    first = kinds[0]
    return {"name": launch.name, "ctas": len(durations), "cta_iterations": sum(x["cta_iterations"] for x in kinds),
            "ctas_per_sm": k, "warps_per_subpartition": k * w_cta, **{x: first[x] for x in (
                "pipes_per_cta_iteration", "binding", "exposed_latency", "round_cycles", "fixed_cycles_per_cta")},
            "kinds": kinds, "compute_cycles": compute, "clock_mhz": clock / 1e6,
            "hbm_ms": hbm * 1e3, "limited_by": "hbm" if hbm > compute / clock else "compute",
            "ms": seconds * 1e3}


def lower_bound(launch: KernelLaunch, card: Card, v100: dict) -> dict:
    """A bound, not an estimate: pipes only (no latency, prologue or epilogue) at the card's own
    clock; the larger of all SMs busy all along (throughput), whole CTAs per SM (for every j,
    some SM runs j+1 of the j*sms+1 longest CTAs), and HBM bytes at full bandwidth."""
    w_cta = math.ceil(launch.warps_per_cta / SUBPARTITIONS)
    longest = sorted((n * max(kind.loop.pipes(w_cta, v100).values())
                      for kind in launch.kinds() for n in kind.iterations), reverse=True)
    sms = card.sms
    cycles = {
        "throughput": sum(longest) / sms,
        "cta_granularity": max(((j + 1) * longest[j * sms] for j in range(-(-len(longest) // sms))), default=0.0),
    }
    seconds = {name: c / (card.clock_mhz * 1e6) for name, c in cycles.items()}
    seconds["hbm"] = launch.hbm_bytes / (v100["hbm_bandwidth_gbs"] * 1e9)
    limit = binding(seconds)
    return {"cycles": cycles, "limited_by": limit, "ms": seconds[limit] * 1e3}


def peak_tflops(card: Card, clock_mhz: float, v100: dict) -> float:
    """FP16 tensor peak: one mma.m8n8k4 (fma_per_mma884 FMAs) per mma884_clocks per sub-partition."""
    return (card.sms * SUBPARTITIONS * 2 * v100["fma_per_mma884"] / v100["mma884_clocks"]
            * clock_mhz * 1e6 / 1e12)


# --- Workloads shared by the routes and the anchors --------------------------------------------

def fa2_grid_iterations(q: int, kv: int, causal: bool, rows_per_cta: int, keys_per_iteration: int,
                        heads: int, batch: int = 1) -> list[int]:
    """Hot-loop iterations of each CTA of an FA2-style forward grid (blockIdx.x = query block m,
    then batch, then head; every sequence q x kv): CTA m holds rows m*rows .. (m+1)*rows-1 and
    visits ceil(kv / keys) key blocks, with the bottom-right causal mask no more than
    ceil(((m+1)*rows + kv - q) / keys) (a partial last CTA counts as a whole one) and none when
    that is <= 0."""
    blocks = -(-kv // keys_per_iteration)
    per_head = [max(0, min(blocks, -(-((m + 1) * rows_per_cta + kv - q) // keys_per_iteration)))
                if causal else blocks for m in range(-(-q // rows_per_cta))]
    return per_head * (batch * heads)


def gemm_launch(name: str, loop: LoopMix, tile: dict, m: int, n: int, k: int, hbm_bytes: float,
                epilogue: LoopMix = LoopMix(), prologue_load_rounds: int = 1) -> KernelLaunch:
    """A tiled GEMM (m x n x k): one CTA per tile_m x tile_n output tile, each iterating over k in
    steps of tile_k. ``tile``: tile_m, tile_n, tile_k, warps, ctas_per_sm."""
    ctas = -(-m // tile["tile_m"]) * -(-n // tile["tile_n"])
    return KernelLaunch(name, loop, (-(-k // tile["tile_k"]),) * ctas, tile["warps"], tile["ctas_per_sm"],
                        epilogue, prologue_load_rounds, hbm_bytes)


# --- Calibration ------------------------------------------------------------------------------

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
    passes, total = shared_passes(d.get("shared", []))
    return LoopMix(instructions=d.get("instructions", 0), hmma_f32_steps=d.get("hmma_f32_steps", 0),
                   hmma_f16_steps=d.get("hmma_f16_steps", 0), shared_passes=passes, shared_bytes=total,
                   fp32=d.get("fp32", 0), mufu=d.get("mufu", 0), load_use_gaps=tuple(d.get("load_use_gaps", ())))


def anchor_launches(anchor: dict, kernels: dict) -> list[KernelLaunch]:
    """The launches an anchor's measurement covers, rebuilt from its recorded workload."""
    work = anchor["workload"]
    kernel = kernels[anchor["kernel"]] if "kernel" in anchor else None
    if work["kind"] == "fa2-forward":
        its = fa2_grid_iterations(work["q"], work["kv"], work["causal"], kernel["rows_per_cta"],
                                  kernel["keys_per_iteration"], work["hq"])
        return [KernelLaunch(anchor["kernel"], mix_from_data(kernel["loop"]), tuple(its), kernel["warps"],
                             kernel["ctas_per_sm"], prologue_load_rounds=kernel["prologue_load_rounds"])]
    if work["kind"] == "kv-blocked-gemms":
        qk, pv = kernels[work["qk_kernel"]], kernels[work["pv_kernel"]]
        rows, d = work["q"] * work["hq"] // work["hkv"], work["d"]
        launches = []
        prefix = work["kv"] - work["q"]
        for start in range(0, prefix, work["block_keys"]):
            n = min(work["block_keys"], prefix - start)
            scores = rows * n * 2
            launches.append(gemm_launch(work["qk_kernel"], mix_from_data(qk["loop"]), qk, rows, n, d,
                                        scores + rows * d * 2 + n * d * 2, mix_from_data(qk.get("epilogue", {}))))
            launches.append(gemm_launch(work["pv_kernel"], mix_from_data(pv["loop"]), pv, rows, d, n,
                                        scores + n * d * 2))
        return launches
    raise ValueError(f"anchor {anchor['name']}: unknown workload kind {work['kind']!r}")


def anchor_card(anchor: dict) -> Card:
    return Card(anchor["card"]["sms"], anchor["card"]["clock_mhz"])


def anchor_measured_ms(anchor: dict, kernels: dict) -> float:
    """The measured time of what the model covers: recorded in ms (less ``excluded_ms``, a part
    measured separately), or as a multiple of the bound the measurement was published against
    (``ratio_to_bound``: warp-iterations x bound cycles / (sms x 4) at the bound's clock; a
    [low, high] range counts as its middle)."""
    if "measured_ms" in anchor:
        return anchor["measured_ms"] - anchor.get("excluded_ms", 0.0)
    ref = anchor["ratio_to_bound"]
    (launch,) = anchor_launches(anchor, kernels)
    warp_iterations = sum(launch.iterations) * launch.warps_per_cta
    bound_ms = (warp_iterations * ref["bound_cycles_per_warp_iteration"]
                / (anchor_card(anchor).sms * SUBPARTITIONS) / (ref["bound_clock_mhz"] * 1e6) * 1e3)
    ratio = ref["ratio"]
    return bound_ms * (sum(ratio) / 2 if isinstance(ratio, list) else ratio)


def evaluate_anchor(anchor: dict, kernels: dict, v100: dict) -> dict:
    """Measured and modelled value of one anchor and their ratio (> 1: slower than the model). A
    rate anchor compares TFLOP/s with the modelled tensor peak at the sustained clock."""
    card = anchor_card(anchor)
    row = {"name": anchor["name"], "source": anchor["source"]}
    if anchor["workload"]["kind"] == "tensor-peak":
        model = peak_tflops(card, card.sustained_mhz(v100), v100)
        return {**row, "unit": "TFLOP/s", "measured": anchor["measured_tflops"], "model": model,
                "ratio": model / anchor["measured_tflops"]}
    measured = anchor_measured_ms(anchor, kernels)
    model = sum(estimate_launch(x, card, v100)["ms"] for x in anchor_launches(anchor, kernels))
    return {**row, "unit": "ms", "measured": measured, "model": model, "ratio": measured / model}


def calibrate(v100: dict | None = None, data: dict | None = None) -> dict:
    """Recompute every anchor with the current model; the factor is the geometric middle of the
    smallest and largest ratio (it minimises the largest residual); residual = ratio / factor - 1.
    A calibrated estimate is the model's time x factor."""
    v100 = v100 or load_v100()
    data = data or load_data("anchors.toml")
    kernels = {k["name"]: k for k in data["kernel"]}
    rows = [evaluate_anchor(a, kernels, v100) for a in data["anchor"]]
    ratios = [r["ratio"] for r in rows]
    factor = math.sqrt(min(ratios) * max(ratios))
    for r in rows:
        r["residual"] = r["ratio"] / factor - 1
    residuals = [r["residual"] for r in rows]
    return {"factor": factor, "tolerance": data["tolerance"], "anchors": rows,
            "residual_range": [min(residuals), max(residuals)],
            "within_tolerance": all(abs(x) <= data["tolerance"] for x in residuals)}
