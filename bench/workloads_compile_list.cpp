// The workloads of tcap::compile (Note [What a compile workload measures] in
// workloads_compile.cpp): what each computes, its inputs and tolerance, its bandwidth floor.
#include "compile_variants.h"

#include <torch/torch.h>

#include <string>
#include <vector>

namespace tcap::bench {

namespace {

using namespace compile_workloads;
namespace nn = torch::nn;

// --- coscos ----------------------------------------------------------------------------

Tensors coscos(const Tensors& in) { return {torch::cos(torch::cos(in[0] + in[1] + in[2] + in[3]))}; }

std::vector<Variant> make_coscos(const Options& opts) {
  torch::manual_seed(0);
  // Shared by every variant: grads are reset before each iteration.
  Tensors inputs;
  for (int i = 0; i < 4; ++i) inputs.push_back(torch::randn({1024, 2048}).to(torch::Device(opts.device)).requires_grad_(true));
  return make_variants("coscos", opts, kPointwiseTol, [inputs](const tcap::CompileOptions* o) {
    return function_step(coscos, inputs, inputs, [](const at::Tensor& out) { return out.sum(); }, o);
  });
}

// --- bias_relu -------------------------------------------------------------------------

// relu(x + b) over f32[8192, 1024] ([1024, 1024] with --quick), x and b requiring grad,
// loss sum(out * w) with a fixed w outside the compiled function (so that the backward
// gets a full gradient, not a broadcast scalar). The backward's bias gradient is a column
// sum of the masked gradient, which it also stores: one Column kernel on CUDA (Note [Split
// column reductions]), a column reduction on the CPU.
Tensors bias_relu(const Tensors& in) { return {torch::relu(in[0] + in[1])}; }

int64_t bias_relu_rows(const Options& o) { return o.quick ? 1024 : 8192; }

std::vector<Variant> make_bias_relu(const Options& opts) {
  torch::manual_seed(0);
  const torch::Device dev(opts.device);
  const at::Tensor x = torch::randn({bias_relu_rows(opts), 1024}).to(dev).requires_grad_(true);
  const at::Tensor b = torch::randn({1024}).to(dev).requires_grad_(true);
  const at::Tensor w = torch::randn({bias_relu_rows(opts), 1024}).to(dev);
  return make_variants("bias_relu", opts, kMatmulTol, [x, b, w](const tcap::CompileOptions* o) {
    return function_step(bias_relu, {x, b}, {x, b}, [w](const at::Tensor& out) { return (out * w).sum(); }, o);
  });
}

// --- mlp_small -------------------------------------------------------------------------

// The seed MLP (as in record_mlp_step), batch 1, MSE loss against a fixed target. Each
// variant has its own model, with the same weights.
std::vector<Variant> make_mlp_small(const Options& opts) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({1, 10}).to(torch::Device(opts.device));
  const at::Tensor target = torch::randn({1, 2}).to(torch::Device(opts.device));
  return make_variants("mlp_small", opts, kPointwiseTol, [x, target, dev = opts.device](const tcap::CompileOptions* o) {
    torch::manual_seed(1);
    nn::Sequential model{nn::Linear(10, 5), nn::ReLU(), nn::Linear(5, 2), nn::Softmax(1)};
    model->to(torch::Device(dev));
    return module_step(model, x, [target](const at::Tensor& out) { return torch::mse_loss(out, target); }, o);
  });
}

// --- small_linear_<n> ------------------------------------------------------------------

// Linear(n, n) + ReLU at batch n (n^3 multiply-adds per matmul), loss out.sum(): where
// a generated matmul kernel stops beating the BLAS call (Note [Small matmuls as kernels];
// run once with TCAP_SMALL_MATMUL_MACS=0 to time the BLAS calls in tcap's graphs).
std::vector<Variant> make_small_linear(const Options& opts, int64_t n) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({n, n}).to(torch::Device(opts.device));
  return make_variants("small_linear_" + std::to_string(n), opts, kMatmulTol,
                       [x, n, dev = opts.device](const tcap::CompileOptions* o) {
                         torch::manual_seed(1);
                         nn::Sequential model{nn::Linear(n, n), nn::ReLU()};
                         model->to(torch::Device(dev));
                         return module_step(model, x, [](const at::Tensor& out) { return out.sum(); }, o);
                       });
}

// --- mlp_big -------------------------------------------------------------------------

// Randomises a LayerNorm's affine parameters. With weight 1 and bias 0, mean(out^2) of a
// LayerNorm's output is 1 whatever its input (up to eps), so every grad above it would be
// rounding noise: nothing to check, and not a training step's values. The work is the same.
void randomise_affine(nn::LayerNorm& norm) {
  torch::NoGradGuard no_grad;
  norm->weight.normal_(1.0, 0.5);
  norm->bias.normal_(0.0, 0.5);
}

at::Tensor mean_of_squares(const at::Tensor& out) { return out.square().mean(); }

// Linear(1024, 4096) -> GELU -> Linear(4096, 1024) -> LayerNorm(1024), batch 256 (64 with
// --quick), compiled as a module; loss mean(out^2) and backward outside it, as in
// mlp_small (the loss is 0.25M elements beside 4 GFLOP of matmuls).
std::vector<Variant> make_mlp_big(const Options& opts) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({opts.quick ? 64 : 256, 1024}).to(torch::Device(opts.device));
  return make_variants("mlp_big", opts, kMatmulTol, [x, dev = opts.device](const tcap::CompileOptions* o) {
    torch::manual_seed(1);
    nn::LayerNorm norm(nn::LayerNormOptions({1024}));
    randomise_affine(norm);
    nn::Sequential model{nn::Linear(1024, 4096), nn::GELU(), nn::Linear(4096, 1024), norm};
    model->to(torch::Device(dev));
    return module_step(model, x, mean_of_squares, o);
  });
}

// --- softmax_ce ------------------------------------------------------------------------

constexpr int64_t kCeClasses = 4096;
int64_t ce_rows(const Options& o) { return o.quick ? 1024 : 4096; }  // 4096 x 4096 = 64 MiB

// Softmax + cross-entropy (log_softmax + nll_loss, mean over rows): the compiled function
// returns the loss, and loss.backward() is the timed backward.
Tensors softmax_ce(const Tensors& in) { return {nn::functional::cross_entropy(in[0], in[1])}; }

// cross_entropy of logits f32[rows, classes] (randn * scale) requiring grad, int64 targets.
std::vector<Variant> make_cross_entropy(const char* name, int64_t rows, int64_t classes, double scale,
                                        const Options& opts) {
  torch::manual_seed(0);
  const at::Tensor logits = (torch::randn({rows, classes}) * scale).to(torch::Device(opts.device)).requires_grad_(true);
  const at::Tensor targets = torch::randint(0, classes, {rows}, torch::kLong).to(torch::Device(opts.device));
  return make_variants(name, opts, kMatmulTol, [logits, targets](const tcap::CompileOptions* o) {
    return function_step(softmax_ce, {logits, targets}, {logits}, [](const at::Tensor& out) { return out; }, o);
  });
}

// A cross-entropy workload's floor: the forward reads the logits once (a one-pass
// log-sum-exp per row; the targets and the scalar loss are left out; where the logits are
// a primal it also writes the log-probabilities its backward reads, a sound floor of twice
// this); the backward reads them again and writes their grad.
FloorBytes cross_entropy_floor(int64_t rows, int64_t classes) {
  const double logits = static_cast<double>(rows * classes) * 4;
  return FloorBytes{logits, 2 * logits};
}

std::vector<Variant> make_softmax_ce(const Options& opts) {
  return make_cross_entropy("softmax_ce", ce_rows(opts), kCeClasses, 1, opts);
}

// --- vocab_ce --------------------------------------------------------------------------

// A language model's loss over a vocabulary of 128,256 tokens (Llama 3's): cross_entropy of
// logits f32[128, 128256] (63 MiB; 64 rows with --quick) given to the compiled function.
// Rows of 501 KiB: more than a core's L2 holds, in more rows than threads.
constexpr int64_t kVocab = 128256;
int64_t vocab_rows(const Options& o) { return o.quick ? 64 : 128; }

std::vector<Variant> make_vocab_ce(const Options& opts) {
  return make_cross_entropy("vocab_ce", vocab_rows(opts), kVocab, 3, opts);
}

// --- long_rows -------------------------------------------------------------------------

// A softmax over three long rows weighted by a vector: (softmax(x, 1) * w).sum(1), x
// f32[3, 2^22] requiring grad (48 MiB; [3, 2^18] with --quick), w f32[2^22] in [0.5, 1.5)
// (positive: the sums have no cancellation to make their rounding look large): fewer rows
// than threads on most machines, so a kernel parallel over rows leaves threads idle (Note
// [Split reductions]). Loss out.sum() outside the compiled function.
// Tolerance: eager's own f32 softmax over rows of 2^22 is off by 3.5e-4 (relative) from
// the float64 result, the output of the split kernels by 2.4e-7 (summed in 32 chunks), and
// the input's gradient, y * (w - out), inherits eager's error where w is near out (1.2e-3
// of its largest magnitude against eager); so the comparison with eager allows 2e-3.
constexpr Tolerance kLongRowTol{2e-3, 2e-3};
int64_t long_row(const Options& o) { return o.quick ? int64_t{1} << 18 : int64_t{1} << 22; }

std::vector<Variant> make_long_rows(const Options& opts) {
  torch::manual_seed(0);
  const at::Tensor x = (torch::randn({3, long_row(opts)}) * 4).to(torch::Device(opts.device)).requires_grad_(true);
  const at::Tensor w = (torch::rand({long_row(opts)}) + 0.5).to(torch::Device(opts.device));
  return make_variants("long_rows", opts, kLongRowTol, [x, w](const tcap::CompileOptions* o) {
    return function_step([](const Tensors& in) { return Tensors{(torch::softmax(in[0], 1) * in[1]).sum(1)}; },
                         {x, w}, {x}, [](const at::Tensor& out) { return out.sum(); }, o);
  });
}

// --- transformer_block -----------------------------------------------------------------

// One nn::TransformerEncoderLayer (d_model 256, 4 heads, dim_feedforward 2048, ReLU,
// post-norm, dropout 0 so that results are checkable), training mode, input [128, 8, 256]
// (seq, batch, d_model; [32, 4, 256] with --quick), compiled as a module; loss mean(out^2)
// outside it. Both LayerNorms' affine parameters are randomised (see randomise_affine).
std::vector<Variant> make_transformer_block(const Options& opts) {
  torch::manual_seed(0);
  const at::Tensor src = (opts.quick ? torch::randn({32, 4, 256}) : torch::randn({128, 8, 256})).to(torch::Device(opts.device));
  return make_variants("transformer_block", opts, kMatmulTol, [src, dev = opts.device](const tcap::CompileOptions* o) {
    torch::manual_seed(1);
    nn::TransformerEncoderLayer layer(nn::TransformerEncoderLayerOptions(256, 4).dropout(0.0));
    randomise_affine(layer->norm1);
    randomise_affine(layer->norm2);
    layer->train();
    layer->to(torch::Device(dev));
    return module_step(layer, src, mean_of_squares, o);
  });
}

// --- ca_chain --------------------------------------------------------------------------

// A chain of 100 small pointwise ops on f32[64]: a backward of ~100 autograd nodes whose
// kernels are tiny, so compiled autograd's per-call cost (the graph walk and cache lookup,
// lookup_us) shows. Goal: lookup_us under 20 µs.
Tensors ca_chain(const Tensors& in) {
  at::Tensor x = in[0];
  for (int i = 0; i < 33; ++i) x = torch::sin(x * 1.01 + in[1]);
  return {x};
}

std::vector<Variant> make_ca_chain(const Options& opts) {
  torch::manual_seed(0);
  Tensors inputs{torch::randn({64}).to(torch::Device(opts.device)).requires_grad_(true),
                 torch::randn({64}).to(torch::Device(opts.device)).requires_grad_(true)};
  return make_variants("ca_chain", opts, kPointwiseTol, [inputs](const tcap::CompileOptions* o) {
    return function_step(ca_chain, inputs, inputs, [](const at::Tensor& out) { return out.sum(); }, o);
  });
}

}  // namespace

void add_compile_workloads(Registry& registry) {
  constexpr double kMiB = 1 << 20;
  Workload coscos{"coscos",
                  "cos(cos(a+b+c+d)), 4 x f32[1024, 2048] requiring grad, loss out.sum(): eager vs "
                  "tcap::compile replay (eager / llvm backend; min-cut / default partitioner); µs per call",
                  make_coscos, derive_bwd_ratio};
  // Note [Bandwidth floors]: forward reads a, b, c, d and writes out and one saved tensor
  // (a+b+c+d, for the recompute); backward reads it and grad_out and writes 4 grads.
  coscos.floor_bytes = [](const Options&) { return FloorBytes{6 * 8 * kMiB, 6 * 8 * kMiB}; };
  coscos.has_peer = true;
  coscos.cuda = true;
  registry.add(std::move(coscos));

  Workload bias{"bias_relu",
                "relu(x + b), x f32[8192, 1024] ([1024, 1024] with --quick) and b f32[1024] requiring grad, "
                "loss sum(out * w): the backward's bias gradient is a column sum; µs per call",
                make_bias_relu, derive_bwd_ratio};
  bias.has_peer = true;
  bias.cuda = true;
  registry.add(std::move(bias));

  Workload mlp_small{"mlp_small",
                     "seed MLP 10-5-2 (softmax, batch 1) compiled as a module, MSE loss and backward "
                     "outside it: eager vs tcap::compile replay; µs per call",
                     make_mlp_small, derive_bwd_ratio};
  mlp_small.has_peer = true;
  mlp_small.cuda = true;
  registry.add(std::move(mlp_small));

  for (int64_t n : {8, 16, 32, 48, 64}) {
    Workload w{"small_linear_" + std::to_string(n),
               "Linear(" + std::to_string(n) + ", " + std::to_string(n) + ") + ReLU at batch " + std::to_string(n) +
                   " (" + std::to_string(n * n * n) + " multiply-adds per matmul), loss out.sum(): small matmuls "
                   "as generated kernels against BLAS; µs per call",
               [n](const Options& o) { return make_small_linear(o, n); }, derive_bwd_ratio};
    registry.add(std::move(w));
  }

  Workload chain{"ca_chain",
                 "33 x sin(x * 1.01 + b) on f32[64] (a 100-node backward): compiled autograd's per-call "
                 "walk and cache lookup (lookup_us) against the whole backward; µs per call",
                 make_ca_chain, derive_bwd_ratio};
  chain.cuda = true;
  registry.add(std::move(chain));

  Workload mlp_big{"mlp_big",
                   "Linear(1024,4096) GELU Linear(4096,1024) LayerNorm, batch 256 (64 with --quick), compiled "
                   "as a module, loss mean(out^2) and backward outside it; µs per call",
                   make_mlp_big, derive_bwd_ratio};
  mlp_big.has_peer = true;
  mlp_big.cuda = true;
  registry.add(std::move(mlp_big));

  Workload ce{"softmax_ce",
              "cross_entropy(logits f32[4096, 4096] requiring grad, int64 targets; 1024 rows with --quick) "
              "compiled, returns the loss; µs per call",
              make_softmax_ce, derive_bwd_ratio};
  ce.floor_bytes = [](const Options& o) { return cross_entropy_floor(ce_rows(o), kCeClasses); };
  ce.has_peer = true;
  ce.cuda = true;
  registry.add(std::move(ce));

  Workload vocab{"vocab_ce",
                 "cross_entropy(logits f32[128, 128256] requiring grad, int64 targets; 64 rows with --quick) "
                 "compiled, returns the loss: rows longer than a core's L2, more rows than threads; µs per call",
                 make_vocab_ce, derive_bwd_ratio};
  vocab.floor_bytes = [](const Options& o) { return cross_entropy_floor(vocab_rows(o), kVocab); };
  vocab.has_peer = true;
  vocab.cuda = true;
  registry.add(std::move(vocab));

  Workload rows{"long_rows",
                "(softmax(x, 1) * w).sum(1), x f32[3, 4194304] requiring grad ([3, 262144] with --quick), "
                "w f32[4194304], loss out.sum(): row reductions over fewer rows than threads; µs per call",
                make_long_rows, derive_bwd_ratio};
  // Forward reads x and w and writes the softmax (saved: x is a primal, Note [Recomputing
  // from primals]); backward reads the softmax and w and writes x's grad.
  rows.floor_bytes = [](const Options& o) {
    const double x = static_cast<double>(3 * long_row(o)) * 4, w = static_cast<double>(long_row(o)) * 4;
    return FloorBytes{2 * x + w, 2 * x + w};
  };
  rows.has_peer = true;
  rows.cuda = true;
  registry.add(std::move(rows));

  Workload block{"transformer_block",
                 "nn::TransformerEncoderLayer(256, 4 heads, ff 2048, dropout 0), training, input "
                 "[128, 8, 256] ([32, 4, 256] with --quick), compiled as a module, loss mean(out^2) "
                 "outside it; µs per call",
                 make_transformer_block, derive_bwd_ratio};
  block.has_peer = true;
  block.cuda = true;
  registry.add(std::move(block));
}

}  // namespace tcap::bench
