// The per-call paths of compiled entries made cheaper: the guard check, which builds
// nothing on a hit (Note [One check, with or without words]), still lets every guard fire
// with its reason; a replay whose outputs
// are not differentiable runs without an autograd node and still matches eager, next to
// one that needs its node; compile_step's host scalars of an optimizer with two parameter
// groups (parameter j found across groups) match eager.
//
// Tolerances: the eager backend runs the same kernels as eager: rtol 1e-5, atol 1e-6.
#include "cache/guards.h"

#include <tcap/compile.h>
#include <tcap/train_step.h>

#include "support/compare.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <mutex>

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;

namespace {

Tensors ten_inputs() {
  Tensors in;
  for (int k = 0; k < 10; ++k) {
    at::Tensor t = torch::randn({3 + k % 4, 5 + k % 3});
    if (k == 9) t = t.t();
    if (k % 2 == 0) t.requires_grad_(true);
    in.push_back(t);
  }
  return in;
}

std::string check(const tcap::cache::Guards& g, const Tensors& ts) {
  tcap::cache::CallView v;
  v.tensors = ts;
  return g.check(v).reason;
}

TEST(GuardFastPath, EveryTensorGuardStillFires) {
  const Tensors in = ten_inputs();
  tcap::cache::Guards g;
  std::vector<std::string> names;
  for (int k = 0; k < 10; ++k) names.push_back("in" + std::to_string(k));
  std::vector<bool> identity(10, false);
  identity[3] = true;
  tcap::cache::CallView v;
  v.tensors = in;
  g.capture_call(v, names, identity);
  EXPECT_EQ(check(g, in), "");

  struct Change {
    const char* what;
    std::function<void(Tensors&)> apply;
  };
  const std::vector<Change> changes = {
      {"changed dtype", [](Tensors& t) { t[1] = t[1].to(torch::kDouble); }},
      {"changed requires_grad", [](Tensors& t) { t[2] = t[2].detach(); }},
      {"changed shape", [](Tensors& t) { t[5] = torch::randn({7, 5}); }},
      {"changed strides", [](Tensors& t) { t[9] = t[9].contiguous(); }},
      {"was replaced by another tensor", [](Tensors& t) { t[3] = t[3].clone(); }},
      {"became undefined", [](Tensors& t) { t[7] = at::Tensor(); }},
  };
  for (const auto& c : changes) {
    Tensors changed = in;
    c.apply(changed);
    EXPECT_NE(check(g, changed).find(c.what), std::string::npos) << c.what << ": got '" << check(g, changed) << "'";
  }
  {
    at::NoGradGuard no_grad;
    EXPECT_NE(check(g, in).find("grad mode changed"), std::string::npos);
  }
  // The same metadata in other tensors (no identity guard on them) still hits.
  Tensors same = in;
  same[0] = in[0].detach().clone().requires_grad_(true);
  EXPECT_EQ(check(g, same), "");
}

TEST(DirectReplay, OutputsThatAreNotDifferentiableMatchEager) {
  // An input requires grad, yet no output is differentiable: replayed without a node.
  auto fn = [](const Tensors& in) { return Tensors{(in[0] * 3).gt(0.5), torch::argmax(in[0] + in[1], 1)}; };
  auto f = tcap::compile(fn);
  for (int i = 0; i < 4; ++i) {
    Tensors in = {torch::randn({5, 7}, torch::requires_grad()), torch::randn({5, 7})};
    auto out = (*f)(in);
    auto ref = fn(in);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_TRUE(torch::equal(out[0], ref[0]));
    EXPECT_TRUE(torch::equal(out[1], ref[1]));
    EXPECT_FALSE(out[0].requires_grad());
    EXPECT_FALSE(out[1].requires_grad());
  }
  EXPECT_GE(f->stats().replays, 2);
  EXPECT_EQ(f->eager_reason(), "");
}

TEST(DirectReplay, DifferentiableOutputStillGetsItsGradient) {
  auto fn = [](const Tensors& in) { return Tensors{torch::tanh(in[0] * in[1]).sum(1), in[0].gt(0)}; };
  auto f = tcap::compile(fn);
  for (int i = 0; i < 4; ++i) {
    Tensors in = {torch::randn({6, 3}, torch::requires_grad()), torch::randn({6, 3})};
    auto out = (*f)(in);
    ASSERT_TRUE(out[0].requires_grad());
    out[0].sum().backward();
    at::Tensor x = in[0].detach().requires_grad_(true);
    fn({x, in[1]})[0].sum().backward();
    EXPECT_TRUE(close(out[0], fn(in)[0], 1e-5, 1e-6));
    EXPECT_TRUE(close(in[0].grad(), x.grad(), 1e-5, 1e-6));
  }
  EXPECT_GE(f->stats().replays, 2);
}

// Two parameter groups with their own learning rates: compile_step computes each
// parameter's Adam scalars from its own group (parameters of the second group included).
TEST(StepHostScalars, AdamWithTwoParamGroupsMatchesEager) {
  auto make = [] {
    torch::manual_seed(5);
    return torch::nn::Sequential(torch::nn::Linear(7, 5), torch::nn::Tanh(), torch::nn::Linear(5, 3));
  };
  auto groups = [](torch::nn::Sequential& m) {
    std::vector<torch::optim::OptimizerParamGroup> g;
    g.emplace_back(m[0]->parameters(), std::make_unique<torch::optim::AdamOptions>(1e-2));
    g.emplace_back(m[2]->parameters(), std::make_unique<torch::optim::AdamOptions>(3e-2));
    return g;
  };
  auto model = make();
  auto twin = make();
  torch::optim::Adam opt(groups(model), torch::optim::AdamOptions(1e-3));
  torch::optim::Adam twin_opt(groups(twin), torch::optim::AdamOptions(1e-3));
  auto body = [](torch::nn::Sequential& m, torch::optim::Optimizer& o, const Tensors& in) {
    o.zero_grad();
    auto loss = torch::mse_loss(m->forward(in[0]), in[1]);
    loss.backward();
    o.step();
    return Tensors{loss};
  };
  auto step = tcap::compile_step(model, opt, [&](const Tensors& in) { return body(model, opt, in); });
  for (int i = 0; i < 8; ++i) {
    Tensors batch = {torch::randn({9, 7}), torch::randn({9, 3})};
    auto loss = (*step)(batch)[0];
    auto want = body(twin, twin_opt, batch)[0];
    EXPECT_TRUE(close(loss, want, 1e-5, 1e-6)) << "step " << i;
  }
  EXPECT_GE(step->stats().replays, 4);
  auto ps = model->parameters();
  auto qs = twin->parameters();
  for (size_t k = 0; k < ps.size(); ++k) EXPECT_TRUE(close(ps[k], qs[k], 1e-5, 1e-6)) << "parameter " << k;
}

// The names of the scopes (or ops) that start while an observer below is installed.
std::mutex g_names_mutex;
std::vector<std::string> g_names;

std::unique_ptr<at::ObserverContext> note_name(const at::RecordFunction& fn) {
  std::lock_guard<std::mutex> lock(g_names_mutex);
  g_names.emplace_back(fn.name());
  return nullptr;
}

TEST(ProfilerNames, RegionsAndFusedKernelsAppear) {
  tcap::CompileOptions o;
  o.backend = "llvm";
  o.name = "prof_fn";
  auto fn = [](const Tensors& in) { return Tensors{torch::cos(torch::cos(in[0] + in[1]))}; };
  auto f = tcap::compile(fn, o);
  auto run = [&] {
    Tensors in = {torch::randn({7, 5}, torch::requires_grad()), torch::randn({7, 5})};
    auto out = (*f)(in);
    out[0].sum().backward();
  };
  run();  // capture and compile
  if (!f->eager_reason().empty()) GTEST_SKIP() << "no llvm backend here: " << f->eager_reason();
  {
    std::lock_guard<std::mutex> lock(g_names_mutex);
    g_names.clear();
  }
  auto handle = at::addThreadLocalCallback(at::RecordFunctionCallback(note_name).scopes({at::RecordScope::USER_SCOPE}));
  run();
  at::removeCallback(handle);
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> lock(g_names_mutex);
    names = g_names;
  }
  ASSERT_GE(f->stats().replays, 1);
  auto has = [&](const std::string& want) { return std::find(names.begin(), names.end(), want) != names.end(); };
  std::string all;
  for (const auto& n : names) all += n + " ";
  EXPECT_TRUE(has("tcap::prof_fn.0.forward")) << all;
  EXPECT_TRUE(has("tcap::prof_fn.0.backward")) << all;
  EXPECT_TRUE(std::any_of(names.begin(), names.end(), [](const std::string& n) {
    return n.rfind("fused_", 0) == 0 && n.find("cos") != std::string::npos;
  })) << all;
  // Without the observer nothing is recorded.
  {
    std::lock_guard<std::mutex> lock(g_names_mutex);
    g_names.clear();
  }
  run();
  std::lock_guard<std::mutex> lock(g_names_mutex);
  EXPECT_TRUE(g_names.empty());
}

// The ATen ops a compiled graph calls (here a matmul too large to be generated) show in the
// profiler inside its scope: with an observer installed they go through the dispatcher,
// not as unboxed calls (Note [Unboxed extern calls]).
TEST(ProfilerNames, ExternOpsOfACompiledGraphAppear) {
  tcap::CompileOptions o;
  o.name = "prof_mm";
  auto fn = [](const Tensors& in) { return Tensors{torch::relu(torch::mm(in[0], in[1]))}; };
  auto f = tcap::compile(fn, o);
  torch::NoGradGuard no_grad;
  Tensors in = {torch::randn({64, 64}), torch::randn({64, 64})};
  (*f)(in);  // compiles
  {
    std::lock_guard<std::mutex> lock(g_names_mutex);
    g_names.clear();
  }
  auto handle = at::addThreadLocalCallback(at::RecordFunctionCallback(note_name).scopes({at::RecordScope::FUNCTION}));
  auto out = (*f)(in);
  at::removeCallback(handle);
  EXPECT_EQ(f->stats().replays, 1);
  EXPECT_TRUE(close(out[0], fn(in)[0]));
  std::lock_guard<std::mutex> lock(g_names_mutex);
  std::string all;
  for (const auto& n : g_names) all += n + " ";
  EXPECT_NE(std::find(g_names.begin(), g_names.end(), "aten::mm"), g_names.end()) << all;
}

}  // namespace
