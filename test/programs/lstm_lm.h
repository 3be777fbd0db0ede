// An LSTM language model (the word_language_model example's shape): Embedding, a
// two-layer nn::LSTM, a Linear decoder and cross_entropy over the next token, trained with
// Adam.
#pragma once

#include "programs/program.h"

namespace tcap::programs::lstm {

namespace nn = torch::nn;

constexpr int64_t kVocab = 40, kEmbed = 12, kHidden = 16, kSeq = 10, kBatch = 3;

struct LstmLmImpl : nn::Module {
  LstmLmImpl() {
    encoder = register_module("encoder", nn::Embedding(kVocab, kEmbed));
    lstm = register_module("lstm", nn::LSTM(nn::LSTMOptions(kEmbed, kHidden).num_layers(2)));
    decoder = register_module("decoder", nn::Linear(kHidden, kVocab));
  }
  // ids: [seq, batch]; returns [seq, batch, vocab] logits (the hidden state starts at zero).
  torch::Tensor forward(torch::Tensor ids) {
    auto output = std::get<0>(lstm->forward(encoder->forward(ids)));
    return decoder->forward(output);
  }
  nn::Embedding encoder{nullptr};
  nn::LSTM lstm{nullptr};
  nn::Linear decoder{nullptr};
};
TORCH_MODULE(LstmLm);

class LstmProgram : public Program {
 public:
  LstmProgram() : opt_(model_->parameters(), torch::optim::AdamOptions(3e-3)) {
    set_model(model_);
  }
  std::string name() const override { return "lstm"; }
  std::vector<std::shared_ptr<nn::Module>> modules() override { return {model_.ptr()}; }
  std::vector<torch::optim::Optimizer*> optimizers() override { return {&opt_}; }
  Tensors batch(int step) override {
    auto gen = step_generator(14, step);
    auto text = torch::randint(0, kVocab, {kSeq + 1, kBatch}, gen);
    return {text.slice(0, 0, kSeq).contiguous(), text.slice(0, 1).contiguous()};
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

 private:
  Seed seed_{14};
  LstmLm model_;
  torch::optim::Adam opt_;
};

}  // namespace tcap::programs::lstm
