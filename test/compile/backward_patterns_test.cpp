// Backward patterns of real programs around tcap::compile: hooks on parameters that log
// gradient norms (they run at accumulation, after the region's backward), a first
// backward that is torch::autograd::grad(...) before loss.backward(), backward() calls on
// several threads at once. Each against eager, and the compiled entries must be used.
//
// Tolerances (float32): rtol 1e-5, atol 1e-6 (the same kernels as eager).
#include <tcap/compile.h>
#include <tcap/stance.h>

#include "support/compare.h"
#include "support/modules.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <thread>

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;
namespace nn = torch::nn;

namespace {

using tcap::testing::copy_params;

// Hooks on the parameters read the gradient's norm on the host: they run at
// AccumulateGrad, outside the region, exactly once per backward, with eager's gradients.
TEST(BackwardPatterns, ParameterHooksLoggingGradNorms) {
  torch::manual_seed(0);
  nn::Sequential model(nn::Linear(6, 10), nn::ReLU(), nn::Linear(10, 2));
  nn::Sequential twin(nn::Linear(6, 10), nn::ReLU(), nn::Linear(10, 2));
  copy_params(*model, *twin);
  std::vector<double> norms, twin_norms;
  for (auto& p : model->parameters()) {
    p.register_hook([&norms](const at::Tensor& g) { norms.push_back(g.norm().item<double>()); });
  }
  for (auto& p : twin->parameters()) {
    p.register_hook([&twin_norms](const at::Tensor& g) { twin_norms.push_back(g.norm().item<double>()); });
  }
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  auto f = tcap::compile(model);
  for (int i = 0; i < 6; ++i) {
    auto x = torch::randn({5, 6});
    f->forward(x).pow(2).sum().backward();
    twin->forward(x).pow(2).sum().backward();
  }
  ASSERT_EQ(norms.size(), twin_norms.size()) << "each hook must run exactly once per backward";
  // The engine may run the leaves' AccumulateGrad nodes in another order: compare each
  // backward's norms as a set.
  const size_t per_step = model->parameters().size();
  for (size_t k = 0; k + per_step <= norms.size(); k += per_step) {
    std::sort(norms.begin() + k, norms.begin() + k + per_step);
    std::sort(twin_norms.begin() + k, twin_norms.begin() + k + per_step);
  }
  for (size_t k = 0; k < norms.size(); ++k) EXPECT_NEAR(norms[k], twin_norms[k], 1e-5 * (1 + twin_norms[k])) << k;
  auto pb = twin->named_parameters();
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(close(item.value().grad(), pb[item.key()].grad())) << item.key();
  }
  EXPECT_EQ(f->eager_reason(), "");
  EXPECT_GE(f->stats().replays, 4);
}

// The first backward through the region is autograd::grad; then loss.backward().
TEST(BackwardPatterns, GradBeforeBackward) {
  torch::manual_seed(1);
  nn::Linear model(4, 3), twin(4, 3);
  copy_params(*model, *twin);
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  auto f = tcap::compile(model);
  for (int i = 0; i < 5; ++i) {
    auto x = torch::randn({7, 4}, torch::requires_grad());
    auto loss = torch::tanh(f->forward(x)).sum();
    auto gx = torch::autograd::grad({loss}, {x}, {}, /*retain_graph=*/true)[0];
    loss.backward();
    auto xt = x.detach().requires_grad_(true);
    auto ref = torch::tanh(twin->forward(xt)).sum();
    auto rgx = torch::autograd::grad({ref}, {xt}, {}, true)[0];
    ref.backward();
    EXPECT_TRUE(close(gx, rgx)) << "step " << i;
    EXPECT_TRUE(close(model->weight.grad(), twin->weight.grad())) << "step " << i;
  }
  EXPECT_EQ(f->eager_reason(), "");
  EXPECT_GE(f->stats().replays, 3);
}

// Functions compiled and first called on several threads at once, each with its own
// backward: every result right, no crash.
TEST(BackwardPatterns, FirstCallsOnSeveralThreads) {
  constexpr int kThreads = 4;
  std::atomic<int> wrong{0};
  auto shared = tcap::compile([](const Tensors& in) { return Tensors{torch::cos(torch::cos(in[0] + in[1]))}; });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto own = tcap::compile([](const Tensors& in) { return Tensors{torch::sin(in[0] * in[1])}; });
      for (int i = 0; i < 40; ++i) {
        auto a = torch::randn({16}, torch::requires_grad()), b = torch::randn({16}, torch::requires_grad());
        auto& f = (i + t) % 2 ? *shared : *own;
        auto out = f({a, b})[0];
        out.sum().backward();
        auto ga = a.grad().clone();
        a.mutable_grad().reset();
        b.mutable_grad().reset();
        auto ref = (i + t) % 2 ? torch::cos(torch::cos(a + b)) : torch::sin(a * b);
        ref.sum().backward();
        if (!close(out, ref) || !close(ga, a.grad())) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GE(shared->stats().replays, 1);
}

}  // namespace
