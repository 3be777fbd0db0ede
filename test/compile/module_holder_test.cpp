// Note [Compiled modules]: tcap::compile(model) is a module holder that forwards like the
// model (values and gradients equal eager's), reaches the model's own tensors and flags,
// and compiles each forward arity; tcap::compile(fn) is called as f(a, b); the older
// spellings keep working; the three front doors count calls with one stats type.
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/train_step.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>

namespace {

using Tensors = std::vector<at::Tensor>;

struct TwoInImpl : torch::nn::Module {
  TwoInImpl() : fc(register_module("fc", torch::nn::Linear(5, 3))) {}
  at::Tensor forward(const at::Tensor& a, const at::Tensor& b) { return torch::tanh(fc->forward(a) * b); }
  torch::nn::Linear fc;
};
TORCH_MODULE(TwoIn);

struct PairOutImpl : torch::nn::Module {
  PairOutImpl() : fc(register_module("fc", torch::nn::Linear(4, 4))) {}
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& x) {
    auto h = fc->forward(x);
    return {torch::relu(h), h.sum(1)};
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(PairOut);

void expect_close(const at::Tensor& a, const at::Tensor& b, const char* what) {
  EXPECT_TRUE(torch::allclose(a, b, 1e-5, 1e-6)) << what << ": max diff " << (a - b).abs().max().item<double>();
}

TEST(ModuleHolder, ForwardsLikeTheModelWithItsOwnTensors) {
  torch::manual_seed(3);
  auto model = torch::nn::Sequential(torch::nn::Linear(7, 9), torch::nn::Dropout(0.5), torch::nn::ReLU(),
                                     torch::nn::Linear(9, 2));
  auto m = tcap::compile(model);
  // The model's tensors, under the submodule "module".
  ASSERT_EQ(m->parameters().size(), model->parameters().size());
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    EXPECT_TRUE(m->parameters()[i].is_same(model->parameters()[i]));
  }
  EXPECT_TRUE(m->named_parameters().contains("module.0.weight"));
  EXPECT_EQ(m->module().get(), model.ptr().get());
  model->eval();
  m->eval();
  EXPECT_FALSE(model->is_training());
  for (int i = 0; i < 4; ++i) {
    auto x = torch::randn({3 + i % 2, 7}).t().contiguous().t();  // odd sizes, then a non-contiguous input
    if (i == 3) x = torch::randn({7, 5}).t();
    auto ref = model->forward(x);
    auto y = m(x);
    expect_close(y, ref, "forward");
    expect_close(m->forward(x), ref, "m->forward");
  }
  // train() reaches the model: Dropout is live again, a recompile (the flag is guarded).
  m->train();
  EXPECT_TRUE(model->is_training());
  EXPECT_TRUE(model[1]->is_training());
  const auto before = m->stats();
  auto x = torch::randn({4, 7});
  torch::manual_seed(11);
  auto y = m(x);  // a recapture: eager, with Dropout live
  torch::manual_seed(11);
  expect_close(y, model->forward(x), "train mode");
  EXPECT_EQ(m->stats().recompiles, before.recompiles + 1);
  model->eval();
  EXPECT_FALSE(y.allclose(model->forward(x))) << "Dropout did not run in train mode";
  EXPECT_EQ(m->stats().calls, 9);
  std::ostringstream printed;
  printed << *m;
  EXPECT_NE(printed.str().find("tcap::CompiledModule"), std::string::npos) << printed.str();
}

TEST(ModuleHolder, GradientsAndOptimizerStepsReachTheModel) {
  torch::manual_seed(5);
  auto model = TwoIn();
  auto twin = TwoIn();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < twin->parameters().size(); ++i) twin->parameters()[i].copy_(model->parameters()[i]);
  }
  tcap::CompileOptions o;
  o.backend = tcap::Backend::Eager;
  auto m = tcap::compile(model, o);
  torch::optim::SGD opt(m->parameters(), 0.1);
  torch::optim::SGD ref_opt(twin->parameters(), 0.1);
  for (int step = 0; step < 4; ++step) {
    auto a = torch::randn({6, 5});
    auto b = torch::randn({6, 3}).expand({6, 3});
    opt.zero_grad();
    ref_opt.zero_grad();
    auto loss = m(a, b).pow(2).mean();  // two tensors: forward(a, b), compiled
    auto ref = twin->forward(a, b).pow(2).mean();
    loss.backward();
    ref.backward();
    expect_close(loss, ref, "loss");
    for (size_t i = 0; i < twin->parameters().size(); ++i) {
      expect_close(model->parameters()[i].grad(), twin->parameters()[i].grad(), "grad");
    }
    opt.step();
    ref_opt.step();
  }
  EXPECT_GE(m->stats().replays, 2);
  EXPECT_EQ(m->entries().size(), 1u);
}

TEST(ModuleHolder, TupleOutputsAndTheOlderSpellings) {
  torch::manual_seed(7);
  auto model = PairOut();
  auto m = tcap::compile(model);
  for (int i = 0; i < 3; ++i) {
    auto x = torch::randn({5, 4});
    auto [r, s] = m(x);
    auto [r_ref, s_ref] = model->forward(x);
    expect_close(r, r_ref, "first output");
    expect_close(s, s_ref, "second output");
  }
  // (*m)({x}) returns the outputs as a list; a shared_ptr<CompiledFunction> still takes it.
  auto x = torch::randn({2, 4});
  auto outs = (*m)({x});
  ASSERT_EQ(outs.size(), 2u);
  expect_close(outs[1], std::get<1>(model->forward(x)), "(*m)({x})");
  std::shared_ptr<tcap::CompiledFunction> f = m;
  expect_close(f->operator()({x})[0], std::get<0>(model->forward(x)), "shared_ptr<CompiledFunction>");
}

TEST(CompiledFn, CalledWithTensorsOrAList) {
  auto f = tcap::compile([](const Tensors& in) { return Tensors{torch::sin(in[0]) * in[1] + 1}; });
  for (int i = 0; i < 3; ++i) {
    auto a = torch::randn({3, 5});
    auto b = torch::randn({5});  // broadcast
    auto ref = torch::sin(a) * b + 1;
    expect_close(f(a, b)[0], ref, "f(a, b)");
    expect_close(f({a, b})[0], ref, "f({a, b})");
    expect_close((*f)({a, b})[0], ref, "(*f)({a, b})");
  }
  const auto s = f->stats();
  EXPECT_EQ(s.calls, 9);
  EXPECT_EQ(s.captures, 1);
  EXPECT_EQ(s.replays, 8);
  tcap::CompiledFn empty;
  EXPECT_FALSE(empty);
  EXPECT_THROW(empty(torch::ones({1})), c10::Error);
}

// One stats type: each front door counts its calls, replays and eager calls the same way.
TEST(OneStatsType, EveryFrontDoorCountsCallsReplaysAndEagerCalls) {
  auto model = torch::nn::Linear(4, 2);
  torch::optim::SGD opt(model->parameters(), 0.05);
  auto step = tcap::compile_step(model, opt, [&](const Tensors& in) {
    opt.zero_grad();
    auto loss = model->forward(in[0]).pow(2).mean();
    loss.backward();
    opt.step();
    return Tensors{loss};
  });
  auto x = torch::randn({3, 4});
  for (int i = 0; i < 5; ++i) (*step)({x});
  {
    tcap::StanceGuard eager(tcap::Stance::ForceEager);
    (*step)({x});
  }
  tcap::CompileStats s = step->stats();
  EXPECT_EQ(s.calls, 6);
  EXPECT_GE(s.eager_calls, 1);
  EXPECT_GE(s.replays, 2);
  EXPECT_EQ(s.captures + s.replays + s.eager_calls, s.calls)
      << s.captures << " captures, " << s.replays << " replays, " << s.eager_calls << " eager";

  tcap::reset_compiled_autograd();
  tcap::CompileOptions bw;
  bw.name = "one_stats_type";
  tcap::CompiledAutogradGuard ca(bw);
  auto w = torch::randn({4, 4}, torch::requires_grad());
  for (int i = 0; i < 3; ++i) (torch::tanh(torch::randn({2, 4}).mm(w))).sum().backward();
  {
    tcap::StanceGuard eager(tcap::Stance::ForceEager);
    (torch::tanh(torch::randn({2, 4}).mm(w))).sum().backward();
  }
  tcap::CompiledAutogradStats c = ca.stats();  // the same type
  EXPECT_EQ(c.calls, 4);
  EXPECT_EQ(c.captures, 1);
  EXPECT_EQ(c.replays, 2);
  EXPECT_EQ(c.eager_calls, 1);
  EXPECT_GT(c.lookup_us, 0);
}

}  // namespace
