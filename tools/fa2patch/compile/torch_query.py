# SPDX-License-Identifier: BSD-3-Clause
"""What a build needs to know about the torch of the interpreter that runs this script.

Standalone on purpose (no fa2patch import): `fa2patch build --python` runs it with another
environment's interpreter, and the `--vllm-src` tree's CMakeLists.txt runs it at configure time.
Prints JSON, or with an argument writes the same facts as CMake `set()` commands to that file.
"""

import json
import os
import sys
import sysconfig

import torch
from torch.utils import cpp_extension


def facts() -> dict:
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        # The arch list torch's own kernels were built for; readable without a GPU (unlike
        # torch.cuda.get_arch_list(), which is empty when no GPU is present).
        "arch_list": (torch._C._cuda_getArchFlags() or "").split() if hasattr(torch._C, "_cuda_getArchFlags") else [],
        "include": cpp_extension.include_paths(),
        "lib": cpp_extension.library_paths(),
        "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI),
        "site_packages": os.path.dirname(os.path.dirname(torch.__file__)),
        "python": sys.executable,
        "python_version": sysconfig.get_python_version(),
        "python_include": sysconfig.get_paths()["include"],
    }


def cmake(f: dict) -> str:
    def value(v):
        items = v if isinstance(v, list) else [v]
        return " ".join('"' + str("" if i is None else i).replace("\\", "/").replace('"', '\\"') + '"' for i in items)

    return (
        "".join(f"set(FA2PATCH_TORCH_{k.upper()} {value(v)})\n" for k, v in f.items() if not k.startswith("python"))
        + f"set(FA2PATCH_PYTHON_INCLUDE {value(f['python_include'])})\n"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as out:
            out.write(cmake(facts()))
    else:
        print(json.dumps(facts()))
