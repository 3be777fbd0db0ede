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

// Walks the graph of `loss` (kept alive by the caller) into `w`.
void walk_graph(const at::Tensor& loss, tcap::ca::BackwardWalk& w) {
  torch::autograd::edge_list roots{torch::autograd::impl::gradient_edge(loss)};
  auto root =
      std::make_shared<torch::autograd::GraphRoot>(roots, torch::autograd::variable_list{torch::ones_like(loss)});
  tcap::ca::walk_backward(root, {}, true, w);
}

// Sets whether walks describe generated nodes by their members, for one scope.
class DescribeByFields {
 public:
  explicit DescribeByFields(bool on) : prev_(tcap::ca::set_describe_generated_fields(on)) {}
  ~DescribeByFields() { tcap::ca::set_describe_generated_fields(prev_); }

 private:
  bool prev_;
};

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

TEST(BackwardWalk, KeyTellsApartMembersOfGeneratedNodes) {
  // Each pair differs in one member of a node the walk describes by its members (Note
  // [Generated nodes described from their fields]), one member type after another.
  const std::pair<Forward, Forward> pairs[] = {
      // int64_t (SoftmaxBackward0::dim)
      {[](const at::Tensor& x) { return torch::softmax(x.view({-1, 1}).expand({-1, 3}) * x.view({-1, 1}), 0); },
       [](const at::Tensor& x) { return torch::softmax(x.view({-1, 1}).expand({-1, 3}) * x.view({-1, 1}), 1); }},
      // at::Scalar of two kinds (PowBackward0::exponent: Long 2 against Double 2.0)
      {[](const at::Tensor& x) { return torch::pow(x, 2); }, [](const at::Tensor& x) { return torch::pow(x, 2.0); }},
      // at::Scalar value
      {[](const at::Tensor& x) { return torch::pow(x, 2.0); }, [](const at::Tensor& x) { return torch::pow(x, 3.0); }},
      // std::optional<at::Scalar> (ClampBackward1::min)
      {[](const at::Tensor& x) { return torch::clamp(x, 0.0, 1.0); },
       [](const at::Tensor& x) { return torch::clamp(x, 0.5, 1.0); }},
      {[](const at::Tensor& x) { return torch::clamp(x, 0.0, 1.0); },
       [](const at::Tensor& x) { return torch::clamp(x, c10::nullopt, 1.0); }},
      // std::string (GeluBackward0::approximate)
      {[](const at::Tensor& x) { return torch::gelu(x, "none"); },
       [](const at::Tensor& x) { return torch::gelu(x, "tanh"); }},
      // bool and c10::OptionalArray<int64_t> (SumBackward1::keepdim, ::dim)
      {[](const at::Tensor& x) { return x.view({-1, 1}).expand({-1, 2}).sum(0, true) * 2; },
       [](const at::Tensor& x) { return x.view({-1, 1}).expand({-1, 2}).sum(0, false) * 2; }},
      {[](const at::Tensor& x) { return x.view({-1, 1}).expand({-1, 2}).sum(0, true) * 2; },
       [](const at::Tensor& x) { return x.view({-1, 1}).expand({-1, 2}).sum(1, true) * 2; }},
      // at::ScalarType (MulBackward0::other_scalar_type)
      {[](const at::Tensor& x) { return x * x.detach(); },
       [](const at::Tensor& x) { return x * x.detach().to(torch::kDouble); }},
      // std::vector<int64_t> (PermuteBackward0::dims)
      {[](const at::Tensor& x) { return x.view({1, -1, 1}).expand({2, -1, 2}).permute({0, 2, 1}) * 3; },
       [](const at::Tensor& x) { return x.view({1, -1, 1}).expand({2, -1, 2}).permute({2, 0, 1}) * 3; }},
      // two saved tensors that are one tensor, against two tensors (MulBackward0)
      {[](const at::Tensor& x) { return x * x; }, [](const at::Tensor& x) { return x * (x + 0); }},
      // at::TensorOptions (ToCopyBackward0::self_options)
      {[](const at::Tensor& x) { return x.to(torch::kDouble); },
       [](const at::Tensor& x) { return x.to(torch::kDouble).to(torch::kFloat).to(torch::kDouble); }},
      {[](const at::Tensor& x) { return x.to(torch::kDouble) * 2; }, [](const at::Tensor& x) { return x.to(torch::kHalf) * 2; }},
      // size_t and std::vector<at::ScalarType> (StackBackward0: two tensors against three)
      {[](const at::Tensor& x) { return torch::stack({x, x * 2}); },
       [](const at::Tensor& x) { return torch::stack({x, x * 2, x * 3}).narrow(0, 0, 2); }},
      // std::vector<std::vector<c10::SymInt>> sizes are sizes, compared apart; the dim is a
      // byte (CatBackward0::dim)
      {[](const at::Tensor& x) { return torch::cat({x.view({1, -1}), x.view({1, -1})}, 0); },
       [](const at::Tensor& x) { return torch::cat({x.view({1, -1}), x.view({1, -1})}, 1).view({2, -1}); }},
  };
  for (size_t i = 0; i < std::size(pairs); ++i) {
    EXPECT_EQ(key_of(pairs[i].first), key_of(pairs[i].first)) << "pair " << i;
    EXPECT_NE(key_of(pairs[i].first), key_of(pairs[i].second)) << "pair " << i;
  }
}

// A generated node described by its members gives the backward the same tensors and the
// same sizes, in the same order, as its compiled_args does.
TEST(BackwardWalk, GeneratedNodesByMembersMatchCompiledArgs) {
  const Forward forwards[] = {
      [](const at::Tensor& x) { return torch::exp(torch::tanh(torch::sin(x) * torch::cos(x))).pow(3); },
      [](const at::Tensor& x) { return torch::sigmoid(x) * torch::relu(x) / (x.abs() + 1).sqrt() - torch::log1p(x * x); },
      [](const at::Tensor& x) { return torch::add(x * x, x, 2.5).sub(x, 0.5); },
      [](const at::Tensor& x) {
        at::Tensor m = x.view({1, -1}).expand({3, -1}) * torch::arange(3, x.options()).view({3, 1});
        at::Tensor w = x.view({-1, 1}).expand({-1, 4}).contiguous();
        return torch::addmm(torch::mm(m, w), m, w.t().t(), 0.5, 2.0).t().reshape({-1}).softmax(0);
      },
      [](const at::Tensor& x) {
        at::Tensor m = x.view({-1, 1}).expand({-1, 6}) * torch::linspace(-1, 1, 6, x.options());
        at::Tensor ln = torch::layer_norm(m, {6}, torch::ones({6}, x.options()) * x.sum(), torch::zeros({6}));
        return torch::gelu(ln, "tanh").log_softmax(1).select(1, 2).unsqueeze(0).squeeze() *
               torch::clamp(x, -0.5, 0.5) * torch::where(x > 0, x, x * 2) + torch::maximum(x, x.flip(0));
      },
      [](const at::Tensor& x) { return x.narrow(0, 1, 3).unsqueeze(1).expand({3, 2}).transpose(0, 1).mean(1); },
      // Lists of saved tensors, TensorOptions, TypeAndSize, TensorGeometry, nested lists.
      [](const at::Tensor& x) {
        auto parts = (x * 2).split(3);
        at::Tensor idx = torch::tensor({0, 2, 2}, torch::kLong);
        at::Tensor y = torch::cat({parts[0], x.to(torch::kDouble).to(torch::kFloat)}, 0);
        at::Tensor z = torch::stack({x.index({idx}), x.flip(0).narrow(0, 0, 3)}, 1).sum(1);
        at::Tensor w = x.as_strided({2, 2}, {1, 2}, 1).reshape({-1});
        return torch::cat({y, z, w, torch::index_put(x, {idx}, x.narrow(0, 0, 3) * 3)}, 0);
      },
  };
  for (size_t i = 0; i < std::size(forwards); ++i) {
    auto x = torch::randn({7}, torch::requires_grad());
    at::Tensor loss = forwards[i](x).sum();
    tcap::ca::BackwardWalk by_members, by_compiled_args;
    {
      DescribeByFields on(true);
      walk_graph(loss, by_members);
    }
    {
      DescribeByFields off(false);
      walk_graph(loss, by_compiled_args);
    }
    ASSERT_TRUE(by_members.why_not.empty()) << by_members.why_not;
    ASSERT_TRUE(by_compiled_args.why_not.empty()) << by_compiled_args.why_not;
    EXPECT_NE(by_members.key(), by_compiled_args.key()) << "forward " << i << ": no node was described by its members";
    EXPECT_EQ(by_members.names, by_compiled_args.names);
    ASSERT_EQ(by_members.tensors.size(), by_compiled_args.tensors.size()) << "forward " << i;
    for (size_t k = 0; k < by_members.tensors.size(); ++k) {
      if (by_members.tensor_node[k] == 0) continue;  // the root gradient: one per walk_graph
      const at::Tensor& a = by_members.tensors[k];
      const at::Tensor& b = by_compiled_args.tensors[k];
      // The same tensor: a saved output unpacks into a new TensorImpl each time.
      ASSERT_TRUE(a.defined() && b.defined()) << "forward " << i << " tensor " << k;
      EXPECT_EQ(a.data_ptr(), b.data_ptr()) << "forward " << i << " tensor " << k;
      EXPECT_EQ(a.sizes(), b.sizes()) << "forward " << i << " tensor " << k;
      EXPECT_EQ(a.strides(), b.strides()) << "forward " << i << " tensor " << k;
      EXPECT_EQ(a.scalar_type(), b.scalar_type()) << "forward " << i << " tensor " << k;
    }
    EXPECT_EQ(by_members.tensor_node, by_compiled_args.tensor_node) << "forward " << i;
    ASSERT_EQ(by_members.sizes.size(), by_compiled_args.sizes.size()) << "forward " << i;
    for (size_t k = 0; k < by_members.sizes.size(); ++k) {
      EXPECT_EQ(by_members.sizes[k].node, by_compiled_args.sizes[k].node) << "forward " << i << " size " << k;
      EXPECT_EQ(by_members.sizes[k].value, by_compiled_args.sizes[k].value) << "forward " << i << " size " << k;
    }
  }
}

TEST(BackwardWalk, ReleasedSavedTensorsSayWhy) {
  // After a backward without retain_graph the saved tensors are gone: the walk says so
  // (the engine then raises its own error), by members and by compiled_args alike.
  for (bool by_members : {true, false}) {
    DescribeByFields mode(by_members);
    auto x = torch::randn({5}, torch::requires_grad());
    at::Tensor loss = torch::sin(x).sum();
    loss.backward();
    tcap::ca::BackwardWalk w;
    walk_graph(loss, w);
    EXPECT_NE(w.why_not.find("SinBackward0"), std::string::npos) << w.why_not;
    EXPECT_NE(w.why_not.find("second time"), std::string::npos) << w.why_not;
  }
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
