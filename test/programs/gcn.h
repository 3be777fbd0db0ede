// A two-layer graph convolutional network (Kipf and Welling's GCN) trained full-batch on
// one fixed random graph, as a node-classification program does: node features
// [kNodes, kFeatures], the normalized adjacency D^-1/2 (A + I) D^-1/2 held by the model
// as a buffer, labels, and a train mask of about 40% of the nodes; the loss is
// cross_entropy over the nodes the mask selects (out.index({train_mask})), Adam. The
// masked index has a size that comes from the mask's values (Note [Sizes that come from
// values] in csrc/ir/op_facts.h); every step uses the same mask, as full-batch training
// does.
#pragma once

#include "programs/program.h"

namespace tcap::programs::gcn {

namespace nn = torch::nn;

constexpr int64_t kNodes = 67;
constexpr int64_t kFeatures = 12;
constexpr int64_t kHidden = 16;
constexpr int64_t kClasses = 4;

// The graph: a generator seeded once, so every run (and the Python peer) sees one graph.
struct Graph {
  at::Tensor x, adj, y, train_mask;
  explicit Graph(uint64_t seed) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    x = torch::randn({kNodes, kFeatures}, gen);
    auto a = (torch::rand({kNodes, kNodes}, gen) < 0.08).to(torch::kFloat).triu(1);
    a = a + a.t() + torch::eye(kNodes);
    auto d = a.sum(1).pow(-0.5);
    adj = d.unsqueeze(1) * a * d.unsqueeze(0);
    y = torch::randint(kClasses, {kNodes}, gen);
    train_mask = torch::rand({kNodes}, gen) < 0.4;
  }
};

struct GcnImpl : nn::Module {
  explicit GcnImpl(const at::Tensor& adjacency)
      : adj(register_buffer("adj", adjacency)),
        l1(register_module("l1", nn::Linear(kFeatures, kHidden))),
        l2(register_module("l2", nn::Linear(kHidden, kClasses))) {}
  at::Tensor forward(const at::Tensor& x) {
    auto h = torch::relu(torch::mm(adj, l1->forward(x)));
    return torch::mm(adj, l2->forward(h));
  }
  at::Tensor adj;
  nn::Linear l1, l2;
};
TORCH_MODULE(Gcn);

class GcnProgram : public Program {
 public:
  GcnProgram() : opt_(model_->parameters(), torch::optim::AdamOptions(1e-2)) { set_model(model_); }
  std::string name() const override { return "gcn"; }
  std::vector<std::shared_ptr<nn::Module>> modules() override { return {model_.ptr()}; }
  std::vector<torch::optim::Optimizer*> optimizers() override { return {&opt_}; }
  Tensors batch(int /*step*/) override { return {graph_.x, graph_.y, graph_.train_mask}; }
  Tensors train_step(const Tensors& batch) override {
    opt_.zero_grad();
    auto out = forward(0, batch[0]);
    auto loss = torch::nn::functional::cross_entropy(out.index({batch[2]}), batch[1].index({batch[2]}));
    loss.backward();
    opt_.step();
    return {loss};
  }
  std::vector<std::shared_ptr<CompiledFunction>> compile_forwards(const CompileOptions& options) override {
    return compile_model(model_, options);
  }

 private:
  Seed seed_{31};
  Graph graph_{31};
  Gcn model_{graph_.adj};
  torch::optim::Adam opt_;
};

}  // namespace tcap::programs::gcn
