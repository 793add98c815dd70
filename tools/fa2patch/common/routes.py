# SPDX-License-Identifier: BSD-3-Clause
"""The SM70 routes' names, as build_info(), route_stats() and routing profiles spell them: the one
place they are written in Python (the extension's C++ writes them once, in route_names.h; a test
checks that both say the same)."""

# The exact route (patch 0002): FA2's forward on Volta tensor cores, through varlen_fwd / fwd_kvcache.
EXACT = "sm70-dense"
# The exact route with split-KV (patch 0004): a route_stats() and report name; a routing profile's
# decision names it as EXACT with "splits".
SPLITKV = "sm70-dense-splitkv"
# The decode kernel (patch 0002) in the exact kernel's place for calls of one query row per sequence
# (or a few) where patch 0004's rule (the switch unset) or FA2PATCH_SM70_DECODE=1 sends them: a
# route_stats() name, and a build_info() route reached through varlen_fwd with the switch at 1 (bench
# times it so).
DECODE = "sm70-decode"
DECODE_ENV = "FA2PATCH_SM70_DECODE"
# Its instantiations (decode_sm70.h kHeadDims, kMaxRows): the head dims, and the most query rows per
# KV head it takes (tests/series/test_real_series.py checks both against the C++).
DECODE_HEAD_DIMS = (64, 128, 256)
DECODE_MAX_ROWS = 16
# The long-prefill route (patch 0003): gqa_prefill_fwd, and varlen_fwd where routing picks it.
GQA = "sm70-gqa-prefill"
