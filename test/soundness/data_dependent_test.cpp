// Note [Output shapes that depend on values] (csrc/capture/shape_rules.h) and Note [Sizes
// that come from values] (csrc/ir/op_facts.h): an op whose output shapes come from its
// inputs' values is never replayed with the shapes it had when recorded. Ops LibTorch tags
// (nonzero, masked_select, a boolean index, unique) are compiled, and every replay checks
// the sizes of their results before anything reads them: a call whose sizes differ is
// served another way (another entry, a capture, eagerly), never with the recorded sizes.
// Ops only a check at capture finds (pack_padded_sequence's batch sizes, which host code
// reads below the dispatcher) keep their function, step or backward eager, with the
// reason. Every call is compared with eager.
#include <tcap/compile.h>
#include <tcap/stance.h>
#include <tcap/train_step.h>

#include "support/backends.h"
#include "support/compare.h"
#include "support/log_capture.h"
#include "support/models.h"

#include <torch/torch.h>

#include <string>

namespace {

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;
namespace nn = torch::nn;
namespace rnn = torch::nn::utils::rnn;

// A GRU classifier over padded batches packed by their lengths: the inputs' shapes are the
// same for lengths {3, 5}, {4, 4} and {2, 6}; the packed batch sizes are not.
struct Packed : nn::Module {
  Packed() : gru(register_module("gru", nn::GRU(nn::GRUOptions(4, 8).batch_first(true)))),
             head(register_module("head", nn::Linear(8, 2))) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& lengths) {
    auto packed = rnn::pack_padded_sequence(x, lengths, /*batch_first=*/true, /*enforce_sorted=*/false);
    auto out = std::get<1>(gru->forward_with_packed_input(packed));
    return head->forward(out[0]);
  }
  nn::GRU gru;
  nn::Linear head;
};

TEST(DataDependentShapes, PackedSequencesAreNotReplayedAtRecordedBatchSizes) {
  for (bool train : {false, true}) {
    SCOPED_TRACE(train ? "training" : "eval, no grad");
    torch::manual_seed(5);
    auto m = std::make_shared<Packed>();
    auto f = tcap::compile(m, [m](const Tensors& in) { return Tensors{m->forward(in[0], in[1])}; });
    const std::vector<std::vector<int64_t>> lengths = {{3, 5}, {3, 5}, {4, 4}, {2, 6}, {3, 5}, {6, 2}, {5, 3}, {1, 7}};
    for (size_t i = 0; i < lengths.size(); ++i) {
      auto x = torch::randn({2, 8, 4});
      auto len = torch::tensor(lengths[i], torch::kLong);
      if (train) {
        m->zero_grad();
        auto y = f({x, len})[0];
        y.pow(2).sum().backward();
        std::vector<at::Tensor> grads;
        for (auto& p : m->parameters()) grads.push_back(p.grad().clone());
        m->zero_grad();
        auto want = m->forward(x, len);
        want.pow(2).sum().backward();
        ASSERT_TRUE(close(y, want, 1e-5, 1e-6)) << "call " << i;
        auto ps = m->parameters();
        for (size_t k = 0; k < ps.size(); ++k) ASSERT_TRUE(close(grads[k], ps[k].grad(), 1e-5, 1e-6)) << "call " << i;
      } else {
        torch::NoGradGuard no_grad;
        auto y = f({x, len})[0];
        ASSERT_TRUE(close(y, m->forward(x, len), 1e-5, 1e-6)) << "call " << i;
      }
    }
    EXPECT_NE(f->eager_reason().find("_pack_padded_sequence"), std::string::npos) << f->eager_reason();
  }
}

// A mask with `count` of `n` entries set, at random places.
at::Tensor mask_of(int64_t n, int64_t count) {
  auto m = torch::zeros({n}, torch::kBool);
  m.index_put_({torch::randperm(n).narrow(0, 0, count)}, true);
  return m;
}

// A loss over the nodes a boolean mask selects (a GNN's train mask): compile_step compiles
// the step; a replay at another mask with as many nodes replays (the index runs on this
// call's mask), one with another count stops at the index and is served another way; every
// step trains as eager does, with both backends.
TEST(DataDependentShapes, MaskedLossInACompiledStep) {
  for (const std::string backend : {"eager", "llvm"}) {
    SCOPED_TRACE(backend);
    TCAP_SKIP_WITHOUT_BACKEND(backend);
    torch::manual_seed(6);
    nn::Linear model(5, 3), twin(5, 3);
    tcap::testing::copy_parameters(*model, *twin);
    torch::optim::SGD opt(model->parameters(), 0.1), twin_opt(twin->parameters(), 0.1);
    auto masked = [](const at::Tensor& out, const Tensors& in) {
      return torch::mse_loss(out.index({in[2]}), in[1].index({in[2]}));
    };
    tcap::CompileOptions o;
    o.backend = backend;
    auto step = tcap::compile_step(model.ptr(), opt, tcap::testing::step_body(model, opt, masked), o);
    auto eager = tcap::testing::step_body(twin, twin_opt, masked);
    const auto train_mask = mask_of(13, 6);
    tcap::testing::LogCapture log("recompiles");
    // counts: the train mask's 6, another mask of 6, then 4 and 9 (stop and serve otherwise), 6 again.
    const std::vector<int64_t> counts = {6, 6, 6, 6, -6, 6, 4, 6, -6, 9, 6, 6};
    int replays_at_other_masks = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      auto x = torch::randn({13, 5}), y = torch::randn({13, 3});
      const auto mask = counts[i] == 6 ? train_mask : mask_of(13, std::abs(counts[i]));
      const int before = step->stats().replays;
      auto got = (*step)({x, y, mask})[0];
      auto want = eager({x, y, mask})[0];
      ASSERT_TRUE(close(got, want, 1e-5, 1e-6)) << "step " << i;
      ASSERT_TRUE(close(model->weight, twin->weight, 1e-5, 1e-6)) << "step " << i;
      ASSERT_TRUE(close(model->bias, twin->bias, 1e-5, 1e-6)) << "step " << i;
      if (counts[i] == -6 && step->stats().replays > before) ++replays_at_other_masks;
    }
    const auto s = step->stats();
    EXPECT_GE(s.replays, 6) << step->eager_reason();
    EXPECT_EQ(replays_at_other_masks, 2);
    // (Under TCAP_VERIFY a verified call runs eager first, and a replay that stops returns
    // eager's result instead of recompiling: no such line.)
    if (!tcap::verify_options().on()) {
      EXPECT_NE(log.text().find("which come from its inputs' values, changed: [6, 3] -> [4, 3]"), std::string::npos)
          << log.text();
    }
  }
}

// nonzero's output feeds a gather in a function: compiled; a call with as many positives
// replays, one with another number stops at nonzero and captures; every call is eager's.
TEST(DataDependentShapes, NonzeroInAFunction) {
  for (const std::string backend : {"eager", "llvm"}) {
    SCOPED_TRACE(backend);
    TCAP_SKIP_WITHOUT_BACKEND(backend);
    auto fn = [](const Tensors& in) {
      auto idx = torch::nonzero(in[0] > 0).select(1, 0);
      return Tensors{(in[0].index_select(0, idx) * 2).exp()};
    };
    tcap::CompileOptions o;
    o.backend = backend;
    auto f = tcap::compile(fn, o);
    auto with_positives = [](int64_t k) {
      auto x = -torch::rand({11}) - 0.1;
      x.index_put_({torch::randperm(11).narrow(0, 0, k)}, torch::rand({k}) + 0.1);
      return x;
    };
    for (int64_t k : {3, 3, 5, 3, 5, 0, 11, 3, 5}) {
      auto x = with_positives(k);
      ASSERT_TRUE(close(f({x})[0], fn({x})[0], 1e-6, 1e-6)) << "positives " << k;
    }
    const auto s = f->stats();
    EXPECT_GE(s.replays, 4);
    EXPECT_EQ(f->eager_reason(), "");
  }
}

// masked_select and a boolean index in a function with a backward: the backward (an
// index_put with the mask) is compiled with the forward; gradients are eager's at every
// mask, with both backends.
TEST(DataDependentShapes, MaskedSelectWithBackward) {
  for (const std::string backend : {"eager", "llvm"}) {
    SCOPED_TRACE(backend);
    TCAP_SKIP_WITHOUT_BACKEND(backend);
    torch::manual_seed(8);
    auto w = torch::randn({7, 4}, torch::requires_grad());
    auto fn = [&w](const Tensors& in) {
      auto h = torch::tanh(in[0] * w);
      auto a = torch::masked_select(h, in[1].unsqueeze(1)).pow(2).sum();
      auto b = h.index({in[1]}).sigmoid().mean(0);
      return Tensors{a, b};
    };
    tcap::CompileOptions o;
    o.backend = backend;
    auto f = tcap::compile(fn, o);
    const auto fixed = mask_of(7, 3);
    for (int i = 0; i < 8; ++i) {
      const auto mask = (i % 3 == 2) ? mask_of(7, 1 + i % 5) : (i % 4 == 3 ? mask_of(7, 3) : fixed);
      auto x = torch::randn({7, 4});
      auto got = f({x, mask});
      auto gw = torch::autograd::grad({got[0] + got[1].sum()}, {w})[0];
      auto want = fn({x, mask});
      auto ww = torch::autograd::grad({want[0] + want[1].sum()}, {w})[0];
      ASSERT_TRUE(close(got[0], want[0], 1e-5, 1e-5)) << "call " << i;
      ASSERT_TRUE(close(got[1], want[1], 1e-5, 1e-5)) << "call " << i;
      ASSERT_TRUE(close(gw, ww, 1e-5, 1e-5)) << "call " << i;
    }
    EXPECT_GE(f->stats().replays, 3) << f->eager_reason();
    EXPECT_EQ(f->eager_reason(), "");
  }
}

// The sizes are read after the step wrote into its inputs (zero_grad without set_to_none
// zeroes the gradients in place first): a replay cannot stop there, so a guard graph
// computes the index's sizes from the call's inputs before the replay. A mask of another
// count is never replayed.
TEST(DataDependentShapes, SizesReadAfterAWriteArePreChecked) {
  torch::manual_seed(9);
  nn::Linear model(5, 3), twin(5, 3);
  tcap::testing::copy_parameters(*model, *twin);
  torch::optim::SGD opt(model->parameters(), 0.1), twin_opt(twin->parameters(), 0.1);
  auto body = [](nn::Linear& m, torch::optim::Optimizer& o) {
    return [&m, &o](const Tensors& in) {
      o.zero_grad(/*set_to_none=*/false);
      auto out = m->forward(in[0]);
      auto l = torch::mse_loss(out.index({in[2]}), in[1].index({in[2]}));
      l.backward();
      o.step();
      return Tensors{l};
    };
  };
  // One eager step first, so that the gradients exist and zero_grad writes them.
  for (auto* m : {&model, &twin}) {
    (*m)->forward(torch::randn({2, 5})).sum().backward();
  }
  auto step = tcap::compile_step(model.ptr(), opt, body(model, opt));
  auto eager = body(twin, twin_opt);
  const auto train_mask = mask_of(10, 4);
  for (int i = 0; i < 9; ++i) {
    auto x = torch::randn({10, 5}), y = torch::randn({10, 3});
    const auto mask = i == 5 ? mask_of(10, 7) : train_mask;
    auto got = (*step)({x, y, mask})[0];
    auto want = eager({x, y, mask})[0];
    ASSERT_TRUE(close(got, want, 1e-5, 1e-6)) << "step " << i;
    ASSERT_TRUE(close(model->weight, twin->weight, 1e-5, 1e-6)) << "step " << i;
  }
  EXPECT_GE(step->stats().replays, 4) << step->eager_reason();
}

// A custom function whose backward calls nonzero: compiled autograd cannot stop a backward
// to look on, so it runs that backward eagerly, with the reason; tcap::compile likewise
// keeps such a function eager. Gradients are eager's.
struct SelectPositive : torch::autograd::Function<SelectPositive> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    ctx->save_for_backward({x});
    return torch::relu(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto x = ctx->get_saved_variables()[0];
    auto idx = torch::nonzero(x > 0).select(1, 0);
    auto g = torch::zeros_like(grads[0]);
    g.index_copy_(0, idx, grads[0].index_select(0, idx));
    return {g};
  }
};

TEST(DataDependentShapes, BackwardsThatCallNonzeroRunEagerly) {
  torch::manual_seed(10);
  auto w = torch::randn({9}, torch::requires_grad());
  tcap::CompileOptions co;
  co.name = "ca_nonzero";
  for (int i = 0; i < 4; ++i) {
    auto x = torch::randn({9});
    at::Tensor got;
    {
      tcap::CompiledAutogradGuard ca(co);
      SelectPositive::apply(x * w).pow(2).sum().backward();
      got = w.grad().clone();
    }
    w.mutable_grad().reset();
    SelectPositive::apply(x * w).pow(2).sum().backward();
    ASSERT_TRUE(close(got, w.grad(), 1e-6, 1e-6)) << "call " << i;
    w.mutable_grad().reset();
  }
  auto fn = [&w](const Tensors& in) { return Tensors{SelectPositive::apply(in[0] * w).pow(2).sum()}; };
  auto f = tcap::compile(fn);
  for (int i = 0; i < 4; ++i) {
    auto x = torch::randn({9});
    f({x})[0].backward();
    auto got = w.grad().clone();
    w.mutable_grad().reset();
    fn({x})[0].backward();
    ASSERT_TRUE(close(got, w.grad(), 1e-6, 1e-6)) << "call " << i;
    w.mutable_grad().reset();
  }
  EXPECT_NE(f->eager_reason().find("aten::nonzero"), std::string::npos) << f->eager_reason();
}

}  // namespace
