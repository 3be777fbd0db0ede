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

# Same as tcap-bench's (compile_variants.h, struct Tolerance): elementwise
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
    and the attention weights averaged over heads (computed, then unused); a float attention
    mask (src_mask) is added in place to q k^T before the softmax, as LibTorch does. Its two
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

    def self_attn(self, x, mask=None):
        tgt_len, bsz, embed_dim = x.shape
        head_dim = embed_dim // self.nhead
        q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        q = q * (1 / math.sqrt(head_dim))
        q = q.contiguous().view(tgt_len, bsz * self.nhead, head_dim).transpose(0, 1)
        k = k.contiguous().view(-1, bsz * self.nhead, head_dim).transpose(0, 1)
        v = v.contiguous().view(-1, bsz * self.nhead, head_dim).transpose(0, 1)
        w = torch.bmm(q, k.transpose(1, 2))
        if mask is not None:
            w += mask.unsqueeze(0)
        w = F.softmax(w, dim=-1)
        out = torch.bmm(w, v)
        out = out.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias)
        w = w.view(bsz, self.nhead, tgt_len, -1).sum(dim=1) / self.nhead
        return out, w

    def forward(self, src, mask=None):
        src2 = self.self_attn(src, mask)[0]
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
        return UpdateStep(model.to(DEVICE), compiled)

    return make, MATMUL_TOL


def adam_transformer_block(quick):
    def make(compiled):
        torch.manual_seed(0)
        return UpdateStep(CppEncoderLayer(256, 4, 2048).to(DEVICE), compiled)

    return make, MATMUL_TOL


WORKLOADS = {
    "adam_mlp_big": adam_mlp_big,
    "adam_transformer_block": adam_transformer_block,
    "coscos": coscos,
    "bias_relu": bias_relu,
    "mlp_small": mlp_small,
    "mlp_big": mlp_big,
    "softmax_ce": softmax_ce,
    "transformer_block": transformer_block,
}


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


class CnnNet(nn.Module):
    """cnn::NetImpl."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3)
        self.bn2 = nn.BatchNorm2d(16)
        self.dropout = nn.Dropout(0.0)
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)  # 16 -> 14 -> 7
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)  # 7 -> 5 -> 2
        x = x.view(-1, 64)
        x = F.relu(self.fc1(x))
        x = self.dropout(x)
        return F.log_softmax(self.fc2(x), dim=1)


class Cnn(Program):
    """cnn::Cnn: SGD with momentum, nll_loss, batch `batch` of 1x16x16."""

    def __init__(self, compiled, batch=8):
        super().__init__(11, compiled)
        self.batch_size = batch
        self.model = CnnNet()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.5)
        self.forward = self.compile(self.model)

    def batch(self, step):
        gen = step_generator(11, step)
        return [torch.randn(self.batch_size, 1, 16, 16, generator=gen),
                torch.randint(0, 10, (self.batch_size,), generator=gen)]

    def train_step(self, batch):
        self.opt.zero_grad()
        output = self.forward(batch[0])
        loss = F.nll_loss(output, batch[1])
        loss.backward()
        self.opt.step()
        return [loss]


GAN_NOISE = 8  # gan::kNoise


class GanGenerator(nn.Module):
    """gan::GeneratorImpl."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.ConvTranspose2d(GAN_NOISE, 16, 4, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.conv3 = nn.ConvTranspose2d(8, 1, 4, stride=2, padding=1, bias=False)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))  # 1 -> 4
        x = F.relu(self.bn2(self.conv2(x)))  # 4 -> 8
        return torch.tanh(self.conv3(x))  # 8 -> 16


def gan_discriminator():
    """gan::discriminator()."""
    return nn.Sequential(nn.Conv2d(1, 8, 4, stride=2, padding=1, bias=False),  # 16 -> 8
                         nn.LeakyReLU(0.2),
                         nn.Conv2d(8, 16, 4, stride=2, padding=1, bias=False),  # 8 -> 4
                         nn.BatchNorm2d(16), nn.LeakyReLU(0.2),
                         nn.Conv2d(16, 1, 4, bias=False),  # 4 -> 1
                         nn.Flatten())


class Gan(Program):
    """gan::Gan: two Adams (betas 0.5, 0.999), D on real and fake.detach(), then G through
    D, in one step."""

    def __init__(self, compiled):
        super().__init__(12, compiled)
        self.generator = GanGenerator()
        self.discriminator = gan_discriminator()
        self.g_opt = torch.optim.Adam(self.generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
        self.d_opt = torch.optim.Adam(self.discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))
        self.g = self.compile(self.generator)
        self.d = self.compile(self.discriminator)

    def modules(self):
        return [self.generator, self.discriminator]

    def batch(self, step):
        gen = step_generator(12, step)
        return [torch.rand(8, 1, 16, 16, generator=gen) * 2 - 1, torch.randn(8, GAN_NOISE, 1, 1, generator=gen)]

    def train_step(self, batch):
        real, noise = batch
        n = real.size(0)
        # Train the discriminator on real images and detached fakes.
        self.d_opt.zero_grad()
        real_labels = torch.full((n, 1), 0.9)  # label smoothing, as the example does
        d_loss_real = F.binary_cross_entropy_with_logits(self.d(real), real_labels)
        fake = self.g(noise)
        fake_labels = torch.zeros(n, 1)
        d_loss_fake = F.binary_cross_entropy_with_logits(self.d(fake.detach()), fake_labels)
        d_loss = d_loss_real + d_loss_fake
        d_loss.backward()
        self.d_opt.step()
        # Train the generator through the discriminator.
        self.g_opt.zero_grad()
        g_loss = F.binary_cross_entropy_with_logits(self.d(fake), torch.ones(n, 1))
        g_loss.backward()
        self.g_opt.step()
        return [d_loss, g_loss]


LSTM_VOCAB, LSTM_EMBED, LSTM_HIDDEN, LSTM_SEQ, LSTM_BATCH = 40, 12, 16, 10, 3  # lstm::k*


class LstmLm(nn.Module):
    """lstm::LstmLmImpl. nn::LSTM and nn.LSTM agree: sequence first (batch_first false),
    biases, no dropout, the hidden state starting at zero."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(LSTM_VOCAB, LSTM_EMBED)
        self.lstm = nn.LSTM(LSTM_EMBED, LSTM_HIDDEN, num_layers=2)
        self.decoder = nn.Linear(LSTM_HIDDEN, LSTM_VOCAB)

    def forward(self, ids):  # ids: [seq, batch]; returns [seq, batch, vocab] logits
        output = self.lstm(self.encoder(ids))[0]
        return self.decoder(output)


class LanguageModelProgram(Program):
    """A next-token language model's step, as the C++ LM programs write it: random token
    streams of [seq + 1, batch] from the program's seed, cross_entropy of every position's
    logits against the next token, one optimizer. Subclasses give shape() = (vocab, seq,
    batch), the model (self.forward) and the optimizer (self.opt)."""

    def batch(self, step):
        vocab, seq, batch = self.shape()
        text = torch.randint(0, vocab, (seq + 1, batch), generator=step_generator(self.seed, step))
        return [text[:seq].contiguous(), text[1:].contiguous()]

    def train_step(self, batch):
        vocab = self.shape()[0]
        self.opt.zero_grad()
        logits = self.forward(batch[0])
        loss = F.cross_entropy(logits.view(-1, vocab), batch[1].view(-1))
        loss.backward()
        self.opt.step()
        return [loss]


class LstmProgram(LanguageModelProgram):
    """lstm::LstmProgram: Adam, cross_entropy over the next token, [10, 3] tokens."""

    def __init__(self, compiled):
        super().__init__(14, compiled)
        self.model = LstmLm()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=3e-3)
        self.forward = self.compile(self.model)

    def shape(self):
        return LSTM_VOCAB, LSTM_SEQ, LSTM_BATCH


class TutorialMlp(Program):
    """tutorials::TutorialMlp: Linear(10, 5), ReLU, Linear(5, 2), Softmax; mse_loss against
    a softmax target; the optimizer, batch and seed are parameters (mlp_small_step is the
    same program with Adam at batch 1: overhead::mlp_small_adam)."""

    def __init__(self, compiled, seed=16, batch=9, make_optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1)):
        super().__init__(seed, compiled)
        self.seed = seed
        self.batch_size = batch
        self.model = nn.Sequential(nn.Linear(10, 5), nn.ReLU(), nn.Linear(5, 2), nn.Softmax(1))
        self.opt = make_optimizer(self.model.parameters())
        self.forward = self.compile(self.model)

    def batch(self, step):
        gen = step_generator(self.seed, step)
        return [torch.randn(self.batch_size, 10, generator=gen),
                torch.softmax(torch.randn(self.batch_size, 2, generator=gen), 1)]

    def train_step(self, batch):
        self.opt.zero_grad()
        loss = F.mse_loss(self.forward(batch[0]), batch[1])
        loss.backward()
        self.opt.step()
        return [loss]


class ManyParams(nn.Module):
    """overhead::ManyParamsImpl: 100 parameters of small odd shapes, flattened,
    concatenated and multiplied by the batch."""

    PARAMS = 100

    def __init__(self):
        super().__init__()
        self.names = []
        for i in range(self.PARAMS):
            a, b = 1 + i % 7, 1 + (i * 3) % 5
            self.register_parameter(f"p{i}", nn.Parameter(torch.randn(a) if i % 3 == 0 else torch.randn(a, b)))
            self.names.append(f"p{i}")

    def numel(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, w):
        return torch.cat([getattr(self, n).reshape(-1) for n in self.names]) * w


class Adam100(Program):
    """overhead::Adam100: loss sum((cat(params) * w)^2), Adam."""

    def __init__(self, compiled):
        super().__init__(29, compiled)
        self.model = ManyParams()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-2)
        self.forward = self.compile(self.model)

    def batch(self, step):
        return [torch.rand(self.model.numel(), generator=step_generator(29, step)) + 0.5]

    def train_step(self, batch):
        self.opt.zero_grad()
        out = self.forward(batch[0])
        loss = (out * out).sum()
        loss.backward()
        self.opt.step()
        return [loss]


REGRESSION_BASE_LR = 0.05  # regression::kBaseLr


class RegressionMlp(Program):
    """regression::RegressionMlp: SGD with momentum under a warm-up then exponential-decay
    schedule set before every step, clip_grad_norm_ between backward and step; with
    log_norm the norm it returns is read on the host (.item(), as LibTorch's
    clip_grad_norm_ returns a double) and logged."""

    def __init__(self, compiled, log_norm):
        super().__init__(15, compiled)
        self.log_norm = log_norm
        self.model = nn.Sequential(nn.Linear(7, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=REGRESSION_BASE_LR, momentum=0.9)
        self.forward = self.compile(self.model)

    def batch(self, step):
        gen = step_generator(15, step)
        x = torch.randn(24, 7, generator=gen)
        y = (x.narrow(1, 0, 1) * 2 - x.narrow(1, 3, 1)).sin() + 0.1 * torch.randn(24, 1, generator=gen)
        return [x, y]

    def before_step(self, step):
        lr = REGRESSION_BASE_LR * (step + 1) / 5 if step < 5 else REGRESSION_BASE_LR * 0.9 ** (step - 5)
        for group in self.opt.param_groups:
            group["lr"] = lr

    def train_step(self, batch):
        self.opt.zero_grad()
        loss = F.mse_loss(self.forward(batch[0]), batch[1])
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=0.5).item()
        if self.log_norm:
            self.host_log.append(norm)
        self.opt.step()
        return [loss]


GCN_NODES, GCN_FEATURES, GCN_HIDDEN, GCN_CLASSES = 67, 12, 16, 4  # gcn::k*


class Gcn(nn.Module):
    """gcn::GcnImpl: two graph convolutions over a fixed normalized adjacency (a buffer)."""

    def __init__(self, adj):
        super().__init__()
        self.register_buffer("adj", adj)
        self.l1 = nn.Linear(GCN_FEATURES, GCN_HIDDEN)
        self.l2 = nn.Linear(GCN_HIDDEN, GCN_CLASSES)

    def forward(self, x):
        h = torch.relu(torch.mm(self.adj, self.l1(x)))
        return torch.mm(self.adj, self.l2(h))


class GcnProgram(Program):
    """gcn::GcnProgram: full-batch node classification on one random graph, cross_entropy
    over the nodes a boolean train mask selects, Adam."""

    def __init__(self, compiled):
        super().__init__(31, compiled)
        gen = torch.Generator().manual_seed(31)  # gcn::Graph
        self.x = torch.randn(GCN_NODES, GCN_FEATURES, generator=gen)
        a = (torch.rand(GCN_NODES, GCN_NODES, generator=gen) < 0.08).float().triu(1)
        a = a + a.t() + torch.eye(GCN_NODES)
        d = a.sum(1).pow(-0.5)
        adj = d.unsqueeze(1) * a * d.unsqueeze(0)
        self.y = torch.randint(GCN_CLASSES, (GCN_NODES,), generator=gen)
        self.train_mask = torch.rand(GCN_NODES, generator=gen) < 0.4
        self.model = Gcn(adj)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-2)
        self.forward = self.compile(self.model)

    def batch(self, step):
        return [self.x, self.y, self.train_mask]

    def train_step(self, batch):
        self.opt.zero_grad()
        out = self.forward(batch[0])
        loss = F.cross_entropy(out[batch[2]], batch[1][batch[2]])
        loss.backward()
        self.opt.step()
        return [loss]


UNET_BATCH, UNET_IMAGE, UNET_CHANNELS = 4, 24, 3  # unet::k*


class UNetBlock(nn.Module):
    """unet::BlockImpl: (Conv2d 3x3, GroupNorm, SiLU) x 2 and a 1x1 skip convolution."""

    def __init__(self, cin, cout, groups):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.n1 = nn.GroupNorm(groups, cout)
        self.c2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.n2 = nn.GroupNorm(groups, cout)
        self.skip = nn.Conv2d(cin, cout, 1)

    def forward(self, x):
        h = F.silu(self.n1(self.c1(x)))
        h = F.silu(self.n2(self.c2(h)))
        return h + self.skip(x)


class UNet(nn.Module):
    """unet::UNetImpl (modules registered in the same order)."""

    def __init__(self):
        super().__init__()
        self.enc1 = UNetBlock(UNET_CHANNELS, 16, 4)
        self.down = nn.Conv2d(16, 16, 3, stride=2, padding=1)
        self.enc2 = UNetBlock(16, 32, 8)
        self.dec1 = UNetBlock(48, 16, 4)
        self.out = nn.Conv2d(16, UNET_CHANNELS, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.down(e1))
        up = F.interpolate(e2, scale_factor=(2.0, 2.0), mode="nearest")
        return self.out(self.dec1(torch.cat([up, e1], 1)))


class UNetProgram(Program):
    """unet::UNetProgram: a denoiser, mse_loss(out, clean) for a noisy input, AdamW."""

    def __init__(self, compiled):
        super().__init__(41, compiled)
        self.model = UNet()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.forward = self.compile(self.model)

    def batch(self, step):
        gen = step_generator(41, step)
        shape = (UNET_BATCH, UNET_CHANNELS, UNET_IMAGE, UNET_IMAGE)
        clean = torch.randn(*shape, generator=gen)
        return [clean + 0.3 * torch.randn(*shape, generator=gen), clean]

    def train_step(self, batch):
        self.opt.zero_grad()
        loss = F.mse_loss(self.forward(batch[0]), batch[1])
        loss.backward()
        self.opt.step()
        return [loss]


TF_VOCAB, TF_MODEL, TF_CONTEXT, TF_BATCH = 32, 16, 12, 4  # transformer::k*


class TransformerLm(nn.Module):
    """transformer::TransformerLmImpl: token and positional Embeddings, two LibTorch
    TransformerEncoderLayer (TransformerEncoderLayerOptions(16, 4).dim_feedforward(32)
    .dropout(0): post-norm, ReLU, sequence first, attention with need_weights=true: see
    CppEncoderLayer) under a causal float mask, a Linear head."""

    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(TF_VOCAB, TF_MODEL)
        self.positions = nn.Embedding(TF_CONTEXT, TF_MODEL)
        self.layer1 = CppEncoderLayer(TF_MODEL, 4, 2 * TF_MODEL)
        self.layer2 = CppEncoderLayer(TF_MODEL, 4, 2 * TF_MODEL)
        self.head = nn.Linear(TF_MODEL, TF_VOCAB)

    def forward(self, ids):  # ids: [seq, batch] token ids; returns [seq, batch, vocab] logits
        seq = ids.size(0)
        pos = torch.arange(seq, dtype=ids.dtype, device=ids.device)
        x = self.tokens(ids) + self.positions(pos).unsqueeze(1)
        causal = torch.triu(torch.full((seq, seq), float("-inf")), 1)
        x = self.layer1(x, causal)
        x = self.layer2(x, causal)
        return self.head(x)


class TransformerProgram(LanguageModelProgram):
    """transformer::TransformerProgram: AdamW (lr 1e-3, weight_decay 0.01); a hook on every
    parameter logs its gradient's norm on the host (g.norm().item())."""

    def __init__(self, compiled):
        super().__init__(13, compiled)
        self.model = TransformerLm()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, weight_decay=0.01)
        self.forward = self.compile(self.model)
        for p in self.model.parameters():
            p.register_hook(lambda g: self.host_log.append(g.norm().item()))

    def shape(self):
        return TF_VOCAB, TF_CONTEXT, TF_BATCH

    def comparable(self, name, param):
        # The key bias of attention has a zero true gradient: its (AdamW-normalised)
        # rounding noise is left out, as the C++ program does.
        if "in_proj_bias" not in name:
            return param
        return torch.cat([param[:TF_MODEL], param[2 * TF_MODEL:]])


class CosCosModel(nn.Module):
    """tutorials::CosCosImpl."""

    def __init__(self):
        super().__init__()
        self.b = nn.Parameter(torch.randn(7, 5))
        self.c = nn.Parameter(torch.randn(5))
        self.d = nn.Parameter(torch.randn(7, 1))

    def forward(self, a):
        return torch.cos(torch.cos(a + self.b + self.c + self.d))


class TutorialCosCos(Program):
    """tutorials::TutorialCosCos: b, c, d parameters, a the batch, the sum as loss, SGD
    with momentum."""

    def __init__(self, compiled):
        super().__init__(17, compiled)
        self.model = CosCosModel()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.forward = self.compile(self.model)

    def batch(self, step):
        return [torch.randn(7, 5, generator=step_generator(17, step))]

    def train_step(self, batch):
        self.opt.zero_grad()
        loss = self.forward(batch[0]).sum()
        loss.backward()
        self.opt.step()
        return [loss]


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
        if DEVICE != "cpu":
            raise NotOnThisDevice("tcap-bench's program workloads run on the CPU only")
        return (lambda compiled: ProgramStep(make_program(compiled))), MATMUL_TOL

    return workload


PROGRAMS = {
    "program_cnn": program_workload(lambda c: Cnn(c)),
    "cnn_step": program_workload(lambda c: Cnn(c, 16)),
    "mlp_small_step": program_workload(lambda c: TutorialMlp(c, 23, 1, lambda ps: torch.optim.Adam(ps, lr=1e-2))),
    "adam100": program_workload(lambda c: Adam100(c)),
    "program_dcgan": program_workload(lambda c: Gan(c)),
    "program_transformer": program_workload(lambda c: TransformerProgram(c)),
    "program_lstm": program_workload(lambda c: LstmProgram(c)),
    "program_regression": program_workload(lambda c: RegressionMlp(c, log_norm=True)),
    "program_gcn": program_workload(lambda c: GcnProgram(c)),
    "program_unet": program_workload(lambda c: UNetProgram(c)),
    "program_tutorial_mlp": program_workload(lambda c: TutorialMlp(c)),
    "program_coscos": program_workload(lambda c: TutorialCosCos(c)),
}
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


def skipped(workload, variant, why, failed=False):
    return {"workload": workload, "variant": variant, "rounds": 0, "iters_per_round": 0,
            "skipped": why, "failed": failed}


def one_line(e):
    text = f"{type(e).__name__}: {e}".strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[0] if lines else type(e).__name__
    return line[:300]


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
