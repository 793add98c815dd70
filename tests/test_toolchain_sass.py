"""The sm_70 toolchain and the SASS reader, on tiny kernels built here with known answers."""

import subprocess
import textwrap

import pytest

from helpers import locked_toolchain, require_toolchain
from fa2patch import sass, toolchain
from fa2patch.build import clang_cuda_flags
from fa2patch.verify import check_kernels

MMA = ("asm volatile(\"mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, "
       "{%8,%9}, {%10,%11}, {%0,%1,%2,%3,%4,%5,%6,%7};\" : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), "
       "\"+f\"(d[3]), \"+f\"(d[4]), \"+f\"(d[5]), \"+f\"(d[6]), \"+f\"(d[7]) : \"r\"(a[0]), \"r\"(a[1]), "
       "\"r\"(b[0]), \"r\"(b[1]));")

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


@pytest.fixture(scope="module")
def clang_cuda(tmp_path_factory):
    require_toolchain()
    d = tmp_path_factory.mktemp("cuda")
    pins = locked_toolchain()
    return toolchain.find_clang(pins.clang), toolchain.assemble_cuda_path(d / "cuda", pins)


def compile_cu(clang_cuda, source, tmp_path, extra=(), macros=True):
    clang, cuda = clang_cuda
    src, obj = tmp_path / "k.cu", tmp_path / "k.o"
    src.write_text(source)
    flags = clang_cuda_flags("sm_70", cuda, locked_toolchain().cuda)
    if not macros:
        flags = [f for f in flags if "__CUDACC_VER" not in f]
    proc = subprocess.run([str(clang), "-O3", "-std=c++17", *flags, *extra, "-c", str(src), "-o", str(obj)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return obj, proc.stderr


def test_hmma_count_matches_hand_count_and_resources_agree(clang_cuda, tmp_path):
    obj, log = compile_cu(clang_cuda, TINY, tmp_path)
    tool = toolchain.find_cuda12_binutil("cuobjdump")
    funcs = {f.name: f for f in sass.parse_sass(sass.cuobjdump(tool, ["-sass"], obj))}
    three = funcs["_Z9three_mmaPKjPf"]
    assert three.arch == "sm_70"
    assert three.hmma == 12 and three.traps == 0
    assert sorted({op for op in three.opcodes if op.startswith("HMMA")}) == [
        f"HMMA.884.F32.F32.STEP{i}" for i in range(4)]
    assert funcs["_Z6no_mmaPf"].hmma == 0
    ptxas = sass.parse_ptxas_log(log)
    res = {r.name: r for r in sass.parse_resource_usage(sass.cuobjdump(tool, ["--dump-resource-usage"], obj))}
    for name in ("_Z9three_mmaPKjPf", "_Z6no_mmaPf"):
        assert ptxas[name].entry and ptxas[name].arch == "sm_70"
        assert ptxas[name].registers == res[name].registers > 0
        assert ptxas[name].spill_stores == 0


def _manifest(log, patterns):
    return {"arch": "sm_70", "tensor_core_kernels": patterns,
            "ptxas_kernels": [vars(e) for e in sass.parse_ptxas_log(log).values() if e.entry]}


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
    rows = {r.name.split("(")[0]: r for r in check_kernels(
        _manifest(log, ["three_mma*"]), obj, budgets, {"three_mma*": (32, 100 * 1024)})}
    assert not rows["three_mma"].ok and "actual 102400" in rows["three_mma"].detail
    rows = {r.name.split("(")[0]: r for r in check_kernels(_manifest(log, ["three_mma*"]), obj, budgets, {})}
    assert "no launch configuration" in rows["three_mma"].detail


def test_spill_budget_cannot_be_loosened(tmp_path):
    from fa2patch.errors import CheckFailed
    from fa2patch.verify import load_budgets

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
    good, good_log = compile_cu(clang_cuda, CUTE_MMA, tmp_path, [inc])
    (f,) = sass.parse_sass(sass.cuobjdump(tool, ["-sass"], good))
    assert f.hmma == 4 and f.traps == 0
    (tmp_path / "bad").mkdir()
    bad, bad_log = compile_cu(clang_cuda, CUTE_MMA, tmp_path / "bad", [inc], macros=False)
    (f,) = sass.parse_sass(sass.cuobjdump(tool, ["-sass"], bad))
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
    assert (f.name, f.arch, f.opcodes) == ("_Z1kv", "sm_70", ["MOV", "BRA", "HMMA.884.F32.F32.STEP0", "STL", "BPT.TRAP"])
    assert (f.hmma, f.traps, f.local_memory_ops) == (1, 1, 1)
    log = ("ptxas info    : Compiling entry function '_Z1kv' for 'sm_70'\n"
           "ptxas info    : Function properties for _Z1kv\n"
           "    24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 255 registers, 49152 bytes smem, 376 bytes cmem[0]\n")
    e = sass.parse_ptxas_log(log)["_Z1kv"]
    assert (e.entry, e.registers, e.stack, e.spill_stores, e.spill_loads, e.smem) == (True, 255, 24, 8, 12, 49152)
    res = sass.parse_resource_usage("arch = sm_70\n Function _Z1kv:\n  REG:40 STACK:8 SHARED:1024 LOCAL:4 CONSTANT[0]:376\n")
    assert [(r.name, r.registers, r.stack, r.shared, r.local) for r in res] == [("_Z1kv", 40, 8, 1024, 4)]


def test_report_loop_model_on_a_synthetic_loop():
    """One loop iteration: 8 HMMA steps, 2 LDS.128, 1 STS, 4 FFMA, 1 MUFU, 1 IADD3, 1 BRA back."""
    from fa2patch.report import analyse_loop, load_v100, occupancy

    ops = ["HMMA.884.F32.F32.STEP%d" % (i % 4) for i in range(8)] + [
        "LDS.U.128", "LDS.U.128", "STS", "FFMA", "FFMA", "FFMA", "FFMA", "MUFU.EX2", "IADD3", "BRA"]
    loop = sass.Loop(0x100, 0x100 + 16 * (len(ops) - 1),
                     [sass.Instr(0x100 + 16 * i, op) for i, op in enumerate(ops)])
    v100 = load_v100()
    r = analyse_loop(loop, v100, warps_per_subpartition=2)
    assert r.instructions == 18 and r.mix["hmma"] == 8 and r.mix["lds"] == 2 and r.mix["mufu"] == 1
    assert r.shared_bytes == 32 * (16 + 16 + 4)
    assert r.cycles == {"tensor": 2 * 8 * 2, "issue": 2 * 18, "shared_memory": 2 * 1152 * 4 / 128,
                        "fp32": 2 * 4 * 2, "mufu": 2 * 1 * 8}
    assert r.binding == "shared_memory" and r.tensor_utilization_bound == pytest.approx(32 / 72)
    assert r.tflops_bound == pytest.approx(32 / 72 * 125.33, rel=1e-3)
    # 255 registers x 128 threads: 2 blocks by registers; 72 KB of shared memory: 1 block.
    occ = occupancy(255, 72 * 1024, 128, v100)
    assert (occ["blocks_per_sm"], occ["warps_per_sm"], occ["limited_by"]) == (1, 4, "shared_memory")
    assert occupancy(64, 0, 256, v100)["blocks_per_sm"] == 4  # 64 regs x 256 threads = 16K regs


def test_report_on_the_tiny_kernel_counts_its_hmma(clang_cuda, tmp_path):
    from fa2patch.report import report

    looped = textwrap.dedent(f"""
        __global__ void three_mma(const unsigned* in, float* out) {{
          unsigned a[2] = {{in[threadIdx.x], in[threadIdx.x + 32]}};
          unsigned b[2] = {{in[threadIdx.x + 64], in[threadIdx.x + 96]}};
          float d[8] = {{0.f}};
          for (int it = 0; it < in[0]; ++it) {{ {MMA} {MMA} }}
          for (int i = 0; i < 8; ++i) out[threadIdx.x * 8 + i] = d[i];
        }}
        __global__ void no_mma(float* out) {{ out[threadIdx.x] = 2.f * threadIdx.x; }}
    """)
    obj, _ = compile_cu(clang_cuda, looped, tmp_path)
    rows = {r["kernel"].split("(")[0]: r for r in report(obj, "sm_70", {"three_mma*": (32, 0)})}
    k = rows["three_mma"]
    assert k["hmma_total"] == 8  # two mma.m8n8k4 in the loop body, 4 HMMA steps each
    (loop,) = k["hot_loops"]
    # 32-thread blocks: the 32-blocks-per-SM limit binds, 8 warps share each sub-partition.
    assert k["occupancy"]["threads_per_block"] == 32 and k["occupancy"]["warps_per_sm"] == 32
    assert loop["mix"]["hmma"] == 8 and loop["cycles"]["tensor"] == 8 * 8 * 2
    assert k["warps_per_subpartition"] == 8
    assert rows["no_mma"]["hot_loops"] == []


def test_kernel_names_are_matched_one_way_globs_on_demangled_names():
    name = "void fa2patch::sm70::flash_fwd_sm70_kernel<256>(flash::Flash_fwd_params)"
    assert sass.kernel_matches(name, "*flash_fwd_sm70_kernel<256>*")
    assert not sass.kernel_matches(name, "*flash_fwd_sm70_kernel<25>*")
    assert not sass.kernel_matches(name, "flash_fwd_sm70_kernel*")      # a glob covers the whole name
    assert not sass.kernel_matches(name, "*FLASH_FWD*")                 # case-sensitive
    assert not sass.kernel_matches("_Z21flash_fwd_sm70_kernelILi256EEv", "*flash_fwd_sm70_kernel<256>*")
    table = {"*kernel<128>*": "a", "*kernel*": "b"}
    assert sass.first_match(name, table) == "b" and sass.first_match(name.replace("256", "128"), table) == "a"
    assert sass.first_match("other", table, "default") == "default"
    glob = sass.name_part_glob("k[1]*?")  # build_info()'s name parts are literal text
    assert sass.kernel_matches("void k[1]*?(int)", glob) and not sass.kernel_matches("void k1x(int)", glob)


def test_verify_takes_launches_from_build_info_by_name_part():
    from fa2patch.verify import launches_of

    info = {"kernels": [{"kernel": "flash_fwd_sm70_kernel<32>", "threads": 128, "dynamic_smem": 15360}]}
    launches = launches_of(info)
    assert sass.first_match("void fa2patch::sm70::flash_fwd_sm70_kernel<32>(flash::Flash_fwd_params)",
                            launches) == (128, 15360)
    assert sass.first_match("void fa2patch::sm70::flash_fwd_sm70_kernel<320>(Params)", launches) is None
