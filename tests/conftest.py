# SPDX-License-Identifier: BSD-3-Clause
import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from helpers import (
    MINI_FILES,
    REPO,
    MiniProject,
    file_member,
    locked_toolchain,
    make_tar,
    project_copy,
    reference_digest,
    require_toolchain,
)

# The property tests (test_*_properties.py, hypothesis): in CI the same examples on every run and
# machine (derandomize), no example database read or written, no per-example deadline (CI shares its
# cores); `HYPOTHESIS_PROFILE=fuzz` (or pytest's --hypothesis-profile=fuzz) searches wider, at random.
# The lab's pytest (ci/gpu-lab.sh) runs tests/gpu without the test extra: no hypothesis there.
try:
    from hypothesis import settings
except ImportError:
    settings = None
if settings is not None:
    settings.register_profile("ci", derandomize=True, database=None, deadline=None, max_examples=50, print_blob=False)
    settings.register_profile("fuzz", database=None, deadline=None, max_examples=2000)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items):
    """ci/test.sh runs the suite on every core (pytest-xdist, --dist loadgroup). Each worker makes its
    own session fixtures (the real series replayed and built: a ccache hit after the first); the tests
    that share a module-scoped fixture (a compatibility build, the vLLM CMake build, a wheel) form one
    group that runs on one worker, so that fixture is made once; every other test goes to whichever
    worker is free."""
    for item in items:
        fixtures = getattr(item, "_fixtureinfo", None)  # pytest's per-test fixture closure
        defs = fixtures.name2fixturedefs.values() if fixtures else []
        if any(d[-1].scope == "module" for d in defs):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def toolchain_table() -> str:
    """This repository's [toolchain] table, as TOML text."""
    import tomlkit

    return tomlkit.dumps({"toolchain": tomlkit.parse((REPO / "baseline.lock").read_text())["toolchain"]})


@pytest.fixture
def mini(tmp_path) -> MiniProject:
    """A small project whose baseline is a tiny archive, with an empty patch series (and this
    repository's toolchain pins and pyproject.toml)."""
    root = tmp_path / "proj"
    (root / "patches").mkdir(parents=True)
    (root / "pyproject.toml").write_bytes((REPO / "pyproject.toml").read_bytes())
    archive = tmp_path / "mini-1.0.tar.gz"
    members = [tarfile.TarInfo("mini-1.0")]
    members[0].type, members[0].mode = tarfile.DIRTYPE, 0o755
    members += [file_member(f"mini-1.0/{p}", d, m) for p, (m, d) in MINI_FILES.items()]
    make_tar(archive, members)
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    (root / "baseline.lock").write_text(
        f'''# test lock
format = 2

[baseline]
project = "mini"
version = "1.0"
archive = "mini-1.0.tar.gz"
sha256 = "{sha}"
size = {archive.stat().st_size}
top_dir = "mini-1.0"
tree_digest = "{reference_digest(MINI_FILES)}"
files = {len(MINI_FILES)}

'''
        + toolchain_table()
    )
    return MiniProject(root, tmp_path / "cache", archive)


@pytest.fixture(scope="module")
def clang_cuda(tmp_path_factory):
    """clang++ and a CUDA path assembled from the pinned wheels, for compiling small kernels
    (test_toolchain_sass.py, test_report_sass.py)."""
    from fa2patch.compile import toolchain

    require_toolchain()
    d = tmp_path_factory.mktemp("cuda")
    pins = locked_toolchain()
    return toolchain.find_clang(pins.clang), toolchain.assemble_cuda_path(d / "cuda", pins)


@pytest.fixture(scope="session")
def real_project(tmp_path_factory) -> MiniProject:
    """This repository's series in a temporary project (project_copy)."""
    return project_copy(tmp_path_factory, "real")


@pytest.fixture(scope="session")
def real_workspace(real_project) -> Path:
    real_project.run("replay")
    return real_project.workspace


@pytest.fixture(scope="session")
def built_sm70(real_project, real_workspace) -> Path:
    """The real series built for sm_70 (once per session): its build folder. With --json the
    build's stdout is one JSON object (ninja and the compiler write to stderr)."""
    require_toolchain()
    proc = real_project.run("build", "--arch", "sm_70", "--json")
    result = json.loads(proc.stdout)
    assert result["ok"] and result["manifest"]["arch"] == "sm_70"
    return real_project.root / "build" / "sm_70"


@pytest.fixture(scope="session")
def vllm_sources(real_project, tmp_path_factory):
    """A supported vLLM release's Python sources by version (packaging/vllm-releases.toml; fetched
    and sha256-checked by fa2patch, with the lab's extra files), each extracted once."""
    found: dict[str, Path] = {}

    def get(version: str) -> Path:
        if version not in found:
            code = (
                "import sys; from pathlib import Path; from fa2patch.common.project import Project; "
                "from fa2patch.vllm import releases; from fa2patch.vllm.sdist import extract_vllm_sources; "
                "from fa2patch.lab.labtools import VLLM_LAB_FILES; project = Project.find(); "
                "release = releases.load(project).get(sys.argv[2]); "
                "print(extract_vllm_sources(project, Path(sys.argv[1]), VLLM_LAB_FILES, release))"
            )
            dest = tmp_path_factory.mktemp("vllm-" + version)
            out = subprocess.run(
                [sys.executable, "-c", code, str(dest), version],
                env=real_project.env,
                cwd=real_project.root,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            found[version] = Path(out.strip().splitlines()[-1])
        return found[version]

    return get


@pytest.fixture(scope="session")
def vllm_src(vllm_sources):
    """vLLM 0.33.0's sources: the release built from source (its CMake, the lab's CMake build)."""
    return vllm_sources("0.33.0")
