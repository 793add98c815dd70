# SPDX-License-Identifier: BSD-3-Clause
"""What each calibration anchor measured, rebuilt as the model's launches (data/anchors.toml): its
card (SMs, clock, DRAM peak), its kernels' recorded code, and per workload kind the launches its
measurement covers: an FA2-style forward grid, KV-blocked QK and PV GEMMs, or a paged decode
(partition kernel and reducers). calibration.py times them."""

from pathlib import Path

from fa2patch.model import memory
from fa2patch.model.loop_mix import mix_from_data
from fa2patch.model.v100model import Card, KernelLaunch, fa2_grid_iterations, gemm_launch, load_v100


def anchor_card(anchor: dict, v100: dict | None = None) -> Card:
    """The card an anchor ran on: its SMs, its clock and, where the record names the card
    (``card.dram``), that card's DRAM peak (memory.card_peak)."""
    card = anchor["card"]
    peak = memory.card_peak(card["dram"], v100 or load_v100()) if "dram" in card else None
    return Card(card["sms"], card["clock_mhz"], peak)


def kernel_code(kernel: dict) -> dict:
    """A recorded kernel's hot loop, its code outside the loop (run once per CTA) and the
    global-load rounds each CTA waits for before its first iteration (0 where the code outside
    the loop was timed from the SASS: its loads are in it)."""
    if "outside" in kernel:
        return {
            "loop": mix_from_data(kernel["loop"]),
            "epilogue": mix_from_data(kernel["outside"]),
            "prologue_load_rounds": 0,
        }
    return {
        "loop": mix_from_data(kernel["loop"]),
        "epilogue": mix_from_data(kernel.get("epilogue", {})),
        "prologue_load_rounds": kernel.get("prologue_load_rounds", 1),
    }


def kernel_sass(kernel: dict, scratch: Path) -> tuple[Path, str]:
    """Where an anchor kernel's SASS was written when it was compiled (its mix_source's ``sass``: a
    file in the scratch folder, common.project.scratch_dir) and the part of the function name that
    picks its function there."""
    where = kernel["mix_source"]["sass"]
    return scratch / where["file"], where["function"]


def anchor_launches(anchor: dict, kernels: dict) -> list[KernelLaunch]:
    """The launches an anchor's measurement covers, rebuilt from its recorded workload."""
    work = anchor["workload"]
    if work["kind"] == "fa2-forward":
        kernel = kernels[anchor["kernel"]]
        its = fa2_grid_iterations(
            work["q"], work["kv"], work["causal"], kernel["rows_per_cta"], kernel["keys_per_iteration"], work["hq"]
        )
        code = kernel_code(kernel)
        return [
            KernelLaunch(
                anchor["kernel"],
                code["loop"],
                tuple(its),
                kernel["warps"],
                kernel["ctas_per_sm"],
                code["epilogue"],
                code["prologue_load_rounds"],
                fused=True,
            )
        ]
    if work["kind"] == "kv-blocked-gemms":
        qk, pv = kernels[work["qk_kernel"]], kernels[work["pv_kernel"]]
        qk_code, pv_code = kernel_code(qk), kernel_code(pv)
        rows, d = work["q"] * work["hq"] // work["hkv"], work["d"]
        launches = []
        prefix = work["kv"] - work["q"]
        for start in range(0, prefix, work["block_keys"]):
            n = min(work["block_keys"], prefix - start)
            scores = rows * n * 2
            launches.append(
                gemm_launch(
                    work["qk_kernel"],
                    qk_code["loop"],
                    qk,
                    rows,
                    n,
                    d,
                    scores + rows * d * 2 + n * d * 2,
                    qk_code["epilogue"],
                    qk_code["prologue_load_rounds"],
                )
            )
            launches.append(
                gemm_launch(
                    work["pv_kernel"],
                    pv_code["loop"],
                    pv,
                    rows,
                    d,
                    n,
                    scores + n * d * 2,
                    pv_code["epilogue"],
                    pv_code["prologue_load_rounds"],
                )
            )
        return launches
    if work["kind"] == "paged-decode":
        return decode_launches(anchor["kernel"], work, kernels)
    raise ValueError(f"anchor {anchor['name']}: unknown workload kind {work['kind']!r}")


def decode_launches(name: str, work: dict, kernels: dict) -> list[KernelLaunch]:
    """A decode anchor's launches: the partition kernel (one CTA per partition of its keys, one
    iteration per 128-key tile, streaming K and V from DRAM) and, for a whole call, its reducers
    (over the partitions; they read partials just written, from L2)."""
    kernel = kernels[name]
    keys, size = work["keys"], kernel["partition_keys"]
    parts = -(-keys // size)
    tiles = [-(-min(size, keys - p * size) // kernel["keys_per_iteration"]) for p in range(parts)]
    code = kernel_code(kernel)
    group, d = 6, 256  # the anchors' shape: 6 query heads per KV head, head dim 256
    kv_bytes = keys * d * 2 * 2
    partials = parts * group * (d * 2 + 8)  # fp16 partial O, fp32 max and sum per partition and head
    launches = [
        KernelLaunch(
            name,
            code["loop"],
            tuple(tiles),
            kernel["warps"],
            kernel["ctas_per_sm"],
            code["epilogue"],
            code["prologue_load_rounds"],
            hbm_bytes=kv_bytes + partials,
            streams=True,
        )
    ]
    for reducer in work.get("reducers", []):
        r = kernels[reducer]
        rcode = kernel_code(r)
        trips = -(-parts // r["partitions_per_iteration"])
        launches.append(
            KernelLaunch(
                reducer, rcode["loop"], (trips,) * r["ctas"], r["warps"], r["ctas_per_sm"], rcode["epilogue"], 0
            )
        )
    return launches
