#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The test suite (README command 2): CPU tests everywhere; GPU tests where a GPU is present.
# Tests that need the sm_70 toolchain fail (instead of skipping) when it is missing, because
# ci/install.sh installs it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
# torch 2.14.0 (vLLM 0.33's pin) in .venv-torch214/: the compatibility build and vLLM 0.33's tests.
bash ci/install-torch214.sh
export FA2PATCH_REQUIRE_TOOLCHAIN=1
exec .venv/bin/python -m pytest -q -rs "$@"
