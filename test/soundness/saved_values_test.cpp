// Saved values are eager's (Note [What a recompute reads], Note [Entries without a
// compiled backward], Note [Recomputing from primals]): a compiled backward computes from
// what the forward saw, whatever the program changes between the forward and the
// backward, and raises eager's error where eager's saved tensors were changed in place.
// Each case runs the same program on a compiled model and on an eager twin and compares
// values, gradients and errors.
#include <tcap/compile.h>

#include "support/compare.h"
#include "support/models.h"

#include <torch/torch.h>

#include <functional>
#include <string>

namespace {

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;
namespace nn = torch::nn;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

struct Mlp : nn::Module {
  Mlp() : fc1(register_module("fc1", nn::Linear(6, 16))), fc2(register_module("fc2", nn::Linear(16, 3))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2->forward(torch::relu(fc1->forward(x))); }
  nn::Linear fc1, fc2;
};

// Every parameter's .grad of `a` equals `b`'s.
void expect_same_grads(nn::Module& a, nn::Module& b, const std::string& what) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  for (size_t k = 0; k < pa.size(); ++k) {
    ASSERT_TRUE(pa[k].value().grad().defined()) << what << ": " << pa[k].key();
    EXPECT_TRUE(close(pa[k].value().grad(), pb[k].value().grad(), 1e-5, 1e-6)) << what << ": " << pa[k].key();
  }
}

// The weights written through .data() between the forward and the backward, as LibTorch's
// optimizers write them: no version counter moves.
void nudge_weights(nn::Module& m, double by) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.data().add_(by);
}

// An output kept across an update of the weights and then backpropagated: eager's
// gradients come from the forward's saved values (the relu's output and mask of the old
// weights). An entry with no compiled backward (its first calls ran no backward) must not
// recompute the forward from the new weights; nor may one with a compiled backward, under
// either partitioner.
TEST(SavedValues, OutputKeptAcrossAWeightUpdate) {
  for (auto partitioner : {tcap::Partitioner::MinCut, tcap::Partitioner::Default}) {
    for (bool first_calls_backward : {false, true}) {
      for (const auto& backend : {std::string("eager"), std::string("llvm")}) {
        SCOPED_TRACE(std::string(first_calls_backward ? "compiled backward" : "no compiled backward") + " / " + backend +
                     (partitioner == tcap::Partitioner::MinCut ? " / min-cut" : " / default"));
        torch::manual_seed(7);
        auto m = std::make_shared<Mlp>(), twin = std::make_shared<Mlp>();
        tcap::testing::copy_parameters(*m, *twin);
        tcap::CompileOptions o;
        o.backend = backend;
        o.partitioner = partitioner;
        auto f = tcap::compile(m, [m](const Tensors& in) { return Tensors{m->forward(in[0])}; }, o);
        for (int i = 0; i < 4; ++i) {
          auto x = torch::randn({5, 6});
          auto y = f({x})[0];
          if (first_calls_backward) y.sum().backward();
        }
        m->zero_grad();
        for (int i = 0; i < 3; ++i) {
          auto x = torch::randn({5, 6});
          auto g = torch::randn({5, 3});
          auto y = f({x})[0];
          auto yt = twin->forward(x);
          ASSERT_TRUE(close(y, yt, 1e-5, 1e-6)) << "call " << i;
          nudge_weights(*m, 0.05);
          nudge_weights(*twin, 0.05);
          m->zero_grad();
          twin->zero_grad();
          y.backward(g);
          yt.backward(g);
          expect_same_grads(*m, *twin, "call " + std::to_string(i));
        }
        EXPECT_GE(f->stats().replays, 3);
      }
    }
  }
}

// An input changed in place between the forward and the backward, where eager's backward
// saved it: eager raises, and so does every compiled path. Where eager did not save it,
// eager runs the backward and so does tcap.
TEST(SavedValues, InputChangedInPlaceRaisesWhereEagerRaises) {
  auto saves_x = [](const Tensors& in) { return Tensors{(in[0] * in[1]).sum(1)}; };        // mul saves x for dw
  auto keeps_no_x = [](const Tensors& in) { return Tensors{torch::cos(torch::cos(in[0] + in[1])).sum(1)}; };
  for (bool first_calls_backward : {false, true}) {
    for (auto partitioner : {tcap::Partitioner::MinCut, tcap::Partitioner::Default}) {
      SCOPED_TRACE(std::string(first_calls_backward ? "compiled backward" : "no compiled backward") +
                   (partitioner == tcap::Partitioner::MinCut ? " / min-cut" : " / default"));
      tcap::CompileOptions o;
      o.partitioner = partitioner;
      auto f = tcap::compile(saves_x, o);
      auto h = tcap::compile(keeps_no_x, o);
      auto w = torch::randn({4, 5}, torch::requires_grad());
      for (int i = 0; i < 4; ++i) {
        auto a = f({torch::randn({4, 5}), w})[0];
        auto b = h({torch::randn({4, 5}), w})[0];
        if (first_calls_backward) (a.sum() + b.sum()).backward();
      }
      // Eager raises for the tensor mul saved.
      {
        auto x = torch::randn({4, 5});
        auto y = saves_x({x, w})[0];
        x.add_(1);
        const std::string want = error_of([&] { y.sum().backward(); });
        ASSERT_NE(want.find("modified by an inplace operation"), std::string::npos) << want;
        auto xc = torch::randn({4, 5});
        auto yc = f({xc, w})[0];
        xc.add_(1);
        const std::string got = error_of([&] { yc.sum().backward(); });
        EXPECT_NE(got.find("modified by an inplace operation"), std::string::npos) << got;
      }
      // Eager saves only intermediates here: the change is allowed, and the gradient is of
      // the forward's values.
      {
        auto x0 = torch::randn({4, 5});
        w.mutable_grad().reset();
        auto x = x0.clone();
        auto y = keeps_no_x({x, w})[0];
        x.add_(1);
        y.sum().backward();
        auto want = w.grad().clone();
        w.mutable_grad().reset();
        auto xc = x0.clone();
        auto yc = h({xc, w})[0];
        xc.add_(1);
        const std::string err = error_of([&] { yc.sum().backward(); });
        ASSERT_EQ(err, "") << "tcap refused a change eager allows";
        EXPECT_TRUE(close(w.grad(), want, 1e-5, 1e-6));
      }
      EXPECT_GE(f->stats().replays, 1);
      EXPECT_GE(h->stats().replays, 1);
    }
  }
}

// A double backward recomputes the forward: after an in-place change of a tensor the
// forward read, it raises (eager raises too: pow and mul saved it) instead of
// differentiating the new values.
TEST(SavedValues, DoubleBackwardAfterAnInPlaceChangeRaises) {
  auto fn = [](const Tensors& in) { return Tensors{(in[0] * in[1]).pow(3).sum()}; };
  auto f = tcap::compile(fn);
  auto w = torch::randn({6}, torch::requires_grad());
  for (int i = 0; i < 3; ++i) f({torch::randn({6}), w})[0].backward();
  auto x = torch::randn({6});
  auto y = fn({x, w})[0];
  x.mul_(2);
  const std::string want = error_of([&] { torch::autograd::grad({y}, {w}, {}, true, true); });
  ASSERT_NE(want.find("modified by an inplace operation"), std::string::npos) << want;
  auto xc = torch::randn({6});
  auto yc = f({xc, w})[0];
  xc.mul_(2);
  const std::string got = error_of([&] { torch::autograd::grad({yc}, {w}, {}, true, true); });
  EXPECT_NE(got.find("modified by an inplace operation"), std::string::npos) << got;
  // Unchanged, the double backward is eager's.
  auto x2 = torch::randn({6});
  auto g = torch::autograd::grad({f({x2, w})[0]}, {w}, {}, true, true)[0];
  auto gt = torch::autograd::grad({fn({x2, w})[0]}, {w}, {}, true, true)[0];
  ASSERT_TRUE(close(g, gt, 1e-4, 1e-5));
  auto gg = torch::autograd::grad({g.sum()}, {w})[0];
  auto ggt = torch::autograd::grad({gt.sum()}, {w})[0];
  EXPECT_TRUE(close(gg, ggt, 1e-4, 1e-5));
}

// A weight written through .data() (no version counter moves) between the forward and a
// double backward of an entry with a compiled backward: the recompute would differentiate
// the new weight where eager's saved activations are the old ones, so the backward stops
// with tcap's error instead of returning other gradients (Note [A recompute that does not
// reproduce the forward]); both backends, and unchanged weights still give eager's answer.
TEST(SavedValues, DoubleBackwardAfterADataWriteStops) {
  for (const auto& backend : {std::string("eager"), std::string("llvm")}) {
    SCOPED_TRACE(backend);
    torch::manual_seed(11);
    nn::Linear lin(4, 4);
    tcap::CompileOptions o;
    o.backend = backend;
    auto f = tcap::compile(lin.ptr(), [&](const Tensors& in) { return Tensors{torch::tanh(lin->forward(in[0]))}; }, o);
    auto eager = [&](const at::Tensor& x) { return torch::tanh(lin->forward(x)); };
    for (int i = 0; i < 3; ++i) f(torch::randn({3, 4}, torch::requires_grad()))[0].sum().backward();
    auto penalty = [](const at::Tensor& out, const at::Tensor& x) {
      return torch::autograd::grad({out.pow(2).sum()}, {x}, {}, true, true)[0].pow(2).sum();
    };
    // Unchanged: eager's answer.
    auto x = torch::randn({3, 4}, torch::requires_grad());
    lin->zero_grad();
    penalty(f(x)[0], x).backward();
    auto got = lin->weight.grad().clone();
    lin->zero_grad();
    penalty(eager(x), x).backward();
    ASSERT_TRUE(close(got, lin->weight.grad(), 1e-4, 1e-5));
    // Written through .data() after the forward: an error, not another answer.
    auto out = f(x)[0];
    lin->weight.data().mul_(1.5);
    const std::string err = error_of([&] { penalty(out, x).backward(); });
    EXPECT_NE(err.find("without moving its version counter"), std::string::npos) << err;
  }
}

// A function that writes its input in place and is differentiated twice: the recompute
// starts from the input as it was before the forward wrote it.
TEST(SavedValues, RecomputeOfAForwardThatWritesItsInput) {
  auto fn = [](const Tensors& in) {
    auto buf = in[1];
    buf.add_(in[0].detach());  // a running sum, as a BatchNorm's statistics
    return Tensors{(in[0] * buf).pow(2).sum()};
  };
  auto f = tcap::compile(fn);
  auto buf = torch::zeros({5}), twin_buf = torch::zeros({5});
  for (int i = 0; i < 5; ++i) {
    auto x = torch::randn({5}, torch::requires_grad());
    auto xt = x.detach().clone().requires_grad_(true);
    auto y = f({x, buf})[0];
    auto yt = fn({xt, twin_buf})[0];
    if (i == 0) {
      y.backward({}, /*retain_graph=*/true);
      yt.backward({}, /*retain_graph=*/true);
    }
    auto g = torch::autograd::grad({y}, {x}, {}, true, true)[0];
    auto gt = torch::autograd::grad({yt}, {xt}, {}, true, true)[0];
    EXPECT_TRUE(close(g, gt, 1e-4, 1e-5)) << "call " << i;
    EXPECT_TRUE(close(buf, twin_buf, 1e-5, 1e-6)) << "call " << i;
  }
  EXPECT_GE(f->stats().replays, 1);
}

// An entry without a compiled backward that reads a value on the host (a branch on a
// sum's sign): calls that need a gradient run its forward through autograd, and a changed
// host value is still noticed there.
TEST(SavedValues, ForwardThroughAutogradChecksHostValues) {
  auto fn = [](const Tensors& in) {
    auto y = in[0] * in[1];
    return Tensors{y.sum().item<double>() > 0 ? y.exp() : y.neg()};
  };
  auto f = tcap::compile(fn);
  auto w = torch::ones({4}, torch::requires_grad());
  for (int i = 0; i < 4; ++i) f({torch::ones({4}), w});  // no backward: a forward-only entry
  for (int i = 0; i < 8; ++i) {
    auto x = (i % 2 ? -1.0 : 1.0) * torch::rand({4}).add(0.1);
    w.mutable_grad().reset();
    auto y = f({x, w})[0];
    y.sum().backward();
    auto g = w.grad().clone();
    w.mutable_grad().reset();
    auto yt = fn({x, w})[0];
    yt.sum().backward();
    ASSERT_TRUE(close(y, yt, 1e-5, 1e-6)) << "call " << i;
    ASSERT_TRUE(close(g, w.grad(), 1e-5, 1e-6)) << "call " << i;
  }
}

// Note [Autograd Functions in a region]: a custom autograd Function whose backward is not
// the derivative of its forward's ops (here three times relu's). Where no capture saw its
// backward (the first call's gradient came from grad()), a call that needs a gradient runs
// eagerly (it used to replay the ops inside the Function, recorded without grad mode, and
// return an output that did not require grad); calls without a gradient still replay. An
// entry whose backward was captured replays it, and a double backward, which would have to
// recompute the forward, stops with tcap's error instead of differentiating relu.
struct TripleRelu : torch::autograd::Function<TripleRelu> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    ctx->save_for_backward({x});
    return torch::relu(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {grads[0] * (ctx->get_saved_variables()[0] > 0) * 3};
  }
};

TEST(SavedValues, AutogradFunctionsAreNotDifferentiatedThroughTheirOps) {
  torch::manual_seed(12);
  auto w = torch::randn({9}, torch::requires_grad());
  auto fn = [&w](const Tensors& in) { return Tensors{TripleRelu::apply(in[0] * w).pow(2).sum()}; };
  for (const bool captured_backward : {false, true}) {
    SCOPED_TRACE(captured_backward ? "backward() at the first call" : "grad() only");
    auto f = tcap::compile(fn);
    for (int i = 0; i < 5; ++i) {
      auto x = torch::randn({9});
      auto y = f({x})[0];
      ASSERT_TRUE(y.requires_grad()) << "call " << i;
      at::Tensor got;
      if (captured_backward) {
        y.backward();
        got = w.grad().clone();
        w.mutable_grad().reset();
      } else {
        got = torch::autograd::grad({y}, {w})[0];
      }
      auto want = torch::autograd::grad({fn({x})[0]}, {w})[0];
      ASSERT_TRUE(close(got, want, 1e-6, 1e-6)) << "call " << i;
      torch::NoGradGuard no_grad;
      ASSERT_TRUE(close(f({x})[0], fn({x})[0], 1e-6, 1e-6)) << "call " << i;
    }
    EXPECT_GE(f->stats().replays, 3);
    if (captured_backward) {
      auto x = torch::randn({9});
      auto y = f({x})[0];
      const std::string err = error_of([&] { torch::autograd::grad({y}, {w}, {}, true, true); });
      EXPECT_NE(err.find("autograd Function"), std::string::npos) << err;
    }
  }
}

}  // namespace
