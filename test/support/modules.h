// Helpers for tests that train a module next to an eager twin.
#pragma once

#include <torch/nn/module.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

namespace tcap::testing {

// Copies `from`'s parameters into `to`'s, by name: the twin starts from the same weights.
inline void copy_params(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto dst = to.named_parameters();
  for (const auto& item : from.named_parameters()) dst[item.key()].copy_(item.value());
}

// An optimizer for `params`: Adam, or SGD with momentum 0.9, at learning rate `lr`.
inline std::unique_ptr<torch::optim::Optimizer> adam_or_sgd(bool adam, const std::vector<at::Tensor>& params,
                                                            double lr) {
  if (adam) return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(lr));
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(lr).momentum(0.9));
}

// Every parameter group's learning rate (a schedule written by hand).
inline void set_lr(torch::optim::Optimizer& o, double lr) {
  for (auto& group : o.param_groups()) group.options().set_lr(lr);
}

// One training step of `m` on an MSE loss: zero_grad, forward, backward, step.
inline at::Tensor mse_step(torch::nn::Sequential& m, torch::optim::Optimizer& o, const at::Tensor& x,
                           const at::Tensor& y) {
  o.zero_grad();
  auto loss = torch::mse_loss(m->forward(x), y);
  loss.backward();
  o.step();
  return loss;
}

}  // namespace tcap::testing
