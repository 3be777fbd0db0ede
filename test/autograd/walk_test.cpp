// The backward walk (csrc/autograd/walk.h): its key tells apart every change that must
// recompile (Note [The backward key]), and a BackwardWalk reused across walks (the
// runtime pools them per thread) describes each graph exactly as a fresh one does: no
// part of an earlier graph's description survives into the next.
#include "autograd/walk.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace {

using Forward = std::function<at::Tensor(const at::Tensor&)>;

// The graph of loss = forward(x).sum() with a fresh leaf x of `n` elements, walked into
// `w` as backward() would walk it. The returned loss keeps the graph alive.
at::Tensor walk(const Forward& forward, int64_t n, tcap::ca::BackwardWalk& w) {
  auto x = torch::randn({n}, torch::requires_grad());
  at::Tensor loss = forward(x).sum();
  torch::autograd::edge_list roots{torch::autograd::impl::gradient_edge(loss)};
  auto root =
      std::make_shared<torch::autograd::GraphRoot>(roots, torch::autograd::variable_list{torch::ones_like(loss)});
  tcap::ca::walk_backward(root, {}, true, w);
  EXPECT_TRUE(w.why_not.empty()) << w.why_not;
  return loss;
}

std::string key_of(const Forward& forward, int64_t n = 7) {
  tcap::ca::BackwardWalk w;
  auto keep = walk(forward, n, w);
  return std::string(w.key());
}

at::Tensor chain(const at::Tensor& x, double c) { return torch::sin(x * c + 0.5) * torch::cos(x); }

TEST(BackwardWalk, KeyTellsApartWhatMustRecompile) {
  const std::string base = key_of([](const at::Tensor& x) { return chain(x, 1.01); });
  EXPECT_EQ(key_of([](const at::Tensor& x) { return chain(x, 1.01); }), base) << "same structure, same key";
  // A constant inside a node (MulBackward1's scalar).
  EXPECT_NE(key_of([](const at::Tensor& x) { return chain(x, 1.02); }), base);
  // A constant of another kind (AddBackward0's alpha).
  EXPECT_NE(key_of([](const at::Tensor& x) { return torch::sin(torch::add(x * 1.01, x, 2.0)) * torch::cos(x); }),
            key_of([](const at::Tensor& x) { return torch::sin(torch::add(x * 1.01, x, 3.0)) * torch::cos(x); }));
  // A new node.
  EXPECT_NE(key_of([](const at::Tensor& x) { return torch::exp(chain(x, 1.01)); }), base);
  // A hook on an intermediate.
  EXPECT_NE(key_of([](const at::Tensor& x) {
              at::Tensor y = chain(x, 1.01);
              y.register_hook([](const at::Tensor& g) { return g; });
              return y;
            }),
            base);
  // A dtype.
  EXPECT_NE(key_of([](const at::Tensor& x) { return chain(x.to(torch::kDouble), 1.01); }), base);
  // A shape: same key, different sizes (compared apart, Note [The backward key]).
  EXPECT_EQ(key_of([](const at::Tensor& x) { return chain(x, 1.01); }, 11), base);
}

TEST(BackwardWalk, ReusedWalkDescribesLikeAFreshOne) {
  const Forward small = [](const at::Tensor& x) { return chain(x, 1.01); };
  const Forward other = [](const at::Tensor& x) { return torch::exp(chain(x, 1.02)).pow(3); };
  tcap::ca::BackwardWalk reused;
  const std::pair<const Forward*, const Forward*> orders[] = {{&other, &small}, {&small, &other}, {&small, &small}};
  for (const auto& [before, f] : orders) {
    // The reused walk first describes another graph (for {other, small}: a longer key,
    // more sizes and tensors), then this one; a fresh walk describes this one alone.
    auto keep_before = walk(*before, 13, reused);
    auto keep = walk(*f, 5, reused);
    tcap::ca::BackwardWalk fresh;
    auto keep_fresh = walk(*f, 5, fresh);
    EXPECT_EQ(reused.key(), fresh.key());
    EXPECT_EQ(reused.key_size, fresh.key_size);
    EXPECT_EQ(reused.node_key_end, fresh.node_key_end);
    ASSERT_EQ(reused.sizes.size(), fresh.sizes.size());
    for (size_t i = 0; i < reused.sizes.size(); ++i) {
      EXPECT_EQ(reused.sizes[i].node, fresh.sizes[i].node) << i;
      EXPECT_EQ(reused.sizes[i].value, fresh.sizes[i].value) << i;
    }
    EXPECT_EQ(reused.nodes.size(), fresh.nodes.size());
    EXPECT_EQ(reused.names, fresh.names);
    EXPECT_EQ(reused.tensors.size(), fresh.tensors.size());
    EXPECT_EQ(reused.tensor_node, fresh.tensor_node);
    EXPECT_EQ(reused.accumulate, fresh.accumulate);
    EXPECT_EQ(reused.hooks.size(), fresh.hooks.size());
  }
}

TEST(BackwardWalk, ClearDropsEveryReference) {
  tcap::ca::BackwardWalk w;
  std::weak_ptr<torch::autograd::Node> node;
  {
    auto keep = walk([](const at::Tensor& x) { return chain(x, 1.01); }, 9, w);
    node = keep.grad_fn();
    ASSERT_FALSE(w.tensors.empty());
  }
  EXPECT_FALSE(node.expired()) << "the walk holds the graph until cleared";
  w.clear();
  EXPECT_TRUE(node.expired()) << "a cleared walk (the runtime's pool) must not keep the graph alive";
  EXPECT_TRUE(w.key().empty());
  EXPECT_TRUE(w.nodes.empty() && w.tensors.empty() && w.sizes.empty() && w.keep_alive.empty());
}

}  // namespace
