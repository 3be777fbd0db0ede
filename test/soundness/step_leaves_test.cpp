// compile_step and the leaves outside the parameters (Note [Leaves of a step]): a user
// input that requires grad gets eager's .grad on every replay (fresh each step, or one
// tensor accumulating across steps); a tensor the step reads through its closure that
// gets a gradient runs the step eagerly, with the reason.
#include "soundness/soundness.h"

#include "support/log_capture.h"

namespace tcap::soundness {
namespace {

class StepLeaves : public ::testing::TestWithParam<std::string> {};

TEST_P(StepLeaves, InputThatRequiresGradGetsEagersGrad) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  for (const bool persistent : {false, true}) {
    torch::manual_seed(0);
    nn::Linear lin(5, 3), twin(5, 3);
    tcap::testing::copy_parameters(*lin, *twin);
    torch::optim::Adam opt(lin->parameters(), 1e-2), opt_twin(twin->parameters(), 1e-2);
    auto body = [](nn::Linear& m, torch::optim::Adam& o, const at::Tensor& x, const at::Tensor& y) {
      o.zero_grad();
      auto loss = torch::mse_loss(m(x).tanh(), y);
      loss.backward();
      o.step();
      return loss;
    };
    CompileOptions co;
    co.backend = backend;
    auto step = tcap::compile_step(lin.ptr(), opt, [&](const Tensors& in) { return Tensors{body(lin, opt, in[0], in[1])}; }, co);
    const Tol tol = tolerance(backend);
    tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
    // An adversarial example optimized across steps (persistent), or a fresh input per step.
    auto x = torch::randn({4, 5}).requires_grad_(true);
    auto x_twin = x.detach().clone().requires_grad_(true);
    for (int i = 0; i < 8; ++i) {
      if (!persistent) {
        x = torch::randn({4, 5}).requires_grad_(true);
        x_twin = x.detach().clone().requires_grad_(true);
      }
      auto y = torch::randn({4, 3});
      auto loss = (*step)({x, y})[0];
      auto ref = body(twin, opt_twin, x_twin, y);
      ASSERT_TRUE(tcap::testing::close(loss, ref, tol.rtol, tol.atol)) << "persistent " << persistent << " step " << i;
      ASSERT_TRUE(x.grad().defined()) << "persistent " << persistent << " step " << i << ": the input's .grad was dropped";
      ASSERT_TRUE(tcap::testing::close(x.grad(), x_twin.grad(), tol.rtol, tol.atol))
          << "persistent " << persistent << " step " << i;
      ASSERT_TRUE(tcap::testing::close(lin->weight, twin->weight, tol.rtol, tol.atol)) << "step " << i;
    }
    EXPECT_GE(step->stats().replays, 4) << "persistent " << persistent;
  }
}

TEST_P(StepLeaves, ClosureTensorThatGetsAGradientRunsEagerlyWithReason) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  torch::manual_seed(0);
  nn::Linear lin(5, 3), twin(5, 3);
  tcap::testing::copy_parameters(*lin, *twin);
  auto scale = torch::ones({3}).requires_grad_(true);  // learnable, but in no model
  auto scale_twin = scale.detach().clone().requires_grad_(true);
  torch::optim::SGD opt(lin->parameters(), 0.1), opt_twin(twin->parameters(), 0.1);
  auto body = [](nn::Linear& m, torch::optim::SGD& o, const at::Tensor& s, const at::Tensor& x) {
    o.zero_grad();
    auto loss = (m(x) * s).pow(2).mean();
    loss.backward();
    o.step();
    return loss;
  };
  CompileOptions co;
  co.backend = backend;
  auto step = tcap::compile_step(lin.ptr(), opt, [&](const Tensors& in) { return Tensors{body(lin, opt, scale, in[0])}; }, co);
  tcap::testing::LogCapture logs("graph_breaks");
  for (int i = 0; i < 6; ++i) {
    auto x = torch::randn({4, 5});
    auto loss = (*step)({x})[0];
    auto ref = body(twin, opt_twin, scale_twin, x);
    ASSERT_TRUE(tcap::testing::close(loss, ref, 1e-5, 1e-6)) << "step " << i;
    ASSERT_TRUE(tcap::testing::close(scale.grad(), scale_twin.grad(), 1e-5, 1e-6)) << "step " << i;
  }
  EXPECT_EQ(step->stats().replays, 0);
  EXPECT_NE(step->eager_reason().find("a tensor it reads from outside its inputs"), std::string::npos)
      << step->eager_reason() << "\n" << logs.text();
}

INSTANTIATE_TEST_SUITE_P(Soundness, StepLeaves, ::testing::Values(std::string("eager"), std::string("llvm")));

}  // namespace
}  // namespace tcap::soundness
