#!/usr/bin/env python3
"""tcap-bench's torch.compile peer (Note [The torch.compile peer] in bench/harness.h).

Builds tcap-bench's compile workloads in Python with the same shapes, losses, dtype and
thread count, and times two variants the way tcap-bench does (bench/harness.h, Note [How
tcap-bench times]): warm-up that calibrates the iterations per round, rounds interleaved
(py_eager, inductor, py_eager, ...), per round the mean per iteration, then the median
over rounds with p10 / p90. One iteration: grads reset to None (untimed), the forward
(fwd_us), the loss (untimed, eager), loss.backward() (bwd_us).

  py_eager  plain PyTorch eager;
  inductor  torch.compile(fn) in its default mode, compiled outside the timed region (its
            first call and that call's backward: compile_ms), checked against py_eager
            (values and grads, same tolerances as tcap-bench), then timed under
            torch.compiler.set_stance("fail_on_recompile"): a timed call that would
            recompile fails the variant instead of timing a compile.

tcap-bench runs this script itself (with the python of the torch it links) with --serve:
it sends one workload at a time and asks for one round at a time, between its own rounds
(see serve()), and merges the rows. It can also be run alone (its own rounds only):

  ~/.cache/tcap/venv/bin/python3 bench/inductor_bench.py --workloads coscos --out /tmp/p.json

Rows: one JSON object per (workload, variant), as tcap-bench writes them, plus a
"per_round" object (the per-round values, for the table's spread). A variant that cannot
run is a row with "skipped" (the reason) and "failed" (true when a check did not hold).
"""
import argparse
import contextlib
import json
import math
import os
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

# Same as tcap-bench's (workloads_compile.cpp, struct Tolerance): elementwise
# |got - want| <= atol * max|want| + rtol * |want|.
POINTWISE_TOL = (1e-5, 1e-6)
MATMUL_TOL = (1e-4, 1e-5)

# --device: where the workloads run (tcap-bench's --device, Note [Benchmarks on a CUDA
# device] in bench/harness.h). Tensors are made on the CPU with the same seeds, then moved.
DEVICE = "cpu"


def on_device(t):
    return t.to(DEVICE)


def sync():
    """A timed region of GPU work ends when the work does."""
    if DEVICE != "cpu":
        torch.cuda.synchronize()


def log(*args):
    print("[inductor_bench]", *args, file=sys.stderr, flush=True)


def quantile(xs, q):
    """Linearly interpolated, as tcap::bench::quantile."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (pos - lo) * (xs[hi] - xs[lo])


class Step:
    """One variant's training-style step (see the module docstring)."""

    def __init__(self, forward, loss, leaves):
        self.forward = forward  # () -> output tensor (the timed call)
        self.loss = loss  # output -> scalar loss (untimed, eager)
        self.leaves = list(leaves)  # what backward writes .grad of

    def reset_grads(self):
        for t in self.leaves:
            t.grad = None

    def run_untimed(self):
        self.reset_grads()
        self.loss(self.forward()).backward()

    def run_timed(self, acc):
        self.reset_grads()
        sync()
        t0 = time.perf_counter()
        out = self.forward()
        sync()
        t1 = time.perf_counter()
        loss = self.loss(out)
        sync()
        t2 = time.perf_counter()
        loss.backward()
        sync()
        t3 = time.perf_counter()
        acc["fwd_us"] += t1 - t0
        acc["bwd_us"] += t3 - t2

    def result(self):
        """Output and grads of one untimed iteration, copied."""
        self.reset_grads()
        out = self.forward()
        r = [out.detach().clone()]
        self.loss(out).backward()
        r += [None if t.grad is None else t.grad.clone() for t in self.leaves]
        return r


def difference(got, want, tol):
    rtol, atol = tol
    if (got is None) != (want is None):
        return "defined where eager's is not" if got is not None else "undefined where eager's is not"
    if want is None:
        return ""
    if got.shape != want.shape:
        return "of another shape"
    g, w = got.double(), want.double()
    scale = w.abs().max().item() or 1.0
    err = (g - w).abs()
    if bool((err <= atol * scale + rtol * w.abs()).all()):
        return ""
    return f"off by up to {err.max().item() / scale:.3g} of its largest magnitude (rtol {rtol}, atol {atol})"


# --- workloads: each returns (make_step(compiled: bool) -> Step, tolerance) --------------
# The same as workloads_compile.cpp: shapes (and --quick's smaller ones), losses, dtype
# (f32), initialisation scheme.


def mean_of_squares(out):
    return out.square().mean()


def randomise_affine(norm):
    # As workloads_compile.cpp: with weight 1 and bias 0, mean(out^2) of a LayerNorm is 1
    # whatever its input, and every grad above it would be rounding noise.
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.5)
        norm.bias.normal_(0.0, 0.5)


def coscos(quick):
    torch.manual_seed(0)
    inputs = [on_device(torch.randn(1024, 2048)).requires_grad_() for _ in range(4)]

    def fn(a, b, c, d):
        return torch.cos(torch.cos(a + b + c + d))

    def make(compiled):
        f = torch.compile(fn) if compiled else fn
        return Step(lambda: f(*inputs), lambda out: out.sum(), inputs)

    return make, POINTWISE_TOL


def bias_relu(quick):
    torch.manual_seed(0)
    rows = 1024 if quick else 8192
    x = on_device(torch.randn(rows, 1024)).requires_grad_()
    b = on_device(torch.randn(1024)).requires_grad_()
    w = on_device(torch.randn(rows, 1024))

    def fn(x, b):
        return torch.relu(x + b)

    def make(compiled):
        f = torch.compile(fn) if compiled else fn
        return Step(lambda: f(x, b), lambda out: (out * w).sum(), [x, b])

    return make, MATMUL_TOL


def mlp_small(quick):
    torch.manual_seed(0)
    x = on_device(torch.randn(1, 10))
    target = on_device(torch.randn(1, 2))

    def make(compiled):
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(10, 5), nn.ReLU(), nn.Linear(5, 2), nn.Softmax(1)).to(DEVICE)
        m = torch.compile(model) if compiled else model
        return Step(lambda: m(x), lambda out: F.mse_loss(out, target), model.parameters())

    return make, POINTWISE_TOL


def mlp_big(quick):
    torch.manual_seed(0)
    x = on_device(torch.randn(64 if quick else 256, 1024))

    def make(compiled):
        torch.manual_seed(1)
        norm = nn.LayerNorm(1024)
        randomise_affine(norm)
        model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024), norm).to(DEVICE)
        m = torch.compile(model) if compiled else model
        return Step(lambda: m(x), mean_of_squares, model.parameters())

    return make, MATMUL_TOL


def softmax_ce(quick):
    torch.manual_seed(0)
    rows = 1024 if quick else 4096
    logits = on_device(torch.randn(rows, 4096)).requires_grad_()
    targets = on_device(torch.randint(0, 4096, (rows,), dtype=torch.int64))

    def fn(logits, targets):
        return F.cross_entropy(logits, targets)

    def make(compiled):
        f = torch.compile(fn) if compiled else fn
        return Step(lambda: f(logits, targets), lambda out: out, [logits])

    return make, MATMUL_TOL


class CppEncoderLayer(nn.Module):
    """LibTorch's torch::nn::TransformerEncoderLayer, op for op (post-norm, ReLU, dropout 0).

    Not Python's nn.TransformerEncoderLayer: the C++ module calls multi-head attention with
    need_weights=true, i.e. the explicit softmax(q k^T) v path (no scaled_dot_product_attention)
    and the attention weights averaged over heads (computed, then unused). Its two
    torch::equal(query, key) host checks, which pick the packed in-projection, are left out
    (Python's own MultiheadAttention tests `query is key`). Parameters are initialised as
    LibTorch's (xavier_uniform in_proj, zero biases of the projections, Linear defaults).
    """

    def __init__(self, d_model=256, nhead=4, dim_feedforward=2048):
        super().__init__()
        self.nhead = nhead
        self.in_proj_weight = nn.Parameter(torch.empty(3 * d_model, d_model))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * d_model))
        self.out_proj = nn.Linear(d_model, d_model)
        nn.init.xavier_uniform_(self.in_proj_weight)
        with torch.no_grad():
            self.out_proj.bias.zero_()
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)

    def self_attn(self, x):
        tgt_len, bsz, embed_dim = x.shape
        head_dim = embed_dim // self.nhead
        q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        q = q * (1 / math.sqrt(head_dim))
        q = q.contiguous().view(tgt_len, bsz * self.nhead, head_dim).transpose(0, 1)
        k = k.contiguous().view(-1, bsz * self.nhead, head_dim).transpose(0, 1)
        v = v.contiguous().view(-1, bsz * self.nhead, head_dim).transpose(0, 1)
        w = torch.bmm(q, k.transpose(1, 2))
        w = F.softmax(w, dim=-1)
        out = torch.bmm(w, v)
        out = out.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias)
        w = w.view(bsz, self.nhead, tgt_len, -1).sum(dim=1) / self.nhead
        return out, w

    def forward(self, src):
        src2 = self.self_attn(src)[0]
        ret = self.norm1(src + src2)
        src2 = self.linear2(F.relu(self.linear1(ret)))
        return self.norm2(ret + src2)


def transformer_block(quick):
    torch.manual_seed(0)
    src = on_device(torch.randn(32, 4, 256) if quick else torch.randn(128, 8, 256))

    def make(compiled):
        torch.manual_seed(1)
        layer = CppEncoderLayer(256, 4, 2048)
        randomise_affine(layer.norm1)
        randomise_affine(layer.norm2)
        layer.train()
        layer.to(DEVICE)
        m = torch.compile(layer) if compiled else layer
        return Step(lambda: m(src), mean_of_squares, layer.parameters())

    return make, MATMUL_TOL


WORKLOADS = {
    "coscos": coscos,
    "bias_relu": bias_relu,
    "mlp_small": mlp_small,
    "mlp_big": mlp_big,
    "softmax_ce": softmax_ce,
    "transformer_block": transformer_block,
}


# --- timing ------------------------------------------------------------------------------


def warm_up(step, warmup_ms, round_ms):
    acc = {"fwd_us": 0.0, "bwd_us": 0.0}
    n = 0
    t0 = time.perf_counter()
    while True:
        step.run_timed(acc)
        n += 1
        if n >= 2 and (time.perf_counter() - t0) * 1e3 >= warmup_ms:
            break
    ms_per_iter = (time.perf_counter() - t0) * 1e3 / n
    return int(min(max(math.ceil(round_ms / max(ms_per_iter, 1e-6)), 1), 1e7))


def graph_breaks():
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def skipped(workload, variant, why, failed=False):
    return {"workload": workload, "variant": variant, "rounds": 0, "iters_per_round": 0,
            "skipped": why, "failed": failed}


def one_line(e):
    text = f"{type(e).__name__}: {e}".strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[0] if lines else type(e).__name__
    return line[:300]


class PeerWorkload:
    """One workload's variants: built, compiled, checked and warmed up; then timed a round
    at a time (one_round), and summed up as rows (rows)."""

    def __init__(self, name, args, variants):
        self.name = name
        make, tol = WORKLOADS[name](args.quick)
        torch._dynamo.reset()
        eager = make(False)
        eager.run_untimed()  # one-time costs
        self.steps = {}  # variant -> (Step, fixed metrics)
        self.rows = []  # skipped and failed variants
        if "py_eager" in variants:
            self.steps["py_eager"] = (eager, {})
        if "inductor" in variants:
            try:
                from torch._dynamo.utils import counters

                counters.clear()
                step = make(True)
                t0 = time.perf_counter()
                step.run_untimed()  # dynamo + AOTAutograd + inductor: forward, then backward
                compile_ms = (time.perf_counter() - t0) * 1e3
                fixed = {"compile_ms": compile_ms, "graph_breaks": graph_breaks(),
                         "graphs": counters["stats"]["unique_graphs"]}
                got, want = step.result(), eager.result()
                for i, (g, w) in enumerate(zip(got, want)):
                    diff = difference(g, w, tol)
                    if diff:
                        what = "output" if i == 0 else f"grad of leaf {i - 1}"
                        raise AssertionError(f"inductor's {what} differs from py_eager: {diff}")
                self.steps["inductor"] = (step, fixed)
            except AssertionError as e:
                self.rows.append(skipped(name, "inductor", str(e), failed=True))
            except Exception as e:  # no C++ compiler, an unsupported op, ...
                log(f"{name}/inductor:", traceback.format_exc())
                self.rows.append(skipped(name, "inductor", "torch.compile failed: " + one_line(e)))
        self.order = [v for v in ("py_eager", "inductor") if v in self.steps]
        self.iters = {v: warm_up(self.steps[v][0], args.warmup_ms, args.round_ms) for v in self.order}
        self.per_round = {v: {"fwd_us": [], "bwd_us": []} for v in self.order}

    def one_round(self):
        """One round of each variant, interleaved (A B): returns {variant: {metric: us}}.
        A timed call of the compiled function that would recompile raises instead."""
        out = {}
        stance = torch.compiler.set_stance("fail_on_recompile") if "inductor" in self.steps \
            else contextlib.nullcontext()
        with stance:
            for v in self.order:
                acc = {"fwd_us": 0.0, "bwd_us": 0.0}
                step = self.steps[v][0]
                for _ in range(self.iters[v]):
                    step.run_timed(acc)
                out[v] = {m: s * 1e6 / self.iters[v] for m, s in acc.items()}
                for m, us in out[v].items():
                    self.per_round[v][m].append(us)
        return out

    def summary(self):
        rows = list(self.rows)
        for v in self.order:
            xs_of = self.per_round[v]
            row = {"workload": self.name, "variant": v, "rounds": len(xs_of["fwd_us"]),
                   "iters_per_round": self.iters[v]}
            for m, xs in xs_of.items():
                row[m] = quantile(xs, 0.5)
                row[m + "_p10"] = quantile(xs, 0.1)
                row[m + "_p90"] = quantile(xs, 0.9)
            row.update(self.steps[v][1])
            row["per_round"] = xs_of
            rows.append(row)
        return rows


def run_workload(name, args, variants):
    w = PeerWorkload(name, args, variants)
    for _ in range(args.rounds):
        w.one_round()
    return w.summary()


def serve(args, variants):
    """--serve: tcap-bench interleaves this process's rounds with its own (Note [The
    torch.compile peer] in bench/harness.h). One JSON object per line each way:
      {"op": "setup", "workload": W}  ->  {"ok": true} or {"ok": false, "error": ...}
      {"op": "round"}                 ->  {"round": {variant: {"fwd_us": us, "bwd_us": us}}}
      {"op": "finish"}                ->  {"rows": [...]} (W's rows, as --out writes them)
    The process ends at the end of its input."""
    # Nothing else may write to the protocol's stream: not Python code (sys.stdout), not a
    # library's C code or a compiler torch.compile runs (file descriptor 1). The protocol
    # gets a descriptor of its own; descriptor 1 becomes the log.
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    current = None
    name = None
    setup_error = None

    def reply(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        op = cmd.get("op")
        try:
            if op == "setup":
                name = cmd["workload"]
                current = None
                setup_error = None
                if name not in WORKLOADS:
                    reply({"ok": False, "error": "inductor_bench.py has no such workload"})
                    continue
                log(f"{name}: {', '.join(variants)} (interleaved with tcap-bench)")
                current = PeerWorkload(name, args, variants)
                reply({"ok": True})
            elif op == "round":
                reply({"round": current.one_round() if current else {}})
            elif op == "finish":
                if current:
                    rows = current.summary()
                elif name in WORKLOADS:
                    why = setup_error or "the peer's setup failed"
                    rows = [skipped(name, v, why, failed=True) for v in variants]
                else:
                    rows = [skipped(name, v, "inductor_bench.py has no such workload") for v in variants]
                reply({"rows": rows})
                current = None
            else:
                reply({"ok": False, "error": f"unknown op {op!r}"})
        except Exception as e:
            log(f"{name}:", traceback.format_exc())
            current = None
            setup_error = one_line(e)
            reply({"ok": False, "error": setup_error})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--variants", default="py_eager,inductor")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--round-ms", type=float, default=50)
    ap.add_argument("--warmup-ms", type=float, default=100)
    ap.add_argument("--quick", action="store_true", help="tcap-bench --quick's smaller shapes")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the workloads run")
    ap.add_argument("--out", help="write the rows here (a JSON list)")
    ap.add_argument("--serve", action="store_true",
                    help="take commands on stdin, one round at a time (see serve())")
    args = ap.parse_args()
    if not args.serve and not args.out:
        ap.error("--out is required without --serve")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        log("--device cuda, but torch.cuda.is_available() is False")
        sys.exit(2)
    variants = [v for v in args.variants.split(",") if v]
    log(f"torch {torch.__version__}, python {sys.version.split()[0]}, {torch.get_num_threads()} threads, "
        f"device {DEVICE}")
    if args.serve:
        serve(args, variants)
        return
    rows = []
    for name in [w for w in args.workloads.split(",") if w]:
        if name not in WORKLOADS:
            rows += [skipped(name, v, "inductor_bench.py has no such workload") for v in variants]
            continue
        log(f"{name}: {', '.join(variants)}")
        t0 = time.perf_counter()
        try:
            rows += run_workload(name, args, variants)
        except Exception as e:
            log(f"{name}:", traceback.format_exc())
            done = {r["variant"] for r in rows if r["workload"] == name}
            rows += [skipped(name, v, one_line(e), failed=True) for v in variants if v not in done]
        log(f"{name}: done in {time.perf_counter() - t0:.1f} s")
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
