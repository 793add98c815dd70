import shutil
import subprocess

import pytest

from fa2patch.verify import check_linkage

SRC = '#include <sstream>\n#include <string>\nstd::string f(long x) { std::ostringstream s; s << x; return s.str(); }\n'


@pytest.mark.parametrize("static, ok", [(False, True), (True, False)])
def test_static_libstdcxx_is_refused(tmp_path, static, ok):
    gxx = shutil.which("g++") or shutil.which("c++")
    if gxx is None:
        pytest.skip("no host C++ compiler")
    (tmp_path / "f.cpp").write_text(SRC)
    so = tmp_path / "f.so"
    subprocess.run([gxx, "-shared", "-fPIC", str(tmp_path / "f.cpp"), "-o", str(so)]
                   + (["-static-libstdc++"] if static else []), check=True)
    (row,) = check_linkage(so)
    assert row.ok is ok
    if not ok:
        assert "libstdc++.so.6" in row.detail and str(so) in row.detail
