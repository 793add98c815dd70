# SPDX-License-Identifier: BSD-3-Clause
"""The sm_70 toolchain and the SASS reader, on tiny kernels built here with known answers."""

import textwrap

import pytest

from fa2patch.compile import sass, toolchain
from fa2patch.compile.verify import check_kernels
from helpers import MMA, compile_cu

# Three dependent mma.m8n8k4 (each is 4 HMMA.884 steps on sm_70: 12 in all) and a plain kernel.
TINY = textwrap.dedent(f"""
    __global__ void three_mma(const unsigned* in, float* out) {{
      unsigned a[2] = {{in[threadIdx.x], in[threadIdx.x + 32]}};
      unsigned b[2] = {{in[threadIdx.x + 64], in[threadIdx.x + 96]}};
      float d[8] = {{0.f}};
      {MMA}
      {MMA}
      {MMA}
      for (int i = 0; i < 8; ++i) out[threadIdx.x * 8 + i] = d[i];
    }}
    __global__ void no_mma(float* out) {{ out[threadIdx.x] = 2.f * threadIdx.x; }}
""")


def test_hmma_count_matches_hand_count_and_resources_agree(clang_cuda, tmp_path):
    obj, log = compile_cu(clang_cuda, TINY, tmp_path)
    tool = toolchain.find_cuda12_binutil("cuobjdump")
    funcs = {f.name: f for f in sass.parse_sass(toolchain.cuobjdump(tool, ["-sass"], obj))}
    three = funcs["_Z9three_mmaPKjPf"]
    assert three.arch == "sm_70"
    assert three.hmma == 12 and three.traps == 0
    assert sorted({op for op in three.opcodes if op.startswith("HMMA")}) == [
        f"HMMA.884.F32.F32.STEP{i}" for i in range(4)
    ]
    assert funcs["_Z6no_mmaPf"].hmma == 0
    ptxas = sass.parse_ptxas_log(log)
    res = {r.name: r for r in sass.parse_resource_usage(toolchain.cuobjdump(tool, ["--dump-resource-usage"], obj))}
    for name in ("_Z9three_mmaPKjPf", "_Z6no_mmaPf"):
        assert ptxas[name].entry and ptxas[name].arch == "sm_70"
        assert ptxas[name].registers == res[name].registers > 0
        assert ptxas[name].spill_stores == 0


def _manifest(log, patterns):
    return {
        "arch": "sm_70",
        "tensor_core_kernels": patterns,
        "ptxas_kernels": [vars(e) for e in sass.parse_ptxas_log(log).values() if e.entry],
    }


def test_budget_breach_and_missing_hmma_are_reported(clang_cuda, tmp_path):
    obj, log = compile_cu(clang_cuda, TINY, tmp_path)
    budgets = tmp_path / "budgets.toml"
    budgets.write_text("[default]\nmax_registers = 255\n[[kernel]]\npattern = 'three_mma*'\nmax_registers = 8\n")
    launches = {"three_mma*": (32, 0), "no_mma*": (32, 0)}
    rows = {r.name.split("(")[0]: r for r in check_kernels(_manifest(log, ["*_mma*"]), obj, budgets, launches)}
    assert not rows["three_mma"].ok and "registers expected <= 8" in rows["three_mma"].detail
    assert not rows["no_mma"].ok and "without HMMA" in rows["no_mma"].detail
    budgets.write_text("[default]\nmax_registers = 255\n")
    rows = check_kernels(_manifest(log, ["three_mma*"]), obj, budgets, launches)
    assert all(r.ok for r in rows), rows
    # Dynamic shared memory counts against the budget; a tensor-core kernel needs its launch.
    rows = {
        r.name.split("(")[0]: r
        for r in check_kernels(_manifest(log, ["three_mma*"]), obj, budgets, {"three_mma*": (32, 100 * 1024)})
    }
    assert not rows["three_mma"].ok and "actual 102400" in rows["three_mma"].detail
    rows = {r.name.split("(")[0]: r for r in check_kernels(_manifest(log, ["three_mma*"]), obj, budgets, {})}
    assert "no launch configuration" in rows["three_mma"].detail


# A kernel that needs more than 16 registers: built with ptxas' limit at 16, it spills.
PRESSURE = textwrap.dedent("""
    __global__ void pressure(const float* in, float* out) {
      float r[24];
      for (int i = 0; i < 24; ++i) r[i] = in[threadIdx.x * 24 + i];
      float acc = 0.f;
      for (int j = 0; j < 24; ++j) for (int i = 0; i < 24; ++i) acc += r[i] * r[(i + j) % 24];
      for (int i = 0; i < 24; ++i) out[threadIdx.x * 24 + i] = r[i] * acc;
    }
""")


def test_spills_fail_the_shipped_arch_and_are_reported_on_a_lab_build(clang_cuda, tmp_path):
    obj, log = compile_cu(clang_cuda, PRESSURE, tmp_path, ["-Xcuda-ptxas", "--maxrregcount=16"])
    spilled = sass.parse_ptxas_log(log)["_Z8pressurePKfPf"]
    assert spilled.spill_stores > 0, log  # the premise: ptxas spilled
    budgets = tmp_path / "budgets.toml"
    budgets.write_text("[default]\n")
    (row,) = check_kernels(_manifest(log, []), obj, budgets, {"pressure*": (32, 0)})
    assert not row.ok and "spill bytes expected <= 0" in row.detail
    (row,) = check_kernels({**_manifest(log, []), "lab": True}, obj, budgets, {"pressure*": (32, 0)})
    assert row.ok and "spill bytes expected <= 0" in row.detail and "lab build" in row.detail


def test_spill_budget_cannot_be_loosened(tmp_path):
    from fa2patch.common.errors import CheckFailed
    from fa2patch.compile.verify import load_budgets

    budgets = tmp_path / "budgets.toml"
    budgets.write_text("[default]\nmax_spill_bytes = 16\n")
    with pytest.raises(CheckFailed, match="zero spills is a hard rule"):
        load_budgets(budgets)


CUTE_MMA = textwrap.dedent("""
    #include <cute/arch/mma_sm70.hpp>
    __global__ void cute_mma(const unsigned* in, float* out) {
      float d[8] = {0.f};
      cute::SM70_8x8x4_F32F16F16F32_TN::fma(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7],
          in[threadIdx.x], in[threadIdx.x + 32], in[threadIdx.x + 64], in[threadIdx.x + 96],
          d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]);
      for (int i = 0; i < 8; ++i) out[threadIdx.x * 8 + i] = d[i];
    }
""")


def test_clang_without_nvcc_macros_turns_cute_mma_into_trap(clang_cuda, tmp_path, real_workspace):
    """docs/DESIGN.md §5: the pitfall is real, our flags avoid it, and verify catches it."""
    inc = f"-I{real_workspace / 'csrc' / 'cutlass' / 'include'}"
    tool = toolchain.find_cuda12_binutil("cuobjdump")
    good, _good_log = compile_cu(clang_cuda, CUTE_MMA, tmp_path, [inc])
    (f,) = sass.parse_sass(toolchain.cuobjdump(tool, ["-sass"], good))
    assert f.hmma == 4 and f.traps == 0
    (tmp_path / "bad").mkdir()
    bad, bad_log = compile_cu(clang_cuda, CUTE_MMA, tmp_path / "bad", [inc], macros=False)
    (f,) = sass.parse_sass(toolchain.cuobjdump(tool, ["-sass"], bad))
    assert f.hmma == 0 and f.traps > 0
    budgets = tmp_path / "budgets.toml"
    budgets.write_text("[default]\n")
    (row,) = check_kernels(_manifest(bad_log, ["cute_mma*"]), bad, budgets, {"cute_mma*": (32, 0)})
    assert not row.ok and "without HMMA" in row.detail and "trap" in row.detail


def test_synthetic_listing_parsers():
    listing = textwrap.dedent("""
        Fatbin elf code:
        ================
        arch = sm_70
                Function : _Z1kv
            /*0000*/                   MOV R1, c[0x0][0x28] ;
            /*0010*/              @!P0 BRA 0x80 ;
            /*0020*/                   HMMA.884.F32.F32.STEP0 R4, R12.reuse.ROW, R14.reuse.COL, RZ ;
            /*0030*/                   STL [R1], R2 ;
            /*0040*/                   BPT.TRAP 0x1 ;
    """)
    (f,) = sass.parse_sass(listing)
    assert (f.name, f.arch, f.opcodes) == (
        "_Z1kv",
        "sm_70",
        ["MOV", "BRA", "HMMA.884.F32.F32.STEP0", "STL", "BPT.TRAP"],
    )
    assert (f.hmma, f.traps, f.local_memory_ops) == (1, 1, 1)
    log = (
        "ptxas info    : Compiling entry function '_Z1kv' for 'sm_70'\n"
        "ptxas info    : Function properties for _Z1kv\n"
        "    24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 255 registers, 49152 bytes smem, 376 bytes cmem[0]\n"
    )
    e = sass.parse_ptxas_log(log)["_Z1kv"]
    assert (e.entry, e.registers, e.stack, e.spill_stores, e.spill_loads, e.smem) == (True, 255, 24, 8, 12, 49152)
    res = sass.parse_resource_usage(
        "arch = sm_70\n Function _Z1kv:\n  REG:40 STACK:8 SHARED:1024 LOCAL:4 CONSTANT[0]:376\n"
    )
    assert [(r.name, r.registers, r.stack, r.shared, r.local) for r in res] == [("_Z1kv", 40, 8, 1024, 4)]


def test_kernel_names_are_matched_one_way_globs_on_demangled_names():
    name = "void fa2patch::sm70::flash_fwd_sm70_kernel<256>(flash::Flash_fwd_params)"
    assert sass.kernel_matches(name, "*flash_fwd_sm70_kernel<256>*")
    assert not sass.kernel_matches(name, "*flash_fwd_sm70_kernel<25>*")
    assert not sass.kernel_matches(name, "flash_fwd_sm70_kernel*")  # a glob covers the whole name
    assert not sass.kernel_matches(name, "*FLASH_FWD*")  # case-sensitive
    assert not sass.kernel_matches("_Z21flash_fwd_sm70_kernelILi256EEv", "*flash_fwd_sm70_kernel<256>*")
    table = {"*kernel<128>*": "a", "*kernel*": "b"}
    assert sass.first_match(name, table) == "b" and sass.first_match(name.replace("256", "128"), table) == "a"
    assert sass.first_match("other", table, "default") == "default"
    glob = sass.name_part_glob("k[1]*?")  # build_info()'s name parts are literal text
    assert sass.kernel_matches("void k[1]*?(int)", glob) and not sass.kernel_matches("void k1x(int)", glob)


def test_verify_takes_launches_from_build_info_by_name_part():
    from fa2patch.compile.extension import launches_of

    info = {"kernels": [{"kernel": "flash_fwd_sm70_kernel<32>", "threads": 128, "dynamic_smem": 15360}]}
    launches = launches_of(info)
    assert sass.first_match("void fa2patch::sm70::flash_fwd_sm70_kernel<32>(flash::Flash_fwd_params)", launches) == (
        128,
        15360,
    )
    assert sass.first_match("void fa2patch::sm70::flash_fwd_sm70_kernel<320>(Params)", launches) is None
