# SPDX-License-Identifier: BSD-3-Clause
"""The peer a V100 user runs today: vLLM 0.33's TRITON_ATTN backend, modelled from its sm_70 SASS.

Without fa2patch, vLLM 0.33 refuses FLASH_ATTN and FLASHINFER on capability 7.0 and picks
TRITON_ATTN, whose ``unified_attention`` launches one Triton kernel for prefill and decode
(``kernel_unified_attention``: a "2D" grid, or a "3D" grid of 16 KV segments followed by
``reduce_segments``). Triton has no tensor-core path for sm_70: its ``tl.dot`` becomes FFMA.

Two halves:

- ``extract`` (peers/extract.py; slow, needs the Triton that vLLM's torch pins; not run in CI):
  compiles the kernels for capability 7.0 offline (peers/compile.py), reads their SASS with the
  same pipeline as our kernels (``sass.parse_sass``, ``SassFunction.main_loop``, ``sass_mix.mix_of``,
  ``sass_mix.outside_mix``) and writes data/peer_vllm_triton.toml. Command:

      python -m fa2patch.peers.extract --python $FA2PATCH_SCRATCH/peer-venv/bin/python \\
          --out tools/fa2patch/data/peer_vllm_triton.toml

  (``--vllm-src DIR`` for an extracted vllm-0.33.0/ tree; without it the pinned sdist is
  fetched through the package index and checked, packaging/vllm-release.toml).
- ``peer_launches(shape, card)`` rebuilds, from the recorded data, the launches vLLM makes for a
  shape (``plan``: its 2D/3D choice, BLOCK_M/BLOCK_Q, tile; ``cta_iterations``: the grid in
  launch order), and ``peer_estimate`` sums ``v100model.estimate_launch`` over them.

docs/peer-vllm-triton.md says what is modelled and what is not. Every number is a model estimate
of a kernel without tensor cores, uncalibrated.
"""

import argparse
import math
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.shapes import Shape
from fa2patch.model.loop_mix import LoopMix
from fa2patch.model.v100model import (
    Card,
    CtaKind,
    KernelLaunch,
    estimate_launch,
    load_data,
    load_v100,
    lower_bound,
    occupancy,
)
from fa2patch.peers import compile as peer_compile

NAME = "vllm-triton"
DATA = "peer_vllm_triton.toml"
SEQ_THRESHOLD_GRID = 128  # MIN_LAUNCH_GRID_SIZE_2D: seq_threshold_3D = 128 // kv heads
MAX_3D_QUERY_LEN = 8


# --- What vLLM launches for a shape ------------------------------------------------------------


def plan(shape: Shape) -> dict:
    """unified_attention's choices on capability 7.0 (fp16, no sinks/ALiBi/window/FP8, no
    speculative decoding): BLOCK_M, BLOCK_Q, 2D or 3D (split-KV over 16 segments when the batch
    has few query blocks: b x ceil(q / BLOCK_Q) <= 128 // hkv; decode-only sequences or short causal
    ones), the KV tile (32 for 2D, 16 for 3D) and the recorded variant that runs it."""
    group = shape.hq // shape.hkv
    bm = peer_compile.block_m(group)
    bq = bm // group
    threshold = SEQ_THRESHOLD_GRID // shape.hkv
    short = shape.q == 1 or (shape.q <= MAX_3D_QUERY_LEN and shape.causal)
    use_3d = short and shape.b * -(-shape.q // bq) <= threshold and shape.b * shape.q <= threshold
    mode = "3d" if use_3d else "2d"
    return {
        "group": group,
        "block_m": bm,
        "block_q": bq,
        "mode": mode,
        "tile": 16 if use_3d else 32,
        "segments": peer_compile.NUM_SEGMENTS if use_3d else 1,
        "seq_threshold_3d": threshold,
        "variant": f"d{shape.d}_g{group}_{mode}",
        "reduce": f"d{shape.d}_reduce" if use_3d else None,
    }


def cta_iterations(shape: Shape, p: dict) -> list[int | None]:
    """Main-loop iterations of each CTA of kernel_unified_attention, in launch order (blockIdx.x:
    query block, then .y: KV head, then .z: segment); None for a CTA that returns before its loop.
    The grid has b*q // BLOCK_Q + b query blocks; block g belongs to the last sequence i whose first
    block i*q // BLOCK_Q + i is <= g. A block sees keys up to context + its last query row
    (bottom-right causal; all keys otherwise), in tiles; in 3D, segment z takes tiles
    [z*t, (z+1)*t) with t = ceil(kv / (16 * tile)), and a segment starting past the keys returns."""
    bq, tile = p["block_q"], p["tile"]
    blocks = shape.b * shape.q // bq + shape.b
    starts = [i * shape.q // bq + i for i in range(shape.b)]
    per_head = []
    for z in range(p["segments"]):
        row: list[int | None] = []
        seq = 0
        for g in range(blocks):
            while seq + 1 < shape.b and starts[seq + 1] <= g:
                seq += 1
            local = g - starts[seq]
            if local * bq >= shape.q:
                row.append(None)
                continue
            prefix = (
                min(shape.kv - shape.q + local * bq + (p["block_m"] - 1) // p["group"] + 1, shape.kv)
                if shape.causal
                else shape.kv
            )
            tiles = -(-prefix // tile)
            if p["mode"] == "2d":
                row.append(tiles)
                continue
            per_segment = -(-shape.kv // (p["segments"] * tile))
            row.append(
                None
                if z * per_segment * tile >= shape.kv
                else max(0, min((z + 1) * per_segment, tiles) - z * per_segment)
            )
        per_head.append(row)
    return [its for z in range(p["segments"]) for _ in range(shape.hkv) for its in per_head[z]]


def search_rounds(num_seqs: int) -> int:
    """Dependent global-load rounds before a CTA knows its sequence: the binary search over
    query_start_loc (one load per step) and the loads of its bounds."""
    return math.ceil(math.log2(num_seqs + 1)) + 1


def mix(d: dict) -> LoopMix:
    return LoopMix(**{**d, "load_use_gaps": tuple(d.get("load_use_gaps", ()))})


def runs(kinds: dict[str, CtaKind], order: list[tuple[str, int]]) -> list[CtaKind]:
    """CTAs of named kinds in launch order, as runs of one kind each."""
    out: list[tuple[str, list[int]]] = []
    for name, its in order:
        if out and out[-1][0] == name:
            out[-1][1].append(its)
        else:
            out.append((name, [its]))
    return [replace(kinds[name], iterations=tuple(its)) for name, its in out]


def launch_of(name: str, parts: list[CtaKind], variant: dict, hbm: float, v100: dict) -> KernelLaunch:
    occ = occupancy(variant["registers"], variant["shared"], 32 * variant["num_warps"], v100)
    head = parts[0]
    return KernelLaunch(
        name,
        head.loop,
        head.iterations,
        variant["num_warps"],
        occ["blocks_per_sm"],
        head.epilogue,
        head.prologue_load_rounds,
        hbm,
        tuple(parts[1:]),
    )


def peer_launches(
    shape: Shape,
    card: Card | None = None,
    data: dict | None = None,
    v100: dict | None = None,
    spills_on_l1: bool = False,
) -> tuple[list[KernelLaunch], dict]:
    """The launches vLLM's TRITON_ATTN backend makes for ``shape``, from the recorded variants.
    ``spills_on_l1``: also charge the main loop's local-memory accesses (register spills) as
    bank passes on the L1/shared data path (a sensitivity: the model otherwise charges them issue
    only, as it does every instruction outside its pipes). ``card`` is accepted for symmetry with
    the routes' builders: the launches do not depend on it."""
    data = data or load_data(DATA)
    v100 = v100 or load_v100()
    p = plan(shape)
    if p["variant"] not in data["variant"]:
        raise KeyError(
            f"peer {NAME}: no recorded variant {p['variant']} for {shape.label} "
            f"(recorded: {', '.join(sorted(data['variant']))})"
        )
    var = data["variant"][p["variant"]]
    loop = mix(var["loop"]["model_mix"])
    if spills_on_l1:
        loop = replace(loop, shared_passes=loop.shared_passes + var["loop"]["local_passes"])
    kinds = {
        "work": CtaKind(loop, (), mix(var["outside"]["model_mix"]), var["outside"]["load_rounds"]),
        "idle": CtaKind(LoopMix(), (), LoopMix(), search_rounds(shape.b)),
    }
    its = cta_iterations(shape, p)
    order = [("idle", 0) if n is None else ("work", n) for n in its]
    d, tokens = shape.d, shape.b * shape.q
    qo = tokens * shape.hq * d * 2
    kv = 2 * shape.b * shape.kv * shape.hkv * d * 2
    partials = tokens * shape.hq * p["segments"] * (d * 4 + 8) if p["mode"] == "3d" else 0
    launches = [launch_of(var["kernel"], runs(kinds, order), var, qo + kv + (partials if partials else qo), v100)]
    if p["reduce"]:
        red = data["variant"][p["reduce"]]
        kind = CtaKind(
            LoopMix(), (0,) * (tokens * shape.hq), mix(red["outside"]["model_mix"]), red["outside"]["load_rounds"]
        )
        launches.append(launch_of(red["kernel"], [kind], red, partials + qo, v100))
    p["ctas"] = len(its)
    p["idle_ctas"] = sum(n is None for n in its)
    p["cta_iterations"] = sum(n or 0 for n in its)
    return launches, p


def peer_estimate(shape: Shape, card: Card, data: dict | None = None, v100: dict | None = None) -> dict:
    """Model time (uncalibrated) of the peer for ``shape`` on ``card``: the sum of
    ``v100model.estimate_launch`` over its launches; with the pipes-only bound, the FP32-pipe bound
    (the main loop's FP32 instructions alone: what no bank-conflict or spill assumption changes)
    and the spills-on-L1 sensitivity."""
    if shape.decode:
        raise EnvironmentProblem(
            f"--peer: {shape.label}: the peer's model has no decode rows (decode=); give it the prefill shape alone"
        )
    data = data or load_data(DATA)
    v100 = v100 or load_v100()
    launches, p = peer_launches(shape, card, data, v100)
    details = [estimate_launch(x, card, v100) for x in launches]
    fp32_only = [
        replace(
            x, loop=LoopMix(fp32=x.loop.fp32), more=tuple(replace(k, loop=LoopMix(fp32=k.loop.fp32)) for k in x.more)
        )
        for x in launches
    ]
    spills, _ = peer_launches(shape, card, data, v100, spills_on_l1=True)
    return {
        "peer": NAME,
        "label": shape.label,
        "plan": p,
        "card": {"sms": card.sms, "clock_mhz": card.clock_mhz},
        "model_ms": sum(x["ms"] for x in details),
        "bound_ms": sum(lower_bound(x, card, v100)["ms"] for x in launches),
        "fp32_bound_ms": sum(lower_bound(x, card, v100)["ms"] for x in fp32_only),
        "model_ms_spills_on_l1": sum(estimate_launch(x, card, v100)["ms"] for x in spills),
        "binding": details[0]["binding"],
        "launches": details,
        "tensor_cores": False,
    }


def render(rows: list[dict], predictions: Sequence[dict] = ()) -> str:
    """The peer's section of `report`: per shape its plan, model time and bounds, and the ratio of
    its model time to each of our routes' model time for the same shape (both uncalibrated)."""
    from fa2patch.common.tables import table

    ours: dict[str, list[dict]] = {}
    for p in predictions:
        ours.setdefault(p["label"], []).append(p)
    cells = [
        [
            e["label"],
            f"{e['plan']['mode']} {e['plan']['variant']}",
            e["plan"]["ctas"],
            f"{e['fp32_bound_ms']:.3f}",
            f"{e['bound_ms']:.3f}",
            f"{e['model_ms']:.3f}",
            f"{e['model_ms_spills_on_l1']:.3f}",
            e["binding"],
            ", ".join(f"{p['route']} {e['model_ms'] / p['model_ms']:.2f}x" for p in ours.get(e["label"], [])) or "-",
        ]
        for e in rows
    ]
    src = load_data(DATA)["source"]
    card = rows[0]["card"] if rows else {"sms": "-", "clock_mhz": "-"}
    head = (
        f"Peer {NAME}: vLLM {src['vllm']}'s TRITON_ATTN on capability 7.0 (Triton {src['triton']}, ptxas "
        f"{src['ptxas']}), model estimates of a kernel WITHOUT tensor cores (tl.dot -> FFMA), uncalibrated, "
        f"{card['sms']} SMs at {card['clock_mhz']:g} MHz. FP32 bound: its FP32 instructions alone; "
        f"spills on L1: local memory charged on the shared-memory path. docs/peer-vllm-triton.md."
    )
    return "\n".join(
        [
            head,
            table(
                cells,
                [
                    "shape",
                    "grid",
                    "CTAs",
                    "FP32 bound ms",
                    "bound ms",
                    "model ms",
                    "spills on L1 ms",
                    "binding",
                    "peer model / route model",
                ],
            ),
        ]
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fa2patch.peers.vllm_triton", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    est = sub.add_parser(
        "estimate", help="model time of the peer for shapes (extraction: python -m fa2patch.peers.extract)"
    )
    est.add_argument("--shapes", required=True)
    est.add_argument("--sms", type=int, default=80)
    est.add_argument("--clock-mhz", type=float, default=1530.0)
    est.add_argument("--data", type=Path, help="a recorded data file (default: the package's)")
    args = ap.parse_args(argv)
    from fa2patch.common.shapes import parse_shapes

    data = tomllib.loads(args.data.read_text()) if args.data else None
    for shape in parse_shapes(args.shapes):
        e = peer_estimate(shape, Card(args.sms, args.clock_mhz), data)
        print(
            f"{e['label']}: {e['plan']['mode']} {e['plan']['variant']}: model {e['model_ms']:.3f} ms "
            f"(bound {e['bound_ms']:.3f}, FP32 bound {e['fp32_bound_ms']:.3f}, spills on L1 "
            f"{e['model_ms_spills_on_l1']:.3f}; binding {e['binding']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
