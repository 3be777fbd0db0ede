// compile_step's fused optimizer updates (CompileOptions::fused_optimizers, opt-in; Note
// [Fused optimizer steps]): each parameter's
// recorded Adam / AdamW / SGD update becomes part of one multi-tensor ATen call per
// optimizer group. Every case trains a compiled model and an eager twin from the same
// weights on fresh random batches and compares losses, parameters, .grads and the
// optimizer's state (exp_avg, exp_avg_sq, momentum buffers, step counters), and checks
// that the fused call is really in the compiled graph (or, where it must not be, that
// the recorded ops stayed and the log says why).
//
// Tolerances (float32): rtol 1e-4, atol 1e-5 over 12 steps: ATen's fused kernels order a
// few operations differently from the per-parameter ops (rounding, not formulas).
#include <tcap/stance.h>
#include <tcap/train_step.h>

#include "support/backends.h"
#include "support/compare.h"
#include "support/log_capture.h"
#include "support/modules.h"

#include <torch/torch.h>

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;
namespace nn = torch::nn;

namespace {

constexpr double kFusedRtol = 1e-4;
constexpr double kFusedAtol = 1e-5;

using tcap::testing::copy_params;

int count_ops(const tcap::ir::Graph& g, const std::string& op) {
  int k = 0;
  for (const auto& n : g.nodes()) k += n.kind == tcap::ir::NodeKind::Call && n.op == op;
  return k;
}

// Parameters, .grads and every state tensor of the two optimizers, in order.
void expect_same_state(nn::Module& a, nn::Module& b, torch::optim::Optimizer& oa, torch::optim::Optimizer& ob,
                       const std::string& what) {
  auto pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t j = 0; j < pa.size(); ++j) {
    EXPECT_TRUE(close(pa[j], pb[j], kFusedRtol, kFusedAtol)) << what << ": parameter " << j;
    EXPECT_TRUE(close(pa[j].grad(), pb[j].grad(), kFusedRtol, kFusedAtol)) << what << ": .grad of parameter " << j;
    auto ia = oa.state().find(pa[j].unsafeGetTensorImpl());
    auto ib = ob.state().find(pb[j].unsafeGetTensorImpl());
    ASSERT_EQ(ia == oa.state().end(), ib == ob.state().end()) << what << ": state of parameter " << j;
    if (ia == oa.state().end()) continue;
    if (auto* sa = dynamic_cast<torch::optim::AdamParamState*>(ia->second.get())) {
      auto& sb = static_cast<torch::optim::AdamParamState&>(*ib->second);
      EXPECT_EQ(sa->step(), sb.step()) << what << ": step of parameter " << j;
      EXPECT_TRUE(close(sa->exp_avg(), sb.exp_avg(), kFusedRtol, kFusedAtol)) << what << ": exp_avg " << j;
      EXPECT_TRUE(close(sa->exp_avg_sq(), sb.exp_avg_sq(), kFusedRtol, kFusedAtol)) << what << ": exp_avg_sq " << j;
    } else if (auto* wa = dynamic_cast<torch::optim::AdamWParamState*>(ia->second.get())) {
      auto& wb = static_cast<torch::optim::AdamWParamState&>(*ib->second);
      EXPECT_EQ(wa->step(), wb.step()) << what << ": step of parameter " << j;
      EXPECT_TRUE(close(wa->exp_avg(), wb.exp_avg(), kFusedRtol, kFusedAtol)) << what << ": exp_avg " << j;
      EXPECT_TRUE(close(wa->exp_avg_sq(), wb.exp_avg_sq(), kFusedRtol, kFusedAtol)) << what << ": exp_avg_sq " << j;
    } else if (auto* ga = dynamic_cast<torch::optim::SGDParamState*>(ia->second.get())) {
      auto& gb = static_cast<torch::optim::SGDParamState&>(*ib->second);
      EXPECT_TRUE(close(ga->momentum_buffer(), gb.momentum_buffer(), kFusedRtol, kFusedAtol)) << what << ": buffer " << j;
    }
  }
}

// An MLP with odd sizes; its first layer's weight is 7x13.
nn::Sequential mlp() { return nn::Sequential(nn::Linear(13, 7), nn::Tanh(), nn::Linear(7, 3)); }

// One training step as a program writes it.
template <class Opt>
at::Tensor train_body(nn::Sequential& m, Opt& o, const at::Tensor& x, const at::Tensor& y) {
  o.zero_grad();
  auto loss = torch::mse_loss(m->forward(x), y);
  loss.backward();
  o.step();
  return loss;
}

tcap::CompileOptions fused() {
  tcap::CompileOptions o;
  o.fused_optimizers = true;
  return o;
}

struct Trained {
  std::shared_ptr<tcap::CompiledStep> step;
  std::string log;
};

// Trains `model` through compile_step and `twin` eagerly for `steps` steps; each step's
// loss must match. `opts` builds an optimizer over a model.
template <class Opt>
Trained train(nn::Sequential& model, nn::Sequential& twin, Opt& opt, Opt& opt_twin, const std::string& what,
              tcap::CompileOptions options = fused(), int steps = 12) {
  auto body = train_body<Opt>;
  tcap::testing::LogCapture logs("perf,graph_breaks");
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  auto step = tcap::compile_step(model, opt, [&](const Tensors& in) { return Tensors{body(model, opt, in[0], in[1])}; },
                                 options);
  for (int i = 0; i < steps; ++i) {
    auto x = torch::randn({5, 13});
    auto y = torch::randn({5, 3});
    auto loss = (*step)({x, y})[0];
    EXPECT_TRUE(close(loss, body(twin, opt_twin, x, y), kFusedRtol, kFusedAtol)) << what << " step " << i;
  }
  EXPECT_GE(step->stats().replays, steps - 3) << what;
  return Trained{step, logs.text()};
}

template <class Opt, class Options>
void fused_matches_eager(Options options, const std::string& fused_op, const std::string& what,
                         const std::string& backend = "eager") {
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  torch::manual_seed(11);
  auto model = mlp(), twin = mlp();
  copy_params(*model, *twin);
  Opt opt(model->parameters(), options), opt_twin(twin->parameters(), options);
  tcap::CompileOptions co = fused();
  co.backend = backend;
  Trained r = train(model, twin, opt, opt_twin, what, co);
  expect_same_state(*model, *twin, opt, opt_twin, what);
  ASSERT_NE(r.step->graph(), nullptr) << what;
  EXPECT_EQ(count_ops(*r.step->graph(), fused_op), 1) << what << "\n" << r.log;
  EXPECT_EQ(count_ops(*r.step->graph(), "aten::addcdiv_"), 0) << what;
  EXPECT_NE(r.log.find("the updates of 4 parameters run as 1 fused"), std::string::npos) << r.log;
}

TEST(FusedOptimizer, Adam) {
  fused_matches_eager<torch::optim::Adam>(torch::optim::AdamOptions(1e-2), "aten::_fused_adam_", "adam");
}
TEST(FusedOptimizer, AdamWeightDecayBetas) {
  fused_matches_eager<torch::optim::Adam>(torch::optim::AdamOptions(3e-3).weight_decay(0.1).betas({0.8, 0.99}).eps(1e-6),
                                          "aten::_fused_adam_", "adam weight decay");
}
TEST(FusedOptimizer, AdamW) {
  fused_matches_eager<torch::optim::AdamW>(torch::optim::AdamWOptions(1e-2).weight_decay(0.05), "aten::_fused_adamw_",
                                           "adamw");
}
TEST(FusedOptimizer, AdamWithTheLlvmBackend) {
  fused_matches_eager<torch::optim::Adam>(torch::optim::AdamOptions(1e-2), "aten::_fused_adam_", "adam llvm", "llvm");
}
TEST(FusedOptimizer, SgdMomentum) {
  fused_matches_eager<torch::optim::SGD>(torch::optim::SGDOptions(0.05).momentum(0.9), "aten::_fused_sgd_",
                                         "sgd momentum");
}
TEST(FusedOptimizer, SgdDampeningWeightDecay) {
  fused_matches_eager<torch::optim::SGD>(
      torch::optim::SGDOptions(0.05).momentum(0.5).dampening(0.25).weight_decay(0.01), "aten::_fused_sgd_",
      "sgd dampening weight decay");
}
TEST(FusedOptimizer, SgdNesterov) {
  fused_matches_eager<torch::optim::SGD>(torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true),
                                         "aten::_fused_sgd_", "sgd nesterov");
}
TEST(FusedOptimizer, PlainSgd) {
  fused_matches_eager<torch::optim::SGD>(torch::optim::SGDOptions(0.1), "aten::_fused_sgd_", "sgd");
}

// amsgrad has no fused form here: the recorded ops stay, the log says why, eager's answer.
TEST(FusedOptimizer, AmsgradKeepsItsRecordedOps) {
  torch::manual_seed(12);
  auto model = mlp(), twin = mlp();
  copy_params(*model, *twin);
  auto o = torch::optim::AdamOptions(1e-2).amsgrad(true);
  torch::optim::Adam opt(model->parameters(), o), opt_twin(twin->parameters(), o);
  Trained r = train(model, twin, opt, opt_twin, "amsgrad");
  expect_same_state(*model, *twin, opt, opt_twin, "amsgrad");
  ASSERT_NE(r.step->graph(), nullptr);
  EXPECT_EQ(count_ops(*r.step->graph(), "aten::_fused_adam_"), 0);
  EXPECT_NE(r.log.find("keeps its recorded ops"), std::string::npos) << r.log;
}

// Off (the default): the recorded per-parameter ops replay, bit for bit eager's.
TEST(FusedOptimizer, OffKeepsTheRecordedOpsExactly) {
  torch::manual_seed(13);
  auto model = mlp(), twin = mlp();
  copy_params(*model, *twin);
  torch::optim::Adam opt(model->parameters(), 1e-2), opt_twin(twin->parameters(), 1e-2);
  tcap::CompileOptions co;
  co.fused_optimizers = false;
  Trained r = train(model, twin, opt, opt_twin, "off", co);
  ASSERT_NE(r.step->graph(), nullptr);
  EXPECT_EQ(count_ops(*r.step->graph(), "aten::_fused_adam_"), 0);
  EXPECT_EQ(count_ops(*r.step->graph(), "aten::addcdiv_"), 4);
  auto pa = model->parameters(), pb = twin->parameters();
  for (size_t j = 0; j < pa.size(); ++j) EXPECT_TRUE(pa[j].equal(pb[j])) << "parameter " << j;
}

// Two parameter groups with their own learning rates and betas: one fused call each, and
// a schedule that changes both learning rates every step reaches both calls.
TEST(FusedOptimizer, ParameterGroupsAndASchedule) {
  torch::manual_seed(14);
  auto model = mlp(), twin = mlp();
  copy_params(*model, *twin);
  auto groups = [](nn::Sequential& m) {
    std::vector<torch::optim::OptimizerParamGroup> gs;
    gs.emplace_back(m[0]->parameters(), std::make_unique<torch::optim::AdamOptions>(1e-2));
    gs.emplace_back(m[2]->parameters(), std::make_unique<torch::optim::AdamOptions>(
                                            torch::optim::AdamOptions(3e-2).betas({0.7, 0.95})));
    return gs;
  };
  torch::optim::Adam opt(groups(model)), opt_twin(groups(twin));
  auto body = train_body<torch::optim::Adam>;
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  auto step = tcap::compile_step(model, opt, [&](const Tensors& in) { return Tensors{body(model, opt, in[0], in[1])}; },
                                 fused());
  for (int i = 0; i < 12; ++i) {
    for (auto* o : {&opt, &opt_twin}) {
      for (auto& g : o->param_groups()) {
        auto& ao = static_cast<torch::optim::AdamOptions&>(g.options());
        ao.lr(ao.lr() * 0.9);
      }
    }
    auto x = torch::randn({5, 13});
    auto y = torch::randn({5, 3});
    auto loss = (*step)({x, y})[0];
    EXPECT_TRUE(close(loss, body(twin, opt_twin, x, y), kFusedRtol, kFusedAtol)) << "step " << i;
  }
  expect_same_state(*model, *twin, opt, opt_twin, "groups");
  EXPECT_GE(step->stats().replays, 9);
  EXPECT_LE(step->stats().recompiles, 1);  // the first step alone (no .grad inputs yet): no lr guard
  ASSERT_NE(step->graph(), nullptr);
  EXPECT_EQ(count_ops(*step->graph(), "aten::_fused_adam_"), 2);
}

// A frozen parameter (no gradient for a few eager steps) has its own step count: while
// counts differ the fused call cannot serve the group, and the step runs eagerly, saying
// why; the answer stays eager's.
TEST(FusedOptimizer, StepCountsThatDifferRunEagerly) {
  torch::manual_seed(15);
  auto model = mlp(), twin = mlp();
  copy_params(*model, *twin);
  torch::optim::Adam opt(model->parameters(), 1e-2), opt_twin(twin->parameters(), 1e-2);
  auto body = train_body<torch::optim::Adam>;
  tcap::testing::LogCapture logs("graph_breaks");
  auto step = tcap::compile_step(model, opt, [&](const Tensors& in) { return Tensors{body(model, opt, in[0], in[1])}; },
                                 fused());
  auto run = [&](int i) {
    auto x = torch::randn({5, 13});
    auto y = torch::randn({5, 3});
    auto loss = (*step)({x, y})[0];
    EXPECT_TRUE(close(loss, body(twin, opt_twin, x, y), kFusedRtol, kFusedAtol)) << "step " << i;
  };
  for (int i = 0; i < 5; ++i) run(i);
  ASSERT_GE(step->stats().replays, 2);
  // One eager step with the first layer frozen (set_to_none grads: no update, no count).
  for (auto* m : {&model, &twin}) {
    for (auto& p : (*m)[0]->parameters()) p.set_requires_grad(false);
  }
  run(5);
  for (auto* m : {&model, &twin}) {
    for (auto& p : (*m)[0]->parameters()) p.set_requires_grad(true);
  }
  const int replays = step->stats().replays;
  for (int i = 6; i < 10; ++i) run(i);
  expect_same_state(*model, *twin, opt, opt_twin, "frozen");
  EXPECT_EQ(step->stats().replays, replays) << "a fused call with two step counts was replayed";
  EXPECT_NE(logs.text().find("step counters of parameters updated by one fused"), std::string::npos) << logs.text();
  // The counters still differ: the drift is a fallback like any other, so under
  // error_on_fallback the call throws, naming the cause, before it changes anything.
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  const auto before = (*model)[0]->parameters()[0].clone();
  try {
    (*step)({torch::randn({5, 13}), torch::randn({5, 3})});
    ADD_FAILURE() << "no FallbackError for differing step counters";
  } catch (const tcap::FallbackError& e) {
    EXPECT_NE(std::string(e.what()).find("step counters"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(torch::equal(before, (*model)[0]->parameters()[0])) << "the refused call changed a parameter";
}

// A parameter that is not contiguous keeps its recorded ops; the others are fused.
TEST(FusedOptimizer, NonContiguousParameterKeepsItsOps) {
  torch::manual_seed(16);
  auto make = [] {
    auto m = mlp();
    torch::NoGradGuard no_grad;
    (*m)[2]->as<nn::Linear>()->weight.set_data(torch::randn({7, 3}).t());  // 3x7, strides (1, 3)
    return m;
  };
  auto model = make(), twin = make();
  copy_params(*model, *twin);
  ASSERT_FALSE((*model)[2]->as<nn::Linear>()->weight.is_contiguous());
  torch::optim::Adam opt(model->parameters(), 1e-2), opt_twin(twin->parameters(), 1e-2);
  Trained r = train(model, twin, opt, opt_twin, "non-contiguous");
  expect_same_state(*model, *twin, opt, opt_twin, "non-contiguous");
  ASSERT_NE(r.step->graph(), nullptr);
  EXPECT_EQ(count_ops(*r.step->graph(), "aten::_fused_adam_"), 1);
  EXPECT_EQ(count_ops(*r.step->graph(), "aten::addcdiv_"), 1);
  EXPECT_NE(r.log.find("not contiguous"), std::string::npos) << r.log;
}

// Two optimizers in one step (a GAN's two Adams): one fused call each.
TEST(FusedOptimizer, TwoOptimizersOneCallEach) {
  torch::manual_seed(17);
  auto g = mlp(), d = nn::Sequential(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 1));
  auto g2 = mlp(), d2 = nn::Sequential(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 1));
  copy_params(*g, *g2);
  copy_params(*d, *d2);
  auto ao = torch::optim::AdamOptions(2e-3).betas({0.5, 0.999});
  torch::optim::Adam og(g->parameters(), ao), od(d->parameters(), ao);
  torch::optim::Adam og2(g2->parameters(), ao), od2(d2->parameters(), ao);
  auto body = [](nn::Sequential& gen, nn::Sequential& disc, torch::optim::Adam& o1, torch::optim::Adam& o2,
                 const at::Tensor& z) {
    o2.zero_grad();
    auto d_loss = disc->forward(gen->forward(z).detach()).pow(2).mean();
    d_loss.backward();
    o2.step();
    o1.zero_grad();
    auto g_loss = (disc->forward(gen->forward(z)) - 1).pow(2).mean();
    g_loss.backward();
    o1.step();
    return Tensors{d_loss, g_loss};
  };
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  auto step = tcap::compile_step({g.ptr(), d.ptr()}, {og, od}, [&](const Tensors& in) { return body(g, d, og, od, in[0]); },
                                 fused());
  for (int i = 0; i < 10; ++i) {
    auto z = torch::randn({6, 13});
    auto out = (*step)({z});
    auto ref = body(g2, d2, og2, od2, z);
    EXPECT_TRUE(close(out[0], ref[0], kFusedRtol, kFusedAtol)) << "d_loss step " << i;
    EXPECT_TRUE(close(out[1], ref[1], kFusedRtol, kFusedAtol)) << "g_loss step " << i;
  }
  expect_same_state(*g, *g2, og, og2, "generator");
  expect_same_state(*d, *d2, od, od2, "discriminator");
  EXPECT_GE(step->stats().replays, 7);
  ASSERT_NE(step->graph(), nullptr);
  EXPECT_EQ(count_ops(*step->graph(), "aten::_fused_adam_"), 2);
}

}  // namespace
