// Replay composes with autograd exactly as eager: .grad accumulation, leaf hooks (run once),
// non-leaf inputs, closure-captured parameters, several outputs, double backward,
// a layer called twice per step, in-place updates of buffers.
//
// Tolerances: rtol 1e-5, atol 1e-6 (same kernels as eager); double backward 1e-4 / 1e-5.
#include <tcap/compile.h>

#include "support/compare.h"

#include <torch/torch.h>

#include <functional>
#include <string>

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;

namespace {

// Whether f throws a c10::Error whose message contains `text`.
::testing::AssertionResult fails_saying(const std::function<void()>& f, const std::string& text) {
  try {
    f();
  } catch (const c10::Error& err) {
    if (std::string(err.what()).find(text) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "the error does not say '" << text << "': " << err.what();
  }
  return ::testing::AssertionFailure() << "no error";
}

TEST(Autograd, GradAccumulatesAndLeafHooksRunOnce) {
  auto w = torch::randn({5, 3}, torch::requires_grad());  // captured by the closure
  int hook_calls = 0;
  w.register_hook([&](const at::Tensor& g) {
    ++hook_calls;
    return g * 0.5;
  });
  auto fn = [w](const Tensors& in) { return Tensors{torch::relu(torch::mm(in[0], w)).pow(2)}; };
  auto f = tcap::compile(fn);
  at::Tensor expect_grad = torch::zeros({5, 3});
  for (int i = 0; i < 4; ++i) {
    auto x = torch::randn({7, 5});
    auto out = (*f)({x});
    out[0].sum().backward();
    // Eager reference for this call's contribution (hook halves it).
    auto wr = w.detach().clone().requires_grad_(true);
    torch::relu(torch::mm(x, wr)).pow(2).sum().backward();
    expect_grad += wr.grad() * 0.5;
    EXPECT_TRUE(close(w.grad(), expect_grad)) << "call " << i;
  }
  EXPECT_EQ(hook_calls, 4);
  EXPECT_GE(f->stats().replays, 3);
}

TEST(Autograd, NonLeafInputsAndTwoOutputs) {
  auto fn = [](const Tensors& in) { return Tensors{in[0].sin() * in[1], (in[0] + in[1]).exp()}; };
  auto f = tcap::compile(fn);
  for (int i = 0; i < 4; ++i) {
    auto a = torch::randn({3, 4}, torch::requires_grad());
    auto b = torch::randn({4}, torch::requires_grad());  // broadcast
    auto a2 = a * 2;                                      // a non-leaf input
    auto out = (*f)({a2, b});
    (out[0].sum() + out[1].mean()).backward();
    auto ga = a.grad().clone(), gb = b.grad().clone();
    a.mutable_grad().reset();
    b.mutable_grad().reset();
    auto ref = fn({a * 2, b});
    (ref[0].sum() + ref[1].mean()).backward();
    EXPECT_TRUE(close(out[0], ref[0]));
    EXPECT_TRUE(close(out[1], ref[1]));
    EXPECT_TRUE(close(ga, a.grad())) << "call " << i;
    EXPECT_TRUE(close(gb, b.grad())) << "call " << i;
  }
  EXPECT_EQ(f->eager_reason(), "");
}

TEST(Autograd, OutputWithoutGradientAtCaptureGetsOneLater) {
  auto fn = [](const Tensors& in) { return Tensors{in[0].cos(), in[0].tanh()}; };
  auto f = tcap::compile(fn);
  for (int i = 0; i < 4; ++i) {
    auto x = torch::randn({6}, torch::requires_grad());
    auto out = (*f)({x});
    // The capture sees a gradient for output 0 only; later calls use both.
    auto loss = i == 0 ? out[0].sum() : out[0].sum() + out[1].sum();
    loss.backward();
    auto expect = -x.detach().sin() + (i == 0 ? torch::zeros({6}) : 1 - x.detach().tanh().pow(2));
    EXPECT_TRUE(close(x.grad(), expect)) << "call " << i;
  }
  EXPECT_GE(f->stats().backward_fallbacks, 1);
}

TEST(Autograd, DoubleBackwardRecomputes) {
  auto fn = [](const Tensors& in) { return Tensors{(in[0] * in[0] * in[0]).sum()}; };
  auto f = tcap::compile(fn);
  for (int i = 0; i < 3; ++i) {
    auto x = torch::randn({5}, torch::requires_grad());
    auto y = (*f)({x})[0];
    if (i == 0) y.backward({}, /*retain_graph=*/true);  // a plain backward completes the capture
    auto g = torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    EXPECT_TRUE(close(g, 3 * x.detach() * x.detach(), 1e-4, 1e-5));
    auto gg = torch::autograd::grad({g.sum()}, {x})[0];
    EXPECT_TRUE(close(gg, 6 * x.detach(), 1e-4, 1e-5)) << "call " << i;
  }
  EXPECT_GE(f->stats().replays, 1);
  EXPECT_GE(f->stats().backward_fallbacks, 1);
}

// A double backward recomputes the region's forward through autograd; BatchNorm's
// running statistics, which native_batch_norm writes without its schema saying so, must
// be updated once per forward, as in eager (Note [Writes a schema does not show]).
TEST(Autograd, DoubleBackwardThroughBatchNormUpdatesRunningStatsOnce) {
  torch::manual_seed(3);
  torch::nn::BatchNorm1d bn(4), twin(4);
  auto f = tcap::compile(bn);
  for (int i = 0; i < 4; ++i) {
    auto x = torch::randn({8, 4}, torch::requires_grad());
    auto xt = x.detach().clone().requires_grad_(true);
    auto y = f->forward(x).pow(2).sum();
    auto yt = twin->forward(xt).pow(2).sum();
    if (i == 0) y.backward({}, /*retain_graph=*/true);  // a plain backward completes the capture
    if (i == 0) yt.backward({}, /*retain_graph=*/true);
    auto g = torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    auto gt = torch::autograd::grad({yt}, {xt}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    EXPECT_TRUE(close(g, gt, 1e-4, 1e-5)) << "call " << i;
    EXPECT_TRUE(close(bn->running_mean, twin->running_mean, 1e-5, 1e-6)) << "running_mean, call " << i;
    EXPECT_TRUE(close(bn->running_var, twin->running_var, 1e-5, 1e-6)) << "running_var, call " << i;
  }
  EXPECT_GE(f->stats().replays, 1);
  EXPECT_GE(f->stats().backward_fallbacks, 1);
}

TEST(Autograd, LayerCalledTwicePerStep) {
  torch::manual_seed(0);
  torch::nn::Linear lin(4, 4);
  auto f = tcap::compile(lin);
  for (int step = 0; step < 4; ++step) {
    for (auto& p : lin->parameters()) p.mutable_grad().reset();
    auto x = torch::randn({3, 4});
    auto loss = f->forward(torch::tanh(f->forward(x))).pow(2).sum();
    loss.backward();
    auto g = lin->weight.grad().clone();
    lin->weight.mutable_grad().reset();
    lin->bias.mutable_grad().reset();
    lin(torch::tanh(lin(x))).pow(2).sum().backward();
    EXPECT_TRUE(close(g, lin->weight.grad(), 1e-5, 1e-6)) << "step " << step;
  }
  EXPECT_EQ(f->eager_reason(), "");
  EXPECT_GE(f->stats().replays, 4);
}

TEST(Autograd, ForwardWithoutBackwardCompilesAlone) {
  torch::manual_seed(0);
  torch::nn::Linear lin(4, 2);
  auto f = tcap::compile(lin);
  for (int i = 0; i < 5; ++i) {
    auto x = torch::randn({3, 4});
    EXPECT_TRUE(close(f->forward(x), lin(x)));  // grad mode on, but nobody calls backward
  }
  EXPECT_EQ(f->stats().compiles, 1);
  EXPECT_GE(f->stats().replays, 1);
  // A later backward through that entry recomputes, and is right.
  auto x = torch::randn({3, 4});
  f->forward(x).sum().backward();
  auto g = lin->weight.grad().clone();
  lin->weight.mutable_grad().reset();
  lin(x).sum().backward();
  EXPECT_TRUE(close(g, lin->weight.grad()));
}

TEST(Autograd, BatchNormBuffersUpdatedInPlace) {
  torch::manual_seed(0);
  torch::nn::BatchNorm1d bn(3), twin(3);
  auto f = tcap::compile(bn);
  for (int i = 0; i < 4; ++i) {
    auto x = torch::randn({8, 3});
    f->forward(x).pow(2).sum().backward();
    twin(x).pow(2).sum().backward();
  }
  EXPECT_TRUE(close(bn->running_mean, twin->running_mean));
  EXPECT_TRUE(close(bn->running_var, twin->running_var));
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 4);
  EXPECT_TRUE(close(bn->weight.grad(), twin->weight.grad()));
  EXPECT_GE(f->stats().replays, 2);
  // Eval mode is another entry (training flag guard), and uses the running stats.
  bn->eval();
  twin->eval();
  auto x = torch::randn({8, 3});
  EXPECT_TRUE(close(f->forward(x), twin(x)));
  EXPECT_EQ(f->stats().recompiles, 1);
}

// Note [Saved tensors of a compiled region]: without retain_graph, the compiled backward
// gets the only reference to each saved intermediate (so it frees each at its last use, as
// the engine frees a node's saved tensors once the node has run); with retain_graph the
// node keeps its own. The incoming gradient is handed over too. The backward's executable
// is wrapped to look at what it receives.
TEST(Autograd, SavedIntermediatesAreHandedOverToTheBackward) {
  auto w = torch::randn({64, 48}, torch::requires_grad());
  auto fn = [w](const Tensors& in) {
    auto t = torch::mm(in[0], w) * 1.5;  // saved for sin's backward
    return Tensors{torch::sin(t).sum()};
  };
  std::vector<at::Tensor> received;  // weak views: (storage, use_count) as received
  std::vector<long> use_counts;
  tcap::CompileOptions o;
  o.bw_compiler = [&](const tcap::ir::Graph& g) {
    tcap::Executable inner = tcap::eager_backend(g);
    return tcap::Executable([&, inner](std::vector<at::Tensor> ins) {
      received.clear();
      use_counts.clear();
      for (const auto& t : ins) {
        use_counts.push_back(t.defined() ? static_cast<long>(t.use_count()) : 0);
        received.push_back(t.defined() ? t.detach() : at::Tensor());  // shares storage, not the impl
      }
      return inner(std::move(ins));
    });
  };
  auto f = tcap::compile(fn, o);
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE("call " + std::to_string(i));
    const bool retain = i == 3;
    auto x = torch::randn({33, 64}, torch::requires_grad());
    w.mutable_grad().reset();
    auto y = (*f)({x})[0] * 2;  // the gradient arrives from MulBackward, not the root
    y.backward({}, retain);
    auto xr = x.detach().clone().requires_grad_(true);
    auto wr = w.detach().clone().requires_grad_(true);
    (torch::sin(torch::mm(xr, wr) * 1.5).sum() * 2).backward();
    EXPECT_TRUE(close(x.grad(), xr.grad(), 1e-4, 1e-5));
    EXPECT_TRUE(close(w.grad(), wr.grad(), 1e-4, 1e-5));
    if (i == 0) continue;  // the capturing call runs eagerly
    int intermediates = 0;
    for (size_t k = 0; k < received.size(); ++k) {
      const auto& t = received[k];
      if (!t.defined()) continue;
      if (t.dim() == 0) {
        EXPECT_EQ(use_counts[k], 1) << "input " << k << ": the incoming gradient was not handed over";
        continue;
      }
      if (t.is_same_size(x) && t.storage().is_alias_of(x.storage())) continue;  // the user's
      if (t.is_same_size(w) && t.storage().is_alias_of(w.storage())) continue;
      ++intermediates;
      if (retain) EXPECT_GE(use_counts[k], 2) << "input " << k << ": retain_graph keeps the node's reference";
      else EXPECT_EQ(use_counts[k], 1) << "input " << k << ": the node kept a reference to a saved intermediate";
    }
    EXPECT_GE(intermediates, 1) << "the backward received no saved intermediate";
    if (retain) {
      y.backward();  // the retained graph runs once more, then is freed
      EXPECT_TRUE(close(x.grad(), 2 * xr.grad(), 1e-4, 1e-5));
    }
    EXPECT_THROW(y.backward(), c10::Error) << "a second backward through a freed graph must fail, as in eager";
  }
  EXPECT_GE(f->stats().replays, 4);
  EXPECT_EQ(f->stats().backward_fallbacks, 0);
}

// An in-place change to a tensor the compiled backward needs, between the forward and the
// backward, is an error as in eager (SavedVariable's version check), not a wrong gradient.
TEST(Autograd, InPlaceChangeOfASavedTensorIsAnError) {
  auto w = torch::randn({6, 4}, torch::requires_grad());
  auto fn = [w](const Tensors& in) { return Tensors{torch::tanh(torch::mm(in[0], w))}; };
  auto f = tcap::compile(fn);
  for (int i = 0; i < 3; ++i) (*f)({torch::randn({5, 6}, torch::requires_grad())})[0].sum().backward();
  ASSERT_GE(f->stats().replays, 2);
  auto x = torch::randn({5, 6}, torch::requires_grad());
  auto y = (*f)({x})[0].sum();  // saves w for x's gradient
  auto y_ref = torch::tanh(torch::mm(x, w)).sum();
  {
    torch::NoGradGuard no_grad;
    w.mul_(2);
  }
  EXPECT_THROW(y_ref.backward(), c10::Error) << "eager's own check";
  EXPECT_TRUE(fails_saying([&] { y.backward(); }, "modified by an inplace operation"))
      << "the compiled backward used a tensor changed in place";
}

// Note [The replay node]: a replay's backward node is tcap's own, and it behaves as the
// torch::autograd::Function node it replaces: a readable name, a non-differentiable output
// (indices) beside differentiable ones, retain_graph (a second backward adds the same
// gradients), and a second backward through a released node failing as in eager.
TEST(Autograd, ReplayNodeBehavesLikeAFunctionNode) {
  auto fn = [](const Tensors& in) {
    return Tensors{torch::tanh(in[0] * in[1]), torch::argmax(in[0] + in[1], 1), torch::sin(in[1])};
  };
  auto f = tcap::compile(fn);
  auto make = [] { return Tensors{torch::randn({4, 5}, torch::requires_grad()), torch::randn({4, 5}, torch::requires_grad())}; };
  for (int i = 0; i < 3; ++i) {
    auto in = make();
    auto out = (*f)(in);
    (out[0].sum() * 2 + out[2].sum()).backward();
  }
  ASSERT_GE(f->stats().replays, 1) << f->eager_reason();
  auto in = make();
  Tensors ref;
  for (const auto& t : in) ref.push_back(t.detach().clone().requires_grad_(true));
  auto out = (*f)(in);
  auto want = fn(ref);
  ASSERT_TRUE(out[0].grad_fn());
  EXPECT_EQ(out[0].grad_fn()->name(), "tcap::CompiledRegionBackward");
  EXPECT_EQ(out[0].grad_fn().get(), out[2].grad_fn().get());
  EXPECT_FALSE(out[1].requires_grad());
  EXPECT_TRUE(torch::equal(out[1], want[1]));
  auto loss = out[0].sum() * 2 + out[2].sum();
  auto loss_ref = want[0].sum() * 2 + want[2].sum();
  loss.backward({}, /*retain_graph=*/true);
  loss.backward();
  loss_ref.backward({}, /*retain_graph=*/true);
  loss_ref.backward();
  for (size_t k = 0; k < in.size(); ++k) EXPECT_TRUE(close(in[k].grad(), ref[k].grad(), 1e-5, 1e-6)) << "input " << k;
  EXPECT_EQ(f->stats().backward_fallbacks, 0) << "the compiled backward served these";
  EXPECT_TRUE(fails_saying([&] { loss.backward(); }, "backward through the graph a second time"))
      << "a second backward through a released node";
}

// Note [Tangents that alias]: when the capture's backward handed two outputs one gradient
// ((a.sum() + b.sum()) expands one ones tensor for both; a + b of one shape passes the same
// tensor), the recording cannot tell which a backward op read. Later calls whose
// gradients differ must not run the compiled backward (they once did, and got the other
// output's gradient: a stale answer); they recompute, and say why.
TEST(Autograd, GradientsThatAliasedWhenCapturedAreCheckedAtReplay) {
  auto fn = [](const Tensors& in) { return Tensors{torch::tanh(in[0] * in[1]), torch::sin(in[1])}; };
  auto make = [] { return Tensors{torch::randn({4, 5}, torch::requires_grad()), torch::randn({4, 5}, torch::requires_grad())}; };
  for (int form = 0; form < 2; ++form) {
    SCOPED_TRACE(form == 0 ? "sums added" : "outputs added");
    // c == 1: the capture's own loss (no multiplication: the gradients alias again).
    auto loss_of = [form](const Tensors& out, double c) {
      if (c == 1.0) return form == 0 ? out[0].sum() + out[1].sum() : (out[0] + out[1]).sum();
      return form == 0 ? out[0].sum() * c + out[1].sum() : (out[0] * c + out[1]).sum();
    };
    auto f = tcap::compile(fn);
    for (int i = 0; i < 3; ++i) loss_of((*f)(make()), 1.0).backward();
    ASSERT_GE(f->stats().replays, 1) << f->eager_reason();
    for (double c : {1.0, 2.0, -0.5, 1.0}) {
      SCOPED_TRACE("c = " + std::to_string(c));
      auto in = make();
      Tensors ref;
      for (const auto& t : in) ref.push_back(t.detach().clone().requires_grad_(true));
      const int fallbacks = f->stats().backward_fallbacks;
      loss_of((*f)(in), c).backward();
      loss_of(fn(ref), c).backward();
      for (size_t k = 0; k < in.size(); ++k) EXPECT_TRUE(close(in[k].grad(), ref[k].grad(), 1e-5, 1e-6)) << "input " << k;
      // Gradients that alias again (c = 1, both ones) take the compiled backward.
      EXPECT_EQ(f->stats().backward_fallbacks - fallbacks, c == 1.0 ? 0 : 1);
    }
  }
}

}  // namespace

// A hook on a parameter of the module given that the function never reads (a branch of
// the model that is switched off): eager's engine never reaches the parameter, so the hook
// never runs, its .grad stays undefined, and torch::autograd::grad of it is an error (or
// undefined with allow_unused). The compiled region must not hand the hook an undefined
// gradient (Note [Edges only where a gradient flows]).
TEST(Autograd, HookOnAParameterThatGetsNoGradientNeverRuns) {
  for (const std::string backend : {"eager", "llvm"}) {
    if (!tcap::Backend(backend).available()) continue;
    SCOPED_TRACE(backend);
    torch::manual_seed(0);
    torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::Linear(4, 4));
    auto used = net[0]->as<torch::nn::Linear>();
    auto unused = net[1]->as<torch::nn::Linear>();
    int hook_calls = 0;
    unused->weight.register_hook([&](const at::Tensor& g) {
      ++hook_calls;
      return g * 2;
    });
    tcap::CompileOptions o;
    o.backend = tcap::Backend(backend);
    auto f = tcap::compile(net.ptr(), [&](const Tensors& in) { return Tensors{torch::gelu(used->forward(in[0]))}; }, o);
    for (int i = 0; i < 4; ++i) {
      auto x = torch::randn({5, 3});
      auto out = (*f)({x});
      out[0].pow(2).sum().backward();
      auto wr = used->weight.detach().clone().requires_grad_(true);
      torch::gelu(torch::nn::functional::linear(x, wr, used->bias.detach())).pow(2).sum().backward();
      ASSERT_TRUE(used->weight.grad().defined());
      used->weight.grad().zero_();
      used->bias.grad().zero_();
    }
    EXPECT_EQ(hook_calls, 0);
    EXPECT_FALSE(unused->weight.grad().defined());
    // torch::autograd::grad of it: an error, as eager's (the parameter is not in the
    // graph), and undefined with allow_unused.
    auto loss = [&] { return (*f)({torch::randn({5, 3})})[0].sum(); };
    EXPECT_TRUE(fails_saying([&] { torch::autograd::grad({loss()}, {unused->weight}); }, "not have been used"));
    auto g = torch::autograd::grad({loss()}, {unused->weight, used->weight}, {}, std::nullopt, false, /*allow_unused=*/true);
    EXPECT_FALSE(g[0].defined());
    EXPECT_TRUE(g[1].defined());
    EXPECT_GE(f->stats().replays, 4);
  }
}
