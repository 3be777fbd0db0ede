// Note [Sizes the ops derive] (csrc/cache/dynamic_sizes.h): sizes that ATen computes from
// the input's (strided convolutions and pooling round a division, chunk splits an odd size)
// are read from each check capture's recording, so models served or trained at varying
// resolution or length get one dynamic entry in every front door and backend, and every
// call agrees with an eager twin (values and gradients; tolerances: size_tolerances.h,
// parameters after SGD with momentum at rtol 1e-4, atol 1e-5).
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/train_step.h>

#include "support/backends.h"
#include "support/compare.h"
#include "support/log_capture.h"
#include "support/models.h"
#include "size_tolerances.h"

#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace {

using tcap::testing::atol_of;
using tcap::testing::close;
using tcap::testing::LogCapture;
using tcap::testing::rtol_of;
using Tensors = std::vector<at::Tensor>;
namespace nn = torch::nn;

// A strided convolution (ceil(s / 2) with padding 1), a max pool (floor), a convolution
// without padding and stride 2 (floor((s - 3) / 2) + 1), adaptive pooling to a fixed
// size, a flatten and a head. With `branch`, host code doubles the features when the
// pooled size is odd (a branch on a size the ops derive).
struct SmallCnn : nn::Module {
  explicit SmallCnn(bool branch = false)
      : branch(branch),
        c1(register_module("c1", nn::Conv2d(nn::Conv2dOptions(3, 6, 3).stride(2).padding(1)))),
        c2(register_module("c2", nn::Conv2d(nn::Conv2dOptions(6, 8, 3).stride(2)))),
        head(register_module("head", nn::Linear(8 * 4, 5))) {}
  at::Tensor forward(const at::Tensor& x) {
    auto y = torch::max_pool2d(torch::relu(c1->forward(x)), 2);
    if (branch && y.size(2) % 2) y = y * 2;
    y = torch::relu(c2->forward(y));
    return head->forward(torch::adaptive_avg_pool2d(y, {2, 2}).flatten(1));
  }
  bool branch;
  nn::Conv2d c1, c2;
  nn::Linear head;
};

// Sides and heights/widths: even and odd, repeated, a new size after the entry went
// dynamic, and sizes where a derived size is 1 (the last pool's input of side 2).
const std::vector<std::pair<int64_t, int64_t>> kImages = {
    {16, 16}, {16, 16}, {24, 24}, {24, 24}, {20, 20}, {20, 20}, {17, 17}, {17, 17}, {31, 31},
    {31, 31}, {33, 33}, {45, 45}, {45, 45}, {16, 16}, {23, 23}, {23, 23}, {12, 12}, {12, 12}};

void expect_grads_close(nn::Module& m, nn::Module& twin, const std::string& backend, const std::string& where) {
  auto p = m.parameters(), q = twin.parameters();
  for (size_t k = 0; k < p.size(); ++k) {
    ASSERT_TRUE(close(p[k].grad(), q[k].grad(), rtol_of(backend), 10 * atol_of(backend))) << where << " parameter " << k;
  }
}

// Served at varying resolution: the entry goes dynamic at its second size and checks each
// later one (odd ones included), so every call after the first two is a check or a replay.
TEST(SizeChecks, ImageModelAtVaryingResolution) {
  for (const char* backend : {"eager", "llvm"}) {
    if (!tcap::testing::backend_built(backend, nullptr)) continue;
    SCOPED_TRACE(backend);
    torch::manual_seed(3);
    auto model = std::make_shared<SmallCnn>(), twin = std::make_shared<SmallCnn>();
    tcap::testing::copy_parameters(*model, *twin);
    tcap::CompileOptions o;
    o.backend = backend;
    LogCapture log("recompiles");
    auto f = tcap::compile(model, [&](const Tensors& in) { return Tensors{model->forward(in[0])}; }, o);
    for (size_t c = 0; c < kImages.size(); ++c) {
      const auto [h, w] = kImages[c];
      // The last call's input is not contiguous (channels last).
      auto x = c + 1 == kImages.size() ? torch::randn({2, h, w, 3}).permute({0, 3, 1, 2}) : torch::randn({2, 3, h, w});
      auto out = (*f)({x})[0];
      auto ref = twin->forward(x);
      const std::string where = "call " + std::to_string(c) + " side " + std::to_string(h);
      ASSERT_TRUE(close(out, ref, rtol_of(backend), atol_of(backend))) << where << "\n" << log.text();
      out.pow(2).sum().backward();
      ref.pow(2).sum().backward();
      expect_grads_close(*model, *twin, backend, where);
      model->zero_grad();
      twin->zero_grad();
    }
    const auto st = f->stats();
    EXPECT_EQ(log.count("sizes its ops derive, read from each check capture's recording: d0 = "), 1) << log.text();
    // Two captures make the dynamic entry, one more the channels-last input; 20, 17, 31, 33,
    // 45, 23 and 12 are one check each, and their second calls replay.
    EXPECT_EQ(st.captures, 3) << log.text();
    EXPECT_EQ(st.size_checks, 7) << log.text();
    EXPECT_GE(st.replays, 7) << log.text();
    EXPECT_EQ(log.count("does not serve sizes"), 0) << log.text();
    EXPECT_EQ(f->eager_reason(), "");
  }
}

// Note [Dense inputs of a dynamic entry]: an input in channels-last layout (dense, its
// dims in another order) at varying resolution goes dynamic, and a transposed sequence
// batch at varying length; a contiguous input at a new size is another layout, and misses.
TEST(SizeChecks, DenseNonContiguousInputsAtVaryingSizes) {
  for (const char* backend : {"eager", "llvm"}) {
    if (!tcap::testing::backend_built(backend, nullptr)) continue;
    SCOPED_TRACE(backend);
    tcap::CompileOptions o;
    o.backend = backend;
    LogCapture log("recompiles");
    auto fn = [](const Tensors& in) {
      auto y = torch::sigmoid(in[0] * 1.5 - 0.25);
      return Tensors{y.mean({2, 3}) + in[0].amax({2, 3}), y * in[0]};
    };
    auto f = tcap::compile(fn, o);
    const std::vector<int64_t> sides = {16, 24, 24, 20, 20, 17, 17, 31, 31, 18};
    for (size_t c = 0; c < sides.size(); ++c) {
      const int64_t s = sides[c];
      // The last call's input is contiguous: another layout.
      auto x = (c + 1 == sides.size() ? torch::randn({2, 3, s, s}) : torch::randn({2, s, s, 3}).permute({0, 3, 1, 2}))
                   .requires_grad_();
      auto x2 = x.detach().clone().requires_grad_();
      auto out = (*f)({x});
      auto ref = fn({x2});
      for (size_t k = 0; k < out.size(); ++k) {
        ASSERT_TRUE(close(out[k], ref[k], rtol_of(backend), atol_of(backend))) << "side " << s << "\n" << log.text();
      }
      (out[0].sum() + out[1].pow(2).sum()).backward();
      (ref[0].sum() + ref[1].pow(2).sum()).backward();
      ASSERT_TRUE(close(x.grad(), x2.grad(), rtol_of(backend), 10 * atol_of(backend))) << "side " << s;
    }
    EXPECT_EQ(log.count("dense in their captured dim order"), 1) << log.text();
    EXPECT_EQ(f->stats().captures, 3) << log.text();
    EXPECT_EQ(f->stats().replays, 4) << log.text();
    EXPECT_EQ(log.count("is no longer dense in the dim order it was captured in"), 1) << log.text();

    // [t, b, c] transposed to [b, t, c]: its strides do not follow t.
    auto g = tcap::compile([](const Tensors& in) { return Tensors{torch::tanh(in[0]).cumsum(1) * in[0]}; }, o);
    for (int64_t t : {5, 9, 9, 7, 7, 12, 12}) {
      auto x = torch::randn({t, 3, 4}).transpose(0, 1);
      ASSERT_TRUE(close((*g)({x})[0], torch::tanh(x).cumsum(1) * x, rtol_of(backend), atol_of(backend))) << "length " << t;
    }
    EXPECT_EQ(g->stats().captures, 2);
    EXPECT_GE(g->stats().replays, 3);
  }
}

// Height and width vary apart: two classes, and a derived size for each.
TEST(SizeChecks, ImageModelWithHeightAndWidthApart) {
  torch::manual_seed(4);
  auto model = std::make_shared<SmallCnn>(), twin = std::make_shared<SmallCnn>();
  tcap::testing::copy_parameters(*model, *twin);
  LogCapture log("recompiles");
  auto f = tcap::compile(model, [&](const Tensors& in) { return Tensors{model->forward(in[0])}; });
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{16, 20}, {24, 28}, {17, 29}, {17, 29}, {30, 13}, {30, 13}};
  for (const auto& [h, w] : sizes) {
    auto x = torch::randn({2, 3, h, w});
    auto out = (*f)({x})[0];
    auto ref = twin->forward(x);
    ASSERT_TRUE(close(out, ref, 1e-4, 1e-5)) << h << "x" << w << "\n" << log.text();
    out.sum().backward();
    ref.sum().backward();
    expect_grads_close(*model, *twin, "llvm", std::to_string(h) + "x" + std::to_string(w));
    model->zero_grad();
    twin->zero_grad();
  }
  EXPECT_EQ(f->stats().captures, 2) << log.text();
  EXPECT_EQ(f->stats().size_checks, 2) << log.text();
  EXPECT_GE(f->stats().replays, 2) << log.text();
}

// A branch on a size the ops derive: the check capture at a size where the pooled size is
// odd records one more op, so those sizes get an entry of their own, and no answer is
// wrong.
TEST(SizeChecks, BranchOnASizeTheOpsDerive) {
  for (const char* backend : {"eager", "llvm"}) {
    if (!tcap::testing::backend_built(backend, nullptr)) continue;
    SCOPED_TRACE(backend);
    torch::manual_seed(5);
    auto model = std::make_shared<SmallCnn>(true), twin = std::make_shared<SmallCnn>(true);
    tcap::testing::copy_parameters(*model, *twin);
    tcap::CompileOptions o;
    o.backend = backend;
    LogCapture log("recompiles");
    auto f = tcap::compile(model, [&](const Tensors& in) { return Tensors{model->forward(in[0])}; }, o);
    // Pooled sizes: 16 -> 4, 32 -> 8, 24 -> 6 (even); 20 -> 5, 36 -> 9 (odd).
    for (int64_t s : {16, 32, 24, 24, 20, 20, 36, 36, 16}) {
      auto x = torch::randn({2, 3, s, s});
      auto out = (*f)({x})[0];
      auto ref = twin->forward(x);
      ASSERT_TRUE(close(out, ref, rtol_of(backend), atol_of(backend))) << "side " << s << "\n" << log.text();
      out.sum().backward();
      ref.sum().backward();
      expect_grads_close(*model, *twin, backend, "side " + std::to_string(s));
      model->zero_grad();
      twin->zero_grad();
    }
    EXPECT_GE(log.count("does not serve sizes [20]"), 1) << log.text();
    EXPECT_GE(f->stats().replays, 2) << log.text();
  }
}

// The promise of check_new_sizes = false cannot serve a size the ops derive (nothing but
// the ops can tell it): such an entry still records its first call at each new size.
// Inference, as a server runs it.
TEST(SizeChecks, APromiseStillRecordsSizesTheOpsDerive) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(6);
  auto model = std::make_shared<SmallCnn>(), twin = std::make_shared<SmallCnn>();
  tcap::testing::copy_parameters(*model, *twin);
  tcap::CompileOptions o;
  o.check_new_sizes = false;
  LogCapture log("recompiles");
  auto f = tcap::compile(model, [&](const Tensors& in) { return Tensors{model->forward(in[0])}; }, o);
  for (int64_t s : {16, 24, 17, 17, 31, 31}) {
    auto x = torch::randn({1, 3, s, s});
    ASSERT_TRUE(close((*f)({x})[0], twin->forward(x), 1e-4, 1e-5)) << "side " << s << "\n" << log.text();
  }
  EXPECT_EQ(f->stats().size_checks, 2) << log.text();
  EXPECT_GE(f->stats().replays, 2) << log.text();
}

// chunk(2) of an odd length: the halves are ceil(n / 2) and floor(n / 2) long. At even
// lengths they are alike, so an entry made at two even lengths refuses odd ones (its
// check capture records halves of other lengths), and two odd lengths make a dynamic entry
// of their own: two entries serve every length, and the user's code runs once per new one.
TEST(SizeChecks, ChunksOfAnOddLength) {
  for (const char* backend : {"eager", "llvm"}) {
    if (!tcap::testing::backend_built(backend, nullptr)) continue;
    SCOPED_TRACE(backend);
    tcap::CompileOptions o;
    o.backend = backend;
    LogCapture log("recompiles");
    auto fn = [](const Tensors& in) {
      auto halves = torch::tanh(in[0]).chunk(2, 1);
      return Tensors{halves[0].sum(1) * 2 + halves[1].pow(2).mean(1), halves[0] * in[1].narrow(1, 0, halves[0].size(1))};
    };
    auto f = tcap::compile(fn, o);
    for (int64_t n : {6, 10, 7, 7, 13, 13, 8, 8, 9, 9, 11, 11, 12, 12}) {
      auto x = torch::randn({3, n, 4}, torch::requires_grad());
      auto y = torch::randn({3, n, 4}, torch::requires_grad());
      auto x2 = x.detach().clone().requires_grad_(), y2 = y.detach().clone().requires_grad_();
      auto out = (*f)({x, y});
      auto ref = fn({x2, y2});
      for (size_t k = 0; k < out.size(); ++k) {
        ASSERT_TRUE(close(out[k], ref[k], rtol_of(backend), atol_of(backend))) << "length " << n << "\n" << log.text();
      }
      (out[0].sum() + out[1].pow(2).sum()).backward();
      (ref[0].sum() + ref[1].pow(2).sum()).backward();
      ASSERT_TRUE(close(x.grad(), x2.grad(), rtol_of(backend), 10 * atol_of(backend))) << "length " << n;
      ASSERT_TRUE(close(y.grad(), y2.grad(), rtol_of(backend), 10 * atol_of(backend))) << "length " << n;
    }
    // Captures at 6, 10, 7 and 13; checks at 7, 13, 8, 9, 11 and 12; the second call at 8,
    // 9, 11 and 12 replays.
    EXPECT_EQ(f->stats().captures, 4) << log.text();
    EXPECT_EQ(f->stats().size_checks, 6) << log.text();
    EXPECT_GE(f->stats().replays, 4) << log.text();
    EXPECT_EQ(log.count("takes the place of entry"), 2) << log.text();
  }
}

// Host code that divides a length (`n / 2`, `n / 3 + 1`): integer arguments no class
// formula explains are derived sizes too, read from each check capture's recording, and
// the backward's integers (narrow's, the broadcast's) follow them.
TEST(SizeChecks, HostDivisionOfALength) {
  for (const char* backend : {"eager", "llvm"}) {
    if (!tcap::testing::backend_built(backend, nullptr)) continue;
    SCOPED_TRACE(backend);
    tcap::CompileOptions o;
    o.backend = backend;
    LogCapture log("recompiles");
    auto fn = [](const Tensors& in) {
      const int64_t n = in[0].size(1);
      auto y = torch::tanh(in[0]).narrow(1, n / 2, 2);
      auto pos = torch::arange(n / 3 + 1, in[0].options());
      return Tensors{y.sum(1) * 2 + pos.sum(), in[0].narrow(1, 0, n / 3 + 1) * pos.unsqueeze(-1)};
    };
    auto f = tcap::compile(fn, o);
    for (int64_t n : {6, 10, 7, 7, 13, 13, 8, 8, 20, 20, 5, 5}) {
      auto x = torch::randn({3, n, 4}, torch::requires_grad());
      auto x2 = x.detach().clone().requires_grad_();
      auto out = (*f)({x});
      auto ref = fn({x2});
      for (size_t k = 0; k < out.size(); ++k) {
        ASSERT_TRUE(close(out[k], ref[k], rtol_of(backend), atol_of(backend))) << "length " << n << "\n" << log.text();
      }
      (out[0].pow(2).sum() + out[1].sum()).backward();
      (ref[0].pow(2).sum() + ref[1].sum()).backward();
      ASSERT_TRUE(close(x.grad(), x2.grad(), rtol_of(backend), 10 * atol_of(backend))) << "length " << n;
    }
    // Captures at 6 and 10; 7, 13, 8, 20 and 5 are a check each, their second calls replay.
    EXPECT_EQ(f->stats().captures, 2) << log.text();
    EXPECT_EQ(f->stats().size_checks, 5) << log.text();
    EXPECT_EQ(f->stats().replays, 5) << log.text();
    EXPECT_EQ(log.count(" = argument 2 of node"), 1) << log.text();
  }
}

// A training step at varying resolution (compile_step, SGD with momentum), and the same
// model's backward under compiled autograd.
at::Tensor cnn_loss(SmallCnn& m, const at::Tensor& x, const at::Tensor& y) {
  return torch::cross_entropy_loss(m.forward(x), y);
}

TEST(SizeChecks, ImageModelStepAtVaryingResolution) {
  torch::manual_seed(7);
  auto model = std::make_shared<SmallCnn>(), twin = std::make_shared<SmallCnn>();
  tcap::testing::copy_parameters(*model, *twin);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD opt_twin(twin->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto body = [](SmallCnn& m, torch::optim::SGD& o, const at::Tensor& x, const at::Tensor& y) {
    o.zero_grad();
    auto loss = cnn_loss(m, x, y);
    loss.backward();
    o.step();
    return loss;
  };
  LogCapture log("recompiles");
  auto step = tcap::compile_step(model, opt, [&](const Tensors& in) { return Tensors{body(*model, opt, in[0], in[1])}; });
  auto run = [&](int64_t h, int64_t w) {
    auto x = torch::randn({4, 3, h, w});
    auto y = torch::randint(0, 5, {4});
    auto loss = (*step)({x, y})[0];
    return close(loss, body(*twin, opt_twin, x, y), 1e-4, 1e-5);
  };
  for (const auto& [h, w] : kImages) ASSERT_TRUE(run(h, w)) << "side " << h << "\n" << log.text();
  // The last convolution's output is 2 at 20 and at 24, so the entry made there takes it
  // for a constant and refuses 17 (where it is 1); 17 and 31 make a second dynamic entry.
  // Each dynamic entry takes the place of the static one it generalized (Note [A dynamic
  // entry takes the place of the static one]). Two dynamic entries then serve every size,
  // and new sides are checks and replays only.
  const int captured = step->stats().captures;
  EXPECT_LE(captured, 7) << log.text();
  EXPECT_EQ(log.count("takes the place of entry"), 2) << log.text();
  for (int64_t s : {19, 19, 27, 27, 40, 40, 14, 14, 33, 21, 21}) ASSERT_TRUE(run(s, s)) << "side " << s << "\n" << log.text();
  auto p = model->parameters(), q = twin->parameters();
  for (size_t k = 0; k < p.size(); ++k) EXPECT_TRUE(close(p[k], q[k], 1e-4, 1e-5)) << "parameter " << k;
  EXPECT_EQ(step->stats().captures, captured) << log.text();
  EXPECT_GE(step->stats().replays, 11) << log.text();
}

// Compiled autograd reads the sizes each node saved (a convolution's input, a pool's
// indices) as its own sizes: sizes that did not change between two captures stay static,
// so a model whose derived sizes change at different sides makes more entries than the
// other front doors (documented in docs/limitations.md). Every gradient is eager's.
TEST(SizeChecks, ImageModelCompiledAutogradAtVaryingResolution) {
  tcap::reset_compiled_autograd();
  torch::manual_seed(8);
  auto model = std::make_shared<SmallCnn>(), twin = std::make_shared<SmallCnn>();
  tcap::testing::copy_parameters(*model, *twin);
  tcap::CompileOptions o;
  o.name = "cnn_ca";
  LogCapture log("recompiles");
  for (const auto& [h, w] : kImages) {
    auto x = torch::randn({2, 3, h, w});
    auto y = torch::randint(0, 5, {2});
    {
      tcap::CompiledAutogradGuard ca(o);
      cnn_loss(*model, x, y).backward();
    }
    cnn_loss(*twin, x, y).backward();
    expect_grads_close(*model, *twin, "llvm", "side " + std::to_string(h) + "\n" + log.text());
    model->zero_grad();
    twin->zero_grad();
  }
  tcap::CompiledAutogradGuard ca(o);
  EXPECT_GE(ca.stats().replays, 2) << log.text();
}

}  // namespace
