# SPDX-License-Identifier: BSD-3-Clause
"""The exact route's launches (sm70-dense), as the extension runs a call (docs/report-model.md).

- **Unsplit** (``dense_launches``): the forward kernel, grid (query blocks, sequences, heads), CTA m
  of a sequence holding its query rows m x rows .. (m + 1) x rows - 1 over the key blocks it sees
  (bottom-right causal: ``visible_blocks``, as sm70/mask.h ``visible_blocks``).
- **The decode split** (``dense_plan``): q = 1 with hq > hkv swaps a group's heads into the query
  rows (FA2's host code) and splits KV so that one wave fills the kernel's CTA slots (patch 0004,
  ``decode_splits``; FA2's own heuristic sized it for its SM80 kernel); its combine is charged its
  HBM bytes. Each
  K/V byte is read once, by one CTA: the forward launch streams from DRAM (memory.py).
- **Split-KV on prefill** (``splitkv_launches``; routing's ``sm70-dense-splitkv``, patch 0004): the
  same kernel with blockIdx.z = split x heads + head: each CTA's visible key blocks are cut into
  ``splits`` shares of ceil(blocks / splits) (flash_fwd_sm70.cuh), every split re-reads its CTA's Q
  and writes FP32 partials of O and the LSE in q's rows (splits x heads x total_q rows of d x 4 + 4
  bytes); then ``splitkv_combine_sm70_kernel`` (``combine_launch``) merges each output row.
- **Batches with decode rows** (``Shape.decode``: vLLM's chunked prefill puts running requests'
  decodes, one query each, in the same varlen call as a prefill chunk): every sequence gets the
  grid's max_seqlen_q / rows query blocks; a block past its sequence's rows returns at once (it
  costs no time in the model and is left out); a decode row's block runs the whole 64-row tile
  over all its keys. The sequences' order in the batch is an assumption: decode rows first
  (running requests are scheduled before a new prefill chunk).
"""

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.shapes import Shape
from fa2patch.model.loop_mix import LoopMix
from fa2patch.model.v100model import Card, KernelLaunch, fa2_grid_iterations

COMBINE_KERNEL = "splitkv_combine_sm70_kernel"
# splitkv_combine_sm70.cu, up to 8 splits (prefill split-KV): one warp merges one output row (rows
# per CTA = threads / 32), each lane two columns of every 64 (its column loop runs ceil(d / 64)
# times). More splits (the decode split) take its wide form, charged its bytes (combine_bytes).
COMBINE_COLUMNS_PER_TRIP = 64


MAX_SPLITS = 128  # FA2's limit (set_params_splitkv)
# Routing's built-in prefill split rule (routing.cpp builtin_prefill_splits; kSplitCandidates,
# kSplitMinGain, kSplitCtaFixedBlocks: tests/cli/test_report_plot.py reads them from patch 0004).
SPLIT_CANDIDATES, SPLIT_MIN_GAIN, SPLIT_CTA_FIXED_BLOCKS = (2, 3, 4), 1.26, 32


def prefill_splits(ctas: int, blocks: int, slots: int) -> int:
    """The built-in rule's split count for one causal sequence on the exact route of ``ctas`` CTAs
    over ``blocks`` key blocks with ``slots`` CTA slots: the s in SPLIT_CANDIDATES with the largest
    wave-quantized gain ceil(c / slots) (F + n) / (ceil(s c / slots) (F + ceil(n / s))), the fewest
    on a tie, where it reaches SPLIT_MIN_GAIN; else 1."""
    fixed = SPLIT_CTA_FIXED_BLOCKS
    unsplit = -(-ctas // slots) * (fixed + blocks)
    gain, s = max((unsplit / (-(-(s * ctas) // slots) * (fixed + -(-blocks // s))), -s) for s in SPLIT_CANDIDATES)
    return -s if gain >= SPLIT_MIN_GAIN else 1


def decode_splits(ctas: int, kv: int, keys_per_iteration: int, slots: int) -> int:
    """The decode swap's split count on the SM70 route (patch 0004, routing::decode_splits): one wave
    of the exact route's CTA slots, slots / ctas splits, at most one per key block and 128; 1 where
    the CTAs fill the slots already."""
    blocks = -(-kv // keys_per_iteration)
    return max(1, min(slots // ctas if ctas > 0 else 1, blocks, MAX_SPLITS))


def dense_plan(shape: Shape, geometry: dict, card: Card, ctas_per_sm: int = 1) -> dict:
    """How FA2's varlen host code runs ``shape`` on the sm70-dense kernel, num_splits = 0
    (automatic): decode with grouped heads (q=1, hq > hkv, no other rows) swaps the heads of a
    group into the query rows (seqlen_q = hq/hkv, h = hkv) and is the only case that splits KV;
    q=1 drops the causal mask. The split fills the kernel's CTA slots (``card.sms`` x
    ``ctas_per_sm``) in one wave (``decode_splits``)."""
    swapped = shape.q == 1 and shape.hq > shape.hkv and not shape.decode
    rows, heads = (shape.hq // shape.hkv, shape.hkv) if swapped else (shape.q, shape.hq)
    causal = shape.causal and shape.q > 1
    splits = 1
    if swapped:
        ctas = shape.b * heads * -(-rows // geometry["rows_per_cta"])
        splits = decode_splits(ctas, shape.kv, geometry["keys_per_iteration"], card.sms * ctas_per_sm)
    return {"rows": rows, "heads": heads, "causal": causal, "splits": splits, "swapped": swapped}


def visible_blocks(m: int, q: int, kv: int, causal: bool, rows: int, keys: int) -> int:
    """Key blocks CTA m of a q x kv sequence visits (sm70/mask.h visible_blocks, no window): all
    ceil(kv / keys), with the bottom-right causal mask at most ceil(((m + 1) rows + kv - q) / keys),
    none when that is <= 0."""
    blocks = -(-kv // keys)
    return max(0, min(blocks, -(-((m + 1) * rows + kv - q) // keys))) if causal else blocks


def sequences(shape: Shape) -> list[tuple[int, int]]:
    """(q, kv) of each sequence of the call in batch order: the decode rows (one query each)
    first, then the b prefill sequences."""
    return [(1, shape.dkv)] * shape.decode + [(shape.q, shape.kv)] * shape.b


def prefill_iterations(shape: Shape, rows: int, keys: int, splits: int = 1) -> tuple[list[int], int]:
    """Hot-loop iterations of each CTA that does work, in launch order (blockIdx.x = query block
    fastest, then sequence, then z = split x heads + head), and how many CTAs return at once (a
    query block past its sequence's rows). Split n of a CTA that sees blocks [0, v) takes blocks
    [n p, min(v, (n + 1) p)), p = ceil(v / splits); a CTA that sees none writes zeros (charged
    its code outside the loop, as unsplit)."""
    seqs = sequences(shape)
    m_blocks = -(-max(q for q, _ in seqs) // rows)
    its, idle = [], 0
    for n in range(splits):
        for _head in range(shape.hq):
            for q, kv in seqs:
                for m in range(m_blocks):
                    if m * rows >= q:
                        idle += 1
                        continue
                    v = visible_blocks(m, q, kv, shape.causal and q > 1, rows, keys)
                    per = -(-v // splits)
                    its.append(max(0, min(v, (n + 1) * per) - n * per))
    return its, idle


def io_bytes(shape: Shape) -> dict:
    """HBM bytes every exact-route call moves: Q and O (fp16), the LSE (fp32), K and V (fp16) of
    every sequence once (re-reads by the CTAs of other query blocks and heads hit L2), and the
    rows of q (heads x total_q, the rows a split's partials and the combine cover)."""
    tokens = shape.b * shape.q + shape.decode
    q_bytes = tokens * shape.hq * shape.d * 2
    kv_bytes = 2 * (shape.b * shape.kv + shape.decode * shape.dkv) * shape.hkv * shape.d * 2
    return {"q": q_bytes, "o": q_bytes, "lse": tokens * shape.hq * 4, "kv": kv_bytes, "rows": tokens * shape.hq}


def forward_launch(kernel: dict, iterations: list[int], hbm: float, streams: bool = False) -> KernelLaunch:
    """The forward kernel's launch: every CTA charged ``cheapest_hot_loop`` per iteration and its
    code outside the loop (timed) once; an FA2-style grid (the fitted cost per fused CTA).
    ``streams``: its K/V come from DRAM once (decode: memory.py's latency and ceiling)."""
    loop = cheapest_hot_loop(kernel)
    outside = kernel.get("outside")
    return KernelLaunch(
        kernel["kernel"],
        LoopMix(**loop["model_mix"]),
        tuple(iterations),
        kernel["geometry"]["warps"],
        kernel["occupancy"]["blocks_per_sm"],
        LoopMix(**outside["model_mix"]) if outside else LoopMix(),
        0 if outside else 1,
        hbm_bytes=hbm,
        fused=True,
        streams=streams,
    )


def dense_launches(shape: Shape, kernel: dict, card: Card) -> tuple[list[KernelLaunch], dict]:
    """The sm70-dense route's launches for ``shape``: the forward kernel and, for FA2's decode
    split, the combine kernel (its HBM traffic only)."""
    g = kernel["geometry"]
    plan = dense_plan(shape, g, card, kernel["occupancy"]["blocks_per_sm"])
    rows_cta, keys = g["rows_per_cta"], g["keys_per_iteration"]
    io = io_bytes(shape)
    if not plan["swapped"]:
        its, idle = prefill_iterations(shape, rows_cta, keys)
        plan["idle_ctas"] = idle
        # MHA decode: one CTA per sequence and head reads that head's K/V once, streamed (the decode
        # anchors' regime; a short prefill's single query block is left to the L2 model)
        once = shape.q == 1 and shape.hq == shape.hkv and not shape.decode
        return [forward_launch(kernel, its, io["q"] + io["o"] + io["lse"] + io["kv"], streams=once)], plan
    if plan["splits"] == 1:
        its = fa2_grid_iterations(plan["rows"], shape.kv, plan["causal"], rows_cta, keys, plan["heads"], shape.b)
    else:  # non-causal: each split takes ceil(blocks / splits) blocks; blockIdx.z = split * h + head
        blocks = -(-shape.kv // keys)
        per = -(-blocks // plan["splits"])
        its = [
            max(0, min(blocks, (s + 1) * per) - s * per)
            for s in range(plan["splits"])
            for _ in range(plan["heads"] * shape.b * -(-plan["rows"] // rows_cta))
        ]
    partials = plan["splits"] * shape.b * plan["heads"] * plan["rows"] * (shape.d * 4 + 4) if plan["splits"] > 1 else 0
    # decode: each K/V byte is read by one CTA, once: streamed from DRAM
    launches = [forward_launch(kernel, its, io["q"] + io["o"] + io["lse"] + io["kv"] + partials, streams=True)]
    if plan["splits"] > 1:
        launches.append(combine_bytes(partials + io["q"]))
    return launches, plan


def splitkv_launches(shape: Shape, kernel: dict, combine: dict, splits: int) -> tuple[list[KernelLaunch], dict]:
    """The exact route with ``splits``-way split-KV on a prefill call (q >= 2, as routing's
    split_fits): the forward kernel over splits x heads x sequences x query blocks, each split
    reading its CTA's Q and writing FP32 partials, then the combine (``combine_launch``)."""
    g = kernel["geometry"]
    its, idle = prefill_iterations(shape, g["rows_per_cta"], g["keys_per_iteration"], splits)
    io = io_bytes(shape)
    partials = splits * io["rows"] * (shape.d * 4 + 4)
    forward = forward_launch(kernel, its, splits * io["q"] + io["kv"] + partials)
    comb = combine_launch(combine, io["rows"], shape.d, partials + io["o"] + io["lse"])
    return [forward, comb], {
        "splits": splits,
        "idle_ctas": idle,
        "partial_bytes": partials,
        "combine_ctas": len(comb.iterations),
    }


def combine_bytes(hbm: float) -> KernelLaunch:
    """The decode split's combine charged only its HBM bytes (the partials read, O written)."""
    return KernelLaunch(COMBINE_KERNEL, LoopMix(), (), 4, 1, prologue_load_rounds=0, hbm_bytes=hbm)


def combine_launch(combine: dict, rows: int, d: int, hbm: float) -> KernelLaunch:
    """The combine kernel over ``rows`` output rows (heads x total_q): one warp per row, each CTA
    ``threads / 32`` rows; per warp ceil(d / 64) trips of its column loop (the SASS's main loop,
    timed; its loops over the splits counted once, as every inner loop without a known trip
    count), its other code timed once per CTA; ``hbm``: the partials read, O and the LSE written."""
    warps = combine["threads"] // 32
    ctas = -(-rows // warps)
    trips = -(-d // COMBINE_COLUMNS_PER_TRIP)
    return KernelLaunch(
        COMBINE_KERNEL,
        LoopMix(**combine["loop"]["model_mix"]),
        (trips,) * ctas,
        warps,
        combine["blocks_per_sm"],
        LoopMix(**combine["outside"]["model_mix"]),
        0,
        hbm,
    )


def cheapest_hot_loop(kernel: dict) -> dict:
    """The hot loop that every iteration is charged at: among the loops with the most HMMA the
    cheapest at the kernel's occupancy (the kernel runs each block through an unmasked or a
    masked body, with or without softcap/ALiBi code; the unmasked plain body is the common one)."""
    if not kernel["hot_loops"]:
        raise EnvironmentProblem(f"kernel {kernel['kernel']} has no hot loop (no loop with HMMA)")
    most = max(lp["mix"].get("hmma", 0) for lp in kernel["hot_loops"])
    return min(
        (lp for lp in kernel["hot_loops"] if lp["mix"].get("hmma", 0) == most),
        key=lambda lp: max(*lp["cycles"].values(), lp.get("critical_cycles", 0)),
    )
