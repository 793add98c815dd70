"""report: a static V100 performance report of the SM70 kernels, read from the sm_70 cubin.

Per kernel: registers, stack and local-memory bytes (``cuobjdump --dump-resource-usage``; spill
counts are `verify`'s), static and dynamic shared memory, and occupancy from the launch
configuration that the extension's ``build_info()`` declares (or ``--launch``). Per hot loop (an
outermost loop with HMMA): the mix of one warp-iteration and its cycles per sub-partition at
that occupancy (v100model: tensor pipe by HMMA step form, issue slots, shared-memory bank
passes, FP32, MUFU), the binding resource, the implied tensor-utilization and TFLOP/s ceilings,
and the rounds of global loads the iteration waits for (``load_use_gaps``). Each instruction of
the loop counts once, both sides of a branch (the forward kernels' hot loops hold no inner loop; the
few that other loops hold, whose trip counts the SASS does not say, count once too: the long-prefill
qk loop's page step, the split-KV combine's loops over the splits).

``predict_routes`` (``report --shapes``): per problem shape, the sm70-dense route and, where its
op takes the shape, the sm70-gqa-prefill route (``gqa_launches``: one launch per KV step whose
grid holds the pv tiles of one block and the qk tiles of the next; docs/report-model.md).
``predict``: the sm70-dense route's launches on a card
(``Card``: 80 or 72 SMs, a clock): the forward kernel for the head dim with its grid from
build_info()'s geometry (``route``, ``head_dim``, ``rows_per_cta``, ``keys_per_iteration``,
``warps``: never restated here), split-KV and the combine kernel for decode as FA2's host code
decides them; per shape a lower bound (pipes only, at the card's clock), the model's time and
the calibrated estimate = model x factor, the factor recomputed from the anchors on every run
(v100model.calibrate).

Estimating another route: a route's time is the sum of its kernel launches. Build one
``v100model.KernelLaunch`` per launch: its hot-loop mix (``LoopMix(**loop["model_mix"])`` of a
hot loop in ``kernel_rows``, or a ``LoopMix`` written by hand), the hot-loop iterations of each
CTA in launch order (``v100model.gemm_launch`` for a tiled GEMM, ``fa2_grid_iterations`` for an
FA2-style grid), warps per CTA, CTAs per SM (a row's occupancy), an epilogue mix per warp and
CTA, prologue load rounds and the launch's HBM bytes. Then ``route_estimate(launches, card, v100,
calibrate(v100))`` gives the bound, the model and the calibrated time with each launch's
details. docs/report-model.md describes the model.
"""

from collections import Counter
from dataclasses import replace
from pathlib import Path

from . import phases, routes, sass, toolchain
from .shapes import Shape, useful_flops
from .tables import table
from .errors import EnvironmentProblem
from .extension import launches_of, load_build_info
from .calibration import faster_if_separated, header_text, range_text, with_range
from .exact_route import (COMBINE_KERNEL, cheapest_hot_loop, combine_row,  # noqa: F401
                          dense_launches, dense_plan, fa2_num_splits, splitkv_launches)
from .v100model import (Calibration, Card, CtaKind, KernelLaunch, LoopMix, access_passes, binding, calibrate,
                        estimate_route, load_v100, lower_bound, peak_tflops)

GEOMETRY = ("head_dim", "rows_per_cta", "keys_per_iteration", "warps")
GQA_BLOCK_PLAN = ("min_block_keys", "max_block_keys", "score_budget_bytes")
CATEGORIES = {
    "HMMA": "hmma", "LDS": "lds", "STS": "sts", "LDG": "ldg", "STG": "stg", "MUFU": "mufu",
    "FADD": "fp32", "FMUL": "fp32", "FFMA": "fp32", "FMNMX": "fp32", "FSETP": "fp32", "FSEL": "fp32",
    "FCHK": "fp32", "FRND": "fp32", "F2F": "fp32",
    "BRA": "branch", "BSSY": "branch", "BSYNC": "branch", "BMOV": "branch", "EXIT": "branch",
    "JMP": "branch", "CALL": "branch", "RET": "branch", "BREAK": "branch",
    "BAR": "barrier", "WARPSYNC": "barrier", "SHFL": "shuffle",
    # FP16x2 arithmetic (HADD2.F32 is also how sm_70 converts fp16 to fp32): GV100 runs it on
    # its own FP16 pipe, at the FFMA instruction rate, and the model charges it issue only
    # (docs/peer-vllm-triton.md). LDL/STL: local memory (register spills), issue only.
    "HADD2": "fp16", "HMUL2": "fp16", "HFMA2": "fp16", "HSETP2": "fp16", "HSET2": "fp16", "HMNMX2": "fp16",
    "LDL": "local", "STL": "local",
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
    gaps, pending, first = [], set(), None
    for i, ins in enumerate(instrs):
        if pending and ins.registers & pending:
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
        hmma_f16_steps=counts["hmma"] - f32,   # HMMA.884.F16.*: the 2-step form
        shared_passes=sum(access_passes(access_bytes(op)) for op in shared),
        shared_bytes=sum(32 * access_bytes(op) for op in shared),
        fp32=counts["fp32"], mufu=counts["mufu"], load_use_gaps=tuple(load_use_gaps(instrs)),
        shuffles=counts["shuffle"])
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
    raise EnvironmentProblem(f"{function.name}: no branch before the hot loop at {first.start:#x} separates it from "
                             f"the hot loop at {second.start:#x}: cannot tell the tiles' code apart")


def outside_row(instrs: list[sass.Instr], warps: int, v100: dict) -> dict:
    """A CTA's code outside its hot loop, run once per CTA: its mix (every instruction once), the
    rounds of global loads it waits for, and its time with ``warps`` warps per sub-partition in
    phase (phases.once_cycles, those loads included)."""
    counts, mix = mix_of(instrs)
    once = phases.once_cycles(instrs, warps, v100)
    return {"instructions": len(instrs), "mix": counts, "load_rounds": len(mix.load_use_gaps), "cycles": once,
            "model_mix": {**vars(mix), "load_use_gaps": (), "critical_cycles": once, "critical_warps": warps}}


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
    mix = replace(mix, critical_cycles=timed["cycles"], critical_warps=w)
    return {"start": loop.start, "end": loop.end, "instructions": len(instrs), "mix": counts, "model_mix": vars(mix), "shared_bytes": mix.shared_bytes,
            "shared_passes": mix.shared_passes, "load_rounds": len(mix.load_use_gaps),
            "cycles": cycles, "binding": bound, "tensor_utilization_bound": util, "tflops_bound": util * peak,
            "critical_cycles": timed["cycles"], "critical_warps": w, "critical_tensor_duty": timed["tensor_duty"],
            "serial_runs": phases.serial_runs(instrs)}


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


def route_geometry(build_info: dict, artifact: Path, route: str = routes.EXACT) -> list[dict]:
    """A route's kernels with their geometry, from build_info()["kernels"]; an error naming what
    is missing when the build does not declare it (report never guesses). The long-prefill
    route's kernel also declares its tiles (qk, pv) and its block plan's constants."""
    if "error" in build_info:
        raise EnvironmentProblem(f"{artifact}: cannot load it for build_info(): {build_info['error']}")
    kernels = [k for k in build_info.get("kernels", []) if k.get("route") == route]
    if not kernels:
        fields = sorted({f for k in build_info.get("kernels", []) for f in k})
        raise EnvironmentProblem(
            f"{artifact}: build_info() declares no kernel of route {route}: its kernel entries have the fields "
            f"{', '.join(fields) or 'none'}; report needs route, {', '.join(GEOMETRY)} on each attention kernel "
            f"(rebuild from a patch series whose build_info() exports the kernel geometry)")
    for k in kernels:
        missing = [f for f in GEOMETRY if not isinstance(k.get(f), int)]
        if route == routes.GQA:
            kinds = {t.get("kind"): t for t in k.get("tiles", [])}
            missing += [f"tiles[{kind}].{f}" for kind in ("qk", "pv") for f in
                        ("rows_per_cta", "keys_per_iteration", "head_dims_per_iteration")
                        if not isinstance(kinds.get(kind, {}).get(f), int)]
            missing += [f"block_plan.{f}" for f in GQA_BLOCK_PLAN if not isinstance(k.get("block_plan", {}).get(f), int)]
        if missing:
            raise EnvironmentProblem(f"{artifact}: build_info() kernel {k.get('kernel')!r} of route {route} lacks "
                                     f"{', '.join(missing)} (expected integers; got {k})")
        if k.get("threads") != 32 * k["warps"]:
            raise EnvironmentProblem(f"{artifact}: build_info() kernel {k['kernel']!r}: threads expected "
                                     f"32 x warps = {32 * k['warps']}, actual {k.get('threads')}")
    return sorted(kernels, key=lambda k: k["head_dim"])


def kernel_rows(artifact: Path, arch: str, launch: dict[str, tuple[int, int]], geometry: list[dict] | None = None
                ) -> list[dict]:
    """Per kernel of ``arch`` in ``artifact``: resources, occupancy and hot loops. ``launch`` maps
    a demangled-name glob to (threads per block, dynamic shared bytes); a tensor-core kernel
    without one is an error. ``geometry``: the route kernels' geometry (``route_geometry``): a
    kernel with one is charged its code outside the hot loops (per kind of tile where it has tiles)."""
    tool = toolchain.find_cuda12_binutil("cuobjdump")
    if tool is None:
        raise EnvironmentProblem(f"cuobjdump: not found\n  install: {toolchain.PIP_BUILD}")
    v100 = load_v100()
    res = {r.name: r for r in sass.parse_resource_usage(sass.cuobjdump(tool, ["--dump-resource-usage"], artifact))
           if r.arch == arch}
    functions = [f for f in sass.parse_sass(sass.cuobjdump(tool, ["-sass"], artifact)) if f.arch == arch]
    pretty = sass.demangle([f.name for f in functions])
    out, unlaunched = [], []
    for f in functions:
        r = res.get(f.name)
        name = pretty[f.name]
        threads, dynamic = sass.first_match(name, launch, (None, 0))
        if threads is None and f.hmma:
            unlaunched.append(name)
            continue
        occ = occupancy(r.registers, r.shared + dynamic, threads, v100) if r and threads else None
        w = max(1, occ["warps_per_sm"] // v100["subpartitions_per_sm"]) if occ else 1
        geo = next((g for g in geometry or [] if sass.kernel_matches(name, sass.name_part_glob(g["kernel"]))), None)
        cta_w = -(-threads // (32 * v100["subpartitions_per_sm"])) if threads else w   # one CTA's warps per scheduler
        hot = [loop_row(lp, v100, w, cta_w) for lp in f.hot_loops()]
        outside = None
        if geo and "tiles" in geo:     # one kernel, several kinds of tile
            for row, code in zip(hot, tile_code(f, sorted(f.hot_loops(), key=lambda lp: lp.start))):
                row["outside"] = outside_row(code, cta_w, v100)
        elif geo and hot:              # one kind of CTA: everything outside its hot loops runs once
            inside = {i.addr for lp in f.hot_loops() for i in lp.instrs}
            outside = outside_row([i for i in f.instrs if i.addr not in inside], cta_w, v100)
        combine = None
        if occ and sass.kernel_matches(name, sass.name_part_glob(COMBINE_KERNEL)):   # split-KV's combine
            combine = combine_row(f, threads, occ["blocks_per_sm"], w, cta_w, v100, loop_row, outside_row)
        out.append({
            "kernel": name, "registers": r.registers if r else None, "stack": r.stack if r else None,
            "static_shared": r.shared if r else None, "dynamic_shared": dynamic, "local": r.local if r else None,
            "occupancy": occ, "warps_per_subpartition": w, "hmma_total": f.hmma, "geometry": geo,
            "hot_loops": hot, "outside": outside, **({"combine": combine} if combine else {}),
        })
    if unlaunched:
        raise EnvironmentProblem(f"{artifact}: no launch configuration (threads, dynamic shared memory) for the "
                                 f"tensor-core kernel(s) {', '.join(unlaunched)}: build_info() does not declare "
                                 f"them and no --launch matches")
    return out


# --- The sm70-gqa-prefill route -----------------------------------------------------------------

def gqa_plan(shape: Shape, geometry: dict) -> dict:
    """The long-prefill op's plan (gqa_prefill_api.cpp make_plan) from build_info()'s tiles and
    block-plan constants: packed rows per KV head padded to the qk tile, and the block size, the
    largest multiple of the qk tile's keys in [min, max] whose two fp16 score buffers fit the
    budget, no larger than the keys rounded up to that multiple."""
    tiles, bp = {t["kind"]: t for t in geometry["tiles"]}, geometry["block_plan"]
    qk_rows, qk_keys = tiles["qk"]["rows_per_cta"], tiles["qk"]["keys_per_iteration"]
    group = shape.hq // shape.hkv
    rows_pad = -(-group * shape.q // qk_rows) * qk_rows
    budget = bp["score_budget_bytes"] // max(1, 2 * shape.hkv * rows_pad * 2) // qk_keys * qk_keys
    needed = max(qk_keys, -(-shape.kv // qk_keys) * qk_keys)
    block_keys = min(max(bp["min_block_keys"], min(budget, bp["max_block_keys"])), needed)
    return {"group": group, "rows": group * shape.q, "rows_pad": rows_pad, "block_keys": block_keys,
            "num_blocks": max(1, -(-shape.kv // block_keys)), "tiles": tiles}


def gqa_steps(shape: Shape, plan: dict) -> list[dict]:
    """The route's launches as gqa_prefill_api.cpp run() makes them, one per step s = 0 ..
    num_blocks: the pv CTAs of block s-1 (every row tile of every KV head, blockIdx.x = head x
    row tiles + row tile), then the qk CTAs of block s (key tile fastest, then row tile from the
    first that sees a key of the block, then head). Per CTA (kind, hot-loop iterations, HBM
    bytes); a CTA with nothing to do returns at once (kind "idle"). Bottom-right causal: packed
    row r (query r // group) sees key j <= r // group + kv - q."""
    qk, pv = plan["tiles"]["qk"], plan["tiles"]["pv"]
    g, bk, d = plan["group"], plan["block_keys"], shape.d
    shift = shape.kv - shape.q
    last_key = lambda r: min(shape.kv - 1, r // g + shift)  # noqa: E731
    qk_iterations = d // qk["head_dims_per_iteration"]
    state = pv["rows_per_cta"] * (d * 4 + 2 * 4)              # fp32 acc, m, l
    steps = []
    for s in range(plan["num_blocks"] + 1):
        ctas, hbm = [], 0
        if s > 0:
            b = s - 1
            key0, nk = b * bk, max(0, min(bk, shape.kv - b * bk))
            first, last = b == 0, b == plan["num_blocks"] - 1
            for _ in range(shape.hkv):
                for t in range(plan["rows_pad"] // pv["rows_per_cta"]):
                    row0 = t * pv["rows_per_cta"]
                    visible = max(0, min(nk, last_key(row0 + pv["rows_per_cta"] - 1) + 1 - key0))
                    chunks = -(-visible // pv["keys_per_iteration"])
                    if chunks == 0 and not first and not last:
                        ctas.append(("idle", 0, 0))
                        continue
                    rows = min(pv["rows_per_cta"], max(0, plan["rows"] - row0))
                    scores = pv["rows_per_cta"] * (chunks * pv["keys_per_iteration"] * 2
                                                   + -(-visible // qk["keys_per_iteration"]) * 4)
                    out = rows * (d * 2 + 4) if last else 0
                    ctas.append(("pv", chunks, scores + state * ((not first) + (not last)) + out))
            hbm += nk * shape.hkv * d * 2                     # V once per block (its CTAs share it in L2)
        if s < plan["num_blocks"]:
            key0, nk = s * bk, max(0, min(bk, shape.kv - s * bk))
            tiles = -(-nk // qk["keys_per_iteration"])
            first_row = max(0, g * (key0 - shift))
            rt0 = min(first_row, plan["rows_pad"]) // qk["rows_per_cta"]
            for _ in range(shape.hkv):
                for rt in range(rt0, plan["rows_pad"] // qk["rows_per_cta"] if tiles else rt0):
                    row0 = rt * qk["rows_per_cta"]
                    for t in range(tiles):
                        seen = key0 + t * qk["keys_per_iteration"] <= last_key(row0 + qk["rows_per_cta"] - 1)
                        ctas.append(("qk", qk_iterations, qk["rows_per_cta"] * (qk["keys_per_iteration"] * 2 + 4))
                                    if seen else ("idle", 0, 0))
                    q_rows = min(qk["rows_per_cta"], max(0, plan["rows"] - row0))
                    hbm += q_rows * d * 2                     # Q once per row tile (its key tiles share it)
            hbm += nk * shape.hkv * d * 2                     # K once per block
        steps.append({"ctas": ctas, "hbm_bytes": hbm + sum(c[2] for c in ctas)})
    return steps


def gqa_loops(kernel: dict) -> dict:
    """The long-prefill kernel's two hot loops, told apart by what the geometry says each does
    per warp-iteration: the pv loop exponentiates its rows x keys scores (MUFU), the qk loop none."""
    loops = kernel["hot_loops"]
    pv = [lp for lp in loops if lp["mix"].get("mufu", 0)]
    qk = [lp for lp in loops if not lp["mix"].get("mufu", 0)]
    if len(pv) != 1 or len(qk) != 1 or any("outside" not in lp for lp in loops):
        raise EnvironmentProblem(f"kernel {kernel['kernel']}: expected one qk hot loop (no MUFU) and one pv hot loop "
                                 f"(MUFU), each with its tile's code; got {len(qk)} and {len(pv)}")
    return {"qk": qk[0], "pv": pv[0]}


def gqa_launches(shape: Shape, kernel: dict) -> tuple[list[KernelLaunch], dict]:
    """The sm70-gqa-prefill route's launches for ``shape``: per step one launch whose CTAs are
    runs of pv, qk and idle tiles (``KernelLaunch.more``); each tile's code outside its hot loop is
    charged once per CTA (its pipes as the epilogue, its load rounds as the prologue)."""
    g = kernel["geometry"]
    plan = gqa_plan(shape, g)
    loops = gqa_loops(kernel)
    kinds = {name: CtaKind(LoopMix(**lp["model_mix"]), (), LoopMix(**lp["outside"]["model_mix"]), 0)
             for name, lp in loops.items()}
    kinds["idle"] = CtaKind(LoopMix(), (), LoopMix(), 0)
    launches = []
    for step in gqa_steps(shape, plan):
        runs = []
        for name, its, _ in step["ctas"]:
            if runs and runs[-1][0] == name:
                runs[-1][1].append(its)
            else:
                runs.append((name, [its]))
        if not runs:
            continue
        parts = [replace(kinds[name], iterations=tuple(its)) for name, its in runs]
        head = parts[0]
        launches.append(KernelLaunch(kernel["kernel"], head.loop, head.iterations, g["warps"],
                                     kernel["occupancy"]["blocks_per_sm"], head.epilogue, head.prologue_load_rounds,
                                     step["hbm_bytes"], tuple(parts[1:])))
    return launches, {"block_keys": plan["block_keys"], "blocks": plan["num_blocks"], "splits": 1}


def gqa_eligible(shape: Shape, geometry: dict) -> bool:
    """Shapes the long-prefill op takes: one causal sequence, its head dim, whole groups, KV >= Q."""
    return (shape.causal and shape.b == 1 and not shape.decode and shape.d == geometry["head_dim"] and shape.hkv > 0
            and shape.hq % shape.hkv == 0 and shape.kv >= shape.q > 0)


def route_estimate(launches: list[KernelLaunch], card: Card, v100: dict, calibration: dict) -> dict:
    """Bound, model and calibrated time of a route made of ``launches`` (run one after another, at
    the clock the route's tensor duty allows); the calibrated time with its range
    (calibration.with_range). ``calibration``: calibrate()'s result (its ``parameters``, ``loo_range``).
    Per launch: the model's details, its calibrated time and what limits it once calibrated."""
    model = estimate_route(launches, card, v100)
    cal = estimate_route(launches, card, v100, Calibration(**calibration["parameters"]))
    details = [{**m, "calibrated_ms": c["ms"], "calibrated_clock_mhz": c["clock_mhz"], "limited_by": c["limited_by"],
                "bound": lower_bound(x, card, v100)} for x, m, c in zip(launches, model["launches"], cal["launches"])]
    return {"launches": details, "bound_ms": sum(x["bound"]["ms"] for x in details), "model_ms": model["ms"],
            "tensor_duty": cal["tensor_duty"], "clock_mhz": cal["clock_mhz"], **with_range(cal["ms"], calibration)}


def dense_kernel(shape: Shape, kernels: list[dict], artifact: Path) -> dict:
    """The sm70-dense kernel for the shape's head dim (the smallest head_dim >= d)."""
    route = [k for k in kernels if (k.get("geometry") or {}).get("route") == routes.EXACT]
    kernel = next((k for k in sorted(route, key=lambda k: k["geometry"]["head_dim"])
                   if k["geometry"]["head_dim"] >= shape.d), None)
    if kernel is None or shape.d % 8:
        dims = [k["geometry"]["head_dim"] for k in route]
        raise EnvironmentProblem(f"--shapes: d={shape.d}: {artifact} builds route {routes.EXACT} for head dims "
                                 f"that are multiples of 8 up to {max(dims, default=0)} (kernels: {dims})")
    return kernel


def predict(shape: Shape, kernels: list[dict], card: Card, v100: dict, calibration: dict, artifact: Path) -> dict:
    """The sm70-dense route on ``card`` for ``shape``. ``kernels``: report rows (with geometry)."""
    kernel = dense_kernel(shape, kernels, artifact)
    launches, plan = dense_launches(shape, kernel, card)
    return prediction(shape, routes.EXACT, kernel, plan, launches, card, v100, calibration)


def predict_split(shape: Shape, kernels: list[dict], card: Card, v100: dict, calibration: dict, artifact: Path,
                  splits: int) -> dict | None:
    """The exact route with ``splits``-way split-KV (exact_route.splitkv_launches), or None where
    routing cannot split the call (fewer than two query rows: decode keeps FA2's own split) or the
    build has no combine kernel."""
    combine = next((k["combine"] for k in kernels if "combine" in k), None)
    if shape.q < 2 or shape.kv < 1 or combine is None:
        return None
    kernel = dense_kernel(shape, kernels, artifact)
    launches, plan = splitkv_launches(shape, kernel, combine, splits)
    return prediction(shape, routes.SPLITKV, kernel, plan, launches, card, v100, calibration)


def predict_gqa(shape: Shape, kernels: list[dict], card: Card, v100: dict, calibration: dict) -> dict | None:
    """The sm70-gqa-prefill route on ``card`` for ``shape``, or None where the build has no such
    kernel or the op does not take the shape."""
    kernel = next((k for k in kernels if (k.get("geometry") or {}).get("route") == routes.GQA), None)
    if kernel is None or not gqa_eligible(shape, kernel["geometry"]):
        return None
    launches, plan = gqa_launches(shape, kernel)
    p = prediction(shape, routes.GQA, kernel, plan, launches, card, v100, calibration)
    return {**p, "binding_per_loop": {name: lp["binding"] for name, lp in gqa_loops(kernel).items()}}


def prediction(shape: Shape, route: str, kernel: dict, plan: dict, launches: list[KernelLaunch], card: Card,
               v100: dict, calibration: dict) -> dict:
    est = route_estimate(launches, card, v100, calibration)
    flops = useful_flops(shape)
    tflops = lambda ms: flops / (ms * 1e-3) / 1e12 if ms else None  # noqa: E731
    return {"label": shape.label, "route": route, "kernel": kernel["geometry"]["kernel"], "plan": plan,
            "card": {"sms": card.sms, "clock_mhz": card.clock_mhz}, "useful_flops": flops, **est,
            "tflops_upper_bound": tflops(est["bound_ms"]), "calibrated_tflops": tflops(est["calibrated_ms"]),
            "calibrated_tflops_low": tflops(est["calibrated_ms_high"]),
            "calibrated_tflops_high": tflops(est["calibrated_ms_low"]),
            "hbm_limited_launches": sum(x["limited_by"] == "hbm" for x in est["launches"])}


VERDICT = {"a": "faster", "b": "slower", "not separated": "not separated"}


def versus(p: dict, other: dict, key: str) -> dict:
    """``key``: other's calibrated time over p's (> 1: p is faster); ``key``_verdict: "faster" or
    "slower" where their ranges separate, else "not separated"."""
    return {key: other["calibrated_ms"] / p["calibrated_ms"], f"{key}_verdict": VERDICT[faster_if_separated(p, other)]}


def predict_routes(shape: Shape, rows: list[dict], card: Card, v100: dict, calibration: dict, artifact: Path,
                   splits: tuple = ()) -> list[dict]:
    """The sm70-dense prediction; where the long-prefill op takes the shape, its own with the
    ratio of the dense route's calibrated time to it (``vs_dense``) and whether their ranges
    separate (``vs_dense_verdict``: "faster", "slower" or "not separated"); and for each of
    ``splits`` the exact route with split-KV, with ``vs_dense`` (against the unsplit exact route)
    and, where the long-prefill op takes the shape, ``vs_gqa``."""
    dense = predict(shape, rows, card, v100, calibration, artifact)
    gqa = predict_gqa(shape, rows, card, v100, calibration)
    out = [dense] + ([{**gqa, **versus(gqa, dense, "vs_dense")}] if gqa else [])
    for n in splits:
        split = predict_split(shape, rows, card, v100, calibration, artifact, n)
        if split is not None:
            out.append({**split, **versus(split, dense, "vs_dense"), **(versus(split, gqa, "vs_gqa") if gqa else {})})
    return out


def route_launches(shape: Shape, rows: list[dict], route: str, card: Card, artifact: Path) -> list[KernelLaunch]:
    """The launches of ``route`` (sm70-dense or sm70-gqa-prefill) for a shape on a card: what a
    user's bench case measured (user_anchors.py)."""
    if route == routes.EXACT:
        return dense_launches(shape, dense_kernel(shape, rows, artifact), card)[0]
    kernel = next((k for k in rows if (k.get("geometry") or {}).get("route") == routes.GQA), None)
    if route == routes.GQA and kernel is not None and gqa_eligible(shape, kernel["geometry"]):
        return gqa_launches(shape, kernel)[0]
    raise EnvironmentProblem(f"{artifact}: no model of route {route!r} for {shape.label}")


def report(artifact: Path, arch: str, launch: dict[str, tuple[int, int]], shapes: list[Shape], card: Card,
           splits: tuple = (2, 3, 4), anchors: list[Path] = ()) -> dict:
    """The whole report: kernel rows and, for ``shapes``, predictions with their calibration
    (the exact route with split-KV for each of ``splits`` on prefill shapes). ``anchors``: users'
    bench files whose cases join the calibration (user_anchors.py; ``anchor_fit`` says how the fit
    moved). ``launch`` (--launch) replaces build_info()'s launch configurations; build_info() must
    load unless it does, and must declare the route's geometry when ``shapes`` are given."""
    from . import user_anchors

    info = load_build_info(artifact)
    if "error" in info and (shapes or anchors or not launch):
        raise EnvironmentProblem(f"{artifact}: cannot load it for build_info(): {info['error']}")
    declared = {k.get("route") for k in info.get("kernels", [])}
    geometry = route_geometry(info, artifact) if shapes or anchors or routes.EXACT in declared else None
    if geometry is not None and routes.GQA in declared:
        geometry += route_geometry(info, artifact, routes.GQA)
    launch = launch or launches_of(info)
    rows = kernel_rows(artifact, arch, launch, geometry)
    out = {"arch": arch, "kernels": rows}
    if shapes or anchors:
        v100 = load_v100()
        calibration = calibrate(v100)
        if anchors:
            user, skipped = user_anchors.load(anchors, lambda s, r, c: route_launches(s, rows, r, c, artifact))
            before, calibration = calibration, calibrate(v100, None, user) if user else calibration
            out["anchor_fit"] = user_anchors.movement(before, calibration, anchors, skipped)
        out.update(card={"sms": card.sms, "clock_mhz": card.clock_mhz}, calibration=calibration,
                   predictions=[p for s in shapes for p in predict_routes(s, rows, card, v100, calibration, artifact,
                                                                          tuple(splits))])
    return out


def render(result: dict) -> str:
    """The report as text: the kernel table; with predictions, the shape table and the anchors."""
    lines = ["Static report from the sm_70 SASS (V100 parameters: tools/fa2patch/data/v100.toml); bounds and "
             "model estimates, not measurements. Counts per warp-iteration: every instruction of the loop once "
             "(both sides of a branch)."]
    cells = []
    for k in result["kernels"]:
        occ = k["occupancy"]
        occ_text = f"{occ['blocks_per_sm']} blk, {occ['warps_per_sm']} warps ({occ['limited_by']})" if occ else "-"
        for lp in k["hot_loops"] or [None]:
            serial = lp and (lp["serial_runs"][0]["instructions"] if lp["serial_runs"] else 0)
            cells.append([k["kernel"][:60], k["registers"], occ_text,
                          lp and lp["instructions"], lp and lp["mix"].get("hmma", 0),
                          lp and f"{lp['shared_passes']:g}", lp and lp["mix"].get("shuffle", 0), lp and lp["load_rounds"],
                          lp and lp["binding"], lp and f"{max(lp['cycles'].values()):.0f}",
                          lp and f"{lp['critical_cycles']:.0f}", serial,
                          lp and f"{lp['tensor_utilization_bound']:.0%}", lp and f"{lp['tflops_bound']:.1f}"])
    lines.append(table([[("-" if c is None else c) for c in r] for r in cells],
                        ["kernel", "regs", "occupancy", "loop instr", "HMMA", "smem passes", "SHFL", "load rounds",
                         "binding", "pipe cycles", "CTA iteration cycles", "serial run", "tensor util <=",
                         "TFLOP/s <="]))
    lines.append("pipe cycles: the binding pipe per iteration at the kernel's occupancy (all its warps per "
                 "scheduler); CTA iteration cycles: one CTA's iteration with its warps in phase, timed from the SASS "
                 "(serial phases, dependency chains, loads waited for); serial run: the longest HMMA-free run of "
                 "instructions in the loop.")
    if "calibration" not in result:
        return "\n".join(lines)
    from .user_anchors import render_calibration

    cal, card = result["calibration"], result["card"]
    if result["predictions"]:
        lines += ["", f"Routes on a V100 with {card['sms']} SMs at {card['clock_mhz']:g} MHz (useful causal FLOPs). "
                  f"bound: pipes only at the peak tensor rate and {card['clock_mhz']:g} MHz (ms >=, TFLOP/s <=). "
                  f"model: one CTA's iteration timed from the SASS, prologue/epilogue, dispatch tail and HBM, at the "
                  f"clock the route's tensor duty allows under the 300 W cap (MHz). " + header_text(cal)
                  + " vs dense / vs long-prefill: that route's calibrated time over this one's (> 1: this one is "
                  "faster), and whether their ranges separate."]
        lines.append(table([[p["label"], p["route"], p["plan"].get("splits", 1), f"{p['bound_ms']:.3f}",
                              _num(p["tflops_upper_bound"]), f"{p['model_ms']:.3f}", f"{p['clock_mhz']:.0f}",
                              range_text(p["calibrated_ms"], p["calibrated_ms_low"], p["calibrated_ms_high"]),
                              range_text(p["calibrated_tflops"], p["calibrated_tflops_low"],
                                         p["calibrated_tflops_high"], 1),
                              _versus(p, "vs_dense"), _versus(p, "vs_gqa"), _limits(p)]
                             for p in result["predictions"]],
                            ["shape", "route", "splits", "bound ms", "TFLOP/s <=", "model ms", "MHz",
                             "calibrated ms (range)", "calibrated TFLOP/s (range)", "vs dense", "vs long-prefill",
                             "limited by"]))
    lines += render_calibration(result)
    return "\n".join(lines)


def _versus(p: dict, key: str) -> str:
    return f"{p[key]:.2f}x, {p[key + '_verdict']}" if key in p else "-"


def _limits(p: dict) -> str:
    """What limits the route: per hot loop its binding pipe; per launch compute or HBM (the
    dense route: "compute" for the first launch, "<kernel> hbm" for the others)."""
    launches = p["launches"]
    if p["route"] == routes.GQA:
        loops = ", ".join(f"{name} {pipe}" for name, pipe in p["binding_per_loop"].items())
        return f"{loops}; hbm binds {p['hbm_limited_launches']} of {len(launches)} launches"
    return ", ".join(x["limited_by"] if i == 0 else f"{x['name'].split('(')[0].split('::')[-1]} {x['limited_by']}"
                     for i, x in enumerate(launches))


def _num(x) -> str:
    return "-" if x is None else f"{x:.1f}"
