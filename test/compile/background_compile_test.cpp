// Note [Kernels compiled in the background] (runtime/background_compiles.h) and Note
// [Specializations in the background] (cache/dynamic_sizes.h), end to end:
// with CompileOptions::compile_in_background, a graph's llvm kernels compile on the
// background thread and its fused groups run their ATen ops until they are ready. The
// thread is paused to make "not ready yet" certain, then let go. Every call is compared
// with an eager twin: outputs and gradients at rtol 1e-4, atol 1e-5 (the kernels reorder
// sums), parameters after Adam steps at rtol 1e-4, atol 1e-5.
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/train_step.h>

#include "codegen/cpu_llvm/cpu_llvm.h"
#include "runtime/background_compiles.h"
#include "runtime/fused_kernel.h"
#include "support/compare.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;
namespace nn = torch::nn;
namespace rt = tcap::runtime;

struct Net : nn::Module {
  Net()
      : fc1(register_module("fc1", nn::Linear(24, 40))),
        norm(register_module("norm", nn::LayerNorm(nn::LayerNormOptions({40})))),
        fc2(register_module("fc2", nn::Linear(40, 24))) {}
  at::Tensor forward(const at::Tensor& x) {
    return fc2->forward(torch::gelu(norm->forward(fc1->forward(x))) * 1.5 + 0.25).log_softmax(1);
  }
  nn::Linear fc1;
  nn::LayerNorm norm;
  nn::Linear fc2;
};

void copy_params(Net& to, Net& from) {
  torch::NoGradGuard g;
  auto a = to.parameters(), b = from.parameters();
  for (size_t i = 0; i < a.size(); ++i) a[i].copy_(b[i]);
}

bool llvm_here() { return tcap::Backend("llvm").available(); }

// Pauses the background thread for a scope; always lets it go again.
struct Paused {
  Paused() { rt::pause_background_compiles_for_testing(true); }
  ~Paused() { rt::pause_background_compiles_for_testing(false); }
};

tcap::CompileOptions background_options(const std::string& name) {
  tcap::CompileOptions o;
  o.name = name;
  o.backend = "llvm";
  o.compile_in_background = true;
  return o;
}

// One call of f and of the twin on fresh inputs (`transposed`: a non-contiguous input),
// outputs and parameter gradients compared.
void call_and_compare(const tcap::CompiledFn& f, Net& net, Net& twin, int64_t b, bool transposed = false) {
  const at::Tensor x = transposed ? torch::randn({24, b}).t() : torch::randn({b, 24});
  const at::Tensor w = torch::randn({b, 24});
  const at::Tensor y = f(x)[0];
  const at::Tensor want = twin.forward(x);
  EXPECT_TRUE(close(y, want, 1e-4, 1e-5));
  (y * w).sum().backward();
  (want * w).sum().backward();
  auto pa = net.parameters(), pb = twin.parameters();
  for (size_t p = 0; p < pa.size(); ++p) EXPECT_TRUE(close(pa[p].grad(), pb[p].grad(), 1e-4, 1e-5)) << p;
  net.zero_grad();
  twin.zero_grad();
}

TEST(BackgroundCompiles, GroupsRunTheirAtenOpsUntilTheKernelsAreReady) {
  if (!llvm_here()) GTEST_SKIP() << "no LLVM backend here";
  tcap::codegen::cpu_llvm::cpu_llvm_clear_memory_cache_for_testing();
  torch::manual_seed(0);
  auto net = std::make_shared<Net>();
  auto twin = std::make_shared<Net>();
  copy_params(*twin, *net);
  auto f = tcap::compile(net, [&](const Tensors& in) { return Tensors{net->forward(in[0])}; },
                         background_options("background_forward_backward"));
  {
    Paused paused;
    const auto before = rt::background_compile_stats();
    const auto launches = rt::runtime_stats().launches;
    // Each entry's graphs submit their kernels at their first run: the transposed input
    // is an entry of its own, replayed once here too.
    for (int i = 0; i < 4; ++i) {
      SCOPED_TRACE("paused call " + std::to_string(i));
      call_and_compare(f, *net, *twin, 13, i >= 2);
    }
    const auto during = rt::background_compile_stats();
    EXPECT_GE(during.jobs, before.jobs + 2);  // the forward's kernels and the backward's
    EXPECT_GT(during.unfused_runs, before.unfused_runs);
    EXPECT_EQ(rt::runtime_stats().launches, launches) << "no kernel can run before its compile";
    EXPECT_EQ(f->stats().replays, 2);
  }
  tcap::wait_for_background_compiles();
  const auto ready = rt::background_compile_stats();
  const auto launches = rt::runtime_stats().launches;
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE("call " + std::to_string(i) + " after the kernels are ready");
    call_and_compare(f, *net, *twin, 13, i == 1);
  }
  EXPECT_GT(rt::runtime_stats().launches, launches);
  EXPECT_EQ(rt::background_compile_stats().unfused_runs, ready.unfused_runs);
  EXPECT_EQ(ready.failed, 0);
  EXPECT_EQ(f->eager_reason(), "");
}

TEST(BackgroundCompiles, ADynamicEntryAtManySizes) {
  if (!llvm_here()) GTEST_SKIP() << "no LLVM backend here";
  tcap::codegen::cpu_llvm::cpu_llvm_clear_memory_cache_for_testing();
  torch::manual_seed(1);
  auto net = std::make_shared<Net>();
  auto twin = std::make_shared<Net>();
  copy_params(*twin, *net);
  tcap::CompileOptions o = background_options("background_sizes");
  o.cache_size_limit = 32;  // 0, 1 and transposed inputs are entries of their own
  auto f = tcap::compile(net, [&](const Tensors& in) { return Tensors{net->forward(in[0])}; }, o);
  const std::vector<int64_t> sizes = {6, 9, 9, 2, 2, 31, 31, 9, 64, 64, 5, 5, 0, 1, 1, 17, 17};
  int64_t unfused = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    SCOPED_TRACE("call " + std::to_string(i) + " batch " + std::to_string(sizes[i]));
    if (i == 0) {
      // Every size before its kernels: paused from the first call, so that no kernel
      // structure is compiled before the sizes that would need it (which one would be is
      // a race with the background thread).
      rt::pause_background_compiles_for_testing(true);
      unfused = rt::background_compile_stats().unfused_runs;
    }
    if (i == 11) {
      EXPECT_GT(rt::background_compile_stats().unfused_runs, unfused);
      rt::pause_background_compiles_for_testing(false);
    }
    call_and_compare(f, *net, *twin, sizes[i], i % 5 == 4);
  }
  rt::pause_background_compiles_for_testing(false);
  tcap::wait_for_background_compiles();
  for (int64_t b : {9, 64, 23}) {
    SCOPED_TRACE("batch " + std::to_string(b) + " after the kernels are ready");
    call_and_compare(f, *net, *twin, b);
  }
  EXPECT_EQ(f->eager_reason(), "");
  // While paused, admitted sizes ran eagerly (their specializations waiting too: Note
  // [Specializations in the background]); after the wait, 9 and 64 replay.
  EXPECT_GE(f->stats().replays, 3);
  EXPECT_GE(f->stats().eager_calls, 1);
}

// Note [Specializations in the background], the same at every front door: with the
// thread paused, three calls at sizes whose specialization is pending run eagerly; once it
// is made, three calls replay it (the llvm kernels, submitted at its first run, waited for
// before the third). `call` makes one call at those sizes and compares it with eager;
// `stats` reads the door's stats, `before` as they were before the first of these calls.
template <class Call, class ReadStats>
void expect_eager_until_made(Call&& call, ReadStats&& stats, const tcap::CompileStats& before) {
  {
    Paused paused;
    for (int i = 0; i < 3; ++i) {
      SCOPED_TRACE("paused call " + std::to_string(i));
      call();
    }
    const auto during = stats();
    EXPECT_EQ(during.eager_calls, before.eager_calls + 3);
    EXPECT_EQ(during.replays, before.replays);
    EXPECT_EQ(during.compiles, before.compiles);
  }
  tcap::wait_for_background_compiles();
  for (int i = 0; i < 2; ++i) call();
  tcap::wait_for_background_compiles();
  call();
  const auto after = stats();
  EXPECT_EQ(after.compiles, before.compiles + 1);
  EXPECT_EQ(after.replays, before.replays + 3);
  EXPECT_EQ(after.eager_calls, before.eager_calls + 3);
}

// A training step with Adam: the step function the compile_step tests compile.
Tensors adam_step(Net& m, torch::optim::Optimizer& o, const Tensors& in) {
  o.zero_grad();
  auto loss = torch::nll_loss(m.forward(in[0]), in[1]);
  loss.backward();
  o.step();
  return Tensors{loss};
}

// Note [Specializations in the background]: a dynamic entry at sizes it has admitted runs
// eagerly while their specialization is made on the background thread (paused here, so
// "not ready" is certain), then replays it; both backends, forward and backward against
// an eager twin.
TEST(BackgroundCompiles, SpecializationsRunEagerlyUntilTheyAreReady) {
  for (const char* backend : {"eager", "llvm"}) {
    if (std::string(backend) == "llvm" && !llvm_here()) continue;
    SCOPED_TRACE(backend);
    torch::manual_seed(3);
    auto net = std::make_shared<Net>();
    auto twin = std::make_shared<Net>();
    copy_params(*twin, *net);
    tcap::CompileOptions o = background_options(std::string("background_specializations_") + backend);
    o.backend = backend;
    auto f = tcap::compile(net, [&](const Tensors& in) { return Tensors{net->forward(in[0])}; }, o);
    for (int64_t b : {6, 9, 11}) call_and_compare(f, *net, *twin, b);  // two captures, then a check at 11
    const auto before = f->stats();
    EXPECT_EQ(before.captures, 2);
    EXPECT_EQ(before.size_checks, 1);
    expect_eager_until_made([&] { call_and_compare(f, *net, *twin, 11); }, [&] { return f->stats(); }, before);
    EXPECT_EQ(f->eager_reason(), "");
  }
}

TEST(BackgroundCompiles, CompileStepWithAdam) {
  if (!llvm_here()) GTEST_SKIP() << "no LLVM backend here";
  tcap::codegen::cpu_llvm::cpu_llvm_clear_memory_cache_for_testing();
  torch::manual_seed(2);
  auto net = std::make_shared<Net>();
  auto twin = std::make_shared<Net>();
  copy_params(*twin, *net);
  torch::optim::Adam opt(net->parameters(), 1e-2);
  torch::optim::Adam opt_twin(twin->parameters(), 1e-2);
  const auto body = adam_step;
  auto step = tcap::compile_step(net, opt, [&](const Tensors& in) { return body(*net, opt, in); },
                                 background_options("background_step"));
  for (int i = 0; i < 12; ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    if (i == 2) rt::pause_background_compiles_for_testing(true);
    if (i == 6) {
      rt::pause_background_compiles_for_testing(false);
      tcap::wait_for_background_compiles();
    }
    const Tensors in{torch::randn({10, 24}), torch::randint(0, 24, {10})};
    const at::Tensor loss = (*step)(in)[0];
    const at::Tensor want = body(*twin, opt_twin, in)[0];
    EXPECT_TRUE(close(loss, want, 1e-4, 1e-5));
    auto pa = net->parameters(), pb = twin->parameters();
    for (size_t p = 0; p < pa.size(); ++p) EXPECT_TRUE(close(pa[p], pb[p], 1e-4, 1e-5)) << p;
  }
  rt::pause_background_compiles_for_testing(false);
  EXPECT_EQ(step->eager_reason(), "");
  EXPECT_GE(step->stats().replays, 8);
}

// compile_step's specializations too: a step at new batch sizes runs eagerly (right
// values, the optimizer's state moving as eager's) until its specialization is stored.
TEST(BackgroundCompiles, StepSpecializationsRunEagerlyUntilTheyAreReady) {
  for (const char* backend : {"eager", "llvm"}) {
    if (std::string(backend) == "llvm" && !llvm_here()) continue;
    SCOPED_TRACE(backend);
    torch::manual_seed(4);
    auto net = std::make_shared<Net>();
    auto twin = std::make_shared<Net>();
    copy_params(*twin, *net);
    torch::optim::Adam opt(net->parameters(), 1e-2);
    torch::optim::Adam opt_twin(twin->parameters(), 1e-2);
    const auto body = adam_step;
    tcap::CompileOptions o = background_options(std::string("background_step_specializations_") + backend);
    o.backend = backend;
    auto step = tcap::compile_step(net, opt, [&](const Tensors& in) { return body(*net, opt, in); }, o);
    auto call = [&](int64_t b) {
      const Tensors in{torch::randn({b, 24}), torch::randint(0, 24, {b})};
      const at::Tensor loss = (*step)(in)[0];
      const at::Tensor want = body(*twin, opt_twin, in)[0];
      EXPECT_TRUE(close(loss, want, 1e-4, 1e-5));
      auto pa = net->parameters(), pb = twin->parameters();
      for (size_t p = 0; p < pa.size(); ++p) EXPECT_TRUE(close(pa[p], pb[p], 1e-4, 1e-5)) << p;
    };
    // Two captures at 6, two at 9 (compile_step compiles an entry from its second
    // capture), a replay at each; then a check at 11.
    for (int64_t b : {6, 6, 6, 9, 9, 9}) call(b);
    tcap::wait_for_background_compiles();
    call(11);
    const auto before = step->stats();
    ASSERT_EQ(before.size_checks, 1) << "the entry did not become dynamic";
    expect_eager_until_made([&] { call(11); }, [&] { return step->stats(); }, before);
    EXPECT_EQ(step->eager_reason(), "");
  }
}

// And compiled autograd's: a backward at new batch sizes runs in the engine (eager's
// gradients) until its specialization is stored.
TEST(BackgroundCompiles, BackwardSpecializationsRunEagerlyUntilTheyAreReady) {
  for (const char* backend : {"eager", "llvm"}) {
    if (std::string(backend) == "llvm" && !llvm_here()) continue;
    SCOPED_TRACE(backend);
    tcap::reset_compiled_autograd();
    torch::manual_seed(5);
    auto net = std::make_shared<Net>();
    auto twin = std::make_shared<Net>();
    copy_params(*twin, *net);
    tcap::CompileOptions o = background_options(std::string("background_backward_specializations_") + backend);
    o.backend = backend;
    auto stats = [&] {
      tcap::CompiledAutogradGuard ca(o);
      return ca.stats();
    };
    auto call = [&](int64_t b) {
      const Tensors in{torch::randn({b, 24}), torch::randint(0, 24, {b})};
      {
        tcap::CompiledAutogradGuard ca(o);
        torch::nll_loss(net->forward(in[0]), in[1]).backward();
      }
      torch::nll_loss(twin->forward(in[0]), in[1]).backward();
      auto pa = net->parameters(), pb = twin->parameters();
      for (size_t p = 0; p < pa.size(); ++p) EXPECT_TRUE(close(pa[p].grad(), pb[p].grad(), 1e-4, 1e-5)) << p;
      net->zero_grad();
      twin->zero_grad();
    };
    for (int64_t b : {6, 9}) call(b);  // the second entry is dynamic over the first
    tcap::wait_for_background_compiles();
    call(11);  // a check
    const auto before = stats();
    ASSERT_EQ(before.size_checks, 1) << "the entry did not become dynamic";
    expect_eager_until_made([&] { call(11); }, [&] { return stats(); }, before);
  }
}

TEST(BackgroundCompiles, AGraphThatDiesBeforeItsKernelsAreCompiled) {
  if (!llvm_here()) GTEST_SKIP() << "no LLVM backend here";
  tcap::codegen::cpu_llvm::cpu_llvm_clear_memory_cache_for_testing();
  torch::manual_seed(3);
  auto net = std::make_shared<Net>();
  const int64_t ready_before = rt::background_compile_stats().kernels;
  {
    Paused paused;
    auto f = tcap::compile(net, [&](const Tensors& in) { return Tensors{net->forward(in[0])}; },
                           background_options("background_dies"));
    torch::NoGradGuard no_grad;
    for (int i = 0; i < 3; ++i) {
      const at::Tensor x = torch::randn({7, 24});
      EXPECT_TRUE(close(f(x)[0], net->forward(x), 1e-4, 1e-5));
    }
  }  // f and its kernels die, then the thread goes on
  tcap::wait_for_background_compiles();
  EXPECT_EQ(rt::background_compile_stats().kernels, ready_before) << "the dead graph's kernels were skipped";
}

}  // namespace
