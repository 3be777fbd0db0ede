// The size tier's property test (docs/compile.md, "Dynamic sizes"): functions whose shapes
// follow their sizes the way real programs' do (attention's head reshapes, flatten and view
// back, a mask built from lengths, a floor-divided narrow, a branch on a size), called at
// sizes drawn at random with repeats, sizes 0, 1 and 2 among them, and non-contiguous
// inputs, through every front door (tcap::compile, compiled autograd, compile_step) and
// both CPU backends. Every call is compared with an eager twin: outputs and gradients (and,
// for steps, the parameters after SGD), eager backend rtol 1e-5 atol 1e-6, llvm rtol 1e-4
// atol 1e-5.
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/stance.h>
#include <tcap/train_step.h>

#include "support/backends.h"
#include "support/compare.h"

#include <torch/torch.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;
namespace nn = torch::nn;

// in[0]: x [b, t, c] (c per family); in[1]: the weight; in[2]: lengths [b] (int64, in 0..t).
struct Family {
  const char* name;
  int64_t channels;
  std::vector<int64_t> weight;
  std::function<at::Tensor(const Tensors&)> fn;
};

// Two heads of 4: the projections viewed as [b, t, heads, d], transposed, attention
// weights over t, merged back with reshape.
at::Tensor heads(const Tensors& in) {
  const auto& x = in[0];
  const int64_t b = x.size(0), t = x.size(1);
  auto q = x.matmul(in[1]).view({b, t, 2, 4}).transpose(1, 2);
  auto a = (q.matmul(q.transpose(-1, -2)) * 0.5).softmax(-1);
  return torch::tanh(a.matmul(q).transpose(1, 2).reshape({b, t, 8}));
}
// flatten(0, 1), a projection, and a view back to [b, t, 3].
at::Tensor flatten_project(const Tensors& in) {
  const auto& x = in[0];
  auto y = x.flatten(0, 1).matmul(in[1]).view({x.size(0), x.size(1), 3});
  return torch::sigmoid(y).sum(1);
}
// A mask from the lengths' values: a mean over the first lengths[i] steps of each row.
at::Tensor masked_mean(const Tensors& in) {
  const auto& x = in[0];
  auto mask = torch::arange(x.size(1)).unsqueeze(0) < in[2].unsqueeze(1);
  auto s = (x * mask.unsqueeze(-1).to(x.scalar_type())).sum(1);
  return s / in[2].clamp_min(1).unsqueeze(1).to(x.scalar_type()) * in[1];
}
// The first half of the steps (a floor division), and a branch on the length's parity.
at::Tensor half_and_parity(const Tensors& in) {
  const auto& x = in[0];
  auto y = torch::cos(x.narrow(1, 0, x.size(1) / 2) * in[1]);
  if (x.size(1) % 2) y = y * 2;
  return y;
}

std::vector<Family> families() {
  return {
      {"heads", 8, {8, 8}, heads},
      {"flatten_project", 6, {6, 3}, flatten_project},
      {"masked_mean", 4, {4}, masked_mean},
      {"half_and_parity", 5, {5}, half_and_parity},
  };
}

enum class Door { Compile, CompiledAutograd, Step };
const char* door_name(Door d) {
  return d == Door::Compile ? "compile" : d == Door::CompiledAutograd ? "compiled_autograd" : "compile_step";
}

// The weight as a module, for compile_step.
struct Weight : nn::Module {
  explicit Weight(const at::Tensor& w) : w(register_parameter("w", w.clone())) {}
  at::Tensor w;
};

struct Sizes {
  int64_t b, t;
  bool transposed;
};

// 14 calls: sizes drawn with repeats (so that sizes come back), 0, 1 and 2 among them.
std::vector<Sizes> draw_sizes(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<int64_t> ts = {0, 1, 2, 3, 4, 5, 7, 9, 12, 16};
  const std::vector<int64_t> bs = {1, 2, 3, 5};
  std::vector<Sizes> out;
  for (int i = 0; i < 14; ++i) {
    Sizes s{bs[rng() % bs.size()], ts[rng() % ts.size()], i % 3 == 2};
    if (i < 2) s = {2, 6, false};  // two first calls alike: the entry compiles
    out.push_back(s);
  }
  return out;
}

class SizeProperty : public ::testing::TestWithParam<std::tuple<Door, std::string>> {};

TEST_P(SizeProperty, EveryCallEqualsEager) {
  const auto [door, backend] = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  const double rtol = backend == "eager" ? 1e-5 : 1e-4, atol = backend == "eager" ? 1e-6 : 1e-5;
  uint64_t seed = 1;
  for (const auto& fam : families()) {
    SCOPED_TRACE(fam.name);
    torch::manual_seed(static_cast<int64_t>(seed));
    const auto sizes = draw_sizes(seed++);
    tcap::CompileOptions o;
    o.backend = backend;
    o.name = std::string("size_property_") + fam.name;
    auto w0 = torch::randn(fam.weight) * 0.5;
    auto model = std::make_shared<Weight>(w0), twin = std::make_shared<Weight>(w0);
    torch::optim::SGD opt(model->parameters(), 0.05), twin_opt(twin->parameters(), 0.05);
    auto step_body = [&fam](Weight& m, torch::optim::Optimizer& op) {
      return [&fam, &m, &op](const Tensors& in) {
        op.zero_grad();
        auto loss = fam.fn({in[0], m.w, in[1]}).pow(2).sum();
        loss.backward();
        op.step();
        return Tensors{loss};
      };
    };
    tcap::CompiledFn f;
    std::shared_ptr<tcap::CompiledStep> step;
    std::unique_ptr<tcap::CompiledAutogradGuard> ca;
    if (door == Door::Compile) f = tcap::compile([&fam](const Tensors& in) { return Tensors{fam.fn(in)}; }, o);
    if (door == Door::Step) step = tcap::compile_step(model, opt, step_body(*model, opt), o);
    auto eager_step = step_body(*twin, twin_opt);
    for (size_t i = 0; i < sizes.size(); ++i) {
      const auto [b, t, transposed] = sizes[i];
      SCOPED_TRACE("call " + std::to_string(i) + " at b=" + std::to_string(b) + ", t=" + std::to_string(t) +
                   (transposed ? ", non-contiguous" : ""));
      auto x = transposed ? torch::randn({t, b, fam.channels}).transpose(0, 1) : torch::randn({b, t, fam.channels});
      auto lengths = torch::randint(0, t + 1, {b}, torch::kLong);
      if (door == Door::Step) {
        auto got = (*step)({x, lengths})[0];
        auto want = eager_step({x, lengths})[0];
        ASSERT_TRUE(close(got, want, rtol, atol));
        ASSERT_TRUE(close(model->w, twin->w, rtol, atol));
        continue;
      }
      auto xc = x.detach().clone().requires_grad_(true), xe = x.detach().clone().requires_grad_(true);
      auto wc = model->w.detach().clone().requires_grad_(true), we = model->w.detach().clone().requires_grad_(true);
      at::Tensor got;
      if (door == Door::Compile) {
        got = f({xc, wc, lengths})[0];
      } else {
        got = fam.fn({xc, wc, lengths});
      }
      auto want = fam.fn({xe, we, lengths});
      ASSERT_TRUE(close(got, want, rtol, atol));
      auto g = torch::randn_like(want);
      {
        if (door == Door::CompiledAutograd && !ca) ca = std::make_unique<tcap::CompiledAutogradGuard>(o);
        (got * g).sum().backward();
      }
      {
        tcap::StanceGuard eager(tcap::Stance::ForceEager);
        (want * g).sum().backward();
      }
      ASSERT_TRUE(close(xc.grad(), xe.grad(), rtol, atol)) << "d/dx";
      ASSERT_TRUE(close(wc.grad(), we.grad(), rtol, atol)) << "d/dw";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Doors, SizeProperty,
                         ::testing::Combine(::testing::Values(Door::Compile, Door::CompiledAutograd, Door::Step),
                                            ::testing::Values(std::string("eager"), std::string("llvm"))),
                         [](const auto& info) {
                           return std::string(door_name(std::get<0>(info.param))) + "_" + std::get<1>(info.param);
                         });

}  // namespace
