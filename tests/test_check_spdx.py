# SPDX-License-Identifier: BSD-3-Clause
"""ci/check_spdx.py: which files need the SPDX line, where it may stand, and the files patches add."""

import subprocess
import sys

from helpers import REPO

SCRIPT = REPO / "ci" / "check_spdx.py"
LINE = "SPDX-License-Identifier: BSD-3-Clause"


def check(*args, cwd=None):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=cwd)


def test_source_files_need_the_line_in_their_head(tmp_path):
    good = {
        "a.py": f"# {LINE}\n'''doc'''\n",
        "b.sh": f"#!/bin/sh\n# {LINE}\necho\n",
        "c.toml": f"# {LINE}\nx = 1\n",
        "baseline.lock": f"# comment\n# {LINE}\nformat = 2\n",
        "k.cuh": f"// {LINE}\n#pragma once\n",
        ".clang-format": f"# {LINE}\nBasedOnStyle: LLVM\n",
    }
    good["e.sh"] = f"#!/bin/sh\necho\n# {LINE}\n"  # third line: still in the head
    bad = {
        "d.py": "'''doc'''\n",
        "f.toml": "\n" * 5 + f"# {LINE}\n",
        "g.yaml": "# SPDX-License-Identifier: MIT\n",
        "h.h": f"# {LINE}\n",
    }
    ignored = {"README.md": "no line\n", "data.json": "{}\n", "lab.log": "x\n"}
    for name, text in {**good, **bad, **ignored}.items():
        (tmp_path / name).write_text(text)
    proc = check(*(tmp_path / n for n in {**good, **bad, **ignored}))
    flagged = {line.split(":")[0].rsplit("/", 1)[-1] for line in proc.stdout.splitlines()}
    assert flagged == {"d.py", "f.toml", "g.yaml", "h.h"} and proc.returncode == 1
    assert "SPDX-License-Identifier MIT, expected BSD-3-Clause" in proc.stdout
    assert check(*(tmp_path / n for n in good)).returncode == 0


def test_add_writes_the_line_first_or_after_a_shebang(tmp_path):
    (tmp_path / "a.py").write_text('"""doc"""\n')
    (tmp_path / "b.sh").write_text("#!/usr/bin/env bash\nset -e\n")
    (tmp_path / "c.py").write_text(f"# {LINE}\nx = 1\n")
    assert check("--add", tmp_path / "a.py", tmp_path / "b.sh", tmp_path / "c.py").returncode == 0
    assert (tmp_path / "a.py").read_text() == f'# {LINE}\n"""doc"""\n'
    assert (tmp_path / "b.sh").read_text() == f"#!/usr/bin/env bash\n# {LINE}\nset -e\n"
    assert (tmp_path / "c.py").read_text() == f"# {LINE}\nx = 1\n"


PATCH = f"""From 1 Mon Sep 17 00:00:00 2001
Subject: x

diff --git a/csrc/old.cpp b/csrc/old.cpp
--- a/csrc/old.cpp
+++ b/csrc/old.cpp
@@ -1 +1,2 @@
 int a;
+int b;
diff --git a/csrc/fa2patch/good.h b/csrc/fa2patch/good.h
new file mode 100644
--- /dev/null
+++ b/csrc/fa2patch/good.h
@@ -0,0 +1,2 @@
+// {LINE}
+#pragma once
diff --git a/csrc/fa2patch/bad.cu b/csrc/fa2patch/bad.cu
new file mode 100644
--- /dev/null
+++ b/csrc/fa2patch/bad.cu
@@ -0,0 +1,2 @@
+#include "good.h"
+// {LINE}
diff --git a/fa2patch-build.toml b/fa2patch-build.toml
new file mode 100644
--- /dev/null
+++ b/fa2patch-build.toml
@@ -0,0 +1 @@
+[sources]
diff --git a/docs/x.md b/docs/x.md
new file mode 100644
--- /dev/null
+++ b/docs/x.md
@@ -0,0 +1 @@
+no line in documentation
"""


def test_files_a_patch_adds_need_the_line_and_fa2s_own_files_do_not(tmp_path):
    (tmp_path / "0001-x.patch").write_text(PATCH)
    proc = check(tmp_path / "0001-x.patch")
    assert proc.returncode == 1
    # bad.cu has it on its second line (within the head); the build description has none.
    assert [line.split(" adds ")[1].split()[0] for line in proc.stdout.splitlines()] == ["fa2patch-build.toml"]
