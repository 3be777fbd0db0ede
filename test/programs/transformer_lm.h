// A small transformer language model: token Embedding plus a learned positional
// Embedding, two nn::TransformerEncoderLayer (nn::MultiheadAttention inside, dropout 0)
// under a causal mask, a Linear head and cross_entropy, trained with AdamW. Hooks on
// every parameter log the gradient's norm on the host (g.norm().item<double>()), as a
// training loop that watches its gradients does; the logged norms are compared with
// eager's as a multiset per step (the engine may run the leaves' hooks in another order).
#pragma once

#include "programs/program.h"

#include <limits>

namespace tcap::programs::transformer {

namespace nn = torch::nn;

constexpr int64_t kVocab = 32, kModel = 16, kContext = 12, kBatch = 4;

struct TransformerLmImpl : nn::Module {
  TransformerLmImpl() {
    tokens = register_module("tokens", nn::Embedding(kVocab, kModel));
    positions = register_module("positions", nn::Embedding(kContext, kModel));
    auto layer = nn::TransformerEncoderLayerOptions(kModel, 4).dim_feedforward(2 * kModel).dropout(0.0);
    layer1 = register_module("layer1", nn::TransformerEncoderLayer(layer));
    layer2 = register_module("layer2", nn::TransformerEncoderLayer(layer));
    head = register_module("head", nn::Linear(kModel, kVocab));
  }
  // ids: [seq, batch] token ids; returns [seq, batch, vocab] logits.
  torch::Tensor forward(torch::Tensor ids) {
    const int64_t seq = ids.size(0);
    auto pos = torch::arange(seq, ids.options());
    auto x = tokens->forward(ids) + positions->forward(pos).unsqueeze(1);
    auto causal = torch::triu(torch::full({seq, seq}, -std::numeric_limits<float>::infinity()), 1);
    x = layer1->forward(x, causal);
    x = layer2->forward(x, causal);
    return head->forward(x);
  }
  nn::Embedding tokens{nullptr}, positions{nullptr};
  nn::TransformerEncoderLayer layer1{nullptr}, layer2{nullptr};
  nn::Linear head{nullptr};
};
TORCH_MODULE(TransformerLm);

class TransformerProgram : public Program {
 public:
  TransformerProgram() : opt_(model_->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.01)) {
    set_model(model_);
    for (auto& p : model_->parameters()) {
      p.register_hook([this](const at::Tensor& g) { host_log.push_back(g.norm().item<double>()); });
    }
  }
  std::string name() const override { return "transformer"; }
  std::vector<std::shared_ptr<nn::Module>> modules() override { return {model_.ptr()}; }
  std::vector<torch::optim::Optimizer*> optimizers() override { return {&opt_}; }
  Tensors batch(int step) override {
    auto gen = step_generator(13, step);
    auto text = torch::randint(0, kVocab, {kContext + 1, kBatch}, gen);
    return {text.slice(0, 0, kContext).contiguous(), text.slice(0, 1).contiguous()};
  }
  Tensors train_step(const Tensors& batch) override {
    opt_.zero_grad();
    auto logits = forward(0, batch[0]);
    auto loss = torch::cross_entropy_loss(logits.view({-1, kVocab}), batch[1].view({-1}));
    loss.backward();
    opt_.step();
    return {loss};
  }
  std::vector<std::shared_ptr<CompiledFunction>> compile_forwards(const CompileOptions& options) override {
    return compile_model(model_, options);
  }
  // See the header: the key bias of attention has a zero true gradient.
  at::Tensor comparable(const std::string& name, const at::Tensor& param) override {
    if (name.find("in_proj_bias") == std::string::npos) return param;
    return torch::cat({param.slice(0, 0, kModel), param.slice(0, 2 * kModel)});
  }
  // The hooks read each gradient's norm on the host only to log it: a value that changes
  // every step without changing the graph, which compile_step may take as observed.
  void adjust_step_options(CompileOptions& options) override { options.observe_host_values = true; }

 private:
  Seed seed_{13};
  TransformerLm model_;
  torch::optim::AdamW opt_;
};

}  // namespace tcap::programs::transformer
