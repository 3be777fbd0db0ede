// The contract (docs/compile.md, "What a replay re-reads and what it freezes"): what a
// function reaches only through its closure is frozen at capture, as JAX's jit freezes
// Python state. Each case here breaks the contract on purpose, and verify mode
// (VerifyOptions, TCAP_VERIFY) must catch it: VerifyError naming the tensor that differs
// and the likely cause, or, with log_only, a warning and eager's results. A program that
// keeps the contract runs under verify mode without a report (no false alarms), with both
// backends and in every mode.
#include "soundness/soundness.h"

#include "cache/verify.h"
#include "support/log_capture.h"

#include <torch/csrc/autograd/custom_function.h>

namespace tcap::soundness {
namespace {

const VerifyOptions kVerify{1, false};
const VerifyOptions kVerifyLog{1, true};

// Runs f until a replay, breaks the contract with `change`, then expects the next call to
// throw VerifyError whose message holds `what`.
void expect_caught(const std::function<at::Tensor()>& call, const std::function<void()>& change, const std::string& what) {
  tcap::StanceGuard verifying(tcap::Stance::Default, /*error_on_fallback=*/true, kVerify);
  for (int i = 0; i < 4; ++i) call();  // capture, compile, verified replays that match
  change();
  try {
    call();
  } catch (const tcap::VerifyError& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_NE(msg.find("Likely cause"), std::string::npos) << msg;
    return;
  }
  ADD_FAILURE() << "verify mode did not catch the broken contract (" << what << ")";
}

class Contract : public ::testing::TestWithParam<std::string> {};

TEST_P(Contract, AFlagTheClosureCapturesByReference) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  bool doubled = false;
  CompileOptions o;
  o.backend = backend;
  auto f = tcap::compile([&doubled](const Tensors& in) { return Tensors{doubled ? in[0].sin() * 2 : in[0].sin()}; }, o);
  expect_caught([&] { return (*f)({torch::randn({5, 3})})[0]; }, [&] { doubled = true; }, "output 0");
}

TEST_P(Contract, ATensorVariableReboundWhileTheOldOneLives) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  at::Tensor scale = torch::rand({3}) + 1;
  std::vector<at::Tensor> history;  // keeps the old tensor alive, so the held guard cannot tell
  CompileOptions o;
  o.backend = backend;
  auto f = tcap::compile([&scale](const Tensors& in) { return Tensors{in[0].cos() * scale}; }, o);
  expect_caught([&] { return (*f)({torch::randn({5, 3})})[0]; },
                [&] {
                  history.push_back(scale);
                  scale = torch::rand({3}) + 5;
                },
                "output 0");
}

// A module the function uses but that compile(fn) was not given: its flags and options
// are the closure's. Given through CompileOptions::modules, they are guards instead.
struct Dropper : nn::Module {
  Dropper() { drop = register_module("drop", nn::Dropout(0.5)); }
  nn::Dropout drop{nullptr};
};

TEST_P(Contract, AModuleNotGivenChangesMode) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  auto m = std::make_shared<Dropper>();
  CompileOptions o;
  o.backend = backend;
  auto fn = [m](const Tensors& in) { return Tensors{m->drop(in[0].exp())}; };
  auto f = tcap::compile(fn, o);
  expect_caught(
      [&] {
        torch::manual_seed(3);  // the same mask for the compiled call and verify's eager run
        return (*f)({torch::randn({5, 3})})[0];
      },
      [&] { m->eval(); }, "output 0");
  // Given to compile(fn), the same change is a guard: no report, eager's answers.
  auto m2 = std::make_shared<Dropper>();
  o.modules = {m2};
  auto g = tcap::compile([m2](const Tensors& in) { return Tensors{m2->drop(in[0].exp())}; }, o);
  tcap::StanceGuard verifying(tcap::Stance::Default, true, kVerify);
  for (int i = 0; i < 6; ++i) {
    if (i == 3) m2->eval();
    torch::manual_seed(4);
    auto x = torch::randn({5, 3});
    EXPECT_NO_THROW((*g)({x})) << "call " << i;
  }
}

TEST_P(Contract, OptionsOfAModuleNotGiven) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  auto m = std::make_shared<Dropper>();
  CompileOptions o;
  o.backend = backend;
  auto f = tcap::compile([m](const Tensors& in) { return Tensors{m->drop(in[0].exp())}; }, o);
  expect_caught(
      [&] {
        torch::manual_seed(3);
        return (*f)({torch::randn({5, 3})})[0];
      },
      [&] { m->drop->options.p(0.9); }, "output 0");
}

// compile_step: zero_grad's set_to_none is an argument of the step's code. Flipping it
// changes whether the .grad the program holds is the one that accumulates.
TEST_P(Contract, ZeroGradSetToNoneFlippedInsideTheStep) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  torch::manual_seed(0);
  nn::Linear lin(4, 2);
  torch::optim::SGD opt(lin->parameters(), 0.1);
  bool set_to_none = false;
  CompileOptions o;
  o.backend = backend;
  auto step = tcap::compile_step(lin.ptr(), opt,
                                 [&](const Tensors& in) {
                                   opt.zero_grad(set_to_none);
                                   auto loss = lin(in[0]).pow(2).mean();
                                   loss.backward();
                                   opt.step();
                                   return Tensors{loss};
                                 },
                                 o);
  expect_caught([&] { return (*step)({torch::randn({3, 4})})[0]; }, [&] { set_to_none = true; }, ".grad of");
}

TEST_P(Contract, ALossWeightTheStepCapturesByReference) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  torch::manual_seed(0);
  nn::Linear lin(4, 2);
  torch::optim::SGD opt(lin->parameters(), 0.1);
  double weight = 1.0;
  CompileOptions o;
  o.backend = backend;
  auto step = tcap::compile_step(lin.ptr(), opt,
                                 [&](const Tensors& in) {
                                   opt.zero_grad();
                                   auto loss = lin(in[0]).pow(2).mean() * weight;
                                   loss.backward();
                                   opt.step();
                                   return Tensors{loss};
                                 },
                                 o);
  expect_caught([&] { return (*step)({torch::randn({3, 4})})[0]; }, [&] { weight = 3.0; }, "output 0");
}

// Compiled autograd: a custom function whose backward reads a value through its closure
// (a global here); the compiled backward froze it.
double g_backward_scale = 1.0;
struct ScaledSquare : torch::autograd::Function<ScaledSquare> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    ctx->save_for_backward({x});
    return x * x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    auto x = ctx->get_saved_variables()[0];
    return {g[0] * 2 * x * g_backward_scale};
  }
};

TEST_P(Contract, ABackwardReadingItsClosureUnderCompiledAutograd) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  tcap::reset_compiled_autograd();
  auto w = torch::randn({3}).requires_grad_(true);
  CompileOptions o;
  o.backend = backend;
  o.name = "contract_ca_" + backend;
  g_backward_scale = 1.0;
  expect_caught(
      [&] {
        tcap::CompiledAutogradGuard ca(o);
        ScaledSquare::apply(w * torch::randn({3})).sum().backward();
        return w.grad();
      },
      [&] { g_backward_scale = 4.0; }, "gradient accumulated");
  g_backward_scale = 1.0;
}

// log_only: a warning, and eager's results (so the program stays right).
TEST_P(Contract, LogOnlyKeepsEagersResults) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  bool doubled = false;
  CompileOptions o;
  o.backend = backend;
  auto fn = [&doubled](const Tensors& in) { return Tensors{doubled ? in[0].sin() * 2 : in[0].sin()}; };
  auto f = tcap::compile(fn, o);
  tcap::testing::LogCapture logs("verify");
  tcap::StanceGuard verifying(tcap::Stance::Default, true, kVerifyLog);
  for (int i = 0; i < 4; ++i) (*f)({torch::randn({5, 3})});
  doubled = true;
  auto x = torch::randn({5, 3});
  auto got = (*f)({x})[0];
  EXPECT_TRUE(tcap::testing::close(got, fn({x})[0], 1e-5, 1e-6)) << "log_only returns eager's results";
  EXPECT_NE(logs.text().find("replayed differently from eager"), std::string::npos) << logs.text();
}

// One tensor passed at two positions: autograd::grad gives each position the tensor's
// whole gradient, the compiled backward splits it. Verify mode compares the sums and hands
// eager's gradient on once: no false alarm, and .grad is eager's (not twice eager's), in
// both the throwing and the log-only mode.
TEST_P(Contract, OneTensorAtTwoPositionsIsNoMismatch) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  CompileOptions o;
  o.backend = backend;
  auto fn = [](const Tensors& in) { return Tensors{(in[0].sin() * in[1]).sum(1)}; };
  auto f = tcap::compile(fn, o);
  for (const VerifyOptions& v : {kVerify, kVerifyLog}) {
    tcap::StanceGuard verifying(tcap::Stance::Default, true, v);
    for (int i = 0; i < 4; ++i) {
      auto data = torch::randn({7, 3});
      auto leaf = data.clone().requires_grad_(true);
      auto eager_leaf = data.clone().requires_grad_(true);
      auto a = leaf.slice(0, 0, 4);
      auto ea = eager_leaf.slice(0, 0, 4);
      auto w = torch::randn({4});
      ((*f)({a, a})[0] * w).sum().backward();
      (fn({ea, ea})[0] * w).sum().backward();
      ASSERT_TRUE(tcap::testing::close(leaf.grad(), eager_leaf.grad(), 1e-5, 1e-6))
          << (v.log_only ? "log_only" : "throwing") << ", call " << i;
    }
  }
  EXPECT_GT(f->stats().verified, 0);
}

// every = 3: one replay in three is checked.
TEST(ContractVerify, EveryNthReplay) {
  auto f = tcap::compile([](const Tensors& in) { return Tensors{in[0].tanh()}; });
  tcap::StanceGuard verifying(tcap::Stance::Default, true, VerifyOptions{3, false});
  for (int i = 0; i < 14; ++i) (*f)({torch::randn({4, 3})});
  const auto s = f->stats();
  EXPECT_EQ(s.verified, (s.replays + 2) / 3) << s.replays << " replays";
}

// Note [Verify tolerances]: for a fused backend the atol scales with the tensor's largest
// magnitude. A reordered sum's error near zero in a tensor whose entries reach 28 (the case
// seen: a compile_step .grad, 1.8e-5 at an element of -0.031) is no mismatch; a wrong value
// of that size, or a small error in a small tensor, still is; the eager backend stays exact.
TEST(ContractVerify, ToleranceScalesWithTheTensorsMagnitude) {
  cache::Tolerances fused;
  fused.exact = false;
  auto eager = torch::tensor({28.8f, -0.0314462f, 3.0f, 0.5f});
  auto rounded = eager.clone();
  rounded[1] = -0.0314641f;
  EXPECT_EQ(cache::compare_tensors(rounded, eager, fused), "");
  auto wrong = eager.clone();
  wrong[3] = 0.6f;
  const std::string why = cache::compare_tensors(wrong, eager, fused);
  EXPECT_NE(why.find("at [3]"), std::string::npos) << why;
  auto small = torch::tensor({0.9f, -0.0314462f});
  auto small_rounded = small.clone();
  small_rounded[1] = -0.0314641f;
  EXPECT_NE(cache::compare_tensors(small_rounded, small, fused), "");
  const cache::Tolerances exact;
  EXPECT_NE(cache::compare_tensors(rounded, eager, exact), "");
  // The report names the element furthest outside the tolerance, not the largest difference.
  auto both = eager.clone();
  both[0] = 28.8f + 2e-3f;  // inside rtol at 28.8
  both[3] = 0.55f;          // outside
  const std::string where = cache::compare_tensors(both, eager, fused);
  EXPECT_NE(where.find("at [3]"), std::string::npos) << where;
}

INSTANTIATE_TEST_SUITE_P(Soundness, Contract, ::testing::Values(std::string("eager"), std::string("llvm")));

// Programs that keep the contract: verify mode on every call finds nothing, in every mode
// and with both backends (the tolerances of Note [Verify tolerances] hold), and the
// program's results are eager's.
struct VerifiedNet : Net {
  VerifiedNet() {
    fc1 = register_module("fc1", nn::Linear(6, 8));
    bn = register_module("bn", nn::BatchNorm1d(8));
    drop = register_module("drop", nn::Dropout(0.2));
    fc2 = register_module("fc2", nn::Linear(8, 3));
  }
  at::Tensor run(const at::Tensor& x) override { return fc2(drop(torch::gelu(bn(fc1(x))))); }
  nn::Linear fc1{nullptr}, fc2{nullptr};
  nn::BatchNorm1d bn{nullptr};
  nn::Dropout drop{nullptr};
};

using ModeParam = std::tuple<Mode, std::string>;
class VerifiedProgram : public ::testing::TestWithParam<ModeParam> {};

TEST_P(VerifiedProgram, FindsNothingAndKeepsEagersResults) {
  const auto& [mode, backend] = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  tcap::reset_compiled_autograd();
  torch::manual_seed(0);
  auto net = std::make_shared<VerifiedNet>();
  torch::manual_seed(0);
  auto twin = std::make_shared<VerifiedNet>();
  Runner compiled(mode, net, backend, true);
  Runner eager(mode, twin, backend, false);
  const Tol tol = tolerance(backend);
  tcap::StanceGuard verifying(tcap::Stance::Default, /*error_on_fallback=*/true, kVerify);
  for (int i = 0; i < 8; ++i) {
    auto x = torch::randn({5, 6});
    auto y = torch::randn({5, 3});
    torch::manual_seed(500 + i);
    auto loss = compiled.call(x, y);
    torch::manual_seed(500 + i);
    auto ref = eager.call(x, y);
    ASSERT_TRUE(tcap::testing::close(loss, ref, tol.rtol, tol.atol)) << "call " << i;
    ASSERT_TRUE(same_state(*net, *twin, tol)) << "call " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Soundness, VerifiedProgram,
                         ::testing::Combine(::testing::Values(Mode::Compile, Mode::CompileFn, Mode::CompileStep,
                                                              Mode::CompiledAutograd),
                                            ::testing::Values(std::string("eager"), std::string("llvm"))),
                         [](const auto& info) {
                           return std::string(mode_name(std::get<0>(info.param))) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace tcap::soundness
