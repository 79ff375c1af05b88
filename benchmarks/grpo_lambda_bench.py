"""GRPO-λ trace: O(T) ``trace_sum`` vs the paper's dense T×T trace matrix.

For each T and dtype: B sequences of random log-ratios (right padding, ~10% holes), λ = 0.99, γ = 1,
two configurations — ``recent`` without a floor (the defaults) and ``both`` with floor ε = 0.01
(every branch of the O(T) algorithm). Timed, median of ``--repeats`` runs (at least 50 for the cheap O(T) side) after a warm-up, the O(T)
side first so that it does not run right after the large dense allocations:

- ``dense build``: building W once for that T (one run; the paper precomputes it per max_length);
- ``dense fwd``: ``x @ Wᵀ`` for the batch (W shared by all sequences, so O(T²) memory once);
- ``dense fwd+bwd``: the same with a backward pass of a random cotangent;
- ``O(T) fwd`` and ``O(T) fwd+bwd``: ``trace_sum``.

Speedups are dense/O(T) without the build time (the dense side's best case). ``max |Δ|`` compares
each result with the dense float64 result. Prints a Markdown table.

    python benchmarks/grpo_lambda_bench.py [--lengths 512 2048 8192] [--batch 8] [--repeats 5] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from reflexdb.methods.grpo_lambda.loss import trace_matrix, trace_sum

CONFIGS = [("recent", 0.0), ("both", 0.01)]
LAM = 0.99


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _inputs(B: int, T: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = 0.05 * torch.randn(B, T, dtype=torch.float64, generator=gen)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=gen)
    mask = (torch.arange(T)[None, :] < lengths[:, None]) & (torch.rand(B, T, generator=gen) > 0.1)
    return torch.where(mask, x, 0.0)


def run(lengths: list[int], batch: int, repeats: int, dtypes: list[torch.dtype]) -> list[dict]:
    rows = []
    fast_repeats = max(repeats, 50)
    for T in lengths:
        x64 = _inputs(batch, T, seed=T)
        cot64 = torch.randn(batch, T, dtype=torch.float64, generator=torch.Generator().manual_seed(T + 1))
        for style, floor in CONFIGS:
            W64 = trace_matrix(T, lam=LAM, style=style, floor=floor, dtype=torch.float64)
            reference = x64 @ W64.T  # [B, T]
            del W64
            for dtype in dtypes:
                x, cot = x64.to(dtype), cot64.to(dtype)
                # O(T) first, many repeats (it is cheap), before the big dense allocations
                fast_fwd = _time(lambda: trace_sum(x, lam=LAM, style=style, floor=floor), fast_repeats)

                def fast_fb():
                    xg = x.clone().requires_grad_()
                    (trace_sum(xg, lam=LAM, style=style, floor=floor) * cot).sum().backward()

                fast_fwd_bwd = _time(fast_fb, fast_repeats)
                fast_out = trace_sum(x, lam=LAM, style=style, floor=floor)

                build = _time(lambda: trace_matrix(T, lam=LAM, style=style, floor=floor, dtype=dtype), 1)
                W = trace_matrix(T, lam=LAM, style=style, floor=floor, dtype=dtype)
                dense_fwd = _time(lambda: x @ W.T, repeats)

                def dense_fb():
                    xg = x.clone().requires_grad_()
                    ((xg @ W.T) * cot).sum().backward()

                dense_fwd_bwd = _time(dense_fb, repeats)
                dense_out = x @ W.T
                del W
                rows.append(
                    dict(
                        T=T,
                        config=f"{style}, ε={floor:g}",
                        dtype=str(dtype).removeprefix("torch."),
                        w_mib=T * T * torch.finfo(dtype).bits / 8 / 2**20,
                        build=build,
                        dense_fwd=dense_fwd,
                        dense_fwd_bwd=dense_fwd_bwd,
                        fast_fwd=fast_fwd,
                        fast_fwd_bwd=fast_fwd_bwd,
                        diff_fast=(fast_out.double() - reference).abs().max().item(),
                        diff_dense=(dense_out.double() - reference).abs().max().item(),
                        ref_max=reference.abs().max().item(),
                    )
                )
                print(_row(rows[-1]), flush=True)
    return rows


HEADER = (
    "| T | config | dtype | W (MiB) | dense build | dense fwd | O(T) fwd | speedup fwd "
    "| dense fwd+bwd | O(T) fwd+bwd | speedup fwd+bwd | max abs Δ O(T) | max abs Δ dense | max abs S |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} µs"


def _row(r: dict) -> str:
    return (
        f"| {r['T']} | {r['config']} | {r['dtype']} | {r['w_mib']:.0f} | {_ms(r['build'])} | {_ms(r['dense_fwd'])} "
        f"| {_ms(r['fast_fwd'])} | {r['dense_fwd'] / r['fast_fwd']:.0f}× | {_ms(r['dense_fwd_bwd'])} "
        f"| {_ms(r['fast_fwd_bwd'])} | {r['dense_fwd_bwd'] / r['fast_fwd_bwd']:.0f}× "
        f"| {r['diff_fast']:.1e} | {r['diff_dense']:.1e} | {r['ref_max']:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtypes = [getattr(torch, d) for d in args.dtypes]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}, "
        f"load average {os.getloadavg()}, B={args.batch}, λ={LAM}, γ=1, repeats={args.repeats} dense / max(repeats, 50) O(T) (median)"
    )
    print(HEADER)
    run(args.lengths, args.batch, args.repeats, dtypes)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
