// Eager's errors are tcap's errors: a call eager refuses is refused by a compiled entry too,
// with eager's message. Inference tensors (made under InferenceMode) cannot be saved for
// backward; an entry captured with normal tensors never serves one (TensorGuard::inference),
// so the call runs the user's code, which raises what eager raises.
#include <tcap/compile.h>
#include <tcap/train_step.h>

#include "support/compare.h"
#include "support/models.h"
#include "support/modules.h"

#include <torch/torch.h>

#include <string>

namespace {

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;
namespace nn = torch::nn;

std::string eager_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

at::Tensor inference_tensor(std::vector<int64_t> sizes) {
  c10::InferenceMode guard;
  return torch::randn(sizes);
}

TEST(EagerErrors, CompileStepRefusesInferenceTensorsAsEagerDoes) {
  torch::manual_seed(1);
  nn::Linear model(4, 3);
  torch::optim::SGD opt(model->parameters(), 0.1);
  auto body = [&](const Tensors& in) {
    opt.zero_grad();
    auto loss = torch::mse_loss(model->forward(in[0]) * in[0].sum(), in[1]);
    loss.backward();
    opt.step();
    return Tensors{loss};
  };
  auto step = tcap::compile_step(model.ptr(), opt, body);
  for (int i = 0; i < 4; ++i) (*step)({torch::randn({5, 4}), torch::randn({5, 3})});
  ASSERT_GE(step->stats().replays, 1);
  const auto x = inference_tensor({5, 4});
  const auto y = torch::randn({5, 3});
  const std::string want = eager_error([&] { body({x, y}); });
  ASSERT_NE(want.find("Inference tensors cannot be saved for backward"), std::string::npos) << want;
  const std::string got = eager_error([&] { (*step)({x, y}); });
  EXPECT_NE(got.find("Inference tensors cannot be saved for backward"), std::string::npos) << got;
  // Normal tensors still replay. (The refused call's zero_grad ran before the error, as in
  // eager: the next call has no .grad tensors, another structure, and is captured.)
  const int replays = step->stats().replays;
  for (int i = 0; i < 2; ++i) (*step)({torch::randn({5, 4}), torch::randn({5, 3})});
  EXPECT_EQ(step->stats().replays, replays + 1);
}

TEST(EagerErrors, CompiledFunctionRefusesInferenceTensorsAsEagerDoes) {
  auto w = torch::randn({4, 3}, torch::requires_grad());
  auto fn = [w](const Tensors& in) { return Tensors{torch::tanh(in[0].matmul(w)) * in[0].sum()}; };
  auto f = tcap::compile(fn);
  for (int i = 0; i < 3; ++i) {
    auto x = torch::randn({5, 4});
    EXPECT_TRUE(close(f(x)[0], fn({x})[0]));
  }
  const auto x = inference_tensor({5, 4});
  const std::string want = eager_error([&] { fn({x}); });
  const std::string got = eager_error([&] { f(x); });
  if (want.empty()) {
    EXPECT_EQ(got, "");
    EXPECT_TRUE(close(f(x)[0], fn({x})[0]));
  } else {
    EXPECT_NE(got.find(want.substr(0, 40)), std::string::npos) << "eager: " << want << "\ntcap: " << got;
  }
}

}  // namespace

namespace {

// Note [Optimizer state by parameter identity]: LibTorch keys optimizer state by the
// parameter tensor; reordering a param group's parameters must not hand one layer's
// momentum to another.
TEST(OptimizerIdentity, ReorderedParamGroupKeepsEachParametersState) {
  torch::manual_seed(7);
  auto make = [] { return nn::Sequential(nn::Linear(4, 6), nn::Tanh(), nn::Linear(6, 6), nn::Tanh(), nn::Linear(6, 2)); };
  auto model = make(), twin = make();
  tcap::testing::copy_parameters(*model, *twin);
  auto sgd = [](nn::Sequential& m) {
    return torch::optim::SGD(m->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  };
  auto opt = sgd(model), opt_twin = sgd(twin);
  using tcap::testing::mse_step;
  auto step = tcap::compile_step(model, opt, [&](const Tensors& in) { return Tensors{mse_step(model, opt, in[0], in[1])}; });
  for (int i = 0; i < 10; ++i) {
    if (i == 5) {
      auto& a = opt.param_groups()[0].params();
      auto& b = opt_twin.param_groups()[0].params();
      std::reverse(a.begin(), a.end());
      std::reverse(b.begin(), b.end());
    }
    auto x = torch::randn({8, 4});
    auto y = torch::randn({8, 2});
    auto loss = (*step)({x, y})[0];
    EXPECT_TRUE(close(loss, mse_step(twin, opt_twin, x, y), 1e-4, 1e-5)) << "step " << i;
  }
  auto p = model->parameters(), q = twin->parameters();
  for (size_t k = 0; k < p.size(); ++k) EXPECT_TRUE(close(p[k], q[k], 1e-4, 1e-5)) << "parameter " << k;
  EXPECT_GE(step->stats().replays, 3);
}

}  // namespace
