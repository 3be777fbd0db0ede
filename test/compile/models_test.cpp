// Models trained 20 steps with torch::optim::Adam, compiled (tcap::compile of the module)
// against an eager twin built from the same seed: losses each step and every parameter
// and buffer at the end must match.
//
// Tolerances (float32): rtol 1e-4, atol 1e-5 on losses and parameters after 20 Adam
// steps. The compiled forward and backward run the very kernels eager runs (eager
// backend), but min-cut recomputation and the summing order of gradient contributions
// differ in the last bits, and Adam amplifies tiny differences a little.
#include <tcap/compile.h>

#include "support/backends.h"
#include "support/compare.h"
#include "support/models.h"

#include <torch/torch.h>

using tcap::testing::close;
namespace nn = torch::nn;

namespace {

constexpr double kModelRtol = 1e-4;
constexpr double kModelAtol = 1e-5;

using tcap::testing::SeedMlp;
using tcap::testing::SmallCnn;

struct EncoderImpl : nn::Module {
  explicit EncoderImpl(double dropout) {
    layer = register_module(
        "layer", nn::TransformerEncoderLayer(nn::TransformerEncoderLayerOptions(16, 4).dim_feedforward(32).dropout(dropout)));
  }
  at::Tensor forward(const at::Tensor& x) { return layer(x); }
  nn::TransformerEncoderLayer layer{nullptr};
};
TORCH_MODULE(Encoder);

// Trains `model` (compiled) and `twin` (eager) side by side; both start from the same
// parameters. make_batch(step) gives (input, target).
template <class M>
void train_and_compare(M model, M twin, const std::function<std::pair<at::Tensor, at::Tensor>(int)>& make_batch,
                       int steps = 20, tcap::Partitioner part = tcap::Partitioner::MinCut) {
  tcap::testing::copy_parameters(*model, *twin);
  tcap::CompileOptions o;
  o.name = "model";
  o.partitioner = part;
  auto compiled = tcap::compile(model, o);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam opt_twin(twin->parameters(), torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = make_batch(step);
    // The same RNG stream for both (dropout masks): reseed before each forward.
    torch::manual_seed(1000 + step);
    opt.zero_grad();
    auto loss = torch::mse_loss(compiled->forward(x), y);
    loss.backward();
    opt.step();
    torch::manual_seed(1000 + step);
    opt_twin.zero_grad();
    auto loss_twin = torch::mse_loss(twin->forward(x), y);
    loss_twin.backward();
    opt_twin.step();
    EXPECT_TRUE(close(loss, loss_twin, kModelRtol, kModelAtol)) << "step " << step;
  }
  EXPECT_EQ(compiled->eager_reason(), "");
  EXPECT_GE(compiled->stats().replays, steps - 2) << "the compiled path was not used";
  auto a = model->named_parameters(), b = twin->named_parameters();
  for (const auto& item : a) EXPECT_TRUE(close(item.value(), b[item.key()], kModelRtol, kModelAtol)) << item.key();
  auto ab = model->named_buffers(), bb = twin->named_buffers();
  for (const auto& item : ab) EXPECT_TRUE(close(item.value(), bb[item.key()], kModelRtol, kModelAtol)) << item.key();
}

TEST(Models, SeedMlpAdam) {
  torch::manual_seed(0);
  SeedMlp m, t;
  train_and_compare<SeedMlp>(m, t, [](int) {
    return std::make_pair(torch::randn({4, 10}), torch::softmax(torch::randn({4, 2}), 1));
  });
}

TEST(Models, SeedMlpAdamDefaultPartitioner) {
  torch::manual_seed(0);
  SeedMlp m, t;
  train_and_compare<SeedMlp>(m, t, [](int) {
    return std::make_pair(torch::randn({4, 10}), torch::softmax(torch::randn({4, 2}), 1));
  }, 20, tcap::Partitioner::Default);
}

TEST(Models, CnnBatchNormAdam) {
  torch::manual_seed(0);
  SmallCnn m, t;
  train_and_compare<SmallCnn>(m, t, [](int) { return std::make_pair(torch::randn({6, 3, 8, 8}), torch::randn({6, 5})); });
}

TEST(Models, TransformerEncoderLayerAdam) {
  torch::manual_seed(0);
  Encoder m(0.0), t(0.0);
  train_and_compare<Encoder>(m, t, [](int) { return std::make_pair(torch::randn({5, 3, 16}), torch::randn({5, 3, 16})); });
}

TEST(Models, TransformerEncoderLayerWithDropoutSameMasks) {
  torch::manual_seed(0);
  Encoder m(0.2), t(0.2);
  train_and_compare<Encoder>(m, t, [](int) { return std::make_pair(torch::randn({5, 3, 16}), torch::randn({5, 3, 16})); });
}

}  // namespace

namespace {

// A parameter the forward never reads (a layer kept for later, a branch not taken) keeps an
// undefined .grad, as in eager: an optimizer then skips it (weight decay, momentum and
// Adam's moments would otherwise move it).
struct WithUnusedImpl : nn::Module {
  WithUnusedImpl() {
    used = register_module("used", nn::Linear(5, 3));
    unused = register_module("unused", nn::Linear(4, 4));
  }
  at::Tensor forward(const at::Tensor& x) { return used->forward(x).tanh(); }
  nn::Linear used{nullptr}, unused{nullptr};
};
TORCH_MODULE(WithUnused);

TEST(Models, UnusedParameterKeepsAnUndefinedGrad) {
  for (const std::string backend : {"eager", "llvm"}) {
    if (!tcap::testing::backend_built(backend, nullptr)) continue;
    WithUnused m;
    tcap::CompileOptions o;
    o.backend = backend;
    auto f = tcap::compile(m, o);
    for (int step = 0; step < 4; ++step) {
      f->forward(torch::randn({7, 5})).sum().backward();
      EXPECT_TRUE(m->used->weight.grad().defined()) << backend << " step " << step;
      EXPECT_FALSE(m->unused->weight.grad().defined()) << backend << " step " << step;
      EXPECT_FALSE(m->unused->bias.grad().defined()) << backend << " step " << step;
    }
    EXPECT_GE(f->stats().replays, 2) << backend << ": " << f->eager_reason();
  }
}

}  // namespace
