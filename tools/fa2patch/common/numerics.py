# SPDX-License-Identifier: BSD-3-Clause
"""The numerics contract (docs/DESIGN.md §7), defined once: the reference comparison, smoke,
bench and the GPU suite all judge results with these thresholds."""

# Relative L2 error of `out` against the FP32 reference: ||out - ref|| / ||ref||.
REL_L2_MAX = 1e-3
# Largest absolute error of softmax_lse against the reference's (rows without keys: +inf exactly).
LSE_ABS_MAX = 1e-3
# FA2's own test criterion: max|out - ref| <= FACTOR * max|out_fp16_torch - ref| + SLACK, where
# out_fp16_torch is the same attention computed by torch in fp16.
FA2_BAR_FACTOR = 2.0
FA2_BAR_SLACK = 1e-5
# bench's looser envelope, printed beside the contract verdict: max abs and relative L2.
BENCH_ENVELOPE = {"max_abs": 1e-3, "rel_l2": 1e-2}


def fa2_bar(fp16_max_abs_err: float) -> float:
    """The largest max|out - ref| FA2's criterion allows, given max|out_fp16_torch - ref|."""
    return FA2_BAR_FACTOR * fp16_max_abs_err + FA2_BAR_SLACK


def meets_contract(max_abs: float, bar: float, rel_l2: float, finite: bool) -> bool:
    """Finite, within FA2's bar and within the relative L2 bound (softmax_lse is judged apart)."""
    return bool(finite) and max_abs <= bar and rel_l2 <= REL_L2_MAX


def within_envelope(max_abs: float, rel_l2: float, finite: bool) -> bool:
    return bool(finite) and max_abs <= BENCH_ENVELOPE["max_abs"] and rel_l2 <= BENCH_ENVELOPE["rel_l2"]
