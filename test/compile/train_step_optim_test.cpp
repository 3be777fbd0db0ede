// compile_step with every optimizer of the C++ API, a learning-rate schedule, several
// optimizers in one step, a transformer layer (MultiheadAttention's host read) and a
// changing batch size; each against an eager twin from the same weights. The step must
// really be replayed (stats), and results equal eager.
//
// Tolerances (float32): rtol 1e-4, atol 1e-5 over 15 steps (the same kernels in the same
// order; the slack covers reductions whose order depends on the thread split).
#include <tcap/stance.h>
#include <tcap/train_step.h>

#include "runtime/fused_kernel.h"
#include "support/backends.h"
#include "support/compare.h"
#include "support/log_capture.h"
#include "support/modules.h"

#include <torch/torch.h>

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;
namespace nn = torch::nn;

namespace {

constexpr double kOptimRtol = 1e-4;
constexpr double kOptimAtol = 1e-5;

using tcap::testing::copy_params;

void expect_same_params(nn::Module& a, nn::Module& b, const std::string& what) {
  auto pb = b.named_parameters();
  for (const auto& item : a.named_parameters()) {
    EXPECT_TRUE(close(item.value(), pb[item.key()], kOptimRtol, kOptimAtol)) << what << ": " << item.key();
    EXPECT_TRUE(close(item.value().grad(), pb[item.key()].grad(), kOptimRtol, kOptimAtol)) << what << ": " << item.key() << ".grad";
  }
}

nn::Sequential mlp() { return nn::Sequential(nn::Linear(5, 12), nn::GELU(), nn::Linear(12, 3)); }

// One optimizer type, trained 15 steps compiled and eager from the same weights.
template <class Opt, class Options>
void train_with(Options options, const std::string& name) {
  torch::manual_seed(1);
  auto model = mlp(), twin = mlp();
  copy_params(*model, *twin);
  Opt opt(model->parameters(), options), opt_twin(twin->parameters(), options);
  auto body = [](nn::Sequential& m, Opt& o, const at::Tensor& x, const at::Tensor& y) {
    o.zero_grad();
    auto loss = torch::mse_loss(m->forward(x), y);
    loss.backward();
    o.step();
    return loss;
  };
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  auto step = tcap::compile_step(model, opt, [&](const Tensors& in) { return Tensors{body(model, opt, in[0], in[1])}; });
  for (int i = 0; i < 15; ++i) {
    auto x = torch::randn({9, 5});
    auto y = torch::randn({9, 3});
    auto loss = (*step)({x, y})[0];
    EXPECT_TRUE(close(loss, body(twin, opt_twin, x, y), kOptimRtol, kOptimAtol)) << name << " step " << i;
  }
  expect_same_params(*model, *twin, name);
  EXPECT_GE(step->stats().replays, 12) << name;
}

TEST(TrainStepOptim, Sgd) { train_with<torch::optim::SGD>(torch::optim::SGDOptions(0.05), "sgd"); }
TEST(TrainStepOptim, SgdNesterovWeightDecay) {
  train_with<torch::optim::SGD>(torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3),
                                "sgd nesterov");
}
TEST(TrainStepOptim, Adam) { train_with<torch::optim::Adam>(torch::optim::AdamOptions(1e-2), "adam"); }
TEST(TrainStepOptim, AdamAmsgrad) {
  train_with<torch::optim::Adam>(torch::optim::AdamOptions(1e-2).amsgrad(true), "adam amsgrad");
}
TEST(TrainStepOptim, AdamW) {
  train_with<torch::optim::AdamW>(torch::optim::AdamWOptions(1e-2).weight_decay(0.05), "adamw");
}
TEST(TrainStepOptim, Adagrad) {
  train_with<torch::optim::Adagrad>(torch::optim::AdagradOptions(0.05).lr_decay(0.01), "adagrad");
}
TEST(TrainStepOptim, RmspropCenteredMomentum) {
  train_with<torch::optim::RMSprop>(torch::optim::RMSpropOptions(1e-2).centered(true).momentum(0.5), "rmsprop");
}

TEST(TrainStepOptim, LbfgsRunsEagerlyWithAReason) {
  auto model = mlp();
  torch::optim::LBFGS opt(model->parameters());
  auto step = tcap::compile_step(model, opt, [&](const Tensors& in) { return Tensors{model->forward(in[0]).sum()}; });
  (*step)({torch::randn({2, 5})});
  EXPECT_NE(step->eager_reason().find("LBFGS"), std::string::npos) << step->eager_reason();
}

// The learning rate changes every step (a warm-up schedule): no recompile.
TEST(TrainStepOptim, LearningRateScheduleIsAnInput) {
  for (const std::string backend : {"eager", "llvm"}) {
  if (!tcap::testing::backend_built(backend, nullptr)) continue;
  SCOPED_TRACE("backend " + backend);
  for (int adam = 0; adam < 2; ++adam) {
    torch::manual_seed(2);
    auto model = mlp(), twin = mlp();
    copy_params(*model, *twin);
    auto opt = tcap::testing::adam_or_sgd(adam, model->parameters(), 1e-3);
    auto opt_twin = tcap::testing::adam_or_sgd(adam, twin->parameters(), 1e-3);
    using tcap::testing::set_lr;
    auto body = tcap::testing::mse_step;
    tcap::CompileOptions o;
    o.backend = backend;
    auto step =
        tcap::compile_step(model, *opt, [&](const Tensors& in) { return Tensors{body(model, *opt, in[0], in[1])}; }, o);
    const int64_t launches = tcap::runtime::runtime_stats().launches;
    for (int i = 0; i < 15; ++i) {
      const double lr = 1e-3 * (i + 1);
      set_lr(*opt, lr);
      set_lr(*opt_twin, lr);
      auto x = torch::randn({9, 5});
      auto y = torch::randn({9, 3});
      auto loss = (*step)({x, y})[0];
      EXPECT_TRUE(close(loss, body(twin, *opt_twin, x, y), kOptimRtol, kOptimAtol)) << "adam " << adam << " step " << i;
    }
    expect_same_params(*model, *twin, adam ? "adam schedule" : "sgd schedule");
    EXPECT_GE(step->stats().replays, 11) << "adam " << adam;
    EXPECT_EQ(step->stats().recompiles, 1) << "adam " << adam << ": only the state-creating first step differs";
    // With the llvm backend the step's graph is fused (Note [Host scalars as graph
    // inputs]): generated kernels ran, and the changing learning rate was not folded in.
    if (backend == "llvm") {
      EXPECT_GT(tcap::runtime::runtime_stats().launches, launches) << "adam " << adam;
    }
  }
  }
}

// A GAN's iteration in one step: two models, two Adams, BatchNorm, the generator trained
// through the discriminator.
struct Gan {
  nn::Sequential gen{nn::Linear(4, 16), nn::BatchNorm1d(16), nn::ReLU(), nn::Linear(16, 6), nn::Tanh()};
  nn::Sequential disc{nn::Linear(6, 16), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)), nn::Linear(16, 1)};
};

// Two GANs with the same weights and an Adam per model each: `a` is compiled, `b` eager.
struct GanTwins {
  explicit GanTwins(uint64_t seed) : seeded((torch::manual_seed(seed), true)) {  // before the models
    copy_params(*a.gen, *b.gen);
    copy_params(*a.disc, *b.disc);
  }
  void expect_same_params_match() {
    expect_same_params(*a.gen, *b.gen, "generator");
    expect_same_params(*a.disc, *b.disc, "discriminator");
  }
  bool seeded;
  Gan a, b;
  torch::optim::AdamOptions adam = torch::optim::AdamOptions(2e-3).betas({0.5, 0.999});
  torch::optim::Adam ga{a.gen->parameters(), adam}, da{a.disc->parameters(), adam};
  torch::optim::Adam gb{b.gen->parameters(), adam}, db{b.disc->parameters(), adam};
};

TEST(TrainStepOptim, GanStepWithTwoOptimizers) {
  GanTwins t(3);
  auto &a = t.a, &b = t.b;
  auto &ga = t.ga, &da = t.da, &gb = t.gb, &db = t.db;
  auto body = [](Gan& g, torch::optim::Adam& og, torch::optim::Adam& od, const at::Tensor& real, const at::Tensor& noise) {
    od.zero_grad();
    auto fake = g.gen->forward(noise);
    auto d_real = torch::binary_cross_entropy_with_logits(g.disc->forward(real), torch::ones({real.size(0), 1}));
    auto d_fake = torch::binary_cross_entropy_with_logits(g.disc->forward(fake.detach()), torch::zeros({real.size(0), 1}));
    auto d_loss = d_real + d_fake;
    d_loss.backward();
    od.step();
    og.zero_grad();
    auto g_loss = torch::binary_cross_entropy_with_logits(g.disc->forward(fake), torch::ones({real.size(0), 1}));
    g_loss.backward();
    og.step();
    return Tensors{d_loss, g_loss};
  };
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  auto step = tcap::compile_step({a.gen.ptr(), a.disc.ptr()}, {ga, da},
                                 [&](const Tensors& in) { return body(a, ga, da, in[0], in[1]); });
  for (int i = 0; i < 12; ++i) {
    auto real = torch::randn({8, 6});
    auto noise = torch::randn({8, 4});
    auto out = (*step)({real, noise});
    auto ref = body(b, gb, db, real, noise);
    EXPECT_TRUE(close(out[0], ref[0], kOptimRtol, kOptimAtol)) << "d_loss step " << i;
    EXPECT_TRUE(close(out[1], ref[1], kOptimRtol, kOptimAtol)) << "g_loss step " << i;
  }
  t.expect_same_params_match();
  auto bn_a = a.gen->named_buffers(), bn_b = b.gen->named_buffers();
  for (const auto& item : bn_a) EXPECT_TRUE(close(item.value(), bn_b[item.key()], kOptimRtol, kOptimAtol)) << item.key();
  EXPECT_GE(step->stats().replays, 9);
}

// A GAN written as two steps: the discriminator's step returns the generator's images
// with their history, and the generator's update backpropagates through them afterwards.
// The replayed step gives the images a history of their own (Note [Outputs with history
// from a replayed step]): the generator learns exactly as in eager.
struct TwoStepGan {
  static Tensors d_step(Gan& g, torch::optim::Adam& od, const at::Tensor& real, const at::Tensor& noise) {
    od.zero_grad();
    auto fake = g.gen->forward(noise);
    auto d_loss = torch::binary_cross_entropy_with_logits(g.disc->forward(real), torch::ones({real.size(0), 1})) +
                  torch::binary_cross_entropy_with_logits(g.disc->forward(fake.detach()), torch::zeros({real.size(0), 1}));
    d_loss.backward();
    od.step();
    return Tensors{d_loss, fake};
  }
  static at::Tensor g_update(Gan& g, torch::optim::Adam& og, const at::Tensor& fake) {
    og.zero_grad();
    auto g_loss = torch::binary_cross_entropy_with_logits(g.disc->forward(fake), torch::ones({fake.size(0), 1}));
    g_loss.backward();
    og.step();
    return g_loss;
  }
};

void expect_same_gen_grads(Gan& a, Gan& b, int step) {
  auto pb = b.gen->named_parameters();
  for (const auto& item : a.gen->named_parameters()) {
    const at::Tensor& ga = item.value().grad();
    const at::Tensor& gb = pb[item.key()].grad();
    ASSERT_EQ(ga.defined(), gb.defined()) << item.key() << " step " << step;
    if (ga.defined()) {
      EXPECT_TRUE(close(ga, gb, kOptimRtol, kOptimAtol)) << item.key() << ".grad step " << step;
    }
  }
}

// The discriminator's step of t.a, compiled.
std::shared_ptr<tcap::CompiledStep> compiled_d_step(GanTwins& t) {
  return tcap::compile_step({t.a.gen.ptr(), t.a.disc.ptr()}, {t.da},
                            [&t](const Tensors& in) { return TwoStepGan::d_step(t.a, t.da, in[0], in[1]); });
}

TEST(TrainStepOptim, StepReturningHistoryKeepsItOnReplays) {
  GanTwins t(5);
  auto &a = t.a, &b = t.b;
  auto &ga = t.ga, &gb = t.gb, &db = t.db;
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  auto step = compiled_d_step(t);
  for (int i = 0; i < 8; ++i) {
    auto real = torch::randn({8, 6});
    auto noise = torch::randn({8, 4});
    auto out = (*step)({real, noise});
    ASSERT_TRUE(out[1].requires_grad()) << "step " << i;
    ASSERT_TRUE(out[1].grad_fn()) << "step " << i;
    auto g_loss = TwoStepGan::g_update(a, ga, out[1]);
    auto ref = TwoStepGan::d_step(b, db, real, noise);
    auto g_ref = TwoStepGan::g_update(b, gb, ref[1]);
    EXPECT_TRUE(close(out[0], ref[0], kOptimRtol, kOptimAtol)) << "d_loss step " << i;
    EXPECT_TRUE(close(out[1], ref[1], kOptimRtol, kOptimAtol)) << "images step " << i;
    EXPECT_TRUE(close(g_loss, g_ref, kOptimRtol, kOptimAtol)) << "g_loss step " << i;
    expect_same_gen_grads(a, b, i);
  }
  t.expect_same_params_match();
  auto bn_a = a.gen->named_buffers(), bn_b = b.gen->named_buffers();
  for (const auto& item : bn_a) EXPECT_TRUE(close(item.value(), bn_b[item.key()], kOptimRtol, kOptimAtol)) << item.key();
  EXPECT_GE(step->stats().replays, 5);
  EXPECT_EQ(step->eager_reason(), "");
}

// Both halves compiled: the generator's step backpropagates through the discriminator into
// images the other compiled step made (an input with a history from an earlier step).
TEST(TrainStepOptim, StepBackpropagatingIntoAnEarlierStepsOutput) {
  GanTwins t(6);
  auto &a = t.a, &b = t.b;
  auto &ga = t.ga, &gb = t.gb, &db = t.db;
  auto d = compiled_d_step(t);
  auto g = tcap::compile_step({a.gen.ptr(), a.disc.ptr()}, {ga},
                              [&](const Tensors& in) { return Tensors{TwoStepGan::g_update(a, ga, in[0])}; });
  for (int i = 0; i < 10; ++i) {
    // d's first three calls run eagerly (one makes optimizer state, two capture), so g's
    // input has an eager history and g runs eagerly too, saying why; no fallback after.
    tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/i >= 3);
    auto real = torch::randn({8, 6});
    auto noise = torch::randn({8, 4});
    auto out = (*d)({real, noise});
    auto g_loss = (*g)({out[1]})[0];
    auto ref = TwoStepGan::d_step(b, db, real, noise);
    auto g_ref = TwoStepGan::g_update(b, gb, ref[1]);
    EXPECT_TRUE(close(out[0], ref[0], kOptimRtol, kOptimAtol)) << "d_loss step " << i;
    EXPECT_TRUE(close(g_loss, g_ref, kOptimRtol, kOptimAtol)) << "g_loss step " << i;
    expect_same_gen_grads(a, b, i);
    if (i == 9) {  // the generator's step used the images' history up, in both
      EXPECT_THROW(out[1].sum().backward(), c10::Error);
      EXPECT_THROW(ref[1].sum().backward(), c10::Error);
    }
  }
  t.expect_same_params_match();
  // d: eager (optimizer state), two captures, then replays. g: eager while d's images
  // come with an eager history, two captures with a replayed one, then replays.
  EXPECT_GE(d->stats().replays, 7);
  EXPECT_GE(g->stats().replays, 5);
  EXPECT_EQ(g->eager_reason(), "");
}

// The generator's step compiled, the discriminator's eager: g's backward would run the
// eager history of its input, whose saved tensors change every call. g runs eagerly at
// once (no recapture per call), says why, and learns as in eager.
TEST(TrainStepOptim, StepBackpropagatingIntoAnEagerHistoryRunsEagerlyWithReason) {
  GanTwins t(8);
  auto &a = t.a, &b = t.b;
  auto &ga = t.ga, &da = t.da, &gb = t.gb, &db = t.db;
  tcap::testing::LogCapture logs("graph_breaks");
  auto g = tcap::compile_step({a.gen.ptr(), a.disc.ptr()}, {ga},
                              [&](const Tensors& in) { return Tensors{TwoStepGan::g_update(a, ga, in[0])}; });
  for (int i = 0; i < 6; ++i) {
    auto real = torch::randn({8, 6});
    auto noise = torch::randn({8, 4});
    auto out = TwoStepGan::d_step(a, da, real, noise);
    auto g_loss = (*g)({out[1]})[0];
    auto ref = TwoStepGan::d_step(b, db, real, noise);
    auto g_ref = TwoStepGan::g_update(b, gb, ref[1]);
    EXPECT_TRUE(close(g_loss, g_ref, kOptimRtol, kOptimAtol)) << "g_loss step " << i;
    expect_same_gen_grads(a, b, i);
  }
  t.expect_same_params_match();
  EXPECT_EQ(g->stats().replays, 0);
  // One capture per structure (the first call has no .grads nor Adam state yet), not one per call.
  EXPECT_LE(g->stats().captures, 2) << "an eager history must not recapture every call";
  EXPECT_NE(g->eager_reason().find("autograd history of input 0"), std::string::npos)
      << g->eager_reason() << "\n" << logs.text();
}

// A step returning an output computed after its optimizer's update keeps its history on
// replays. One computed before the update cannot get one (a recompute from the step's start
// could not see what the update changed): that step runs eagerly, says why, and the
// program does whatever eager does (its later backward may fail on the changed weights).
TEST(TrainStepOptim, StepReturningHistoryOfWeightsItUpdates) {
  torch::manual_seed(7);
  nn::Linear lin(5, 3), twin(5, 3);
  copy_params(*lin, *twin);
  torch::optim::SGD opt(lin->parameters(), 0.1), opt_twin(twin->parameters(), 0.1);
  auto after = [](nn::Linear& m, torch::optim::SGD& o, const at::Tensor& x) {
    o.zero_grad();
    auto loss = m->forward(x).pow(2).mean();
    loss.backward();
    o.step();
    return Tensors{loss, m->forward(x).tanh()};
  };
  auto before = [](nn::Linear& m, torch::optim::SGD& o, const at::Tensor& x) {
    o.zero_grad();
    auto h = m->forward(x).tanh();
    auto loss = h.pow(2).mean();
    loss.backward(torch::ones_like(loss), /*retain_graph=*/true);
    o.step();
    return Tensors{loss, h};
  };
  auto expect_same_grads = [&](int i) {
    EXPECT_TRUE(close(lin->weight.grad(), twin->weight.grad(), kOptimRtol, kOptimAtol)) << "weight.grad step " << i;
    EXPECT_TRUE(close(lin->bias.grad(), twin->bias.grad(), kOptimRtol, kOptimAtol)) << "bias.grad step " << i;
  };
  {
    tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
    auto fine = tcap::compile_step(lin.ptr(), opt, [&](const Tensors& in) { return after(lin, opt, in[0]); });
    for (int i = 0; i < 6; ++i) {
      auto x = torch::randn({4, 5});
      auto out = (*fine)({x});
      auto ref = after(twin, opt_twin, x);
      out[1].sum().backward();  // accumulates onto the step's .grad, as in eager
      ref[1].sum().backward();
      expect_same_grads(i);
    }
    EXPECT_GE(fine->stats().replays, 3);
  }
  tcap::testing::LogCapture logs("graph_breaks");
  auto bad = tcap::compile_step(lin.ptr(), opt, [&](const Tensors& in) { return before(lin, opt, in[0]); });
  for (int i = 0; i < 4; ++i) {
    auto x = torch::randn({4, 5});
    auto out = (*bad)({x});
    auto ref = before(twin, opt_twin, x);
    bool eager_threw = false;
    try {
      ref[1].sum().backward();
    } catch (const c10::Error&) {
      eager_threw = true;
    }
    if (eager_threw) {
      EXPECT_THROW(out[1].sum().backward(), c10::Error) << "step " << i;
    } else {
      out[1].sum().backward();
      expect_same_grads(i);
    }
  }
  EXPECT_EQ(bad->stats().replays, 0);
  EXPECT_NE(bad->eager_reason().find("which the step changes in place afterwards"), std::string::npos)
      << bad->eager_reason() << "\n" << logs.text();
}

// A transformer encoder layer (MultiheadAttention reads equal(q, k) on the host) with AdamW.
TEST(TrainStepOptim, TransformerLayerStep) {
  torch::manual_seed(4);
  auto opts = nn::TransformerEncoderLayerOptions(16, 4).dim_feedforward(32).dropout(0.0);
  nn::TransformerEncoderLayer layer(opts), twin(opts);
  copy_params(*layer, *twin);
  torch::optim::AdamW opt(layer->parameters(), 1e-3), opt_twin(twin->parameters(), 1e-3);
  auto body = [](nn::TransformerEncoderLayer& m, torch::optim::AdamW& o, const at::Tensor& x) {
    o.zero_grad();
    auto loss = m->forward(x).pow(2).mean();
    loss.backward();
    o.step();
    return loss;
  };
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  auto step = tcap::compile_step(layer, opt, [&](const Tensors& in) { return Tensors{body(layer, opt, in[0])}; });
  for (int i = 0; i < 10; ++i) {
    auto x = torch::randn({7, 3, 16});
    auto loss = (*step)({x})[0];
    EXPECT_TRUE(close(loss, body(twin, opt_twin, x), kOptimRtol, kOptimAtol)) << "step " << i;
  }
  expect_same_params(*layer, *twin, "transformer layer");
  EXPECT_GE(step->stats().replays, 7);
}

// The batch size changes: a compiled step is generalized over it.
TEST(TrainStepOptim, ChangingBatchIsDynamic) {
  torch::manual_seed(5);
  auto model = mlp(), twin = mlp();
  copy_params(*model, *twin);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD opt_twin(twin->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto body = [](nn::Sequential& m, torch::optim::SGD& o, const at::Tensor& x, const at::Tensor& y) {
    o.zero_grad();
    auto loss = torch::mse_loss(m->forward(x), y);
    loss.backward();
    o.step();
    return loss;
  };
  auto step = tcap::compile_step(model, opt, [&](const Tensors& in) { return Tensors{body(model, opt, in[0], in[1])}; });
  const int64_t batches[] = {8, 8, 8, 8, 12, 12, 12, 16, 20, 16, 24};
  for (int64_t n : batches) {
    auto x = torch::randn({n, 5});
    auto y = torch::randn({n, 3});
    auto loss = (*step)({x, y})[0];
    EXPECT_TRUE(close(loss, body(twin, opt_twin, x, y), kOptimRtol, kOptimAtol)) << "batch " << n;
  }
  expect_same_params(*model, *twin, "dynamic batch");
  // The capture at 12 compiles at once, its capture at 8 standing in for a first one there
  // (Note [A step compiled from captures at two sizes]).
  EXPECT_EQ(step->stats().captures, 4) << "three captures at 8 (the first creates state), one at 12";
  // 16, 20 and 24 are checked once each (Note [Checking a new size]); 8, 12 and 16 replay.
  EXPECT_EQ(step->stats().size_checks, 3);
  EXPECT_GE(step->stats().replays, 3);
}

}  // namespace
