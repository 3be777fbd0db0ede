"""What the torch.compile peer's modules share (inductor_bench.py, inductor_programs.py):
tolerances, the device the workloads run on, logging, quantiles, comparisons against
py_eager, skipped rows, and LibTorch's TransformerEncoderLayer op for op. See Note [The torch.compile peer] in bench/harness.h."""
import math
import sys

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


def set_device(device):
    global DEVICE
    DEVICE = device


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


def skipped(workload, variant, why, failed=False):
    return {"workload": workload, "variant": variant, "rounds": 0, "iters_per_round": 0,
            "skipped": why, "failed": failed}


def one_line(e):
    text = f"{type(e).__name__}: {e}".strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[0] if lines else type(e).__name__
    return line[:300]


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
