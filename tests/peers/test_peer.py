# SPDX-License-Identifier: BSD-3-Clause
"""The peer vLLM runs on a V100 (TRITON_ATTN): its recorded sm_70 data, the launches rebuilt from
it, and the main-loop finder that reads a kernel without tensor cores. CPU only; the
re-derivation from vLLM's sources runs where FA2PATCH_PEER_PYTHON names a Python with vLLM's
Triton (python -m fa2patch.peers.extract)."""

import os
import textwrap
from pathlib import Path

import pytest

from fa2patch.common.routes import EXACT
from fa2patch.common.shapes import Shape
from fa2patch.compile import sass
from fa2patch.model import sass_mix
from fa2patch.model.v100model import Card, load_data, load_v100
from fa2patch.peers import compile as peer_compile, extract as peer_extract, vllm_triton as peer

DATA = load_data(peer.DATA)


def shape(q, kv, hq, hkv, d, b=1, causal=True):
    return Shape(q, kv, hq, hkv, d, causal, d**-0.5, b)


def test_recorded_data_parses_and_names_its_toolchain():
    src = DATA["source"]
    assert (src["vllm"], src["target"]) == ("0.33.0", "cuda:70")
    assert src["triton"].startswith("3.8.") and src["ptxas"].startswith("12.")
    assert set(DATA["variant"]) == set(peer_compile.VARIANTS)
    for name, var in DATA["variant"].items():
        kernel, d, hq, hkv, mode, tile = peer_compile.VARIANTS[name]
        assert (var["kernel"], var["head_dim"], var["q_heads"], var["kv_heads"], var["mode"], var["tile_size"]) == (
            kernel,
            d,
            hq,
            hkv,
            mode,
            tile,
        )
        assert var["num_warps"] == 4 and 0 < var["registers"] <= 255 and var["shared"] > 0
        assert ("loop" in var) == (kernel == "kernel_unified_attention")


@pytest.mark.parametrize("name", [n for n, v in peer_compile.VARIANTS.items() if v[0] == "kernel_unified_attention"])
def test_main_loop_is_the_fma_dot_of_its_tiles(name):
    """No tensor cores: each warp-iteration issues the FMAs of S = Q K^T and O += P V for its
    share of a BLOCK_M x TILE x D tile pair (4 warps), in FFMA, plus the softmax's FP32 work."""
    var = DATA["variant"][name]
    c = var["constexprs"]
    fmas_per_thread = 2 * c["BLOCK_M"] * c["TILE_SIZE"] * c["HEAD_SIZE"] / (32 * var["num_warps"])
    loop = var["loop"]
    assert loop["mix"].get("hmma", 0) == 0 and loop["model_mix"]["hmma_f32_steps"] == 0
    assert fmas_per_thread <= loop["model_mix"]["fp32"] <= 1.15 * fmas_per_thread
    assert loop["local_passes"] == 0 or var["stack"] > 0


def test_plan_follows_unified_attention_on_capability_7():
    prefill = peer.plan(shape(8192, 8192, 6, 1, 256))
    assert (prefill["block_m"], prefill["block_q"], prefill["mode"], prefill["tile"]) == (16, 2, "2d", 32)
    decode = peer.plan(shape(1, 4096, 32, 8, 128))
    assert (decode["block_q"], decode["mode"], decode["tile"], decode["segments"]) == (4, "3d", 16, 16)
    # 64 sequences x 1 query block > 128 // 8 = 16: the 2D grid; with one KV head the threshold is 128.
    assert peer.plan(shape(1, 4096, 32, 8, 128, b=64))["mode"] == "2d"
    assert peer.plan(shape(1, 4096, 6, 1, 256, b=64))["mode"] == "3d"


def test_prefill_grid_by_hand():
    """Q=64, KV=128, 6/1, causal: 64 // 2 + 1 = 33 query blocks of 2 tokens (16 rows). Block b
    sees keys < min(64 + 2b + 3, 128): 3 tiles of 32 for b <= 14, 4 for b = 15..31; block 32
    starts past the queries and returns."""
    s = shape(64, 128, 6, 1, 256)
    p = peer.plan(s)
    assert peer.cta_iterations(s, p) == [3] * 15 + [4] * 17 + [None]
    (launch,), p = peer.peer_launches(s, data=DATA)
    assert len(launch.iterations) + sum(len(k.iterations) for k in launch.more) == 33
    assert p["cta_iterations"] == 3 * 15 + 4 * 17 and p["idle_ctas"] == 1


def test_decode_grid_by_hand():
    """3 sequences of 1 query, KV=1000, 32/8, D=128: 3D (3 <= 16), 3 // 4 + 3 = 3 query blocks
    x 8 KV heads x 16 segments; 63 tiles of 16, 4 per segment (ceil(1000 / 256)), the last
    segment 3. KV=100: 7 tiles, one per segment, segments 7..15 return (7 x 16 >= 100)."""
    s = shape(1, 1000, 32, 8, 128, b=3)
    its = peer.cta_iterations(s, peer.plan(s))
    assert its == [4] * (15 * 24) + [3] * 24
    launches, _p = peer.peer_launches(s, data=DATA)
    assert [x.name for x in launches] == ["kernel_unified_attention", "reduce_segments"]
    assert len(launches[1].iterations) == 3 * 32  # one CTA per token and query head
    short = shape(1, 100, 32, 8, 128, b=3)
    assert peer.cta_iterations(short, peer.plan(short)) == [1] * (7 * 24) + [None] * (9 * 24)


def test_decode_batch_idle_blocks():
    """64 sequences, 6/1: 64 // 2 + 64 = 96 blocks; sequence i starts at block i // 2 + i, so every
    third block (2, 5, 8, ...) lies past its sequence's one query and returns."""
    s = shape(1, 512, 6, 1, 256, b=64)
    its = peer.cta_iterations(s, peer.plan(s))
    first_segment = its[:96]
    assert [g for g, n in enumerate(first_segment) if n is None] == list(range(2, 96, 3))


def test_estimate_is_positive_and_above_its_bounds():
    e = peer.peer_estimate(shape(4096, 4096, 6, 1, 256), Card(72, 1530.0), DATA, load_v100())
    assert e["tensor_cores"] is False
    assert 0 < e["fp32_bound_ms"] <= e["bound_ms"] <= e["model_ms"] <= e["model_ms_spills_on_l1"]


def test_shape_without_a_recorded_variant_is_refused():
    with pytest.raises(KeyError, match="d64_g4_2d"):
        peer.peer_launches(shape(128, 128, 32, 8, 64), data=DATA)


SYNTHETIC = textwrap.dedent("""
        code for sm_70
                Function : k
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   LDG.E.SYS R2, [R4] ;
        /*0020*/                   ISETP.GE.AND P0, PT, R2, 0x4, PT ;
        /*0030*/               @P0 BRA 0x10 ;
        /*0040*/                   FFMA R6, R7, R8, R6 ;
        /*0050*/                   LDS.U.128 R8, [R9] ;
        /*0060*/                   FFMA R6, R7, R8, R6 ;
        /*0070*/                   IADD3 R10, R10, 0x1, RZ ;
        /*0080*/               @P1 BRA 0x70 ;
        /*0090*/                   FFMA R6, R9, R8, R6 ;
        /*00a0*/                   HADD2.F32 R11, -RZ, R12.H0_H0 ;
        /*00b0*/               @P2 BRA 0x40 ;
        /*00c0*/                   EXIT ;
        /*00d0*/                   BRA 0xd0 ;
""")


def test_main_loop_without_hmma():
    """The largest outermost loop is the main loop (0x40..0xb0, with an inner loop), not the
    search loop before it, the inner loop, nor the trailing self-branch; hot_loops finds none."""
    (f,) = sass.parse_sass(SYNTHETIC)
    assert f.hot_loops() == []
    assert [(lp.start, lp.end) for lp in f.outer_loops()] == [(0x10, 0x30), (0x40, 0xB0), (0xD0, 0xD0)]
    main = f.main_loop()
    assert (main.start, main.end, len(main.instrs)) == (0x40, 0xB0, 8)
    counts, mix = sass_mix.mix_of(main.instrs)
    assert (counts["fp32"], counts["fp16"], mix.fp32, mix.shared_passes) == (3, 1, 3, 4)


def test_fp16x2_and_local_memory_are_issue_only():
    """HADD2/HFMA2 (GV100's FP16 pipe) and LDL/STL have their own categories and stay out of the
    FP32 pipe and the shared-memory passes."""
    text = "\n".join(
        f"        /*{i * 16:04x}*/                   {op} ;"
        for i, op in enumerate(
            [
                "HFMA2 R0, R1, R2, R3",
                "HADD2.F32 R4, -RZ, R5.H0_H0",
                "STL [R1], R6",
                "LDL.LU R7, [R1]",
                "FFMA R8, R8, R8, R8",
            ]
        )
    )
    (f,) = sass.parse_sass("        Function : k\n" + text)
    counts, mix = sass_mix.mix_of(f.instrs)
    assert counts == {"fp16": 2, "local": 2, "fp32": 1}
    assert (mix.fp32, mix.shared_passes, mix.instructions) == (1, 0, 5)


LOOP_KERNEL = textwrap.dedent("""
        code for sm_70
                Function : k
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   LDG.E.SYS R2, [R4] ;
        /*0020*/                   FFMA R6, R7, R2, R6 ;
        /*0030*/                   LDS.U.128 R8, [R9] ;
        /*0040*/                   FFMA R6, R7, R8, R6 ;
        /*0050*/                   IADD3 R10, R10, 0x1, RZ ;
        /*0060*/               @P2 BRA 0x20 ;
        /*0070*/                   STG.E.SYS [R4], R6 ;
        /*0080*/                   EXIT ;
        /*0090*/                   BRA 0x90 ;
""")


def test_analyse_reads_a_variant_as_recorded(monkeypatch, tmp_path):
    """extract's reading of one compiled variant (cuobjdump's output given here): its resources, the
    main loop and, untimed, the code outside it, with the keys the recorded data has."""

    def cuobjdump(tool, args, path):
        assert (tool, path) == (Path("cuobjdump"), tmp_path / "k.cubin"), (tool, path)
        return " Function k:\n  REG:40 STACK:0 SHARED:0 LOCAL:0\n" if "--dump-resource-usage" in args else LOOP_KERNEL

    monkeypatch.setattr(peer_extract.toolchain, "cuobjdump", cuobjdump)
    log = (
        "ptxas info    : Compiling entry function 'k' for 'sm_70'\n"
        "ptxas info    : Function properties for k\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 40 registers, 376 bytes cmem[0]\n"
    )
    got = peer_extract.analyse(tmp_path / "k.cubin", log, Path("cuobjdump"))
    assert (got["registers"], got["spill_stores"], got["static_instructions"]) == (40, 0, 10)
    assert (got["loop"]["start"], got["loop"]["end"], got["loop"]["instructions"]) == (0x20, 0x60, 5)
    recorded = DATA["variant"]["d128_g4_2d"]["outside"]
    assert set(got["outside"]) == set(recorded) == {"instructions", "mix", "load_rounds", "model_mix"}
    assert set(got["outside"]["model_mix"]) >= set(recorded["model_mix"])
    assert "load_use_gaps" not in got["outside"]["model_mix"] and not got["outside"]["model_mix"]["critical_cycles"]
    (f,) = sass.parse_sass(LOOP_KERNEL)
    outside = [i for i in f.instrs if not 0x20 <= i.addr <= 0x60]
    assert got["outside"]["instructions"] == 5 and got["outside"]["mix"] == sass_mix.mix_of(outside)[0]


@pytest.mark.skipif(
    not os.environ.get("FA2PATCH_PEER_PYTHON"),
    reason="FA2PATCH_PEER_PYTHON: a Python with vLLM's Triton (3.8.x), e.g. a scratch venv",
)
def test_rederive_matches_the_recorded_data(tmp_path):
    """Compile vLLM's kernels again and read them: the same resources and mixes as recorded."""
    vllm_src = os.environ.get("FA2PATCH_PEER_VLLM_SRC")
    data = peer_extract.extract(
        Path(os.environ["FA2PATCH_PEER_PYTHON"]), tmp_path, Path(vllm_src) if vllm_src else None
    )
    assert data["source"]["triton"] == DATA["source"]["triton"]
    for name, var in DATA["variant"].items():
        new = data["variant"][name]
        assert {k: new[k] for k in ("registers", "shared", "stack", "num_warps")} == {
            k: var[k] for k in ("registers", "shared", "stack", "num_warps")
        }
        if "loop" in var:
            assert new["loop"]["mix"] == var["loop"]["mix"]
            assert new["loop"]["model_mix"]["load_use_gaps"] == var["loop"]["model_mix"]["load_use_gaps"]


def test_report_section_compares_model_with_model():
    """`report --peer vllm-triton`'s section: the peer's model time over each route's model time for
    the same shape (both uncalibrated), and the plain statement that the peer has no tensor cores."""
    s = shape(4096, 4096, 6, 1, 256)
    e = peer.peer_estimate(s, Card(72, 1530.0), DATA, load_v100())
    route = {"label": s.label, "route": EXACT, "model_ms": e["model_ms"] / 4}
    text = peer.render([e], [route])
    assert "WITHOUT tensor cores" in text and "uncalibrated" in text
    assert "sm70-dense 4.00x" in text
    assert peer.render([e]).splitlines()[-1].rstrip().endswith("-")
