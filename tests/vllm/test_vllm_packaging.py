# SPDX-License-Identifier: BSD-3-Clause
"""Packaging for vLLM, against the real source files of every supported vLLM release
(packaging/vllm-releases.toml, fetched through the package index by sha256; never copied here).

- The wheel: its RECORD, its contents, and, installed into a fresh venv that reuses this venv's
  torch, the extension imports as vLLM imports it and its schemas verify.
- The plugin, through each release's own plugin loader and gate functions (tests/vllm/vllm_gate_probe.py):
  the three gates say yes on capability 7.0 only, other capabilities get vLLM's own answers,
  and it refuses another torch, a release its wheel was not made for, or a foreign _vllm_fa2_C
  loaded first.
- The --vllm-src tree, built by vLLM's real cmake/external_projects/vllm_flash_attn.cmake
  (clang route) and installed the way vLLM's setup.py installs it: the artifact verifies, its
  kernels are the ninja build's, and vLLM's interface imports it.
"""

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from fa2patch.common.project import Project
from fa2patch.compile.verify import load_expected_schemas
from fa2patch.vllm import releases
from helpers import REPO, locked_toolchain, require_toolchain

MATRIX = releases.load(Project(REPO))
VERSIONS = MATRIX.versions()

PROBE = Path(__file__).with_name("vllm_gate_probe.py")
# The operators the extension must register: the list written down before any build.
_NAMESPACE, _SCHEMAS = load_expected_schemas(REPO / "schemas" / "vllm_fa2_ops.toml")
SCHEMA_OPS = sorted(f"{_NAMESPACE}::{name}" for name in _SCHEMAS)
YES = {"is_fa2_supported": [True, None], "get_flash_attn_version": 2, "supports_compute_capability": True}
# vLLM's own answers without an extension that serves the capability (written down beforehand).
NO = {
    "is_fa2_supported": [False, "FA2 is only supported on devices with compute capability >= 8"],
    "get_flash_attn_version": None,
    "supports_compute_capability": False,
}
# Stand-in for vLLM's own FA2 extension (the fork's, built for capability >= 8.0): it registers
# the torch library _vllm_fa2_C with vLLM's varlen_fwd schema and no build_info.
FORK_STANDIN = """import torch
_lib = torch.library.Library("_vllm_fa2_C", "DEF")
_lib.define(
    "varlen_fwd(Tensor! q, Tensor k, Tensor v, Tensor!? out, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
    "Tensor? seqused_k, Tensor? leftpad_k, Tensor? block_table, Tensor? alibi_slopes, int max_seqlen_q, "
    "int max_seqlen_k, float p_dropout, float softmax_scale, bool zero_tensors, bool is_causal, "
    "int window_size_left, int window_size_right, float softcap, bool return_softmax, int num_splits, "
    "Tensor? gen) -> Tensor[]"
)
"""


@pytest.fixture(scope="module")
def built(real_project, real_workspace):
    require_toolchain()
    real_project.run("build", "--arch", "sm_70")
    return real_project.root / "build" / "sm_70"


def make_venv(path: Path, wheel: Path) -> Path:
    """A fresh venv that reuses this environment's torch (a .pth file) with ``wheel`` installed."""
    venv.EnvBuilder(with_pip=False).create(path)
    import torch

    site = next(path.glob("lib/python*/site-packages"))
    (site / "torch-env.pth").write_text(str(Path(torch.__file__).parents[1]) + "\n")
    python = path / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
    )
    return python


def vllm_tree(vllm_src: Path, dest: Path, extension: Path | None = None, standin: bool = False) -> Path:
    """A copy of vLLM's sources whose vllm_flash_attn/ holds ``extension``, the fork stand-in or neither."""
    shutil.copytree(vllm_src, dest)
    fa = dest / "vllm" / "vllm_flash_attn"
    if extension is not None:
        shutil.copy(extension, fa / "_vllm_fa2_C.abi3.so")
    if standin:
        (fa / "_vllm_fa2_C.py").write_text(FORK_STANDIN)
    return dest


def probe(python: Path, tree: Path, caps: str, plugins: bool, env=None, extra=()) -> tuple[dict, str]:
    proc = subprocess.run(
        [str(python), str(PROBE), str(tree), caps, *(["--plugins"] if plugins else []), *extra],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=tree,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def wheel(built, real_project):
    out = json.loads(real_project.run("package", "--arch", "sm_70", "--json").stdout)
    assert out["ok"] is True
    return Path(out["wheel"])


@pytest.fixture(scope="module")
def wheel_python(wheel, tmp_path_factory):
    return make_venv(tmp_path_factory.mktemp("venv") / "wheel", wheel)


def test_wheel_record_contents_and_tags(wheel, built, real_workspace):
    manifest = json.loads((built / "manifest.json").read_text())
    torch_version = manifest["torch"]["version"]
    assert wheel.name == (f"fa2patch_vllm-0.1.0+torch{torch_version.replace('+', '.')}-cp39-abi3-linux_x86_64.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/RECORD"))
        record = zf.read(f"{info}/RECORD").decode().splitlines()
        for line in record:
            name, digest, size = line.rsplit(",", 2)
            if name == f"{info}/RECORD":
                continue
            data = zf.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={expected}" and int(size) == len(data), name
        assert {line.split(",")[0] for line in record} == names
        assert zf.read("fa2patch_vllm/_vllm_fa2_C.abi3.so") == (built / "_vllm_fa2_C.abi3.so").read_bytes()
        assert (
            "[vllm.general_plugins]\nfa2patch_v100 = fa2patch_vllm.plugin:register"
            in zf.read(f"{info}/entry_points.txt").decode()
        )
        assert "Root-Is-Purelib: false" in zf.read(f"{info}/WHEEL").decode()
        # The licences: fa2patch's, FA2's, and CUTLASS's as the comment that opens cutlass.h in the
        # tree the extension is built from (the FA2 sdist has no CUTLASS LICENSE.txt).
        header = (real_workspace / "csrc/cutlass/include/cutlass/cutlass.h").read_bytes()
        expected = {
            "LICENSE": (REPO / "LICENSE").read_bytes(),
            "NOTICE": (REPO / "NOTICE").read_bytes(),
            "flash-attn/LICENSE": (real_workspace / "LICENSE").read_bytes(),
            "flash-attn/AUTHORS": (real_workspace / "AUTHORS").read_bytes(),
            "flash-attn/csrc/cutlass/include/cutlass/cutlass.h.license": header[: header.index(b"*/\n") + 3],
        }
        assert (
            b"SPDX-License-Identifier: BSD-3-Clause"
            in expected["flash-attn/csrc/cutlass/include/cutlass/cutlass.h.license"]
        )
        metadata = zf.read(f"{info}/METADATA").decode()
        files = [
            line.removeprefix("License-File: ") for line in metadata.splitlines() if line.startswith("License-File:")
        ]
        assert files == list(expected)
        assert {n for n in names if n.startswith(f"{info}/licenses/")} == {f"{info}/licenses/{n}" for n in expected}
        for name, data in expected.items():
            assert zf.read(f"{info}/licenses/{name}") == data, name
        record_json = json.loads(zf.read("fa2patch_vllm/build.json"))
        assert record_json["bundles_extension"] is True
        assert record_json["cxx_standard"] == "c++20" == manifest["cxx_standard"]
        assert record_json["torch"]["version"] == torch_version
        assert (
            record_json["extension_sha256"] == hashlib.sha256((built / "_vllm_fa2_C.abi3.so").read_bytes()).hexdigest()
        )
        # Nothing in it names a folder of this machine.
        for name in names:
            data = zf.read(name)
            for folder in (str(REPO), str(built.parents[1]), sys.prefix, str(Path.home())):
                assert folder.encode() not in data, (name, folder)


def test_the_wheel_is_reproducible(wheel, real_project, tmp_path):
    again = json.loads(real_project.run("package", "--arch", "sm_70", "--out", str(tmp_path), "--json").stdout)
    assert Path(again["wheel"]).read_bytes() == wheel.read_bytes()


def test_installed_wheel_imports_as_vllm_does_and_verifies(wheel_python, real_project):
    """`from <package> import _vllm_fa2_C` (vLLM's import), then torch.ops.load_library on the
    same file, in either order: the operators are registered once and callable by name."""
    code = r"""
import json, sys, torch
if sys.argv[1] == "load-first":
    import importlib.util
    so = importlib.util.find_spec("fa2patch_vllm").submodule_search_locations[0] + "/_vllm_fa2_C.abi3.so"
    torch.ops.load_library(so)
from fa2patch_vllm import _vllm_fa2_C
torch.ops.load_library(_vllm_fa2_C.__file__)
ops = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("_vllm_fa2_C::"))
print(json.dumps({"file": _vllm_fa2_C.__file__, "ops": ops,
                  "info": json.loads(torch.ops._vllm_fa2_C.build_info())["library"]}))
"""
    for order in ("import-first", "load-first"):
        out = subprocess.run([str(wheel_python), "-c", code, order], capture_output=True, text=True, cwd="/")
        assert out.returncode == 0, out.stderr[-3000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert got["file"].startswith(str(wheel_python.parents[1]))
        assert got["ops"] == SCHEMA_OPS
        assert got["info"] == "_vllm_fa2_C"
    installed = Path(got["file"])
    proc = real_project.run("verify", "--artifact", str(installed), "--python", str(wheel_python), "--json")
    rows = {r["name"]: r["ok"] for r in json.loads(proc.stdout)["rows"]}
    assert rows["varlen_fwd"] and rows["fwd_kvcache"] and rows["build_info"] and rows["rpath"]


def made_for(wheel_python: Path, version: str):
    """The installed wheel's build record, edited to list ``version`` among the releases it serves
    (the wheel is built for the primary release's torch; the gates are the same code for all)."""
    record = next(wheel_python.parents[1].glob("lib/python*/site-packages/fa2patch_vllm/build.json"))
    data = json.loads(record.read_text())
    if version not in data["vllm"]:
        data["vllm"] = [*data["vllm"], version]
        record.write_text(json.dumps(data))
    return record


@pytest.mark.parametrize("version", VERSIONS)
def test_plugin_lifts_the_three_gates_on_7_0_only(wheel_python, vllm_sources, version, tmp_path):
    """Wheel route: vLLM has its own FA2 extension (the fork stand-in) that does not serve 7.0."""
    tree = vllm_tree(vllm_sources(version), tmp_path / "vllm", standin=True)
    without, _ = probe(wheel_python, tree, "7.0,7.5,8.0,9.0", plugins=False)
    assert without["gates"] == {"7.0": NO, "7.5": NO, "8.0": YES, "9.0": YES}
    assert without["extension"].endswith("vllm/vllm_flash_attn/_vllm_fa2_C.py") and without["vllm"] == version
    record = next(wheel_python.parents[1].glob("lib/python*/site-packages/fa2patch_vllm/build.json"))
    saved = record.read_text()
    made_for(wheel_python, version)
    try:
        on_v100, log = probe(wheel_python, tree, "7.0", plugins=True)
        assert on_v100["gates"] == {"7.0": YES}
        assert on_v100["extension"] == str(
            next(wheel_python.parents[1].glob("lib/python*/site-packages/fa2patch_vllm/_vllm_fa2_C.abi3.so"))
        )
        assert log.count("fa2patch-vllm: FlashAttention-2 on compute capability 7.0 through") == 1
        for cap in ("7.5", "8.0", "9.0"):
            other, log = probe(wheel_python, tree, cap, plugins=True)
            assert other["gates"] == {cap: without["gates"][cap]}, cap
            assert other["extension"] == without["extension"] and "fa2patch-vllm" not in log
    finally:
        record.write_text(saved)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_v100_backend_is_flash_attn_on_7_0_only(wheel_python, vllm_sources, version, tmp_path):
    """vLLM's registry resolves FLASH_ATTN to fa2patch's V100 backend on 7.0 (the plugin registers
    it there only), vLLM's class elsewhere; its segments restrict the release's own metadata."""
    tree = vllm_tree(vllm_sources(version), tmp_path / "vllm", standin=True)
    record = next(wheel_python.parents[1].glob("lib/python*/site-packages/fa2patch_vllm/build.json"))
    saved = record.read_text()
    made_for(wheel_python, version)
    try:
        on_v100, log = probe(wheel_python, tree, "7.0", plugins=True, extra=["--backend"])
        off, off_log = probe(
            wheel_python, tree, "7.0", plugins=True, extra=["--backend"], env={"FA2PATCH_VLLM_BACKEND": "0"}
        )
        others = {
            cap: probe(wheel_python, tree, cap, plugins=True, extra=["--backend"])[0] for cap in ("7.5", "8.0", "9.0")
        }
    finally:
        record.write_text(saved)
    ours = on_v100["backend"]
    assert ours["path"] == "fa2patch_vllm.backend.V100FlashAttentionBackend" and ours["supports_capability"]
    assert ours["cudagraph_support"] == "UNIFORM_BATCH" and ours["reorder_batch_threshold"] == 1
    assert "FLASH_ATTN is fa2patch_vllm.backend.V100FlashAttentionBackend on 7.0" in log
    # The batch (2 decodes, one chunk of 4096 rows over 65536 keys) in two calls, each on its rows.
    assert ours["segments"] == [
        {
            "kind": "exact",
            "num_actual_tokens": 2,
            "query_start_loc": [0, 1, 2],
            "seq_lens": [300, 20000],
            "block_rows": [0, 4096],
            "slots": [0, 1],
            "max_seqlen": [1, 20000],
        },
        {
            "kind": "long_prefill",
            "num_actual_tokens": 4096,
            "query_start_loc": [0, 4096],
            "seq_lens": [65536],
            "block_rows": [8192],
            "slots": [2, 4097],
            "max_seqlen": [4096, 65536],
        },
    ]
    # No split planned for heads the route cannot serve: head dim 128, or 17 query heads per KV head
    # (beyond the extension's max_group of 16); 48/4 is 12 per KV head.
    assert ours["builder_sets"] == {"num_heads_q": True, "kv_cache_spec": True}
    assert ours["long_prefill_group"] == {"6/1x256": True, "32/8x128": False, "17/1x256": False, "48/4x256": True}
    # vLLM's profiling run: this release's forward returns at once (zeroed output), and the impl reserves
    # a long prefill chunk's workspace (the stand-in's 1,000 bytes per row + heads) and LSE (8 bytes per row
    # and query head) once, for the batch's 4,096 rows of 12/2 x 256; nothing below min_seqlen_q rows, for
    # heads the route cannot serve, or for 16,384 rows, whose workspace exceeds the stand-in's cap.
    profile = ours["profile_run"]
    assert all(call["output_zeroed"] for call in profile["calls"]), profile
    assert profile["reserved"] == [["cpu", 4096, 12, 2, 1000 * 4096 + 12 + 8 * 4096 * 12]]
    vllms = "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend"
    assert off["backend"]["path"] == vllms and "FA2PATCH_VLLM_BACKEND=0" in off_log
    assert all(o["backend"]["path"] == vllms for o in others.values())


def test_the_wheel_serves_the_primary_release_and_refuses_another(wheel_python, vllm_sources, tmp_path):
    record = next(wheel_python.parents[1].glob("lib/python*/site-packages/fa2patch_vllm/build.json"))
    assert json.loads(record.read_text())["vllm"] == [MATRIX.primary.version]
    other = next(v for v in VERSIONS if v != MATRIX.primary.version)
    tree = vllm_tree(vllm_sources(other), tmp_path / "vllm", standin=True)
    got, log = probe(wheel_python, tree, "7.0", plugins=True)
    assert got["gates"] == {"7.0": NO} and got["extension"].endswith("_vllm_fa2_C.py")
    assert "fa2patch-vllm is not activated" in log
    assert f"vLLM {other} is not a release this wheel supports ({MATRIX.primary.version};" in log


def test_plugin_refuses_another_torch_and_changes_nothing(wheel_python, vllm_sources, tmp_path):
    tree = vllm_tree(vllm_sources(MATRIX.primary.version), tmp_path / "vllm", standin=True)
    record = next(wheel_python.parents[1].glob("lib/python*/site-packages/fa2patch_vllm/build.json"))
    saved = record.read_text()
    try:
        data = json.loads(saved)
        data["torch"]["version"] = "2.8.0+cu126"
        record.write_text(json.dumps(data))
        got, log = probe(wheel_python, tree, "7.0", plugins=True)
    finally:
        record.write_text(saved)
    assert got["gates"] == {"7.0": NO} and got["extension"].endswith("_vllm_fa2_C.py")
    assert "fa2patch-vllm is not activated" in log and "built for torch 2.8.0+cu126" in log


def test_plugin_refuses_when_a_foreign_extension_is_already_loaded(wheel_python, vllm_sources, tmp_path):
    """The fork's library loaded before the plugin runs: loading ours would clash on the torch
    library name, so the plugin must step back (and the process must survive)."""
    tree = vllm_tree(vllm_sources(MATRIX.primary.version), tmp_path / "vllm", standin=True)
    sitecustomize = tmp_path / "early"
    sitecustomize.mkdir()
    (sitecustomize / "sitecustomize.py").write_text(
        f"import sys; sys.path.insert(0, {str(tree)!r}); import vllm.vllm_flash_attn._vllm_fa2_C\n"
    )
    got, log = probe(wheel_python, tree, "7.0", plugins=True, env={"PYTHONPATH": str(sitecustomize)})
    assert got["gates"] == {"7.0": NO} and got["extension"].endswith("_vllm_fa2_C.py")
    assert "fa2patch-vllm is not activated" in log and "already loaded" in log


# --- the --vllm-src route ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_src_package(built, real_project, tmp_path_factory):
    dest = tmp_path_factory.mktemp("vsrc")
    out = json.loads(
        real_project.run("package", "--vllm-src", str(dest / "tree"), "--out", str(dest / "dist"), "--json").stdout
    )
    return Path(out["vllm_src"]), Path(out["wheel"]), out


@pytest.fixture(scope="module")
def vllm_built_tree(vllm_src_package, vllm_src, built, tmp_path_factory):
    """The tree built and installed by vLLM's real vllm_flash_attn.cmake, as setup.py does it
    (fa2patch.vllm.cmake, clang route: a stand-in top level, vLLM's needs nvcc). No build type:
    setup.py's RelWithDebInfo adds -g, and this build must be byte-identical to fa2patch build's."""
    tree, _, _ = vllm_src_package
    from fa2patch.compile import toolchain
    from fa2patch.vllm import cmake as vllm_cmake

    root = tmp_path_factory.mktemp("vllm-cmake")
    pins = locked_toolchain()
    prefix = vllm_src.parent / "installed"
    shutil.copytree(vllm_src, prefix, dirs_exist_ok=True)
    run = vllm_cmake.Run(
        vllm_src,
        tree,
        root,
        prefix,
        "clang",
        sys.executable,
        build_type="",
        jobs=2,
        clang=toolchain.find_clang(pins.clang),
        cuda_path=toolchain.assemble_cuda_path(root / "cuda", pins),
    )
    log = []
    try:
        vllm_cmake.configure(run, log.append)
        vllm_cmake.build_and_install(run, log.append)
    except Exception:
        print("\n".join(log)[-6000:])
        raise
    return prefix


def test_vllm_src_tree_is_what_vllm_cmake_expects(vllm_src_package):
    tree, plugin_wheel, out = vllm_src_package
    assert out["source_matches_lock"] is True and out["cxx_standard"] == "c++20"
    assert (tree / "CMakeLists.txt").is_file() and (tree / "fa2patch-build.toml").is_file()
    cmake = (tree / "CMakeLists.txt").read_text()
    assert "CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON" in cmake and "CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON" in cmake
    assert sorted(p.relative_to(tree).as_posix() for p in (tree / "vllm_flash_attn").rglob("*.py")) == [
        "vllm_flash_attn/layers/rotary.py",
        "vllm_flash_attn/ops/triton/rotary.py",
    ]
    assert (
        "from vllm.vllm_flash_attn.ops.triton.rotary import" in (tree / "vllm_flash_attn/layers/rotary.py").read_text()
    )
    assert plugin_wheel.name == "fa2patch_vllm-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(plugin_wheel) as zf:
        assert not [n for n in zf.namelist() if n.endswith(".so")]
        assert json.loads(zf.read("fa2patch_vllm/build.json"))["bundles_extension"] is False


def test_vllm_cmake_builds_and_installs_the_tree_and_it_verifies(
    vllm_built_tree, built, real_project, vllm_src_package
):
    tree, _, _ = vllm_src_package
    installed = vllm_built_tree / "vllm" / "vllm_flash_attn"
    assert (installed / "_vllm_fa2_C.abi3.so").is_file()
    assert (installed / "layers" / "rotary.py").is_file() and not (installed / "_vllm_fa3_C.abi3.so").exists()
    proc = real_project.run(
        "verify",
        "--artifact",
        str(installed / "_vllm_fa2_C.abi3.so"),
        "--workspace",
        str(tree),
        "--json",
        check_rc=None,
    )
    rows = json.loads(proc.stdout)["rows"]
    assert proc.returncode == 0, [r for r in rows if not r["ok"]]
    manifest = json.loads((built / "manifest.json").read_text())
    # One kernel row per kernel that ptxas reported in the ninja build.
    assert sum(r["kind"] == "kernel" for r in rows) == sum(k["entry"] for k in manifest["ptxas_kernels"])
    # Same sources, same flags, same folders mapped away: the very bytes of the ninja build.
    assert (
        hashlib.sha256((installed / "_vllm_fa2_C.abi3.so").read_bytes()).hexdigest() == manifest["artifact"]["sha256"]
    )


def test_vllm_src_route_gates(vllm_built_tree, vllm_src_package, tmp_path):
    """vLLM built fa2patch's extension itself; the plugin-only wheel lifts the gates on 7.0."""
    _, plugin_wheel, _ = vllm_src_package
    python = make_venv(tmp_path / "venv", plugin_wheel)
    tree = vllm_built_tree
    ours = str(tree / "vllm" / "vllm_flash_attn" / "_vllm_fa2_C.abi3.so")
    without, _ = probe(python, tree, "7.0,7.5,8.0", plugins=False)
    assert without["gates"] == {"7.0": NO, "7.5": NO, "8.0": YES} and without["extension"] == ours
    with_plugin, log = probe(python, tree, "7.0", plugins=True)
    assert with_plugin["gates"] == {"7.0": YES} and with_plugin["extension"] == ours
    assert "through the _vllm_fa2_C that vLLM built from fa2patch's source tree" in log
    other, _ = probe(python, tree, "8.0", plugins=True)
    assert other["gates"] == {"8.0": YES}


# --- the GPU lab script, as far as a CPU goes ----------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_lab_script_sets_up_vllms_test_through_vllms_interface(vllm_sources, version, built, tmp_path):
    """ci/gpu-vllm.sh, per supported release: without a GPU `run` skips with exit 3; `collect` does
    the whole set-up and finds vLLM's 160 FA2 fp16 cases and the 36 KV-view cases, with the extension
    imported by vLLM's interface from vllm/vllm_flash_attn/."""
    import tarfile

    vllm_src = vllm_sources(version)
    archive = tmp_path / f"vllm-src-{version}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(vllm_src, arcname=vllm_src.name)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "FA2PATCH_VLLM_ARCHIVE": str(archive),
        "OUT": str(tmp_path / "out"),
        "FA2PATCH_VLLM_EXTENSION": str(built / "_vllm_fa2_C.abi3.so"),
    }
    script = [str(REPO / "ci" / "gpu-vllm.sh")]
    import torch

    if not torch.cuda.is_available():
        run = subprocess.run(["bash", *script, "run"], env=env, capture_output=True, text=True)
        assert run.returncode == 3 and "SKIP: no GPU" in run.stdout
    collect = subprocess.run(["bash", *script, "collect"], env=env, capture_output=True, text=True)
    assert collect.returncode == 0, collect.stdout + collect.stderr
    assert "160 vLLM FA2 fp16 cases, 36 KV-view cases, 6 per-request backend cases" in collect.stdout
    summary = json.loads((tmp_path / "out" / f"vllm-summary-{version}.json").read_text())
    assert summary["imported_by_vllm_interface"] and summary["fa2patch_ops"]


# --- build --python ------------------------------------------------------------------------------

FAKE_TORCH = """__version__ = "{version}"
class version:
    cuda = {cuda!r}
class _C:
    _GLIBCXX_USE_CXX11_ABI = True
    @staticmethod
    def _cuda_getArchFlags():
        return "{archs}"
"""


def fake_python(tmp_path, version, cuda, archs) -> Path:
    """An interpreter whose `import torch` finds a stand-in reporting these facts (no such torch
    is installed here): a wrapper that puts the stand-in first on PYTHONPATH."""
    root = tmp_path / "fake-site"
    (root / "torch" / "utils").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text(FAKE_TORCH.format(version=version, cuda=cuda, archs=archs))
    (root / "torch" / "utils" / "__init__.py").write_text("")
    (root / "torch" / "utils" / "cpp_extension.py").write_text(
        "def include_paths():\n    return ['/nonexistent/include']\n"
        "def library_paths():\n    return ['/nonexistent/lib']\n"
    )
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={root} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@pytest.mark.parametrize(
    "version, cuda, archs, expected",
    [
        (
            "2.14.0+cu130",
            "13.0",
            "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120",
            [
                "torch 2.14.0+cu130",
                "carries no sm_70 code",
                "actual:   sm_75 sm_80 sm_86 sm_90 sm_100 sm_120",
                # the hint names what works for vLLM 0.33, and the check-only mode
                "vLLM 0.33 pins torch 2.14.0: install PyTorch's CUDA 12.6 build of it",
                "--allow-torch-without-sm70",
            ],
        ),
        ("2.9.1+cpu", None, "", ["torch 2.9.1+cpu", "is a CPU build"]),
        ("2.11.0+cu130", "13.0", "sm_70 sm_80 sm_90", ["CUDA major version mismatch", "actual:   13.0"]),
    ],
)
def test_build_refuses_a_torch_that_cannot_serve_sm70(
    real_project, real_workspace, tmp_path, version, cuda, archs, expected
):
    require_toolchain()
    python = fake_python(tmp_path, version, cuda, archs)
    proc = real_project.run("build", "--arch", "sm_70", "--python", str(python), check_rc=2)
    assert all(e in proc.stderr for e in expected), proc.stderr
    assert str(python) in proc.stderr or "CUDA major" in proc.stderr


def test_a_cpu_torch_is_refused_even_for_a_check_only_build(real_project, real_workspace, tmp_path):
    """No libtorch_cuda to link: nothing to check."""
    require_toolchain()
    python = fake_python(tmp_path, "2.14.0+cpu", None, "")
    proc = real_project.run(
        "build", "--arch", "sm_70", "--python", str(python), "--allow-torch-without-sm70", check_rc=2
    )
    assert "torch 2.14.0+cpu" in proc.stderr and "is a CPU build" in proc.stderr


def torch_without_sm70(tmp_path) -> Path:
    """This environment's torch (headers, libraries, CUDA 12.8), made to report the arch list of a
    torch without sm_70 (as the package index's 2.14.0 does): a wrapper whose sitecustomize
    replaces the one fact."""
    site = tmp_path / "no-sm70"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import torch\ntorch._C._cuda_getArchFlags = lambda: 'sm_75 sm_80 sm_86 sm_90 sm_100 sm_120'\n"
    )
    wrapper = tmp_path / "python-no-sm70"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_check_only_build_is_built_verified_and_refused_by_package(built, real_project, tmp_path):
    """--allow-torch-without-sm70: the same build (same bytes) against a torch that cannot run it,
    recorded as check-only; verify loads it with that torch and says so; package refuses it with
    the manifest, the expected and the actual build."""
    real_project.run("build", "--arch", "sm_70")  # a refused build removes the manifest before it
    normal = json.loads((built / "manifest.json").read_text())
    python = torch_without_sm70(tmp_path)
    try:
        out = json.loads(
            real_project.run(
                "build", "--arch", "sm_70", "--python", str(python), "--allow-torch-without-sm70", "--json"
            ).stdout
        )
        manifest = out["manifest"]
        assert manifest["check_only"] == {
            "why": [
                f"torch {normal['torch']['version']} carries no sm_70 code (arch list: sm_75 sm_80 sm_86 "
                "sm_90 sm_100 sm_120)"
            ],
            "preload": [],
        }  # same CUDA major: torch's own libcudart serves it
        assert manifest["artifact"]["sha256"] == normal["artifact"]["sha256"]
        rows = {
            r["name"]: r for r in json.loads(real_project.run("verify", "--arch", "sm_70", "--json").stdout)["rows"]
        }
        assert all(r["ok"] for r in rows.values())
        assert f"({python}); check-only build, not for packaging: torch" in rows["torch"]["detail"]
        assert rows["import"]["ok"] and rows["varlen_fwd"]["ok"]
        proc = real_project.run("package", "--arch", "sm_70", "--out", str(tmp_path / "dist"), check_rc=1)
        assert f"{built / 'manifest.json'}: a check-only build is not packaged" in proc.stderr
        assert "expected: a build against a torch that runs sm_70" in proc.stderr
        assert f"actual:   a build against torch {normal['torch']['version']} ({python}): " in proc.stderr
        assert not (tmp_path / "dist").exists()
    finally:
        real_project.run("build", "--arch", "sm_70")


def test_build_against_another_interpreter_records_it_and_verify_loads_with_it(built, wheel_python, real_project):
    """Another venv's interpreter (same torch, so the build is a no-op): the manifest names it and
    verify loads the extension with it."""
    try:
        real_project.run("build", "--arch", "sm_70", "--python", str(wheel_python))
        manifest = json.loads((built / "manifest.json").read_text())
        assert manifest["torch"]["python"] == str(wheel_python)
        assert manifest["torch"]["arch_list"][0] == "sm_70"
        code = (
            "import json,sys; from pathlib import Path; from fa2patch.compile import verify; "
            "calls=[]; real=verify.probe_extension; "
            "verify.probe_extension=lambda a,s,p,*r: calls.append(p) or real(a,s,p,*r); "
            "m,rows=verify.verify(Path(sys.argv[1]),Path(sys.argv[2]),Path(sys.argv[3])); "
            "print(json.dumps({'calls':calls,'ok':all(r.ok for r in rows)}))"
        )
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                code,
                str(built),
                str(real_project.root / "schemas" / "vllm_fa2_ops.toml"),
                str(real_project.root / "budgets.toml"),
            ],
            capture_output=True,
            text=True,
            check=True,
            env=real_project.env,
        ).stdout
        assert json.loads(out.strip().splitlines()[-1]) == {"calls": [str(wheel_python)], "ok": True}
    finally:
        real_project.run("build", "--arch", "sm_70")
