#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The test suite (README command 2): CPU tests everywhere; GPU tests where a GPU is present.
# Tests that need the sm_70 toolchain fail (instead of skipping) when it is missing, because
# ci/install.sh installs it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
# The torch of each other supported vLLM release (packaging/vllm-releases.toml), each in its own venv:
# the compatibility builds (tests/vllm/test_compat_builds.py) and the doctor --vllm tests.
bash ci/install-torch.sh ci/torch-2.9.1.txt    # vLLM 0.16.0 -> .venv-torch291/
bash ci/install-torch.sh ci/torch-2.14.txt     # vLLM 0.33.0 -> .venv-torch214/
# The user guide, built strictly (broken links, pages or anchors fail; about a second).
bash ci/docs.sh
export FA2PATCH_REQUIRE_TOOLCHAIN=1
exec .venv/bin/python -m pytest -q -rs "$@"
