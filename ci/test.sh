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
# Both at once, beside the user guide's strict build (broken links, pages or anchors fail).
bash ci/install-torch.sh ci/torch-2.9.1.txt &  # vLLM 0.16.0 -> .venv-torch291/
torch291=$!
bash ci/install-torch.sh ci/torch-2.14.txt &   # vLLM 0.33.0 -> .venv-torch214/
torch214=$!
bash ci/docs.sh
wait "$torch291"
wait "$torch214"
export FA2PATCH_REQUIRE_TOOLCHAIN=1
# Every core, at most four (each worker replays and builds the series once: tests/conftest.py).
exec .venv/bin/python -m pytest -q -rs -n auto --maxprocesses "${FA2PATCH_TEST_WORKERS:-4}" --dist loadgroup "$@"
