// Cross-entropy rewritten for kernels (Note [Cross-entropy at the bandwidth floor],
// fuse/decompose_losses.cpp; Note [Saving what fusion would not write], passes/min_cut.cpp):
// every front door against eager (loss and gradients) on odd sizes, ignored targets, both
// reductions, float64, class weights and label smoothing (kept as ATen calls or other
// ops), non-contiguous logits; an out-of-range target raises as eager does; and what the
// partitioner saves.
//
// Tolerances (vs eager on the same inputs): float32 rtol 1e-4 atol 1e-6 (sums over rows and
// columns are reassociated, exp/log from libmvec within a few ulp); float64 rtol 1e-9
// atol 1e-12.
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/train_step.h>

#include "codegen/cpu_llvm/cpu_llvm.h"
#include "support/compare.h"

#include <torch/torch.h>

#include <string>
#include <vector>

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;
namespace F = torch::nn::functional;

namespace cross_entropy_test {

struct Case {
  int64_t n, c;
  at::ScalarType dtype;
  std::string reduction;  // "mean" or "sum"
  double ignored;         // fraction of targets set to ignore_index
  bool transposed = false;
  double smoothing = 0.0;
  bool weighted = false;
};

std::string name(const Case& k) {
  return "[" + std::to_string(k.n) + ", " + std::to_string(k.c) + "] " + std::string(c10::toString(k.dtype)) + " " +
         k.reduction + (k.ignored > 0 ? " ignored" : "") + (k.transposed ? " transposed" : "") +
         (k.smoothing > 0 ? " smoothing" : "") + (k.weighted ? " weighted" : "");
}

F::CrossEntropyFuncOptions options_of(const Case& k, const at::Tensor& weight) {
  F::CrossEntropyFuncOptions o;
  o = o.reduction(k.reduction == "sum" ? F::CrossEntropyFuncOptions::reduction_t(torch::kSum)
                                      : F::CrossEntropyFuncOptions::reduction_t(torch::kMean));
  o = o.ignore_index(-100).label_smoothing(k.smoothing);
  if (k.weighted) o = o.weight(weight);
  return o;
}

at::Tensor targets(const Case& k) {
  at::Tensor t = torch::randint(0, k.c, {k.n}, torch::kLong);
  if (k.ignored > 0) t.masked_fill_(torch::rand({k.n}) < k.ignored, -100);
  return t;
}

at::Tensor logits(const Case& k) {
  if (k.transposed) return torch::randn({k.c, k.n}, k.dtype).t();
  return torch::randn({k.n, k.c}, k.dtype);
}

double rtol(at::ScalarType t) { return t == at::kDouble ? 1e-9 : 1e-4; }
double atol(at::ScalarType t) { return t == at::kDouble ? 1e-12 : 1e-6; }

std::vector<Case> cases() {
  return {
      {1, 1, at::kFloat, "mean", 0},       {1, 7, at::kFloat, "mean", 0},     {7, 13, at::kFloat, "mean", 0.3},
      {33, 1000, at::kFloat, "sum", 0.2},   {64, 4097, at::kFloat, "mean", 0}, {5, 17, at::kDouble, "mean", 0.4},
      {9, 31, at::kFloat, "mean", 0, true}, {6, 11, at::kFloat, "mean", 0.2, false, 0.1},
      {6, 11, at::kFloat, "mean", 0.2, false, 0.0, true},
      {4, 9, at::kFloat, "mean", 1.0},  // every target ignored: eager's loss is NaN (0 / 0)
  };
}

class CrossEntropy : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!tcap::Backend(tcap::Backend::Llvm).available()) GTEST_SKIP() << "LLVM backend not available";
  }
};


TEST_F(CrossEntropy, CompiledFunctionMatchesEager) {
  for (const Case& k : cases()) {
    SCOPED_TRACE(name(k));
    const at::Tensor w = torch::rand({k.c}, k.dtype) + 0.5;
    tcap::CompileOptions o;
    o.backend = tcap::Backend::Llvm;
    o.name = "ce";
    auto f = tcap::compile([&](const Tensors& in) { return Tensors{F::cross_entropy(in[0], in[1], options_of(k, w))}; }, o);
    for (int call = 0; call < 3; ++call) {
      at::Tensor x = logits(k).requires_grad_(), t = targets(k);
      at::Tensor expected = F::cross_entropy(x, t, options_of(k, w));
      expected.backward();
      at::Tensor gx = x.grad().clone();
      x.mutable_grad().reset();
      at::Tensor got = f({x, t})[0];
      got.backward();
      EXPECT_TRUE(close(got, expected, rtol(k.dtype), atol(k.dtype))) << "call " << call;
      EXPECT_TRUE(close(x.grad(), gx, rtol(k.dtype), atol(k.dtype))) << "call " << call;
    }
    EXPECT_GE(f->stats().replays, 1);
  }
}

// A Linear before the loss: its logits are written by the matmul anyway, so the partitioner
// saves them and two numbers per row, not log-probabilities of the logits' size; with the
// logits a primal it saves the log-probabilities (Note [Recomputing from primals]).
TEST_F(CrossEntropy, AfterALinearTheLogProbabilitiesAreNotSaved) {
  torch::manual_seed(0);
  torch::nn::Linear lin(24, 301);
  tcap::CompileOptions o;
  o.backend = tcap::Backend::Llvm;
  o.name = "linear_ce";
  auto f = tcap::compile(lin.ptr(), [&](const Tensors& in) { return Tensors{F::cross_entropy(lin->forward(in[0]), in[1])}; }, o);
  for (int call = 0; call < 3; ++call) {
    at::Tensor x = torch::randn({37, 24});
    Case k{37, 301, at::kFloat, "mean", 0.25};
    at::Tensor t = targets(k);
    lin->zero_grad();
    at::Tensor expected = F::cross_entropy(lin->forward(x), t);
    expected.backward();
    at::Tensor gw = lin->weight.grad().clone(), gb = lin->bias.grad().clone();
    lin->zero_grad();
    at::Tensor got = f({x, t})[0];
    got.backward();
    EXPECT_TRUE(close(got, expected, 1e-4, 1e-6));
    EXPECT_TRUE(close(lin->weight.grad(), gw, 1e-4, 1e-6));
    EXPECT_TRUE(close(lin->bias.grad(), gb, 1e-4, 1e-6));
  }
  const auto entries = f->entries();
  ASSERT_FALSE(entries.empty());
  const auto& part = entries[0].partition;
  int full = 0;
  for (const auto& v : part.forward.output_values()) {
    const auto& m = part.forward.value(v).meta;
    if (m.sizes.size() == 2 && m.sizes[0] == 37 && m.sizes[1] == 301) {
      ++full;
      const auto& producer = part.forward.node(part.forward.value(v).producer);
      EXPECT_EQ(producer.op, "aten::addmm") << part.explain();
    }
  }
  EXPECT_EQ(full, 1) << part.explain();
}

TEST_F(CrossEntropy, AnOutOfRangeTargetRaisesAsInEager) {
  tcap::CompileOptions o;
  o.backend = tcap::Backend::Llvm;
  o.name = "ce_range";
  auto f = tcap::compile([](const Tensors& in) { return Tensors{F::cross_entropy(in[0], in[1])}; }, o);
  for (int call = 0; call < 3; ++call) f({torch::randn({8, 5}, torch::requires_grad()), torch::randint(0, 5, {8})})[0].backward();
  ASSERT_GE(f->stats().replays, 1);
  at::Tensor bad = torch::randint(0, 5, {8});
  bad[3] = 5;
  EXPECT_ANY_THROW(F::cross_entropy(torch::randn({8, 5}), bad));
  EXPECT_ANY_THROW(f({torch::randn({8, 5}, torch::requires_grad()), bad}));
  bad[3] = -3;
  EXPECT_ANY_THROW(f({torch::randn({8, 5}, torch::requires_grad()), bad}));
}

TEST_F(CrossEntropy, StepMatchesEager) {
  for (const std::string reduction : {"mean", "sum"}) {
    SCOPED_TRACE(reduction);
    Case k{19, 57, at::kFloat, reduction, 0.2};
    auto make = [] {
      torch::manual_seed(1);
      return torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::GELU(), torch::nn::Linear(32, 57));
    };
    auto eager = make(), compiled = make();
    torch::optim::SGD eager_opt(eager->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    torch::optim::SGD opt(compiled->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    auto body = [&](torch::nn::Sequential& m, torch::optim::Optimizer& o, const Tensors& in) {
      o.zero_grad();
      at::Tensor loss = F::cross_entropy(m->forward(in[0]), in[1], options_of(k, at::Tensor()));
      loss.backward();
      o.step();
      return Tensors{loss.detach()};
    };
    tcap::CompileOptions co;
    co.backend = tcap::Backend::Llvm;
    co.name = "ce_step";
    auto step = tcap::compile_step(compiled, opt, [&](const Tensors& in) { return body(compiled, opt, in); }, co);
    for (int s = 0; s < 6; ++s) {
      Tensors in{torch::randn({19, 16}), targets(k)};
      at::Tensor expected = body(eager, eager_opt, in)[0];
      at::Tensor got = (*step)(in)[0];
      EXPECT_TRUE(close(got, expected, 1e-4, 1e-6)) << "step " << s;
      auto pe = eager->parameters(), pc = compiled->parameters();
      for (size_t i = 0; i < pe.size(); ++i) EXPECT_TRUE(close(pc[i], pe[i], 1e-4, 1e-6)) << "step " << s << " param " << i;
    }
    EXPECT_GE(step->stats().replays, 1);
  }
}

TEST_F(CrossEntropy, CompiledAutogradMatchesEager) {
  int index = 0;
  for (const Case& k : cases()) {
    SCOPED_TRACE(name(k));
    tcap::CompileOptions o;  // a cache per case: each is another graph
    o.backend = tcap::Backend::Llvm;
    o.name = "ce_ca_" + std::to_string(index++);
    int replays = 0;
    const at::Tensor w = torch::rand({k.c}, k.dtype) + 0.5;
    for (int call = 0; call < 3; ++call) {
      at::Tensor x = logits(k).requires_grad_(), t = targets(k);
      F::cross_entropy(x, t, options_of(k, w)).backward();
      at::Tensor gx = x.grad().clone();
      x.mutable_grad().reset();
      {
        tcap::CompiledAutogradGuard ca(o);
        F::cross_entropy(x, t, options_of(k, w)).backward();
        replays = ca.stats().replays;
      }
      EXPECT_TRUE(close(x.grad(), gx, rtol(k.dtype), atol(k.dtype))) << "call " << call;
    }
    EXPECT_GE(replays, 1);
  }
}

}  // namespace cross_entropy_test
