"""report: a static V100 performance report of every SM70 kernel, read from the sm_70 cubin.

Per kernel: registers, spills, stack, static shared memory, theoretical occupancy. Per hot loop
(an outermost loop containing HMMA): the instruction mix of one iteration as it stands in the
SASS (static: inner loops count once) and a lower bound on its cycles per sub-partition: the
largest of the tensor pipe, the issue slots, shared-memory bandwidth, the FP32 and MUFU pipes,
with W warps per sub-partition sharing the SM. From it, an upper bound on tensor-pipe
utilization and on TFLOP/s at the boost clock. It is a bound, not a measurement.

``predict``: for a problem shape, an upper bound on the sm70-dense route's TFLOP/s (useful causal
FLOPs, attended pairs only) from the cycles of its kernel's hot loop. See ``predict`` for exactly
what that model includes and leaves out.
"""

import tomllib
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from . import sass, toolchain
from .bench import Shape, useful_flops
from .errors import EnvironmentProblem

CATEGORIES = {
    "HMMA": "hmma", "LDS": "lds", "STS": "sts", "LDG": "ldg", "STG": "stg", "MUFU": "mufu",
    "FADD": "fp32", "FMUL": "fp32", "FFMA": "fp32", "FMNMX": "fp32", "FSETP": "fp32", "FSEL": "fp32",
    "FCHK": "fp32", "FRND": "fp32", "F2F": "fp32",
    "BRA": "branch", "BSSY": "branch", "BSYNC": "branch", "BMOV": "branch", "EXIT": "branch",
    "JMP": "branch", "CALL": "branch", "RET": "branch", "BREAK": "branch",
    "BAR": "barrier", "WARPSYNC": "barrier", "SHFL": "shuffle",
}
# The sm70-dense route (work/flash-attn/csrc/flash_attn/fa2patch/sm70/: sm70_api.cpp dispatches a head
# dim d to the kernel for the smallest of these >= d; kernel_traits.h gives the tiles): query rows
# per CTA, keys per main-loop iteration, warps per CTA (one per 16 rows).
ROUTE_KERNEL = "flash_fwd_sm70_kernel<{}>"
ROUTE_HEAD_DIMS = (32, 64, 96, 128, 192, 256)
BLOCK_M, BLOCK_N, WARPS_PER_CTA = 64, 32, 4
WIDTH = {"8": 1, "U8": 1, "S8": 1, "16": 2, "U16": 2, "S16": 2, "64": 8, "128": 16}


def load_v100() -> dict:
    text = resources.files("fa2patch").joinpath("data/v100.toml").read_text()
    return {k: v["value"] for k, v in tomllib.loads(text).items()}


def access_bytes(op: str) -> int:
    """Bytes per thread of a load or store opcode (LDS.U.128 -> 16; no width suffix -> 4)."""
    return next((WIDTH[p] for p in op.split(".")[1:] if p in WIDTH), 4)


@dataclass
class LoopReport:
    start: int
    end: int
    instructions: int
    mix: dict
    shared_bytes: int           # per warp and iteration (loads and stores, all 32 lanes)
    global_bytes: int
    cycles: dict = field(default_factory=dict)  # per sub-partition and iteration, per bound
    binding: str = ""
    tensor_utilization_bound: float = 0.0
    tflops_bound: float = 0.0


def analyse_loop(loop: sass.Loop, v100: dict, warps_per_subpartition: int) -> LoopReport:
    mix = Counter(CATEGORIES.get(op.split(".")[0], "int_other") for op in loop.opcodes)
    shared = sum(32 * access_bytes(op) for op in loop.opcodes if op.split(".")[0] in ("LDS", "STS"))
    glob = sum(32 * access_bytes(op) for op in loop.opcodes if op.split(".")[0] in ("LDG", "STG"))
    w = warps_per_subpartition
    cycles = {
        "tensor": w * mix["hmma"] * v100["hmma884_step_clocks"],
        "issue": w * len(loop.instrs) / v100["issue_per_clock_per_subpartition"],
        # The SM's shared-memory bandwidth is shared by its sub-partitions.
        "shared_memory": w * shared * v100["subpartitions_per_sm"] / v100["shared_bytes_per_clock_per_sm"],
        "fp32": w * mix["fp32"] * 32 / v100["fp32_lanes_per_subpartition"],
        "mufu": w * mix["mufu"] * 32 / v100["mufu_lanes_per_subpartition"],
    }
    binding = max(cycles, key=cycles.get)
    util = cycles["tensor"] / cycles[binding] if cycles[binding] else 0.0
    peak = (v100["sm_count"] * v100["subpartitions_per_sm"] * 2 * v100["fma_per_mma884"]
            / (4 * v100["hmma884_step_clocks"]) * v100["boost_clock_mhz"] * 1e6 / 1e12)
    return LoopReport(loop.start, loop.end, len(loop.instrs), dict(sorted(mix.items())), shared, glob,
                      cycles, binding, util, util * peak)


def occupancy(registers: int, shared: int, threads: int, v100: dict) -> dict:
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
    return {"blocks_per_sm": blocks, "warps_per_sm": blocks * warps, "limited_by": min(limits, key=limits.get),
            "threads_per_block": threads, "shared_bytes": shared}


def report(artifact: Path, arch: str, launch: dict[str, tuple[int, int]]) -> list[dict]:
    """``launch`` maps a demangled-name glob to (threads per block, dynamic shared bytes)."""
    import fnmatch

    tool = toolchain.find_cuda12_binutil("cuobjdump")
    if tool is None:
        raise EnvironmentProblem(f"cuobjdump: not found\n  install: {toolchain.PIP_BUILD}")
    v100 = load_v100()
    res = {r.name: r for r in sass.parse_resource_usage(sass.cuobjdump(tool, ["--dump-resource-usage"], artifact))
           if r.arch == arch}
    functions = [f for f in sass.parse_sass(sass.cuobjdump(tool, ["-sass"], artifact)) if f.arch == arch]
    pretty = sass.demangle([f.name for f in functions])
    out = []
    for f in functions:
        r = res.get(f.name)
        threads, dynamic = next((v for pat, v in launch.items() if fnmatch.fnmatchcase(pretty[f.name], pat)),
                                (None, 0))
        occ = occupancy(r.registers, r.shared + dynamic, threads, v100) if r and threads else None
        w = max(1, occ["warps_per_sm"] // v100["subpartitions_per_sm"]) if occ else 1
        out.append({
            "kernel": pretty[f.name], "registers": r.registers if r else None, "stack": r.stack if r else None,
            "static_shared": r.shared if r else None, "dynamic_shared": dynamic, "local": r.local if r else None,
            "occupancy": occ, "warps_per_subpartition": w, "hmma_total": f.hmma,
            "hot_loops": [vars(analyse_loop(lp, v100, w)) for lp in f.hot_loops()],
        })
    return out


def key_blocks_per_cta(q: int, kv: int, causal: bool) -> list[int]:
    """Main-loop iterations (key blocks of BLOCK_N keys) of each CTA of one (batch, head), CTA m
    holding query rows m*BLOCK_M .. (m+1)*BLOCK_M-1, as the kernel's n_block_max gives them:
    ceil(kv / BLOCK_N) blocks, with the bottom-right causal mask no more than
    ceil(((m+1)*BLOCK_M + kv - q) / BLOCK_N) (a partial last CTA counts as BLOCK_M rows there,
    as in the kernel), and none when that is <= 0."""
    blocks = -(-kv // BLOCK_N)
    return [max(0, min(blocks, -(-((m + 1) * BLOCK_M + kv - q) // BLOCK_N)) if causal else blocks)
            for m in range(-(-q // BLOCK_M))]


def predict(shape: Shape, kernels: list[dict], v100: dict, artifact: Path) -> dict:
    """A lower bound on the sm70-dense route's time for ``shape`` on V100 at the boost clock, and
    the upper bound on TFLOP/s it implies (useful FLOPs: attended pairs only). ``kernels``: the
    rows of ``report``; the route's kernel for ``shape.d`` must be among them.

    Included: every CTA of the grid (ceil(q/BLOCK_M) x hq) runs ``key_blocks_per_cta`` iterations
    of its kernel's hot loop (the one with the most HMMA; among equals, the cheapest: the kernel
    runs each KV block through one of two loop bodies, unmasked or masked, and every block costs
    at least the cheaper one) in each of its WARPS_PER_CTA warps; one
    warp-iteration costs c cycles of its sub-partition, c being the largest per-resource bound of
    the hot loop for one warp per sub-partition (the report's bound divided by its W). These
    bounds are throughputs, so warps sharing a sub-partition add up and occupancy does not change
    them. The time is at least the larger of
      - throughput: warp-iterations x c / (sm_count x subpartitions_per_sm), all SMs busy all along;
      - CTA granularity (waves): a CTA runs on one SM, so for every k some SM runs k+1 of the
        k*sm_count+1 longest CTAs, at least (k+1) x (their shortest iterations) x c; k=0 is the
        longest CTA.
    It assumes one split (num_splits = 1; a split-KV launch and its combine kernel are not modelled).
    Left out, each of which only adds time: the prologue and epilogue (Q load, O and LSE
    stores, CTAs with no visible key), latencies and stalls, synchronization, HBM bandwidth, the
    clock falling below boost, and inner loops of the hot loop beyond their one static count.
    """
    dpad = next((h for h in ROUTE_HEAD_DIMS if h >= shape.d), None)
    if dpad is None or shape.d % 8:
        raise EnvironmentProblem(f"--shapes: d={shape.d}: the sm70-dense route takes head dims that "
                                 f"are multiples of 8 up to {ROUTE_HEAD_DIMS[-1]}")
    name = ROUTE_KERNEL.format(dpad)
    kernel = next((k for k in kernels if name in k["kernel"]), None)
    if kernel is None:
        raise EnvironmentProblem(f"{artifact}: no kernel {name}, the sm70-dense route's kernel for "
                                 f"d={shape.d}; its SM70 kernels: "
                                 f"{', '.join(k['kernel'] for k in kernels) or 'none'}")
    if not kernel["hot_loops"]:
        raise EnvironmentProblem(f"{artifact}: kernel {name} has no hot loop (no loop with HMMA)")
    most = max(lp["mix"].get("hmma", 0) for lp in kernel["hot_loops"])
    loop = min((lp for lp in kernel["hot_loops"] if lp["mix"].get("hmma", 0) == most),
               key=lambda lp: max(lp["cycles"].values()))
    per_warp = {b: c / kernel["warps_per_subpartition"] for b, c in loop["cycles"].items()}
    binding = max(per_warp, key=per_warp.get)
    c = per_warp[binding]
    ctas = sorted(key_blocks_per_cta(shape.q, shape.kv, shape.causal) * shape.hq, reverse=True)
    sms = v100["sm_count"]
    bounds = {
        "throughput": WARPS_PER_CTA * sum(ctas) * c / (sms * v100["subpartitions_per_sm"]),
        "cta_granularity": max(((k + 1) * ctas[k * sms] * c for k in range(-(-len(ctas) // sms))),
                               default=0.0),
    }
    limit = max(bounds, key=bounds.get)
    seconds = bounds[limit] / (v100["boost_clock_mhz"] * 1e6)
    flops = useful_flops(shape)
    return {"label": shape.label, "kernel": name, "ctas": len(ctas), "warp_iterations": WARPS_PER_CTA * sum(ctas),
            "binding": binding, "cycles_per_warp_iteration": c, "bounds": bounds, "limited_by": limit,
            "cycles": bounds[limit], "useful_flops": flops, "ms_lower_bound": seconds * 1e3,
            "tflops_upper_bound": flops / seconds / 1e12 if seconds else None}
