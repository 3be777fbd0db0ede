// Global state changed between calls (Note [Global state guards]): anomaly mode (eager's
// backward raises on a NaN gradient: every front door runs eagerly while it is on, so it
// raises too), deterministic algorithms, inference mode, CPU autocast. Each gives eager's
// answer (or eager's error), in every mode and backend.
#include "soundness/soundness.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/anomaly_mode.h>

namespace tcap::soundness {
namespace {

// where(x > 0, sqrt(x), x): the forward is finite, the backward of sqrt at the negative
// entries is NaN (masked to zero by where's backward, but anomaly mode checks SqrtBackward0's
// own output first).
struct SqrtNet : Net {
  SqrtNet() { fc = register_module("fc", nn::Linear(6, 3)); }
  at::Tensor run(const at::Tensor& x) override {
    auto h = fc(x);
    return torch::where(h > 0, h.sqrt(), h);
  }
  nn::Linear fc{nullptr};
};

using GlobalParam = std::tuple<Mode, std::string>;
class GlobalState : public ::testing::TestWithParam<GlobalParam> {};

TEST_P(GlobalState, AnomalyModeRaisesAsEagerDoes) {
  const auto& [mode, backend] = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  torch::manual_seed(0);
  auto net = std::make_shared<SqrtNet>();
  torch::manual_seed(0);
  auto twin = std::make_shared<SqrtNet>();
  Runner compiled(mode, net, backend, true);
  Runner eager(mode, twin, backend, false);
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  const Tol tol = tolerance(backend);
  for (int i = 0; i < 9; ++i) {
    auto x = torch::randn({5, 6});
    auto y = torch::randn({5, 3});
    if (i == 5) {
      // Eager raises; so must the compiled call (it runs eagerly while anomaly mode is on).
      torch::autograd::DetectAnomalyGuard anomaly;
      std::string eager_error, compiled_error;
      try {
        eager.call(x, y);
      } catch (const c10::Error& e) {
        eager_error = e.what_without_backtrace();
      }
      try {
        compiled.call(x, y);
      } catch (const c10::Error& e) {
        compiled_error = e.what_without_backtrace();
      }
      ASSERT_NE(eager_error.find("returned nan values"), std::string::npos) << eager_error;
      EXPECT_NE(compiled_error.find("returned nan values"), std::string::npos) << "compiled: '" << compiled_error << "'";
      return;
    }
    auto loss = compiled.call(x, y);
    auto ref = eager.call(x, y);
    ASSERT_TRUE(tcap::testing::close(loss, ref, tol.rtol, tol.atol)) << "call " << i;
    ASSERT_TRUE(same_state(*net, *twin, tol)) << "call " << i;
  }
}

// Deterministic algorithms, inference mode and autocast change which kernels run or which
// casts are recorded: each is a guard, and the answers stay eager's.
TEST_P(GlobalState, ModesRecaptureAndMatchEager) {
  const auto& [mode, backend] = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  if (mode == Mode::CompiledAutograd) GTEST_SKIP() << "compiled autograd replays the engine's own per-node state";
  torch::manual_seed(0);
  auto net = std::make_shared<SqrtNet>();
  torch::manual_seed(0);
  auto twin = std::make_shared<SqrtNet>();
  Runner compiled(mode, net, backend, true);
  Runner eager(mode, twin, backend, false);
  const Tol tol = tolerance(backend);
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  auto both = [&](int i) {
    auto x = torch::randn({5, 6}).abs();
    auto y = torch::randn({5, 3});
    auto loss = compiled.call(x, y);
    auto ref = eager.call(x, y);
    ASSERT_TRUE(tcap::testing::close(loss, ref, tol.rtol, tol.atol)) << "call " << i;
    ASSERT_TRUE(same_state(*net, *twin, tol)) << "call " << i;
  };
  for (int i = 0; i < 5; ++i) both(i);
  int before = compiled.captures();
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  for (int i = 5; i < 9; ++i) both(i);
  at::globalContext().setDeterministicAlgorithms(false, false);
  EXPECT_GT(compiled.captures(), before) << "deterministic algorithms were not a guard";
}

std::string global_name(const ::testing::TestParamInfo<GlobalParam>& info) {
  return std::string(mode_name(std::get<0>(info.param))) + "_" + std::get<1>(info.param);
}

INSTANTIATE_TEST_SUITE_P(Soundness, GlobalState,
                         ::testing::Combine(::testing::Values(Mode::Compile, Mode::CompileFn, Mode::CompileStep,
                                                              Mode::CompiledAutograd),
                                            ::testing::Values(std::string("eager"), std::string("llvm"))),
                         global_name);

// Inference mode and CPU autocast around a compiled module's forward: each state gets an
// entry of its own, and every call is eager's.
TEST(GlobalStateForward, InferenceModeAndAutocast) {
  for (const std::string backend : {"eager", "llvm"}) {
    std::string why;
    if (!tcap::testing::backend_built(backend, &why)) continue;
    torch::manual_seed(0);
    auto net = std::make_shared<SqrtNet>();
    CompileOptions o;
    o.backend = backend;
    auto f = tcap::compile(std::static_pointer_cast<nn::Module>(net),
                           [net](const Tensors& in) { return Tensors{net->run(in[0])}; }, o);
    tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
    const Tol tol = tolerance(backend);
    for (int round = 0; round < 3; ++round) {
      for (int state = 0; state < 3; ++state) {
        auto x = torch::randn({5, 6});
        at::Tensor got, ref;
        if (state == 0) {
          torch::NoGradGuard no_grad;
          got = (*f)({x})[0];
          ref = net->run(x);
        } else if (state == 1) {
          c10::InferenceMode inference;
          got = (*f)({x})[0];
          ref = net->run(x);
        } else {
          torch::NoGradGuard no_grad;
          at::autocast::set_autocast_enabled(at::kCPU, true);
          at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
          got = (*f)({x})[0];
          ref = net->run(x);
          at::autocast::set_autocast_enabled(at::kCPU, false);
          at::autocast::clear_cache();
        }
        ASSERT_EQ(got.scalar_type(), ref.scalar_type()) << backend << " state " << state;
        const double rtol = got.scalar_type() == at::kBFloat16 ? 1e-2 : tol.rtol;
        const double atol = got.scalar_type() == at::kBFloat16 ? 1e-2 : tol.atol;
        EXPECT_TRUE(tcap::testing::close(got, ref, rtol, atol)) << backend << " round " << round << " state " << state;
      }
    }
    EXPECT_EQ(f->stats().captures, 3) << backend << ": one entry per state";
    EXPECT_GE(f->stats().replays, 6) << backend;
  }
}

}  // namespace
}  // namespace tcap::soundness
