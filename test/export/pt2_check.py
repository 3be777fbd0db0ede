"""The Python side of the export round trips (test/export/*_test.cpp): PyTorch's own
readers run what tcap wrote, and PyTorch writes what tcap reads.

  pt2_check.py run PT2 INPUTS EXPECTED [--aoti] [--rtol R] [--atol A]
      torch.export.load(PT2).module()(*INPUTS) against EXPECTED (torch.save'd tuples of
      tensors written by C++); with --aoti also aoti_compile_and_package + load_package.
  pt2_check.py schema
      prints torch's SCHEMA_VERSION "major.minor".
Exit status 0 when everything matched; a message on stderr otherwise.
"""
import sys
import warnings

import torch

warnings.filterwarnings("ignore")


def fail(msg):
    print("pt2_check: " + msg, file=sys.stderr)
    sys.exit(1)


def compare(what, got, expected, rtol, atol):
    if isinstance(got, torch.Tensor):
        got = (got,)
    got = tuple(got)
    if len(got) != len(expected):
        fail(f"{what}: {len(got)} outputs, expected {len(expected)}")
    for k, (g, e) in enumerate(zip(got, expected)):
        if g.shape != e.shape or g.dtype != e.dtype:
            fail(f"{what}: output {k} is {g.dtype}{list(g.shape)}, expected {e.dtype}{list(e.shape)}")
        if not torch.allclose(g, e, rtol=rtol, atol=atol):
            fail(f"{what}: output {k} differs by {(g - e).abs().max().item()} (rtol {rtol}, atol {atol})")


def run(argv):
    path, inputs_path, expected_path = argv[:3]
    rtol = float(argv[argv.index("--rtol") + 1]) if "--rtol" in argv else 1e-5
    atol = float(argv[argv.index("--atol") + 1]) if "--atol" in argv else 1e-6
    inputs = torch.load(inputs_path, weights_only=True)
    expected = torch.load(expected_path, weights_only=True)
    try:
        ep = torch.export.load(path)
    except Exception:
        # torch.export.load hides the reader's own error behind a generic one.
        from torch.export.pt2_archive._package import load_pt2
        load_pt2(path)
        raise
    with torch.no_grad():
        compare("torch.export.load(...).module()", ep.module()(*inputs), expected, rtol, atol)
    if "--aoti" in argv:
        import os
        import tempfile
        from torch._inductor import aoti_compile_and_package, aoti_load_package
        with tempfile.TemporaryDirectory() as d:
            pkg = aoti_compile_and_package(ep, package_path=os.path.join(d, "aoti.pt2"))
            runner = aoti_load_package(pkg)
            with torch.no_grad():
                compare("AOTInductor", runner(*inputs), expected, max(rtol, 1e-4), max(atol, 1e-5))
    print("pt2_check: matched")


def main():
    if len(sys.argv) < 2:
        fail(__doc__)
    if sys.argv[1] == "run":
        run(sys.argv[2:])
    elif sys.argv[1] == "schema":
        from torch._export.serde.schema import SCHEMA_VERSION
        print(f"{SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1]}")
    else:
        fail(__doc__)


if __name__ == "__main__":
    main()
