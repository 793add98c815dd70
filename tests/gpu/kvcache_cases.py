# SPDX-License-Identifier: BSD-3-Clause
"""Run ONE case of ``_vllm_fa2_C.fwd_kvcache`` and print one JSON line.

    python tests/gpu/kvcache_cases.py <artifact.so> '<json spec>'

Run it with FA2PATCH_FORCE_SM70=1 to exercise the SM70 kernels on any GPU (the test suite does).
The spec (defaults in ``DEFAULTS``):

  cache          seqlens_k per sequence: the cache row after its last key (left padding included)
  seqlen_q       query rows per sequence (q is [batch, seqlen_q, hq, d])
  seqlen_new     new k/v rows appended per sequence (0: none)
  capacity       cache rows per sequence (default: max(cache) + seqlen_new + 3)
  hq, hkv, d, causal, window, softcap, alibi, num_splits, scale, magnitude, repeats, seed
                 as in sm70_cases.py
  page_size      null: contiguous cache [batch, capacity, hkv, d]; else paged through block_table
  rotary_dim     0: none; else rotary_cos/sin of [capacity, rotary_dim / 2] (override the rows
                 with rotary_rows)
  interleaved    rotary pairs (2j, 2j+1) instead of (j, j + rotary_dim / 2)
  cache_batch_idx  true: the contiguous cache has 2 spare rows and sequences use a permutation
  leftpad        list per sequence, or null
  with_seqlens_k false: seqlens_k is None (every sequence attends to its whole cache)
  dtype          "float16" (default) or "bfloat16"
  expect_error   true: the call must raise; overrides of seqlens_k, cache_batch_idx, leftpad
                 values through bad_seqlens_k / bad_cache_batch_idx / bad_leftpad, and a block
                 table entry through bad_block_table [sequence, column, value]

Reference, independent of the kernel: the new keys rotated in FP32 at rows seqlens_k + t,
queries at seqlens_k + i when the attention is causal or local (else at seqlens_k), as FA2
defines; then FP32 attention over cache rows [leftpad, seqlens_k + seqlen_new) of the cache row
cache_batch_idx[b]. Output: the numerics of sm70_cases.py plus cache_ok (the appended rows hold
the rotated new k/v, every other cache element is unchanged) and cache_max_err.
"""

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

from fa2patch.common import numerics
from sm70_cases import (
    _first_line,
    error_of,
    fa2_mask,
    harness_main,
    run_mode,
    run_op_only,
    run_script,
    switch_decode_kernel,
    track_worst,
    verdict,
    with_defaults,
)

DEFAULTS = {
    "cache": None,
    "seqlen_q": 1,
    "seqlen_new": 0,
    "capacity": None,
    "hq": 8,
    "hkv": 2,
    "d": 128,
    "causal": True,
    "window": [-1, -1],
    "softcap": 0.0,
    "alibi": False,
    "num_splits": 0,
    "scale": None,
    "magnitude": 1.0,
    "repeats": 1,
    "seed": 0,
    "page_size": None,
    "rotary_dim": 0,
    "rotary_rows": None,
    "interleaved": False,
    "cache_batch_idx": False,
    "leftpad": None,
    "with_seqlens_k": True,
    "dtype": "float16",
    "expect_error": False,
    "bad_seqlens_k": None,
    "bad_cache_batch_idx": None,
    "bad_leftpad": None,
    "bad_block_table": None,
    "decode_kernel": False,
}
SPARE_BLOCKS = 3


def _spec(raw: dict) -> dict:
    spec = with_defaults(raw, DEFAULTS, "cache")
    if spec["capacity"] is None:
        spec["capacity"] = max(spec["cache"]) + spec["seqlen_new"] + 3
    return spec


def build_inputs(spec: dict) -> dict:
    import torch

    torch.manual_seed(spec["seed"])
    dev, dtype = ("cuda" if torch.cuda.is_available() else "cpu"), getattr(torch, spec["dtype"])
    batch, sq, new = len(spec["cache"]), spec["seqlen_q"], spec["seqlen_new"]
    hq, hkv, d, page = spec["hq"], spec["hkv"], spec["d"], spec["page_size"]
    mag = float(spec["magnitude"])
    x = {"q": (torch.randn(batch, sq, hq, d, device=dev) * mag).to(dtype), "block_table": None, "cache_batch_idx": None}
    if page is None:
        span = spec["capacity"]
        rows = batch + (2 if spec["cache_batch_idx"] else 0)
        shape = (rows, span, hkv, d)
        if spec["cache_batch_idx"]:
            x["cache_batch_idx"] = torch.randperm(rows)[:batch].to(torch.int32).to(dev)
    else:
        per_seq = -(-spec["capacity"] // page)
        span = per_seq * page
        num_blocks = batch * per_seq + SPARE_BLOCKS
        shape = (num_blocks, page, hkv, d)
        x["block_table"] = torch.randperm(num_blocks)[: batch * per_seq].view(batch, per_seq).to(torch.int32).to(dev)
    x["span"] = span  # keys a sequence can address: FA2's seqlen_k of the call
    x["kcache"] = (torch.randn(shape, device=dev) * mag).to(dtype)
    x["vcache"] = torch.randn(shape, device=dev).to(dtype)
    x["knew"] = (torch.randn(batch, new, hkv, d, device=dev) * mag).to(dtype) if new else None
    x["vnew"] = torch.randn(batch, new, hkv, d, device=dev).to(dtype) if new else None
    x["seqlens_k"] = torch.tensor(spec["cache"], dtype=torch.int32, device=dev) if spec["with_seqlens_k"] else None
    x["leftpad"] = torch.tensor(spec["leftpad"], dtype=torch.int32, device=dev) if spec["leftpad"] else None
    x["cos"] = x["sin"] = None
    if spec["rotary_dim"]:
        rows = spec["rotary_rows"] or span
        inv_freq = 1.0 / 10000 ** (torch.arange(0, spec["rotary_dim"], 2, device=dev).float() / spec["rotary_dim"])
        angles = torch.arange(rows, device=dev).float().view(-1, 1) * inv_freq.view(1, -1)
        x["cos"], x["sin"] = angles.cos().to(dtype), angles.sin().to(dtype)
    x["alibi"] = (torch.rand(hq, device=dev) * 0.998 + 0.001).float() if spec["alibi"] else None
    x["scale"] = float(spec["scale"]) if spec["scale"] is not None else d**-0.5
    for key, name in (
        ("bad_seqlens_k", "seqlens_k"),
        ("bad_cache_batch_idx", "cache_batch_idx"),
        ("bad_leftpad", "leftpad"),
    ):
        if spec[key] is not None:
            x[name] = torch.tensor(spec[key], dtype=torch.int32, device=dev)
    if spec["bad_block_table"] is not None:
        b, j, value = spec["bad_block_table"]
        x["block_table"][b, j] = int(value)
    return x


def call_op(op, spec, x, out):
    window = spec["window"]
    return op(
        x["q"],
        x["kcache"],
        x["vcache"],
        x["knew"],
        x["vnew"],
        x["seqlens_k"],
        x["cos"],
        x["sin"],
        x["cache_batch_idx"],
        x["leftpad"],
        x["block_table"],
        x["alibi"],
        out,
        x["scale"],
        bool(spec["causal"]),
        int(window[0]),
        int(window[1]),
        float(spec["softcap"]),
        bool(spec["interleaved"]),
        int(spec["num_splits"]),
    )


def new_out(x):
    """``out`` between two NaN guard sequences of the same allocation."""
    import torch

    q = x["q"]
    buf = torch.full((q.shape[0] + 2, *q.shape[1:]), float("nan"), dtype=q.dtype, device=q.device)
    return buf, buf[1:-1]


def rotate(t, cos, sin, interleaved):
    """Rotary embedding in FP32 of t [rows, heads, d] with cos/sin [rows, rotary_dim / 2]; one
    rounding to t's dtype."""
    import torch

    rd = 2 * cos.shape[-1]
    f = t.float()
    c, s = cos.float().unsqueeze(1), sin.float().unsqueeze(1)
    if interleaved:
        x1, x2 = f[..., 0:rd:2], f[..., 1:rd:2]
        rot = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    else:
        x1, x2 = f[..., : rd // 2], f[..., rd // 2 : rd]
        rot = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return torch.cat((rot, f[..., rd:]), dim=-1).to(t.dtype)


def cache_rows(spec, x, cache, b, rows):
    """Views of cache rows `rows` (a range) of sequence b: contiguous, or through the block table."""
    page = spec["page_size"]
    if page is None:
        cb = int(x["cache_batch_idx"][b]) if x["cache_batch_idx"] is not None else b
        return cache[cb, rows.start : rows.stop]
    import torch

    table = x["block_table"][b].tolist()
    return torch.stack([cache[table[r // page], r % page] for r in rows]) if len(rows) else cache[0, :0]


def put_rows(spec, x, cache, b, start, rows):
    """Write rows [start, start + len(rows)) of sequence b into a cache (contiguous or paged)."""
    page = spec["page_size"]
    for t in range(rows.shape[0]):
        r = start + t
        if page is None:
            cb = int(x["cache_batch_idx"][b]) if x["cache_batch_idx"] is not None else b
            cache[cb, r] = rows[t]
        else:
            cache[int(x["block_table"][b, r // page]), r % page] = rows[t]


def expected(spec, x, k0, v0):
    """Per sequence: (rotated q, keys, values) after the append, and the expected caches."""
    import torch

    batch, sq, new = len(spec["cache"]), spec["seqlen_q"], spec["seqlen_new"]
    causal, (left, right) = bool(spec["causal"]) and (sq > 1 or spec["alibi"]), spec["window"]
    right = 0 if causal else right
    per_row = (0 <= left < x["span"]) or (0 <= right < x["span"])
    k_exp, v_exp = k0.clone(), v0.clone()
    seqs = []
    for b in range(batch):
        end = int(x["seqlens_k"][b]) if x["seqlens_k"] is not None else x["span"]
        pad = int(x["leftpad"][b]) if x["leftpad"] is not None else 0
        q = x["q"][b]
        if new:
            knew, vnew = x["knew"][b], x["vnew"][b]
            if spec["rotary_dim"]:
                knew = rotate(knew, x["cos"][end : end + new], x["sin"][end : end + new], spec["interleaved"])
                pos = torch.arange(sq, device=q.device) + end if per_row else torch.full((sq,), end, device=q.device)
                q = rotate(q, x["cos"][pos], x["sin"][pos], spec["interleaved"])
            put_rows(spec, x, k_exp, b, end, knew)
            put_rows(spec, x, v_exp, b, end, vnew)
        keys = cache_rows(spec, x, k_exp, b, range(pad, end + new))
        values = cache_rows(spec, x, v_exp, b, range(pad, end + new))
        seqs.append((q, keys, values))
    return seqs, k_exp, v_exp


def run_numerics(op, spec, x) -> dict:
    import torch

    from fa2patch.measure.reference import attention_ref, compare

    k0, v0 = x["kcache"].clone(), x["vcache"].clone()
    q0 = x["q"].clone()
    buf, out = new_out(x)
    try:
        ret = call_op(op, spec, x, out)
        torch.cuda.synchronize()
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": _first_line(exc), "ok": False, "finite": False}
    result = {"raised": None}
    lse = ret[1]
    result["returns_out"] = bool(ret[0].data_ptr() == out.data_ptr() and ret[0].shape == out.shape)
    result["guard_ok"] = bool(torch.isnan(buf[0]).all() and torch.isnan(buf[-1]).all())
    result["inputs_unchanged"] = bool(torch.equal(q0, x["q"]))

    seqs, k_exp, v_exp = expected(spec, x, k0, v0)
    err = max(
        (x["kcache"].float() - k_exp.float()).abs().max().item(),
        (x["vcache"].float() - v_exp.float()).abs().max().item(),
    )
    # Appended rows: one fp16 rounding of an FP32 rotation (1 ulp of slack for the operation
    # order); every other element bitwise unchanged.
    touched = (k_exp != k0) | (v_exp != v0)
    same_elsewhere = bool(((x["kcache"] == k0) | touched).all() and ((x["vcache"] == v0) | touched).all())
    close = bool(
        torch.allclose(x["kcache"].float(), k_exp.float(), rtol=2e-3, atol=2e-3) and torch.equal(x["vcache"], v_exp)
    )
    result["cache_max_err"] = err
    result["cache_ok"] = same_elsewhere and close

    if spec["repeats"] > 1:
        same = True
        for _ in range(spec["repeats"] - 1):
            _, out2 = new_out(x)
            ret2 = call_op(op, spec, x, out2)
            torch.cuda.synchronize()
            same &= torch.equal(out2.view(torch.int16), out.view(torch.int16)) and torch.equal(ret2[1], lse)
        result["deterministic"] = bool(same)

    mask = fa2_mask(spec, spec["seqlen_q"], x["span"])
    worst, lse_max_err = None, 0.0
    ok, num, den = True, 0.0, 0.0
    for b, (q, keys, values) in enumerate(seqs):
        kw = {
            "causal": mask[0],
            "window": tuple(mask[1]),
            "softcap": float(spec["softcap"]),
            "alibi_slopes": x["alibi"],
        }
        ref, lse_ref = attention_ref(q, keys, values, x["scale"], **kw)
        ref16, _ = attention_ref(q, keys, values, x["scale"], compute_dtype=torch.float16, **kw)
        c = compare(out[b], ref, ref16)
        ok &= c["ok"]
        worst = track_worst(worst, c)
        num += torch.linalg.vector_norm(torch.nan_to_num(out[b].float() - ref, nan=math.inf)).item() ** 2
        den += torch.linalg.vector_norm(ref).item() ** 2
        got = lse[b].reshape(lse_ref.shape)
        inf_ok = bool((got[torch.isposinf(lse_ref)] == math.inf).all())
        fin = ~torch.isposinf(lse_ref)
        e = torch.nan_to_num((got[fin] - lse_ref[fin]).abs(), nan=math.inf)
        lse_max_err = max(lse_max_err, e.max().item() if e.numel() else 0.0, 0.0 if inf_ok else math.inf)
    result.update(track_worst(worst, None))
    result["lse_max_err"] = lse_max_err
    result["lse_ok"] = lse_max_err <= numerics.LSE_ABS_MAX
    result["rel_l2"] = math.sqrt(num) / max(math.sqrt(den), 1e-30)
    result["finite"] = bool(torch.isfinite(out.float()).all())
    result["ok"] = verdict(result, ok, "cache_ok")
    return result


def run_error(op, spec, x) -> dict:
    import torch

    k0, v0 = x["kcache"].clone(), x["vcache"].clone()
    buf, out = new_out(x)
    out.fill_(7.0)
    result = error_of(lambda: call_op(op, spec, x, out), out.device)
    try:
        result["out_untouched"] = bool((out == 7.0).all())
        result["guard_ok"] = bool(torch.isnan(buf[0]).all() and torch.isnan(buf[-1]).all())
        result["cache_untouched"] = bool(torch.equal(k0, x["kcache"]) and torch.equal(v0, x["vcache"]))
    except Exception:
        result["out_untouched"] = result["guard_ok"] = result["cache_untouched"] = None
    return result


def run(ops, raw: dict) -> dict:
    spec = _spec(raw)
    switch_decode_kernel(spec)
    op = ops.fwd_kvcache
    x = build_inputs(spec)
    return run_mode(
        lambda: run_op_only(lambda out: call_op(op, spec, x, out), new_out(x)[1]),
        lambda: run_error(op, spec, x),
        lambda: run_numerics(op, spec, x),
        spec["expect_error"],
    )


def main(argv) -> int:
    return harness_main(argv, __doc__, run)


if __name__ == "__main__":
    run_script(main)
