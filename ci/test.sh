#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The test suite (README command 2): CPU tests everywhere; GPU tests where a GPU is present.
# Tests that need the sm_70 toolchain fail (instead of skipping) when it is missing, because
# ci/install.sh installs it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
export FA2PATCH_REQUIRE_TOOLCHAIN=1
exec .venv/bin/python -m pytest -q -rs "$@"
