// Capture of small hand-written programs: forward, backward, hooks, replay by the interpreter.
#include <tcap/capture.h>
#include <tcap/graph_json.h>
#include <tcap/interpreter.h>

#include "support/compare.h"

#include <torch/torch.h>

#include <optional>

using tcap::testing::close;
using tcap::testing::dump;
namespace ir = tcap::ir;

namespace {

int count_op(const ir::Graph& g, const std::string& qualified, ir::Phase phase) {
  int n = 0;
  for (const auto& node : g.nodes()) {
    if (node.kind == ir::NodeKind::Call && node.qualified_op() == qualified && node.phase == phase) ++n;
  }
  return n;
}

int count_kind(const ir::Graph& g, ir::NodeKind kind) {
  int n = 0;
  for (const auto& node : g.nodes()) n += node.kind == kind;
  return n;
}

}  // namespace

TEST(Capture, RecordsForwardOpsAndReplays) {
  torch::manual_seed(0);
  auto a = torch::randn({5, 7}), b = torch::randn({5, 7}), c = torch::randn({7});
  tcap::CaptureGuard cap;
  cap.input(a, "a");
  cap.input(b, "b");
  cap.input(c, "c");
  auto y = torch::cos(torch::cos(a + b + c));
  cap.output(y, "y");
  cap.stop();
  const auto& g = cap.graph();
  ir::verify(g);
  EXPECT_EQ(count_op(g, "aten::add.Tensor", ir::Phase::Forward), 2) << dump(g);
  EXPECT_EQ(count_op(g, "aten::cos", ir::Phase::Forward), 2) << dump(g);
  EXPECT_EQ(g.input_nodes().size(), 3u);
  auto a2 = torch::randn({5, 7}), b2 = torch::randn({5, 7}), c2 = torch::randn({7});
  auto out = tcap::interpret(g, {a2, b2, c2});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(close(out[0], torch::cos(torch::cos(a2 + b2 + c2)))) << dump(g);
}

// The recorder defers each call node's operator, arguments and results until the graph
// is read (Note [Deferred call nodes]). A read in the middle of a capture must see every
// node whole, later reads must agree with it, and every compact argument form (int and
// tensor lists, optional-tensor lists, strings, dtypes, scalars) must come back as it was.
TEST(Capture, ReadingTheGraphMidCaptureLosesNothing) {
  torch::manual_seed(0);
  auto program = [](const at::Tensor& a, const at::Tensor& idx, tcap::CaptureGuard* cap,
                    std::optional<ir::Graph>* first) {
    auto b = a.view({6, 4}).sum({0}, /*keepdim=*/true);  // int[], bool
    auto c = torch::cat({a, a * 2}, 1);                  // Tensor[], Scalar
    if (cap) *first = cap->graph();
    auto d = torch::div(c, 3, "floor");                  // str
    auto e = c.index({idx});                             // Tensor?[]
    auto f = e.to(torch::kDouble).sum(torch::kFloat);    // ScalarType
    return f + b.sum() + d.sum();
  };
  auto a = torch::randn({4, 6}, torch::requires_grad());
  auto idx = torch::tensor({2, 0}, torch::kLong);
  tcap::CaptureGuard cap;
  cap.input(a, "a");
  cap.input(idx, "idx");
  std::optional<ir::Graph> first;
  auto loss = program(a, idx, &cap, &first);
  loss.backward();
  cap.output(loss, "loss");
  cap.stop();
  const ir::Graph g = cap.graph();
  ir::verify(g);
  ASSERT_TRUE(first.has_value());
  ir::verify(*first);
  // The first read's nodes (all but its Output node) begin the final graph, unchanged.
  ASSERT_LT(first->nodes().size(), g.nodes().size());
  for (size_t k = 0; k + 1 < first->nodes().size(); ++k) {
    EXPECT_TRUE(first->nodes()[k] == g.nodes()[k]) << "node " << k << "\n" << dump(g);
  }
  for (const auto& n : g.nodes()) {
    if (n.kind != ir::NodeKind::Call) continue;
    EXPECT_FALSE(n.op.empty()) << "node " << n.id;
    // Backward ops name the autograd node they ran in; backward()'s seed ran in none.
    if (n.phase == ir::Phase::Backward && n.op != "aten::ones_like") {
      EXPECT_FALSE(n.autograd_node.empty()) << "node " << n.id << " " << n.op;
    }
  }
  auto find = [&](const std::string& qualified) -> const ir::Node* {
    for (const auto& n : g.nodes()) {
      if (n.kind == ir::NodeKind::Call && n.qualified_op() == qualified) return &n;
    }
    return nullptr;
  };
  const ir::Node* sum = find("aten::sum.dim_IntList");
  ASSERT_NE(sum, nullptr) << dump(g);
  EXPECT_EQ(sum->args[1].kind, ir::ArgKind::IntList);
  EXPECT_EQ(sum->args[1].ints, std::vector<int64_t>{0});
  EXPECT_EQ(sum->args[1].name, "dim");
  EXPECT_EQ(sum->args[2].kind, ir::ArgKind::Bool);
  EXPECT_EQ(sum->args[2].i, 1);
  const ir::Node* cat = find("aten::cat");
  ASSERT_NE(cat, nullptr) << dump(g);
  EXPECT_EQ(cat->args[0].kind, ir::ArgKind::ValueList);
  EXPECT_EQ(cat->args[0].values.size(), 2u);
  const ir::Node* div = find("aten::div.Scalar_mode");
  ASSERT_NE(div, nullptr) << dump(g);
  EXPECT_EQ(div->args[2].kind, ir::ArgKind::String);
  EXPECT_EQ(div->args[2].s, "floor");
  const ir::Node* index = find("aten::index.Tensor");
  ASSERT_NE(index, nullptr) << dump(g);
  EXPECT_EQ(index->args[1].kind, ir::ArgKind::OptValueList);
  const ir::Node* to_sum = find("aten::sum");
  ASSERT_NE(to_sum, nullptr) << dump(g);
  EXPECT_EQ(to_sum->args[1].kind, ir::ArgKind::ScalarType);
  EXPECT_EQ(to_sum->args[1].i, static_cast<int64_t>(at::kFloat));
  // Through JSON and back, then replayed on fresh inputs: eager's loss and gradient.
  const ir::Graph back = ir::from_json_string(ir::to_json_string(g));
  EXPECT_TRUE(back == g);
  auto a2 = torch::randn({4, 6}, torch::requires_grad());
  auto out = tcap::interpret(back, {a2, idx});
  auto expected = program(a2, idx, nullptr, nullptr);
  expected.backward();
  ASSERT_EQ(out.size(), 2u) << dump(g);  // loss, grad(a)
  EXPECT_TRUE(close(out[0], expected)) << dump(g);
  EXPECT_TRUE(close(out[1], a2.grad())) << dump(g);
}

TEST(Capture, OffWhenGuardGone) {
  auto a = torch::randn({3});
  {
    tcap::CaptureGuard cap;
    auto y = a * 2;
    EXPECT_EQ(cap.graph().num_calls(), 1u) << dump(cap.graph());
  }
  // A new guard sees only its own ops.
  tcap::CaptureGuard cap2;
  auto z = a + 1;
  EXPECT_EQ(cap2.graph().num_calls(), 1u) << dump(cap2.graph());
}

TEST(Capture, BackwardIsRecordedAndMarked) {
  torch::manual_seed(1);
  auto w = torch::randn({4, 3}, torch::requires_grad());
  auto x = torch::randn({2, 4});
  tcap::CaptureGuard cap;
  cap.input(x, "x");
  auto loss = torch::tanh(torch::mm(x, w)).sum();
  cap.output(loss, "loss");
  loss.backward();
  cap.stop();
  const auto& g = cap.graph();
  ir::verify(g);
  int fw = 0, bw = 0;
  for (const auto& n : g.nodes()) {
    if (n.kind != ir::NodeKind::Call) continue;
    (n.phase == ir::Phase::Forward ? fw : bw)++;
  }
  EXPECT_GE(fw, 3) << dump(g);
  EXPECT_GE(bw, 3) << dump(g);
  EXPECT_EQ(count_op(g, "aten::tanh_backward", ir::Phase::Backward), 1) << dump(g);
  // The parameter's gradient is an output.
  const ir::Node* out = g.output_node();
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(out->output_names.size(), 2u) << dump(g);
  EXPECT_EQ(out->output_kinds[1], ir::OutputKind::Grad);
  // Replay on fresh inputs gives eager's loss and gradient.
  auto x2 = torch::randn({2, 4});
  auto w2 = torch::randn({4, 3});
  auto res = tcap::interpret(g, {x2, w2});
  auto w2e = w2.clone().requires_grad_();
  auto loss_e = torch::tanh(torch::mm(x2, w2e)).sum();
  loss_e.backward();
  EXPECT_TRUE(close(res[0], loss_e));
  EXPECT_TRUE(close(res[1], w2e.grad())) << dump(g);
}

namespace {

// A custom Function whose backward warns: the engine gathers warnings raised while it
// runs nodes and replays them to the caller of backward() when it returns.
struct WarnInBackward : torch::autograd::Function<WarnInBackward> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) { return x * 2; }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list g) {
    TORCH_WARN("tcap test: a warning from backward");
    return {g[0] * 2};
  }
};

struct CollectWarnings : c10::WarningHandler {
  std::vector<std::string> messages;
  void process(const c10::Warning& w) override { messages.push_back(w.msg()); }
};

}  // namespace

// tcap's forwarding engine (Note [Intercepting backward()]) must keep this behaviour.
TEST(Capture, BackwardWarningsReachTheCaller) {
  for (bool capture : {false, true}) {
    CollectWarnings handler;
    c10::WarningUtils::WarningHandlerGuard use(&handler);
    auto x = torch::randn({5}, torch::requires_grad());
    std::optional<tcap::CaptureGuard> cap;
    if (capture) cap.emplace();
    WarnInBackward::apply(x).sum().backward();
    if (cap) {
      cap->stop();
      const ir::Graph g = cap->graph();
      int backward_calls = 0;
      for (const auto& n : g.nodes()) backward_calls += n.kind == ir::NodeKind::Call && n.phase == ir::Phase::Backward;
      EXPECT_GT(backward_calls, 0) << dump(g);
    }
    EXPECT_TRUE(torch::allclose(x.grad(), torch::full({5}, 2.0))) << "capture " << capture;
    int ours = 0;
    for (const auto& m : handler.messages) ours += m.find("a warning from backward") != std::string::npos;
    EXPECT_EQ(ours, 1) << "capture " << capture;
  }
}

TEST(Capture, HooksBecomeCallHookNodes) {
  torch::manual_seed(2);
  auto w = torch::randn({3, 3}, torch::requires_grad());
  auto x = torch::randn({3, 3});
  int calls = 0;
  tcap::CaptureGuard cap;
  cap.input(x, "x");
  auto h = torch::mm(x, w);
  h.register_hook([&](const at::Tensor& g) {
    ++calls;
    return g * 3;
  });
  w.register_hook([&](const at::Tensor& g) {
    ++calls;
    return g + 10;
  });
  auto loss = (h.sigmoid() + h).sum();  // two gradient paths into h, summed
  cap.output(loss, "loss");
  loss.backward();
  cap.stop();
  EXPECT_EQ(calls, 2);
  const auto& g = cap.graph();
  ir::verify(g);
  EXPECT_EQ(count_kind(g, ir::NodeKind::CallHook), 2) << dump(g);
  EXPECT_EQ(g.hooks().size(), 2u);
  // Each hook's body (g * 3, g + 10) is recorded as backward ops tagged with its hook id,
  // and the InputBuffer sum of the two gradient paths into h is an add in the backward.
  std::vector<std::string> body[2];
  for (const auto& n : g.nodes()) {
    if (n.kind == ir::NodeKind::Call && n.hook >= 0) body[n.hook].push_back(n.qualified_op());
  }
  EXPECT_EQ(body[0], std::vector<std::string>{"aten::mul.Scalar"}) << dump(g);
  EXPECT_EQ(body[1], std::vector<std::string>{"aten::add.Scalar"}) << dump(g);
  EXPECT_GE(count_op(g, "aten::add.Tensor", ir::Phase::Backward), 1) << dump(g);
  auto x2 = torch::randn({3, 3});
  auto w2 = torch::randn({3, 3});
  auto res = tcap::interpret(g, {x2, w2});
  auto w2e = w2.clone().requires_grad_();
  auto h2 = torch::mm(x2, w2e);
  h2.register_hook([](const at::Tensor& g) { return g * 3; });
  w2e.register_hook([](const at::Tensor& g) { return g + 10; });
  (h2.sigmoid() + h2).sum().backward();
  EXPECT_TRUE(close(res.back(), w2e.grad())) << dump(g);
  EXPECT_EQ(calls, 2) << "replay runs the recorded hook bodies, not the hooks";
}
