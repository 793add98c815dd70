# SPDX-License-Identifier: BSD-3-Clause
"""What a build needs to know about the torch of the interpreter that runs this script.

Standalone on purpose (no fa2patch import): `fa2patch build --python` runs it with another
environment's interpreter, and the `--vllm-src` tree's CMakeLists.txt runs it at configure time.
Prints JSON, or with an argument writes the same facts as CMake `set()` commands to that file.
"""

import importlib.metadata
import json
import os
import re
import sys
import sysconfig

import torch
from torch.utils import cpp_extension

# The CUDA math libraries whose headers ATen's CUDA headers include: the build compiles against the
# versions this torch pins (its Requires-Dist), from this environment's wheels.
MATH_LIBRARIES = ("cublas", "cusparse", "cusolver", "curand")


def cuda_libraries(site_packages: str) -> list[dict]:
    """Per math library torch pins: the distribution, the pinned and the installed version, and
    the include folder of the installed wheel (None where absent)."""
    out = []
    try:
        requires = importlib.metadata.requires("torch") or []
    except importlib.metadata.PackageNotFoundError:  # a torch without installed metadata: no pins to read
        requires = []
    for req in requires:
        m = re.match(r"(nvidia-(\w+?)(-cu\d+)?)\s*==\s*([\w.]+)", req)
        if not m or m.group(2) not in MATH_LIBRARIES:
            continue
        dist, name, pin = m.group(1), m.group(2), m.group(4)
        try:
            installed = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        include = os.path.join(site_packages, "nvidia", name, "include")
        out.append(
            {"dist": dist, "pin": pin, "installed": installed, "include": include if os.path.isdir(include) else None}
        )
    return out


def facts() -> dict:
    site_packages = os.path.dirname(os.path.dirname(torch.__file__))
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        # The arch list torch's own kernels were built for; readable without a GPU (unlike
        # torch.cuda.get_arch_list(), which is empty when no GPU is present).
        "arch_list": (torch._C._cuda_getArchFlags() or "").split() if hasattr(torch._C, "_cuda_getArchFlags") else [],
        "include": cpp_extension.include_paths(),
        "lib": cpp_extension.library_paths(),
        "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI),
        "site_packages": site_packages,
        "cuda_libraries": cuda_libraries(site_packages),
        "python": sys.executable,
        "python_version": sysconfig.get_python_version(),
        "python_include": sysconfig.get_paths()["include"],
    }


def cmake(f: dict) -> str:
    def value(v):
        items = v if isinstance(v, list) else [v]
        return " ".join('"' + str("" if i is None else i).replace("\\", "/").replace('"', '\\"') + '"' for i in items)

    return (
        "".join(
            f"set(FA2PATCH_TORCH_{k.upper()} {value(v)})\n"
            for k, v in f.items()
            if not k.startswith("python") and k != "cuda_libraries"
        )
        + f"set(FA2PATCH_PYTHON_INCLUDE {value(f['python_include'])})\n"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as out:
            out.write(cmake(facts()))
    else:
        print(json.dumps(facts()))
