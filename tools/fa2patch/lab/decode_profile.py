# SPDX-License-Identifier: BSD-3-Clause
"""Where a decode call's time goes, on the lab (issue 37 item 2): the decode benchmark's calls
(fa2patch.lab.decode_bench: vLLM's paged cache, the decode kernel forced), taken apart.

    python3 -m fa2patch.lab.decode_profile --artifact SO --json-file OUT.json
        per shape, torch.profiler's record of one eager call and of one graph replay: every device
        activity (kernel, memset, copy) with its duration, and the eager call's host time (median of
        20, launch to synchronize);
    ncu --clock-control none -k regex:'decode_sm70|splitkv_combine' --section ... \\
        python3 -m fa2patch.lab.decode_profile --artifact SO --once
        one eager call per shape, nothing else, for Nsight Compute's counters of the decode kernel and
        its combine (ci/gpu-lab.sh's neighbours give the sections; the lab's README the command).
"""

import argparse
import csv
import json
import os
import statistics
import sys
import time

from fa2patch.lab.decode_bench import DecodeShape

SHAPES = (
    DecodeShape(6, 1, 256, 1, 1024, 784),
    DecodeShape(6, 1, 256, 1, 131072, 784),
    DecodeShape(32, 8, 128, 64, 32768, 16),
)


def device_activities(prof) -> list[dict]:
    """The profiler's device-side events in start order: name, microseconds, and start after the first
    (the gaps between them are time the device waited)."""
    events = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
    first = events[0].time_range.start if events else 0
    return [
        {"name": e.name[:200], "us": e.time_range.elapsed_us(), "start_us": e.time_range.start - first} for e in events
    ]


# Nsight Compute's metrics that say where a memory-bound kernel's time goes.
NCU_METRICS = (
    "Duration",
    "DRAM Throughput",
    "Memory Throughput",
    "Achieved Occupancy",
    "Theoretical Occupancy",
    "Registers Per Thread",
    "Warp Cycles Per Issued Instruction",
    "Grid Size",
)


def ncu_summary(text: str) -> list[dict]:
    """The NCU_METRICS rows of ``ncu --csv --page details`` output (its own ==PROF== lines and the
    program's output skipped): kernel, launch ID, metric, value, unit."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    return [
        {
            "id": row["ID"],
            "kernel": row["Kernel Name"],
            "metric": row["Metric Name"],
            "value": row["Metric Value"],
            "unit": row["Metric Unit"],
        }
        for row in csv.DictReader(lines)
        if row.get("Metric Name") in NCU_METRICS
    ]


def profile_shape(torch, ops, s: DecodeShape) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from fa2patch.lab.decode_bench import Case, Timer

    case = Case(torch, ops, s)
    case.call()
    torch.cuda.synchronize()
    host = []
    for _ in range(20):
        start = time.perf_counter()
        case.call()
        torch.cuda.synchronize()
        host.append((time.perf_counter() - start) * 1e6)
    with profile(activities=[ProfilerActivity.CUDA]) as eager:
        case.call()
        torch.cuda.synchronize()
    graph = Timer(torch, 1).capture(case.call)
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as replay:
        graph.replay()
        torch.cuda.synchronize()
    return {
        "label": s.label,
        "eager_host_us_median": statistics.median(host),
        "eager": device_activities(eager),
        "graph_replay": device_activities(replay),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifact")
    parser.add_argument("--json-file")
    parser.add_argument("--once", action="store_true", help="one eager call per shape (under ncu)")
    parser.add_argument("--ncu-csv", help="print the key metrics of an ncu --csv --page details log, and stop")
    args = parser.parse_args(argv)
    if args.ncu_csv:
        with open(args.ncu_csv) as f:
            for row in ncu_summary(f.read()):
                print(f"{row['id']:>3} {row['kernel'][:70]:70s} {row['metric']:36s} {row['value']:>12s} {row['unit']}")
        return 0
    if not args.artifact:
        parser.error("--artifact is required unless --ncu-csv")
    if not args.once and not args.json_file:
        parser.error("--json-file is required unless --once")
    os.environ.setdefault("FA2PATCH_FORCE_SM70", "1")
    os.environ["FA2PATCH_SM70_DECODE"] = "1"
    import torch

    torch.ops.load_library(args.artifact)
    ops = torch.ops._vllm_fa2_C
    if args.once:
        from fa2patch.lab.decode_bench import Case

        for s in SHAPES:
            Case(torch, ops, s).call()
            torch.cuda.synchronize()
        return 0
    shapes = [profile_shape(torch, ops, s) for s in SHAPES]
    result = {"gpu": torch.cuda.get_device_name(), "shapes": shapes}
    for shape in shapes:
        print(f"{shape['label']}: eager host {shape['eager_host_us_median']:.1f} us")
        for part in ("eager", "graph_replay"):
            total = sum(a["us"] for a in shape[part])
            print(f"  {part}: {len(shape[part])} device activities, {total:.1f} us of device time")
            for a in shape[part]:
                print(f"    at {a['start_us']:9.1f} us: {a['us']:9.1f} us  {a['name'][:100]}")
    with open(args.json_file, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
