// Group norm as kernels (Note [Group norm as kernels], fuse/decompose_norms.cpp, and Note
// [Reshapes sunk below pointwise ops], fuse/sink_reshapes.cpp): a U-Net style block
// (convolution, GroupNorm, SiLU, residual add) and group norms (with a SiLU) of many shapes against
// eager, outputs and every gradient, in tcap::compile, compile_step and compiled autograd;
// and which cases stay ATen calls.
//
// Tolerances (vs eager): float32 rtol 1e-4 atol 1e-5 (the kernels sum in float32 in
// another order than ATen; the backward's terms are the same expanded otherwise); float64
// rtol 1e-9 atol 1e-11.
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/train_step.h>

#include "support/compare.h"
#include "support/log_capture.h"

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace group_norm_test {

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;
namespace nn = torch::nn;

struct Case {
  std::vector<int64_t> shape;
  int64_t groups;
  bool affine;
  at::ScalarType dtype;
  bool transposed = false;  // a non-contiguous input (group_norm makes it contiguous first)
};

std::string name(const Case& c) {
  return std::string(c10::toString(c.dtype)) + " " + c10::str(c10::IntArrayRef(c.shape)) + " groups " +
         std::to_string(c.groups) + (c.affine ? " affine" : "") + (c.transposed ? " transposed" : "");
}

double rtol(at::ScalarType t) { return t == at::kDouble ? 1e-9 : 1e-4; }
double atol(at::ScalarType t) { return t == at::kDouble ? 1e-11 : 1e-5; }

class GroupNorm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!tcap::Backend(tcap::Backend::Llvm).available()) GTEST_SKIP() << "LLVM backend not available";
  }
};

TEST_F(GroupNorm, BareGroupNormsMatchEager) {
  const std::vector<Case> cases{
      {{4, 8, 5, 7}, 2, true, at::kFloat},  {{3, 6, 9}, 3, false, at::kFloat}, {{3, 8}, 4, true, at::kFloat},
      {{1, 12, 3, 3}, 1, true, at::kFloat}, {{5, 4, 17}, 4, true, at::kDouble}, {{2, 32, 16, 16}, 8, true, at::kFloat},
      {{2, 6, 5, 4}, 3, true, at::kFloat, true},
  };
  int index = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(name(c));
    torch::manual_seed(index);
    nn::GroupNorm gn(nn::GroupNormOptions(c.groups, c.shape[1]).affine(c.affine));
    gn->to(c.dtype);
    if (c.affine) {
      torch::NoGradGuard no_grad;
      gn->weight.uniform_(0.5, 1.5);
      gn->bias.uniform_(-0.5, 0.5);
    }
    tcap::CompileOptions o;
    o.backend = tcap::Backend::Llvm;
    o.name = "group_norm_" + std::to_string(index++);
    auto f = tcap::compile(gn.ptr(), [&](const Tensors& in) { return Tensors{torch::silu(gn->forward(in[0]))}; }, o);
    tcap::testing::LogCapture log("fusion");
    for (int call = 0; call < 3; ++call) {
      at::Tensor x = torch::randn(c.shape, c.dtype);
      if (c.transposed) x = x.transpose(2, 3).contiguous().transpose(2, 3);
      x.requires_grad_();
      const at::Tensor w = torch::randn(c.shape, c.dtype);
      gn->zero_grad();
      at::Tensor want = torch::silu(gn->forward(x));
      (want * w).sum().backward();
      const at::Tensor gx = x.grad().clone();
      std::vector<at::Tensor> gp;
      for (auto& p : gn->parameters()) gp.push_back(p.grad().clone());
      x.mutable_grad().reset();
      gn->zero_grad();
      at::Tensor got = f({x})[0];
      (got * w).sum().backward();
      EXPECT_TRUE(close(got, want, rtol(c.dtype), atol(c.dtype))) << "call " << call;
      EXPECT_TRUE(close(x.grad(), gx, rtol(c.dtype), atol(c.dtype))) << "call " << call;
      size_t k = 0;
      for (auto& p : gn->parameters()) EXPECT_TRUE(close(p.grad(), gp[k++], rtol(c.dtype), atol(c.dtype))) << "call " << call;
    }
    EXPECT_GE(f->stats().replays, 1);
    EXPECT_GT(log.count("native_group_norm: decomposed"), 0) << log.text();
    EXPECT_GT(log.count("native_group_norm_backward: decomposed"), 0) << log.text();
    // The SiLU joins the group norm's kernel (Note [Reshapes sunk below pointwise ops]).
    EXPECT_GT(log.count("1 pointwise ops computed above the reshape"), 0) << log.text();
  }
}

// bfloat16 statistics stay ATen's (they accumulate in float there).
TEST_F(GroupNorm, BFloat16StaysAnATenCall) {
  nn::GroupNorm gn(nn::GroupNormOptions(2, 8));
  gn->to(at::kBFloat16);
  tcap::CompileOptions o;
  o.backend = tcap::Backend::Llvm;
  o.name = "group_norm_bf16";
  auto f = tcap::compile(gn.ptr(), [&](const Tensors& in) { return Tensors{gn->forward(in[0])}; }, o);
  tcap::testing::LogCapture log("fusion");
  torch::NoGradGuard no_grad;
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::randn({4, 8, 6}, at::kBFloat16);
    EXPECT_TRUE(close(f({x})[0].to(at::kFloat), gn->forward(x).to(at::kFloat), 1e-2, 1e-2));
  }
  EXPECT_GT(log.count("native_group_norm: kept as one ATen call: BFloat16 statistics accumulate in float"), 0)
      << log.text();
}

// A U-Net style block: conv, GroupNorm, SiLU, conv, GroupNorm, SiLU, trained with SGD
// with momentum in every front door (not Adam: the second conv's bias, before a group norm
// of one channel per group, has a zero gradient up to rounding, whose sign Adam's update
// follows; Note [Fused optimizer steps] says the same of a bias before BatchNorm).
nn::Sequential block() {
  torch::manual_seed(3);
  nn::Sequential m(nn::Conv2d(nn::Conv2dOptions(4, 8, 3).padding(1)), nn::GroupNorm(2, 8), nn::SiLU(),
                   nn::Conv2d(nn::Conv2dOptions(8, 4, 3).padding(1)), nn::GroupNorm(4, 4), nn::SiLU());
  return m;
}

// Trains make() and a twin of it with SGD (momentum 0.9, lr 1e-2) for 5 steps through
// `door` ("compile", "step", "compiled_autograd", llvm backend), each step on batch(), loss
// mse(out, target), comparing the losses and the parameters with eager's.
void expect_trains_as_eager(const std::string& name, const std::function<nn::Sequential()>& make,
                            const std::string& door, const std::function<Tensors()>& batch) {
  SCOPED_TRACE(door);
  auto eager = make(), model = make();
  torch::optim::SGD eager_opt(eager->parameters(), torch::optim::SGDOptions(1e-2).momentum(0.9));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(1e-2).momentum(0.9));
  tcap::CompileOptions o;
  o.backend = tcap::Backend::Llvm;
  o.name = name + "_" + door;
  using Fwd = std::function<at::Tensor(const at::Tensor&)>;
  using Bwd = std::function<void(const at::Tensor&)>;
  auto body = [](torch::optim::Optimizer& op, const Tensors& in, const Fwd& fwd, const Bwd& bwd) {
    op.zero_grad();
    at::Tensor loss = (fwd(in[0]) - in[1]).pow(2).mean();
    bwd(loss);
    op.step();
    return Tensors{loss.detach()};
  };
  const Fwd model_fwd = [&](const at::Tensor& x) { return model->forward(x); };
  const Bwd plain_bwd = [](const at::Tensor& l) { l.backward(); };
  tcap::CompiledFn f;
  std::shared_ptr<tcap::CompiledStep> step;
  if (door == "compile") f = tcap::compile(model.ptr(), [&](const Tensors& in) { return Tensors{model->forward(in[0])}; }, o);
  if (door == "step") step = tcap::compile_step(model, opt, [&](const Tensors& in) { return body(opt, in, model_fwd, plain_bwd); }, o);
  int ca_replays = 0;
  for (int s = 0; s < 5; ++s) {
    const Tensors in = batch();
    const at::Tensor want = body(eager_opt, in, [&](const at::Tensor& x) { return eager->forward(x); }, plain_bwd)[0];
    at::Tensor got;
    if (door == "compile") {
      got = body(opt, in, [&](const at::Tensor& x) { return f(x)[0]; }, plain_bwd)[0];
    } else if (door == "step") {
      got = (*step)(in)[0];
    } else {
      got = body(opt, in, model_fwd, [&](const at::Tensor& l) {
        tcap::CompiledAutogradGuard ca(o);
        l.backward();
        ca_replays = ca.stats().replays;
      })[0];
    }
    EXPECT_TRUE(close(got, want, 1e-4, 1e-6)) << "step " << s;
    auto pe = eager->parameters(), pm = model->parameters();
    for (size_t i = 0; i < pe.size(); ++i) EXPECT_TRUE(close(pm[i], pe[i], 1e-4, 1e-5)) << "step " << s << " param " << i;
  }
  if (f) {
    EXPECT_GE(f->stats().replays, 1);
  }
  if (step) {
    EXPECT_GE(step->stats().replays, 1);
  }
  if (door == "compiled_autograd") {
    EXPECT_GE(ca_replays, 1);
  }
}

TEST_F(GroupNorm, ConvolutionBlockTrainsAsEagerInEveryFrontDoor) {
  for (const std::string door : {"compile", "step", "compiled_autograd"}) {
    expect_trains_as_eager("unet_block", block, door, [] { return Tensors{torch::randn({3, 4, 12, 10}), torch::randn({3, 4, 12, 10})}; });
  }
}

}  // namespace group_norm_test

namespace group_norm_test {

// Found by the divergence fuzzer (seed 22, program 218): a GELU's backward reads the group
// norm's input gradient (a reshape of the [N, G, D, 1] kernel's result) and the flattened
// convolution output (a reshape of [N, C, L]): two reshapes of different shapes, of which
// only the first is moved above (Note [Reshapes sunk below pointwise ops]).
TEST_F(GroupNorm, ReshapesOfTwoShapesMeetInOneOp) {
  auto make = [] {
    torch::manual_seed(5);
    return nn::Sequential(nn::Conv1d(nn::Conv1dOptions(2, 3, 3).padding(1)), nn::Flatten(), nn::GELU(),
                          nn::GroupNorm(5, 15), nn::Linear(15, 8));
  };
  for (const std::string door : {"compile", "step"}) {
    expect_trains_as_eager("gn_two_reshapes", make, door, [] { return Tensors{torch::randn({4, 2, 5}), torch::randn({4, 8})}; });
  }
}

}  // namespace group_norm_test

namespace group_norm_test {

// Found by the divergence fuzzer (seed 22, program 2145): under compiled autograd at batch 1,
// the weight's [1, G, D, 1] view (the shape of the op that reads it) was read by a moved op
// as a tensor of the op's own shape, not as the value it reshapes, and was dropped as if no
// op read it (unordered_map::at).
TEST_F(GroupNorm, AReshapeReadAsItIsByAMovedOpIsKept) {
  auto make = [] {
    torch::manual_seed(9);
    return nn::Sequential(nn::Linear(7, 8), nn::Sigmoid(), nn::Tanh(), nn::GroupNorm(4, 8),
                          nn::Functional([](const at::Tensor& x) { return x * 1.5 - 0.25; }), nn::Sigmoid(),
                          nn::Linear(8, 1));
  };
  auto eager = make(), model = make();
  tcap::CompileOptions o;
  o.backend = tcap::Backend::Llvm;
  o.name = "gn_reshape_read_as_it_is";
  int replays = 0;
  for (int call = 0; call < 8; ++call) {
    const int64_t batch = call < 4 ? 4 : 1;  // at batch 1 the weight's [1, G, D, 1] view has the op's shape
    at::Tensor x = torch::randn({7, batch}).t();  // non-contiguous
    const at::Tensor y = torch::randn({batch, 1});
    eager->zero_grad();
    (eager->forward(x) - y).pow(2).mean().backward();
    model->zero_grad();
    {
      tcap::CompiledAutogradGuard ca(o);
      (model->forward(x) - y).pow(2).mean().backward();
      replays = ca.stats().replays;
    }
    auto pe = eager->parameters(), pm = model->parameters();
    for (size_t i = 0; i < pe.size(); ++i) EXPECT_TRUE(close(pm[i].grad(), pe[i].grad(), 1e-4, 1e-6)) << "call " << call << " param " << i;
  }
  EXPECT_GE(replays, 1);
}

}  // namespace group_norm_test
