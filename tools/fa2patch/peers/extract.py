# SPDX-License-Identifier: BSD-3-Clause
"""The peer's data, extracted (``python -m fa2patch.peers.extract``; slow, needs the Triton that vLLM's
torch pins, not run in CI): compile vLLM's TRITON_ATTN kernels for capability 7.0 (peers/compile.py),
read each variant's SASS with the pipeline our kernels go through and write
data/peer_vllm_triton.toml, which peer.py models from."""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.compile import sass, toolchain
from fa2patch.model import sass_mix
from fa2patch.model.loop_mix import access_passes
from fa2patch.peers import compile as peer_compile

# The vLLM release whose TRITON_ATTN kernels the recorded data are of (packaging/vllm-releases.toml).
PEER_VLLM = "0.33.0"
# Where the data came from (recorded in its [source] table).
TRITON_PIN = (
    "vLLM 0.33.0 pins torch==2.14.0 (requirements/cuda.txt); torch 2.14.0's wheel METADATA: "
    "Requires-Dist: triton~=3.8.0; newest 3.8.x on the index: 3.8.0"
)
ENVIRONMENT = (
    "python3 -m venv $FA2PATCH_SCRATCH/peer-venv && $FA2PATCH_SCRATCH/peer-venv/bin/pip install 'triton~=3.8.0'"
)
COMMAND = (
    "PYTHONPATH=tools python -m fa2patch.peers.extract --python $FA2PATCH_SCRATCH/peer-venv/bin/python "
    "--out tools/fa2patch/data/peer_vllm_triton.toml"
)


def analyse(cubin: Path, ptxas_log: str, cuobjdump: Path) -> dict:
    """One compiled variant read with the pipeline our kernels go through: resources, the main
    loop's mix (every instruction once: Triton's loop has no inner loop) and the code outside it."""
    # A bare cubin's listing names no "arch = sm_XX" section (a fat binary's does).
    usage = toolchain.cuobjdump(cuobjdump, ["--dump-resource-usage"], cubin)
    (res,) = sass.parse_resource_usage(usage if "arch = sm_" in usage else f"arch = sm_70\n{usage}")
    (function,) = sass.parse_sass(toolchain.cuobjdump(cuobjdump, ["-sass"], cubin))
    (ptx,) = sass.parse_ptxas_log(ptxas_log).values()
    loop = function.main_loop()
    if loop is not None and len(loop.instrs) <= len(function.instrs) // 4:
        loop = None  # only a small loop (reduce_segments' sequence search): no main loop
    if loop is not None and any(
        loop.start <= lp.start and lp.end <= loop.end and (lp.start, lp.end) != (loop.start, loop.end)
        for lp in function.loops()
    ):
        raise ValueError(f"{cubin}: the main loop at {loop.start:#x} has inner loops: trip counts unknown")
    inside = {i.addr for i in loop.instrs} if loop else set()
    out: dict[str, Any] = {
        "registers": res.registers,
        "stack": res.stack,
        "spill_stores": ptx.spill_stores,
        "spill_loads": ptx.spill_loads,
        "static_instructions": len(function.instrs),
        "outside": sass_mix.outside_mix([i for i in function.instrs if i.addr not in inside]),
    }
    out["outside"]["model_mix"] = {k: v for k, v in out["outside"]["model_mix"].items() if k != "load_use_gaps"}
    if loop is not None:
        counts, m = sass_mix.mix_of(loop.instrs)
        local = [i.op for i in loop.instrs if sass_mix.base(i.op) in ("LDL", "STL")]
        out["loop"] = {
            "start": loop.start,
            "end": loop.end,
            "instructions": len(loop.instrs),
            "mix": counts,
            "model_mix": {**vars(m), "load_use_gaps": list(m.load_use_gaps)},
            "local_passes": sum(access_passes(sass_mix.access_bytes(op)) for op in local),
        }
    return out


def extract(python: Path, out_dir: Path, vllm_src: Path | None = None) -> dict:
    """Compile every variant with ``python`` (an environment with vLLM's Triton) and read it."""
    from fa2patch.common.project import Project
    from fa2patch.vllm import releases
    from fa2patch.vllm.sdist import extract_vllm_sources

    project = Project.find()
    release = releases.load(project).get(PEER_VLLM)
    if release is None:
        raise EnvironmentProblem(f"vLLM {PEER_VLLM}, whose TRITON_ATTN is the peer, is not in {releases.MATRIX}")
    if vllm_src is None:
        vllm_src = extract_vllm_sources(project, out_dir / "vllm", release=release)
    subprocess.run(
        [str(python), str(Path(peer_compile.__file__)), "--vllm-src", str(vllm_src), "--out", str(out_dir)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    compiled = json.loads((out_dir / "compile.json").read_text())
    tool = toolchain.find_cuda12_binutil("cuobjdump")
    if tool is None:
        raise EnvironmentProblem(f"cuobjdump: not found\n  install: {toolchain.PIP_BUILD}")
    version = subprocess.run([str(tool), "--version"], capture_output=True, text=True).stdout.split("release ")[-1]
    variants = {}
    for name, meta in compiled["variants"].items():
        kernel, d, hq, hkv, mode, tile = peer_compile.VARIANTS[name]
        var = {
            "kernel": kernel,
            "head_dim": d,
            "q_heads": hq,
            "kv_heads": hkv,
            "mode": mode,
            "tile_size": tile,
            "num_warps": meta["num_warps"],
            "shared": meta["shared"],
            "constexprs": meta["constexprs"],
            "divisible_by_16": meta["divisible_by_16"],
        }
        var.update(analyse(out_dir / f"{name}.cubin", (out_dir / f"{name}.ptxas.log").read_text(), tool))
        variants[name] = var
    return {
        "source": {
            "vllm": release.version,
            "vllm_sdist_sha256": release.sdist.sha256,
            "vllm_files": [f"vllm/v1/attention/ops/{m}.py" for m in peer_compile.MODULES]
            + ["vllm/v1/attention/backends/triton_attn.py"],
            "triton": compiled["triton"],
            "ptxas": compiled["ptxas_version"],
            "cuobjdump": version.split(",")[0].strip(),
            "target": compiled["target"],
            "triton_pin": TRITON_PIN,
            "environment": ENVIRONMENT,
            "command": COMMAND,
        },
        "variant": variants,
    }


def write(data: dict, path: Path) -> None:
    import tomlkit

    doc = tomlkit.document()
    for line in HEADER.strip().splitlines():
        doc.add(tomlkit.comment(line))
    doc.update(data)
    path.write_text(tomlkit.dumps(doc))


HEADER = """
SPDX-License-Identifier: BSD-3-Clause
vLLM 0.33.0's TRITON_ATTN kernels compiled for capability 7.0 (no tensor cores: tl.dot is FFMA),
read from their SASS. Written by `python -m fa2patch.peers.extract` (tools/fa2patch/peers/extract.py;
the compile is tools/fa2patch/peers/compile.py); do not edit by hand. docs/peer-vllm-triton.md.
Per variant: launch configuration (num_warps, dynamic shared bytes), resources, the main loop's
mix per warp-iteration (static counts; loop.model_mix is what v100model charges) and the code
outside it, once per CTA (outside.model_mix, outside.load_rounds).
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fa2patch.peers.extract", description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", type=Path, required=True, help="a Python whose environment has vLLM's Triton")
    ap.add_argument("--vllm-src", type=Path, help="an extracted vllm-<version>/ tree (default: the pinned sdist)")
    ap.add_argument("--out", type=Path, required=True, help="the TOML file to write")
    ap.add_argument("--keep", type=Path, help="keep the cubins, PTX and ptxas logs in this folder")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        write(extract(args.python, work, args.vllm_src), args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
