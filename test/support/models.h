// Small models shared by the tests and the divergence fuzzer (the seeds' MLP, a CNN with
// BatchNorm, attention over the batch), and helpers for eager twins: the same parameters, and one training step body for both.
#pragma once

#include <torch/torch.h>

#include <functional>

namespace tcap::testing {

// The Dynamo/AOTAutograd tutorials' MLP: Linear(10,5), ReLU, Linear(5,2), Softmax.
struct SeedMlpImpl : torch::nn::Module {
  SeedMlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(10, 5));
    fc2 = register_module("fc2", torch::nn::Linear(5, 2));
  }
  at::Tensor forward(const at::Tensor& x) { return torch::softmax(fc2(torch::relu(fc1(x))), 1); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(SeedMlp);

// Conv2d + BatchNorm + ReLU + max-pool + Linear, for [N, 3, 8, 8] inputs, 5 outputs.
struct SmallCnnImpl : torch::nn::Module {
  SmallCnnImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)));
    bn = register_module("bn", torch::nn::BatchNorm2d(8));
    fc = register_module("fc", torch::nn::Linear(8 * 4 * 4, 5));
  }
  at::Tensor forward(const at::Tensor& x) {
    return fc(torch::max_pool2d(torch::relu(bn(conv(x))), 2).flatten(1));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(SmallCnn);

// Single-head self-attention over the batch: [batch, w] as one sample's sequence of
// `batch` tokens (MultiheadAttention reads equal(query, key) on the host).
struct BatchAttentionImpl : torch::nn::Module {
  explicit BatchAttentionImpl(int64_t w) : mha(register_module("mha", torch::nn::MultiheadAttention(w, 1))) {}
  at::Tensor forward(const at::Tensor& x) {
    auto t = x.unsqueeze(1);
    return std::get<0>(mha->forward(t, t, t)).squeeze(1);
  }
  torch::nn::MultiheadAttention mha;
};
TORCH_MODULE(BatchAttention);

// Copies every parameter of `from` into the same-named parameter of `to`.
inline void copy_parameters(const torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto dst = to.named_parameters();
  for (const auto& item : from.named_parameters()) dst[item.key()].copy_(item.value());
}

// A training step for compile_step and for its eager twin: zero_grad, the loss of the
// model's output on the step's inputs, backward, step; returns the loss.
using StepLoss = std::function<at::Tensor(const at::Tensor& out, const std::vector<at::Tensor>& in)>;
inline std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> step_body(torch::nn::Linear& m,
                                                                                          torch::optim::Optimizer& o,
                                                                                          StepLoss loss) {
  return [&m, &o, loss](const std::vector<at::Tensor>& in) {
    o.zero_grad();
    auto l = loss(m->forward(in[0]), in);
    l.backward();
    o.step();
    return std::vector<at::Tensor>{l};
  };
}

}  // namespace tcap::testing
