// Hooks in a compiled training step (Note [Hooks in a compiled step], train_step.cpp):
// hooks registered on parameters before the step are called by every replay, with this
// call's gradient, and what they return flows on; hooks the step registers itself are
// recorded and replayed as graph ops. Each test trains a compiled model and an eager twin
// from the same weights on the same batches.
//
// Tolerances (float32): rtol 1e-5, atol 1e-6 (the same ATen kernels in the same order).
#include <tcap/stance.h>
#include <tcap/train_step.h>

#include "support/compare.h"
#include "support/models.h"

#include <torch/torch.h>

#include <algorithm>

using tcap::testing::close;
namespace nn = torch::nn;

namespace {

constexpr double kHookRtol = 1e-5;
constexpr double kHookAtol = 1e-6;

struct Net : nn::Module {
  Net() {
    fc1 = register_module("fc1", nn::Linear(6, 8));
    fc2 = register_module("fc2", nn::Linear(8, 3));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2->forward(torch::tanh(fc1->forward(x))); }
  nn::Linear fc1{nullptr}, fc2{nullptr};
};

// A model, its optimizer and the step body; twins are trained eagerly.
struct Trainer {
  Trainer() : net(std::make_shared<Net>()), opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)) {}
  at::Tensor step(const at::Tensor& x, const at::Tensor& y) {
    opt.zero_grad();
    auto loss = torch::mse_loss(net->forward(x), y);
    loss.backward();
    opt.step();
    return loss;
  }
  std::shared_ptr<Net> net;
  torch::optim::SGD opt;
};

std::shared_ptr<tcap::CompiledStep> compile(Trainer& t) {
  return tcap::compile_step(t.net, t.opt, [&t](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{t.step(in[0], in[1])};
  });
}

void expect_same_model(Trainer& a, Trainer& b) {
  auto pa = a.net->named_parameters(), pb = b.net->named_parameters();
  for (const auto& item : pa) {
    EXPECT_TRUE(close(item.value(), pb[item.key()], kHookRtol, kHookAtol)) << item.key();
    EXPECT_TRUE(close(item.value().grad(), pb[item.key()].grad(), kHookRtol, kHookAtol)) << item.key() << ".grad";
  }
}

// Gradient-norm logging that also scales the gradient: a host side effect, and a result
// that flows on to .grad and the optimizer.
void add_logging_hooks(Trainer& t, std::vector<double>& log) {
  for (auto& p : t.net->parameters()) {
    p.register_hook([&log](const at::Tensor& g) {
      log.push_back(g.norm().item<double>());
      return g * 0.5;
    });
  }
}

// The engine may call the hooks of different leaves in another order than the capture.
void expect_same_log(std::vector<double> a, std::vector<double> b) {
  ASSERT_EQ(a.size(), b.size());
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], b[k], kHookAtol + kHookRtol * std::abs(b[k])) << "entry " << k;
}

// A model and its eager twin from the same weights, each with add_logging_hooks.
struct HookedTwins {
  explicit HookedTwins(uint64_t seed) : seeded((torch::manual_seed(seed), true)) {
    tcap::testing::copy_parameters(*model.net, *twin.net);
    add_logging_hooks(model, log);
    add_logging_hooks(twin, twin_log);
  }
  bool seeded;  // first: the seed is set before the models are built
  Trainer model, twin;
  std::vector<double> log, twin_log;
};

TEST(TrainStepHooks, ParameterHooksRunOnEveryReplay) {
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  HookedTwins t(0);
  Trainer &model = t.model, &twin = t.twin;
  std::vector<double>& log = t.log, &twin_log = t.twin_log;
  auto step = compile(model);
  for (int i = 0; i < 10; ++i) {
    auto x = torch::randn({5, 6}), y = torch::randn({5, 3});
    const size_t before = log.size();
    auto loss = (*step)({x, y})[0];
    auto loss_twin = twin.step(x, y);
    EXPECT_TRUE(close(loss, loss_twin, kHookRtol, kHookAtol)) << "step " << i;
    EXPECT_EQ(log.size() - before, 4u) << "step " << i << ": every parameter's hook runs once";
  }
  EXPECT_EQ(step->eager_reason(), "");
  EXPECT_GE(step->stats().replays, 7);
  expect_same_log(log, twin_log);
  expect_same_model(model, twin);
  // The hooks are opaque calls in the graph, not their recorded bodies.
  ASSERT_NE(step->graph(), nullptr);
  size_t calls = 0;
  for (const auto& n : step->graph()->nodes()) {
    if (n.kind != tcap::ir::NodeKind::CallHook) continue;
    ++calls;
    EXPECT_GE(step->graph()->hooks().at(static_cast<size_t>(n.hook)).slot, 0);
  }
  EXPECT_EQ(calls, 4u);
}

TEST(TrainStepHooks, HookAddedToAnotherParameterRecaptures) {
  torch::manual_seed(1);
  Trainer model, twin;
  tcap::testing::copy_parameters(*model.net, *twin.net);
  auto step = compile(model);
  int calls = 0, twin_calls = 0;
  for (int i = 0; i < 12; ++i) {
    if (i == 6) {
      // After the step was compiled without hooks.
      model.net->fc2->weight.register_hook([&calls](const at::Tensor& g) {
        ++calls;
        return g * 3;
      });
      twin.net->fc2->weight.register_hook([&twin_calls](const at::Tensor& g) {
        ++twin_calls;
        return g * 3;
      });
    }
    auto x = torch::randn({5, 6}), y = torch::randn({5, 3});
    EXPECT_TRUE(close((*step)({x, y})[0], twin.step(x, y), kHookRtol, kHookAtol)) << "step " << i;
  }
  EXPECT_EQ(calls, 6);
  EXPECT_EQ(twin_calls, 6);
  EXPECT_GE(step->stats().recompiles, 1) << "the new hook must be a guard miss";
  EXPECT_GE(step->stats().replays, 6);
  expect_same_model(model, twin);
}

TEST(TrainStepHooks, SecondHookOnTheSameParameterRuns) {
  HookedTwins t(2);
  Trainer &model = t.model, &twin = t.twin;
  std::vector<double>& log = t.log, &twin_log = t.twin_log;
  auto step = compile(model);
  int second = 0;
  for (int i = 0; i < 10; ++i) {
    if (i == 5) {
      // LibTorch keeps a leaf's C++ hooks in one list that a single pre-hook object runs:
      // the replay's call of that object runs the new hook too.
      model.net->fc1->bias.register_hook([&second](const at::Tensor& g) {
        ++second;
        return g + 1;
      });
      twin.net->fc1->bias.register_hook([](const at::Tensor& g) { return g + 1; });
    }
    auto x = torch::randn({5, 6}), y = torch::randn({5, 3});
    EXPECT_TRUE(close((*step)({x, y})[0], twin.step(x, y), kHookRtol, kHookAtol)) << "step " << i;
  }
  EXPECT_EQ(second, 5);
  EXPECT_GE(step->stats().replays, 6);
  expect_same_log(log, twin_log);
  expect_same_model(model, twin);
}

TEST(TrainStepHooks, HookThatChangesTheGradientShapeFails) {
  torch::manual_seed(3);
  Trainer model;
  bool wrong = false;
  model.net->fc1->weight.register_hook([&wrong](const at::Tensor& g) { return wrong ? g.sum(0) : g.clone(); });
  auto step = compile(model);
  for (int i = 0; i < 5; ++i) (*step)({torch::randn({5, 6}), torch::randn({5, 3})});
  ASSERT_GE(step->stats().replays, 1);
  wrong = true;
  try {
    (*step)({torch::randn({5, 6}), torch::randn({5, 3})});
    FAIL() << "a hook that changes its gradient's shape must fail, as in eager";
  } catch (const c10::Error& e) {
    // LibTorch's hook wrapper refuses the new size; tcap names the parameter.
    EXPECT_NE(std::string(e.what()).find("size"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fc1.weight"), std::string::npos) << e.what();
  }
}

TEST(TrainStepHooks, HookRegisteredInsideTheStepIsReplayed) {
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  torch::manual_seed(4);
  Trainer model, twin;
  tcap::testing::copy_parameters(*model.net, *twin.net);
  // The step makes its own leaf and hooks it: a new hook object every step, so its body is
  // recorded and replayed as graph ops.
  auto body = [](Trainer& t, const at::Tensor& in, const at::Tensor& y) {
    t.opt.zero_grad();
    auto x = in.clone().requires_grad_(true);
    x.register_hook([](const at::Tensor& g) { return g * 3 + 1; });
    auto loss = torch::mse_loss(t.net->forward(x), y);
    loss.backward();
    t.opt.step();
    return std::vector<at::Tensor>{loss, x.grad()};
  };
  auto step = tcap::compile_step(model.net, model.opt, [&](const std::vector<at::Tensor>& in) {
    return body(model, in[0], in[1]);
  });
  for (int i = 0; i < 8; ++i) {
    auto x = torch::randn({5, 6}), y = torch::randn({5, 3});
    auto outs = (*step)({x, y});
    auto want = body(twin, x, y);
    EXPECT_TRUE(close(outs[0], want[0], kHookRtol, kHookAtol)) << "step " << i;
    EXPECT_TRUE(close(outs[1], want[1], kHookRtol, kHookAtol)) << "x.grad, step " << i;
  }
  EXPECT_GE(step->stats().replays, 5);
  expect_same_model(model, twin);
}

}  // namespace
