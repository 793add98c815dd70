# SPDX-License-Identifier: BSD-3-Clause
"""The patch file format: the diffstat computed from the diff, against hand counts."""

import pytest

from fa2patch.series.patches import PatchFile, diffstat

DIFF = """diff --git a/src/a.cpp b/src/a.cpp
index 1111111111111111111111111111111111111111..2222222222222222222222222222222222222222 100644
--- a/src/a.cpp
+++ b/src/a.cpp
@@ -1,4 +1,5 @@
 keep
--- removed line that looks like a header
+++ added line that looks like a header
+added
 keep
diff --git a/docs/a b.txt b/docs/a b.txt
deleted file mode 100644
index 3333333333333333333333333333333333333333..0000000000000000000000000000000000000000
--- a/docs/a b.txt
+++ /dev/null
@@ -1,2 +0,0 @@
-one
-two
diff --git a/blob.bin b/blob.bin
new file mode 100644
index 0000000000000000000000000000000000000000..4444444444444444444444444444444444444444
GIT binary patch
literal 3
KcmZ>-`~Uy|0RR91

literal 0
HcmV?d00001

"""


def test_diffstat_counts_lines_per_file_by_hand():
    # a.cpp: 2 added, 1 removed (the lines starting with '---'/'+++' inside the hunk are content);
    # "a b.txt": 2 removed (a path with a space); blob.bin: binary.
    assert diffstat(DIFF) == (
        " src/a.cpp    | 3 ++-\n"
        " docs/a b.txt | 2 --\n"
        " blob.bin     | Bin\n"
        " 3 files changed, 2 insertions(+), 3 deletions(-)\n"
    )


def test_large_changes_are_scaled_to_forty_columns():
    diff = "diff --git a/big b/big\n--- a/big\n+++ b/big\n@@ -1,40 +1,120 @@\n" + "+x\n" * 120 + "-y\n" * 40
    line = diffstat(diff).splitlines()[0]
    # 160 changed lines; bars scaled by 40/160: 120 -> 30 '+', 40 -> 10 '-'.
    assert line == " big | 160 " + "+" * 30 + "-" * 10


def test_render_and_parse_round_trip_and_a_wrong_diffstat_is_refused():
    patch = PatchFile("Subject line", "Body.\n---\nnot a separator", DIFF)
    text = patch.render()
    assert PatchFile.parse(text, "p.patch") == patch
    wrong = text.replace("src/a.cpp    | 3 ++-", "src/a.cpp    | 4 +++-")
    with pytest.raises(ValueError, match="diffstat"):
        PatchFile.parse(wrong, "p.patch")
