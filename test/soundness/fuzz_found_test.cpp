// Divergences the divergence fuzzer found (test/fuzz/divergence.cpp, docs/reliability.md),
// each kept as a regression test: the smallest program that showed it, compiled and on an
// eager twin, compared after every call.
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/train_step.h>

#include "support/compare.h"
#include "support/models.h"

#include <torch/torch.h>

#include <string>

namespace {

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;
namespace nn = torch::nn;


nn::Sequential bn_then_attention() {
  return nn::Sequential(nn::Linear(12, 6), nn::BatchNorm1d(6), tcap::testing::BatchAttention(6), nn::Linear(6, 2));
}

void expect_same_state(nn::Module& a, nn::Module& b, const std::string& when) {
  auto ba = a.named_buffers(), bb = b.named_buffers();
  for (size_t k = 0; k < ba.size(); ++k) {
    EXPECT_TRUE(close(ba[k].value(), bb[k].value(), 1e-4, 1e-5)) << ba[k].key() << ", " << when;
  }
  auto pa = a.named_parameters(), pb = b.named_parameters();
  for (size_t k = 0; k < pa.size(); ++k) {
    EXPECT_TRUE(close(pa[k].value(), pb[k].value(), 1e-4, 1e-5)) << pa[k].key() << ", " << when;
    if (pa[k].value().grad().defined()) {
      EXPECT_TRUE(close(pa[k].value().grad(), pb[k].value().grad(), 1e-4, 1e-5)) << pa[k].key() << ".grad, " << when;
    }
  }
}

// A training BatchNorm before a value read on the host (the read's guard graph, run before
// each replay, ran the batch norm too and updated the running statistics a second time:
// running_mean off by the momentum times the batch mean on every call, outputs equal).
TEST(FuzzFound, BatchNormBeforeAHostReadUpdatesItsStatisticsOnce) {
  for (const auto& backend : {std::string("eager"), std::string("llvm")}) {
    SCOPED_TRACE(backend);
    torch::manual_seed(1);
    auto model = bn_then_attention(), twin = bn_then_attention();
    tcap::testing::copy_parameters(*model, *twin);
    tcap::CompileOptions o;
    o.backend = backend;
    auto m = model.ptr();
    auto f = tcap::compile(m, [m](const Tensors& in) { return Tensors{m->forward(in[0])}; }, o);
    for (int i = 0; i < 5; ++i) {
      auto x = torch::randn({5, 12});
      model->zero_grad();
      twin->zero_grad();
      auto got = f(x)[0];
      got.pow(2).sum().backward();
      auto want = twin->forward(x);
      want.pow(2).sum().backward();
      ASSERT_TRUE(close(got, want, 1e-4, 1e-5)) << "call " << i;
      expect_same_state(*model, *twin, "call " + std::to_string(i));
    }
    EXPECT_GE(f->stats().replays, 3);
  }
}

// The same in a compiled training step.
TEST(FuzzFound, BatchNormBeforeAHostReadInAStep) {
  for (const auto& backend : {std::string("eager"), std::string("llvm")}) {
    SCOPED_TRACE(backend);
    torch::manual_seed(2);
    auto model = bn_then_attention(), twin = bn_then_attention();
    tcap::testing::copy_parameters(*model, *twin);
    torch::optim::SGD opt(model->parameters(), 0.05), twin_opt(twin->parameters(), 0.05);
    auto body = [](nn::Sequential m, torch::optim::Optimizer& o) {
      return [m, &o](const Tensors& in) mutable {
        o.zero_grad();
        auto loss = torch::mse_loss(m->forward(in[0]), in[1]);
        loss.backward();
        o.step();
        return Tensors{loss};
      };
    };
    tcap::CompileOptions opts;
    opts.backend = backend;
    auto step = tcap::compile_step(model.ptr(), opt, body(model, opt), opts);
    auto eager = body(twin, twin_opt);
    for (int i = 0; i < 6; ++i) {
      auto x = torch::randn({5, 12}), y = torch::randn({5, 2});
      auto got = (*step)({x, y})[0];
      auto want = eager({x, y})[0];
      ASSERT_TRUE(close(got, want, 1e-4, 1e-5)) << "step " << i;
      expect_same_state(*model, *twin, "step " + std::to_string(i));
    }
    EXPECT_GE(step->stats().replays, 2);
  }
}

// Dropout before a loss over a boolean mask in a compiled step (seed 12, program 91): a
// replay at a mask of another count stops at the masked index, after the dropout drew its
// random numbers; the call then ran another way on the generator the stopped replay had
// advanced, so it dropped other elements than eager. A stopped replay of a step now puts
// the generators back, as tcap::compile's does.
TEST(FuzzFound, DropoutBeforeAMaskedLossInAStep) {
  for (const auto& backend : {std::string("eager"), std::string("llvm")}) {
    SCOPED_TRACE(backend);
    torch::manual_seed(3);
    auto make = [] { return nn::Sequential(nn::Linear(4, 9), nn::Dropout(0.25), nn::GELU(), nn::Linear(9, 4)); };
    auto model = make(), twin = make();
    tcap::testing::copy_parameters(*model, *twin);
    torch::optim::Adam opt(model->parameters(), 1e-2), twin_opt(twin->parameters(), 1e-2);
    auto body = [](nn::Sequential m, torch::optim::Optimizer& o) {
      return [m, &o](const Tensors& in) mutable {
        o.zero_grad();
        auto out = m->forward(in[0]);
        auto loss = torch::nn::functional::cross_entropy(out.index({in[2]}), in[1].index({in[2]}));
        loss.backward();
        o.step();
        return Tensors{loss};
      };
    };
    tcap::CompileOptions opts;
    opts.backend = backend;
    auto step = tcap::compile_step(model.ptr(), opt, body(model, opt), opts);
    auto eager = body(twin, twin_opt);
    const auto mask = torch::tensor(std::vector<int64_t>{1, 0, 1, 1, 0, 1}).to(torch::kBool);
    const auto other = torch::tensor(std::vector<int64_t>{1, 1, 0, 1, 1, 1}).to(torch::kBool);
    for (int i = 0; i < 8; ++i) {
      auto x = torch::randn({6, 4});
      auto y = torch::randint(4, {6});
      const auto& m = (i == 4 || i == 6) ? other : mask;
      torch::manual_seed(100 + i);
      auto got = (*step)({x, y, m})[0];
      torch::manual_seed(100 + i);
      auto want = eager({x, y, m})[0];
      ASSERT_TRUE(close(got, want, 1e-4, 1e-5)) << "step " << i;
      expect_same_state(*model, *twin, "step " + std::to_string(i));
    }
    EXPECT_GE(step->stats().replays, 3);
  }
}

}  // namespace

namespace {

// A Conv1d, flatten, two in-place Dropouts, SiLU and a Linear: seed 53's programs.
nn::Sequential conv_then_inplace_dropouts() {
  return nn::Sequential(nn::Conv1d(nn::Conv1dOptions(4, 4, 3).padding(1)), nn::Flatten(),
                        nn::Dropout(nn::DropoutOptions(0.25).inplace(true)),
                        nn::Dropout(nn::DropoutOptions(0.25).inplace(true)), nn::SiLU(), nn::Linear(20, 5));
}

}  // namespace

// An in-place Dropout on a view of a convolution's output (flatten), under compiled
// autograd around an eager forward: the backward's CopySlices nodes write the gradient
// into a view of the buffer they return, and the graph kept only the buffer (the writes
// were cut as unused), so replays skipped the dropout masks (seed 53, program 2166).
TEST(FuzzFound, InPlaceDropoutOnAViewUnderCompiledAutograd) {
  for (const auto& backend : {std::string("eager"), std::string("llvm")}) {
    SCOPED_TRACE(backend);
    auto make = conv_then_inplace_dropouts;
    torch::manual_seed(2);
    auto model = make(), twin = make();
    tcap::testing::copy_parameters(*model, *twin);
    tcap::CompileOptions o;
    o.name = "inplace_dropout_" + backend;
    o.backend = backend;
    for (int i = 0; i < 4; ++i) {
      auto x = torch::randn({4, 4, 5});
      model->zero_grad();
      twin->zero_grad();
      torch::manual_seed(100 + i);
      auto got = model->forward(x);
      {
        tcap::CompiledAutogradGuard ca(o);
        got.pow(2).mean().backward();
      }
      torch::manual_seed(100 + i);
      auto want = twin->forward(x);
      want.pow(2).mean().backward();
      ASSERT_TRUE(close(got, want, 1e-5, 1e-6)) << "call " << i;
      expect_same_state(*model, *twin, "call " + std::to_string(i));
    }
    tcap::CompiledAutogradGuard ca(o);
    EXPECT_EQ(ca.stats().captures, 1);
    EXPECT_EQ(ca.stats().replays, 3) << "the backwards after the first were served compiled";
  }
  tcap::reset_compiled_autograd();
}

// The same model through tcap::compile (its backward cut out of the engine's, Note
// [Cutting a region's backward]) and through compile_step: every call equal to eager's.
TEST(FuzzFound, InPlaceDropoutOnAViewThroughCompileAndCompileStep) {
  for (const auto& backend : {std::string("eager"), std::string("llvm")}) {
    SCOPED_TRACE(backend);
    auto make = conv_then_inplace_dropouts;
    torch::manual_seed(2);
    auto model = make(), twin = make(), stepped = make(), stepped_twin = make();
    tcap::testing::copy_parameters(*model, *twin);
    tcap::testing::copy_parameters(*model, *stepped);
    tcap::testing::copy_parameters(*model, *stepped_twin);
    tcap::CompileOptions o;
    o.backend = backend;
    auto m = model.ptr();
    auto f = tcap::compile(m, [m](const Tensors& in) { return Tensors{m->forward(in[0])}; }, o);
    torch::optim::SGD opt(stepped->parameters(), 0.1), opt_twin(stepped_twin->parameters(), 0.1);
    auto body = [](nn::Sequential& s, torch::optim::SGD& op, const at::Tensor& x) {
      op.zero_grad();
      auto loss = s->forward(x).pow(2).mean();
      loss.backward();
      op.step();
      return loss;
    };
    auto step = tcap::compile_step(stepped, opt, [&](const Tensors& in) { return Tensors{body(stepped, opt, in[0])}; }, o);
    for (int i = 0; i < 5; ++i) {
      auto x = torch::randn({4, 4, 5});
      model->zero_grad();
      twin->zero_grad();
      torch::manual_seed(100 + i);
      auto got = f(x)[0];
      got.pow(2).mean().backward();
      torch::manual_seed(100 + i);
      auto want = twin->forward(x);
      want.pow(2).mean().backward();
      ASSERT_TRUE(close(got, want, 1e-5, 1e-6)) << "call " << i;
      expect_same_state(*model, *twin, "compile, call " + std::to_string(i));
      torch::manual_seed(200 + i);
      auto loss = (*step)({x})[0];
      torch::manual_seed(200 + i);
      auto loss_twin = body(stepped_twin, opt_twin, x);
      ASSERT_TRUE(close(loss, loss_twin, 1e-5, 1e-6)) << "step " << i;
      expect_same_state(*stepped, *stepped_twin, "step " + std::to_string(i));
    }
    EXPECT_GE(f->stats().replays, 3);
    EXPECT_GE(step->stats().replays, 2);
  }
}
