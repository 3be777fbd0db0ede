"""The program workloads of tcap-bench's torch.compile peer (inductor_bench.py): what a
program is, the step that runs it as workloads_programs.cpp does, and the workload made
of it (see inductor_bench.py's docstring). The programs themselves:
inductor_program_list.py."""
import time

import torch

import peer_common
from peer_common import MATMUL_TOL, difference, one_line, sync

# --- program workloads (workloads_programs.cpp): the programs of test/programs/*.h ------
# Each class below is the C++ program of the same name written again in Python: same
# modules, sizes and registration order, same losses, optimizers and hyper-parameters,
# same batches (a torch.Generator seeded as step_generator seeds the C++ one). Weights are
# PyTorch's default initialisation after torch.manual_seed(the program's seed) (the C++
# Seed member); they need not equal LibTorch's, the cost does. Python's optimizers take
# their defaults, which on the CPU are the per-parameter loops (foreach and fused are for
# accelerators), as LibTorch's are. `compiled`: each model wrapped in torch.compile(model)
# (the inductor variant), everything else eager, as the C++ Mode::Compile does with
# tcap::compile.

K_WARMUP_STEPS = 6  # workloads_programs.cpp's kWarmupSteps
K_BATCHES = 8  # and its kBatches


def step_generator(program_seed, step):
    """programs::step_generator: a generator seeded for one step of one program."""
    return torch.Generator().manual_seed(program_seed * 1000003 + step)


class Program:
    """programs::Program: models, optimizers, batch(step), before_step(step), train_step."""

    def __init__(self, seed, compiled):
        torch.manual_seed(seed)  # the program's Seed member: before its models are built
        self.seed = seed  # also the batches' (step_generator)
        self.compiled = compiled
        self.host_log = []  # host-side values the step logs (grad norms, clip_grad_norm_'s)

    def compile(self, model):
        return torch.compile(model) if self.compiled else model

    def modules(self):
        return [self.model]

    def before_step(self, step):
        pass

    def comparable(self, name, param):
        """The part of a parameter compared with eager (Program::comparable)."""
        return param


class ProgramStep:
    """One variant of a program workload: one iteration is one training step (step_us),
    the steps cycling through K_BATCHES batches drawn at setup. Same interface as Step."""

    metrics = ("step_us",)

    def __init__(self, program):
        self.program = program
        self.batches = [program.batch(b) for b in range(K_BATCHES)]
        self.steps = 0
        self.record = []  # per setup step: (losses, the host values it logged, sorted)

    def run_step(self):
        p = self.program
        p.before_step(self.steps)
        losses = p.train_step(self.batches[self.steps % K_BATCHES])
        self.steps += 1
        return losses

    def run_untimed(self):
        n = len(self.program.host_log)
        losses = self.run_step()
        self.record.append(([t.detach().clone() for t in losses], sorted(self.program.host_log[n:])))

    def run_timed(self, acc):
        sync()
        t0 = time.perf_counter()
        self.run_step()
        sync()
        acc["step_us"] += time.perf_counter() - t0

    def prepare(self):
        """K_WARMUP_STEPS untimed steps (the compiles, the optimizers' state), then one
        under fail_on_recompile, as workloads_programs.cpp does: returns the ms of the
        steps in which torch.compile compiled (the first, and any that compiled again)."""
        from torch._dynamo.utils import counters

        compile_ms = 0.0
        for k in range(K_WARMUP_STEPS):
            graphs = counters["stats"]["unique_graphs"]
            t0 = time.perf_counter()
            self.run_untimed()
            ms = (time.perf_counter() - t0) * 1e3
            if k == 0 or counters["stats"]["unique_graphs"] != graphs:
                compile_ms += ms
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                self.run_untimed()
        except Exception as e:
            # A recompile (RecompileError) or anything else: the step after warm-up is not
            # served by what the warm-up compiled, as workloads_programs.cpp fails it.
            raise AssertionError("the step after warm-up failed under fail_on_recompile: " + one_line(e)) from e
        return compile_ms

    def state(self):
        """(name, tensor) of the models' parameters (their comparable part) and buffers."""
        modules = self.program.modules()
        for i, m in enumerate(modules):
            prefix = f"model {i} " if len(modules) > 1 else ""
            for name, p in m.named_parameters():
                yield prefix + name, self.program.comparable(name, p.detach())
            for name, b in m.named_buffers():
                yield prefix + name, b

    def check_against(self, eager, tol):
        """"" or where this program's setup steps differ from eager's: each step's losses
        and logged host values (a multiset, as the C++ tier compares them: hooks may run in
        another order), then the parameters and buffers after them."""
        for k, ((got, got_log), (want, want_log)) in enumerate(zip(self.record, eager.record)):
            for i, (g, w) in enumerate(zip(got, want)):
                diff = difference(g, w, tol)
                if diff:
                    return f"inductor's loss {i} of step {k} differs from py_eager: {diff}"
            if len(got_log) != len(want_log):
                return f"inductor's step {k} logged {len(got_log)} host values, py_eager's {len(want_log)}"
            if want_log:
                diff = difference(torch.tensor(got_log, dtype=torch.float64),
                                  torch.tensor(want_log, dtype=torch.float64), tol)
                if diff:
                    return f"inductor's logged host values of step {k} differ from py_eager: {diff}"
        for (name, g), (_, w) in zip(self.state(), eager.state()):
            diff = difference(g, w, tol)
            if diff:
                return f"inductor's {name} after {len(self.record)} steps differs from py_eager: {diff}"
        return ""


class NotOnThisDevice(Exception):
    """A workload that does not run on --device (its rows are skipped, not failed)."""


def program_workload(make_program):
    """A program workload: (make(compiled) -> ProgramStep, tolerance); --quick shrinks
    nothing (the programs are small already); CPU only, as tcap-bench's programs.

    The tolerance is MATMUL_TOL (the C++ tier's Tolerance{1e-4, 1e-5}) for every program,
    BatchNorm and Adam ones included: over the 7 setup steps the largest difference
    measured (torch 2.11, CPU) was 2.8e-6 of a tensor's largest magnitude (program_cnn's
    bn1.bias after SGD with momentum), the losses and logged norms within 7e-7."""

    def workload(quick):
        if peer_common.DEVICE != "cpu":
            raise NotOnThisDevice("tcap-bench's program workloads run on the CPU only")
        return (lambda compiled: ProgramStep(make_program(compiled))), MATMUL_TOL

    return workload
