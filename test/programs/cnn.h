// An MNIST-style CNN (pytorch/examples cpp/mnist): two Conv2d + BatchNorm2d + ReLU +
// max_pool2d blocks, Dropout (p = 0, so results stay checkable), two Linear layers,
// log_softmax + nll_loss, trained with SGD with momentum on random 16x16 images, in every
// mode against eager.
#pragma once

#include "programs/program.h"

namespace tcap::programs::cnn {

namespace nn = torch::nn;

struct NetImpl : nn::Module {
  NetImpl() {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, 8, 3)));
    bn1 = register_module("bn1", nn::BatchNorm2d(8));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(8, 16, 3)));
    bn2 = register_module("bn2", nn::BatchNorm2d(16));
    dropout = register_module("dropout", nn::Dropout(0.0));
    fc1 = register_module("fc1", nn::Linear(64, 32));
    fc2 = register_module("fc2", nn::Linear(32, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn1->forward(conv1->forward(x))), 2);  // 16 -> 14 -> 7
    x = torch::max_pool2d(torch::relu(bn2->forward(conv2->forward(x))), 2);  // 7 -> 5 -> 2
    x = x.view({-1, 64});
    x = torch::relu(fc1->forward(x));
    x = dropout->forward(x);
    return torch::log_softmax(fc2->forward(x), /*dim=*/1);
  }
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  nn::Dropout dropout{nullptr};
  nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

class Cnn : public Program {
 public:
  // batch: images per step (8 in the test tier; tcap-bench's cnn_step uses 16).
  explicit Cnn(int64_t batch = 8)
      : batch_(batch), opt_(model_->parameters(), torch::optim::SGDOptions(0.01).momentum(0.5)) {
    set_model(model_);
  }
  std::string name() const override { return "cnn"; }
  std::vector<std::shared_ptr<nn::Module>> modules() override { return {model_.ptr()}; }
  std::vector<torch::optim::Optimizer*> optimizers() override { return {&opt_}; }
  Tensors batch(int step) override {
    auto gen = step_generator(11, step);
    return {torch::randn({batch_, 1, 16, 16}, gen), torch::randint(0, 10, {batch_}, gen)};
  }
  Tensors train_step(const Tensors& batch) override {
    opt_.zero_grad();
    auto output = forward(0, batch[0]);
    auto loss = torch::nll_loss(output, batch[1]);
    loss.backward();
    opt_.step();
    return {loss};
  }
  std::vector<std::shared_ptr<CompiledFunction>> compile_forwards(const CompileOptions& options) override {
    return compile_model(model_, options);
  }

 private:
  int64_t batch_;
  Seed seed_{11};
  Net model_;
  torch::optim::SGD opt_;
};

}  // namespace tcap::programs::cnn
