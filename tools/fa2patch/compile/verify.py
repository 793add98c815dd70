# SPDX-License-Identifier: BSD-3-Clause
"""verify: the built extension has exactly vLLM's operators, and every kernel is in budget.

1. Load the extension with torch in a subprocess and compare each `_vllm_fa2_C` operator
   schema with the expected-schema file (both parsed by torch, compared as strings).
2. Per kernel of the device code: registers, stack, shared and local memory (cuobjdump), spill
   bytes (the build's ptxas -v log), compared with the budgets file.
3. Kernels that must use tensor cores (the build description's globs): HMMA present and no
   trap instruction in their SASS (a clang build without the nvcc version macros compiles
   every CuTe MMA to a trap, docs/DESIGN.md §5).
4. Artifact hygiene: no RPATH/RUNPATH, only libraries torch already provides (NEEDED), no
   folder of the build machine in its bytes, libstdc++ shared with torch, no private CPython
   symbol (the .abi3.so name promises the limited API) and no libpython.
Kernels are named by globs on their demangled names (``sass.kernel_matches``).
"""

import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fa2patch.common.errors import CheckFailed, EnvironmentProblem, mismatch
from fa2patch.compile import sass, toolchain
from fa2patch.compile.extension import launches_of, load_manifest, manifest_path, python_json

SCHEMA_PROBE = r"""
import ctypes, importlib.machinery, importlib.util, json, sys, torch
lib, ns, expected, preload = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
for path in preload:  # a check-only build's own CUDA runtime (another major than torch's)
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
torch.ops.load_library(lib)
names = sorted(n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names()
               if n.startswith(ns + "::"))
actual = {}
for n in names:
    op = getattr(getattr(torch.ops, ns), n)
    actual[n] = [str(getattr(op, o)._schema) for o in op.overloads()]
norm = {}
for n, text in expected.items():
    try:
        norm[n] = str(torch._C.parse_schema(ns + "::" + text))
    except RuntimeError as exc:
        norm[n] = "UNPARSEABLE: " + str(exc).splitlines()[0]
info = json.loads(getattr(torch.ops, ns).build_info()) if "build_info" in actual else {}
# vLLM imports the extension as a Python module (`from . import _vllm_fa2_C`): PyInit_<name>.
name = lib.rsplit("/", 1)[-1].split(".")[0]
try:
    loader = importlib.machinery.ExtensionFileLoader(name, lib)
    loader.exec_module(importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader)))
    imported = None
except Exception as exc:
    imported = f"{type(exc).__name__}: {exc}"
print(json.dumps({"actual": actual, "expected": norm, "build_info": info, "module": name,
                  "import_error": imported, "torch": torch.__version__}))
"""


@dataclass
class Row:
    kind: str  # "schema" or "kernel"
    name: str
    ok: bool
    detail: str
    numbers: dict | None = None


def load_expected_schemas(path: Path) -> tuple[str, dict[str, str]]:
    if not path.is_file():
        raise EnvironmentProblem(f"{path}: expected-schema file not found")
    data = tomllib.loads(path.read_text())
    return data["namespace"], dict(data["ops"])


def probe_extension(
    artifact: Path, schemas_path: Path, python: str = sys.executable, preload: Sequence[str] = ()
) -> dict:
    """Load the extension with torch in a subprocess: its operators' schemas, the expected ones
    parsed by the same torch, its build_info(), whether it imports as a Python module, and the
    torch version; {"error": ...} if it does not load. ``preload``: shared libraries loaded first
    (a check-only build's CUDA runtime)."""
    ns, expected = load_expected_schemas(schemas_path)
    got = python_json(SCHEMA_PROBE, str(artifact), ns, json.dumps(expected), json.dumps(list(preload)), python=python)
    return got if "error" in got else {"namespace": ns, **got}


def check_load(artifact: Path, manifest: dict, python: str, got: dict) -> list[Row]:
    """Which torch loaded it, and whether it imports as the Python module vLLM imports."""
    if "error" in got:
        return []
    check = manifest.get("check_only")
    rows = [
        Row(
            "link",
            "torch",
            True,
            f"loaded with torch {got['torch']} ({python})"
            + (f"; check-only build, not for packaging: {'; '.join(check['why'])}" if check else ""),
        )
    ]
    ok = got["import_error"] is None
    rows.append(
        Row(
            "link",
            "import",
            ok,
            f"imports as the Python module {got['module']} (vLLM's `from . import {got['module']}`)"
            if ok
            else f"{artifact}: does not import as a Python module: {got['import_error']}",
        )
    )
    return rows


def check_schemas(artifact: Path, schemas_path: Path, got: dict) -> list[Row]:
    if "error" in got:
        return [Row("schema", "load", False, f"{artifact}: torch could not load it:\n{got['error']}")]
    ns, expected = got["namespace"], load_expected_schemas(schemas_path)[1]
    rows = []
    for name, want in got["expected"].items():
        have = got["actual"].get(name)
        if not have:
            rows.append(Row("schema", name, False, f"{artifact}: operator {ns}::{name} is missing"))
        elif have != [want]:
            rows.append(
                Row("schema", name, False, mismatch("schema", f"{schemas_path} vs {artifact}", want, " | ".join(have)))
            )
        else:
            rows.append(Row("schema", name, True, "exact match"))
    for name in sorted(set(got["actual"]) - set(expected)):
        rows.append(Row("schema", name, False, f"{artifact}: operator {ns}::{name} is not in {schemas_path}"))
    return rows


@dataclass
class Budget:
    max_registers: int = 255
    max_spill_bytes: int = 0
    max_shared_bytes: int = 96 * 1024


def load_budgets(path: Path) -> tuple[Budget, dict[str, Budget]]:
    """The default budget and {demangled-name glob: budget} of the [[kernel]] tables."""
    if not path.is_file():
        raise EnvironmentProblem(f"{path}: budgets file not found")
    data = tomllib.loads(path.read_text())
    try:
        default = Budget(**data.get("default", {}))
        overrides = {
            k.pop("pattern"): Budget(**{**default.__dict__, **k}) for k in [dict(x) for x in data.get("kernel", [])]
        }
    except (TypeError, KeyError) as exc:
        raise CheckFailed(f"{path}: malformed budgets: {exc!r}") from exc
    for pattern, b in [("default", default), *overrides.items()]:
        if b.max_spill_bytes != 0:
            raise CheckFailed(
                mismatch(f"max_spill_bytes of {pattern!r}", str(path), 0, b.max_spill_bytes)
                + "\n  (zero spills is a hard rule)"
            )
    return default, overrides


def check_kernels(
    manifest: dict, artifact: Path, budgets_path: Path, launches: dict[str, tuple[int, int]]
) -> list[Row]:
    """``launches``: {demangled-name glob: (threads, dynamic shared bytes)}, from build_info().
    Every pattern (budgets, tensor-core kernels, launches) is a glob on the demangled name."""
    tool = toolchain.find_cuda12_binutil("cuobjdump")
    if tool is None:
        raise EnvironmentProblem(f"cuobjdump: not found\n  install: {toolchain.PIP_BUILD}")
    default, overrides = load_budgets(budgets_path)
    arch = manifest["arch"]
    resources = [
        r
        for r in sass.parse_resource_usage(toolchain.cuobjdump(tool, ["--dump-resource-usage"], artifact))
        if r.arch == arch
    ]
    functions = {f.name: f for f in sass.parse_sass(toolchain.cuobjdump(tool, ["-sass"], artifact)) if f.arch == arch}
    # Without the build's ptxas -v log (an artifact built elsewhere, e.g. by CMake), spills are
    # bounded by the binary's stack frame: spilled registers live there, so 0 proves none.
    from_log = manifest.get("ptxas_kernels") is not None
    ptxas = {k["name"]: k for k in manifest["ptxas_kernels"] or []}
    names = sorted({r.name for r in resources} | set(ptxas))
    pretty = toolchain.demangle(names)
    patterns = manifest["tensor_core_kernels"]
    rows = []
    by_name = {r.name: r for r in resources}
    for name in names:
        budget = sass.first_match(pretty[name], overrides, default)
        res, px, fn = by_name.get(name), ptxas.get(name), functions.get(name)
        problems = []
        if res is None:
            problems.append("in the ptxas log but not in the binary")
        if px is None and from_log:
            problems.append("no ptxas -v report for it (spills unknown)")
        if res is not None:
            regs, own_shared = res.registers, res.shared
        elif px is not None:
            regs, own_shared = px["registers"], px["smem"]
        else:
            rows.append(Row("kernel", pretty[name], False, "; ".join(problems)))
            continue
        spills = (px["spill_stores"] + px["spill_loads"]) if px else (res.stack if res else None)
        launch = sass.first_match(pretty[name], launches)
        tensor_core = any(sass.kernel_matches(pretty[name], p) for p in patterns)
        if launch is None and tensor_core:
            problems.append("no launch configuration in build_info() (dynamic shared memory unknown)")
        shared = own_shared + (launch[1] if launch else 0)
        if regs > budget.max_registers:
            problems.append(f"registers expected <= {budget.max_registers}, actual {regs}")
        notes: list[str] = []
        if spills is not None and spills > budget.max_spill_bytes:
            what = "spill bytes" if px else "stack frame bytes (no ptxas log: a spill-free kernel has none)"
            # The spill rule is about V100 speed, so it binds the shipped sm_70 SASS; a lab build
            # (another compiler and architecture, only for correctness) reports its spills.
            (notes if manifest.get("lab") else problems).append(
                f"{what} expected <= {budget.max_spill_bytes}, actual {spills}"
                + (" (lab build: not a budget)" if manifest.get("lab") else "")
            )
        if shared > budget.max_shared_bytes:
            problems.append(f"shared memory (static + dynamic) expected <= {budget.max_shared_bytes}, actual {shared}")
        hmma = fn.hmma if fn else 0
        traps = fn.traps if fn else 0
        # A lab build (sm_90) runs Volta's mma.m8n8k4 emulated, without HMMA.884 in its SASS.
        if tensor_core and not manifest.get("lab"):
            if hmma == 0:
                problems.append("tensor-core kernel without HMMA instructions")
            if traps:
                problems.append(f"tensor-core kernel with {traps} trap instruction(s)")
        numbers = {
            "registers": regs,
            "spill_bytes": spills,
            "stack": res.stack if res else None,
            "shared": shared,
            "local": res.local if res else None,
            "hmma": hmma,
            "traps": traps,
        }
        rows.append(Row("kernel", pretty[name], not problems, "; ".join(problems + notes) or "ok", numbers))
    for pat in patterns:
        if not any(sass.kernel_matches(pretty[n], pat) for n in names):
            rows.append(Row("kernel", pat, False, f"no kernel matches the tensor-core pattern {pat!r}"))
    return rows


# Libraries an extension may link: those torch's wheels (and the C/C++ runtime) already put in
# the process. Anything else would have to exist on the user's machine by luck.
ALLOWED_NEEDED = [
    r"libc10(_cuda)?\.so",
    r"libtorch(_cpu|_cuda)?\.so",
    r"libcudart\.so\.\d+",
    r"libstdc\+\+\.so\.6",
    r"libgcc_s\.so\.1",
    r"lib(c|m|dl|pthread|rt)\.so\.\d+",
    r"ld-linux-x86-64\.so\.2",
]


def _readelf(args: list[str], artifact: Path) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["readelf", *args, str(artifact)], capture_output=True, text=True)
    except OSError as exc:
        raise EnvironmentProblem(f"readelf: cannot run it: {exc}\n  install: apt-get install -y binutils") from exc


def check_hygiene(artifact: Path, machine_folders: list[Path]) -> list[Row]:
    """What the artifact asks of the machine it lands on: libraries, search paths, folders."""
    proc = _readelf(["-d", "-W"], artifact)
    if proc.returncode != 0:
        return [
            Row("link", "libstdc++", False, f"{artifact}: not a shared library readelf can read: {proc.stderr.strip()}")
        ]
    dynamic = proc.stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    rows = []
    # A statically linked libstdc++ has its own locale tables, and C++ stream formatting across
    # the torch boundary then crashes (seen on the lab machine, whose $CXX links libstdc++
    # statically: every error message with a number segfaulted).
    ok = any(n.startswith("libstdc++.so") for n in needed)
    rows.append(
        Row(
            "link",
            "libstdc++",
            ok,
            "linked dynamically (shared with torch)"
            if ok
            else mismatch("NEEDED libraries", str(artifact), "libstdc++.so.6 among them", needed)
            + "\n  (the host compiler linked libstdc++ statically; use the system g++/clang++)",
        )
    )
    foreign = [n for n in needed if not any(re.fullmatch(p, n) for p in ALLOWED_NEEDED)]
    rows.append(
        Row(
            "link",
            "needed",
            not foreign,
            f"{len(needed)} libraries, all provided by torch or the C/C++ runtime"
            if not foreign
            else mismatch(
                "NEEDED libraries",
                str(artifact),
                "only torch's and the C/C++ runtime's (libc10, libtorch*, libcudart, libstdc++, libc...)",
                foreign,
            ),
        )
    )
    paths = re.findall(r"\((RPATH|RUNPATH)\)\s+Library (?:rpath|runpath): \[([^\]]*)\]", dynamic)
    rows.append(
        Row(
            "link",
            "rpath",
            not paths,
            "no RPATH/RUNPATH"
            if not paths
            else mismatch(
                "library search path",
                str(artifact),
                "none (torch's libraries are already loaded when the extension is)",
                [f"{k}={v}" for k, v in paths],
            ),
        )
    )
    data = artifact.read_bytes()
    named = sorted({str(f) for f in machine_folders if len(str(f)) > 1 and str(f).encode() in data})
    rows.append(
        Row(
            "link",
            "build paths",
            not named,
            "names no folder of the build machine"
            if not named
            else mismatch("folders of the build machine", str(artifact), "none", named),
        )
    )
    symbols = re.findall(r"\bUND\s+(\S+)", _readelf(["--dyn-syms", "-W"], artifact).stdout)
    private = sorted({sym.split("@")[0] for sym in symbols if sym.startswith("_Py")})
    libpython = [n for n in needed if n.startswith("libpython")]
    ok = not private and not libpython
    rows.append(
        Row(
            "link",
            "python abi",
            ok,
            "limited API only (abi3), no libpython"
            if ok
            else mismatch(
                "CPython symbols/libraries", str(artifact), "limited API only, no libpython", private + libpython
            ),
        )
    )
    return rows


# Prefixes every Linux machine has: a Python installed there is no folder of *this* machine, and
# an artifact built with -g names /usr/include and /usr/local/cuda wherever it is built.
SYSTEM_PREFIXES = ("/", "/usr", "/usr/local")


def machine_folders(*extra: Path, python: str | None = None) -> list[Path]:
    """Folders whose names would tie an artifact to this machine."""
    folders = [Path.home(), *extra]
    if python:
        # The environment's prefix (a venv's own folder) and its base interpreter's, unless that is
        # the system's (a venv of /usr/bin/python3).
        for prefix in (Path(python).absolute().parents[1], Path(python).resolve().parents[1]):
            if str(prefix) not in SYSTEM_PREFIXES and prefix not in folders:
                folders.append(prefix)
        torch = toolchain.torch_info(python)
        if torch:
            folders.append(Path(torch["site_packages"]))
    return folders


def verify(
    build_dir: Path, schemas_path: Path, budgets_path: Path, python: str | None = None, folders: tuple[Path, ...] = ()
) -> tuple[dict, list[Row]]:
    """Verify a ``fa2patch build`` output, loading it with the interpreter it was built for."""
    manifest, artifact = load_manifest(build_dir)
    python = python or manifest.get("torch", {}).get("python") or sys.executable
    if not Path(python).exists():
        raise EnvironmentProblem(
            f"{manifest_path(build_dir)}: built for the torch of {python}, which no longer exists (pass --python)"
        )
    return manifest, verify_artifact(
        artifact, manifest, schemas_path, budgets_path, python, machine_folders(build_dir, *folders, python=python)
    )


def verify_artifact(
    artifact: Path, manifest: dict, schemas_path: Path, budgets_path: Path, python: str, folders: list[Path]
) -> list[Row]:
    got = probe_extension(artifact, schemas_path, python, (manifest.get("check_only") or {}).get("preload", []))
    return (
        check_hygiene(artifact, folders)
        + check_load(artifact, manifest, python, got)
        + check_schemas(artifact, schemas_path, got)
        + check_kernels(manifest, artifact, budgets_path, launches_of(got.get("build_info", {})))
    )
