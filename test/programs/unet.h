// A small U-Net trained as a denoiser, as image-to-image programs are: residual blocks of
// (Conv2d, GroupNorm, SiLU) x 2 with a 1x1 skip, a strided convolution down, nearest
// upsampling and a concatenated skip connection up, a 1x1 convolution out; loss
// mse(out, clean) for a noisy input; AdamW. Group norms and SiLUs around convolutions are
// what Note [Group norm as kernels] (csrc/fuse/decompose_norms.cpp) fuses.
#pragma once

#include "programs/program.h"

namespace tcap::programs::unet {

namespace nn = torch::nn;

constexpr int64_t kBatch = 4;
constexpr int64_t kImage = 24;  // height and width
constexpr int64_t kChannels = 3;

struct BlockImpl : nn::Module {
  BlockImpl(int64_t in, int64_t out, int64_t groups)
      : c1(register_module("c1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1)))),
        n1(register_module("n1", nn::GroupNorm(groups, out))),
        c2(register_module("c2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1)))),
        n2(register_module("n2", nn::GroupNorm(groups, out))),
        skip(register_module("skip", nn::Conv2d(nn::Conv2dOptions(in, out, 1)))) {}
  at::Tensor forward(const at::Tensor& x) {
    auto h = torch::silu(n1->forward(c1->forward(x)));
    h = torch::silu(n2->forward(c2->forward(h)));
    return h + skip->forward(x);
  }
  nn::Conv2d c1;
  nn::GroupNorm n1;
  nn::Conv2d c2;
  nn::GroupNorm n2;
  nn::Conv2d skip;
};
TORCH_MODULE(Block);

struct UNetImpl : nn::Module {
  UNetImpl()
      : enc1(register_module("enc1", Block(kChannels, 16, 4))),
        down(register_module("down", nn::Conv2d(nn::Conv2dOptions(16, 16, 3).stride(2).padding(1)))),
        enc2(register_module("enc2", Block(16, 32, 8))),
        dec1(register_module("dec1", Block(48, 16, 4))),
        out(register_module("out", nn::Conv2d(nn::Conv2dOptions(16, kChannels, 1)))) {}
  at::Tensor forward(const at::Tensor& x) {
    auto e1 = enc1->forward(x);                     // [B, 16, 24, 24]
    auto e2 = enc2->forward(down->forward(e1));     // [B, 32, 12, 12]
    auto up = torch::nn::functional::interpolate(
        e2, torch::nn::functional::InterpolateFuncOptions().scale_factor(std::vector<double>{2, 2}).mode(torch::kNearest));
    return out->forward(dec1->forward(torch::cat({up, e1}, 1)));
  }
  Block enc1;
  nn::Conv2d down;
  Block enc2;
  Block dec1;
  nn::Conv2d out;
};
TORCH_MODULE(UNet);

class UNetProgram : public Program {
 public:
  UNetProgram() : opt_(model_->parameters(), torch::optim::AdamWOptions(1e-3)) { set_model(model_); }
  std::string name() const override { return "unet"; }
  std::vector<std::shared_ptr<nn::Module>> modules() override { return {model_.ptr()}; }
  std::vector<torch::optim::Optimizer*> optimizers() override { return {&opt_}; }
  Tensors batch(int step) override {
    auto gen = step_generator(41, step);
    auto clean = torch::randn({kBatch, kChannels, kImage, kImage}, gen);
    return {clean + 0.3 * torch::randn({kBatch, kChannels, kImage, kImage}, gen), clean};
  }
  Tensors train_step(const Tensors& batch) override {
    opt_.zero_grad();
    auto loss = torch::mse_loss(forward(0, batch[0]), batch[1]);
    loss.backward();
    opt_.step();
    return {loss};
  }
  std::vector<std::shared_ptr<CompiledFunction>> compile_forwards(const CompileOptions& options) override {
    return compile_model(model_, options);
  }

 private:
  Seed seed_{41};
  UNet model_;
  torch::optim::AdamW opt_;
};

}  // namespace tcap::programs::unet
