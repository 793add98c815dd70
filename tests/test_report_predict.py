"""report --shapes: the sm70-dense iteration count and the predicted bound, on the CPU."""

import subprocess
import sys
from pathlib import Path

import pytest

from fa2patch.bench import Shape
from fa2patch.errors import EnvironmentProblem
from fa2patch.report import key_blocks_per_cta, load_v100, predict
from helpers import REPO

ARTIFACT = Path("/nowhere/_vllm_fa2_C.abi3.so")


def brute_force_warp_iterations(q, kv, hq, causal):
    """Walk every CTA, warp and key block of the sm70-dense grid: CTA (m, h) owns query rows
    64m..64m+63 (the kernel takes all 64 even past q), 4 warps, and visits key block n (keys
    32n..32n+31, those below kv) unless its first key lies right of the mask's diagonal in the
    block's last row, 64m+63 + (kv - q)."""
    total, m = 0, 0
    while 64 * m < q:
        last_row = 64 * m + 63
        for _head in range(hq):
            for _warp in range(4):
                n = 0
                while 32 * n < kv:
                    if not causal or 32 * n <= last_row + kv - q:
                        total += 1
                    n += 1
        m += 1
    return total


def kernel_row(head_dim, w, loops):
    return {"kernel": f"void fa2patch::sm70::flash_fwd_sm70_kernel<{head_dim}>(flash::Flash_fwd_params)",
            "warps_per_subpartition": w, "hot_loops": loops}


def loop(hmma, cycles):
    return {"mix": {"hmma": hmma, "lds": 10}, "cycles": cycles}


# d=64 kernel, W=2 warps per sub-partition. Of its two loops with 256 HMMA (the masked and the
# unmasked body), the cheaper binds on issue at 1200 cycles for 2 warps, i.e. 600 per warp; the
# costlier one (700 per warp) comes first, so taking the first would give another answer. The
# loop with fewer HMMA has larger cycles, so choosing by cycles alone would too. A d=32 kernel is
# there as a decoy.
KERNELS = [
    kernel_row(32, 4, [loop(128, {"tensor": 4 * 128 * 2, "issue": 4 * 5000})]),
    kernel_row(64, 2, [loop(8, {"tensor": 2 * 8 * 2, "issue": 2 * 9000}),
                       loop(256, {"tensor": 2 * 256 * 2, "issue": 2 * 700, "shared_memory": 2 * 100}),
                       loop(256, {"tensor": 2 * 256 * 2, "issue": 2 * 600, "shared_memory": 2 * 100})]),
]


@pytest.mark.parametrize("q, kv", [(1, 1), (64, 64), (100, 50), (50, 100), (130, 70), (8000, 40000),
                                   (700, 333), (64, 1), (1000, 31)])
@pytest.mark.parametrize("causal", [True, False])
def test_iteration_count_matches_a_brute_force_walk_of_the_grid(q, kv, causal):
    got = predict(Shape(q, kv, 3, 1, 64, causal, 0.125), KERNELS, load_v100(), ARTIFACT)["warp_iterations"]
    assert got == brute_force_warp_iterations(q, kv, 3, causal)
    assert sum(key_blocks_per_cta(q, kv, causal)) * 3 * 4 == got


def test_iteration_count_by_hand():
    # q=100, kv=50, causal: shift -50; CTA 0: ceil((64-50)/32) = 1 block; CTA 1: ceil((128-50)/32)
    # = 3, capped at ceil(50/32) = 2 blocks.
    assert key_blocks_per_cta(100, 50, True) == [1, 2]
    assert key_blocks_per_cta(100, 50, False) == [2, 2]
    # q=300, kv=10: shift -290; CTAs 0..3 see no key (64(m+1) <= 290), CTA 4: ceil(30/32) = 1.
    assert key_blocks_per_cta(300, 10, True) == [0, 0, 0, 0, 1]
    assert key_blocks_per_cta(128, 128, True) == [2, 4]


def test_prediction_arithmetic_when_cta_granularity_binds():
    v100 = load_v100()
    assert (v100["sm_count"], v100["subpartitions_per_sm"], v100["boost_clock_mhz"]) == (80, 4, 1530)
    # Non-causal, 10 CTAs per head x 9 heads = 90 CTAs of 10 key blocks; 600 cycles per
    # warp-iteration. Throughput: 90*10*4*600 / 320 = 6750 cycles. Granularity: some SM runs two
    # of the 81 longest CTAs: 2*10*600 = 12000 cycles, which binds.
    p = predict(Shape(640, 320, 9, 1, 64, False, 0.125), KERNELS, v100, ARTIFACT)
    assert p["kernel"] == "flash_fwd_sm70_kernel<64>" and p["ctas"] == 90 and p["warp_iterations"] == 3600
    assert (p["binding"], p["cycles_per_warp_iteration"]) == ("issue", 600)
    assert p["bounds"] == {"throughput": pytest.approx(6750), "cta_granularity": pytest.approx(12000)}
    assert (p["limited_by"], p["cycles"]) == ("cta_granularity", pytest.approx(12000))
    flops = 4 * 9 * 64 * 640 * 320
    assert p["useful_flops"] == flops
    assert p["ms_lower_bound"] == pytest.approx(12000 / 1530e6 * 1e3)
    assert p["tflops_upper_bound"] == pytest.approx(flops / (12000 / 1530e6) / 1e12)


def test_prediction_arithmetic_when_throughput_binds_and_causal_flops():
    # d=48 runs the d=64 kernel. q=kv=128, causal, 200 heads: CTAs of 2 and 4 blocks, 200 each.
    # Throughput: 200*(2+4)*4*600 / 320 = 9000 cycles. Granularity: k=0: 4*600 = 2400; k=1: the
    # 81st longest has 4 blocks: 2*4*600 = 4800; k=2: 3*4*600 = 7200; k=3 (241st): 4*2*600 = 4800;
    # k=4: 5*2*600 = 6000. Throughput binds.
    p = predict(Shape(128, 128, 200, 1, 48, True, 0.125), KERNELS, load_v100(), ARTIFACT)
    assert p["kernel"] == "flash_fwd_sm70_kernel<64>" and p["warp_iterations"] == 200 * 6 * 4
    assert p["bounds"] == {"throughput": pytest.approx(9000), "cta_granularity": pytest.approx(7200)}
    assert (p["limited_by"], p["cycles"]) == ("throughput", pytest.approx(9000))
    flops = 4 * 200 * 48 * (128 * 129 // 2)  # attended pairs of a square causal mask
    assert p["tflops_upper_bound"] == pytest.approx(flops * 1530e6 / 9000 / 1e12)


def test_cta_granularity_uses_the_shortest_of_the_longest_ctas():
    # One head, 161 CTAs, q = 161*64 and kv = q + 32000, causal: CTA m visits 1000 + 2(m+1) key
    # blocks (1002 .. 1322). 161 CTAs on 80 SMs: some SM runs 3, each of at least 1002 blocks:
    # 3*1002*600 cycles. Throughput: (161*1000 + 161*162) * 4 * 600 / 320.
    p = predict(Shape(161 * 64, 161 * 64 + 32000, 1, 1, 64, True, 0.125), KERNELS, load_v100(), ARTIFACT)
    assert p["bounds"] == {"throughput": pytest.approx((161 * 1000 + 161 * 162) * 4 * 600 / 320),
                           "cta_granularity": pytest.approx(3 * 1002 * 600)}
    assert p["limited_by"] == "cta_granularity"


def test_missing_route_kernel_and_unsupported_head_dim_are_refused():
    with pytest.raises(EnvironmentProblem, match=r"/nowhere/_vllm_fa2_C.abi3.so: no kernel flash_fwd_sm70_kernel<128>"):
        predict(Shape(64, 64, 1, 1, 128, True, 0.1), KERNELS, load_v100(), ARTIFACT)
    with pytest.raises(EnvironmentProblem, match="no hot loop"):
        predict(Shape(64, 64, 1, 1, 64, True, 0.1), [kernel_row(64, 1, [])], load_v100(), ARTIFACT)
    for d in (264, 60):
        with pytest.raises(EnvironmentProblem, match=f"d={d}"):
            predict(Shape(64, 64, 1, 1, d, True, 0.1), KERNELS, load_v100(), ARTIFACT)


def test_bad_shapes_option_is_a_usage_error_naming_it():
    proc = subprocess.run([sys.executable, "-m", "fa2patch", "report", "--shapes", "q=8,kv=x,hq=1,hkv=1,d=64"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert "--shapes" in proc.stderr and "kv='x'" in proc.stderr
