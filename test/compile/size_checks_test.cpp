// Note [Checking a new size] (csrc/cache/dynamic_sizes.h): host code that branches on a
// size is run and its recording checked at every size a dynamic entry has not served, so
// no front door and no backend returns another answer than eager at a new size.
//
// Every call is compared with an eager twin (values and gradients): eager backend rtol
// 1e-5, atol 1e-6 (the same kernels); llvm rtol 1e-4, atol 1e-5 (reordered sums); the
// steps' parameters after SGD with momentum at rtol 1e-4, atol 1e-5.
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
#include <vector>

namespace {

using tcap::testing::close;
using tcap::testing::LogCapture;
using tcap::testing::atol_of;
using tcap::testing::rtol_of;
using Tensors = std::vector<at::Tensor>;
namespace nn = torch::nn;

// Branches on a size that change the ops recorded.
Tensors narrow_above_64(const Tensors& in) {
  auto y = torch::tanh(in[0] * 1.5 + 0.5);
  if (in[0].size(0) > 64) y = y.narrow(0, 0, 64);
  return {y * in[1]};
}
Tensors double_if_odd(const Tensors& in) {
  auto y = torch::sigmoid(in[0]).matmul(in[1]);
  if (in[0].size(0) % 2) y = y * 2;
  return {y.relu()};
}
// A branch that changes an integer only: the same ops, another shape.
Tensors rows_by_size(const Tensors& in) {
  const int64_t n = in[0].size(0);
  auto y = (in[0] * in[1]).reshape({n > 32 ? 3 : 2, -1}).softmax(1);
  return {y * 3};
}
// A float computed from a size behind a branch: the same ops and shapes, another constant.
Tensors scale_above_20(const Tensors& in) {
  const double s = in[0].size(0) > 20 ? 0.25 : 1.0;
  return {torch::cos(in[0] * in[1]) * s};
}
// No branch: every new size is checked once, then replays.
Tensors plain(const Tensors& in) { return {torch::tanh(in[0] * in[1] + 1).sum(1)}; }

struct Case {
  const char* name;
  std::function<Tensors(const Tensors&)> fn;
  std::function<at::Tensor(int64_t)> make_w;
};

std::vector<Case> cases() {
  return {
      {"narrow_above_64", narrow_above_64, [](int64_t) { return torch::randn({6}); }},
      {"double_if_odd", double_if_odd, [](int64_t) { return torch::randn({6, 5}); }},
      {"rows_by_size", rows_by_size, [](int64_t) { return torch::randn({6}); }},
      {"scale_above_20", scale_above_20, [](int64_t) { return torch::randn({6}); }},
      {"plain", plain, [](int64_t) { return torch::randn({6}); }},
  };
}


// Calls f at each size with fresh inputs (a non-contiguous x every third call at sizes
// where the entry is static anyway), comparing outputs and gradients with eager.
void expect_eager_at_every_size(tcap::CompiledFunction& f, const Case& c, const std::vector<int64_t>& sizes,
                                const std::string& backend) {
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    auto x = torch::randn({n, 6}, torch::requires_grad());
    auto w = c.make_w(n).requires_grad_(true);
    auto out = f({x, w});
    auto xr = x.detach().clone().requires_grad_(true), wr = w.detach().clone().requires_grad_(true);
    auto ref = c.fn({xr, wr});
    ASSERT_TRUE(close(out[0], ref[0], rtol_of(backend), atol_of(backend)))
        << c.name << " " << backend << " call " << i << " at size " << n;
    auto g = torch::randn_like(ref[0]);
    (out[0] * g).sum().backward();
    (ref[0] * g).sum().backward();
    EXPECT_TRUE(close(x.grad(), xr.grad(), rtol_of(backend), atol_of(backend)))
        << c.name << " " << backend << " d/dx, call " << i << " at size " << n;
    EXPECT_TRUE(close(w.grad(), wr.grad(), rtol_of(backend), atol_of(backend)))
        << c.name << " " << backend << " d/dw, call " << i << " at size " << n;
  }
}

TEST(SizeChecks, HostBranchesOnSizesGiveEagerAnswersInEveryBackend) {
  // 8 and 16 take the same branches (the entry becomes dynamic); the rest cross them,
  // repeat, and come back. Odd sizes, sizes 2 and 3, and sizes above every threshold.
  const std::vector<int64_t> sizes = {8, 16, 100, 100, 200, 200, 17, 17, 33, 33, 24, 24, 64, 65, 65, 2, 3, 3, 40, 40, 8};
  for (const char* backend : {"eager", "llvm"}) {
    if (!tcap::testing::backend_built(backend, nullptr)) continue;
    for (const auto& c : cases()) {
      tcap::CompileOptions o;
      o.name = std::string(c.name) + "_" + backend;
      o.backend = backend;
      o.cache_size_limit = 64;
      auto f = tcap::compile(c.fn, o);
      expect_eager_at_every_size(*f, c, sizes, backend);
      const auto st = f->stats();
      EXPECT_GE(st.size_checks, 1) << c.name;
      EXPECT_GT(st.replays, 0) << c.name;
      EXPECT_EQ(f->eager_reason(), "") << c.name;
    }
  }
}

// A size checked and admitted replays from the second call on; a refused one gets an
// entry of its own, logged with the first difference.
TEST(SizeChecks, AdmittedSizesReplayRefusedSizesGetTheirOwnEntry) {
  LogCapture log("recompiles");
  auto f = tcap::compile(narrow_above_64);
  auto call = [&](int64_t n) {
    auto x = torch::randn({n, 6});
    auto w = torch::randn({6});
    auto out = (*f)({x, w});
    EXPECT_TRUE(close(out[0], narrow_above_64({x, w})[0])) << "size " << n;
  };
  call(8);
  call(16);  // dynamic from here
  auto st = f->stats();
  EXPECT_EQ(st.captures, 2);
  call(24);  // checked: the same graph
  call(24);  // replayed
  st = f->stats();
  EXPECT_EQ(st.size_checks, 1);
  EXPECT_EQ(st.captures, 2);
  EXPECT_EQ(st.replays, 1) << log.text();
  EXPECT_EQ(log.count("sizes [24] of its dynamic dims checked"), 1) << log.text();
  call(100);  // checked: another graph (a narrow); eager's answer
  EXPECT_EQ(log.count("does not serve sizes [100]"), 1) << log.text();
  EXPECT_NE(log.text().find("is aten::slice.Tensor"), std::string::npos) << log.text();  // narrow's op
  call(100);  // an entry of its own
  call(100);  // which replays
  st = f->stats();
  EXPECT_EQ(st.captures, 3) << log.text();
  EXPECT_EQ(st.size_checks, 2);
  EXPECT_EQ(st.replays, 2) << log.text();
  // 200 is checked by the first dynamic entry (refused), then captured and generalized
  // with the entry at 100: the two sizes above 64 make a second dynamic entry.
  call(200);
  call(200);
  call(300);  // checked by the second dynamic entry, and admitted
  call(300);
  st = f->stats();
  EXPECT_EQ(st.captures, 4) << log.text();
  EXPECT_EQ(log.count("sizes [300] of its dynamic dims checked"), 1) << log.text();
  // Each dynamic entry took the place of the static one it generalized (Note [A dynamic
  // entry takes the place of the static one]): one entry per branch, 8 and 100 served
  // with their own code.
  EXPECT_EQ(f->entries().size(), 2u);
  EXPECT_EQ(log.count("takes the place of entry"), 2) << log.text();
  st = f->stats();
  call(8);
  call(100);
  EXPECT_EQ(f->stats().replays, st.replays + 2) << log.text();
  EXPECT_EQ(f->stats().compiles, st.compiles) << log.text();
}

// check_new_sizes = false: the promise that no host code branches on a size. New sizes of
// a function that keeps it replay at once, with no check.
TEST(SizeChecks, APromiseServesNewSizesWithoutACheck) {
  tcap::CompileOptions o;
  o.check_new_sizes = false;
  auto f = tcap::compile(plain, o);
  for (int64_t n : {8, 16, 24, 31, 24}) {
    auto x = torch::randn({n, 6});
    auto w = torch::randn({6});
    EXPECT_TRUE(close((*f)({x, w})[0], plain({x, w})[0])) << "size " << n;
  }
  const auto st = f->stats();
  EXPECT_EQ(st.size_checks, 0);
  EXPECT_EQ(st.captures, 2);
  EXPECT_EQ(st.replays, 3);
}

// A module's forward that branches on the batch size (a model that drops a regularizer for
// small batches), compiled as a module, trained by hand.
struct Gated : nn::Module {
  Gated() : fc(register_module("fc", nn::Linear(6, 4))) {}
  at::Tensor forward(const at::Tensor& x) {
    auto y = fc->forward(x);
    if (x.size(0) >= 32) y = y - y.mean(0, /*keepdim=*/true);
    return torch::gelu(y);
  }
  nn::Linear fc;
};

TEST(SizeChecks, ModuleForwardThatBranchesOnTheBatch) {
  for (const char* backend : {"eager", "llvm"}) {
    if (!tcap::testing::backend_built(backend, nullptr)) continue;
    torch::manual_seed(3);
    auto m = std::make_shared<Gated>();
    auto twin = std::make_shared<Gated>();
    tcap::testing::copy_parameters(*m, *twin);
    tcap::CompileOptions o;
    o.backend = backend;
    o.cache_size_limit = 32;
    auto f = tcap::compile(m, [m](const Tensors& in) { return Tensors{m->forward(in[0])}; }, o);
    for (int64_t n : {4, 8, 12, 12, 40, 40, 48, 33, 33, 7, 31, 32, 32}) {
      auto x = torch::randn({n, 6});
      auto out = (*f)({x})[0];
      auto ref = twin->forward(x);
      ASSERT_TRUE(close(out, ref, rtol_of(backend), atol_of(backend))) << backend << " batch " << n;
      out.pow(2).sum().backward();
      ref.pow(2).sum().backward();
      EXPECT_TRUE(close(m->fc->weight.grad(), twin->fc->weight.grad(), rtol_of(backend), atol_of(backend)))
          << backend << " batch " << n;
      m->zero_grad();
      twin->zero_grad();
    }
    EXPECT_GE(f->stats().size_checks, 2) << backend;
  }
}

// compile_step: a step whose code scales the loss for odd batches. The parameters after
// every step must be eager's.
TEST(SizeChecks, StepThatBranchesOnTheBatch) {
  torch::manual_seed(5);
  auto make = [] { return nn::Sequential(nn::Linear(5, 8), nn::Tanh(), nn::Linear(8, 3)); };
  auto model = make(), twin = make();
  tcap::testing::copy_parameters(*model, *twin);
  auto sgd = [](nn::Sequential& m) { return torch::optim::SGD(m->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)); };
  auto opt = sgd(model), opt_twin = sgd(twin);
  auto body = [](nn::Sequential& m, torch::optim::SGD& o, const at::Tensor& x, const at::Tensor& y) {
    o.zero_grad();
    auto loss = torch::mse_loss(m->forward(x), y);
    if (x.size(0) % 2) loss = loss * 2;
    loss.backward();
    o.step();
    return loss;
  };
  LogCapture log("recompiles");
  auto step = tcap::compile_step(model, opt, [&](const Tensors& in) { return Tensors{body(model, opt, in[0], in[1])}; });
  for (int64_t n : {8, 8, 8, 8, 12, 12, 12, 17, 17, 17, 17, 16, 16, 21, 21, 21, 10, 10}) {
    auto x = torch::randn({n, 5});
    auto y = torch::randn({n, 3});
    auto loss = (*step)({x, y})[0];
    ASSERT_TRUE(close(loss, body(twin, opt_twin, x, y), 1e-4, 1e-5)) << "batch " << n << "\n" << log.text();
  }
  auto p = model->parameters(), q = twin->parameters();
  for (size_t k = 0; k < p.size(); ++k) EXPECT_TRUE(close(p[k], q[k], 1e-4, 1e-5)) << "parameter " << k;
  const auto st = step->stats();
  EXPECT_GE(st.size_checks, 2) << log.text();
  EXPECT_GE(log.count("does not serve sizes [17]"), 1) << log.text();
  EXPECT_GE(st.replays, 5) << log.text();
  // Each branch's dynamic entry takes the place of the static entry it generalized (Note
  // [A dynamic entry takes the place of the static one]): the even batches' at 12 that of
  // 8, the odd batches' at 21 that of 17.
  EXPECT_EQ(log.count("takes the place of entry"), 2) << log.text();
}

// Lengths that never repeat back to back (Note [A step compiled from captures at two
// sizes]): the step compiles from captures at two lengths, goes dynamic, and then checks
// each new length once and replays it from then on; with Adam, whose bias corrections are host scalars that
// differ between the two captures. A step whose float follows the length (the mean taken
// by hand) waits for two captures at one length instead, and still gives eager's answer.
TEST(SizeChecks, StepWithLengthsThatNeverRepeat) {
  for (const bool float_of_size : {false, true}) {
    SCOPED_TRACE(float_of_size ? "a float that follows the length" : "integers only");
    torch::manual_seed(6);
    auto make = [] { return nn::Sequential(nn::Linear(4, 6), nn::GELU(), nn::Linear(6, 2)); };
    auto model = make(), twin = make();
    tcap::testing::copy_parameters(*model, *twin);
    torch::optim::Adam opt(model->parameters(), 0.01), opt_twin(twin->parameters(), 0.01);
    auto body = [float_of_size](nn::Sequential& m, torch::optim::Adam& o, const at::Tensor& x, const at::Tensor& y) {
      o.zero_grad();
      auto err = (m->forward(x.flatten(0, 1)) - y.flatten(0, 1)).pow(2);
      auto loss = float_of_size ? err.sum() * (1.0 / static_cast<double>(x.size(1))) : err.mean();
      loss.backward();
      o.step();
      return loss;
    };
    LogCapture log("recompiles");
    auto step = tcap::compile_step(model, opt, [&](const Tensors& in) { return Tensors{body(model, opt, in[0], in[1])}; });
    const int64_t lengths[] = {7, 7, 9, 5, 11, 6, 13, 9, 5, 11, 6, 13, 8, 9, 5};  // new, then again
    for (int64_t t : lengths) {
      auto x = torch::randn({3, t, 4});
      auto y = torch::randn({3, t, 2});
      auto loss = (*step)({x, y})[0];
      ASSERT_TRUE(close(loss, body(twin, opt_twin, x, y), 1e-4, 1e-5)) << "length " << t << "\n" << log.text();
    }
    auto p = model->parameters(), q = twin->parameters();
    for (size_t k = 0; k < p.size(); ++k) EXPECT_TRUE(close(p[k], q[k], 1e-4, 1e-5)) << "parameter " << k;
    const auto st = step->stats();
    if (!float_of_size) {
      EXPECT_GE(log.count("compiles from one capture"), 1) << log.text();
      EXPECT_LE(st.captures, 4) << log.text();
      EXPECT_GE(st.replays, 7) << log.text();  // every length's second call
    } else {
      EXPECT_EQ(log.count("compiles from one capture"), 0) << log.text();
    }
  }
}

// An RNN unrolls its time loop: a step's graph has another structure at each length, so a
// capture at a new length cannot stand in for a first one, and the log says why (the step
// still gives eager's answers, captured until a length repeats).
TEST(SizeChecks, StepWhoseStructureFollowsTheLengthSaysWhyItWaits) {
  torch::manual_seed(8);
  auto make = [] { return nn::GRU(nn::GRUOptions(4, 6)); };
  auto model = make(), twin = make();
  tcap::testing::copy_parameters(*model, *twin);
  torch::optim::SGD opt(model->parameters(), 0.1), opt_twin(twin->parameters(), 0.1);
  auto body = [](nn::GRU& m, torch::optim::SGD& o, const at::Tensor& x) {
    o.zero_grad();
    auto loss = std::get<0>(m->forward(x)).pow(2).mean();
    loss.backward();
    o.step();
    return loss.detach();
  };
  LogCapture log("recompiles");
  auto step = tcap::compile_step(model, opt, [&](const Tensors& in) { return Tensors{body(model, opt, in[0])}; });
  for (int64_t t : {5, 7, 9, 7, 7}) {
    auto x = torch::randn({t, 2, 4});
    ASSERT_TRUE(close((*step)({x})[0], body(twin, opt_twin, x), 1e-4, 1e-5)) << "length " << t << "\n" << log.text();
  }
  EXPECT_GE(log.count("nodes where that one has"), 1) << log.text();
  EXPECT_GE(log.count("a loop unrolled over a length?"), 1) << log.text();
}

// The recompile log names each symbol, the sizes it stands for and the relations guarded
// on it, per front door.
TEST(SizeChecks, TheLogSaysWhichSizesAreSymbolsAndWhatIsGuarded) {
  LogCapture log("recompiles");
  tcap::CompileOptions o;
  o.name = "symbols";
  auto f = tcap::compile([](const Tensors& in) { return Tensors{(in[0] * in[1]).sum(1)}; }, o);
  for (int64_t n : {8, 12, 12}) {
    auto x = torch::randn({n, 5}), y = torch::randn({n, 5});
    ASSERT_TRUE(close(f(x, y)[0], (x * y).sum(1), 1e-5, 1e-6));
  }
  EXPECT_EQ(log.count("s0 = in0.size(0) = in1.size(0) (captured at 12); guarded: s0 >= 2, the sizes of one symbol "
                      "equal, the tensors with a symbolic size contiguous, every other size as captured"),
            1)
      << log.text();

  torch::manual_seed(3);
  nn::Linear lin(5, 3);
  torch::optim::SGD opt(lin->parameters(), 0.1);
  tcap::CompileOptions so;
  so.name = "symbols_step";
  auto step = tcap::compile_step(lin, opt, [&](const Tensors& in) {
    opt.zero_grad();
    auto loss = lin->forward(in[0]).pow(2).mean();
    loss.backward();
    opt.step();
    return Tensors{loss.detach()};
  }, so);
  for (int64_t n : {8, 8, 12, 12, 12, 16, 16, 20}) (*step)({torch::randn({n, 5})});
  EXPECT_EQ(log.count("step 'symbols_step' entry 3 is dynamic in 1 dims"), 1) << log.text();
  EXPECT_EQ(log.count("s0 = in0.size(0) (captured at 16); guarded: s0 >= 2, the tensors with a symbolic size "
                      "contiguous, every other size as captured"),
            1)
      << log.text();
}

// CompileOptions::static_dims (torch._dynamo.mark_static): a marked dim never becomes
// dynamic; each of its sizes gets an entry of its own (no generalization, no check
// capture), while unmarked dims still do.
TEST(SizeChecks, StaticDimsGetAnEntryPerSize) {
  auto fn = [](const Tensors& in) { return Tensors{(in[0] * 2).sum(1) + in[1]}; };
  LogCapture log("recompiles");
  tcap::CompileOptions o;
  o.name = "static_dims";
  o.static_dims = {{0, 1}};
  auto f = tcap::compile(fn, o);
  for (int64_t w : {3, 5, 7, 5, 3, 7}) {
    auto x = torch::randn({4, w}), b = torch::randn({4});
    ASSERT_TRUE(close(f(x, b)[0], fn({x, b})[0], 1e-5, 1e-6)) << w;
  }
  EXPECT_EQ(f->stats().captures, 3) << log.text();
  EXPECT_EQ(f->stats().size_checks, 0) << log.text();
  EXPECT_EQ(log.count("is dynamic in"), 0) << log.text();
  EXPECT_GE(log.count("dim 1 of 'in0' kept static (CompileOptions::static_dims)"), 1) << log.text();
  // The batch dim is not marked: it becomes dynamic beside the static width.
  for (int64_t n : {6, 9, 11}) {
    auto x = torch::randn({n, 5}), b = torch::randn({n});
    ASSERT_TRUE(close(f(x, b)[0], fn({x, b})[0], 1e-5, 1e-6)) << n;
  }
  EXPECT_EQ(log.count("is dynamic in 2 dims"), 1) << log.text();
  EXPECT_EQ(log.count("s0 = in0.size(0) = in1.size(0)"), 1) << log.text();
}

// CompileOptions::dynamic_dims: a promise that no host code branches on a dim's size within
// bounds. The function below branches at 64; the promise covers [2, 64], so sizes there
// are served without a check capture (logged once per size), and sizes above are checked
// as usual: the check sees the branch and those sizes get the function's own answer.
TEST(SizeChecks, DynamicDimsServeSizesWithinTheirBoundsUnchecked) {
  auto fn = [](const Tensors& in) {
    at::Tensor y = torch::tanh(in[0]) * 2 + in[1];
    if (in[0].size(0) > 64) y = y.narrow(0, 0, 64);
    return Tensors{y};
  };
  LogCapture log("recompiles");
  tcap::CompileOptions o;
  o.name = "promised";
  o.dynamic_dims = {{0, 0, 2, 64}};
  auto f = tcap::compile(fn, o);
  for (int64_t n : {8, 16, 5, 33, 64, 16, 7, 33}) {
    auto x = torch::randn({n, 16}), b = torch::randn({16});
    ASSERT_TRUE(close(f(x, b)[0], fn({x, b})[0], 1e-5, 1e-6)) << n;
  }
  EXPECT_EQ(f->stats().size_checks, 0) << log.text();
  EXPECT_EQ(log.count("served without a check capture"), 4) << log.text();  // 5, 33, 64, 7
  EXPECT_EQ(log.count("dim 0 of 'in0' in [2, 64]"), 4) << log.text();
  for (int64_t n : {100, 200, 100}) {
    auto x = torch::randn({n, 16}), b = torch::randn({16});
    const auto got = f(x, b)[0];
    const auto want = fn({x, b})[0];
    ASSERT_EQ(got.sizes(), want.sizes()) << n << "\n" << log.text();
    ASSERT_TRUE(close(got, want, 1e-5, 1e-6)) << n;
  }
  EXPECT_GE(f->stats().size_checks, 1) << log.text();
  EXPECT_EQ(log.count("served without a check capture"), 4) << log.text();
}

// The same promise for compile_step: an Adam step over batches of 2..64 rows, the loss
// scaled on the host for batches above 64 (outside the promise). Parameters follow the
// eager twin's at every step.
TEST(SizeChecks, StepDynamicDimsServeSizesWithinTheirBoundsUnchecked) {
  torch::manual_seed(8);
  auto make = [] { return nn::Sequential(nn::Linear(4, 6), nn::GELU(), nn::Linear(6, 2)); };
  auto model = make(), twin = make();
  tcap::testing::copy_parameters(*model, *twin);
  torch::optim::Adam opt(model->parameters(), 0.01), opt_twin(twin->parameters(), 0.01);
  auto body = [](nn::Sequential& m, torch::optim::Adam& o, const at::Tensor& x, const at::Tensor& y) {
    o.zero_grad();
    auto loss = (m->forward(x) - y).pow(2).mean();
    if (x.size(0) > 64) loss = loss * 0.5;
    loss.backward();
    o.step();
    return loss;
  };
  LogCapture log("recompiles");
  tcap::CompileOptions options;
  options.name = "promised_step";
  options.dynamic_dims = {{0, 0, 2, 64}};
  auto step = tcap::compile_step(model, opt, [&](const Tensors& in) { return Tensors{body(model, opt, in[0], in[1])}; },
                                 options);
  for (int64_t n : {8, 8, 16, 16, 5, 33, 64, 5, 100, 100, 33}) {
    auto x = torch::randn({n, 4}), y = torch::randn({n, 2});
    auto loss = (*step)({x, y})[0];
    ASSERT_TRUE(close(loss, body(twin, opt_twin, x, y), 1e-4, 1e-5)) << "batch " << n << "\n" << log.text();
  }
  auto p = model->parameters(), q = twin->parameters();
  for (size_t k = 0; k < p.size(); ++k) EXPECT_TRUE(close(p[k], q[k], 1e-4, 1e-5)) << "parameter " << k;
  EXPECT_GE(log.count("served without a check capture"), 1) << log.text();
  EXPECT_EQ(log.count("served without a check capture"), log.count("dim 0 of 'in0' in [2, 64]")) << log.text();
}

TEST(SizeChecks, DynamicDimsWithBadBoundsAreErrors) {
  auto fn = [](const Tensors& in) { return Tensors{in[0] * 2}; };
  tcap::CompileOptions o;
  o.dynamic_dims = {{0, 0, 1, 64}};
  EXPECT_THROW(
      {
        try {
          tcap::compile(fn, o);
        } catch (const c10::Error& e) {
          EXPECT_NE(std::string(e.what()).find("2 <= min <= max"), std::string::npos) << e.what();
          throw;
        }
      },
      c10::Error);
  o.dynamic_dims = {{0, 1}};
  o.static_dims = {{0, 1}};
  EXPECT_THROW(
      {
        try {
          tcap::compile(fn, o);
        } catch (const c10::Error& e) {
          EXPECT_NE(std::string(e.what()).find("both CompileOptions::static_dims and CompileOptions::dynamic_dims"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      c10::Error);
}

// Compiled autograd: a custom Function's backward is C++ code that branches on a size.
struct HalveLargeGrads : torch::autograd::Function<HalveLargeGrads> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) { return x * 3; }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list g) {
    auto gi = g[0] * 3;
    if (gi.size(0) > 64) gi = gi * 0.5;
    return {gi};
  }
};

TEST(SizeChecks, CompiledAutogradBackwardThatBranchesOnASize) {
  tcap::reset_compiled_autograd();
  tcap::CompileOptions o;
  o.name = "size_checks_ca";
  LogCapture log("recompiles");
  for (int64_t n : {8, 16, 100, 100, 100, 24, 24, 130, 130, 130, 200, 200, 200}) {
    auto x = torch::randn({n, 4}, torch::requires_grad());
    auto loss = HalveLargeGrads::apply(torch::sin(x)).pow(2).sum();
    auto xr = x.detach().clone().requires_grad_(true);
    auto loss_r = HalveLargeGrads::apply(torch::sin(xr)).pow(2).sum();
    {
      tcap::CompiledAutogradGuard ca(o);
      loss.backward();
    }
    loss_r.backward();
    EXPECT_TRUE(close(x.grad(), xr.grad())) << "size " << n;
  }
  tcap::CompiledAutogradGuard ca(o);
  EXPECT_GE(ca.stats().size_checks, 3) << log.text();
  EXPECT_GE(ca.stats().replays, 4) << log.text();
  EXPECT_GE(log.count("does not serve sizes [100]"), 1) << log.text();
}

}  // namespace
