// A DCGAN-style pair (pytorch/examples cpp/dcgan): a generator of ConvTranspose2d +
// BatchNorm2d + ReLU ending in Tanh, a discriminator of Conv2d + LeakyReLU(0.2) (+
// BatchNorm2d), two Adams with betas (0.5, 0.999), BCE-with-logits losses; the
// discriminator trained on real images and fake.detach(), then the generator through the
// discriminator: ONE step per iteration (compile_step takes both models and optimizers).
#pragma once

#include "programs/program.h"

namespace tcap::programs::gan {

namespace nn = torch::nn;

constexpr int64_t kNoise = 8;

struct GeneratorImpl : nn::Module {
  GeneratorImpl() {
    conv1 = register_module("conv1", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(kNoise, 16, 4).bias(false)));
    bn1 = register_module("bn1", nn::BatchNorm2d(16));
    conv2 = register_module("conv2",
                            nn::ConvTranspose2d(nn::ConvTranspose2dOptions(16, 8, 4).stride(2).padding(1).bias(false)));
    bn2 = register_module("bn2", nn::BatchNorm2d(8));
    conv3 = register_module("conv3",
                            nn::ConvTranspose2d(nn::ConvTranspose2dOptions(8, 1, 4).stride(2).padding(1).bias(false)));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn1->forward(conv1->forward(x)));  // 1 -> 4
    x = torch::relu(bn2->forward(conv2->forward(x)));  // 4 -> 8
    return torch::tanh(conv3->forward(x));             // 8 -> 16
  }
  nn::ConvTranspose2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
};
TORCH_MODULE(Generator);

inline nn::Sequential discriminator() {
  auto leaky = nn::LeakyReLUOptions().negative_slope(0.2);
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 8, 4).stride(2).padding(1).bias(false)),  // 16 -> 8
                        nn::LeakyReLU(leaky),
                        nn::Conv2d(nn::Conv2dOptions(8, 16, 4).stride(2).padding(1).bias(false)),  // 8 -> 4
                        nn::BatchNorm2d(16), nn::LeakyReLU(leaky),
                        nn::Conv2d(nn::Conv2dOptions(16, 1, 4).bias(false)),  // 4 -> 1
                        nn::Flatten());
}

class Gan : public Program {
 public:
  Gan()
      : g_opt_(generator_->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999})),
        d_opt_(discriminator_->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999})) {
    forwards_ = {[this](const at::Tensor& x) { return generator_->forward(x); },
                 [this](const at::Tensor& x) { return discriminator_->forward(x); }};
  }
  std::string name() const override { return "dcgan"; }
  std::vector<std::shared_ptr<nn::Module>> modules() override { return {generator_.ptr(), discriminator_.ptr()}; }
  std::vector<torch::optim::Optimizer*> optimizers() override { return {&g_opt_, &d_opt_}; }
  Tensors batch(int step) override {
    auto gen = step_generator(12, step);
    return {torch::rand({8, 1, 16, 16}, gen) * 2 - 1, torch::randn({8, kNoise, 1, 1}, gen)};
  }
  Tensors train_step(const Tensors& batch) override {
    const auto& real = batch[0];
    const auto& noise = batch[1];
    const int64_t n = real.size(0);
    // Train the discriminator on real images and detached fakes.
    d_opt_.zero_grad();
    auto real_labels = torch::full({n, 1}, 0.9);  // label smoothing, as the example does
    auto d_loss_real = torch::binary_cross_entropy_with_logits(forward(1, real), real_labels);
    auto fake = forward(0, noise);
    auto fake_labels = torch::zeros({n, 1});
    auto d_loss_fake = torch::binary_cross_entropy_with_logits(forward(1, fake.detach()), fake_labels);
    auto d_loss = d_loss_real + d_loss_fake;
    d_loss.backward();
    d_opt_.step();
    // Train the generator through the discriminator.
    g_opt_.zero_grad();
    auto g_loss = torch::binary_cross_entropy_with_logits(forward(1, fake), torch::ones({n, 1}));
    g_loss.backward();
    g_opt_.step();
    return {d_loss, g_loss};
  }
  std::vector<std::shared_ptr<CompiledFunction>> compile_forwards(const CompileOptions& options) override {
    auto g_options = options, d_options = options;
    g_options.name = "generator";
    d_options.name = "discriminator";
    auto g = tcap::compile(generator_, g_options);
    auto d = tcap::compile(discriminator_, d_options);
    forwards_ = {[g](const at::Tensor& x) { return g->forward(x); },
                 [d](const at::Tensor& x) { return d->forward(x); }};
    return {g, d};
  }

 private:
  Seed seed_{12};
  Generator generator_;
  nn::Sequential discriminator_ = discriminator();
  torch::optim::Adam g_opt_, d_opt_;
};

}  // namespace tcap::programs::gan
