# SPDX-License-Identifier: BSD-3-Clause
"""docs/DESIGN.md §8: nothing in the series may end a serving process. The patch series adds no call
to exit/abort/terminate (or a device trap/assert), and the built extension imports none of the C
library's process-ending functions, so no FA2 function our code reaches (e.g. FA2's CHECK_CUDA in
hardware_info.h, which calls exit(1)) is linked in."""

import re
import subprocess

from helpers import REPO

ENDS_PROCESS = re.compile(
    r"(?<![\w.])(?:std::)?(?:exit|_exit|_Exit|quick_exit|abort|terminate)\s*\(|__trap\s*\(|\bassert\s*\(|asm[^;]*\btrap\b"
)


def added_code_lines(patch_text):
    """The added lines of a patch, without // comments."""
    for line in patch_text.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            yield line[1:].split("//", 1)[0]


def test_the_pattern_catches_what_it_must():
    caught = [
        "exit(1);",
        "  std::exit(EXIT_FAILURE);",
        "abort();",
        "std::terminate();",
        "_Exit(3)",
        "quick_exit(0);",
        "__trap();",
        "assert(x > 0);",
        'asm volatile("trap;");',
    ]
    allowed = ["static_assert(kN % 8 == 0);", "on_exit_path = true;", "early_exit(params);", "obj.exit(1)"]
    assert all(ENDS_PROCESS.search(s) for s in caught)
    assert not any(ENDS_PROCESS.search(s) for s in allowed)


def test_the_series_adds_no_call_that_ends_the_process():
    patches = sorted((REPO / "patches").glob("*.patch"))
    assert len(patches) >= 3
    found = [
        f"{p.name}: {line.strip()}"
        for p in patches
        for line in added_code_lines(p.read_text())
        if ENDS_PROCESS.search(line)
    ]
    assert found == []


def test_the_built_extension_imports_no_process_ending_function(built_sm70):
    nm = subprocess.run(
        ["nm", "-D", "--undefined-only", str(built_sm70 / "_vllm_fa2_C.abi3.so")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    imported = {line.split()[-1].split("@")[0] for line in nm.splitlines() if line.strip()}
    assert "cudaLaunchKernel" in imported or "__cudaRegisterFatBinary" in imported  # nm read the imports
    assert imported & {"exit", "_exit", "_Exit", "quick_exit", "abort"} == set()
