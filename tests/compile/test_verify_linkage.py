# SPDX-License-Identifier: BSD-3-Clause
"""Artifact hygiene (verify): each defect, built into a small shared object, fails its own row
and only that row; a clean object passes every row."""

import shutil
import subprocess

import pytest

from fa2patch.compile.verify import check_hygiene

SRC = "#include <sstream>\n#include <string>\nstd::string f(long x) { std::ostringstream s; s << x; return s.str(); }\n"
ROWS = {"libstdc++", "needed", "rpath", "build paths", "python abi"}


def compiler():
    gxx = shutil.which("g++") or shutil.which("c++")
    if gxx is None:
        pytest.skip("no host C++ compiler")
    return gxx


def shared_object(tmp_path, name, source=SRC, flags=()):
    (tmp_path / f"{name}.cpp").write_text(source)
    so = tmp_path / f"{name}.so"
    subprocess.run([compiler(), "-shared", "-fPIC", str(tmp_path / f"{name}.cpp"), "-o", str(so), *flags], check=True)
    return so


def failing_rows(so, folders=()):
    rows = check_hygiene(so, list(folders))
    assert {r.name for r in rows} == ROWS
    return {r.name: r.detail for r in rows if not r.ok}


def test_a_clean_object_passes_every_row(tmp_path):
    assert failing_rows(shared_object(tmp_path, "clean"), [tmp_path / "elsewhere"]) == {}


def test_static_libstdcxx_is_refused(tmp_path):
    so = shared_object(tmp_path, "static", flags=["-static-libstdc++"])
    failed = failing_rows(so)
    assert set(failed) == {"libstdc++"}
    assert "libstdc++.so.6" in failed["libstdc++"] and str(so) in failed["libstdc++"]


@pytest.mark.parametrize("tags, kind", [("--disable-new-dtags", "RPATH"), ("--enable-new-dtags", "RUNPATH")])
def test_a_library_search_path_is_refused(tmp_path, tags, kind):
    failed = failing_rows(shared_object(tmp_path, "rpath", flags=[f"-Wl,{tags}", "-Wl,-rpath,/opt/somewhere"]))
    assert set(failed) == {"rpath"}
    assert f"{kind}=/opt/somewhere" in failed["rpath"]


def test_a_library_torch_does_not_provide_is_refused(tmp_path):
    dep = shared_object(tmp_path, "libextra", "int extra() { return 1; }\n")
    so = shared_object(
        tmp_path,
        "uses",
        SRC + "int extra();\nint g() { return extra(); }\n",
        flags=[str(dep), "-Wl,--disable-new-dtags"],
    )
    failed = failing_rows(so)
    assert set(failed) == {"needed"} and "libextra.so" in failed["needed"]


def test_a_folder_of_the_build_machine_is_refused(tmp_path):
    folder = tmp_path / "my-build-folder"
    so = shared_object(tmp_path, "path", SRC + f'const char* where() {{ return "{folder}/x.h"; }}\n')
    failed = failing_rows(so, [folder, tmp_path / "not-in-it"])
    assert set(failed) == {"build paths"}
    assert str(folder) in failed["build paths"] and "not-in-it" not in failed["build paths"]


def test_a_private_cpython_symbol_is_refused(tmp_path):
    so = shared_object(
        tmp_path,
        "private",
        SRC + 'extern "C" void _Py_Dealloc(void*);\n'
        'extern "C" void PyModule_Create2(void*, int);\n'
        "void g() { _Py_Dealloc(nullptr); PyModule_Create2(nullptr, 3); }\n",
    )
    failed = failing_rows(so)
    assert set(failed) == {"python abi"}
    assert "_Py_Dealloc" in failed["python abi"] and "PyModule_Create2" not in failed["python abi"]


def test_machine_folders_name_a_venv_not_the_system_prefix_of_its_interpreter(tmp_path):
    """A venv of the system's Python: its own folder ties an artifact to this machine, /usr (which
    -g builds name everywhere: /usr/include) does not."""
    from pathlib import Path

    from fa2patch.compile.verify import machine_folders

    system = Path("/usr/bin/python3")
    if not system.exists():
        pytest.skip("no /usr/bin/python3")
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    python = tmp_path / "venv" / "bin" / "python"
    python.symlink_to(system)
    folders = machine_folders(python=str(python))
    assert tmp_path / "venv" in folders and Path("/usr") not in folders
