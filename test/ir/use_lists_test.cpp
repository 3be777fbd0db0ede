// The graph's use lists (Note [Use lists], include/tcap/graph.h): after any sequence of
// edits through the graph, users(v) is what a scan of the nodes finds.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <tcap/capture.h>
#include <tcap/graph.h>

#include <torch/torch.h>

#include <algorithm>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/contiguous_meta.h"

namespace tcap::ir {
namespace {

using tcap::ir::testing::meta;

// What users(v) must be: every node reading v, in order, once.
std::vector<NodeId> scan_users(const Graph& g, ValueId v) {
  std::vector<NodeId> out;
  for (const Node& n : g.nodes()) {
    bool reads = false;
    for_each_value(n.args, [&](ValueId u) { reads = reads || u == v; });
    if (reads) out.push_back(n.id);
  }
  return out;
}

void expect_lists_true(const Graph& g, const std::string& when) {
  for (const Value& v : g.values()) {
    const auto users = g.users(v.id);
    EXPECT_EQ(std::vector<NodeId>(users.begin(), users.end()), scan_users(g, v.id)) << when << ": %" << v.id;
  }
}

// A node reading `args` and making one value.
ValueId call(Graph& g, std::vector<Arg> args) {
  Node n;
  n.kind = NodeKind::Call;
  n.op = "aten::add";
  n.overload = "Tensor";
  n.args = std::move(args);
  const ValueId out = g.new_value(static_cast<NodeId>(g.nodes().size()), 0, -1, meta({2}));
  n.outputs = {Arg::value(out)};
  g.add_node(std::move(n));
  return out;
}

// Random graphs (single values, repeated reads, lists with holes, constants), then random
// edits of every kind the graph offers; the lists are checked after each.
TEST(UseLists, MatchAScanAfterRandomEdits) {
  std::mt19937 rng(20261129);
  for (int round = 0; round < 40; ++round) {
    Graph g;
    std::vector<ValueId> vals;
    for (int k = 0; k < 3; ++k) vals.push_back(g.add_input(InputKind::UserInput, "x" + std::to_string(k), meta({2})));
    auto pick = [&] { return vals[std::uniform_int_distribution<size_t>(0, vals.size() - 1)(rng)]; };
    auto random_args = [&] {
      std::vector<Arg> args;
      const int n = std::uniform_int_distribution<int>(0, 4)(rng);
      for (int a = 0; a < n; ++a) {
        switch (std::uniform_int_distribution<int>(0, 3)(rng)) {
          case 0: args.push_back(Arg::value(pick())); break;
          case 1: args.push_back(Arg::value_list({pick(), pick(), kNoValue}, true)); break;
          case 2: {
            const ValueId v = pick();
            args.push_back(Arg::value_list({v, v}, false));  // one node reading a value twice
            break;
          }
          default: args.push_back(Arg::integer(a)); break;
        }
      }
      return args;
    };
    for (int k = 0; k < 60; ++k) vals.push_back(call(g, random_args()));
    g.set_outputs({vals.back(), vals[5]}, {"a", "b"}, {OutputKind::User, OutputKind::User});
    expect_lists_true(g, "built");
    for (int e = 0; e < 30; ++e) {
      const auto node = std::uniform_int_distribution<NodeId>(3, static_cast<NodeId>(g.nodes().size()) - 2)(rng);
      switch (std::uniform_int_distribution<int>(0, 4)(rng)) {
        case 0: {
          // Any argument of a node changed (only earlier values, so the graph stays ordered).
          std::vector<Arg> args;
          for (Arg& a : random_args()) {
            for (auto& v : a.values) {
              if (v != kNoValue && g.value(v).producer >= node) v = 0;
            }
            args.push_back(std::move(a));
          }
          g.edit_node(node, [&](Node& n) { n.args = std::move(args); });
          break;
        }
        case 1: {
          const ValueId from = g.node(node).outputs[0].values[0];
          g.replace_all_uses_with(from, pick() < from ? 1 : 2);
          break;
        }
        case 2: {
          std::unordered_map<ValueId, ValueId> renames;
          for (int r = 0; r < 4; ++r) {
            const ValueId a = pick();
            if (a > 3) renames[a] = a - 1;  // a chain when neighbours are both picked
          }
          g.replace_uses(renames);
          break;
        }
        case 3:
          g.set_outputs({pick(), pick()}, {"a", "b"}, {OutputKind::User, OutputKind::User});
          break;
        default: {
          const Node& n = g.node(node);
          for (size_t i = 0; i < n.args.size(); ++i) {
            if (n.args[i].kind == ArgKind::Int) g.edit_constant(node, i, [](Arg& a) { a.i += 1; });
          }
        }
      }
      expect_lists_true(g, "edit " + std::to_string(e) + " of round " + std::to_string(round));
    }
    const Graph copy = g;  // a copy carries its lists
    expect_lists_true(copy, "copy");
    EXPECT_EQ(copy, g);
  }
}

TEST(UseLists, ReplaceUsesResolvesChainsAndRefusesCycles) {
  Graph g;
  const ValueId x = g.add_input(InputKind::UserInput, "x", meta({2}));
  const ValueId a = call(g, {Arg::value(x)});
  const ValueId b = call(g, {Arg::value(a)});
  const ValueId c = call(g, {Arg::value(b), Arg::value(a)});
  g.set_outputs({c}, {"c"}, {OutputKind::User});
  Graph h = g;
  h.replace_uses({{b, a}, {a, x}});  // b -> a -> x: c reads x twice
  EXPECT_EQ(h.node(g.value(c).producer).args[0].values[0], x);
  EXPECT_EQ(h.node(g.value(c).producer).args[1].values[0], x);
  EXPECT_TRUE(h.users(a).empty());
  EXPECT_TRUE(h.users(b).empty());
  EXPECT_EQ(h.users(x).size(), 3u);  // a's node, b's node (now reading x) and c's node
  expect_lists_true(h, "chain");
  // A value renamed to itself is left alone; a cycle is an error that names a value.
  Graph same = g;
  same.replace_uses({{a, a}});
  EXPECT_EQ(same, g);
  Graph cyclic = g;
  try {
    cyclic.replace_uses({{a, b}, {b, a}});
    FAIL() << "a cycle of renames was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("cycle"), std::string::npos) << e.what();
  }
}

TEST(UseLists, EditConstantRefusesValueArguments) {
  Graph g;
  const ValueId x = g.add_input(InputKind::UserInput, "x", meta({2}));
  const ValueId y = call(g, {Arg::value(x), Arg::real(1.5)});
  g.set_outputs({y}, {"y"}, {OutputKind::User});
  g.edit_constant(1, 1, [](Arg& a) { a.d = 2.5; });
  EXPECT_EQ(g.node(1).args[1].d, 2.5);
  EXPECT_THROW(g.edit_constant(1, 0, [](Arg& a) { a.i = 7; }), c10::Error);
  // Turning a constant into a value reference is refused too (the lists would be wrong).
  EXPECT_THROW(g.edit_constant(1, 1, [x](Arg& a) { a = Arg::value(x); }), c10::Error);
  expect_lists_true(g, "after refused edits");
}

// The recorder fills its nodes through edit_node: a captured graph's lists are true.
TEST(UseLists, CapturedGraph) {
  at::Tensor x = torch::randn({3, 4}, torch::requires_grad());
  at::Tensor w = torch::randn({4, 4}, torch::requires_grad());
  CaptureGuard guard;
  guard.input(x, "x");
  guard.input(w, "w");
  at::Tensor h = torch::tanh(torch::mm(x, w));
  at::Tensor loss = (h * h + h).sum();
  loss.backward();
  guard.output(loss, "loss");
  guard.stop();
  const Graph g = guard.graph();
  ASSERT_GT(g.nodes().size(), 10u);
  expect_lists_true(g, "captured");
}

}  // namespace
}  // namespace tcap::ir
