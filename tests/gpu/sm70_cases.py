# SPDX-License-Identifier: BSD-3-Clause
"""Run ONE numerics case of ``_vllm_fa2_C.varlen_fwd`` and print one JSON line.

    python tests/gpu/sm70_cases.py <artifact.so> '<json spec>'

Run it with FA2PATCH_FORCE_SM70=1 to exercise the SM70 kernels on any GPU (the test suite does).
The spec (every key optional except ``seqlens``; defaults in ``DEFAULTS``):

  seqlens        [[seqlen_q, seqlen_k], ...] per sequence; 0 query rows and/or 0 keys allowed
  hq, hkv, d     query heads, KV heads, head dim
  causal         bool (bottom-right aligned when seqlen_q != seqlen_k)
  window         [left, right], -1 = unbounded
  softcap        float, 0 = off
  alibi          bool: slopes float32 [hq], uniform in (0, 1)
  page_size      null = contiguous k/v [total_k, hkv, d]; else a paged cache
                 [num_blocks, page_size, hkv, d] whose block ids are a random permutation,
                 with seqused_k = seqlen_k per sequence (vLLM's paged call)
  cu_seqlens_k   paged only: "cumulative" (default), "zeros", or "garbage" (random int32,
                 like vLLM's ``torch.empty_like(cu_seqlens_q)`` dummy: seqused_k must win)
  spare_blocks   paged only: unused blocks in the cache besides the ones the table uses
  num_splits     int, 0 = automatic
  scale          softmax scale, null = d ** -0.5
  magnitude      q and k are multiplied by it (10 gives scaled scores of magnitude ~100)
  strided        q is a view of a packed qkv tensor and k/v views of a packed kv tensor
                 (last dim contiguous, other strides not)
  poison         NaN in every cache slot no sequence uses (paged), or NaN rows after the last
                 key (contiguous): a kernel must never let unused slots reach the output
  repeats        N > 1: N calls, bitwise identical out and softmax_lse required ("deterministic")
  seed           torch.manual_seed
  ref_dtype      "float32" (default) or "float64": compute dtype of the accurate reference
  ref_chunk_elems  largest score block (heads x rows x keys) the reference materialises; longer
                 sequences are computed in chunks of query rows (needs a right window of 0)
  lse_tol        absolute tolerance on softmax_lse (default: the contract's, fa2patch.common.numerics)
  expect_error   true: the call is expected to raise; no reference, report the error instead
  bad_block_table  with expect_error: [sequence, block index, value] written into block_table
  bad_cu_seqlens_q, bad_cu_seqlens_k, bad_seqused_k  with expect_error: values that replace the
                 tensor's (int32)
  misaligned     with expect_error: "q" or "k": that tensor becomes a view whose rows start 2
                 bytes off a 16-byte boundary (last dim still contiguous)
  extra_blocks   extra (unused, zero) columns in block_table, like vLLM's padded tables
  vllm_cache     paged only: k and v are views of vLLM's (num_blocks, hkv, page_size, 2 d) cache
                 holding the same values (prefill_cases.vllm_views)
  prefill_splits N > 0 (default 1): the router's test hook _routing_prefill_splits_for_testing(N):
                 every call that split-KV can take (max_seqlen_q >= 2, keys) runs the exact route
                 with N splits; 1 keeps the numerics families on the unsplit exact kernel whatever
                 the built-in rule would pick (split-KV, long-prefill); 0: the router decides

Output (numerics): max_abs, rel_l2 (whole output), rel_l2_worst_seq, bar (FA2's, of the worst
sequence), ratio (max over sequences of max_abs / bar), lse_max_err, finite, guard_ok (no write
outside ``out``), returns_out, inputs_unchanged, ok, deterministic (with repeats), raised/message
(the op raised), routes (what route_stats() counted per route over the case's calls, on device 0),
seconds. Output (expect_error): raised, message, out_untouched, device_ok.
Exit code 0 whenever a JSON line was printed; 1 for a failure of this harness itself.
"""

import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

from fa2patch.common import numerics
from fa2patch.common.routes import DECODE_ENV

DEFAULTS = {
    "seqlens": None,
    "hq": 4,
    "hkv": 2,
    "d": 64,
    "causal": False,
    "window": [-1, -1],
    "softcap": 0.0,
    "alibi": False,
    "page_size": None,
    "cu_seqlens_k": "cumulative",
    "spare_blocks": 3,
    "extra_blocks": 0,
    "num_splits": 0,
    "scale": None,
    "magnitude": 1.0,
    "strided": False,
    "poison": False,
    "repeats": 1,
    "seed": 0,
    "ref_dtype": "float32",
    "ref_chunk_elems": 1 << 28,
    "lse_tol": numerics.LSE_ABS_MAX,
    "expect_error": False,
    "bad_block_table": None,
    "bad_cu_seqlens_q": None,
    "bad_cu_seqlens_k": None,
    "bad_seqused_k": None,
    "misaligned": None,
    "vllm_cache": False,
    "prefill_splits": 1,
    "decode_kernel": False,
}
GUARD_ROWS = 3  # NaN rows on each side of `out`, inside the same allocation
CONTIG_POISON_ROWS = 64


def with_defaults(raw: dict, defaults: dict, required: str) -> dict:
    """A case spec completed with the harness's defaults; unknown keys and an empty ``required``
    list are errors of the case, not results."""
    unknown = set(raw) - set(defaults) - {"id", "family"}
    if unknown:
        raise ValueError(f"unknown spec keys: {sorted(unknown)}")
    spec = {**defaults, **raw}
    if not spec[required]:
        raise ValueError(f"spec needs a non-empty {required} list")
    return spec


def _spec(raw: dict) -> dict:
    spec = with_defaults(raw, DEFAULTS, "seqlens")
    spec["seqlens"] = [(int(a), int(b)) for a, b in spec["seqlens"]]
    return spec


def switch_decode_kernel(spec: dict) -> None:
    """The decode kernel on (spec ``decode_kernel`` true), off (false) or left to routing's profile
    and rule (None: the switch unset) for this process's calls: the extension reads
    FA2PATCH_SM70_DECODE on every call."""
    if spec["decode_kernel"] is None:
        os.environ.pop(DECODE_ENV, None)
    else:
        os.environ[DECODE_ENV] = "1" if spec["decode_kernel"] else "0"


def _first_line(exc) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def build_inputs(spec: dict, device) -> dict:
    """Random fp16 inputs and every argument of varlen_fwd, for one spec."""
    import torch

    torch.manual_seed(spec["seed"])
    seqlens = spec["seqlens"]
    hq, hkv, d = spec["hq"], spec["hkv"], spec["d"]
    mag = float(spec["magnitude"])
    sq = [a for a, _ in seqlens]
    sk = [b for _, b in seqlens]
    total_q, total_k = sum(sq), sum(sk)

    def cum(xs):
        return torch.tensor([0] + [sum(xs[: i + 1]) for i in range(len(xs))], dtype=torch.int32, device=device)

    cu_q = cum(sq)

    if spec["strided"]:  # vLLM's q is a view of the qkv projection: [tokens, hq + 2 hkv, d]
        qkv = torch.randn(total_q, hq + 2 * hkv, d, device=device)
        qkv[:, :hq] *= mag
        q = qkv.half()[:, :hq]
    else:
        q = (torch.randn(total_q, hq, d, device=device) * mag).half()

    page = spec["page_size"]
    inputs = {"q": q, "cu_seqlens_q": cu_q, "seqused_k": None, "block_table": None}
    if page is None:
        rows = total_k + (CONTIG_POISON_ROWS if spec["poison"] else 0)
        if spec["strided"]:
            kv = torch.randn(rows, 2, hkv, d, device=device)
            kv[:, 0] *= mag
            kv = kv.half()
            k, v = kv[:, 0], kv[:, 1]
        else:
            k = (torch.randn(rows, hkv, d, device=device) * mag).half()
            v = torch.randn(rows, hkv, d, device=device).half()
        if spec["poison"]:
            k[total_k:] = float("nan")
            v[total_k:] = float("nan")
        inputs.update(k=k, v=v, cu_seqlens_k=cum(sk))
    else:
        nblocks = [-(-n // page) for n in sk]
        num_blocks = sum(nblocks) + int(spec["spare_blocks"])
        max_blocks = max([*nblocks, 1]) + int(spec["extra_blocks"])
        perm = torch.randperm(num_blocks).tolist()
        table = torch.zeros(len(seqlens), max_blocks, dtype=torch.int32)
        used = torch.zeros(num_blocks, page, dtype=torch.bool)
        at = 0
        for b, (n, nb) in enumerate(zip(sk, nblocks, strict=True)):
            ids = perm[at : at + nb]
            at += nb
            table[b, :nb] = torch.tensor(ids, dtype=torch.int32)
            for j, blk in enumerate(ids):
                used[blk, : min(page, n - j * page)] = True
        if spec["strided"]:  # one allocation for both caches: batch stride 2 * page * hkv * d
            kv = torch.randn(num_blocks, 2, page, hkv, d, device=device)
            kv[:, 0] *= mag
            kv = kv.half()
            k, v = kv[:, 0], kv[:, 1]
        else:
            k = (torch.randn(num_blocks, page, hkv, d, device=device) * mag).half()
            v = torch.randn(num_blocks, page, hkv, d, device=device).half()
        if spec["poison"]:
            unused = (~used).to(device)
            k[unused] = float("nan")
            v[unused] = float("nan")
        mode = spec["cu_seqlens_k"]
        if mode == "cumulative":
            cu_k = cum(sk)
        elif mode == "zeros":
            cu_k = torch.zeros(len(seqlens) + 1, dtype=torch.int32, device=device)
        elif mode == "garbage":
            cu_k = torch.randint(-(2**31), 2**31 - 1, (len(seqlens) + 1,), dtype=torch.int32, device=device)
        else:
            raise ValueError(f"cu_seqlens_k mode {mode!r}")
        if spec["bad_block_table"] is not None:
            b, j, value = spec["bad_block_table"]
            if value == "num_blocks":
                value = num_blocks
            table[b, j] = int(value)
        inputs.update(
            k=k,
            v=v,
            cu_seqlens_k=cu_k,
            block_table=table.to(device),
            seqused_k=torch.tensor(sk, dtype=torch.int32, device=device),
            num_blocks=num_blocks,
        )
    for key, name in (
        ("bad_cu_seqlens_q", "cu_seqlens_q"),
        ("bad_cu_seqlens_k", "cu_seqlens_k"),
        ("bad_seqused_k", "seqused_k"),
    ):
        if spec[key] is not None:
            inputs[name] = torch.tensor(spec[key], dtype=torch.int32, device=device)
    if spec["misaligned"] is not None:  # same values, rows 2 bytes off: a [..., 1:] view of a wider tensor
        t = inputs[spec["misaligned"]]
        wide = torch.zeros(*t.shape[:-1], t.shape[-1] + 1, dtype=t.dtype, device=device)
        wide[..., 1:] = t
        inputs[spec["misaligned"]] = wide[..., 1:]
    inputs["alibi_slopes"] = (torch.rand(hq, device=device) * 0.998 + 0.001).float() if spec["alibi"] else None
    inputs["scale"] = float(spec["scale"]) if spec["scale"] is not None else d**-0.5
    inputs["max_seqlen_q"] = max(sq)
    inputs["max_seqlen_k"] = max(sk)
    inputs["total_q"] = total_q
    return inputs


def new_out(inputs, hq, d):
    """``out`` inside a NaN allocation with guard rows on both sides."""
    import torch

    buf = torch.full(
        (inputs["total_q"] + 2 * GUARD_ROWS, hq, d), float("nan"), dtype=torch.float16, device=inputs["q"].device
    )
    return buf, buf[GUARD_ROWS : GUARD_ROWS + inputs["total_q"]]


def call_op(op, spec, inputs, out):
    """varlen_fwd, positionally, with the 22 arguments of vLLM's schema."""
    window = spec["window"]
    return op(
        inputs["q"],
        inputs["k"],
        inputs["v"],
        out,
        inputs["cu_seqlens_q"],
        inputs["cu_seqlens_k"],
        inputs["seqused_k"],
        None,
        inputs["block_table"],
        inputs["alibi_slopes"],
        inputs["max_seqlen_q"],
        inputs["max_seqlen_k"],
        0.0,
        inputs["scale"],
        False,
        bool(spec["causal"]),
        int(window[0]),
        int(window[1]),
        float(spec["softcap"]),
        False,
        int(spec["num_splits"]),
        None,
    )


def gather_keys(spec, inputs, b):
    """Keys and values of sequence b, read independently of the kernel (block table on the host)."""
    sk = spec["seqlens"][b][1]
    k, v = inputs["k"], inputs["v"]
    page = spec["page_size"]
    if page is None:
        start = sum(n for _, n in spec["seqlens"][:b])
        return k[start : start + sk], v[start : start + sk]
    nb = -(-sk // page)
    ids = [int(x) for x in inputs["block_table"][b, :nb].tolist()]
    if not ids:
        return k[:0, 0], v[:0, 0]
    import torch

    kk = torch.cat([k[i] for i in ids], dim=0)[:sk]
    vv = torch.cat([v[i] for i in ids], dim=0)[:sk]
    return kk, vv


def fa2_mask(spec, max_seqlen_q, max_seqlen_k):
    """(causal, window) as FA2's host code leaves them for the kernel (flash_api.cpp, 2.8.3).

    It matters for ALiBi: FA2's kernels add ``slope * j`` when ``params.is_causal``, which
    set_params_fprop defines as ``window_left < 0 && window_right == 0`` after mha_varlen_fwd
    has (1) dropped causal for max_seqlen_q == 1 without ALiBi, (2) set window_right = 0 for
    causal, (3) turned windows >= max_seqlen_k into -1. So causal with a left window uses
    ``-slope * |i - j|`` (the same softmax, another softmax_lse), and a non-causal (-1, 0)
    window uses ``slope * j``. The masks themselves are unchanged by this normalisation.
    """
    causal = bool(spec["causal"])
    left, right = (int(x) for x in spec["window"])
    if max_seqlen_q == 1 and not spec["alibi"]:
        causal = False
    if causal:
        right = 0
    if left >= max_seqlen_k:
        left = -1
    if right >= max_seqlen_k:
        right = -1
    if left < 0 and right == 0:
        return True, (-1, -1)
    return False, (left, right)


def reference(spec, q, k, v, scale, alibi, dtype, mask=None):
    """attention_ref on one sequence, in chunks of query rows when the score block is large.

    ``mask`` is (causal, window) as the kernel sees them (``fa2_mask``); default: the spec's."""
    from fa2patch.measure.reference import attention_ref_chunked

    causal, window = mask if mask is not None else (bool(spec["causal"]), tuple(spec["window"]))
    return attention_ref_chunked(
        q,
        k,
        v,
        scale,
        causal=causal,
        window=tuple(window),
        softcap=float(spec["softcap"]),
        alibi_slopes=alibi,
        compute_dtype=dtype,
        max_elems=int(spec["ref_chunk_elems"]),
    )


def track_worst(worst: dict | None, c: dict | None) -> dict:
    """The running worst over a case's sequences of reference.compare's results: FA2's bar ratio
    (with the bar it was measured against), max abs, the worst sequence's relative L2. Non-finite
    values count as infinite. Start with None; ``c`` None: nothing compared yet."""
    w = worst or {"max_abs": 0.0, "ratio": 0.0, "bar": None, "rel_l2_worst_seq": 0.0}
    if c is None:
        return w
    finite = math.isfinite(c["max_abs"])
    ratio = c["max_abs"] / c["bar"] if finite else math.inf
    if w["bar"] is None or not ratio <= w["ratio"]:
        w["ratio"], w["bar"] = ratio, c["bar"]
    w["max_abs"] = max(w["max_abs"], c["max_abs"]) if finite else math.inf
    w["rel_l2_worst_seq"] = max(w["rel_l2_worst_seq"], c["rel_l2"])
    return w


# What every numerics case must show besides its sequences being within FA2's bar.
CASE_CHECKS = ("finite", "lse_ok", "guard_ok", "returns_out", "inputs_unchanged")


def verdict(result: dict, sequences_ok: bool, *extra: str) -> bool:
    """The case's verdict (the numerics contract, docs/DESIGN.md §7): every sequence within FA2's
    bar, the whole output's relative L2 within the contract, CASE_CHECKS and the ``extra`` checks of
    ``result`` true, and bitwise repeatable where repeats ran."""
    return bool(
        sequences_ok
        and result["rel_l2"] <= numerics.REL_L2_MAX
        and all(result[k] for k in (*CASE_CHECKS, *extra))
        and result.get("deterministic", True)
    )


def run_numerics(op, spec, inputs) -> dict:
    import torch

    from fa2patch.measure.reference import compare

    hq, d = spec["hq"], spec["d"]
    snapshot = [t.clone() for t in (inputs["q"], inputs["k"], inputs["v"])]
    buf, out = new_out(inputs, hq, d)
    t0 = time.perf_counter()
    try:
        ret = call_op(op, spec, inputs, out)
        torch.cuda.synchronize()
    except Exception as exc:  # the op's typed error, reported, not a harness failure
        return {"raised": type(exc).__name__, "message": _first_line(exc), "ok": False, "finite": False}
    seconds = time.perf_counter() - t0
    lse = ret[1] if isinstance(ret, (list, tuple)) and len(ret) >= 2 else None
    result = {"raised": None, "seconds_op": round(seconds, 4)}
    result["returns_out"] = bool(
        isinstance(ret, (list, tuple))
        and len(ret) == 2
        and ret[0].data_ptr() == out.data_ptr()
        and ret[0].shape == out.shape
    )
    result["guard_ok"] = bool(
        torch.isnan(buf[:GUARD_ROWS]).all() and torch.isnan(buf[GUARD_ROWS + out.shape[0] :]).all()
    )
    result["inputs_unchanged"] = all(
        torch.equal(a.view(torch.int16), b.view(torch.int16))
        for a, b in zip(snapshot, (inputs["q"], inputs["k"], inputs["v"]), strict=True)
    )

    # Determinism: fresh NaN outputs each time, bitwise comparison.
    if spec["repeats"] > 1:
        same = True
        try:
            for _ in range(spec["repeats"] - 1):
                _, out2 = new_out(inputs, hq, d)
                ret2 = call_op(op, spec, inputs, out2)
                torch.cuda.synchronize()
                same &= torch.equal(out2.view(torch.int16), out.view(torch.int16))
                same &= lse is not None and torch.equal(ret2[1], lse)
        except Exception as exc:
            same = False
            result["repeat_raised"] = f"{type(exc).__name__}: {_first_line(exc)}"
        result["deterministic"] = bool(same)

    # Reference, sequence by sequence.
    ref_dtype = getattr(torch, spec["ref_dtype"])
    seqlens = spec["seqlens"]
    cu_q = [0]
    for a, _ in seqlens:
        cu_q.append(cu_q[-1] + a)
    ref_full = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
    lse_ref = torch.full((hq, out.shape[0]), math.inf, dtype=torch.float32, device=out.device)
    worst = None
    ok = True
    seq_fail = []
    mask = fa2_mask(spec, inputs["max_seqlen_q"], inputs["max_seqlen_k"])
    for b, (sq, sk) in enumerate(seqlens):
        if sq == 0:
            continue
        qb = inputs["q"][cu_q[b] : cu_q[b + 1]]
        kb, vb = gather_keys(spec, inputs, b)
        ref, lse_b = reference(spec, qb, kb, vb, inputs["scale"], inputs["alibi_slopes"], ref_dtype, mask)
        ref16, _ = reference(spec, qb, kb, vb, inputs["scale"], inputs["alibi_slopes"], torch.float16, mask)
        c = compare(out[cu_q[b] : cu_q[b + 1]], ref, ref16)
        ref_full[cu_q[b] : cu_q[b + 1]] = ref
        lse_ref[:, cu_q[b] : cu_q[b + 1]] = lse_b
        worst = track_worst(worst, c)
        if not c["ok"]:
            ok = False
            seq_fail.append({"seq": b, "seqlen_q": sq, "seqlen_k": sk, **c})
        del ref, ref16
    outf = out.float()
    finite = bool(torch.isfinite(outf).all())
    diff = torch.nan_to_num(outf - ref_full, nan=math.inf)
    result["rel_l2"] = (torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(ref_full).clamp_min(1e-30)).item()
    worst = track_worst(worst, None)  # a case without query rows has compared nothing
    if not finite:
        worst["max_abs"] = math.inf
        worst["ratio"] = math.inf
    result.update(worst)
    result["finite"] = finite
    result["failed_seqs"] = seq_fail[:8]

    # softmax_lse: fp32 [hq, total_q]; +inf exactly where the reference row has no key.
    tol = float(spec["lse_tol"])
    if lse is None or lse.dtype != torch.float32 or list(lse.shape) != [hq, out.shape[0]]:
        result["lse_shape"] = None if lse is None else [str(lse.dtype), list(lse.shape)]
        result["lse_max_err"] = math.inf
    else:
        empty = torch.isposinf(lse_ref)
        inf_ok = bool((lse[empty] == math.inf).all())
        fin = ~empty
        err = (lse[fin] - lse_ref[fin]).abs()
        err = torch.nan_to_num(err, nan=math.inf)
        result["lse_max_err"] = err.max().item() if err.numel() else 0.0
        result["lse_empty_rows_inf"] = inf_ok
        if not inf_ok:
            result["lse_max_err"] = math.inf
    result["lse_ok"] = result["lse_max_err"] <= tol
    result["ok"] = verdict(result, ok)
    return result


def run_op_only(call, out) -> dict:
    """Only the op and a synchronisation, for compute-sanitizer racecheck (FA2PATCH_OP_ONLY=1): the
    reference's cuBLAS kernels are not under test there."""
    import torch

    try:
        call(out)
        torch.cuda.synchronize()
        return {"op_only": True, "raised": None}
    except Exception as exc:
        return {"op_only": True, "raised": type(exc).__name__, "message": _first_line(exc)}


def error_of(call, device) -> dict:
    """``call()``, which should raise: its error, and whether the process and the device are
    still usable after it."""
    import torch

    result = {"raised": None, "message": None}
    try:
        call()
        torch.cuda.synchronize()
    except Exception as exc:
        result.update(raised=type(exc).__name__, message=_first_line(exc))
    try:
        torch.cuda.synchronize()
        result["device_ok"] = torch.ones(4, device=device).sum().item() == 4.0
    except Exception as exc:
        result["device_ok"] = False
        result["device_error"] = f"{type(exc).__name__}: {_first_line(exc)}"
    return result


def run_error(op, spec, inputs) -> dict:
    import torch

    buf, out = new_out(inputs, spec["hq"], spec["d"])
    out.fill_(7.0)
    result = error_of(lambda: call_op(op, spec, inputs, out), out.device)
    try:
        result["out_untouched"] = bool((out == 7.0).all())
        result["guard_ok"] = bool(
            torch.isnan(buf[:GUARD_ROWS]).all() and torch.isnan(buf[GUARD_ROWS + out.shape[0] :]).all()
        )
    except Exception:
        result["out_untouched"] = result["guard_ok"] = None
    return result


def main(argv) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    artifact, raw = argv[1], json.loads(argv[2])
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    spec = _spec(raw)
    switch_decode_kernel(spec)
    if artifact == "reference-op":  # harness self-test: an exact op written from the reference
        op, device = _reference_op, ("cuda" if torch.cuda.is_available() else "cpu")
        if device == "cpu":
            torch.cuda.synchronize = lambda *a, **k: None
    else:
        torch.ops.load_library(artifact)
        op, device = torch.ops._vllm_fa2_C.varlen_fwd, "cuda"
        if spec["prefill_splits"] and hasattr(torch.ops._vllm_fa2_C, "_routing_prefill_splits_for_testing"):
            torch.ops._vllm_fa2_C._routing_prefill_splits_for_testing(int(spec["prefill_splits"]))
    t0 = time.perf_counter()
    inputs = build_inputs(spec, device)
    if spec["vllm_cache"]:
        import prefill_cases

        prefill_cases.vllm_views(spec, inputs)
    before = route_counts(device)
    if os.environ.get("FA2PATCH_OP_ONLY") == "1":  # racecheck: our kernels only, no reference GEMMs
        result = run_op_only(lambda out: call_op(op, spec, inputs, out), new_out(inputs, spec["hq"], spec["d"])[1])
    else:
        result = run_error(op, spec, inputs) if spec["expect_error"] else run_numerics(op, spec, inputs)
    after = route_counts(device)
    if after is not None:
        result["routes"] = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
    result["seconds"] = round(time.perf_counter() - t0, 3)
    print(json.dumps(result))
    return 0


def route_counts(device):
    """route_stats()'s calls per route on device 0 (patch 0004), or None without the op or a GPU."""
    import torch

    if device != "cuda" or not hasattr(torch.ops._vllm_fa2_C, "route_stats"):
        return None
    return json.loads(torch.ops._vllm_fa2_C.route_stats())["devices"]["0"]["routes"]


def _reference_op(
    q,
    k,
    v,
    out,
    cu_q,
    cu_k,
    seqused_k,
    leftpad_k,
    block_table,
    alibi,
    max_sq,
    max_sk,
    p_dropout,
    scale,
    zero_tensors,
    causal,
    wl,
    wr,
    softcap,
    return_softmax,
    num_splits,
    gen,
):
    """A slow exact stand-in for the kernel, to check this harness without a GPU (not a reference:
    it reads the paged cache its own way, through seqused_k, and ignores cu_seqlens_k then)."""
    import torch

    from fa2patch.measure.reference import attention_ref

    hq, d = q.shape[1], q.shape[2]
    if d > 256 or d % 8 or hq % k.shape[-2]:
        raise RuntimeError("bad shape")
    causal, (wl, wr) = fa2_mask({"causal": causal, "window": (wl, wr), "alibi": alibi is not None}, max_sq, max_sk)
    lse = torch.empty(hq, q.shape[0], dtype=torch.float32, device=q.device)
    cq = cu_q.tolist()
    for b in range(len(cq) - 1):
        if block_table is not None:
            n = int(seqused_k[b])
            page = k.shape[1]
            idx = [int(block_table[b, t // page]) * page + t % page for t in range(n)]
            if any(i < 0 or i >= k.shape[0] * page for i in idx):
                raise IndexError("block_table entry out of range")
            kb, vb = k.reshape(-1, *k.shape[2:])[idx], v.reshape(-1, *v.shape[2:])[idx]
        else:
            ck = cu_k.tolist()
            kb, vb = k[ck[b] : ck[b + 1]], v[ck[b] : ck[b + 1]]
        o, lse_b = attention_ref(q[cq[b] : cq[b + 1]], kb, vb, scale, causal, (wl, wr), softcap, alibi)
        out[cq[b] : cq[b + 1]] = o.half()
        lse[:, cq[b] : cq[b + 1]] = lse_b
    return [out, lse]


def harness_main(argv, doc: str, run) -> int:
    """The entry of a case harness, ``<artifact.so> '<json spec>'``: loads the extension (TF32
    off, so the FP32 reference is FP32), calls ``run(torch.ops._vllm_fa2_C, spec)`` and prints
    its result, with the seconds it took, as one JSON line."""
    if len(argv) != 3:
        print(doc, file=sys.stderr)
        return 2
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    spec = json.loads(argv[2])
    torch.ops.load_library(argv[1])
    t0 = time.perf_counter()
    result = run(torch.ops._vllm_fa2_C, spec)
    result["seconds"] = round(time.perf_counter() - t0, 3)
    print(json.dumps(result))
    return 0


def run_mode(op_only, error, numerics, expect_error: bool) -> dict:
    """Our kernels alone under racecheck (FA2PATCH_OP_ONLY=1: no reference GEMMs), else the
    bad-input or the numerics check."""
    if os.environ.get("FA2PATCH_OP_ONLY") == "1":
        return op_only()
    return error() if expect_error else numerics()


def run_script(main) -> None:
    """Exit with main's status; a failure of the harness itself prints its traceback, exit 1."""
    try:
        sys.exit(main(sys.argv))
    except Exception:
        traceback.print_exc()
        sys.exit(1)


if __name__ == "__main__":
    run_script(main)
