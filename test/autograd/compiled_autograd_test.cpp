// Compiled autograd (include/tcap/compiled_autograd.h): the scenarios of the seed
// 002 (compiled autograd tutorial) in C++, each checked against eager LibTorch.
#include <tcap/compiled_autograd.h>
#include <tcap/compile.h>
#include <tcap/stance.h>

#include "ca_fixture.h"

#include "support/backends.h"
#include "support/compare.h"
#include "support/log_capture.h"
#include "support/logging.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

namespace {

using tcap::testing::close;

using tcap::testing::LogCapture;

using tcap::testing::count_call_hooks;
using tcap::testing::opts;
using CompiledAutograd = tcap::testing::CompiledAutogradTest;

// Seed 002, "Basic usage": a linear layer; the second backward is served compiled and
// matches eager, values and .grad.
TEST_F(CompiledAutograd, LinearModelCompiledBackwardMatchesEager) {
  torch::nn::Linear model(10, 10);
  torch::nn::Linear ref(10, 10);
  {
    torch::NoGradGuard ng;
    ref->weight.copy_(model->weight);
    ref->bias.copy_(model->bias);
  }
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({7, 10});
    {
      tcap::CompiledAutogradGuard ca(opts("linear"));
      model->forward(x).sum().backward();
      auto st = ca.stats();
      EXPECT_EQ(st.captures, 1);
      EXPECT_EQ(st.replays, step);
    }
    ref->forward(x).sum().backward();
    EXPECT_TRUE(close(model->weight.grad(), ref->weight.grad()));
    EXPECT_TRUE(close(model->bias.grad(), ref->bias.grad()));
  }
}

// Note [Tensors that alias in a walk]: a backward whose two roots got one gradient tensor
// is captured with one tangent for both; a later backward with two different gradients
// must be captured again, not served by that graph (it once was, and got the first
// root's gradient where the second's belonged).
TEST_F(CompiledAutograd, RootGradientsThatAliasedAreNotReusedWhenTheyDiffer) {
  auto a = torch::randn({4, 5}, torch::requires_grad());
  auto b = torch::randn({4, 5}, torch::requires_grad());
  tcap::CompiledAutogradGuard ca(opts("roots"));
  for (double c : {1.0, 1.0, 2.0, -3.0, 1.0}) {
    SCOPED_TRACE("c = " + std::to_string(c));
    a.mutable_grad().reset();
    b.mutable_grad().reset();
    auto ones = torch::ones({4, 5});
    auto run = [&](const at::Tensor& x, const at::Tensor& y) {
      auto o0 = torch::tanh(x * y), o1 = torch::sin(y);
      if (c == 1.0) torch::autograd::backward({o0, o1}, {ones, ones});  // one tensor for both roots
      else torch::autograd::backward({o0, o1}, {ones * c, ones});
    };
    run(a, b);
    auto ar = a.detach().clone().requires_grad_(true), br = b.detach().clone().requires_grad_(true);
    {
      tcap::StanceGuard eager(tcap::Stance::ForceEager);  // the reference: the engine itself
      run(ar, br);
    }
    EXPECT_TRUE(close(a.grad(), ar.grad()));
    EXPECT_TRUE(close(b.grad(), br.grad()));
  }
  const auto st = ca.stats();
  EXPECT_EQ(st.captures, 2) << "one graph for one gradient tensor, one for two";
  EXPECT_EQ(st.replays, 3);
}

// CompileOptions::bw_compiler compiles the backward graphs (torch's
// compiled_autograd.enable(compiler_fn)); a different compiler gets its own cache.
int g_counting_compiles = 0;
tcap::Executable counting_compiler(const tcap::ir::Graph& g) {
  ++g_counting_compiles;
  return tcap::eager_backend(g);
}
tcap::Executable other_compiler(const tcap::ir::Graph& g) { return tcap::eager_backend(g); }

TEST_F(CompiledAutograd, BwCompilerCompilesTheBackward) {
  torch::nn::Linear model(10, 4);
  tcap::CompileOptions o = opts("bw_compiler");
  o.bw_compiler = counting_compiler;
  g_counting_compiles = 0;
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({7, 10});
    model->zero_grad();
    torch::tanh(model->forward(x)).sum().backward();
    const at::Tensor want = model->weight.grad().clone();
    model->zero_grad();
    tcap::CompiledAutogradGuard ca(o);
    torch::tanh(model->forward(x)).sum().backward();
    EXPECT_EQ(ca.stats().replays, step);
    EXPECT_TRUE(close(model->weight.grad(), want));
  }
  EXPECT_EQ(g_counting_compiles, 1);
  o.bw_compiler = other_compiler;
  tcap::CompiledAutogradGuard other(o);
  EXPECT_EQ(other.stats().calls, 0) << "a different bw_compiler shared the first one's cache";
}

// Seed 002: "Graph breaks in the forward pass lead to graph breaks in the backward pass".
// Three separately compiled regions: tcap::compile makes three backward graphs,
// compiled autograd makes one.
TEST_F(CompiledAutograd, ThreeRegionsGiveOneBackwardGraph) {
  auto r1 = tcap::compile([](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{in[0] + 10}; },
                          opts("r1"));
  auto r2 = tcap::compile([](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{in[0] + 10}; },
                          opts("r2"));
  auto r3 = tcap::compile([](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{in[0].sum()}; },
                          opts("r3"));
  auto fn = [&](const at::Tensor& x) { return (*r3)({(*r2)({(*r1)({x})[0]})[0]})[0]; };
  // Warm the regions up: each compiles its own forward and backward.
  for (int i = 0; i < 2; ++i) {
    auto x = torch::randn({10, 10}, torch::requires_grad());
    fn(x).backward();
  }
  int region_backwards = 0;  // tcap::compile: one backward graph per region
  for (const auto& r : {r1, r2, r3}) {
    region_backwards += static_cast<int>(r->entries().size());
    EXPECT_GE(r->stats().replays, 1);
  }
  EXPECT_EQ(region_backwards, 3);
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({10, 10}, torch::requires_grad());
    auto loss = fn(x);
    tcap::CompiledAutogradGuard ca(opts("three_regions"));
    loss.backward();
    EXPECT_TRUE(close(x.grad(), torch::ones({10, 10})));
    EXPECT_EQ(ca.stats().captures, 1);  // unique_graphs == 1
    EXPECT_EQ(ca.graphs().size(), 1u);
  }
}

// Regions compiled with the llvm backend, whose backward graphs run generated kernels,
// under compiled autograd (llvm too): compiled autograd records each region's backward
// replay as the ATen ops its kernels stand for (Note [A compiled graph owns its kernels]:
// no node of its graph names a kernel of another graph), and agrees with eager on fresh
// inputs at every step.
TEST_F(CompiledAutograd, RegionKernelsAreRecordedAsTheirOps) {
  TCAP_SKIP_WITHOUT_BACKEND("llvm");
  auto r1 = tcap::compile(
      [](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{(in[0] * 1.5).sin() * in[0]}; },
      opts("k1", "llvm"));
  auto r2 = tcap::compile(
      [](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{(in[0].tanh() + 0.5).pow(2).sum()}; },
      opts("k2", "llvm"));
  auto fn = [&](const at::Tensor& x) { return (*r2)({(*r1)({x})[0]})[0]; };
  auto eager = [](const at::Tensor& x) { return (((x * 1.5).sin() * x).tanh() + 0.5).pow(2).sum(); };
  for (int i = 0; i < 2; ++i) fn(torch::randn({7, 13}, torch::requires_grad())).backward();
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({7, 13}, torch::requires_grad());
    auto y = x.detach().clone().requires_grad_(true);
    auto loss = fn(x);
    {
      tcap::CompiledAutogradGuard ca(opts("region_kernels", "llvm"));
      loss.backward();
      const std::vector<tcap::ir::Graph> graphs = ca.graphs();
      ASSERT_EQ(graphs.size(), 1u);
      for (const auto& n : graphs[0].nodes()) {
        EXPECT_TRUE(n.op != "tcap::fused" && n.op != "tcap::fused_horizontal")
            << "node %" << n.id << " names a region's kernel";
      }
    }
    eager(y).backward();
    EXPECT_TRUE(close(x.grad(), y.grad(), 1e-4, 1e-5)) << "step " << step;
  }
}

// Seed 002: "Backward hooks are not captured": a leaf hook grad + 10 is a call_hook node
// and still runs (with its side effects) when the compiled backward replays.
TEST_F(CompiledAutograd, LeafHookIsACallHookNode) {
  int calls = 0;
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({10, 10}, torch::requires_grad());
    x.register_hook([&calls](const at::Tensor& g) {
      ++calls;
      return g + 10;
    });
    auto loss = x.sum();
    tcap::CompiledAutogradGuard ca(opts("leaf_hook"));
    loss.backward();
    EXPECT_TRUE(close(x.grad(), torch::full({10, 10}, 11.0)));
    EXPECT_EQ(ca.graphs().size(), 1u);
    EXPECT_EQ(count_call_hooks(ca.graphs().at(0)), 1) << ca.graphs().at(0);
    EXPECT_EQ(calls, step + 1);
  }
}

// Seed 002: "Due to changes in the autograd structure": one recompile per new node.
TEST_F(CompiledAutograd, NewAutogradNodeRecompiles) {
  LogCapture log("compiled_autograd_verbose");
  auto x = torch::randn({10}, torch::requires_grad());
  std::vector<std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>> ops = {
      [](const at::Tensor& a, const at::Tensor& b) { return torch::add(a, b); },
      [](const at::Tensor& a, const at::Tensor& b) { return torch::sub(a, b); },
      [](const at::Tensor& a, const at::Tensor& b) { return torch::mul(a, b); },
      [](const at::Tensor& a, const at::Tensor& b) { return torch::div(a, b); }};
  std::vector<at::Tensor> expected = {torch::full({10}, 2.0), torch::zeros({10}), 2 * x.detach(),
                                      torch::zeros({10})};
  for (int round = 0; round < 2; ++round) {
    for (size_t k = 0; k < ops.size(); ++k) {
      auto loss = ops[k](x, x).sum();
      x.mutable_grad() = at::Tensor();
      tcap::CompiledAutogradGuard ca(opts("ops"));
      loss.backward();
      EXPECT_TRUE(close(x.grad(), expected[k])) << k;
      EXPECT_EQ(ca.stats().captures, 4 * 0 + static_cast<int>(round == 0 ? k + 1 : 4));
    }
  }
  EXPECT_EQ(log.count("Cache miss due to new autograd node: torch::autograd::GraphRoot (NodeCall 0)"), 1) << log.text();
  EXPECT_EQ(log.count("Cache miss due to new autograd node: SubBackward0"), 1) << log.text();
  EXPECT_EQ(log.count("Cache miss due to new autograd node: MulBackward0"), 1) << log.text();
  EXPECT_EQ(log.count("Cache miss due to new autograd node: DivBackward0"), 1) << log.text();
}

// A constant inside a node is part of the key: the backward of x * 1.02 is not served by
// the graph compiled for x * 1.01 (which would compute the wrong gradient).
TEST_F(CompiledAutograd, ChangedConstantRecompiles) {
  auto x = torch::randn({9}, torch::requires_grad());
  for (double c : {1.01, 1.01, 1.02, 1.02, 1.01}) {
    x.mutable_grad() = at::Tensor();
    auto loss = torch::sin(x * c).sum();
    tcap::CompiledAutogradGuard ca(opts("constant"));
    loss.backward();
    EXPECT_TRUE(close(x.grad(), torch::cos(x.detach() * c) * c)) << c;
  }
  tcap::CompiledAutogradGuard ca(opts("constant"));
  EXPECT_EQ(ca.stats().captures, 2);
  EXPECT_EQ(ca.stats().replays, 3);
}

// Seed 002: "Due to tensors changing shapes": sizes 10, 100, 10 -> one recompile, then
// the changed sizes are dynamic and a new size, once checked, reuses the compiled graph.
TEST_F(CompiledAutograd, ChangedShapesBecomeDynamic) {
  LogCapture log("recompiles");
  for (int n : {10, 100, 10, 37, 37}) {
    auto x = torch::randn({n, n}, torch::requires_grad());
    auto loss = (x * x).sum();
    tcap::CompiledAutogradGuard ca(opts("shapes"));
    loss.backward();
    EXPECT_TRUE(close(x.grad(), 2 * x.detach())) << n;
  }
  tcap::CompiledAutogradGuard ca(opts("shapes"));
  auto st = ca.stats();
  EXPECT_EQ(st.captures, 2) << log.text();
  EXPECT_EQ(st.recompiles, 1);
  EXPECT_EQ(st.replays, 2);     // 10, and 37 once checked (Note [Checking a new size])
  EXPECT_EQ(st.size_checks, 1);
  EXPECT_GE(log.count("Cache miss due to changed shapes: marking size idx"), 1) << log.text();
  EXPECT_EQ(log.count("specialized to sizes [37]"), 1) << log.text();
}

// retain_graph=true twice: the second call is a hit and accumulates like eager.
TEST_F(CompiledAutograd, RetainGraphTwice) {
  auto w = torch::randn({5, 3}, torch::requires_grad());
  auto xin = torch::randn({4, 5});
  auto w_ref = w.detach().clone().requires_grad_(true);
  auto loss = torch::tanh(torch::mm(xin, w)).pow(2).sum();
  auto loss_ref = torch::tanh(torch::mm(xin, w_ref)).pow(2).sum();
  tcap::CompiledAutogradGuard ca(opts("retain"));
  loss.backward({}, /*retain_graph=*/true);
  loss.backward({}, /*retain_graph=*/true);
  EXPECT_EQ(ca.stats().replays, 1);
  loss_ref.backward({}, true);
  loss_ref.backward({}, true);
  EXPECT_TRUE(close(w.grad(), w_ref.grad()));
  // Without retain_graph the replay frees the graph as the engine does.
  loss.backward();
  EXPECT_THROW(loss.backward(), c10::Error);
}

// Note [Saved tensors freed as the backward runs]: like the engine, the compiled backward
// drops a saved tensor once the backward no longer needs it, not when it returns. A hook
// that runs after sin's backward sees the tensor sin saved already freed; with
// retain_graph the graph keeps it. (The first, capturing call runs the engine with the
// walk's references held: only replays free early.)
TEST_F(CompiledAutograd, SavedTensorsAreFreedAsTheBackwardRuns) {
  for (const char* backend : {"eager", "llvm"}) {
    if (!tcap::testing::backend_built(backend, nullptr)) continue;
    SCOPED_TRACE(backend);
    tcap::reset_compiled_autograd();
    auto w = torch::randn({64, 64}, torch::requires_grad());
    auto w_ref = w.detach().clone().requires_grad_(true);
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      auto x = torch::randn({64, 64});
      bool saved_alive_at_hook = true;
      bool retain = step == 2;
      {
        tcap::CompiledAutogradGuard ca(opts("saved_freed", backend));
        auto t = torch::mm(x, w) * 1.5;  // saved by sin's backward only
        c10::weak_intrusive_ptr<c10::StorageImpl> weak = t.storage().getWeakStorageImpl();
        auto u = torch::sin(t);
        t.register_hook([&](const at::Tensor& g) {  // runs after SinBackward
          saved_alive_at_hook = !weak.expired();
          return g;
        });
        t.reset();
        auto loss = (u * u).sum();
        loss.backward({}, retain);
        EXPECT_EQ(ca.stats().replays, step);
      }
      if (step > 0) {
        EXPECT_EQ(saved_alive_at_hook, retain) << (retain ? "retain_graph keeps the saved tensor"
                                                          : "the saved tensor outlived its last use");
      }
      auto t_ref = torch::mm(x, w_ref) * 1.5;
      (torch::sin(t_ref) * torch::sin(t_ref)).sum().backward();
      EXPECT_TRUE(close(w.grad(), w_ref.grad(), 1e-4, 1e-5));
    }
  }
}

// Note [Saved tensors of a compiled region]: a tensor that a tcap::compile region keeps for
// its backward is freed once that backward has used it, under the engine (steps 0-2) and
// under compiled autograd (steps 3-5) alike: the hook that runs after the region's backward
// sees it gone. With retain_graph the region keeps it. (Step 0 captures the region; step 3
// is compiled autograd's capturing call, which runs the engine with the walk's references
// held.)
TEST_F(CompiledAutograd, RegionSavedTensorsAreFreedOnceUsed) {
  TCAP_SKIP_WITHOUT_BACKEND("llvm");
  auto region = tcap::compile(
      [](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{torch::sin(in[0]).sum()}; },
      opts("region_saved", "llvm"));
  auto w = torch::randn({64, 64}, torch::requires_grad());
  auto w_ref = w.detach().clone().requires_grad_(true);
  for (int step = 0; step < 6; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const bool under_ca = step >= 3;
    const bool retain = step == 2 || step == 5;
    auto x = torch::randn({64, 64});
    std::vector<bool> saved_alive_at_hook;  // per backward
    {
      std::optional<tcap::CompiledAutogradGuard> ca;
      if (under_ca) ca.emplace(opts("region_saved_ca"));
      auto t = torch::mm(x, w) * 1.5;  // the region's input, which its backward needs
      c10::weak_intrusive_ptr<c10::StorageImpl> weak = t.storage().getWeakStorageImpl();
      auto loss = (*region)({t})[0];
      t.register_hook([&](const at::Tensor& g) {  // runs after the region's backward
        saved_alive_at_hook.push_back(!weak.expired());
        return g;
      });
      t.reset();
      loss.backward({}, retain);
      if (retain) loss.backward();  // a retained graph runs again, then is freed
      EXPECT_THROW(loss.backward(), c10::Error) << "a second backward through a freed graph must fail";
    }
    ASSERT_EQ(saved_alive_at_hook.size(), retain ? 2u : 1u);
    if (step != 0 && step != 3) {
      EXPECT_EQ(saved_alive_at_hook[0], retain) << (retain ? "retain_graph keeps the saved tensor"
                                                           : "the saved tensor outlived the region's backward");
    }
    if (retain) {
      EXPECT_FALSE(saved_alive_at_hook[1]) << "the last backward frees it";
    }
    auto t_ref = torch::mm(x, w_ref) * 1.5;
    torch::sin(t_ref).sum().backward();
    if (retain) torch::sin(torch::mm(x, w_ref) * 1.5).sum().backward();
    EXPECT_TRUE(close(w.grad(), w_ref.grad(), 1e-4, 1e-5));
  }
  EXPECT_GE(region->stats().replays, 4);
}

// create_graph=true runs the engine (double backward stays correct).
TEST_F(CompiledAutograd, CreateGraphFallsBackToEager) {
  auto x = torch::randn({6}, torch::requires_grad());
  tcap::CompiledAutogradGuard ca(opts("double"));
  auto y = (x * x * x).sum();
  auto g = torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  auto gg = torch::autograd::grad({g.sum()}, {x})[0];
  EXPECT_TRUE(close(g, 3 * x.detach() * x.detach()));
  EXPECT_TRUE(close(gg, 6 * x.detach()));
  EXPECT_GE(ca.stats().eager_calls, 1);
}

// grad() is compiled too; results match eager.
TEST_F(CompiledAutograd, GradIsCompiled) {
  for (int step = 0; step < 3; ++step) {
    auto a = torch::randn({3, 7}, torch::requires_grad());
    auto b = torch::randn({7}, torch::requires_grad());
    auto y = (torch::sigmoid(a) * b).sum();
    tcap::CompiledAutogradGuard ca(opts("grad"));
    auto gs = torch::autograd::grad({y}, {a, b});
    auto sa = torch::sigmoid(a.detach());
    EXPECT_TRUE(close(gs[0], sa * (1 - sa) * b.detach()));
    EXPECT_TRUE(close(gs[1], sa.sum(0)));
    EXPECT_FALSE(a.grad().defined());
    EXPECT_EQ(ca.stats().replays, step);
  }
}

// grad() without retain_graph frees the saved tensors of the nodes it runs (a second
// grad() through them fails, as with the engine) and keeps the others' (a later grad()
// of another leaf through them works), on replays too.
TEST_F(CompiledAutograd, GradReleasesOnlyTheNodesItRuns) {
  for (int step = 0; step < 3; ++step) {
    auto a = torch::randn({5}, torch::requires_grad());
    auto b = torch::randn({5}, torch::requires_grad());
    auto loss = torch::sin(a).sum() + torch::cos(b).sum();
    tcap::CompiledAutogradGuard ca(opts("grad_release"));
    auto ga = torch::autograd::grad({loss}, {a});
    EXPECT_TRUE(close(ga[0], torch::cos(a.detach())));
    EXPECT_EQ(ca.stats().replays, step);
    // cos's node did not run: its saved tensor is still there.
    auto gb = torch::autograd::grad({loss}, {b});
    EXPECT_TRUE(close(gb[0], -torch::sin(b.detach())));
    // sin's node ran and released its saved tensor.
    EXPECT_THROW(torch::autograd::grad({loss}, {a}), c10::Error) << "step " << step;
  }
}

// AccumulateGrad steals a fresh gradient instead of copying it, as under the engine: a
// compiled backward runs with grad mode off (only create_graph=false is compiled). The
// leaf's hook sees the tensor that arrives; .grad must be that tensor, not a copy.
TEST_F(CompiledAutograd, LeafGradIsStolenNotCopied) {
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({6}, torch::requires_grad());
    const void* delivered = nullptr;
    x.register_hook([&delivered](const at::Tensor& g) { delivered = g.data_ptr(); });
    auto loss = (x.sin() * 3).sum();
    tcap::CompiledAutogradGuard ca(opts("steal"));
    loss.backward();
    EXPECT_EQ(ca.stats().replays, step);
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().data_ptr(), delivered) << "step " << step << ": .grad is a copy of the delivered gradient";
    EXPECT_FALSE(x.grad().requires_grad());
    EXPECT_TRUE(close(x.grad(), x.detach().cos() * 3));
  }
}

// A hook that throws: the exception reaches the caller, the engine stays usable.
TEST_F(CompiledAutograd, ExceptionInHookPropagates) {
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({4}, torch::requires_grad());
    const bool fail = step == 2;  // the third call is a compiled replay
    x.register_hook([fail](const at::Tensor& g) {
      if (fail) throw std::runtime_error("hook failed on purpose");
      return g * 2;
    });
    auto loss = (x * 3).sum();
    tcap::CompiledAutogradGuard ca(opts("throwing"));
    if (fail) {
      EXPECT_THROW(loss.backward(), std::exception);
    } else {
      loss.backward();
      EXPECT_TRUE(close(x.grad(), torch::full({4}, 6.0)));
    }
  }
  // Still usable, with and without the guard.
  auto x = torch::randn({4}, torch::requires_grad());
  (x * 3).sum().backward();
  EXPECT_TRUE(close(x.grad(), torch::full({4}, 3.0)));
  {
    tcap::CompiledAutogradGuard ca(opts("after_throw"));
    auto z = torch::randn({4}, torch::requires_grad());
    (z * 3).sum().backward();
    EXPECT_TRUE(close(z.grad(), torch::full({4}, 3.0)));
  }
}

// zero_grad() (set_to_none) between steps does not recompile; accumulation without it
// (.grad defined) is served by the same entry too.
TEST_F(CompiledAutograd, ZeroGradDoesNotRecompile) {
  torch::nn::Linear model(8, 4);
  torch::optim::SGD opt(model->parameters(), 0.1);
  for (int step = 0; step < 4; ++step) {
    opt.zero_grad();
    auto loss = model->forward(torch::randn({5, 8})).pow(2).mean();
    tcap::CompiledAutogradGuard ca(opts("zero_grad"));
    loss.backward();
    opt.step();
  }
  // Two accumulating backwards without zero_grad.
  for (int step = 0; step < 2; ++step) {
    auto loss = model->forward(torch::randn({5, 8})).pow(2).mean();
    tcap::CompiledAutogradGuard ca(opts("zero_grad"));
    loss.backward();
  }
  tcap::CompiledAutogradGuard ca(opts("zero_grad"));
  EXPECT_EQ(ca.stats().captures, 1);
  EXPECT_EQ(ca.stats().replays, 5);
}

// retain_grad() on an intermediate and a hook on it: call_hook nodes, same .grad as eager.
TEST_F(CompiledAutograd, RetainGradAndIntermediateHook) {
  std::vector<double> norms, norms_ref;
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({6, 5}, torch::requires_grad());
    auto xr = x.detach().clone().requires_grad_(true);
    auto run = [](const at::Tensor& in, std::vector<double>& log) {
      auto h = torch::relu(in) * 2;
      h.retain_grad();
      h.register_hook([&log](const at::Tensor& g) {
        log.push_back(g.norm().item<double>());
        return g * 0.5;
      });
      return std::make_pair(h, (h * h).sum());
    };
    auto [h, loss] = run(x, norms);
    auto [hr, loss_ref] = run(xr, norms_ref);
    {
      tcap::CompiledAutogradGuard ca(opts("retain_grad"));
      loss.backward();
      EXPECT_EQ(count_call_hooks(ca.graphs().at(0)), 2);
    }
    loss_ref.backward();
    EXPECT_TRUE(close(x.grad(), xr.grad()));
    EXPECT_TRUE(close(h.grad(), hr.grad()));
  }
  ASSERT_EQ(norms.size(), norms_ref.size());
  for (size_t i = 0; i < norms.size(); ++i) EXPECT_NEAR(norms[i], norms_ref[i], 1e-9);
}

// The explicit path works without the engine hook, and plain backward() is then not
// intercepted.
TEST_F(CompiledAutograd, ExplicitPathWithoutEngineHook) {
  tcap::CompiledAutogradOptions o;
  o.compile = opts("explicit");
  o.use_engine_hook = false;
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({3, 4}, torch::requires_grad());
    auto loss = torch::exp(x).sum();
    tcap::CompiledAutogradGuard ca(o);
    EXPECT_FALSE(ca.engine_hook_installed());
    ca.backward({loss});
    EXPECT_TRUE(close(x.grad(), torch::exp(x.detach())));
    EXPECT_EQ(ca.stats().replays, step);
    auto y = torch::randn({2}, torch::requires_grad());
    (y * 2).sum().backward();  // not seen by the guard
    EXPECT_EQ(ca.stats().calls, step + 1);
  }
}

}  // namespace
