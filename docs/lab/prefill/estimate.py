"""A V100 bound for the long-prefill route (patch 0003), from `fa2patch report --arch sm_70 --json`.

    python docs/lab/prefill/estimate.py report.json [--sms 80] [--mhz 1530]

It walks the route's launches as gqa_prefill_api.cpp makes them (block size from the plan; per
step the pv tiles of block s - 1, then the qk tiles of block s that some row sees) and charges each
CTA its main-loop iterations (qk: 8 stages of 32 head dims; pv: one per 32-key chunk it sees)
times the cycles of one warp-iteration of that hot loop at 1 warp per sub-partition (the report's
binding bound divided by its W) times 2 (two CTAs share each SM's sub-partitions). CTAs are placed
greedily in grid order on 2 slots per SM; a launch ends with its last CTA. Left out: prologues and
epilogues, latencies, HBM/L2 traffic, launch gaps, the clock below boost. A bound, not a
measurement, and not the calibrated model (issue 9).
"""
import argparse
import heapq
import json


def plan(sq, sk, hq, hk):
    g = hq // hk
    rows_pad = -(-g * sq // 128) * 128
    bk = (768 << 20) // max(1, 2 * hk * rows_pad * 2) // 128 * 128
    bk = min(max(bk, 256), 8192, max(128, -(-sk // 128) * 128))
    return g, rows_pad, bk, max(1, -(-sk // bk))


def steps(sq, sk, hq, hk):
    """Per launch, the CTAs as (kind, main-loop iterations), in grid order."""
    g, rows_pad, bk, nb = plan(sq, sk, hq, hk)
    shift = sk - sq

    def last_key(r):
        return min(sk - 1, r // g + shift)

    def pv(b):
        key0, nk = b * bk, max(0, min(bk, sk - b * bk))
        return [("pv", -(-max(0, min(nk, last_key(64 * t + 63) + 1 - key0)) // 32))
                for t in range(rows_pad // 64)] * hk

    def qk(b):
        key0, nk = b * bk, max(0, min(bk, sk - b * bk))
        rt0 = min(max(0, g * (key0 - shift)), rows_pad) // 128
        out = []
        for rt in range(rt0, rows_pad // 128):
            out += [("qk", 8)] * sum(1 for t in range(-(-nk // 128)) if key0 + 128 * t <= last_key(128 * rt + 127))
        return out * hk

    return [(pv(s - 1) if s > 0 else []) + (qk(s) if s < nb else []) for s in range(nb + 1)]


def hbm_bytes(sq, sk, hq, hk):
    """Bytes the route moves through HBM at least: each qk tile computed writes its 128 x 128 fp16
    scores and 128 maxima, each pv chunk reads 64 x 32 scores and its maxima; every pv tile reads
    and writes its running state (fp32 acc, m, l; not read in the first block, not written in the
    last; untouched by a tile that sees no key of a middle block); per block Q is read again and K, V once; out and softmax_lse once."""
    g, rows_pad, bk, nb = plan(sq, sk, hq, hk)
    state = 64 * (256 * 4 + 8)
    total = sq * hq * 256 * 2 + hq * sq * 4
    for s, ctas in enumerate(steps(sq, sk, hq, hk)):
        for kind, it in ctas:
            if kind == "qk":
                total += 128 * 128 * 2 + 128 * 4
            else:
                b = s - 1   # a pv tile with nothing to do in a middle block returns at once
                if it or b in (0, nb - 1):
                    total += it * (64 * 32 * 2 + 64 * 4) + state * ((b > 0) + (b < nb - 1))
        if s < nb:
            total += sq * hq * 256 * 2 + 2 * max(0, min(bk, sk - s * bk)) * hk * 256 * 2
    return total


def loop_cycles(report):
    kernel = next(k for k in report["kernels"] if "sm70_gqa_prefill_kernel" in k["kernel"])
    w = kernel["warps_per_subpartition"]
    loops = sorted(kernel["hot_loops"], key=lambda lp: lp["mix"].get("mufu", 0))  # qk has no MUFU
    return {kind: max(lp["cycles"].values()) / w for kind, lp in zip(("qk", "pv"), loops)}, loops


def estimate(report, sq, sk, hq, hk, sms, mhz):
    c, _ = loop_cycles(report)
    total = busy = 0.0
    for ctas in steps(sq, sk, hq, hk):
        slots = [0.0] * (2 * sms)
        end = 0.0
        for kind, it in ctas:
            t = heapq.heappop(slots) + 2 * it * c[kind]
            heapq.heappush(slots, t)
            end = max(end, t)
            busy += 2 * it * c[kind] / (2 * sms)
        total += end
    pairs = sq * (sk - sq) + sq * (sq + 1) // 2 if sk >= sq else sum(max(0, i + sk - sq + 1) for i in range(sq))
    flops = 4.0 * hq * 256 * pairs
    ms, ms_busy = total / (mhz * 1e3), busy / (mhz * 1e3)
    return {"ms": ms, "tflops": flops / ms / 1e9, "ms_all_busy": ms_busy, "tflops_all_busy": flops / ms_busy / 1e9}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--sms", type=int, nargs="+", default=[80, 72])
    ap.add_argument("--mhz", type=float, default=1530)
    args = ap.parse_args()
    report = json.load(open(args.report))
    c, loops = loop_cycles(report)
    for kind, lp in zip(("qk", "pv"), loops):
        print(f"{kind} hot loop: {lp['instructions']} instructions per warp-iteration, mix {lp['mix']}, "
              f"{lp['shared_bytes']} shared bytes; bound {c[kind]:.0f} cycles at 1 warp per sub-partition "
              f"({lp['binding']})")
    shapes = [(8000, kv, 6, 1) for kv in range(40000, 128001, 8000)] + [
        (8192, 8192, 6, 1), (1024, 262144, 6, 1), (16384, 16384, 16, 1), (16384, 262144, 8, 1)]
    for sms in args.sms:
        for s in shapes:
            e = estimate(report, *s, sms, args.mhz)
            hbm = hbm_bytes(*s)
            print(f"{sms} SMs {args.mhz:.0f} MHz  Q={s[0]} KV={s[1]} Hq={s[2]} Hkv={s[3]}: bound {e['ms']:.2f} ms, "
                  f"{e['tflops']:.1f} TFLOP/s (every SM busy: {e['tflops_all_busy']:.1f}); HBM {hbm / 1e9:.1f} GB = "
                  f"{hbm / 900e6:.1f} ms at 900 GB/s ({100 * hbm / 900e6 / e['ms']:.0f}% of the bound's time)")


if __name__ == "__main__":
    main()
