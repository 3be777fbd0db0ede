// The seed tutorials' scenarios as small training programs:
//   - the Dynamo / AOTAutograd tutorials' MLP: Linear(10, 5), ReLU, Linear(5, 2), Softmax,
//     mse_loss against a target, SGD;
//   - the AOTAutograd tutorial's cos(cos(a + b + c + d)): b, c, d are parameters, a the
//     batch, the sum as loss, SGD;
//   - the compiled-autograd tutorial's Linear(10, 10) with loss = model(x).sum(), where x
//     requires grad and carries a tensor hook (grad + 10); x.grad is returned by the step.
#pragma once

#include "programs/program.h"

namespace tcap::programs::tutorials {

namespace nn = torch::nn;

// The tutorial MLP; its optimizer, batch size, seed and name are parameters so that
// bench's mlp_small_step (Adam, batch 1: programs/overhead.h) is the same program.
class TutorialMlp : public Program {
 public:
  using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;
  static MakeOptimizer sgd(double lr) {
    return [lr](std::vector<at::Tensor> ps) {
      return std::make_unique<torch::optim::SGD>(std::move(ps), torch::optim::SGDOptions(lr));
    };
  }
  explicit TutorialMlp(std::string name = "tutorial_mlp", uint64_t seed = 16, int64_t batch = 9,
                       const MakeOptimizer& make_optimizer = sgd(0.1))
      : name_(std::move(name)), seed_value_(seed), batch_(batch), seed_(seed), opt_(make_optimizer(model_->parameters())) {
    set_model(model_);
  }
  std::string name() const override { return name_; }
  std::vector<std::shared_ptr<nn::Module>> modules() override { return {model_.ptr()}; }
  std::vector<torch::optim::Optimizer*> optimizers() override { return {opt_.get()}; }
  Tensors batch(int step) override {
    auto gen = step_generator(seed_value_, step);
    return {torch::randn({batch_, 10}, gen), torch::softmax(torch::randn({batch_, 2}, gen), 1)};
  }
  Tensors train_step(const Tensors& batch) override {
    opt_->zero_grad();
    auto loss = torch::mse_loss(forward(0, batch[0]), batch[1]);
    loss.backward();
    opt_->step();
    return {loss};
  }
  std::vector<std::shared_ptr<CompiledFunction>> compile_forwards(const CompileOptions& options) override {
    return compile_model(model_, options);
  }

 private:
  std::string name_;
  uint64_t seed_value_;
  int64_t batch_;
  Seed seed_;
  nn::Sequential model_{nn::Linear(10, 5), nn::ReLU(), nn::Linear(5, 2), nn::Softmax(1)};
  std::unique_ptr<torch::optim::Optimizer> opt_;
};

struct CosCosImpl : nn::Module {
  CosCosImpl() {
    b = register_parameter("b", torch::randn({7, 5}));
    c = register_parameter("c", torch::randn({5}));
    d = register_parameter("d", torch::randn({7, 1}));
  }
  torch::Tensor forward(torch::Tensor a) { return torch::cos(torch::cos(a + b + c + d)); }
  torch::Tensor b, c, d;
};
TORCH_MODULE(CosCos);

class TutorialCosCos : public Program {
 public:
  TutorialCosCos() : opt_(model_->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)) {
    set_model(model_);
  }
  std::string name() const override { return "tutorial_coscos"; }
  std::vector<std::shared_ptr<nn::Module>> modules() override { return {model_.ptr()}; }
  std::vector<torch::optim::Optimizer*> optimizers() override { return {&opt_}; }
  Tensors batch(int step) override { return {torch::randn({7, 5}, step_generator(17, step))}; }
  Tensors train_step(const Tensors& batch) override {
    opt_.zero_grad();
    auto loss = forward(0, batch[0]).sum();
    loss.backward();
    opt_.step();
    return {loss};
  }
  std::vector<std::shared_ptr<CompiledFunction>> compile_forwards(const CompileOptions& options) override {
    return compile_model(model_, options);
  }

 private:
  Seed seed_{17};
  CosCos model_;
  torch::optim::SGD opt_;
};

class TutorialHook : public Program {
 public:
  TutorialHook() : opt_(model_->parameters(), torch::optim::SGDOptions(0.01)) {
    set_model(model_);
  }
  std::string name() const override { return "tutorial_hook"; }
  std::vector<std::shared_ptr<nn::Module>> modules() override { return {model_.ptr()}; }
  std::vector<torch::optim::Optimizer*> optimizers() override { return {&opt_}; }
  Tensors batch(int step) override { return {torch::randn({10}, step_generator(18, step))}; }
  Tensors train_step(const Tensors& batch) override {
    opt_.zero_grad();
    auto x = batch[0].clone().requires_grad_(true);
    x.register_hook([](const at::Tensor& grad) { return grad + 10; });
    auto loss = forward(0, x).sum();
    loss.backward();
    opt_.step();
    return {loss, x.grad()};
  }
  std::vector<std::shared_ptr<CompiledFunction>> compile_forwards(const CompileOptions& options) override {
    return compile_model(model_, options);
  }

 private:
  Seed seed_{18};
  nn::Linear model_{10, 10};
  torch::optim::SGD opt_;
};

}  // namespace tcap::programs::tutorials
