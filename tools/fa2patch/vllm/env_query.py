# SPDX-License-Identifier: BSD-3-Clause
"""What `fa2patch doctor --vllm PYTHON` needs to know about that interpreter's environment.

Standalone on purpose (no fa2patch import): it runs with the user's interpreter. It imports torch
(through fa2patch/compile/torch_query.py, by path) but never vllm, whose import needs vLLM's whole dependency set:
vLLM and the fa2patch plugin are read from their installed metadata and files. Prints JSON.
"""

import importlib.metadata as md
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any


def package_dir(name: str) -> str | None:
    """The folder of a top-level package, found without importing it (editable installs too)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(spec.submodule_search_locations))


def distribution(name: str) -> dict | None:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        return None
    direct = dist.read_text("direct_url.json")
    return {
        "version": dist.version,
        "requires": dist.requires or [],
        "installer": (dist.read_text("INSTALLER") or "").strip(),
        # PEP 610: written for an install from a folder, a file or a VCS, not from an index.
        "direct_url": json.loads(direct) if direct else None,
        "entry_points": [[e.group, e.name, e.value] for e in dist.entry_points],
    }


def main() -> dict:
    out: dict[str, Any] = {
        "python": sys.executable,
        "vllm": distribution("vllm"),
        "plugin": distribution("fa2patch-vllm"),
    }
    vllm_dir = package_dir("vllm")
    if out["vllm"] is not None:
        out["vllm"]["dir"] = vllm_dir
        out["vllm"]["extensions"] = sorted(str(p) for p in Path(vllm_dir).glob("_C*.so")) if vllm_dir else []
        fa2 = sorted(Path(vllm_dir).glob("vllm_flash_attn/_vllm_fa2_C*.so")) if vllm_dir else []
        out["vllm"]["fa2_extension"] = str(fa2[0]) if fa2 else None
    plugin_dir = package_dir("fa2patch_vllm")
    if out["plugin"] is not None and plugin_dir:
        record = Path(plugin_dir) / "build.json"
        out["plugin"]["build"] = json.loads(record.read_text()) if record.is_file() else None
        out["plugin"]["dir"] = plugin_dir
    out["general_plugins"] = sorted(e.name for e in md.entry_points(group="vllm.general_plugins"))
    try:
        sys.path.insert(0, str(Path(__file__).parents[1] / "compile"))  # torch_query.py, the compile stage's
        import torch_query

        out["torch"] = torch_query.facts()
    except Exception as exc:
        out["torch"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
