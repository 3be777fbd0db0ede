// Verify mode must not cry wolf or crash on programs that keep the contract (docs/compile.md,
// "Verify mode"): chained calls of one compiled function, sparse gradients, a step whose
// input is a stride-0 (expanded) tensor, hooks with side effects (run once per call, as in
// eager), double backwards. Each program runs under TCAP_VERIFY-style verification of
// every replay, which must report nothing and give eager's results.
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/stance.h>
#include <tcap/train_step.h>

#include "support/compare.h"
#include "support/log_capture.h"
#include "support/models.h"

#include <torch/torch.h>

#include <string>

namespace {

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;
namespace nn = torch::nn;

const tcap::VerifyOptions kEveryReplay{1, false};

// f(f(x)): the outer call's input is the inner call's output, with autograd history.
TEST(VerifyMode, ChainedCallsOfOneFunction) {
  for (const auto& backend : {std::string("eager"), std::string("llvm")}) {
    SCOPED_TRACE(backend);
    torch::manual_seed(1);
    nn::Linear lin(5, 5);
    tcap::CompileOptions o;
    o.backend = backend;
    auto f = tcap::compile(lin, o);
    for (int i = 0; i < 5; ++i) {
      tcap::StanceGuard verifying(tcap::Stance::Default, true, i >= 2 ? std::optional(kEveryReplay) : std::nullopt);
      auto x = torch::randn({3, 5}, torch::requires_grad());
      lin->zero_grad();
      auto y = f->forward(torch::tanh(f->forward(x)));
      y.pow(2).sum().backward();
      auto g = lin->weight.grad().clone();
      auto gx = x.grad().clone();
      lin->zero_grad();
      x.mutable_grad().reset();
      {
        tcap::StanceGuard eager(tcap::Stance::ForceEager);
        lin->forward(torch::tanh(lin->forward(x))).pow(2).sum().backward();
      }
      ASSERT_TRUE(close(g, lin->weight.grad(), 1e-5, 1e-6)) << "call " << i;
      ASSERT_TRUE(close(gx, x.grad(), 1e-5, 1e-6)) << "call " << i;
    }
    EXPECT_GE(f->stats().verified, 3);
  }
}

// A function whose out= write resizes an input (ATen resizes an `out` of another shape):
// each verified replay puts the input back, geometry and values, before eager runs, so
// eager's read of it before the write sees what the compiled run saw.
TEST(VerifyMode, AnInputResizedByAnOutOverload) {
  auto fn = [](const Tensors& in) {
    at::Tensor out = in[1];
    const at::Tensor before = out.sum(0);
    at::mul_out(out, in[0], in[0]);
    return Tensors{out + before};
  };
  for (const auto& backend : {std::string("eager"), std::string("llvm")}) {
    SCOPED_TRACE(backend);
    tcap::CompileOptions o;
    o.backend = backend;
    o.name = "verify_out_resized_" + backend;
    auto f = tcap::compile(fn, o);
    for (int i = 0; i < 5; ++i) {
      tcap::StanceGuard verifying(tcap::Stance::Default, true, i >= 1 ? std::optional(kEveryReplay) : std::nullopt);
      const at::Tensor x = torch::randn({5}), y = torch::randn({4, 5});
      Tensors in{x, y.clone()}, ref_in{x, y.clone()};
      const Tensors got = (*f)(in);
      const Tensors ref = fn(ref_in);
      ASSERT_EQ(in[1].sizes(), ref_in[1].sizes()) << "call " << i;
      ASSERT_TRUE(close(in[1], ref_in[1], 1e-5, 1e-6)) << "call " << i;
      ASSERT_TRUE(close(got[0], ref[0], 1e-5, 1e-6)) << "call " << i;
    }
    EXPECT_GE(f->stats().verified, 3);
  }
}

// An Embedding with sparse gradients: verified gradients are compared as dense tensors.
TEST(VerifyMode, SparseGradients) {
  torch::manual_seed(2);
  nn::Embedding emb(nn::EmbeddingOptions(20, 4).sparse(true));
  auto f = tcap::compile(emb);
  for (int i = 0; i < 5; ++i) {
    tcap::StanceGuard verifying(tcap::Stance::Default, true, i >= 2 ? std::optional(kEveryReplay) : std::nullopt);
    auto idx = torch::randint(0, 20, {6}, torch::kLong);
    emb->zero_grad();
    f->forward(idx).pow(2).sum().backward();
    ASSERT_TRUE(emb->weight.grad().is_sparse());
    auto got = emb->weight.grad().to_dense();
    emb->zero_grad();
    emb->forward(idx).pow(2).sum().backward();
    ASSERT_TRUE(close(got, emb->weight.grad().to_dense(), 1e-5, 1e-6)) << "call " << i;
  }
  EXPECT_GE(f->stats().verified, 1);
}

// A compiled step whose input is an expanded (stride-0) tensor: verification restores the
// step's inputs without writing into one.
TEST(VerifyMode, StepWithAStrideZeroInput) {
  torch::manual_seed(3);
  nn::Linear model(4, 2), twin(4, 2);
  tcap::testing::copy_parameters(*model, *twin);
  torch::optim::SGD opt(model->parameters(), 0.1), twin_opt(twin->parameters(), 0.1);
  auto mse = [](const at::Tensor& out, const Tensors& in) { return torch::mse_loss(out, in[1]); };
  auto step = tcap::compile_step(model.ptr(), opt, tcap::testing::step_body(model, opt, mse));
  auto eager = tcap::testing::step_body(twin, twin_opt, mse);
  for (int i = 0; i < 6; ++i) {
    tcap::StanceGuard verifying(tcap::Stance::Default, true, i >= 3 ? std::optional(kEveryReplay) : std::nullopt);
    auto x = torch::randn({1, 4}).expand({6, 4});  // one row for the whole batch: stride 0
    auto y = torch::randn({6, 2});
    auto got = (*step)({x, y})[0];
    auto want = eager({x, y})[0];
    ASSERT_TRUE(close(got, want, 1e-5, 1e-6)) << "step " << i;
    ASSERT_TRUE(close(model->weight, twin->weight, 1e-5, 1e-6)) << "step " << i;
  }
  EXPECT_GE(step->stats().verified, 1);
}

// A gradient hook that counts its calls and scales the gradient: run twice, it would count
// twice and scale eager's .grad twice.
struct CountingHook {
  std::shared_ptr<int> calls = std::make_shared<int>(0);
  double scale;
  explicit CountingHook(double s) : scale(s) {}
  at::Tensor operator()(const at::Tensor& g) const {
    ++*calls;
    return g * scale;
  }
};

// compile_step: the parameters' hooks are opaque hooks the compiled step calls; under
// verify they run once per step, in eager's run.
TEST(VerifyMode, ParameterHooksRunOnceInAVerifiedStep) {
  for (const auto& backend : {std::string("eager"), std::string("llvm")}) {
    SCOPED_TRACE(backend);
    torch::manual_seed(4);
    nn::Linear model(5, 3), twin(5, 3);
    tcap::testing::copy_parameters(*model, *twin);
    CountingHook hook(0.5), twin_hook(0.5);
    model->weight.register_hook(hook);
    twin->weight.register_hook(twin_hook);
    torch::optim::SGD opt(model->parameters(), 0.1), twin_opt(twin->parameters(), 0.1);
    auto mse = [](const at::Tensor& out, const Tensors& in) { return torch::mse_loss(out, in[1]); };
    tcap::CompileOptions o;
    o.backend = backend;
    auto step = tcap::compile_step(model.ptr(), opt, tcap::testing::step_body(model, opt, mse), o);
    auto eager = tcap::testing::step_body(twin, twin_opt, mse);
    for (int i = 0; i < 7; ++i) {
      tcap::StanceGuard verifying(tcap::Stance::Default, true, i >= 3 ? std::optional(kEveryReplay) : std::nullopt);
      auto x = torch::randn({6, 5}), y = torch::randn({6, 3});
      auto got = (*step)({x, y})[0];
      auto want = eager({x, y})[0];
      ASSERT_TRUE(close(got, want, 1e-5, 1e-6)) << "step " << i;
      ASSERT_TRUE(close(model->weight.grad(), twin->weight.grad(), 1e-5, 1e-6)) << "step " << i;
      ASSERT_TRUE(close(model->weight, twin->weight, 1e-5, 1e-6)) << "step " << i;
      ASSERT_EQ(*hook.calls, *twin_hook.calls) << "step " << i;
    }
    EXPECT_GE(step->stats().verified, 3);
  }
}

// A verified step whose host value changes: the compiled step stops at the read (an
// inline guard) after eager's step already ran, and eager's step stays the call's only run
// (handed back to the serving loop, it would run the step's code a second time).
TEST(VerifyMode, AHostValueThatChangesInAVerifiedStep) {
  torch::manual_seed(9);
  nn::Linear model(4, 2), twin(4, 2);
  tcap::testing::copy_parameters(*model, *twin);
  torch::optim::SGD opt(model->parameters(), 0.1), twin_opt(twin->parameters(), 0.1);
  auto body = [](nn::Linear& m, torch::optim::Optimizer& o) {
    return [&m, &o](const Tensors& in) {
      o.zero_grad();
      auto loss = torch::mse_loss(m->forward(in[0]), in[1]);
      if (in[2].item<bool>()) loss = loss * 2;
      loss.backward();
      o.step();
      return Tensors{loss};
    };
  };
  auto step = tcap::compile_step(model.ptr(), opt, body(model, opt));
  auto eager = body(twin, twin_opt);
  for (int i = 0; i < 10; ++i) {
    tcap::StanceGuard verifying(tcap::Stance::Default, true, i >= 3 ? std::optional(kEveryReplay) : std::nullopt);
    auto x = torch::randn({6, 4}), y = torch::randn({6, 2});
    auto flag = torch::tensor(i < 5 || i % 2 == 0);
    auto got = (*step)({x, y, flag})[0];
    auto want = eager({x, y, flag})[0];
    ASSERT_TRUE(close(got, want, 1e-5, 1e-6)) << "step " << i;
    ASSERT_TRUE(close(model->weight, twin->weight, 1e-5, 1e-6)) << "step " << i;
  }
}

// Compiled autograd: a parameter hook and retain_grad are opaque call_hook nodes; under
// verify each runs once per backward (a retained .grad is set once, not doubled).
TEST(VerifyMode, HooksRunOnceInAVerifiedCompiledBackward) {
  torch::manual_seed(5);
  nn::Linear lin(4, 4), twin(4, 4);
  tcap::testing::copy_parameters(*lin, *twin);
  CountingHook hook(2.0), twin_hook(2.0);
  lin->weight.register_hook(hook);
  twin->weight.register_hook(twin_hook);
  auto run = [](nn::Linear& m, const at::Tensor& x) {
    auto h = torch::tanh(m->forward(x));
    h.retain_grad();
    h.pow(2).sum().backward();
    return h.grad();
  };
  tcap::CompiledAutogradGuard ca;
  for (int i = 0; i < 6; ++i) {
    tcap::StanceGuard verifying(tcap::Stance::Default, true, i >= 2 ? std::optional(kEveryReplay) : std::nullopt);
    auto x = torch::randn({3, 4});
    lin->zero_grad();
    twin->zero_grad();
    auto got = run(lin, x);
    at::Tensor want;
    {
      tcap::StanceGuard eager(tcap::Stance::ForceEager);
      want = run(twin, x);
    }
    ASSERT_TRUE(close(got, want, 1e-5, 1e-6)) << "call " << i;  // the retained .grad, once
    ASSERT_TRUE(close(lin->weight.grad(), twin->weight.grad(), 1e-5, 1e-6)) << "call " << i;
    ASSERT_EQ(*hook.calls, *twin_hook.calls) << "call " << i;
  }
  EXPECT_GE(ca.stats().verified, 2);
}

// tcap::compile: eager's gradients are taken with torch::autograd::grad on the primals and
// handed on to them; a parameter's own hook runs once, when they reach it.
TEST(VerifyMode, ParameterHooksOfAVerifiedFunction) {
  torch::manual_seed(6);
  nn::Linear lin(4, 3), twin(4, 3);
  tcap::testing::copy_parameters(*lin, *twin);
  CountingHook hook(3.0), twin_hook(3.0);
  lin->weight.register_hook(hook);
  twin->weight.register_hook(twin_hook);
  auto f = tcap::compile(lin);
  for (int i = 0; i < 6; ++i) {
    tcap::StanceGuard verifying(tcap::Stance::Default, true, i >= 2 ? std::optional(kEveryReplay) : std::nullopt);
    auto x = torch::randn({5, 4});
    lin->zero_grad();
    twin->zero_grad();
    torch::sigmoid(f->forward(x)).sum().backward();
    {
      tcap::StanceGuard eager(tcap::Stance::ForceEager);
      torch::sigmoid(twin->forward(x)).sum().backward();
    }
    ASSERT_TRUE(close(lin->weight.grad(), twin->weight.grad(), 1e-5, 1e-6)) << "call " << i;
    ASSERT_TRUE(close(lin->bias.grad(), twin->bias.grad(), 1e-5, 1e-6)) << "call " << i;
    ASSERT_EQ(*hook.calls, *twin_hook.calls) << "call " << i;
  }
  EXPECT_GE(f->stats().verified, 3);
}

// A double backward (gradient penalty) of a compiled function is verified: its first
// gradient is compared, and the second differentiation runs through eager's graph.
TEST(VerifyMode, DoubleBackwardsAreCompared) {
  for (const auto& backend : {std::string("eager"), std::string("llvm")}) {
    SCOPED_TRACE(backend);
    torch::manual_seed(7);
    nn::Sequential seq(nn::Linear(4, 5), nn::Tanh(), nn::Linear(5, 3)), twin(nn::Linear(4, 5), nn::Tanh(), nn::Linear(5, 3));
    tcap::testing::copy_parameters(*seq, *twin);
    tcap::CompileOptions o;
    o.backend = backend;
    auto f = tcap::compile(seq.ptr(), [&](const Tensors& in) { return Tensors{seq->forward(in[0])}; }, o);
    tcap::testing::LogCapture log("verify");
    auto penalty = [](const at::Tensor& out, const at::Tensor& x) {
      auto gx = torch::autograd::grad({out.pow(2).sum()}, {x}, {}, true, true)[0];
      return gx.pow(2).sum();
    };
    for (int i = 0; i < 3; ++i) f(torch::randn({3, 4}, torch::requires_grad()))[0].sum().backward();  // compiled
    for (int i = 0; i < 4; ++i) {
      // A double backward recomputes, which is a logged fallback of the compiled backward.
      tcap::StanceGuard verifying(tcap::Stance::Default, false, kEveryReplay);
      auto x = torch::randn({3, 4}, torch::requires_grad());
      seq->zero_grad();
      twin->zero_grad();
      penalty(f(x)[0], x).backward();
      {
        tcap::StanceGuard eager(tcap::Stance::ForceEager);
        auto x2 = x.detach().requires_grad_(true);
        penalty(twin->forward(x2), x2).backward();
      }
      auto ps = seq->parameters(), qs = twin->parameters();
      for (size_t k = 0; k < ps.size(); ++k) {
        ASSERT_TRUE(close(ps[k].grad(), qs[k].grad(), 1e-4, 1e-5)) << "call " << i << ", parameter " << k;
      }
    }
    EXPECT_GE(f->stats().verified, 4);
    EXPECT_GE(log.count("'s backward matched eager"), 4) << log.text();  // the create_graph backwards
  }
}

}  // namespace
