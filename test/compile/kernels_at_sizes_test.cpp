// Note [Sizes at launch] (codegen/cpu_llvm/cpu_llvm.h), end to end: a dynamic entry of the
// llvm backend compiles its kernels at its first two sizes and serves every later size
// with the code of the second (kernels that read their sizes at launch), through
// tcap::compile (forward and backward) and compile_step. Every call is compared with an
// eager twin: outputs and gradients at rtol 1e-4, atol 1e-5 (reordered sums), parameters
// after the steps at rtol 1e-4, atol 1e-5.
#include <tcap/compile.h>
#include <tcap/train_step.h>

#include "codegen/cpu_llvm/cpu_llvm.h"
#include "support/compare.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;
namespace nn = torch::nn;
namespace cl = tcap::codegen::cpu_llvm;

int kernels_built() {
  const cl::CpuLlvmStats s = cl::cpu_llvm_stats();
  return s.compiled + s.disk_hits;
}

struct Net : nn::Module {
  Net()
      : fc1(register_module("fc1", nn::Linear(64, 128))),
        norm(register_module("norm", nn::LayerNorm(nn::LayerNormOptions({128})))),
        fc2(register_module("fc2", nn::Linear(128, 64))) {}
  at::Tensor forward(const at::Tensor& x) {
    return fc2->forward(torch::gelu(norm->forward(fc1->forward(x)))).log_softmax(1);
  }
  nn::Linear fc1;
  nn::LayerNorm norm;
  nn::Linear fc2;
};

void copy_params(Net& to, Net& from) {
  torch::NoGradGuard g;
  auto a = to.parameters(), b = from.parameters();
  for (size_t i = 0; i < a.size(); ++i) a[i].copy_(b[i]);
}

// Every matmul of Net has at least 2 * 8192 multiply-adds at a batch of 2, so it stays an
// ATen call at every size here: a matmul that crosses the small-matmul limit (Note [Small
// matmuls as kernels]) at some size groups the kernels around it otherwise, which is new
// kernel structures once. Sizes past the first two: odd, below and above a vector width,
// some that come back; each twice (a check, then a replay).
const std::vector<int64_t> kSizes = {6, 6, 11, 11, 3, 3, 37, 37, 64, 64, 17, 17, 2, 2, 37, 100, 100, 5, 5, 11};

bool llvm_here() { return tcap::Backend("llvm").available(); }

TEST(KernelsAtSizes, CompiledFunctionForwardAndBackward) {
  if (!llvm_here()) GTEST_SKIP() << "no LLVM backend here";
  torch::manual_seed(0);
  auto net = std::make_shared<Net>();
  auto twin = std::make_shared<Net>();
  copy_params(*twin, *net);
  tcap::CompileOptions o;
  o.name = "kernels_at_sizes";
  o.backend = "llvm";
  auto f = tcap::compile(net, [&](const Tensors& in) { return Tensors{net->forward(in[0])}; }, o);
  int after_two = -1;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    const int64_t b = kSizes[i];
    SCOPED_TRACE("call " + std::to_string(i) + " batch " + std::to_string(b));
    const at::Tensor x = torch::randn({b, 64});
    const at::Tensor w = torch::randn({b, 64});
    const at::Tensor y = f(x)[0];
    const at::Tensor want = twin->forward(x);
    EXPECT_TRUE(close(y, want, 1e-4, 1e-5));
    (y * w).sum().backward();
    (want * w).sum().backward();
    auto pa = net->parameters(), pb = twin->parameters();
    for (size_t p = 0; p < pa.size(); ++p) EXPECT_TRUE(close(pa[p].grad(), pb[p].grad(), 1e-4, 1e-5)) << p;
    net->zero_grad();
    twin->zero_grad();
    if (i == 3) after_two = kernels_built();  // the first two sizes, each called twice
  }
  EXPECT_EQ(f->eager_reason(), "");
  // Every size after the first two is served by kernels compiled already.
  EXPECT_EQ(kernels_built(), after_two);
  EXPECT_GE(f->stats().replays, 9);
}

TEST(KernelsAtSizes, CompileStepWithAdam) {
  if (!llvm_here()) GTEST_SKIP() << "no LLVM backend here";
  torch::manual_seed(1);
  auto net = std::make_shared<Net>();
  auto twin = std::make_shared<Net>();
  copy_params(*twin, *net);
  torch::optim::Adam opt(net->parameters(), 1e-2);
  torch::optim::Adam opt_twin(twin->parameters(), 1e-2);
  auto body = [](Net& m, torch::optim::Optimizer& o, const Tensors& in) {
    o.zero_grad();
    auto loss = torch::nll_loss(m.forward(in[0]), in[1]);
    loss.backward();
    o.step();
    return Tensors{loss};
  };
  tcap::CompileOptions opts;
  opts.name = "kernels_at_sizes_step";
  opts.backend = "llvm";
  auto step = tcap::compile_step(net, opt, [&](const Tensors& in) { return body(*net, opt, in); }, opts);
  // compile_step compiles after two captures at one size: each size four times.
  std::vector<int64_t> sizes;
  for (int64_t b : kSizes) sizes.insert(sizes.end(), {b, b});
  int after_two = -1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t b = sizes[i];
    SCOPED_TRACE("step " + std::to_string(i) + " batch " + std::to_string(b));
    const Tensors in{torch::randn({b, 64}), torch::randint(0, 64, {b})};
    const at::Tensor loss = (*step)(in)[0];
    const at::Tensor want = body(*twin, opt_twin, in)[0];
    EXPECT_TRUE(close(loss, want, 1e-4, 1e-5));
    auto pa = net->parameters(), pb = twin->parameters();
    for (size_t p = 0; p < pa.size(); ++p) EXPECT_TRUE(close(pa[p], pb[p], 1e-4, 1e-5)) << p;
    if (i == 7) after_two = kernels_built();  // sizes 6 and 11, four steps each
  }
  EXPECT_EQ(step->eager_reason(), "");
  EXPECT_EQ(kernels_built(), after_two);
  EXPECT_GE(step->stats().replays, 20);
}

}  // namespace
