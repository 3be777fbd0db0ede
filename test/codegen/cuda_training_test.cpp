// Whole training programs through the cuda backend on a device (skipped without one),
// against an eager twin on the device: compile_step with Adam and with fused Adam, a
// transformer encoder layer through tcap::compile.
#include "codegen/cuda/cuda.h"
#include "cuda_test_util.h"
#include "support/compare.h"
#include "support/modules.h"

#include <tcap/compile.h>
#include <tcap/stance.h>
#include <tcap/train_step.h>

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace {

using namespace tcap::test::cuda_kernels;
using Tensors = std::vector<at::Tensor>;

// Whole training programs on the device, against an eager twin from the same weights
// and data: an MLP step with Adam through compile_step, and a transformer encoder layer
// (MultiheadAttention reads equal(q, k) on the host) through tcap::compile with the loss,
// backward and AdamW eager around it. Tolerances as for the fused patterns, loosened to
// 1e-4 for the parameters after several optimizer steps (Adam divides by sqrt(v)).
void expect_same(torch::nn::Module& a, torch::nn::Module& b, double tol) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  for (const auto& item : pa) {
    EXPECT_TRUE(tcap::testing::close(item.value().detach().cpu(), pb[item.key()].detach().cpu(), tol, tol)) << item.key();
  }
}

// Trains make() through compile_step (error_on_fallback) and an eager twin from the same
// weights, with Adam(`adam`), MSE loss and fresh batches on the device, for 10 steps: each
// step's loss within 1e-4 / 1e-5, the parameters within 1e-4 at the end, at least 6
// replays. `check` then looks at the compiled step.
void adam_steps_match_eager(const std::function<torch::nn::Sequential()>& make, const torch::optim::AdamOptions& adam,
                            tcap::CompileOptions opts, const std::function<void(tcap::CompiledStep&)>& check) {
  auto a = make(), b = make();
  a->to(torch::kCUDA);
  b->to(torch::kCUDA);
  tcap::testing::copy_params(*a, *b);
  torch::optim::Adam oa(a->parameters(), adam), ob(b->parameters(), adam);
  auto body = [](torch::nn::Sequential& m, torch::optim::Adam& o, const at::Tensor& x, const at::Tensor& y) {
    o.zero_grad();
    auto loss = torch::mse_loss(m->forward(x), y);
    loss.backward();
    o.step();
    return loss;
  };
  opts.backend = "cuda";
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  auto step = tcap::compile_step(a, oa, [&](const Tensors& in) { return Tensors{body(a, oa, in[0], in[1])}; }, opts);
  for (int i = 0; i < 10; ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    auto x = torch::randn({29, 33}, torch::kCUDA);
    auto y = torch::randn({29, 17}, torch::kCUDA);
    auto got = (*step)({x, y})[0];
    auto want = body(b, ob, x, y);
    EXPECT_TRUE(tcap::testing::close(got.detach().cpu(), want.detach().cpu(), 1e-4, 1e-5));
  }
  expect_same(*a, *b, 1e-4);
  EXPECT_GE(step->stats().replays, 6) << step->eager_reason();
  check(*step);
}

TEST(CudaDevice, CompileStepWithAdamMatchesEager) {
  SKIP_WITHOUT_CUDA_DEVICE();
  torch::manual_seed(0);
  auto make = [] {
    return torch::nn::Sequential(torch::nn::Linear(33, 64), torch::nn::GELU(), torch::nn::Linear(64, 17),
                                 torch::nn::LayerNorm(torch::nn::LayerNormOptions({17})));
  };
  const auto launches0 = cuda::cuda_stats().launches;  // the eager twin launches none of tcap's
  adam_steps_match_eager(make, torch::optim::AdamOptions(1e-3), {}, [&](tcap::CompiledStep&) {
    EXPECT_GT(cuda::cuda_stats().launches, launches0) << "no generated CUDA kernel ran";
  });
}

// compile_step with fused optimizer updates on the device: the recorded per-parameter Adam
// ops become one `_fused_adam_` over the group (ATen's CUDA multi-tensor kernel), beside
// the generated kernels of the rest of the step. Tolerance 1e-4: the fused kernel orders a
// few operations differently from the per-parameter ops.
TEST(CudaDevice, CompileStepWithFusedAdamMatchesEager) {
  SKIP_WITHOUT_CUDA_DEVICE();
  torch::manual_seed(2);
  auto make = [] {
    return torch::nn::Sequential(torch::nn::Linear(33, 64), torch::nn::Tanh(), torch::nn::Linear(64, 17));
  };
  tcap::CompileOptions opts;
  opts.fused_optimizers = true;
  adam_steps_match_eager(make, torch::optim::AdamOptions(1e-2).weight_decay(0.01), opts, [](tcap::CompiledStep& step) {
    ASSERT_NE(step.graph(), nullptr);
    int fused = 0;
    for (const auto& n : step.graph()->nodes()) fused += n.op == "aten::_fused_adam_" ? 1 : 0;
    EXPECT_EQ(fused, 1) << "the step's Adam updates did not run as one fused call";
  });
}

TEST(CudaDevice, TransformerLayerCompilesAndTrains) {
  SKIP_WITHOUT_CUDA_DEVICE();
  torch::manual_seed(1);
  auto o = torch::nn::TransformerEncoderLayerOptions(64, 4).dim_feedforward(128).dropout(0.0);
  torch::nn::TransformerEncoderLayer a(o), b(o);
  a->to(torch::kCUDA);
  b->to(torch::kCUDA);
  tcap::testing::copy_params(*a, *b);
  torch::optim::AdamW oa(a->parameters(), 1e-3), ob(b->parameters(), 1e-3);
  tcap::CompileOptions opts;
  opts.backend = "cuda";
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  auto f = tcap::compile(a, opts);
  for (int i = 0; i < 8; ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    auto x = torch::randn({11, 3, 64}, torch::kCUDA);
    oa.zero_grad();
    auto got = (*f)({x})[0].pow(2).mean();
    got.backward();
    oa.step();
    ob.zero_grad();
    auto want = b->forward(x).pow(2).mean();
    want.backward();
    ob.step();
    EXPECT_TRUE(tcap::testing::close(got.detach().cpu(), want.detach().cpu(), 1e-4, 1e-5));
  }
  expect_same(*a, *b, 1e-4);
  EXPECT_GE(f->stats().replays, 5) << f->eager_reason();
}

}  // namespace
