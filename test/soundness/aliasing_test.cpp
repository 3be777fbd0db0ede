// Inputs that share memory (Note [Alias geometry guards]): the same tensor passed twice,
// two views of one storage that overlap, two that do not. A graph captured under one of
// these never serves another: every call is eager's, whatever the order, with and without
// gradients, in tcap::compile and compile_step, with both backends.
#include "soundness/soundness.h"

namespace tcap::soundness {
namespace {

enum class Alias { Same, Coincident, Disjoint, Overlapping, Separate };
const char* alias_name(Alias a) {
  switch (a) {
    case Alias::Same: return "same tensor";
    case Alias::Coincident: return "two views of the same elements";
    case Alias::Disjoint: return "disjoint views";
    case Alias::Overlapping: return "overlapping views";
    case Alias::Separate: return "separate tensors";
  }
  return "?";
}

// Two [4, 3] inputs related as `a` says, over a fresh copy of `data` ([8, 3]).
std::pair<at::Tensor, at::Tensor> inputs(Alias a, const at::Tensor& data) {
  at::Tensor base = data.clone();
  switch (a) {
    case Alias::Same: {
      at::Tensor v = base.slice(0, 0, 4);
      return {v, v};
    }
    case Alias::Coincident: return {base.slice(0, 0, 4), base.slice(0, 0, 4)};
    case Alias::Disjoint: return {base.slice(0, 0, 4), base.slice(0, 4, 8)};
    case Alias::Overlapping: return {base.slice(0, 0, 4), base.slice(0, 2, 6)};
    case Alias::Separate: return {base.slice(0, 0, 4).clone(), base.slice(0, 4, 8).clone()};
  }
  return {};
}

// Writes its first input, then reads both: the answer depends on how they alias.
Tensors writes_then_reads(const Tensors& in) {
  in[0].mul_(2);
  return {in[0] + in[1] * 3};
}

const Alias kOrder[] = {Alias::Same,       Alias::Same,     Alias::Disjoint,   Alias::Disjoint, Alias::Overlapping,
                        Alias::Coincident, Alias::Same,     Alias::Overlapping, Alias::Separate, Alias::Coincident,
                        Alias::Disjoint,   Alias::Same};

class Aliasing : public ::testing::TestWithParam<std::string> {};

TEST_P(Aliasing, InPlaceWriteSeesEagersAliasing) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  CompileOptions o;
  o.backend = backend;
  auto f = tcap::compile(writes_then_reads, o);
  const Tol tol = tolerance(backend);
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  for (size_t i = 0; i < std::size(kOrder); ++i) {
    auto data = torch::randn({8, 3});
    auto [a, b] = inputs(kOrder[i], data);
    auto got = (*f)({a, b})[0];
    auto [ea, eb] = inputs(kOrder[i], data);
    auto ref = writes_then_reads({ea, eb})[0];
    ASSERT_TRUE(tcap::testing::close(got, ref, tol.rtol, tol.atol)) << alias_name(kOrder[i]) << ", call " << i;
    ASSERT_TRUE(tcap::testing::close(a, ea, tol.rtol, tol.atol)) << alias_name(kOrder[i]) << " (the written input), call " << i;
  }
  EXPECT_GE(f->stats().replays, 4);
}

// Gradients: a leaf viewed twice. f(x, x) sums both paths into one gradient; two views of
// a base send each its part.
TEST_P(Aliasing, GradientsSeeEagersAliasing) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  CompileOptions o;
  o.backend = backend;
  auto fn = [](const Tensors& in) { return Tensors{(in[0].sin() * in[1]).sum(1)}; };
  auto f = tcap::compile(fn, o);
  const Tol tol = tolerance(backend);
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  for (size_t i = 0; i < std::size(kOrder); ++i) {
    auto data = torch::randn({8, 3});
    auto leaf = data.clone().requires_grad_(true);
    auto eager_leaf = data.clone().requires_grad_(true);
    auto views = [&](const at::Tensor& l) -> std::pair<at::Tensor, at::Tensor> {
      switch (kOrder[i]) {
        case Alias::Same: {
          at::Tensor v = l.slice(0, 0, 4);
          return {v, v};
        }
        case Alias::Coincident: return {l.slice(0, 0, 4), l.slice(0, 0, 4)};
        case Alias::Disjoint: return {l.slice(0, 0, 4), l.slice(0, 4, 8)};
        case Alias::Overlapping: return {l.slice(0, 0, 4), l.slice(0, 2, 6)};
        case Alias::Separate: return {l.slice(0, 0, 4) * 1, l.slice(0, 4, 8) * 1};
      }
      return {};
    };
    auto [a, b] = views(leaf);
    auto [ea, eb] = views(eager_leaf);
    auto got = (*f)({a, b})[0];
    auto ref = fn({ea, eb})[0];
    ASSERT_TRUE(tcap::testing::close(got, ref, tol.rtol, tol.atol)) << alias_name(kOrder[i]) << ", call " << i;
    auto w = torch::randn({4});
    (got * w).sum().backward();
    (ref * w).sum().backward();
    ASSERT_TRUE(tcap::testing::close(leaf.grad(), eager_leaf.grad(), tol.rtol, tol.atol))
        << alias_name(kOrder[i]) << " gradient, call " << i;
  }
}

// compile_step: a step that normalizes its first input in place, then reads both.
TEST_P(Aliasing, StepInputsSeeEagersAliasing) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  torch::manual_seed(0);
  nn::Linear lin(3, 2), twin(3, 2);
  tcap::testing::copy_parameters(*lin, *twin);
  torch::optim::SGD opt(lin->parameters(), 0.1), opt_twin(twin->parameters(), 0.1);
  auto body = [](nn::Linear& m, torch::optim::SGD& o, const at::Tensor& a, const at::Tensor& b) {
    o.zero_grad();
    a.mul_(0.5);
    auto loss = (m(a) - m(b)).pow(2).mean() + m(a).mean();
    loss.backward();
    o.step();
    return loss;
  };
  CompileOptions co;
  co.backend = backend;
  auto step = tcap::compile_step(lin.ptr(), opt, [&](const Tensors& in) { return Tensors{body(lin, opt, in[0], in[1])}; }, co);
  const Tol tol = tolerance(backend);
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  const Alias order[] = {Alias::Same,        Alias::Same,        Alias::Same,        Alias::Same,
                         Alias::Disjoint,    Alias::Disjoint,    Alias::Disjoint,    Alias::Disjoint,
                         Alias::Same,        Alias::Overlapping, Alias::Overlapping, Alias::Overlapping,
                         Alias::Overlapping, Alias::Coincident,  Alias::Coincident,  Alias::Coincident,
                         Alias::Same,        Alias::Disjoint};
  for (size_t i = 0; i < std::size(order); ++i) {
    auto data = torch::randn({8, 3});
    auto [a, b] = inputs(order[i], data);
    auto loss = (*step)({a, b})[0];
    auto [ea, eb] = inputs(order[i], data);
    auto ref = body(twin, opt_twin, ea, eb);
    ASSERT_TRUE(tcap::testing::close(loss, ref, tol.rtol, tol.atol)) << alias_name(order[i]) << ", step " << i;
    ASSERT_TRUE(tcap::testing::close(lin->weight, twin->weight, tol.rtol, tol.atol)) << alias_name(order[i]) << ", step " << i;
    ASSERT_TRUE(tcap::testing::close(a, ea, tol.rtol, tol.atol)) << alias_name(order[i]) << ", step " << i;
  }
  EXPECT_GE(step->stats().replays, 3);
}

// An intermediate written through a view of it, then read whole: in the forward (the
// write is recorded on the view, later reads name the intermediate) and so in the
// backward (CopySlices writes the gradient into a view of its buffer). Values and the
// gradient equal eager's, through tcap::compile and under compiled autograd.
Tensors writes_an_intermediate_through_a_view(const Tensors& in) {
  at::Tensor h = in[0] * 1.5 + 0.5;
  h.view({-1}).narrow(0, 2, 5).mul_(in[1]);
  return {torch::tanh(h).sum(0) + h.narrow(0, 1, 2).sum()};
}

TEST_P(Aliasing, AnIntermediateWrittenThroughAViewThenReadWhole) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  CompileOptions o;
  o.backend = backend;
  o.name = "write_through_view_" + backend;
  auto f = tcap::compile(writes_an_intermediate_through_a_view, o);
  const Tol tol = tolerance(backend);
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  for (int i = 0; i < 4; ++i) {
    const at::Tensor x = torch::randn({4, 3}), w = torch::randn({5});
    for (const bool through_compile : {true, false}) {
      const at::Tensor a = x.clone().requires_grad_(), ea = x.clone().requires_grad_();
      at::Tensor got;
      if (through_compile) {
        got = (*f)({a, w})[0];
        got.sum().backward();
      } else {
        got = writes_an_intermediate_through_a_view({a, w})[0];
        tcap::CompiledAutogradGuard ca(o);
        got.sum().backward();
      }
      const at::Tensor ref = writes_an_intermediate_through_a_view({ea, w})[0];
      ref.sum().backward();
      const std::string what = std::string(through_compile ? "compile" : "compiled autograd") + ", call " +
                               std::to_string(i);
      ASSERT_TRUE(tcap::testing::close(got, ref, tol.rtol, tol.atol)) << what;
      ASSERT_TRUE(tcap::testing::close(a.grad(), ea.grad(), tol.rtol, tol.atol)) << what << " (gradient)";
    }
  }
  EXPECT_GE(f->stats().replays, 3);
  tcap::CompiledAutogradGuard ca(o);
  EXPECT_GE(ca.stats().replays, 3);
  tcap::reset_compiled_autograd();
}

// out= overloads write their `out` (Note [Writes are not lowered], fuse/lowering.cpp): into
// an input that is also an operand (amsgrad's max_out), a fresh buffer, an intermediate
// overwritten, another input read by the same op; the inputs written must hold eager's
// values after each call, and so must what the function returns.
Tensors writes_through_out_overloads(const Tensors& in) {
  at::Tensor state = in[1], acc = in[2];
  at::maximum_out(state, in[0], state);
  at::Tensor t = at::empty_like(in[0]);
  at::mul_out(t, in[0], in[1]);
  at::Tensor u = in[0] * 2;
  at::exp_out(u, t.neg());
  at::add_out(acc, acc, u, 0.5);
  return {u.sum(0), t + 1};
}

TEST_P(Aliasing, OutOverloadsWriteTheirOut) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  CompileOptions o;
  o.backend = backend;
  o.name = "out_overloads_" + backend;
  auto f = tcap::compile(writes_through_out_overloads, o);
  const Tol tol = tolerance(backend);
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  for (int i = 0; i < 4; ++i) {
    const Tensors data{torch::randn({5, 7}), torch::randn({5, 7}), torch::randn({5, 7})};
    Tensors in, ref_in;
    for (const auto& d : data) in.push_back(d.clone()), ref_in.push_back(d.clone());
    const Tensors got = (*f)(in), ref = writes_through_out_overloads(ref_in);
    for (size_t j = 0; j < got.size(); ++j) {
      ASSERT_TRUE(tcap::testing::close(got[j], ref[j], tol.rtol, tol.atol)) << "output " << j << ", call " << i;
    }
    for (size_t j = 0; j < in.size(); ++j) {
      ASSERT_TRUE(tcap::testing::close(in[j], ref_in[j], tol.rtol, tol.atol)) << "input " << j << ", call " << i;
    }
  }
  EXPECT_GE(f->stats().replays, 3);
}

// An out= overload whose `out` has another shape resizes it (ATen warns, then resizes):
// the input written must come back with eager's shape and values, never broadcast into its
// old shape.
TEST_P(Aliasing, OutOverloadsThatResizeTheirOut) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  CompileOptions o;
  o.backend = backend;
  o.name = "out_resized_" + backend;
  auto fn = [](const Tensors& in) {
    at::Tensor out = in[1];
    at::mul_out(out, in[0], in[0]);
    return Tensors{out + 1};
  };
  auto f = tcap::compile(fn, o);
  const Tol tol = tolerance(backend);
  for (int i = 0; i < 4; ++i) {
    const at::Tensor x = torch::randn({5});
    Tensors in{x, torch::randn({4, 5})}, ref_in{x, in[1].clone()};
    const Tensors got = (*f)(in), ref = fn(ref_in);
    ASSERT_EQ(in[1].sizes(), ref_in[1].sizes()) << "call " << i;
    ASSERT_TRUE(tcap::testing::close(in[1], ref_in[1], tol.rtol, tol.atol)) << "call " << i;
    ASSERT_TRUE(tcap::testing::close(got[0], ref[0], tol.rtol, tol.atol)) << "call " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Soundness, Aliasing, ::testing::Values(std::string("eager"), std::string("llvm")));

}  // namespace
}  // namespace tcap::soundness
