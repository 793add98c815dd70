# SPDX-License-Identifier: BSD-3-Clause
"""Run ONE case of ``_vllm_fa2_C.gqa_prefill_fwd`` (the long-prefill route) and print one JSON line.

    python tests/gpu/prefill_cases.py <artifact.so> '<json spec>'

The op takes one sequence, causal, head dim 256. The spec is sm70_cases.py's (``seqlens`` holds
one [seqlen_q, seqlen_k]; inputs, the FP32 reference, the checks and the output keys are that
harness's, through an adapter with varlen_fwd's arguments) plus:

  dominated      null; "first": every query row is dominated by key 0 (scores ~100 against ~1,
                 key 0 visible to every row); "diagonal": rows of the first head of each group
                 are dominated by their own diagonal key (~100), the last key they see
  vllm_cache     paged only: k and v are the views vLLM passes, ``kv.transpose(1, 2).split(d, -1)``
                 of a (num_blocks, hkv, page_size, 2 d) cache (row stride 2 d), same values
  workspace      "nan": a preallocated workspace of gqa_prefill_workspace_bytes bytes filled with
                 NaN (the op must never read what it did not write); "short": one byte too few;
                 null: the op allocates its own
  dtype          "float16" (default) or "bfloat16" (bad input)
  seqlen_k_extra the op's seqlen_k argument is seqlen_k + this (bad input: beyond the cache)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import sm70_cases

EXTRA = {"dominated": None, "vllm_cache": False, "workspace": "nan", "dtype": "float16", "seqlen_k_extra": 0}
DEFAULTS = {"hq": 6, "hkv": 1, "d": 256, "causal": True, "scale": 1 / 16}


def split_spec(raw: dict) -> tuple[dict, dict]:
    raw = dict(raw)
    extra = {k: raw.pop(k, v) for k, v in EXTRA.items()}
    spec = sm70_cases._spec({**DEFAULTS, **raw})
    if len(spec["seqlens"]) != 1:
        raise ValueError("the long-prefill op takes one sequence: seqlens must hold one pair")
    return spec, extra


def adversarial(spec: dict, extra: dict, x: dict) -> None:
    """Rows dominated by one key, written into q and k (the reference reads the same tensors)."""
    import torch

    sq, sk = spec["seqlens"][0]
    hq, hkv = spec["hq"], spec["hkv"]
    group = hq // hkv
    k = x["k"] if spec["page_size"] is None else None
    if spec["page_size"] is not None:  # the cache rows of keys 0 .. sk-1, in block-table order
        page = spec["page_size"]
        ids = x["block_table"][0].tolist()

        def key_row(j):
            return x["k"][ids[j // page], j % page]
    else:

        def key_row(j):
            return k[j]

    gen = torch.Generator(device="cpu").manual_seed(spec["seed"] + 99)
    if extra["dominated"] == "first":
        # q_i += 16 u for every row and head, key 0 = 100 u: s(i, 0) = 100 (16 + N(0,1)) / 16 ~ 100,
        # the other scores ~N(0, 2) (unit u, scale 1/16).
        u = torch.randn(spec["d"], generator=gen)
        u = (u / u.norm()).to(x["q"].device)
        x["q"].copy_((x["q"].float() + 16 * u).half())
        key_row(0).copy_((100 * u).half().expand_as(key_row(0)))
    elif extra["dominated"] == "diagonal":
        # key j = 6 q_(j - (sk - sq)) of the group's first head: its diagonal score ~ 6 |q|^2 / 16 ~ 96.
        for j in range(max(0, sk - sq), sk):
            i = j - (sk - sq)
            for h in range(hkv):
                key_row(j)[h].copy_((6 * x["q"][i, h * group].float()).half())
    else:
        raise ValueError(f"dominated: {extra['dominated']!r}")


def vllm_views(spec: dict, x: dict) -> None:
    """Replace the paged k/v by views of one (num_blocks, hkv, page, 2 d) cache holding the same values."""
    import torch

    k, v = x["k"], x["v"]
    nb, page, hkv, d = k.shape
    kv = torch.empty(nb, hkv, page, 2 * d, dtype=k.dtype, device=k.device)
    kk, vv = kv.transpose(1, 2).split(d, dim=-1)
    kk.copy_(k)
    vv.copy_(v)
    x["k"], x["v"] = kk, vv


def adapter(op, workspace_bytes, extra: dict):
    """gqa_prefill_fwd behind varlen_fwd's arguments, so sm70_cases' checks apply unchanged."""
    import torch

    def call(
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
        if not causal or alibi is not None or softcap or (wl, wr) != (-1, -1):
            raise ValueError("harness: the long-prefill op is causal without ALiBi, softcap or windows")
        seqlen_k = max_sk + int(extra["seqlen_k_extra"])
        ws = None
        if extra["workspace"] is not None:
            need = workspace_bytes(q.shape[0], max(0, seqlen_k), q.shape[1], k.shape[-2])
            size = need - 1 if extra["workspace"] == "short" else need
            ws = torch.full((max(0, size),), 0xFF, dtype=torch.uint8, device=q.device)  # NaN in fp16/fp32
        return op(q, k, v, out, block_table, seqlen_k, scale, ws)

    return call


def run(ops, raw: dict) -> dict:
    import torch

    spec, extra = split_spec(raw)
    op = adapter(ops.gqa_prefill_fwd, ops.gqa_prefill_workspace_bytes, extra)
    x = sm70_cases.build_inputs(spec, "cuda")
    if extra["dominated"]:
        adversarial(spec, extra, x)
    if extra["vllm_cache"]:
        vllm_views(spec, x)
    if extra["dtype"] != "float16":
        for name in ("q", "k", "v"):
            x[name] = x[name].to(getattr(torch, extra["dtype"]))
    return sm70_cases.run_mode(
        lambda: sm70_cases.run_op_only(
            lambda out: sm70_cases.call_op(op, spec, x, out), sm70_cases.new_out(x, spec["hq"], spec["d"])[1]
        ),
        lambda: sm70_cases.run_error(op, spec, x),
        lambda: sm70_cases.run_numerics(op, spec, x),
        spec["expect_error"],
    )


def main(argv) -> int:
    return sm70_cases.harness_main(argv, __doc__, run)


if __name__ == "__main__":
    sm70_cases.run_script(main)
