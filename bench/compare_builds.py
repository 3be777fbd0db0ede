#!/usr/bin/env python3
"""Before/after: two builds of tcap-bench, run alternately on the same machine.

    bench/compare_builds.py --before OLD/build/bench/tcap-bench --after build/bench/tcap-bench \
        [--rounds 2] [-- tcap-bench arguments...]

Each round runs the before binary, then the after binary, with the same arguments
(default: every workload the before binary knows, the tcap and eager variants, no
torch.compile peer) and `--json`. Per workload and variant it prints each timed metric
(fwd_us, bwd_us, step_us) as the median over rounds for both builds, and
`after/before`: below 1 is faster; then each build's `x_eager` (the variant's time over
the eager variant's in the same runs) and their ratio, which the machine's load affects
far less than the raw times. Alternating keeps slow drift of a shared machine out
of the ratio; a ratio within a few percent of 1 is noise on a 2-core machine.

Each binary loads the libtcap next to it when `--before-lib`/`--after-lib` name a
folder (LD_LIBRARY_PATH), so a copied binary and library can be compared while the
checkout rebuilds. The library must be there under its soname (`libtcap.so.0.1.0`, as
`ldd` shows it); the script checks that each binary loads it from that folder, and stops
otherwise (a folder with only `libtcap.so` would silently compare the checkout's library
with itself).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

METRICS = ("fwd_us", "bwd_us", "step_us")


def run(binary, lib, args, out):
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    if lib:
        env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    cmd = [binary, *args, "--no-inductor", "--json", out]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def check_loads_from(binary, lib):
    """Exits with a message unless `binary`, run with LD_LIBRARY_PATH=lib, loads its libtcap
    from `lib`: the binary asks for the library's soname (libtcap.so.X.Y.Z), so a folder
    holding only a copied libtcap.so would leave it loading the checkout's library, and
    both sides of the comparison would be the same build."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    out = subprocess.run(["ldd", binary], env=env, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "libtcap" in line and "=>" in line:
            name, path = line.split("=>")[0].strip(), line.split("=>")[1].split("(")[0].strip()
            if not os.path.realpath(path).startswith(os.path.realpath(lib) + os.sep):
                sys.exit(f"{binary} would load {path}, not a library in {lib}: copy the library there as {name} "
                         f"(its soname)")
            return


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True)
    p.add_argument("--after", required=True)
    p.add_argument("--before-lib")
    p.add_argument("--after-lib")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("bench_args", nargs="*", help="tcap-bench arguments (after --)")
    a = p.parse_args()
    for binary, lib in ((a.before, a.before_lib), (a.after, a.after_lib)):
        if lib:
            check_loads_from(binary, lib)
    args = a.bench_args or ["--repeats", "5"]
    got = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for which, binary, lib in (("before", a.before, a.before_lib), ("after", a.after, a.after_lib)):
                for rec in run(binary, lib, args, os.path.join(tmp, f"{which}{r}.json")):
                    key = (rec["workload"], rec["variant"])
                    for m in METRICS:
                        if m in rec and rec[m]:
                            got[which].setdefault(key + (m,), []).append(rec[m])
    keys = sorted(set(got["before"]) & set(got["after"]))
    med = {w: {k: statistics.median(v) for k, v in got[w].items()} for w in got}
    # Against eager LibTorch in the same run of the same build: x_eager. The eager variant
    # runs the same LibTorch code in both builds, so x_eager after/before removes the
    # machine's load from the comparison; the raw after/before keeps it.
    print(f"{'workload':<20} {'variant':<20} {'metric':<8} {'before':>10} {'after':>10} {'after/before':>13}"
          f" {'x_eager before':>15} {'x_eager after':>14} {'ratio':>7}")
    ratios, norm = [], []
    for k in keys:
        b, t = med["before"][k], med["after"][k]
        ratios.append(t / b)
        line = f"{k[0]:<20} {k[1]:<20} {k[2]:<8} {b:>10.2f} {t:>10.2f} {t / b:>13.3f}"
        e = (k[0], "eager", k[2])
        if k[1] != "eager" and e in med["before"] and e in med["after"]:
            xb, xa = b / med["before"][e], t / med["after"][e]
            norm.append(xa / xb)
            line += f" {xb:>15.3f} {xa:>14.3f} {xa / xb:>7.3f}"
        print(line)
    if ratios:
        print(f"\n{len(ratios)} metrics; raw after/before geometric mean "
              f"{statistics.geometric_mean(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}")
    if norm:
        print(f"{len(norm)} metrics against eager; x_eager after/before geometric mean "
              f"{statistics.geometric_mean(norm):.3f}, min {min(norm):.3f}, max {max(norm):.3f}")
    only = sorted(set(got["before"]) ^ set(got["after"]))
    if only:
        print(f"({len(only)} metrics measured by one build only, not compared)")


if __name__ == "__main__":
    main()
