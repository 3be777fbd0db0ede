// Values read on the host inside compiled code (cache::HostReads, Note [Observed host
// values]): guards checked inline as the replay reads them, host control flow recompiled,
// values only logged or returned becoming observations where the program says so
// (CompileOptions::observe_host_values), for tcap::compile and compile_step alike.
//
// Tolerances (float32): rtol 1e-5, atol 1e-6 (the same kernels as eager).
#include <tcap/compile.h>
#include <tcap/stance.h>
#include <tcap/train_step.h>

#include "support/compare.h"
#include "support/log_capture.h"

#include <torch/torch.h>

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;

namespace {

// Branches on a value read on the host: each branch is right, on every call.
Tensors branch_on_sum(const Tensors& in) {
  if (in[0].sum().item<double>() > 0) return {in[0] * 2};
  return {in[0] - 1};
}

TEST(HostValues, ControlFlowOnAHostValueStaysRight) {
  tcap::CompileOptions o;
  o.observe_host_values = false;  // a branch seen both ways must never be observed away
  auto f = tcap::compile(branch_on_sum, o);
  for (int call = 0; call < 12; ++call) {
    auto x = torch::randn({9});
    if (call % 3 == 0) x = x.abs();
    if (call % 3 == 1) x = -x.abs();
    EXPECT_TRUE(close((*f)({x})[0], branch_on_sum({x})[0])) << "call " << call;
  }
}

// By default every host read is a guard: a value that changes every call is recaptured
// (right, never fast), and the log says how to promise it is only observed.
TEST(HostValues, ChangingValueStaysAGuardByDefault) {
  tcap::testing::LogCapture log("recompiles");
  tcap::CompileOptions o;
  o.cache_size_limit = 3;
  auto f = tcap::compile(branch_on_sum, o);
  for (int call = 0; call < 10; ++call) {
    auto x = torch::randn({9});
    EXPECT_TRUE(close((*f)({x})[0], branch_on_sum({x})[0])) << "call " << call;
  }
  EXPECT_GE(log.count("observe_host_values"), 1) << log.text();
}

// A value only logged: after two captures it is an observation, and later calls replay.
TEST(HostValues, LoggedValueBecomesAnObservation) {
  tcap::testing::LogCapture log("recompiles");
  std::vector<double> logged;
  tcap::CompileOptions o;
  o.observe_host_values = true;  // the program only logs the value
  auto f = tcap::compile([&](const Tensors& in) {
    auto y = torch::tanh(in[0]) * 3;
    logged.push_back(y.mean().item<double>());
    return Tensors{y};
  }, o);
  for (int call = 0; call < 8; ++call) {
    auto x = torch::randn({16});
    EXPECT_TRUE(close((*f)({x})[0], torch::tanh(x) * 3)) << "call " << call;
  }
  EXPECT_EQ(f->stats().captures, 2);
  EXPECT_GE(f->stats().replays, 6);
  EXPECT_GE(log.count("it is an observation"), 1) << log.text();
  EXPECT_EQ(f->entries().size(), 1u) << "the newer entry replaces the one it generalizes";
}

// MultiheadAttention reads equal(query, key) on every forward: a guard checked inline.
TEST(HostValues, MultiheadAttentionEqualIsAGuard) {
  torch::nn::MultiheadAttention mha(torch::nn::MultiheadAttentionOptions(8, 2));
  auto f = tcap::compile([&](const Tensors& in) { return Tensors{std::get<0>(mha(in[0], in[0], in[0]))}; });
  for (int call = 0; call < 6; ++call) {
    auto x = torch::randn({5, 3, 8});
    auto out = (*f)({x});
    torch::NoGradGuard ng;
    EXPECT_TRUE(close(out[0], std::get<0>(mha(x, x, x)), 1e-5, 1e-6)) << "call " << call;
  }
  EXPECT_EQ(f->stats().captures, 1);
  auto es = f->entries();
  ASSERT_EQ(es.size(), 1u);
  bool host_guard = false;
  for (const auto& g : es[0].guards) host_guard = host_guard || g.find("host value of aten::equal") != std::string::npos;
  EXPECT_TRUE(host_guard);
}

// A training step that logs its loss (item()) and clip_grad_norm_'s norm, in that order.
template <class Opt>
at::Tensor logged_step(torch::nn::Sequential& m, Opt& o, const at::Tensor& x, const at::Tensor& y,
                       std::vector<double>& log) {
  o.zero_grad();
  auto loss = torch::mse_loss(m->forward(x), y);
  log.push_back(loss.item<double>());
  loss.backward();
  log.push_back(torch::nn::utils::clip_grad_norm_(m->parameters(), 0.5));
  o.step();
  return loss;
}

// compile_step: a logged loss.item() and clip_grad_norm_ (which reads the norm on the
// host) inside the step, observed by the program's promise; results equal eager, and the
// step replays.
TEST(HostValues, StepWithLoggedLossAndClipGradNorm) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 2));
  torch::nn::Sequential twin(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 2));
  {
    torch::NoGradGuard g;
    auto dst = twin->named_parameters();
    for (const auto& item : model->named_parameters()) dst[item.key()].copy_(item.value());
  }
  torch::optim::Adam opt(model->parameters(), 1e-2), opt_twin(twin->parameters(), 1e-2);
  std::vector<double> log;
  auto body = [&](torch::nn::Sequential& m, torch::optim::Adam& o, const at::Tensor& x, const at::Tensor& y) {
    return logged_step(m, o, x, y, log);
  };
  tcap::CompileOptions o;
  o.observe_host_values = true;  // the loss and the norm are only logged
  auto step = tcap::compile_step(model, opt, [&](const Tensors& in) { return Tensors{body(model, opt, in[0], in[1])}; }, o);
  for (int i = 0; i < 12; ++i) {
    auto x = torch::randn({7, 6});
    auto y = torch::randn({7, 2});
    auto loss = (*step)({x, y})[0];
    auto ref = body(twin, opt_twin, x, y);
    EXPECT_TRUE(close(loss, ref, 1e-5, 1e-6)) << "step " << i;
  }
  for (const auto& item : twin->named_parameters()) {
    EXPECT_TRUE(close(model->named_parameters()[item.key()], item.value(), 1e-5, 1e-6)) << item.key();
  }
  EXPECT_EQ(step->eager_reason(), "");
  EXPECT_GE(step->stats().replays, 8);
}

// A replay runs the graph, not the step's code: the values that code logs come back
// through CompiledStep::last_call(), in the order the step read them, equal to eager's.
TEST(HostValues, StepHandsObservedValuesBack) {
  using Kind = tcap::CompiledStep::Call::Kind;
  torch::manual_seed(1);
  torch::nn::Sequential model(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 2));
  torch::nn::Sequential twin(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 2));
  {
    torch::NoGradGuard g;
    auto dst = twin->named_parameters();
    for (const auto& item : model->named_parameters()) dst[item.key()].copy_(item.value());
  }
  torch::optim::SGD opt(model->parameters(), 0.05), opt_twin(twin->parameters(), 0.05);
  std::vector<double> log, twin_log;  // loss, then norm, per step
  auto body = logged_step<torch::optim::SGD>;
  tcap::CompileOptions o;
  o.observe_host_values = true;
  auto step = tcap::compile_step(model, opt, [&](const Tensors& in) { return Tensors{body(model, opt, in[0], in[1], log)}; }, o);
  int replays = 0;
  for (int i = 0; i < 10; ++i) {
    auto x = torch::randn({7, 6}), y = torch::randn({7, 2});
    (*step)({x, y});
    body(twin, opt_twin, x, y, twin_log);
    const auto& call = step->last_call();
    if (call.kind == Kind::Replayed) {
      ++replays;
      ASSERT_EQ(call.host_values.size(), 2u) << "step " << i;
      for (const auto& v : call.host_values) log.push_back(v.toDouble());
    } else {
      ASSERT_EQ(call.kind, Kind::Captured) << "step " << i;
      ASSERT_EQ(call.host_values.size(), 2u) << "step " << i;
      EXPECT_DOUBLE_EQ(call.host_values[0].toDouble(), log[log.size() - 2]);
      EXPECT_DOUBLE_EQ(call.host_values[1].toDouble(), log.back());
    }
  }
  EXPECT_GE(replays, 7);
  ASSERT_EQ(log.size(), twin_log.size());
  for (size_t k = 0; k < log.size(); ++k) EXPECT_NEAR(log[k], twin_log[k], 1e-6 + 1e-5 * std::abs(twin_log[k])) << "entry " << k;
  // Eagerly (forced), the code runs and logs for itself: nothing is handed back.
  {
    tcap::StanceGuard eager(tcap::Stance::ForceEager);
    (*step)({torch::randn({7, 6}), torch::randn({7, 2})});
    EXPECT_EQ(step->last_call().kind, Kind::Eager);
    EXPECT_TRUE(step->last_call().host_values.empty());
  }
}

}  // namespace
