// Note [Calls that run eagerly] (cache/entry_cache.h): what runs eagerly is held by the
// cache in one form for every front door, and the serving loop serves it: a whole front
// door (reported once), an entry of compile_step (every call it serves reported), a
// backward structure of compiled autograd (every backward of that structure, at any
// sizes, reported). Each call is eager's, counted as an eager call, and what runs
// eagerly is never captured again. (A whole front door falling back is tested with its causes.)
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/stance.h>
#include <tcap/train_step.h>

#include "support/compare.h"
#include "support/log_capture.h"
#include "support/models.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

namespace {

using tcap::testing::close;
using tcap::testing::LogCapture;

// Turns error_on_fallback on for one scope.
struct ErrorOnFallback {
  ErrorOnFallback() { tcap::set_error_on_fallback(true); }
  ~ErrorOnFallback() { tcap::set_error_on_fallback(false); }
};

// A ReLU whose backward keeps the gradient where x > 0 through nonzero and index: sizes
// that come from values, which a compiled backward cannot check.
struct MaskedRelu : torch::autograd::Function<MaskedRelu> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    ctx->save_for_backward({x});
    return x.clamp_min(0);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor idx = torch::nonzero(x > 0).squeeze(1);
    at::Tensor g = torch::zeros_like(grads[0]);
    g.index_put_({idx}, grads[0].index({idx}));
    return {g};
  }
};

// Compiled autograd runs that backward's structure eagerly from its first capture on, at
// every size; each backward is reported, and gradients are eager's.
TEST(CallsThatRunEagerly, ABackwardStructureThatCannotBeCompiledRunsEagerlyAtEverySize) {
  tcap::CompileOptions o;
  o.name = "eager_structure";
  auto backward = [](int64_t n) {
    auto x = torch::randn({n}, torch::requires_grad());
    torch::sin(MaskedRelu::apply(x * 2)).sum().backward();
    const at::Tensor h = 2 * x.detach();
    EXPECT_TRUE(close(x.grad(), 2 * torch::cos(h.clamp_min(0)) * (h > 0).to(at::kFloat))) << "size " << n;
  };
  LogCapture log("graph_breaks");
  tcap::CompileStats s;
  {
    tcap::CompiledAutogradGuard ca(o);
    for (int64_t n : {5, 5, 9, 13}) backward(n);
    s = ca.stats();
  }
  EXPECT_EQ(s.captures, 1) << "the structure is captured once, whatever the sizes";
  EXPECT_EQ(s.compiles, 0);
  EXPECT_EQ(s.eager_calls, 3);
  EXPECT_EQ(s.replays, 0);
  EXPECT_EQ(log.count("for this graph structure, from now on"), 1) << log.text();
  EXPECT_EQ(log.count("compiled autograd (for this graph structure) runs eagerly"), 3) << log.text();
  {
    // Under error_on_fallback each such backward throws.
    ErrorOnFallback on;
    tcap::CompiledAutogradGuard ca(o);
    auto x = torch::randn({7}, torch::requires_grad());
    EXPECT_THROW(torch::sin(MaskedRelu::apply(x * 2)).sum().backward(), tcap::FallbackError);
  }
  tcap::reset_compiled_autograd();
}

struct CountingHook : torch::autograd::PostAccumulateGradHook {
  explicit CountingHook(int* calls) : calls(calls) {}
  void operator()(const torch::autograd::Variable&) override { ++*calls; }
  int* calls;
};

// compile_step: an entry whose step cannot be compiled (a post-accumulate-grad hook a
// replay would skip) runs eagerly for its guards; every call it serves is reported, and
// the entry is never captured again. A call with other guards (.grad defined, another
// batch size: static entries of their own) is captured, and runs eagerly for the same
// reason.
TEST(CallsThatRunEagerly, AStepEntryThatCannotBeCompiledRunsEagerlyForItsGuards) {
  torch::manual_seed(3);
  torch::nn::Linear model(5, 2), twin(5, 2);
  tcap::testing::copy_parameters(*model, *twin);
  int calls = 0;
  torch::autograd::impl::set_post_acc_grad_hooks(model->weight, std::make_unique<CountingHook>(&calls));
  torch::optim::SGD opt(model->parameters(), 0.1), opt_twin(twin->parameters(), 0.1);
  auto body = [](torch::nn::Linear& m, torch::optim::SGD& o, const at::Tensor& x) {
    o.zero_grad();
    auto loss = m->forward(x).pow(2).mean();
    loss.backward();
    o.step();
    return loss;
  };
  tcap::CompileOptions co;
  co.name = "eager_entry";
  co.dynamic = false;
  auto step = tcap::compile_step(model, opt, [&](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{body(model, opt, in[0])};
  }, co);
  LogCapture log("graph_breaks");
  for (int64_t rows : {3, 3, 3, 4, 4}) {
    const at::Tensor x = torch::randn({rows, 5});
    EXPECT_TRUE(close((*step)({x})[0], body(twin, opt_twin, x)));
  }
  EXPECT_EQ(calls, 5) << "the hook runs every step";
  const auto s = step->stats();
  // Guards: 3 rows without .grad (the first call), 3 rows with, 4 rows with.
  EXPECT_EQ(s.captures, 3) << "one per guards";
  EXPECT_EQ(s.replays, 0);
  EXPECT_EQ(s.eager_calls, 2) << "the calls the marked entries served";
  EXPECT_EQ(log.count("step 'eager_entry' (for these guards) runs eagerly"), 5) << log.text();
  EXPECT_NE(step->eager_reason().find("post-accumulate-grad hook"), std::string::npos) << step->eager_reason();
  for (const auto& p : model->named_parameters()) EXPECT_TRUE(close(p.value(), twin->named_parameters()[p.key()]));
  {
    ErrorOnFallback on;
    EXPECT_THROW((*step)({torch::randn({3, 5})}), tcap::FallbackError);
  }
  torch::autograd::impl::post_acc_grad_hooks(model->weight).reset();
}

}  // namespace
