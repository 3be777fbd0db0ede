// The stance (include/tcap/stance.h), for tcap::compile, compile_step and compiled
// autograd alike: force_eager, eager_on_recompile, fail_on_recompile, error_on_fallback,
// per thread and for the process.
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/stance.h>
#include <tcap/train_step.h>

#include "support/compare.h"
#include "support/log_capture.h"

#include <torch/torch.h>

#include <thread>

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;

namespace {

Tensors sincos(const Tensors& in) { return {torch::sin(in[0]) * torch::cos(in[0])}; }

TEST(Stance, ForceEagerCapturesNothing) {
  auto f = tcap::compile(sincos);
  {
    tcap::StanceGuard g(tcap::Stance::ForceEager);
    for (int i = 0; i < 3; ++i) {
      auto x = torch::randn({4});
      EXPECT_TRUE(close((*f)({x})[0], sincos({x})[0]));
    }
  }
  EXPECT_EQ(f->stats().captures, 0);
  EXPECT_EQ(f->stats().eager_calls, 3);
  (*f)({torch::randn({4})});  // back to default: captures
  EXPECT_EQ(f->stats().captures, 1);
}

TEST(Stance, EagerOnRecompileKeepsUsingEntries) {
  tcap::CompileOptions o;
  o.dynamic = false;
  auto f = tcap::compile(sincos, o);
  (*f)({torch::randn({4})});  // compiled
  tcap::StanceGuard g(tcap::Stance::EagerOnRecompile);
  auto y = torch::randn({7});
  EXPECT_TRUE(close((*f)({y})[0], sincos({y})[0]));  // would recompile: eager
  auto x = torch::randn({4});
  EXPECT_TRUE(close((*f)({x})[0], sincos({x})[0]));  // fits: replayed
  EXPECT_EQ(f->stats().captures, 1);
  EXPECT_EQ(f->stats().replays, 1);
  EXPECT_EQ(f->stats().eager_calls, 1);
}

TEST(Stance, FailOnRecompileThrowsWithTheReason) {
  tcap::CompileOptions o;
  o.dynamic = false;
  auto f = tcap::compile(sincos, o);
  tcap::StanceGuard g(tcap::Stance::FailOnRecompile);
  (*f)({torch::randn({4})});  // the first compile is not a recompile
  try {
    (*f)({torch::randn({5})});
    FAIL() << "no RecompileError";
  } catch (const tcap::RecompileError& e) {
    EXPECT_NE(std::string(e.what()).find("changed shape"), std::string::npos) << e.what();
  }
}

TEST(Stance, ErrorOnFallbackNamesTheCause) {
  tcap::StanceGuard g(tcap::Stance::Default, /*error_on_fallback=*/true);
  auto f = tcap::compile([](const Tensors& in) {
    return Tensors{torch::nn::utils::rnn::pack_padded_sequence(in[0], in[1], true, false).data() * 2};
  });
  try {
    (*f)({torch::randn({2, 5, 3}), torch::tensor(std::vector<int64_t>{3, 5})});
    FAIL() << "no FallbackError";
  } catch (const tcap::FallbackError& e) {
    EXPECT_NE(std::string(e.what()).find("data-dependent output shape"), std::string::npos) << e.what();
  }
}

TEST(Stance, ErrorOnFallbackCoversTheCacheLimit) {
  tcap::CompileOptions o;
  o.dynamic = false;
  o.cache_size_limit = 1;
  auto f = tcap::compile(sincos, o);
  tcap::StanceGuard g(tcap::Stance::Default, /*error_on_fallback=*/true);
  (*f)({torch::randn({4})});
  EXPECT_THROW((*f)({torch::randn({5})}), tcap::FallbackError);
}

TEST(Stance, ErrorOnFallbackInCompiledAutograd) {
  tcap::StanceGuard g(tcap::Stance::Default, /*error_on_fallback=*/true);
  auto x = torch::randn({3}, torch::requires_grad());
  auto y = (x * x).sum();
  tcap::CompiledAutogradGuard ca;
  // create_graph=true needs the engine's graph: a fallback.
  EXPECT_THROW(torch::autograd::grad({y}, {x}, {}, true, true), tcap::FallbackError);
}

TEST(Stance, IsPerThread) {
  auto f = tcap::compile(sincos);
  tcap::StanceGuard g(tcap::Stance::ForceEager);
  std::thread t([&] { (*f)({torch::randn({4})}); });  // default stance there: captures
  t.join();
  EXPECT_EQ(f->stats().captures, 1);
  EXPECT_EQ(tcap::stance(), tcap::Stance::ForceEager);
}

TEST(Stance, ProcessWideSetting) {
  tcap::set_stance(tcap::Stance::ForceEager);
  auto f = tcap::compile(sincos);
  (*f)({torch::randn({4})});
  tcap::set_stance(tcap::Stance::Default);
  EXPECT_EQ(f->stats().captures, 0);
  EXPECT_EQ(tcap::to_string(tcap::Stance::EagerOnRecompile), "eager_on_recompile");
}

TEST(Stance, ForceEagerInCompiledAutogradAndSteps) {
  torch::nn::Linear m(3, 2);
  torch::optim::SGD opt(m->parameters(), 0.1);
  auto step = tcap::compile_step(m, opt, [&](const Tensors& in) {
    opt.zero_grad();
    auto loss = m(in[0]).sum();
    loss.backward();
    opt.step();
    return Tensors{loss};
  });
  tcap::StanceGuard g(tcap::Stance::ForceEager);
  for (int i = 0; i < 4; ++i) (*step)({torch::randn({2, 3})});
  EXPECT_EQ(step->stats().captures, 0);
  EXPECT_EQ(step->stats().eager_calls, 4);
  tcap::CompiledAutogradGuard ca;
  auto x = torch::randn({2, 3});
  m(x).sum().backward();
  EXPECT_EQ(ca.stats().captures, 0);
}

}  // namespace
