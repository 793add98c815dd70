# SPDX-License-Identifier: BSD-3-Clause
"""The logic of the CI and GPU lab scripts (ci/*.sh): `python -m fa2patch.lab.labtools`.

Imports fa2patch.common and fa2patch.vllm.
"""
