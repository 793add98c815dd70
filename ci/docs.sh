#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The user guide (mkdocs.yml, docs/): built strictly into site/ (git-ignored). Broken links, missing pages
# and anchors, and pages left out of the navigation fail the build. The CLI reference is generated from
# the click commands (mkdocs-click), so fa2patch must import: run from the repository's .venv, which
# ci/install.sh creates with the `docs` extra.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
export NO_MKDOCS_2_WARNING=1  # mkdocs-material 9.7+ prints a banner about MkDocs 2.0 otherwise
"$python" -m mkdocs build --strict --clean --site-dir site "$@"
