// Note [Output shapes that depend on values] (csrc/capture/shape_rules.h): an op whose
// output shapes come from its inputs' values is never replayed with the shapes it had when
// recorded. LibTorch's tags name most (nonzero, masked_select, a boolean index); a check at
// capture finds the rest (pack_padded_sequence's batch sizes, which no tag names). Each
// front door runs such a function, step or backward eagerly, says why, and every call
// gives eager's answer.
#include <tcap/compile.h>
#include <tcap/train_step.h>

#include "support/compare.h"
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

// A loss over the nodes a boolean mask selects (a GNN's train mask): compile_step runs the
// step eagerly, saying which op, and trains as eager does.
TEST(DataDependentShapes, MaskedLossInACompiledStep) {
  torch::manual_seed(6);
  nn::Linear model(5, 3), twin(5, 3);
  tcap::testing::copy_parameters(*model, *twin);
  torch::optim::SGD opt(model->parameters(), 0.1), twin_opt(twin->parameters(), 0.1);
  auto masked = [](const at::Tensor& out, const Tensors& in) {
    return torch::mse_loss(out.index({in[2]}), in[1].index({in[2]}));
  };
  auto step = tcap::compile_step(model.ptr(), opt, tcap::testing::step_body(model, opt, masked));
  auto eager = tcap::testing::step_body(twin, twin_opt, masked);
  for (int i = 0; i < 8; ++i) {
    auto x = torch::randn({9, 5}), y = torch::randn({9, 3});
    auto mask = torch::rand({9}) > 0.5;
    mask[0] = true;
    auto got = (*step)({x, y, mask})[0];
    auto want = eager({x, y, mask})[0];
    ASSERT_TRUE(close(got, want, 1e-5, 1e-6)) << "step " << i;
    ASSERT_TRUE(close(model->weight, twin->weight, 1e-5, 1e-6)) << "step " << i;
  }
  EXPECT_NE(step->eager_reason().find("data-dependent"), std::string::npos) << step->eager_reason();
}

// nonzero's output feeds a gather in a function: eager at every call, with the reason.
TEST(DataDependentShapes, NonzeroInAFunction) {
  auto fn = [](const Tensors& in) {
    auto idx = torch::nonzero(in[0] > 0).select(1, 0);
    return Tensors{in[0].index_select(0, idx) * 2};
  };
  auto f = tcap::compile(fn);
  for (int i = 0; i < 6; ++i) {
    auto x = torch::randn({11});
    ASSERT_TRUE(close(f({x})[0], fn({x})[0], 0, 0)) << "call " << i;
  }
  EXPECT_NE(f->eager_reason().find("aten::nonzero"), std::string::npos) << f->eager_reason();
}

}  // namespace
