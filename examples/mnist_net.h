// The MNIST-style CNN of examples/ddp_mnist.cpp and bench/ddp_bench.cpp: two 3x3
// convolutions with BatchNorm, ReLU and 2x2 max pooling, then two Linear layers, on
// 1x28x28 images and 10 classes.
#pragma once

#include <torch/torch.h>

struct MnistNetImpl : torch::nn::Module {
  explicit MnistNetImpl(int64_t hidden = 128) {
    namespace nn = torch::nn;
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, 16, 3).padding(1)));
    bn1 = register_module("bn1", nn::BatchNorm2d(16));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(16, 32, 3).padding(1)));
    bn2 = register_module("bn2", nn::BatchNorm2d(32));
    fc1 = register_module("fc1", nn::Linear(32 * 7 * 7, hidden));
    fc2 = register_module("fc2", nn::Linear(hidden, 10));
  }
  at::Tensor forward(const at::Tensor& x) {
    auto h = torch::max_pool2d(torch::relu(bn1->forward(conv1->forward(x))), 2);
    h = torch::max_pool2d(torch::relu(bn2->forward(conv2->forward(h))), 2);
    return fc2->forward(torch::relu(fc1->forward(h.flatten(1))));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(MnistNet);
