# SPDX-License-Identifier: BSD-3-Clause
"""`fa2patch doctor --vllm PYTHON`: can the vLLM of that environment run FlashAttention-2 on a
V100 with fa2patch, and what is the next step. Which release it is, whether that release runs on
7.0 from the package index, and the path for it come from packaging/vllm-releases.toml (README:
"V100 from the package index" for 0.16.0 and 0.19.1, "V100 with vLLM 0.33, from zero" for 0.20+).

Read from the environment (tools/fa2patch/vllm/env_query.py, run by PYTHON; vLLM is never
imported): vLLM's version, the torch it pins, how it was installed (PEP 610 direct_url.json:
none for an index install), its compiled extensions; torch's version, CUDA and arch list; the
fa2patch plugin and its build.json. Read here: the architectures in vLLM's own kernels and in its
_vllm_fa2_C (cuobjdump: the robust signal, whatever the install says), whether that _vllm_fa2_C is
fa2patch's (it registers build_info), and the nvcc a source build would use.
"""

import json
import re
import shlex
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.compile import toolchain
from fa2patch.vllm.releases import Matrix

V100 = "sm_70"
TORCH_CU126 = "--index-url https://download.pytorch.org/whl/cu126"  # PyTorch's CUDA 12.6 builds
FA2PATCH_MARK = b"build_info() -> str"  # the schema only fa2patch's _vllm_fa2_C registers
QUERY = Path(__file__).with_name("env_query.py")
README = 'README.md, "V100 with vLLM 0.33, from zero"'
README_INDEX = 'README.md, "V100 from the package index"'


@dataclass
class Check:
    name: str
    ok: bool | None  # None: not applicable / information
    detail: str


def query(python: str) -> dict:
    proc = subprocess.run([python, str(QUERY)], capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise EnvironmentProblem(f"{python}: cannot run {QUERY.name} with it:\n{proc.stderr.strip()[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def architectures(so: str) -> dict:
    """{"sm": [...], "ptx": [...]}: the machine code and PTX a shared object carries (cuobjdump)."""
    tool = toolchain.find_cuda12_binutil("cuobjdump")
    if tool is None:
        raise EnvironmentProblem(
            "cuobjdump: not found (it reads which GPUs vLLM's kernels are for)\n  install: "
            "a CUDA 12.x toolkit (its bin/ on PATH, or CUDA_HOME), or triton's copy: "
            f"{toolchain.PIP_BUILD}"
        )
    found = {}
    for kind, flag in (("sm", "--list-elf"), ("ptx", "--list-ptx")):
        out = subprocess.run([str(tool), flag, so], capture_output=True, text=True).stdout
        archs = sorted(set(re.findall(r"\.sm_(\d+[a-z]?)\.", out)), key=sass_order)
        found[kind] = [("sm_" if kind == "sm" else "compute_") + a for a in archs]  # PTX: a virtual arch
    return found


def sass_order(arch: str) -> int:
    return int(re.sub(r"\D", "", arch) or 0)


def runs_on(archs: dict, arch: str = V100) -> bool:
    """Machine code for ``arch``, or PTX at or below it (which the driver compiles for it)."""
    want = sass_order(arch)
    return arch in archs["sm"] or any(sass_order(p) <= want for p in archs["ptx"])


def torch_pin(requires: list[str]) -> str | None:
    for r in requires:
        m = re.match(r"torch\s*==\s*([\w.+]+)\s*(;|$)", r)
        if m:
            return m.group(1)
    return None


def nvcc_facts() -> dict | None:
    nvcc = toolchain.find_nvcc()
    if nvcc is None:
        return None
    return {"path": str(nvcc), "version": toolchain.nvcc_version(nvcc), "sm_70": V100 in toolchain.nvcc_archs(nvcc)}


def _ver(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:2])


def diagnose(python: str, project_root: Path, matrix: Matrix) -> dict:
    """The checks, the verdict ("ready", "next" or "cannot"), and the next command or the reason."""
    env = query(python)
    py = shlex.quote(python)
    # The README's set-up makes <project>/.venv/bin/fa2patch; elsewhere the command on PATH.
    fa2patch = str(project_root / ".venv" / "bin" / "fa2patch")
    fa2patch = fa2patch if Path(fa2patch).exists() else "fa2patch"
    vllm, torch, plugin = env["vllm"], env["torch"], env["plugin"]
    supported = ", ".join(matrix.versions())
    found = matrix.get(vllm["version"]) if vllm else None
    # The release this environment is (or, without vLLM, the one its torch suits, else the primary).
    matched = matrix.for_torch(torch["version"]) if "error" not in torch else []
    target = found or (None if vllm else (matched[0] if matched else matrix.primary))
    release = {"version": target.version, "torch": target.torch} if target else {"version": "?", "torch": None}
    checks: list[Check] = []
    facts: dict[str, Any] = {"python": python, "supported_vllm": matrix.versions()}
    if vllm:
        checks.append(
            Check(
                "vllm release",
                found is not None,
                f"{vllm['version']}: "
                + (
                    f"supported (line {found.line}); "
                    + ("runs on 7.0 from the package index" if found.v100_from_index else "a source build for 7.0")
                    if found
                    else f"not a release fa2patch supports ({supported}); the plugin refuses it"
                ),
            )
        )
    if target:
        facts["release"] = {"version": target.version, "line": target.line, "v100_from_index": target.v100_from_index}

    # torch
    torch_ok = "error" not in torch
    torch_sm70 = torch_ok and bool(torch.get("cuda")) and toolchain.torch_runs_arch(torch, V100)
    if torch_ok:
        facts["torch"] = {k: torch[k] for k in ("version", "cuda", "arch_list")}
        checks.append(
            Check(
                "torch",
                torch_sm70,
                f"{torch['version']} (CUDA {torch['cuda']}), arch list: "
                f"{' '.join(torch['arch_list']) or '(none)'}" + ("" if torch_sm70 else f": no {V100}"),
            )
        )
    else:
        checks.append(Check("torch", False, f"not importable: {torch['error']}"))

    # vLLM
    pin = torch_pin(vllm["requires"]) if vllm else release["torch"]
    kernels = None
    ext: str | None = None  # vLLM's largest compiled extension
    if vllm:
        how = (
            "from a package index (no direct_url.json)"
            if vllm["direct_url"] is None
            else "built from source at " + vllm["direct_url"]["url"].removeprefix("file://")
            if "dir_info" in vllm["direct_url"]
            else "from " + vllm["direct_url"]["url"]
        )
        facts["vllm"] = {"version": vllm["version"], "torch_pin": pin, "installed": how}
        checks.append(Check("vllm", True, f"{vllm['version']}, pins torch=={pin}, installed {how}"))
        ext = max(vllm["extensions"], key=lambda p: Path(p).stat().st_size) if vllm["extensions"] else None
        if ext:
            kernels = architectures(ext)
            facts["vllm"]["kernels"] = {"file": ext, **kernels}
            checks.append(
                Check(
                    "vllm kernels",
                    runs_on(kernels),
                    f"{Path(ext).name}: "
                    f"{' '.join(kernels['sm']) or 'no machine code'}"
                    + (f", PTX {' '.join(kernels['ptx'])}" if kernels["ptx"] else "")
                    + ("" if runs_on(kernels) else f": nothing runs on {V100}"),
                )
            )
        else:
            checks.append(Check("vllm kernels", False, f"no compiled vllm/_C*.so under {vllm['dir']}"))
        if torch_ok and pin:
            checks.append(
                Check(
                    "torch pin",
                    torch["version"].split("+")[0] == pin,
                    f"vLLM {vllm['version']} pins torch=={pin}; this environment has {torch['version']}",
                )
            )
    else:
        checks.append(
            Check(
                "vllm",
                None,
                f"not installed (vLLM {release['version']}, a supported release, pins torch=={pin})",
            )
        )
        if torch_ok:
            checks.append(
                Check(
                    "torch pin",
                    torch["version"].split("+")[0] == pin,
                    f"vLLM {release['version']} (supported) pins torch=={pin}; this environment has {torch['version']}",
                )
            )

    # vLLM's _vllm_fa2_C
    fa2 = vllm.get("fa2_extension") if vllm else None
    ours = False
    if fa2:
        ours = FA2PATCH_MARK in Path(fa2).read_bytes()
        fa2_archs = architectures(fa2)
        facts["fa2_extension"] = {"file": fa2, "fa2patch": ours, **fa2_archs}
        replaced = not ours and bool(((plugin or {}).get("build") or {}).get("bundles_extension"))
        checks.append(
            Check(
                "vllm _vllm_fa2_C",
                None if replaced else ours and runs_on(fa2_archs),
                f"{'fa2patch' if ours else 'vLLM'}'s ({' '.join(fa2_archs['sm']) or 'no machine code'})"
                + ("; the plugin's bundled extension is the one vLLM imports" if replaced else ""),
            )
        )

    # nvcc (a vLLM source build compiles with it)
    nvcc = nvcc_facts()
    facts["nvcc"] = nvcc
    nvcc_ok = bool(nvcc and nvcc["sm_70"] and _ver(nvcc["version"]) < (12, 8))
    checks.append(
        Check(
            "nvcc",
            nvcc_ok if not (vllm and kernels and runs_on(kernels)) else None,
            "not found (CUDA_HOME or PATH)"
            if not nvcc
            else f"{nvcc['path']}, CUDA {nvcc['version']}: "
            + (
                "a vLLM 0.33 source build keeps 7.0 with it"
                if nvcc_ok
                else "cannot target sm_70"
                if not nvcc["sm_70"]
                else "vLLM 0.33 drops 7.0 from its arch list from nvcc 12.8 on"
            ),
        )
    )

    # the plugin
    build = (plugin or {}).get("build") or {}
    registered = "fa2patch_v100" in env["general_plugins"]
    if plugin:
        bundled = build.get("bundles_extension")
        plugin_torch = build.get("torch", {}).get("version") if bundled else None
        plugin_ok = (
            registered and (not bundled or (torch_ok and plugin_torch == torch["version"])) and (bundled or ours)
        )
        facts["plugin"] = {
            "version": plugin["version"],
            "bundles_extension": bundled,
            "torch": plugin_torch,
            "registered": registered,
        }
        checks.append(
            Check(
                "fa2patch plugin",
                plugin_ok,
                f"{plugin['version']}, "
                + (
                    f"bundles an extension built for torch {plugin_torch}"
                    if bundled
                    else "plugin only (uses the _vllm_fa2_C vLLM built)"
                )
                + ("" if registered else ", not registered in vllm.general_plugins"),
            )
        )
    else:
        checks.append(Check("fa2patch plugin", None, "not installed"))

    # The verdict: the first thing that blocks, in the order of the README's path.
    cu126 = f"{py} -m pip install torch=={pin or release['torch']} {TORCH_CU126}"
    from_index = f"python3.12 -m venv ~/vllm-v100 && ~/vllm-v100/bin/pip install vllm=={matrix.primary.version}"
    wheel_route = (
        f"{fa2patch} build --arch sm_70 --python {py} && {fa2patch} verify --arch sm_70 && "
        f"{fa2patch} package --arch sm_70 && {py} -m pip install --no-deps --force-reinstall "
        f"{project_root}/dist/fa2patch_vllm-*+torch*.whl"
    )
    plugin_only = f"{py} -m pip install --no-deps {project_root}/dist/fa2patch_vllm-0.1.0-py3-none-any.whl"
    verdict: tuple[str, str, str | None] | None = None
    if vllm and found is None:
        verdict = (
            "cannot",
            f"vLLM {vllm['version']} is not a release fa2patch supports ({supported}): the plugin refuses it",
            f"vLLM {matrix.primary.version}, the newest release a V100 runs from the package index, in a new "
            f"environment: {from_index} ({README_INDEX}); for vLLM 0.20 and newer: {README}",
        )
    elif vllm and ext and kernels is not None and not runs_on(kernels):
        verdict = (
            "cannot",
            f"vLLM {vllm['version']} here was installed {how}, and its kernels "
            f"({Path(ext).name}: {' '.join(kernels['sm'])}) carry no {V100}: it cannot run on a V100 "
            "(no index install of vLLM 0.20 or newer does)"
            + (f"; its torch {torch['version']} has no {V100} either" if torch_ok and not torch_sm70 else ""),
            f"vLLM {matrix.primary.version} from the package index in a new environment: {from_index} "
            f"({README_INDEX}); or vLLM {vllm['version']} built from source for 7.0: {README}",
        )
    elif not vllm and target is not None and target.v100_from_index and (not torch_ok or torch_sm70):
        # README "V100 from the package index": vLLM from the index brings the torch it pins.
        verdict = ("next", f"{py} -m pip install vllm=={target.version}", None)
    elif not torch_ok:
        verdict = ("next", f"install the torch vLLM needs, a build with {V100}: {cu126}", None)
    elif not torch_sm70:
        verdict = (
            "cannot",
            f"torch {torch['version']} carries no {V100} code (arch list: "
            f"{' '.join(torch['arch_list']) or 'none'}): nothing built against it runs on a V100",
            f"in a new environment: {cu126}",
        )
    elif vllm and pin and torch["version"].split("+")[0] != pin:
        verdict = (
            "cannot",
            f"vLLM {vllm['version']} pins torch=={pin}, this environment has torch "
            f"{torch['version']}: vLLM's extensions do not load under another torch",
            f"{cu126} (then rebuild vLLM against it)",
        )
    elif not vllm:
        if torch["version"].split("+")[0] != pin:
            verdict = (
                "next",
                f"{cu126}  (vLLM {release['version']}, a supported release built from source, "
                f"pins torch=={pin}; this environment has {torch['version']})",
                None,
            )
        elif not nvcc_ok:
            verdict = (
                "next",
                "install the CUDA 12.6 toolkit (nvcc below 12.8; "
                + (f"{nvcc['path']} is CUDA {nvcc['version']}" if nvcc else "none found")
                + ") and "
                "export CUDA_HOME=/usr/local/cuda-12.6 PATH=/usr/local/cuda-12.6/bin:$PATH",
                None,
            )
        else:
            # README step 4: vLLM's own steps for an existing torch, its FA2 from fa2patch's tree.
            verdict = (
                "next",
                f"{fa2patch} package --arch sm_70 --vllm-src ~/fa2-src --force && cd /path/to/vllm && "
                f"{py} tools/use_existing_torch.py && {py} -m pip install -r requirements/build/cuda.txt && "
                f"TORCH_CUDA_ARCH_LIST=7.0 VLLM_FLASH_ATTN_SRC_DIR=~/fa2-src {py} -m pip install "
                "--no-build-isolation -e .",
                None,
            )
    elif ours:
        if not plugin or not registered:
            verdict = ("next", plugin_only, None)
    elif plugin and not build.get("bundles_extension"):
        verdict = (
            "cannot",
            "the plugin-only wheel lifts the gates for the _vllm_fa2_C vLLM built from "
            f"fa2patch's source tree, but vLLM's ({fa2 or 'none'}) is not fa2patch's",
            f"the wheel route: {wheel_route}",
        )
    elif not plugin or not registered or build.get("torch", {}).get("version") != torch["version"]:
        verdict = ("next", wheel_route, None)
    kind, text, instead = verdict or ("ready", None, None)
    result = {"ok": kind == "ready", "verdict": kind, "checks": [asdict(c) for c in checks], "facts": facts}
    if kind == "next":
        result["next"] = text
    elif kind == "cannot":
        result["reason"], result["instead"] = text, instead
    else:
        result["ready"] = (
            'vLLM loads the plugin in every process; on a V100 it logs "fa2patch-vllm: '
            'FlashAttention-2 on compute capability 7.0 through ..." and selects FLASH_ATTN'
        )
    return result
