// Compiled autograd over training: the engine restored when the scope ends, a transformer
// encoder trained with Adam and gradient-norm hooks, and leaves with post-accumulate-grad
// hooks accumulated where the engine would; each checked against eager LibTorch.
#include <tcap/compiled_autograd.h>
#include <tcap/compile.h>

#include "ca_fixture.h"

#include "support/backends.h"
#include "support/compare.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace {

using tcap::testing::close;
using tcap::testing::count_call_hooks;
using tcap::testing::opts;
using CompiledAutograd = tcap::testing::CompiledAutogradTest;

// Leaving the scope restores the engine: later backwards are plain.
TEST_F(CompiledAutograd, LeavingTheScopeRestoresTheEngine) {
  auto x = torch::randn({3}, torch::requires_grad());
  {
    tcap::CompiledAutogradGuard ca(opts("scope"));
    EXPECT_TRUE(ca.engine_hook_installed());
    (x * 2).sum().backward();
  }
  (x * 2).sum().backward();
  tcap::CompiledAutogradGuard ca(opts("scope"));
  EXPECT_EQ(ca.stats().calls, 1);
  EXPECT_TRUE(close(x.grad(), torch::full({3}, 4.0)));
}

// Seed-scale training: a transformer encoder layer, 20 Adam steps, gradient-norm hooks
// on every parameter and on the layer's output. Losses, gradients and the norms the hooks
// log match eager at every step; only the first backward is captured.
void transformer_training(const std::string& backend, double rtol, double atol) {
  auto make = [] {
    return torch::nn::TransformerEncoderLayer(
        torch::nn::TransformerEncoderLayerOptions(16, 4).dim_feedforward(24).dropout(0.0));
  };
  torch::manual_seed(3);
  auto model = make();
  auto ref = make();
  {
    torch::NoGradGuard ng;
    auto a = model->parameters();
    auto b = ref->parameters();
    for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
  }
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam opt_ref(ref->parameters(), torch::optim::AdamOptions(1e-2));
  std::vector<double> norms, norms_ref;
  for (auto& p : model->parameters()) {
    p.register_hook([&norms](const at::Tensor& g) { norms.push_back(g.norm().item<double>()); });
  }
  for (auto& p : ref->parameters()) {
    p.register_hook([&norms_ref](const at::Tensor& g) { norms_ref.push_back(g.norm().item<double>()); });
  }
  tcap::CompileOptions o = opts("transformer_" + backend, backend);
  for (int step = 0; step < 20; ++step) {
    auto src = torch::randn({7, 3, 16});  // (sequence, batch, features): odd sizes
    auto target = torch::randn({7, 3, 16});
    auto forward = [&](torch::nn::TransformerEncoderLayer& m, std::vector<double>& log) {
      auto out = m->forward(src);
      out.register_hook([&log](const at::Tensor& g) { log.push_back(g.norm().item<double>()); });
      return torch::mse_loss(out, target);
    };
    opt.zero_grad();
    opt_ref.zero_grad();
    auto loss = forward(model, norms);
    auto loss_ref = forward(ref, norms_ref);
    EXPECT_TRUE(close(loss, loss_ref, rtol, atol)) << "step " << step;
    {
      tcap::CompiledAutogradGuard ca(o);
      loss.backward();
    }
    loss_ref.backward();
    auto a = model->parameters();
    auto b = ref->parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(close(a[i].grad(), b[i].grad(), rtol, atol)) << "step " << step << " parameter " << i;
    }
    opt.step();
    opt_ref.step();
  }
  ASSERT_EQ(norms.size(), norms_ref.size());
  for (size_t i = 0; i < norms.size(); ++i) EXPECT_NEAR(norms[i], norms_ref[i], 1e-4 * (1 + norms_ref[i])) << i;
  tcap::CompiledAutogradGuard ca(o);
  EXPECT_EQ(ca.stats().captures, 1);
  EXPECT_EQ(ca.stats().replays, 19);
  EXPECT_EQ(count_call_hooks(ca.graphs().at(0)), static_cast<int>(model->parameters().size()) + 1);
}

TEST_F(CompiledAutograd, TransformerEncoderAdamWithGradNormHooks) { transformer_training("eager", 1e-5, 1e-6); }

TEST_F(CompiledAutograd, TransformerEncoderAdamWithGradNormHooksLlvm) {
  transformer_training("auto", 1e-4, 1e-5);
}

// Note [Leaves accumulated where the engine would]: a leaf with a post-accumulate-grad
// hook (DistributedDataParallel's) is accumulated, and its hook run, at the point of the
// backward where the engine runs its AccumulateGrad, not after the whole compiled graph.
// Here: lin2.weight's gradient is final before the backward reaches h1, so its hook runs
// before h1's tensor hook, under the engine and in a replay alike.
struct RecordOrderHook : torch::autograd::PostAccumulateGradHook {
  RecordOrderHook(const bool* h1_seen, std::vector<int>* log) : h1_seen(h1_seen), log(log) {}
  void operator()(const torch::autograd::Variable& p) override {
    log->push_back(*h1_seen ? 1 : 0);
    seen_grad = p.grad().defined();
  }
  const bool* h1_seen;
  std::vector<int>* log;
  bool seen_grad = false;
};

void accumulate_where_the_engine_would(const std::string& backend) {
  torch::nn::Linear lin1(6, 5), lin2(5, 3), ref1(6, 5), ref2(5, 3);
  {
    torch::NoGradGuard ng;
    ref1->weight.copy_(lin1->weight);
    ref1->bias.copy_(lin1->bias);
    ref2->weight.copy_(lin2->weight);
    ref2->bias.copy_(lin2->bias);
  }
  bool h1_seen = false;
  std::vector<int> order, ref_order;
  torch::autograd::impl::set_post_acc_grad_hooks(lin2->weight, std::make_unique<RecordOrderHook>(&h1_seen, &order));
  torch::autograd::impl::set_post_acc_grad_hooks(ref2->weight, std::make_unique<RecordOrderHook>(&h1_seen, &ref_order));
  tcap::CompiledAutogradStats last;
  std::vector<tcap::ir::Graph> graphs;
  auto run = [&](torch::nn::Linear& a, torch::nn::Linear& b, const at::Tensor& x, bool compiled) {
    h1_seen = false;
    auto h1 = torch::relu(a->forward(x));
    h1.register_hook([&h1_seen](const at::Tensor&) { h1_seen = true; });
    auto loss = b->forward(h1).pow(2).sum();
    if (compiled) {
      tcap::CompiledAutogradGuard ca(opts("acc_order_" + backend, backend));
      loss.backward();
      last = ca.stats();
      graphs = ca.graphs();
    } else {
      loss.backward();
    }
  };
  for (int step = 0; step < 4; ++step) {
    auto x = torch::randn({4, 6});
    run(lin1, lin2, x, true);
    run(ref1, ref2, x, false);
  }
  EXPECT_GE(last.replays, 2);
  ASSERT_EQ(graphs.size(), 1u);
  int accumulate_nodes = 0;
  for (const auto& n : graphs[0].nodes()) {
    accumulate_nodes += n.kind == tcap::ir::NodeKind::CallHook &&
                        graphs[0].hooks().at(static_cast<size_t>(n.hook)).kind == tcap::ir::HookKind::AccumulateGrad;
  }
  EXPECT_EQ(accumulate_nodes, 1) << "only lin2.weight has a post-accumulate-grad hook";
  ASSERT_EQ(order.size(), 4u);
  EXPECT_EQ(order, ref_order) << "the hook ran at another point of the backward than under the engine";
  EXPECT_EQ(ref_order, std::vector<int>(4, 0));
  for (const auto& [p, q] : {std::pair{lin1->weight, ref1->weight}, {lin1->bias, ref1->bias},
                             {lin2->weight, ref2->weight}, {lin2->bias, ref2->bias}}) {
    EXPECT_TRUE(close(p.grad(), q.grad(), 1e-5, 1e-6));
  }
  torch::autograd::impl::post_acc_grad_hooks(lin2->weight).reset();
  torch::autograd::impl::post_acc_grad_hooks(ref2->weight).reset();
}

TEST_F(CompiledAutograd, LeafWithPostAccumulateGradHookAccumulatesWhereTheEngineWould) {
  accumulate_where_the_engine_would("eager");
}

TEST_F(CompiledAutograd, LeafWithPostAccumulateGradHookAccumulatesWhereTheEngineWouldLlvm) {
  accumulate_where_the_engine_would("auto");
}

}  // namespace
