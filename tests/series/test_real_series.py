# SPDX-License-Identifier: BSD-3-Clause
"""The real baseline and this repository's patch series: replay, round trip, build, verify."""

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import gqa_oracle
from fa2patch.common import routes
from helpers import REPO, cpp_head_dims


def test_replay_is_deterministic_and_matches_the_lock(real_project, real_workspace, tmp_path):
    lock = tomllib.loads((REPO / "baseline.lock").read_text())
    again = tmp_path / "again"
    real_project.run("replay", "--workspace", str(again))
    first = real_project.git("log", "--format=%H %s")
    assert real_project.git("log", "--format=%H %s", cwd=again) == first
    assert len(first.splitlines()) == 1 + len(lock["patches"])
    check = json.loads(real_project.run("check", "--json").stdout)
    assert check["ok"] and all(f["ok"] for f in check["findings"])
    assert {"workspace", "toolchain pins", "archive"} <= {f["item"] for f in check["findings"]}


def test_replay_then_export_is_a_byte_identical_round_trip(real_project, real_workspace):
    before = {p.name: p.read_bytes() for p in (real_project.root / "patches").iterdir()}
    lock_before = (real_project.root / "baseline.lock").read_bytes()
    real_project.run("export")
    assert {p.name: p.read_bytes() for p in (real_project.root / "patches").iterdir()} == before
    assert (real_project.root / "baseline.lock").read_bytes() == lock_before
    assert before == {p.name: p.read_bytes() for p in (REPO / "patches").iterdir()}


def test_sm70_build_writes_extension_and_manifest(built_sm70, real_project):
    manifest = json.loads((built_sm70 / "manifest.json").read_text())
    lock = tomllib.loads((REPO / "baseline.lock").read_text())
    artifact = built_sm70 / manifest["artifact"]["file"]
    assert artifact.name == "_vllm_fa2_C.abi3.so" and artifact.is_file()
    import hashlib

    assert manifest["artifact"]["sha256"] == hashlib.sha256(artifact.read_bytes()).hexdigest()
    assert manifest["source_tree_digest"] == lock["patches"][-1]["tree_digest"]
    assert manifest["source_matches_lock"] is True
    assert manifest["arch"] == "sm_70" and manifest["compiler"]["kind"] in ("clang", "nvcc")
    assert manifest["torch"]["version"].startswith(lock["toolchain"]["torch"])
    # C++20 for every torch (torch >= 2.10's headers require it), host and CUDA sources alike.
    assert manifest["cxx_standard"] == "c++20" and manifest["check_only"] is None
    assert "-std=c++20" in manifest["commands"]["cxx"] and "-std=c++20" in manifest["commands"]["cuda"]
    assert not [f for f in manifest["commands"]["cxx"] + manifest["commands"]["cuda"] if f.startswith("-std=c++1")]
    if manifest["compiler"]["kind"] == "clang":
        assert manifest["ptxas_version"].startswith("12.8")
        assert "-D__CUDACC_VER_MAJOR__=12" in manifest["commands"]["cuda"]


def test_verify_passes_and_matches_both_schemas(built_sm70, real_project):
    proc = real_project.run("verify", "--arch", "sm_70", "--json")
    result = json.loads(proc.stdout)
    rows = {r["name"]: r for r in result["rows"]}
    assert result["ok"] and rows["varlen_fwd"]["ok"] and rows["fwd_kvcache"]["ok"] and rows["build_info"]["ok"]
    assert rows["gqa_prefill_fwd"]["ok"] and rows["gqa_prefill_workspace_bytes"]["ok"]
    # patch 0004's routing ops, split-KV and profile test hooks included
    for name in (
        "route_stats",
        "_routing_prefill_splits_for_testing",
        "_routing_decide_for_testing",
        "set_routing_profile",
        "refuse_routing_profile",
        "extension_path",
    ):
        assert rows[name]["ok"], rows.get(name)


def test_verify_and_report_find_the_same_launch_for_every_kernel(built_sm70, real_project):
    """Both match build_info()'s kernels to the binary's with the same globs: every kernel verify
    checked with a launch has an occupancy in the report, computed with the same shared memory."""
    rows = json.loads(real_project.run("verify", "--arch", "sm_70", "--json").stdout)["rows"]
    shared = {r["name"]: r["numbers"]["shared"] for r in rows if r["kind"] == "kernel"}
    report = json.loads(real_project.run("report", "--arch", "sm_70", "--json").stdout)
    assert report["ok"] and {k["kernel"] for k in report["kernels"]} == set(shared)
    for k in report["kernels"]:
        assert k["occupancy"] is not None, k["kernel"]
        assert k["occupancy"]["shared_bytes"] == shared[k["kernel"]], k["kernel"]


def test_verify_fails_on_a_schema_that_differs(built_sm70, real_project):
    schemas = real_project.root / "schemas" / "vllm_fa2_ops.toml"
    original = schemas.read_text()
    try:
        schemas.write_text(original.replace("int num_splits, Tensor? gen", "int num_split, Tensor? gen"))
        proc = real_project.run("verify", "--arch", "sm_70", check_rc=1)
        assert "varlen_fwd" in proc.stdout and "FAIL" in proc.stdout and "num_split," in proc.stdout
        schemas.write_text(original + 'missing_op = "missing_op(Tensor x) -> Tensor"\n')
        proc = real_project.run("verify", "--arch", "sm_70", check_rc=1)
        assert "_vllm_fa2_C::missing_op is missing" in proc.stdout
    finally:
        schemas.write_text(original)


def test_verify_detects_a_tampered_artifact(built_sm70, real_project, tmp_path):
    artifact = built_sm70 / "_vllm_fa2_C.abi3.so"
    saved = tmp_path / "saved.so"
    shutil.copy(artifact, saved)
    try:
        with open(artifact, "r+b") as f:
            f.seek(-1, 2)
            last = f.read(1)
            f.seek(-1, 2)
            f.write(bytes([last[0] ^ 1]))
        proc = real_project.run("verify", "--arch", "sm_70", check_rc=1)
        assert "_vllm_fa2_C.abi3.so" in proc.stderr and "sha256 mismatch" in proc.stderr
    finally:
        shutil.copy(saved, artifact)


def test_ops_without_sm70_kernels_raise_instead_of_crashing(built_sm70):
    """The library loads on a GPU-less machine; build_info says what it has (routes exactly
    when SM70 kernels are built); a call with CPU tensors is refused by torch's dispatcher (the
    ops have CUDA kernels only) and the process survives."""
    code = r"""
import json, sys, torch
torch.ops.load_library(sys.argv[1])
info = json.loads(torch.ops._vllm_fa2_C.build_info())
q = torch.zeros(4, 2, 64, dtype=torch.float16)
cu = torch.tensor([0, 4], dtype=torch.int32)
try:
    torch.ops._vllm_fa2_C.varlen_fwd(q, q, q, None, cu, cu, None, None, None, None, 4, 4, 0.0, 0.125,
                                     False, True, -1, -1, 0.0, False, 0, None)
    raised = None
except Exception as exc:
    raised = [type(exc).__name__, str(exc).splitlines()[0]]
print(json.dumps({"info": info, "raised": raised}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code, str(built_sm70 / "_vllm_fa2_C.abi3.so")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["info"]["library"] == "_vllm_fa2_C"
    assert result["info"]["sm70_kernels"] == bool(result["info"]["routes"])
    kind, message = result["raised"]
    assert (
        kind == "NotImplementedError"
        and "Could not run '_vllm_fa2_C::varlen_fwd'" in message
        and "'CPU' backend" in message
    )


LONG_PREFILL_OPS = r"""
import json, sys, torch
torch.ops.load_library(sys.argv[1])
ops = torch.ops._vllm_fa2_C


def refusal(call):
    try:
        call()
        return None
    except Exception as exc:
        return [type(exc).__name__, str(exc).splitlines()[0]]


shapes = json.loads(sys.argv[2])
bad = [(100, 300, 17, 1), (100, 300, 6, 4), (-1, 300, 6, 1)]
q = torch.zeros(4, 6, 256, dtype=torch.float16)
k = torch.zeros(4, 1, 256, dtype=torch.float16)
print(json.dumps({
    "plans": [json.loads(ops.gqa_prefill_plan(*s)) for s in shapes],
    "sizes": [ops.gqa_prefill_workspace_bytes(*s) for s in shapes],
    "refused": [
        [refusal(lambda: op(*s)) for op in (ops.gqa_prefill_workspace_bytes, ops.gqa_prefill_plan)] for s in bad
    ],
    "cpu_call": refusal(lambda: ops.gqa_prefill_fwd(q, k, k, None, None, 4, 0.0625, None)),
    "info": json.loads(ops.build_info())}))
"""

# Shapes of the oracle check: the reference workloads, short and long prompts, groups 1..16, two KV
# heads, a key count that is no multiple of anything, empty and one-token calls; the first two and
# (1, 1, 1, 1) have their workspace counted by hand below.
PLAN_SHAPES = [
    (8000, 128000, 6, 1),
    (1, 1, 1, 1),
    (8000, 40000, 6, 1),
    (1024, 16384, 4, 1),
    (256, 640, 2, 1),
    (777, 50001, 5, 1),
    (3000, 9000, 16, 2),
    (5, 0, 4, 4),
    (2048, 2048, 8, 8),
    (64, 8448, 1, 1),
    (512, 512, 1, 1),
]


@pytest.fixture(scope="module")
def long_prefill_ops(built_sm70):
    out = subprocess.run(
        [sys.executable, "-c", LONG_PREFILL_OPS, str(built_sm70 / "_vllm_fa2_C.abi3.so"), json.dumps(PLAN_SHAPES)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_long_prefill_ops_on_a_gpu_less_machine(long_prefill_ops):
    """gqa_prefill_workspace_bytes is the workspace of the plan gqa_prefill_plan describes (counted by
    hand for two shapes); both refuse what the route does not take with a ValueError saying why;
    build_info lists the route (an object naming its op) and its kernel with its tiles and the
    block-size constants the oracle walks with; gqa_prefill_fwd with CPU tensors is refused by
    torch's dispatcher and the process survives."""
    r = long_prefill_ops
    assert r["sizes"] == [p["workspace_bytes"] for p in r["plans"]]
    # 48,000 packed rows x (2 x 4,096 x 2 + 2 x 32 x 4 + 1,024 + 8) bytes: blocks of 4,096 keys,
    # two score buffers, two tile-maximum buffers, the FP32 accumulator and m, l per row.
    assert r["sizes"][0] == 848_256_000
    # One row padded to 128, blocks of 128 keys: 2 x 32,768 + 2 x 512 + 131,072 + 1,024 (each part
    # rounded up to 256 bytes).
    assert r["sizes"][1] == 198_656
    groups = "num_heads_q must be a multiple of num_heads_k with at most 16 query heads per KV head"
    for (workspace, plan), why in zip(
        r["refused"], [groups, groups, "seqlen_q = -1, seqlen_k = 300 out of range"], strict=True
    ):
        assert workspace == plan and workspace[0] == "ValueError" and why in workspace[1]
    kind, message = r["cpu_call"]
    assert kind == "NotImplementedError" and "'CPU' backend" in message
    assert {"name": routes.GQA, "op": "gqa_prefill_fwd", "env": {}} in r["info"]["routes"]
    decode = {"name": routes.DECODE, "op": "varlen_fwd", "env": {routes.DECODE_ENV: "1"}}
    assert r["info"]["routes"] == [routes.EXACT, {"name": routes.GQA, "op": "gqa_prefill_fwd", "env": {}}, decode]
    kernel = next(k for k in r["info"]["kernels"] if k["kernel"] == "sm70_gqa_prefill_kernel")
    assert kernel["route"] == routes.GQA and kernel["head_dim"] == 256 and kernel["warps"] == 4
    # Two CTAs per SM beside the static 1,408 bytes (tile maxima, row scales, bad-key marks).
    assert kernel["dynamic_smem"] <= 48 * 1024 - 1408
    tiles = {
        t["kind"]: (t["rows_per_cta"], t["keys_per_iteration"], t["head_dims_per_iteration"]) for t in kernel["tiles"]
    }
    assert tiles == {
        "qk": (gqa_oracle.QK["rows"], gqa_oracle.QK["keys"], 256 // gqa_oracle.QK["stages"]),
        "pv": (gqa_oracle.PV["rows"], gqa_oracle.PV["keys"], 256),
    }
    assert kernel["block_plan"] == {
        "min_block_keys": gqa_oracle.MIN_KEYS,
        "max_block_keys": gqa_oracle.MAX_KEYS,
        "score_budget_bytes": gqa_oracle.BUDGET,
    }


def test_long_prefill_plan_op_agrees_with_the_oracle(long_prefill_ops):
    """gqa_prefill_plan (the op's block plan and launch sequence, from the C++ that runs them) equals
    the tests' oracle walk (gqa_oracle.py, written from the documented rules): per shape the block
    size, blocks and packed rows, and per launch its blocks and every CTA's kind and main-loop
    iterations in blockIdx order."""
    for shape, op in zip(PLAN_SHAPES, long_prefill_ops["plans"], strict=True):
        expected = gqa_oracle.plan(*shape)
        assert {k: v for k, v in op.items() if k != "workspace_bytes"} == expected, shape


def test_artifact_names_no_folder_of_this_machine(built_sm70, real_project):
    """Header paths reach the binary through __FILE__: neither the project, the workspace nor the
    Python environment (torch's headers) may appear in it, or the bytes depend on the machine."""
    data = (built_sm70 / "_vllm_fa2_C.abi3.so").read_bytes()
    import torch

    folders = {str(real_project.root), sys.prefix, str(Path(torch.__file__).parents[1])}
    assert [f for f in folders if f.encode() in data] == []


def test_build_is_reproducible_from_another_project_folder(built_sm70, real_project, tmp_path):
    """The same locked series built in another folder gives a byte-identical extension, from the
    same command lines (ninja runs in the build folder and spells every path through its links, so
    the object cache serves a build in any folder). The second build compiles everything itself
    (FA2PATCH_NO_CCACHE): two independent compilations, not one and a cache hit."""
    other = tmp_path / "elsewhere"
    shutil.copytree(real_project.root, other, ignore=shutil.ignore_patterns("work", "build"))
    env = {**real_project.env, "FA2PATCH_ROOT": str(other), "FA2PATCH_NO_CCACHE": "1"}
    for args in (["replay"], ["build", "--arch", "sm_70"]):
        subprocess.run([sys.executable, "-m", "fa2patch", *args], env=env, check=True, capture_output=True)
    mine = json.loads((built_sm70 / "manifest.json").read_text())
    theirs = json.loads((other / "build" / "sm_70" / "manifest.json").read_text())
    assert theirs["artifact"]["sha256"] == mine["artifact"]["sha256"]

    def compile_commands(manifest):  # without the ccache launcher
        return {k: [w for w in manifest["commands"][k] if Path(w).name != "ccache"] for k in ("cxx", "cuda")}

    assert compile_commands(theirs) == compile_commands(mine)
    commands = " ".join(compile_commands(mine)["cxx"] + compile_commands(mine)["cuda"])
    assert str(real_project.root) not in commands and str(other) not in commands, commands
    assert not any(w.startswith("-ffile-prefix-map") for w in commands.split())


# --- One list each: head dims (C++), sources (build description), kernel tiles (build_info). ---

SM70_DIR = "csrc/flash_attn/fa2patch/sm70"


def test_every_fa2patch_source_is_built_and_the_lab_builds_the_same_kernels(real_workspace):
    from fa2patch.compile.description import BuildDescription

    desc = BuildDescription.load(real_workspace)
    ours = sorted(
        str(p.relative_to(real_workspace))
        for p in (real_workspace / "csrc/flash_attn/fa2patch").rglob("*")
        if p.suffix in (".cu", ".cpp")
    )
    built = desc.host_sources + desc.arch("sm_70").cuda_sources
    assert [f for f in ours if f not in built] == []
    assert desc.arch("sm_90").cuda_sources == desc.arch("sm_70").cuda_sources


def test_one_instantiation_file_per_cpp_head_dim_each_built(real_workspace):
    import re

    from fa2patch.compile.description import BuildDescription

    head_dims = cpp_head_dims(real_workspace)
    assert head_dims == sorted(head_dims) and head_dims[-1] == 256
    cuda = BuildDescription.load(real_workspace).arch("sm_70").cuda_sources
    files = {int(m.group(1)): f for f in cuda if (m := re.fullmatch(rf"{SM70_DIR}/flash_fwd_sm70_hdim(\d+)\.cu", f))}
    assert sorted(files) == head_dims
    for d, f in files.items():  # each file instantiates the head dim its name says, and only that one
        text = (real_workspace / f).read_text()
        assert re.findall(r"run_flash_fwd_sm70<(\d+)>", text) == [str(d)]


def test_setup_py_builds_the_build_descriptions_fa2patch_sources(real_workspace):
    """FA2's setup.py takes fa2patch's sources from the build description: evaluate the `sources`
    of its CUDAExtension as written, with its own fa2patch_sources()."""
    import ast
    import os

    from fa2patch.compile.description import BuildDescription

    tree = ast.parse((real_workspace / "setup.py").read_text())
    helper = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "fa2patch_sources")
    namespace = {"os": os}
    exec(compile(ast.Module([helper], []), "setup.py", "exec"), namespace)
    extension = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and getattr(n.func, "id", "") == "CUDAExtension"
        and any(k.arg == "name" and getattr(k.value, "value", "") == "flash_attn_2_cuda" for k in n.keywords)
    )
    sources_expr = next(k.value for k in extension.keywords if k.arg == "sources")
    sources = eval(
        compile(ast.Expression(sources_expr), "setup.py", "eval"), {**namespace, "this_dir": str(real_workspace)}
    )
    desc = BuildDescription.load(real_workspace)
    # setup.py builds FA2's pybind module, so not the torch library (vllm_ops.cpp) nor its Python
    # module entry point (python_module.cpp).
    expected = [
        s
        for s in desc.host_sources
        if s.startswith("csrc/flash_attn/fa2patch/") and not s.endswith(("/vllm_ops.cpp", "/python_module.cpp"))
    ] + desc.arch("sm_70").cuda_sources
    assert [s for s in sources if "/fa2patch/" in s] == expected
    assert len(sources) == len(set(sources)) and all((real_workspace / s).is_file() for s in sources)


def test_build_info_lists_the_built_kernels_and_the_cpp_head_dims(built_sm70, real_workspace):
    """build_info() names every SM70 kernel of the SASS once; attention kernels carry a route and a
    tile, the others null; the sm70-dense kernels are exactly those of kHeadDims. (That each tile
    accounts for its kernel's hot loop is test_report_sass's check.)"""
    import re

    from fa2patch.compile import sass, toolchain
    from fa2patch.compile.extension import load_build_info

    artifact = built_sm70 / "_vllm_fa2_C.abi3.so"
    info = load_build_info(artifact)
    functions = [
        f
        for f in sass.parse_sass(toolchain.cuobjdump(toolchain.find_cuda12_binutil("cuobjdump"), ["-sass"], artifact))
        if f.arch == "sm_70"
    ]
    built = list(toolchain.demangle([f.name for f in functions]).values())
    listed = []
    for k in info["kernels"]:
        matches = [name for name in built if k["kernel"] in name]
        assert len(matches) == 1, (k["kernel"], built)
        listed += matches
        tile = [k[f] for f in ("head_dim", "rows_per_cta", "keys_per_iteration", "warps")]
        if k["route"] is None:
            assert tile == [None] * 4, k
        else:
            names = [r if isinstance(r, str) else r["name"] for r in info["routes"]]
            assert k["route"] in names and all(isinstance(v, int) and v > 0 for v in tile), k
    assert sorted(listed) == sorted(built)
    dense = [k for k in info["kernels"] if k["route"] == routes.EXACT]
    assert [k["kernel"] for k in dense] == [f"flash_fwd_sm70_kernel<{d}>" for d in cpp_head_dims(real_workspace)]
    assert [k["head_dim"] for k in dense] == cpp_head_dims(real_workspace)
    sass_dims = sorted(int(m.group(1)) for name in built if (m := re.search(r"flash_fwd_sm70_kernel<(\d+)>", name)))
    assert sass_dims == cpp_head_dims(real_workspace)


def test_route_names_are_written_once_in_each_language(real_workspace):
    """fa2patch.common.routes (Python) spells each route as route_names.h (C++) does, and the C++ sources
    write no route name outside that header (comments aside)."""
    import re

    fa2patch_dir = real_workspace / "csrc/flash_attn/fa2patch"
    header = (fa2patch_dir / "route_names.h").read_text()
    cpp = dict(re.findall(r"constexpr const char \*(k\w+Route) = \"([^\"]+)\";", header))
    assert cpp == {
        "kDenseRoute": routes.EXACT,
        "kDecodeRoute": routes.DECODE,
        "kGqaPrefillRoute": routes.GQA,
        "kDenseSplitKvRoute": routes.SPLITKV,
    }
    assert f'kDecodeEnv = "{routes.DECODE_ENV}"' in header
    names = re.compile("|".join(re.escape(f'"{n}"') for n in cpp.values()))
    elsewhere = [
        str(p.relative_to(real_workspace))
        for p in fa2patch_dir.rglob("*")
        if p.suffix in (".h", ".cuh", ".cpp", ".cu")
        and p.name != "route_names.h"
        and names.search(re.sub(r"//.*", "", p.read_text()))
    ]
    assert elsewhere == []


def test_decode_kernel_constants_are_the_models(real_workspace):
    """The model's mirror of the decode kernel's constants (fa2patch.model.decode_route) says what
    decode_sm70.h / decode_sm70.cu and routing's decode split say."""
    import re

    from fa2patch.model import decode_route

    sm70 = real_workspace / "csrc/flash_attn/fa2patch/sm70"
    text = (sm70 / "decode_sm70.h").read_text() + (sm70 / "decode_sm70.cu").read_text()
    consts = {k: int(v) for k, v in re.findall(r"constexpr int (k\w+) = (\d+);", text)}
    assert consts["kThreads"] == decode_route.THREADS
    assert consts["kKeysPerWarp"] == decode_route.KEYS_PER_WARP
    assert consts["kLoadsInFlight"] == decode_route.LOADS_IN_FLIGHT
    assert consts["kLoadsInFlightManyRows"] == decode_route.LOADS_IN_FLIGHT_MANY_ROWS
    assert consts["kManyRows"] == decode_route.MANY_ROWS
    assert "kInFlight = kHeadDim < 256 && kRows >= kManyRows ? kLoadsInFlightManyRows : kLoadsInFlight;" in text
    assert "constexpr int kSplitKeys = kWarps * kKeysPerWarp;" in text
    assert consts["kMaxRows"] == decode_route.MAX_ROWS
    dims = re.search(r"constexpr std::array<int, \d+> kHeadDims = \{([\d, ]+)\};", text)
    assert dims and tuple(int(x) for x in dims[1].split(",")) == decode_route.HEAD_DIMS
    instantiated = re.search(r"constexpr std::array<int, \d+> kRows = \{([\d, ]+)\};", text)
    assert instantiated and int(instantiated[1].split(",")[-1]) == decode_route.CTA_ROWS
    split = re.search(r"per_split = max\(kSplitKeys, ceil_div\(ceil_div\(.+\), (\d+)\) \* (\d+)\);", text)
    assert split and int(split[1]) == int(split[2]) == decode_route.SPLIT_ROUND
    routing = (real_workspace / "csrc/flash_attn/fa2patch/routing.cpp").read_text()
    assert f"kDecodeKeysPerSplit = {decode_route.SPLIT_KEYS};" in routing
    # The built-in rule: its bytes table (MiB by row class and head dim) and its row classes.
    table = re.search(r"kDecodeRuleBytes\[(\d+)\]\[(\d+)\] = \{(.+?)\};", routing, re.S)
    assert table, "routing.cpp: no kDecodeRuleBytes table"
    mib = tuple(
        tuple(int(x) for x in re.findall(r"(\d+) \* kMiB", row)) for row in re.findall(r"\{([^{}]+)\}", table[3])
    )
    assert mib == decode_route.RULE_MIB
    assert (int(table[1]), int(table[2])) == (len(decode_route.RULE_ROWS), len(decode_route.RULE_DIMS))
    classes = re.search(r"call\.rows == 1 \? 0 : call\.rows <= (\d+) \? 1 : call\.rows <= (\d+) \? 2 : 3;", routing)
    limit = re.search(r"call\.rows > (\d+)", routing)
    assert classes and limit, "routing.cpp: decode_kernel_rule's row classes not found"
    assert (1, int(classes[1]), int(classes[2]), int(limit[1])) == decode_route.RULE_ROWS
    dims = re.search(r"call\.head_dim <= (\d+) \? 0 : call\.head_dim <= (\d+) \? 1 : 2;", routing)
    assert dims and (int(dims[1]), int(dims[2])) == decode_route.RULE_DIMS[:2]
    # Under graph capture every call the rule's first test lets through takes the decode kernel
    # (rule_takes(..., capturing=True)), and before the bytes are read.
    capture = routing.index("if (capturing_graph()) { return call.head_dim <= 256; }")
    assert routing.index("call.rows > 8") < capture < routing.index("kDecodeRuleBytes[rows][dim]")
