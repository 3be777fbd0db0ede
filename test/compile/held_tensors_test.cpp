// Tensors a compiled function reads from outside its inputs (Note [Held tensors]): a
// lambda capturing by reference, an in-place change, a module member that is not a
// registered parameter or buffer. Every call must give eager's answer, and replays must
// really be used where nothing changed.
//
// Tolerances (float32): rtol 1e-5, atol 1e-6 (the same kernels as eager).
#include <tcap/compile.h>
#include <tcap/train_step.h>

#include "support/compare.h"
#include "support/log_capture.h"

#include <torch/torch.h>

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;

namespace {

// The user's variable is rebound to a new tensor: replays must read the new one.
TEST(HeldTensors, ReboundClosureIsSeen) {
  at::Tensor scale = torch::randn({5, 7});
  auto f = tcap::compile([&](const Tensors& in) { return Tensors{in[0] * scale + 1}; });
  for (int call = 0; call < 6; ++call) {
    if (call == 3) scale = torch::randn({5, 7});  // rebound, the old tensor is dropped
    auto x = torch::randn({5, 7});
    EXPECT_TRUE(close((*f)({x})[0], x * scale + 1)) << "call " << call;
  }
  EXPECT_GE(f->stats().replays, 3) << "the compiled entries were not used";
  EXPECT_EQ(f->stats().captures, 2) << "the rebinding should recapture exactly once";
}

// Rebound while a compiled region still waits for its backward: tcap's own reference to
// the old tensor (kept for that backward) must not count as the program's.
TEST(HeldTensors, ReboundClosureWithPendingBackward) {
  at::Tensor scale = torch::randn({4, 3});
  auto f = tcap::compile([&](const Tensors& in) { return Tensors{in[0] * scale}; });
  auto warm = torch::randn({4, 3}, torch::requires_grad());
  (*f)({warm})[0].sum().backward();  // capture completed
  auto x = torch::randn({4, 3}, torch::requires_grad());
  auto y = (*f)({x})[0];  // replayed: its backward is pending and holds the old scale
  const at::Tensor old_scale = scale.clone();
  scale = torch::randn({4, 3});
  auto x2 = torch::randn({4, 3}, torch::requires_grad());
  auto y2 = (*f)({x2})[0];
  EXPECT_TRUE(close(y2, x2 * scale)) << "a replay used the replaced tensor";
  y.sum().backward();
  EXPECT_TRUE(close(x.grad(), old_scale)) << "the pending backward must use the tensor of its own forward";
}

// The closure tensor is changed in place: replays read its current contents.
TEST(HeldTensors, InPlaceChangeIsSeen) {
  at::Tensor bias = torch::randn({6});
  auto f = tcap::compile([&](const Tensors& in) { return Tensors{torch::relu(in[0] + bias)}; });
  for (int call = 0; call < 6; ++call) {
    bias.mul_(1.5).add_(0.25);
    auto x = torch::randn({3, 6});
    EXPECT_TRUE(close((*f)({x})[0], torch::relu(x + bias))) << "call " << call;
  }
  EXPECT_EQ(f->stats().captures, 1);
  EXPECT_GE(f->stats().replays, 4);
}

// A tensor member that is not registered is read through the module: replacing it is seen.
struct MaskedLinearImpl : torch::nn::Module {
  MaskedLinearImpl() {
    fc = register_module("fc", torch::nn::Linear(8, 4));
    mask = torch::bernoulli(torch::full({4}, 0.5));
  }
  at::Tensor forward(const at::Tensor& x) { return fc(x) * mask; }
  torch::nn::Linear fc{nullptr};
  at::Tensor mask;  // not registered
};
TORCH_MODULE(MaskedLinear);

TEST(HeldTensors, UnregisteredModuleMemberIsSeen) {
  MaskedLinear m;
  auto f = tcap::compile(m);
  for (int call = 0; call < 8; ++call) {
    if (call == 4) m->mask = torch::randn({4});
    auto x = torch::randn({2, 8}, torch::requires_grad());
    auto out = f->forward(x);
    out.sum().backward();
    auto gx = x.grad().clone();
    x.mutable_grad().reset();
    auto ref = m->forward(x);
    ref.sum().backward();
    EXPECT_TRUE(close(out, ref)) << "call " << call;
    EXPECT_TRUE(close(gx, x.grad())) << "call " << call;
  }
  EXPECT_GE(f->stats().replays, 4);
}

// The rebinding is logged as the recompile's reason.
TEST(HeldTensors, RecompileSaysWhy) {
  tcap::testing::LogCapture log("recompiles");
  at::Tensor scale = torch::randn({3});
  auto f = tcap::compile([&](const Tensors& in) { return Tensors{in[0] * scale}; });
  (*f)({torch::randn({3})});
  scale = torch::randn({3});
  (*f)({torch::randn({3})});
  EXPECT_GE(log.count("the tensor 'const0' it read from outside its inputs"), 1) << log.text();
}

// compile_step: a label tensor made outside the step is held, not refused.
TEST(HeldTensors, StepReadsOutsideTensors) {
  torch::manual_seed(0);
  torch::nn::Linear model(6, 3), twin(6, 3);
  {
    torch::NoGradGuard g;
    twin->weight.copy_(model->weight);
    twin->bias.copy_(model->bias);
  }
  torch::optim::SGD opt(model->parameters(), 0.1), opt_twin(twin->parameters(), 0.1);
  at::Tensor target = torch::randn({5, 3});
  auto body = [&](torch::nn::Linear& m, torch::optim::SGD& o, const at::Tensor& x) {
    o.zero_grad();
    auto loss = torch::mse_loss(m(x), target);
    loss.backward();
    o.step();
    return loss;
  };
  auto step = tcap::compile_step(model, opt, [&](const Tensors& in) { return Tensors{body(model, opt, in[0])}; });
  for (int i = 0; i < 10; ++i) {
    if (i == 6) target = torch::randn({5, 3});
    auto x = torch::randn({5, 6});
    auto loss = (*step)({x})[0];
    auto ref = body(twin, opt_twin, x);
    EXPECT_TRUE(close(loss, ref, 1e-5, 1e-6)) << "step " << i;
  }
  EXPECT_TRUE(close(model->weight, twin->weight, 1e-5, 1e-6));
  EXPECT_EQ(step->eager_reason(), "");
  EXPECT_GE(step->stats().replays, 4);
}

// Inputs that share memory are part of the guards, for functions with many inputs too
// (the check sorts the memories of the inputs instead of comparing every pair): an
// in-place update of one input seen through another must give eager's answer.
TEST(HeldTensors, AliasedInputsAmongManyRecompile) {
  constexpr int kInputs = 40;
  auto body = [](const Tensors& in) {
    at::Tensor a = in[0].clone();
    in[0].mul_(2);  // seen through in[39] when the two share memory
    return Tensors{a + in[kInputs - 1] + in[kInputs / 2]};
  };
  auto f = tcap::compile(body);
  auto inputs = [](bool alias_last, bool alias_view) {
    Tensors in;
    for (int k = 0; k < kInputs; ++k) in.push_back(torch::randn({6}));
    if (alias_last) in[kInputs - 1] = in[0];
    if (alias_view) in[kInputs - 1] = in[0].view({2, 3}).view({6});
    return in;
  };
  for (int call = 0; call < 8; ++call) {
    const bool alias_last = call == 4 || call == 6, alias_view = call == 5;
    Tensors in = inputs(alias_last, alias_view), ref_in;
    for (const auto& t : in) ref_in.push_back(t.clone());
    if (alias_last || alias_view) ref_in[kInputs - 1] = ref_in[0].view({6});
    auto out = (*f)(in)[0];
    auto ref = body(ref_in)[0];
    EXPECT_TRUE(close(out, ref)) << "call " << call;
    EXPECT_TRUE(close(in[0], ref_in[0])) << "in-place update, call " << call;
  }
  EXPECT_GE(f->stats().replays, 4);
  EXPECT_GE(f->stats().captures, 2) << "aliasing inputs must recapture";
}

}  // namespace
