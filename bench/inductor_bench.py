#!/usr/bin/env python3
"""tcap-bench's torch.compile peer (Note [The torch.compile peer] in bench/harness.h).

Builds tcap-bench's workloads in Python with the same shapes, losses, dtype and thread
count, and times two variants the way tcap-bench does (bench/harness.h, Note [How
tcap-bench times]): warm-up that calibrates the iterations per round, rounds interleaved
(py_eager, inductor, py_eager, ...), per round the mean per iteration, then the median
over rounds with p10 / p90. Two kinds of workloads:

  compile workloads (workloads_compile.cpp: coscos, mlp_big, ...): one iteration is grads
      reset to None (untimed), the forward (fwd_us), the loss (untimed, eager),
      loss.backward() (bwd_us);
  program workloads (workloads_programs.cpp: program_cnn, cnn_step, mlp_small_step,
      adam100, program_dcgan, program_transformer, program_lstm, program_regression, program_gcn,
      program_unet,
      program_tutorial_mlp, program_coscos): the programs of test/programs/*.h written
      again in Python (same layers and sizes, losses, optimizers and hyper-parameters,
      schedule, clipping, hooks, batch shapes; PyTorch's default initialisation from the
      program's seed); one iteration is one whole training step as the program's
      train_step writes it (zero_grad, forward(s), loss(es), backward(s), optimizer
      step(s)), cycling through 8 batches drawn at setup (step_us). Setup runs 6 untimed
      steps (compiles, the optimizers' state) and one more under fail_on_recompile, as
      tcap-bench does. CPU only, as tcap-bench's programs; --quick shrinks nothing.

  py_eager  plain PyTorch eager;
  inductor  torch.compile in its default mode, compiled outside the timed region:
            compile workloads: torch.compile(fn), its first call and that call's
            backward (compile_ms); programs: each model wrapped in torch.compile(model),
            loss, backward and optimizer step eager around it, as a Python user compiles
            such a program (compile_ms: the setup steps in which it compiled).
            Checked against py_eager (compile workloads: values and grads, same
            tolerances as tcap-bench; programs: built from the same seed, the same setup
            steps on the same batches, then each step's losses, the host-side values the
            program logs, and the final parameters and buffers), then timed under
            torch.compiler.set_stance("fail_on_recompile"): a timed call that would
            recompile fails the variant instead of timing a compile.

tcap-bench runs this script itself (with the python of the torch it links) with --serve:
it sends one workload at a time and asks for one round at a time, between its own rounds
(see serve()), and merges the rows. It can also be run alone (its own rounds only):

  ~/.cache/tcap/venv/bin/python3 bench/inductor_bench.py --workloads coscos --out /tmp/p.json

Rows: one JSON object per (workload, variant), as tcap-bench writes them, with the
workload kind's metrics (fwd_us and bwd_us, or step_us; each with _p10 / _p90), plus a
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

from peer_common import (MATMUL_TOL, POINTWISE_TOL, CppEncoderLayer, difference, log, on_device, one_line,
                         quantile, set_device, skipped, sync)
import peer_common
from inductor_programs import NotOnThisDevice

class Step:
    """One variant's training-style step of a compile workload (see the module docstring).

    The interface PeerWorkload uses (ProgramStep has the same): metrics, prepare(),
    check_against(eager, tol), run_timed(acc)."""

    metrics = ("fwd_us", "bwd_us")

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

    def prepare(self):
        """One-time costs (the compile, for inductor): one untimed iteration; its ms."""
        t0 = time.perf_counter()
        self.run_untimed()
        return (time.perf_counter() - t0) * 1e3

    def check_against(self, eager, tol):
        """"" or how this (compiled) step's output and grads differ from eager's."""
        got, want = self.result(), eager.result()
        for i, (g, w) in enumerate(zip(got, want)):
            diff = difference(g, w, tol)
            if diff:
                what = "output" if i == 0 else f"grad of leaf {i - 1}"
                return f"inductor's {what} differs from py_eager: {diff}"
        return ""


# --- workloads: each returns (make_step(compiled: bool) -> Step, tolerance) --------------
# The same as workloads_compile_list.cpp: shapes (and --quick's smaller ones), losses, dtype
# (f32), initialisation scheme.


def mean_of_squares(out):
    return out.square().mean()


def randomise_affine(norm):
    # As workloads_compile_list.cpp: with weight 1 and bias 0, mean(out^2) of a LayerNorm is 1
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
        model = nn.Sequential(nn.Linear(10, 5), nn.ReLU(), nn.Linear(5, 2), nn.Softmax(1)).to(peer_common.DEVICE)
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
        model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024), norm).to(peer_common.DEVICE)
        m = torch.compile(model) if compiled else model
        return Step(lambda: m(x), mean_of_squares, model.parameters())

    return make, MATMUL_TOL


def cross_entropy_rows(rows, classes, scale):
    """cross_entropy of logits f32[rows, classes] (randn * scale) requiring grad, int64 targets."""
    torch.manual_seed(0)
    logits = on_device(torch.randn(rows, classes) * scale).requires_grad_()
    targets = on_device(torch.randint(0, classes, (rows,), dtype=torch.int64))

    def fn(logits, targets):
        return F.cross_entropy(logits, targets)

    def make(compiled):
        f = torch.compile(fn) if compiled else fn
        return Step(lambda: f(logits, targets), lambda out: out, [logits])

    return make, MATMUL_TOL


def softmax_ce(quick):
    return cross_entropy_rows(1024 if quick else 4096, 4096, 1)


def vocab_ce(quick):
    return cross_entropy_rows(64 if quick else 128, 128256, 3)


def long_rows(quick):
    torch.manual_seed(0)
    n = 2**18 if quick else 2**22
    x = on_device(torch.randn(3, n) * 4).requires_grad_()
    w = on_device(torch.rand(n) + 0.5)

    def fn(x, w):
        return (torch.softmax(x, 1) * w).sum(1)

    def make(compiled):
        f = torch.compile(fn) if compiled else fn
        return Step(lambda: f(x, w), lambda out: out.sum(), [x])

    # eager's own f32 softmax over rows of 2**22 is off by 3.5e-4 from float64 (the C++
    # workload's comment in bench/workloads_compile_list.cpp)
    return make, (2e-3, 2e-3)


def transformer_block(quick):
    torch.manual_seed(0)
    src = on_device(torch.randn(32, 4, 256) if quick else torch.randn(128, 8, 256))

    def make(compiled):
        torch.manual_seed(1)
        layer = CppEncoderLayer(256, 4, 2048)
        randomise_affine(layer.norm1)
        randomise_affine(layer.norm2)
        layer.train()
        layer.to(peer_common.DEVICE)
        m = torch.compile(layer) if compiled else layer
        return Step(lambda: m(src), mean_of_squares, layer.parameters())

    return make, MATMUL_TOL


class UpdateStep:
    """One Adam step alone over a model's parameters, gradients set once
    (workloads_updates.cpp, Note [What an update workload measures]); fwd_us is the step.
    `inductor`: torch.compile(opt.step), Inductor's compiled optimizer, as a Python user
    compiles a step. Python's Adam on the CPU takes its default per-parameter loop, as
    LibTorch's does."""

    metrics = ("fwd_us",)

    def __init__(self, model, compiled):
        torch.manual_seed(0)
        self.params = list(model.parameters())
        for p in self.params:
            p.grad = torch.randn_like(p)
        self.opt = torch.optim.Adam(self.params, lr=1e-3)
        self.step = torch.compile(self.opt.step) if compiled else self.opt.step

    def run_untimed(self):
        self.step()

    def run_timed(self, acc):
        sync()
        t0 = time.perf_counter()
        self.step()
        sync()
        acc["fwd_us"] += time.perf_counter() - t0

    def result(self):
        return [p.detach().clone() for p in self.params]

    def prepare(self):
        t0 = time.perf_counter()
        self.run_untimed()
        return (time.perf_counter() - t0) * 1e3

    def check_against(self, eager, tol):
        for i, (g, w) in enumerate(zip(self.result(), eager.result())):
            diff = difference(g, w, tol)
            if diff:
                return f"inductor's parameter {i} after one step differs from py_eager: {diff}"
        return ""


def adam_mlp_big(quick):
    def make(compiled):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024), nn.LayerNorm(1024))
        return UpdateStep(model.to(peer_common.DEVICE), compiled)

    return make, MATMUL_TOL


def adam_transformer_block(quick):
    def make(compiled):
        torch.manual_seed(0)
        return UpdateStep(CppEncoderLayer(256, 4, 2048).to(peer_common.DEVICE), compiled)

    return make, MATMUL_TOL


WORKLOADS = {
    "adam_mlp_big": adam_mlp_big,
    "adam_transformer_block": adam_transformer_block,
    "coscos": coscos,
    "bias_relu": bias_relu,
    "mlp_small": mlp_small,
    "mlp_big": mlp_big,
    "softmax_ce": softmax_ce,
    "long_rows": long_rows,
    "vocab_ce": vocab_ce,
    "transformer_block": transformer_block,
}

from inductor_program_list import PROGRAMS  # noqa: E402 (the programs use this module's helpers)

WORKLOADS.update(PROGRAMS)


# --- timing ------------------------------------------------------------------------------


def warm_up(step, warmup_ms, round_ms):
    acc = {m: 0.0 for m in step.metrics}
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


class NothingCompiled(Exception):
    """torch.compile ran, but Dynamo compiled no graph: the variant would time eager code."""


def nothing_compiled_reason():
    """Why Dynamo compiled nothing: the first construct it refused (counters["unimplemented"],
    e.g. nn.LSTM, which Dynamo does not trace while torch._dynamo.config.allow_rnn is
    False, its default), as one line."""
    from torch._dynamo.utils import counters

    why = ""
    for text in counters["unimplemented"]:
        lines = [line.strip() for line in str(text).splitlines() if line.strip()]
        why = lines[0] if lines else ""
        for line in lines[1:]:
            if line.startswith("Explanation:"):
                why += ": " + line.removeprefix("Explanation:").strip()
            elif line.startswith("Hint: Set"):
                why += " (" + line.removeprefix("Hint:").strip() + ")"
        break
    why = why or "Dynamo skipped every frame"
    return ("torch.compile compiled no graph (the model runs eagerly under it): " + why)[:300]


class PeerWorkload:
    """One workload's variants: built, compiled, checked and warmed up; then timed a round
    at a time (one_round), and summed up as rows (rows)."""

    def __init__(self, name, args, variants):
        self.name = name
        self.steps = {}  # variant -> (Step or ProgramStep, fixed metrics)
        self.rows = []  # skipped and failed variants
        self.order, self.iters, self.per_round = [], {}, {}
        try:
            make, tol = WORKLOADS[name](args.quick)
        except NotOnThisDevice as e:
            self.rows = [skipped(name, v, str(e)) for v in variants]
            return
        torch._dynamo.reset()
        eager = make(False)
        eager.prepare()  # one-time costs (a program's setup steps)
        if "py_eager" in variants:
            self.steps["py_eager"] = (eager, {})
        if "inductor" in variants:
            try:
                from torch._dynamo.utils import counters

                counters.clear()
                step = make(True)
                # dynamo + AOTAutograd + inductor: forward, then backward (a program's setup
                # steps: the compiling ones)
                compile_ms = step.prepare()
                fixed = {"compile_ms": compile_ms, "graph_breaks": graph_breaks(),
                         "graphs": counters["stats"]["unique_graphs"]}
                if fixed["graphs"] == 0:
                    raise NothingCompiled(nothing_compiled_reason())
                problem = step.check_against(eager, tol)
                if problem:
                    raise AssertionError(problem)
                self.steps["inductor"] = (step, fixed)
            except AssertionError as e:
                self.rows.append(skipped(name, "inductor", str(e), failed=True))
            except NothingCompiled as e:
                self.rows.append(skipped(name, "inductor", str(e)))
            except Exception as e:  # no C++ compiler, an unsupported op, ...
                log(f"{name}/inductor:", traceback.format_exc())
                self.rows.append(skipped(name, "inductor", "torch.compile failed: " + one_line(e)))
        self.order = [v for v in ("py_eager", "inductor") if v in self.steps]
        self.iters = {v: warm_up(self.steps[v][0], args.warmup_ms, args.round_ms) for v in self.order}
        self.per_round = {v: {m: [] for m in self.steps[v][0].metrics} for v in self.order}

    def one_round(self):
        """One round of each variant, interleaved (A B): returns {variant: {metric: us}}.
        A timed call of the compiled function that would recompile raises instead."""
        out = {}
        stance = torch.compiler.set_stance("fail_on_recompile") if "inductor" in self.steps \
            else contextlib.nullcontext()
        with stance:
            for v in self.order:
                step = self.steps[v][0]
                acc = {m: 0.0 for m in step.metrics}
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
            row = {"workload": self.name, "variant": v, "rounds": len(next(iter(xs_of.values()))),
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
      {"op": "round"}                 ->  {"round": {variant: {metric: us}}}, the metrics
                                          fwd_us and bwd_us, or step_us (programs)
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
    set_device(args.device)
    if peer_common.DEVICE == "cuda" and not torch.cuda.is_available():
        log("--device cuda, but torch.cuda.is_available() is False")
        sys.exit(2)
    variants = [v for v in args.variants.split(",") if v]
    log(f"torch {torch.__version__}, python {sys.version.split()[0]}, {torch.get_num_threads()} threads, "
        f"device {peer_common.DEVICE}")
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
