// The seed MLP training step that record_mlp_step times and tcap-capture-profile runs
// under callgrind or perf.
#pragma once

#include <tcap/capture.h>

#include <torch/torch.h>

namespace tcap::bench {

// The seed MLP, batch 1, and one training step without an optimizer: zero the grads,
// forward, MSE loss against a fixed random target, backward.
struct Mlp {
  torch::nn::Sequential model{torch::nn::Linear(10, 5), torch::nn::ReLU(), torch::nn::Linear(5, 2),
                              torch::nn::Softmax(1)};
  at::Tensor x = torch::randn({1, 10});
  at::Tensor target = torch::randn({1, 2});

  at::Tensor step() {
    model->zero_grad();
    at::Tensor loss = torch::mse_loss(model->forward(x), target);
    loss.backward();
    return loss;
  }
  void declare(tcap::CaptureGuard& cap) {
    cap.register_module(*model);
    cap.input(x, "x");
    cap.input(target, "target");
  }
};

}  // namespace tcap::bench
