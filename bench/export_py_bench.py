"""Python's side of export_cnn (bench/workloads_export.cpp): a PT2 archive run by
torch.export.load(...).module() in eager mode, timed as tcap-bench times (warm-up, then
rounds of calls, median and p10/p90 of the per-round means, grad off, the same thread count).

  python bench/export_py_bench.py ARCHIVE.pt2 N,C,H,W [--rounds 15] [--threads 2]

Run it beside `tcap-bench --filter export_cnn` on the same machine (the archive:
`tcap-bench --filter export_cnn --keep-archives DIR`), and compare with its cpp_eager row.
"""
import argparse
import statistics
import time
import warnings

import torch

warnings.filterwarnings("ignore")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("archive")
    p.add_argument("shape")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    ep = torch.export.load(a.archive)
    m = ep.module()
    x = torch.randn(*[int(s) for s in a.shape.split(",")])
    with torch.no_grad():
        m(x)
    first = (time.perf_counter() - t0) * 1e6
    with torch.no_grad():
        end = time.perf_counter() + 0.2
        iters = 0
        while time.perf_counter() < end:
            m(x)
            iters += 1
        per_round = max(2, iters // 4)
        means = []
        for _ in range(a.rounds):
            t = time.perf_counter()
            for _ in range(per_round):
                m(x)
            means.append((time.perf_counter() - t) / per_round * 1e6)
    means.sort()
    q = statistics.quantiles(means, n=10)
    print(f"py_export_load  load_first_call {first:.0f} us; steady forward median {statistics.median(means):.0f} us "
          f"[{q[0]:.0f}, {q[-1]:.0f}] over {a.rounds} rounds of {per_round}")


if __name__ == "__main__":
    main()
