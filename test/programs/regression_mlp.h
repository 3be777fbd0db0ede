// A regression MLP (Linear + ReLU x2, Linear, mse_loss) trained with SGD + momentum under
// a hand-written learning-rate schedule (linear warm-up over 5 steps, then exponential
// decay, set on every param group before every step), with
// torch::nn::utils::clip_grad_norm_ between backward() and step(). The norm it returns is
// logged (compared with eager per step); a second variant ignores it, as most programs do.
#pragma once

#include "programs/program.h"

#include <cmath>

namespace tcap::programs::regression {

namespace nn = torch::nn;

constexpr double kBaseLr = 0.05;

class RegressionMlp : public Program {
 public:
  explicit RegressionMlp(bool log_norm) : log_norm_(log_norm), opt_(model_->parameters(), torch::optim::SGDOptions(kBaseLr).momentum(0.9)) {
    set_model(model_);
  }
  std::string name() const override { return log_norm_ ? "regression" : "regression_nolog"; }
  std::vector<std::shared_ptr<nn::Module>> modules() override { return {model_.ptr()}; }
  std::vector<torch::optim::Optimizer*> optimizers() override { return {&opt_}; }
  Tensors batch(int step) override {
    auto gen = step_generator(15, step);
    auto x = torch::randn({24, 7}, gen);
    auto y = (x.narrow(1, 0, 1) * 2 - x.narrow(1, 3, 1)).sin() + 0.1 * torch::randn({24, 1}, gen);
    return {x, y};
  }
  void before_step(int step) override {
    const double lr = step < 5 ? kBaseLr * (step + 1) / 5 : kBaseLr * std::pow(0.9, step - 5);
    for (auto& group : opt_.param_groups()) group.options().set_lr(lr);
  }
  Tensors train_step(const Tensors& batch) override {
    opt_.zero_grad();
    auto loss = torch::mse_loss(forward(0, batch[0]), batch[1]);
    loss.backward();
    const double norm = nn::utils::clip_grad_norm_(model_->parameters(), /*max_norm=*/0.5);
    if (log_norm_) host_log.push_back(norm);
    opt_.step();
    return {loss};
  }
  std::vector<std::shared_ptr<CompiledFunction>> compile_forwards(const CompileOptions& options) override {
    return compile_model(model_, options);
  }
  // clip_grad_norm_ returns the total norm read on the host (item()), a value that changes
  // every step; this program only logs it (the clipping itself happens on the tensors), so
  // it promises compile_step that the value is observed, not branched on.
  void adjust_step_options(CompileOptions& options) override { options.observe_host_values = true; }
  // A replayed step did not run the push_back above; the norm is the step's one host read.
  void replayed_step(const std::vector<c10::IValue>& host_values) override {
    if (log_norm_) host_log.push_back(host_values.at(0).toDouble());
  }

 private:
  bool log_norm_;
  Seed seed_{15};
  nn::Sequential model_{nn::Linear(7, 32), nn::ReLU(), nn::Linear(32, 32), nn::ReLU(), nn::Linear(32, 1)};
  torch::optim::SGD opt_;
};

}  // namespace tcap::programs::regression
