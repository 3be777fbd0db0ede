// Optimizer updates and other in-place chains as kernels (Note [In-place updates as
// kernels], fuse/functionalize.cpp; Note [Fused results written in place], fuse/fusion.cpp;
// Note [Fused multiply-add], fuse/lowering.cpp).
//
// The optimizer cases take the loss sum(p * x) per parameter, so every gradient is x
// itself, exactly, in any backend: the update kernels must then give eager's bits (the
// same ops in the same order, multiply-adds rounded once as ATen's CPU kernels round them)
// except where eager's op is not the kernel's: LibTorch's CPU sqrt is MKL's vsSqrt, within
// 1 ulp of the correctly rounded one the kernels compute (float32 rtol 1e-5 atol 1e-6 after
// 7 steps; float64 rtol 1e-12 atol 1e-14). The functions' cases compare with eager at
// float32 rtol 1e-5 atol 1e-6, outputs and the written inputs (their sums are reduced in
// another order).
#include <tcap/compile.h>
#include <tcap/train_step.h>

#include "support/compare.h"
#include "support/log_capture.h"

#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fused_updates_test {

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;
namespace nn = torch::nn;
namespace optim = torch::optim;

class FusedUpdates : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!tcap::Backend(tcap::Backend::Llvm).available()) GTEST_SKIP() << "LLVM backend not available";
  }
};

// Parameters of odd shapes, and one of a single element.
struct Params : nn::Module {
  Params(at::ScalarType dtype, uint64_t seed) {
    torch::manual_seed(seed);
    const std::vector<std::vector<int64_t>> shapes{{33, 17}, {5}, {2, 3, 7}, {1}};
    for (size_t i = 0; i < shapes.size(); ++i) {
      ps.push_back(register_parameter("p" + std::to_string(i), torch::randn(shapes[i], dtype)));
    }
  }
  std::vector<at::Tensor> ps;
};

using MakeOpt = std::function<std::unique_ptr<optim::Optimizer>(std::vector<at::Tensor>)>;

struct OptCase {
  std::string name;
  MakeOpt make;
  int in_place;  // writes into a parameter or its state made by kernels, per parameter
};

std::vector<OptCase> optimizer_cases() {
  using P = std::vector<at::Tensor>;
  return {
      {"sgd_momentum", [](P p) { return std::make_unique<optim::SGD>(p, optim::SGDOptions(0.1).momentum(0.9)); }, 2},
      {"sgd_nesterov_decay",
       [](P p) {
         return std::make_unique<optim::SGD>(
             p, optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01));
       },
       2},
      {"sgd_dampening",
       [](P p) { return std::make_unique<optim::SGD>(p, optim::SGDOptions(0.05).momentum(0.5).dampening(0.3)); }, 2},
      {"adam", [](P p) { return std::make_unique<optim::Adam>(p, optim::AdamOptions(1e-2)); }, 3},
      {"adam_decay", [](P p) { return std::make_unique<optim::Adam>(p, optim::AdamOptions(1e-2).weight_decay(0.1)); }, 3},
      {"adamw", [](P p) { return std::make_unique<optim::AdamW>(p, optim::AdamWOptions(1e-2).weight_decay(0.05)); }, 3},
      {"adam_amsgrad", [](P p) { return std::make_unique<optim::Adam>(p, optim::AdamOptions(1e-2).amsgrad(true)); }, 4},
      {"adamw_amsgrad",
       [](P p) { return std::make_unique<optim::AdamW>(p, optim::AdamWOptions(1e-2).weight_decay(0.05).amsgrad(true)); },
       4},
      {"rmsprop", [](P p) { return std::make_unique<optim::RMSprop>(p, optim::RMSpropOptions(1e-2)); }, 2},
      {"rmsprop_centered_momentum",
       [](P p) { return std::make_unique<optim::RMSprop>(p, optim::RMSpropOptions(1e-2).centered(true).momentum(0.5)); },
       4},
      {"adagrad", [](P p) { return std::make_unique<optim::Adagrad>(p, optim::AdagradOptions(0.1).lr_decay(0.01)); }, 2},
  };
}

// One step: every gradient is x itself (d/dp sum(p * x) = x, exactly).
Tensors step_body(optim::Optimizer& opt, const std::vector<at::Tensor>& ps, const Tensors& xs) {
  opt.zero_grad();
  at::Tensor loss = (ps[0] * xs[0]).sum();
  for (size_t i = 1; i < ps.size(); ++i) loss = loss + (ps[i] * xs[i]).sum();
  loss.backward();
  opt.step();
  return {loss.detach()};
}

Tensors batch_for(const std::vector<at::Tensor>& ps) {
  Tensors xs;
  for (const auto& p : ps) xs.push_back(torch::randn(p.sizes(), p.options()));
  return xs;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Trains model and eager side by side for 7 steps; `check` compares after each step.
void run_steps(const OptCase& c, at::ScalarType dtype,
               const std::function<void(const Params&, const Params&, int)>& check) {
  SCOPED_TRACE(c.name + " " + c10::toString(dtype));
  auto eager = std::make_shared<Params>(dtype, 3), model = std::make_shared<Params>(dtype, 3);
  auto eager_opt = c.make(eager->parameters()), opt = c.make(model->parameters());
  tcap::CompileOptions o;
  o.backend = tcap::Backend::Llvm;
  o.name = "updates_" + c.name;
  tcap::testing::LogCapture log("fusion");
  auto step = tcap::compile_step(std::static_pointer_cast<nn::Module>(model), *opt,
                                 [&](const Tensors& in) { return step_body(*opt, model->ps, in); }, o);
  for (int s = 0; s < 7; ++s) {
    const Tensors xs = batch_for(model->ps);
    step_body(*eager_opt, eager->ps, xs);
    (*step)(xs);
    check(*model, *eager, s);
  }
  EXPECT_GE(step->stats().replays, 4);
  // Each parameter's update is one kernel writing the parameter and its state in place.
  EXPECT_EQ(count(log.text(), "written in place by"), c.in_place * static_cast<int>(model->ps.size())) << log.text();
}

// SGD's updates are multiplies and (fused) multiply-adds: eager's bits.
TEST_F(FusedUpdates, SgdStepsAreBitwiseEager) {
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    for (const OptCase& c : optimizer_cases()) {
      if (c.name.rfind("sgd", 0) != 0) continue;
      run_steps(c, dtype, [](const Params& model, const Params& eager, int s) {
        for (size_t i = 0; i < model.ps.size(); ++i) {
          ASSERT_TRUE(torch::equal(model.ps[i], eager.ps[i]))
              << "step " << s << " parameter " << i << ": max difference "
              << (model.ps[i] - eager.ps[i]).abs().max().item<double>();
        }
      });
    }
  }
}

// The optimizers with a square root agree with eager to rounding: LibTorch's CPU sqrt is
// MKL's vsSqrt (within 1 ulp, not correctly rounded), the kernels' the correctly rounded
// instruction (Note [Fused multiply-add]).
TEST_F(FusedUpdates, StepsWithASquareRootMatchEagerToRounding) {
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    for (const OptCase& c : optimizer_cases()) {
      if (c.name.rfind("sgd", 0) == 0) continue;
      run_steps(c, dtype, [dtype](const Params& model, const Params& eager, int s) {
        const double rtol = dtype == at::kDouble ? 1e-12 : 1e-5, atol = dtype == at::kDouble ? 1e-14 : 1e-6;
        for (size_t i = 0; i < model.ps.size(); ++i) {
          ASSERT_TRUE(close(model.ps[i], eager.ps[i], rtol, atol)) << "step " << s << " parameter " << i;
        }
      });
    }
  }
}

// Adam's update is otherwise eager's ops in eager's order: against LibTorch's Adam with
// the correctly rounded sqrt in place of vsSqrt, bitwise.
TEST_F(FusedUpdates, AdamIsEagersOpsWithACorrectlyRoundedSqrt) {
  auto model = std::make_shared<Params>(at::kFloat, 5);
  optim::Adam opt(model->parameters(), optim::AdamOptions(1e-2).weight_decay(0.1));
  tcap::CompileOptions o;
  o.backend = tcap::Backend::Llvm;
  auto step = tcap::compile_step(std::static_pointer_cast<nn::Module>(model), opt,
                                 [&](const Tensors& in) { return step_body(opt, model->ps, in); }, o);
  std::vector<at::Tensor> p, m, v;
  for (const auto& x : model->ps) {
    p.push_back(x.detach().clone());
    m.push_back(torch::zeros_like(x));
    v.push_back(torch::zeros_like(x));
  }
  for (int s = 1; s <= 7; ++s) {
    const Tensors xs = batch_for(model->ps);
    (*step)(xs);
    const double bc1 = 1 - std::pow(0.9, s), bc2 = 1 - std::pow(0.999, s);
    for (size_t i = 0; i < p.size(); ++i) {
      const at::Tensor g = xs[i].add(p[i], 0.1);  // weight decay, as LibTorch's Adam adds it
      m[i].mul_(0.9).add_(g, 1 - 0.9);
      v[i].mul_(0.999).addcmul_(g, g, 1 - 0.999);
      // A replay's kernel rounds sqrt correctly; a capture ran LibTorch's ops.
      const bool replayed = step->last_call().kind == tcap::CompiledStep::Call::Kind::Replayed;
      const at::Tensor root = replayed ? v[i].to(at::kDouble).sqrt().to(at::kFloat) : v[i].sqrt();
      const at::Tensor denom = (root / std::sqrt(bc2)).add_(1e-8);
      p[i].addcdiv_(m[i], denom, -1e-2 / bc1);
      ASSERT_TRUE(torch::equal(model->ps[i], p[i]))
          << "step " << s << " parameter " << i << ": max difference " << (model->ps[i] - p[i]).abs().max().item<double>();
    }
  }
  EXPECT_GE(step->stats().replays, 4);
}

// A kernel's write keeps the caller's tensors (same storage) and bumps their version
// counters as eager's in-place ops do, so a graph that saved a parameter before the step
// refuses to backward after it, as in eager.
TEST_F(FusedUpdates, WritesKeepStorageAndBumpVersions) {
  auto model = std::make_shared<Params>(at::kFloat, 4);
  optim::Adam opt(model->parameters(), optim::AdamOptions(1e-2));
  tcap::CompileOptions o;
  o.backend = tcap::Backend::Llvm;
  auto step = tcap::compile_step(std::static_pointer_cast<nn::Module>(model), opt,
                                 [&](const Tensors& in) { return step_body(opt, model->ps, in); }, o);
  for (int s = 0; s < 4; ++s) (*step)(batch_for(model->ps));
  ASSERT_GE(step->stats().replays, 1);
  const void* data = model->ps[0].data_ptr();
  const auto version = model->ps[0]._version();
  at::Tensor y = (model->ps[0] * model->ps[0]).sum();  // saves ps[0]
  (*step)(batch_for(model->ps));
  EXPECT_EQ(step->last_call().kind, tcap::CompiledStep::Call::Kind::Replayed);
  EXPECT_EQ(model->ps[0].data_ptr(), data);
  EXPECT_GT(model->ps[0]._version(), version);
  EXPECT_THROW(y.backward(), c10::Error);
}

// Gradients that share one storage (a cat's backward slices them from one tensor, and
// AccumulateGrad keeps the slices as .grad): the step's inputs then share a storage, but
// no write goes into a gradient, so the updates of the parameters and their moments are
// still kernels written in place (Note [Inputs that share storage] names the inputs that
// share), and the parameters follow eager's.
TEST_F(FusedUpdates, GradientsSlicedFromOneTensorLeaveTheUpdatesFused) {
  auto eager = std::make_shared<Params>(at::kFloat, 5), model = std::make_shared<Params>(at::kFloat, 5);
  optim::Adam eager_opt(eager->parameters(), optim::AdamOptions(1e-2)), opt(model->parameters(), optim::AdamOptions(1e-2));
  auto body = [](optim::Optimizer& o, const std::vector<at::Tensor>& ps, const Tensors& in) {
    o.zero_grad();
    std::vector<at::Tensor> flat;
    for (const auto& p : ps) flat.push_back(p.reshape({-1}));
    const at::Tensor loss = (torch::cat(flat) * in[0]).pow(2).sum();
    loss.backward();
    o.step();
    return Tensors{loss.detach()};
  };
  int64_t n = 0;
  for (const auto& p : model->ps) n += p.numel();
  tcap::CompileOptions o;
  o.backend = tcap::Backend::Llvm;
  o.name = "updates_sliced_grads";
  tcap::testing::LogCapture log("fusion");
  auto step = tcap::compile_step(std::static_pointer_cast<nn::Module>(model), opt,
                                 [&](const Tensors& in) { return body(opt, model->ps, in); }, o);
  for (int s = 0; s < 6; ++s) {
    const Tensors in{torch::rand({n}) + 0.5};
    body(eager_opt, eager->ps, in);
    (*step)(in);
    for (size_t i = 0; i < model->ps.size(); ++i) {
      ASSERT_TRUE(close(model->ps[i], eager->ps[i], 1e-5, 1e-6)) << "step " << s << " parameter " << i;
    }
  }
  EXPECT_GE(step->stats().replays, 3);
  EXPECT_EQ(count(log.text(), "written in place by"), 3 * static_cast<int>(model->ps.size())) << log.text();
}

// In-place chains in a compiled function: on an input (written back), on a temporary,
// and the cases that must stay as they are (a view read after the write, the old value read
// after it, a write through a view), each against eager, outputs and the inputs' contents.
TEST_F(FusedUpdates, InPlaceChainsInAFunctionMatchEager) {
  using Fn = std::function<Tensors(const Tensors&)>;
  const std::vector<std::pair<std::string, Fn>> cases{
      {"input_chain", [](const Tensors& in) {
         in[0].mul_(2).add_(in[1], 0.5).addcmul_(in[1], in[1], 0.25);
         return Tensors{in[0] * 3};
       }},
      {"temporary_chain", [](const Tensors& in) {
         at::Tensor t = in[0] * in[1];
         t.add_(1).mul_(0.5).sqrt_();
         return Tensors{t};
       }},
      {"view_read_after_write", [](const Tensors& in) {
         at::Tensor v = in[0].view({-1});
         in[0].add_(in[1]);
         return Tensors{v * 2};
       }},
      {"old_value_kept", [](const Tensors& in) {
         at::Tensor y = in[0] * 2;
         in[0].add_(1);
         return Tensors{y + in[0]};
       }},
      {"write_through_view", [](const Tensors& in) {
         in[0].select(0, 1).mul_(3);
         in[0].add_(in[1]);
         return Tensors{in[0].sum(0)};
       }},
      {"updated_value_read_after", [](const Tensors& in) {
         in[0].mul_(0.9).add_(in[1], 0.1);  // a running average, then read: the buffer's new values
         return Tensors{in[1] * 2 + in[0]};
       }},
      {"broadcast_operand", [](const Tensors& in) {
         in[0].add_(in[1].sum(0), -0.5).mul_(in[1][0]);
         return Tensors{in[0] + 1};
       }},
  };
  for (const auto& [name, fn] : cases) {
    SCOPED_TRACE(name);
    tcap::CompileOptions o;
    o.backend = tcap::Backend::Llvm;
    o.name = name;
    auto f = tcap::compile(fn, o);
    for (int s = 0; s < 5; ++s) {
      const at::Tensor a = torch::randn({7, 13}), b = torch::rand({7, 13}) + 0.1;
      Tensors eager_in{a.clone(), b.clone()}, in{a.clone(), b.clone()};
      const Tensors want = fn(eager_in);
      const Tensors got = f(in);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(close(got[i], want[i], 1e-5, 1e-6)) << "call " << s;
      EXPECT_TRUE(close(in[0], eager_in[0], 1e-5, 1e-6)) << "call " << s << ": the input's contents";
    }
    EXPECT_GE(f->stats().replays, 2);
  }
}

// An exponential moving average (lerp_ with a weight below and above 0.5, where ATen uses
// its two formulas, each one multiply-add rounded once): eager's bits, in place.
TEST_F(FusedUpdates, MovingAveragesAreBitwiseEager) {
  for (double w : {0.1, 0.7}) {
    SCOPED_TRACE(w);
    auto fn = [w](const Tensors& in) {
      in[0].lerp_(in[1], w);
      return Tensors{in[0] * 1};
    };
    tcap::CompileOptions o;
    o.backend = tcap::Backend::Llvm;
    tcap::testing::LogCapture log("fusion");
    auto f = tcap::compile(fn, o);
    for (int s = 0; s < 4; ++s) {
      const at::Tensor a = torch::randn({37, 19}), b = torch::randn({37, 19});
      Tensors eager_in{a.clone(), b.clone()}, in{a.clone(), b.clone()};
      fn(eager_in);
      f(in);
      ASSERT_TRUE(torch::equal(in[0], eager_in[0])) << "call " << s << ": max difference "
                                                    << (in[0] - eager_in[0]).abs().max().item<double>();
    }
    EXPECT_GE(f->stats().replays, 2);
    EXPECT_EQ(count(log.text(), "written in place by"), 1) << log.text();
  }
}

}  // namespace fused_updates_test
