// Small training steps whose time is per-op overhead rather than arithmetic (the
// overhead workloads of tcap-bench, bench/README.md): the seed MLP with Adam at batch 1
// (the tutorial MLP, programs/tutorials.h), and an Adam step over 100 small parameters. Written as ordinary LibTorch programs and
// run in every mode against eager, like the rest of the tier.
#pragma once

#include "programs/program.h"
#include "programs/tutorials.h"

namespace tcap::programs::overhead {

namespace nn = torch::nn;

// The seed MLP (Linear(10, 5), ReLU, Linear(5, 2), Softmax) at batch 1, mse_loss, Adam:
// bench's mlp_small, as a whole training step (the tutorial MLP with Adam).
inline std::unique_ptr<Program> mlp_small_adam() {
  return std::make_unique<tutorials::TutorialMlp>(
      "mlp_small_adam", 23, 1, [](std::vector<at::Tensor> ps) {
        return std::make_unique<torch::optim::Adam>(std::move(ps), torch::optim::AdamOptions(1e-2));
      });
}

// kParams parameters of small odd shapes; the forward flattens and concatenates them and
// the loss is a weighted sum of squares against the batch, so the step's time is the
// optimizer's per-parameter work (100 Adam updates of a few elements each).
struct ManyParamsImpl : nn::Module {
  static constexpr int kParams = 100;
  ManyParamsImpl() {
    for (int i = 0; i < kParams; ++i) {
      const int64_t a = 1 + i % 7, b = 1 + (i * 3) % 5;
      params.push_back(register_parameter("p" + std::to_string(i), torch::randn(i % 3 == 0 ? std::vector<int64_t>{a}
                                                                                          : std::vector<int64_t>{a, b})));
    }
  }
  int64_t numel() const {
    int64_t n = 0;
    for (const auto& p : params) n += p.numel();
    return n;
  }
  torch::Tensor forward(torch::Tensor w) {
    std::vector<torch::Tensor> flat;
    for (const auto& p : params) flat.push_back(p.reshape({-1}));
    return torch::cat(flat) * w;
  }
  std::vector<torch::Tensor> params;
};
TORCH_MODULE(ManyParams);

class Adam100 : public Program {
 public:
  Adam100() : opt_(model_->parameters(), torch::optim::AdamOptions(1e-2)) { set_model(model_); }
  std::string name() const override { return "adam100"; }
  std::vector<std::shared_ptr<nn::Module>> modules() override { return {model_.ptr()}; }
  std::vector<torch::optim::Optimizer*> optimizers() override { return {&opt_}; }
  Tensors batch(int step) override {
    auto gen = step_generator(29, step);
    return {torch::rand({model_->numel()}, gen) + 0.5};
  }
  Tensors train_step(const Tensors& batch) override {
    opt_.zero_grad();
    auto out = forward(0, batch[0]);
    auto loss = (out * out).sum();
    loss.backward();
    opt_.step();
    return {loss};
  }
  std::vector<std::shared_ptr<CompiledFunction>> compile_forwards(const CompileOptions& options) override {
    return compile_model(model_, options);
  }

 private:
  Seed seed_{29};
  ManyParams model_;
  torch::optim::Adam opt_;
};

}  // namespace tcap::programs::overhead
