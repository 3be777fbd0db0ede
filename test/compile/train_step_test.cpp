// Whole training steps compiled with tcap::compile_step: the CNN trained 20 steps with
// SGD (momentum) and with Adam, compiled vs an eager twin from the same initial weights:
// losses each step, parameters, .grad tensors, BatchNorm buffers and optimizer state
// (momentum buffers, exp_avg, exp_avg_sq, step counts) must match.
//
// Tolerances (float32): rtol 1e-4, atol 1e-5 after 20 steps (same kernels, same order;
// the slack covers mkldnn convolution reductions).
#include <tcap/stance.h>
#include <tcap/train_step.h>

#include "support/compare.h"
#include "support/models.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

using tcap::testing::close;
namespace nn = torch::nn;

namespace {

constexpr double kStepRtol = 1e-4;
constexpr double kStepAtol = 1e-5;

using Cnn = tcap::testing::SmallCnn;

template <class Opt>
void compare_state(Opt& a, Opt& b, const std::vector<at::Tensor>& pa, const std::vector<at::Tensor>& pb);

template <>
void compare_state(torch::optim::SGD& a, torch::optim::SGD& b, const std::vector<at::Tensor>& pa,
                   const std::vector<at::Tensor>& pb) {
  for (size_t j = 0; j < pa.size(); ++j) {
    auto& sa = static_cast<torch::optim::SGDParamState&>(*a.state().at(pa[j].unsafeGetTensorImpl()));
    auto& sb = static_cast<torch::optim::SGDParamState&>(*b.state().at(pb[j].unsafeGetTensorImpl()));
    EXPECT_TRUE(close(sa.momentum_buffer(), sb.momentum_buffer(), kStepRtol, kStepAtol)) << "momentum of param " << j;
  }
}

template <>
void compare_state(torch::optim::Adam& a, torch::optim::Adam& b, const std::vector<at::Tensor>& pa,
                   const std::vector<at::Tensor>& pb) {
  for (size_t j = 0; j < pa.size(); ++j) {
    auto& sa = static_cast<torch::optim::AdamParamState&>(*a.state().at(pa[j].unsafeGetTensorImpl()));
    auto& sb = static_cast<torch::optim::AdamParamState&>(*b.state().at(pb[j].unsafeGetTensorImpl()));
    EXPECT_EQ(sa.step(), sb.step());
    EXPECT_TRUE(close(sa.exp_avg(), sb.exp_avg(), kStepRtol, kStepAtol)) << "exp_avg of param " << j;
    EXPECT_TRUE(close(sa.exp_avg_sq(), sb.exp_avg_sq(), kStepRtol, kStepAtol)) << "exp_avg_sq of param " << j;
  }
}

template <class Opt, class Options>
void train(Options opts, bool zero_to_none) {
  torch::manual_seed(0);
  Cnn model, twin;
  tcap::testing::copy_parameters(*model, *twin);
  Opt opt(model->parameters(), opts), opt_twin(twin->parameters(), opts);
  auto body = [&](Cnn& m, Opt& o, const at::Tensor& x, const at::Tensor& y) {
    o.zero_grad(zero_to_none);
    auto loss = torch::mse_loss(m->forward(x), y);
    loss.backward();
    o.step();
    return loss;
  };
  auto step = tcap::compile_step(model, opt, [&](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{body(model, opt, in[0], in[1])};
  });
  for (int i = 0; i < 20; ++i) {
    auto x = torch::randn({6, 3, 8, 8});
    auto y = torch::randn({6, 5});
    auto loss = (*step)({x, y})[0];
    auto loss_twin = body(twin, opt_twin, x, y);
    EXPECT_TRUE(close(loss, loss_twin, kStepRtol, kStepAtol)) << "step " << i;
  }
  EXPECT_EQ(step->eager_reason(), "");
  EXPECT_GE(step->stats().replays, 16) << "the compiled step was not used";
  ASSERT_NE(step->graph(), nullptr);
  auto a = model->named_parameters(), b = twin->named_parameters();
  for (const auto& item : a) {
    EXPECT_TRUE(close(item.value(), b[item.key()], kStepRtol, kStepAtol)) << item.key();
    EXPECT_TRUE(close(item.value().grad(), b[item.key()].grad(), kStepRtol, kStepAtol)) << item.key() << ".grad";
  }
  auto ab = model->named_buffers(), bb = twin->named_buffers();
  for (const auto& item : ab) EXPECT_TRUE(close(item.value(), bb[item.key()], kStepRtol, kStepAtol)) << item.key();
  compare_state(opt, opt_twin, model->parameters(), twin->parameters());
}

TEST(TrainStep, CnnSgdMomentum) { train<torch::optim::SGD>(torch::optim::SGDOptions(0.05).momentum(0.9), true); }

TEST(TrainStep, CnnSgdMomentumZeroGradInPlace) {
  train<torch::optim::SGD>(torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).dampening(0), false);
}

TEST(TrainStep, CnnAdam) { train<torch::optim::Adam>(torch::optim::AdamOptions(1e-2), true); }

TEST(TrainStep, CnnAdamWeightDecay) {
  train<torch::optim::Adam>(torch::optim::AdamOptions(1e-2).weight_decay(1e-3), true);
}

// The step returns a loss that is the sum of two losses. backward() runs through its
// AddBackward0, which runs no op (it passes the gradient on), so no recorded op names it;
// the step must still count its backward as used and be compiled.
TEST(TrainStep, ReturnsASumOfLosses) {
  torch::manual_seed(6);
  nn::Linear model(5, 2), twin(5, 2);
  {
    torch::NoGradGuard no_grad;
    twin->weight.copy_(model->weight);
    twin->bias.copy_(model->bias);
  }
  torch::optim::SGD opt(model->parameters(), 0.1), opt_twin(twin->parameters(), 0.1);
  auto body = [](nn::Linear& m, torch::optim::SGD& o, const at::Tensor& a, const at::Tensor& b) {
    o.zero_grad();
    auto loss = m->forward(a).pow(2).mean() + m->forward(b).abs().mean();
    loss.backward();
    o.step();
    return loss;
  };
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  auto step = tcap::compile_step(model, opt, [&](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{body(model, opt, in[0], in[1])};
  });
  for (int i = 0; i < 8; ++i) {
    auto a = torch::randn({7, 5});
    auto b = torch::randn({7, 5});
    EXPECT_TRUE(close((*step)({a, b})[0], body(twin, opt_twin, a, b), kStepRtol, kStepAtol)) << "step " << i;
  }
  EXPECT_GE(step->stats().replays, 5);
}

// A post-accumulate-grad hook that does not record its work (Note [Recorded
// post-accumulate-grad hooks]) would be skipped by a replay, which never runs
// AccumulateGrad: the step runs eagerly, says why, and the hook runs every step.
struct CountingHook : torch::autograd::PostAccumulateGradHook {
  explicit CountingHook(int* calls) : calls(calls) {}
  void operator()(const torch::autograd::Variable&) override { ++*calls; }
  int* calls;
};

TEST(TrainStep, PostAccumulateGradHookRunsEagerlyWithReason) {
  torch::manual_seed(7);
  nn::Linear model(5, 2);
  int calls = 0;
  torch::autograd::impl::set_post_acc_grad_hooks(model->weight, std::make_unique<CountingHook>(&calls));
  torch::optim::SGD opt(model->parameters(), 0.1);
  auto step = tcap::compile_step(model, opt, [&](const std::vector<at::Tensor>& in) {
    opt.zero_grad();
    auto loss = model->forward(in[0]).pow(2).mean();
    loss.backward();
    opt.step();
    return std::vector<at::Tensor>{loss};
  });
  for (int i = 0; i < 5; ++i) (*step)({torch::randn({3, 5})});
  EXPECT_EQ(calls, 5);
  EXPECT_EQ(step->stats().replays, 0);
  EXPECT_NE(step->eager_reason().find("parameter weight has a post-accumulate-grad hook"), std::string::npos)
      << step->eager_reason();
  torch::autograd::impl::post_acc_grad_hooks(model->weight).reset();
}

}  // namespace
