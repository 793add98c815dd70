# SPDX-License-Identifier: BSD-3-Clause
"""Compile vLLM's TRITON_ATTN kernels for capability 7.0 offline, as vLLM's launch would.

Run by ``python -m fa2patch.peers.extract`` with the Python of an environment that has the Triton
vLLM's release uses (no GPU, no torch, no vLLM install needed):

    <python with triton> tools/fa2patch/peers/compile.py --vllm-src DIR --out DIR

``--vllm-src``: the release's source tree (vllm-<version>/ of its sdist). Only
``vllm/v1/attention/ops/triton_unified_attention.py`` and ``triton_attention_helpers.py`` are
loaded, unchanged; the few vLLM and torch names their module level needs are stand-ins
(``_stand_ins``). Each variant's arguments are the ones ``unified_attention`` passes on
capability 7.0 (fp16, KV cache ``(blocks, kv_heads, 16, 2*D)`` split into K and V views, no
sinks, ALiBi, softcap, sliding window or FP8); Triton's own binder turns them into the
signature, constexprs and specialization attributes its JIT would compile, and
``triton.compile`` builds them for ``GPUTarget("cuda", 70, 32)``. Writes per variant
``<name>.cubin``, ``<name>.ptx``, ``<name>.ptxas.log`` and ``compile.json`` (versions, options,
what each variant was compiled with).

This file imports only the standard library at module level, so that fa2patch can read its
variant table without Triton.
"""

import argparse
import contextlib
import enum
import importlib.util
import io
import json
import logging
import os
import sys
import tempfile
import types
from pathlib import Path

BLOCK_SIZE = 16  # vLLM's paged KV block size on this path
NUM_SEGMENTS = 16  # NUM_PAR_SOFTMAX_SEGMENTS (64 only on capability 12.0)
MAX_BLOCKS_PER_SEQ = 8192  # block_table.stride(0): max_model_len 131072 / 16 (only its divisibility matters)
FP8_E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max: FP8_MIN/FP8_MAX defaults (unused: USE_FP8 off)

# name: (kernel, head_dim, query heads, KV heads, 2D or 3D, KV tile). The tile is _get_tile_size's:
# 32 for the 2D (prefill) path, 16 for the 3D (decode) path with 2-byte elements.
VARIANTS = {
    "d256_g6_2d": ("kernel_unified_attention", 256, 6, 1, "2d", 32),
    "d256_g6_3d": ("kernel_unified_attention", 256, 6, 1, "3d", 16),
    "d128_g4_2d": ("kernel_unified_attention", 128, 32, 8, "2d", 32),
    "d128_g4_3d": ("kernel_unified_attention", 128, 32, 8, "3d", 16),
    "d256_reduce": ("reduce_segments", 256, 6, 1, "3d", 16),
    "d128_reduce": ("reduce_segments", 128, 32, 8, "3d", 16),
}
MODULES = ("triton_attention_helpers", "triton_unified_attention")


def block_m(group: int) -> int:
    """BLOCK_M of unified_attention: 16 query rows, or the group size rounded up to a power of 2."""
    return 16 if group <= 16 else 1 << (group - 1).bit_length()


def _stand_ins(triton, tl):
    """Modules that the two kernel files import at module level, as far as they use them."""

    class Platform:
        def fp8_dtype(self):  # CUDA's FP8 type; a name only where torch is not installed
            return __import__("torch").float8_e4m3fn if "torch" not in mods else "float8_e4m3fn"

    class Finfo:
        def __init__(self, dtype):
            self.min, self.max = -FP8_E4M3_MAX, FP8_E4M3_MAX

    KVQuantMode = enum.IntEnum(  # the functional API: the variable has the enum's name
        "KVQuantMode",
        {"NONE": 0, "FP8_PER_TENSOR": 1, "INT8_PER_TOKEN_HEAD": 2, "FP8_PER_TOKEN_HEAD": 3, "INT4_PER_TOKEN_HEAD": 4},
    )
    mods = {
        "vllm": {},
        "vllm.envs": {"VLLM_BATCH_INVARIANT": False},
        "vllm.logger": {"init_logger": logging.getLogger},
        "vllm.platforms": {"current_platform": Platform()},
        "vllm.triton_utils": {"triton": triton, "tl": tl},
        "vllm.v1": {},
        "vllm.v1.attention": {},
        "vllm.v1.attention.ops": {},
        "vllm.v1.kv_cache_interface": {"KVQuantMode": KVQuantMode},
    }
    if importlib.util.find_spec("torch") is None:
        mods["torch"] = {"finfo": Finfo}
    return mods


def load_kernels(vllm_src: Path) -> types.ModuleType:
    """vLLM's two kernel modules, loaded from ``vllm_src`` under their own names."""
    import triton
    import triton.language as tl

    stand_ins = _stand_ins(triton, tl)
    for name, attrs in stand_ins.items():
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        mod.__path__ = []
        sys.modules[name] = mod
    out: dict[str, types.ModuleType] = {}
    for name in MODULES:
        full = f"vllm.v1.attention.ops.{name}"
        path = vllm_src / "vllm/v1/attention/ops" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(full, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"{path}: cannot load it as the module {full}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[full] = mod
        spec.loader.exec_module(mod)
        out[name] = mod
    if "torch" in stand_ins:  # Triton's binder checks torch.Tensor when a torch module is loaded
        del sys.modules["torch"]
    return out["triton_unified_attention"]


class _Dtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


# One object per dtype for the whole run: Triton's binder caches what it reads of a dtype object.
_DTYPES = {name: _Dtype(name) for name in ("float16", "float32", "int32")}


class _Tensor:
    """What Triton's binder reads of a tensor argument: its dtype and its address."""

    def __init__(self, dtype, address=0):
        self.dtype, self.address = _DTYPES[dtype], address

    def data_ptr(self):
        return self.address


def launch_args(variant: str) -> dict:
    """The keyword arguments unified_attention passes for ``variant`` on capability 7.0 (fp16)."""
    kernel, d, hq, hkv, mode, tile = VARIANTS[variant]
    group = hq // hkv
    is_3d = mode == "3d"
    bm = block_m(group)
    f16, f32, i32 = (lambda address=0, t=t: _Tensor(t, address) for t in ("float16", "float32", "int32"))
    if kernel == "reduce_segments":
        return {
            "output_ptr": f16(),
            "segm_output_ptr": f32(),
            "segm_max_ptr": f32(),
            "segm_expsum_ptr": f32(),
            "seq_lens_ptr": i32(),
            "num_seqs": 1,
            "num_query_heads": hq,
            "out_scale_inv": 1.0,
            "output_stride_0": hq * d,
            "output_stride_1": d,
            "block_table_stride": MAX_BLOCKS_PER_SEQ,
            "TILE_SIZE": tile,
            "HEAD_SIZE": d,
            "HEAD_SIZE_PADDED": d,
            "query_start_len_ptr": i32(),
            "BLOCK_Q": bm // group,
            "NUM_SEGMENTS_PER_SEQ": NUM_SEGMENTS,
            "USE_FP8": False,
            "FP8_MIN": -FP8_E4M3_MAX,
            "FP8_MAX": FP8_E4M3_MAX,
        }
    row = 2 * d  # K and V views of one (block, kv head, 16, 2*D) cache
    strides = (hkv * BLOCK_SIZE * row, row, BLOCK_SIZE * row, 1)
    segm = f32() if is_3d else None
    return {
        "output_ptr": f16(),
        "segm_output_ptr": segm,
        "segm_max_ptr": segm,
        "segm_expsum_ptr": segm,
        "query_ptr": f16(),
        "key_cache_ptr": f16(),
        "value_cache_ptr": f16(2 * d),
        "sink_ptr": None,
        "block_tables_ptr": i32(),
        "seq_lens_ptr": i32(),
        "alibi_slopes_ptr": None,
        "qq_bias_ptr": None,
        "k_scale_cache_ptr": None,
        "v_scale_cache_ptr": None,
        "scale": d**-0.5,
        "q_scale": None,
        "k_scale": f32(),
        "v_scale": f32(),
        "out_scale": 1.0,
        "softcap": 0,
        "num_query_heads": hq,
        "num_queries_per_kv": group,
        "block_table_stride": MAX_BLOCKS_PER_SEQ,
        "query_stride_0": hq * d,
        "query_stride_1": d,
        "output_stride_0": hq * d,
        "output_stride_1": d,
        "qq_bias_stride_0": 0,
        "BLOCK_SIZE": BLOCK_SIZE,
        "TILE_SIZE": tile,
        "HEAD_SIZE": d,
        "HEAD_SIZE_PADDED": d,
        "USE_ALIBI_SLOPES": False,
        "USE_ALIBI_SQRT": False,
        "USE_QQ_BIAS": False,
        "USE_SOFTCAP": False,
        "USE_SINKS": False,
        "SLIDING_WINDOW": 0,
        "USE_CAUSAL": True,
        "USE_PER_SEQ_CAUSAL": False,
        "per_seq_causal_ptr": None,
        "USE_MM_PREFIX": False,
        "MAX_MM_RANGES": 0,
        "mm_prefix_range_ptr": None,
        "rswa_prefix_lens_ptr": i32(),
        "R_SWA_WINDOW": 0,
        "USE_R_SWA": False,
        "stride_k_cache_0": strides[0],
        "stride_k_cache_1": strides[1],
        "stride_k_cache_2": strides[2],
        "stride_k_cache_3": strides[3],
        "stride_v_cache_0": strides[0],
        "stride_v_cache_1": strides[1],
        "stride_v_cache_2": strides[2],
        "stride_v_cache_3": strides[3],
        "stride_ks_blk": None,
        "stride_ks_slot": None,
        "stride_ks_head": None,
        "stride_vs_blk": None,
        "stride_vs_slot": None,
        "stride_vs_head": None,
        "query_start_len_ptr": i32(),
        "BLOCK_Q": bm // group,
        "num_seqs": 1,
        "BLOCK_M": bm,
        "NUM_SEGMENTS_PER_SEQ": NUM_SEGMENTS if is_3d else 1,
        "USE_FP8": False,
        "IS_3D": is_3d,
        "KV_QUANT_MODE": 0,
        "Q_IS_FP8": False,
        "CHUNK_LOOKBACK": -1,
        "CHUNK_SIZE": -1,
        "USE_TD": False,
        "USE_TD_QO": False,
        "MM_PREFIX_CLAMP_SW": False,
    }


def compile_variant(module, variant: str, out: Path) -> dict:
    """Compile one variant for sm_70 the way Triton's JIT would for these arguments."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel = getattr(module, VARIANTS[variant][0])
    target = GPUTarget("cuda", 70, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(**launch_args(variant))
    options, signature, constexprs, attrs = kernel._pack_args(backend, {}, bound, specialization, options)
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        compiled = triton.compile(
            ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__
        )
    (out / f"{variant}.cubin").write_bytes(compiled.asm["cubin"])
    (out / f"{variant}.ptx").write_text(compiled.asm["ptx"])
    (out / f"{variant}.ptxas.log").write_text(log.getvalue())
    names = kernel.arg_names
    return {
        "kernel": kernel.__name__,
        "num_warps": compiled.metadata.num_warps,
        "num_stages": compiled.metadata.num_stages,
        "shared": compiled.metadata.shared,
        "constexprs": {names[k[0]]: _plain(v) for k, v in sorted(constexprs.items())},
        "divisible_by_16": sorted(names[k[0]] for k, v in attrs.items() if ["tt.divisibility", 16] in v),
        "signature": {k: v for k, v in signature.items() if v != "constexpr"},
    }


def _plain(v):
    return v if isinstance(v, (bool, int, float, str)) else repr(v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-src", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TRITON_CACHE_DIR"] = cache  # a fresh compile: ptxas runs and logs
        os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"
        import triton
        from triton import knobs

        module = load_kernels(args.vllm_src)
        ptxas = knobs.nvidia.ptxas
        record = {
            "triton": triton.__version__,
            "ptxas": ptxas.path,
            "ptxas_version": ptxas.version,
            "target": "cuda:70",
            "variants": {v: compile_variant(module, v, args.out) for v in args.variants},
        }
    (args.out / "compile.json").write_text(json.dumps(record, indent=1, sort_keys=True))
    print(args.out / "compile.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
