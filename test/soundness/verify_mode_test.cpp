// Verify mode must not cry wolf or crash on programs that keep the contract (docs/compile.md,
// "Verify mode"): chained calls of one compiled function, sparse gradients, a step whose
// input is a stride-0 (expanded) tensor. Each program runs under TCAP_VERIFY-style
// verification of every replay, which must report nothing and give eager's results.
#include <tcap/compile.h>
#include <tcap/stance.h>
#include <tcap/train_step.h>

#include "support/compare.h"
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

}  // namespace
