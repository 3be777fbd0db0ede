// The interpreter on graphs it cannot run: every error is a c10::Error that names the
// node (%id and op), never a crash; and the checked-in golden graphs replay against eager.
//
// Needs the compile definition TCAP_GOLDEN_DIR (test/CMakeLists.txt sets it).
#include <gtest/gtest.h>
#include <tcap/graph_json.h>
#include <tcap/interpreter.h>

#include "interp/hook_runner.h"
#include "ir/op_facts.h"

#include <torch/torch.h>

#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/contiguous_meta.h"

namespace tcap {
namespace {

using namespace tcap::ir;

using tcap::ir::testing::contiguous_meta;
TensorMeta meta(std::vector<int64_t> sizes, c10::ScalarType dtype = c10::kFloat) {
  return contiguous_meta(std::move(sizes), dtype);
}

// inputs (name, meta) -> op(args) -> one tensor result of `result`.
Graph one_call(std::vector<TensorMeta> inputs, const std::string& op, const std::string& overload,
               std::vector<Arg> args, TensorMeta result) {
  Graph g;
  for (size_t k = 0; k < inputs.size(); ++k) g.add_input(InputKind::UserInput, "in" + std::to_string(k), inputs[k]);
  Node n;
  n.kind = NodeKind::Call;
  n.op = op;
  n.overload = overload;
  n.args = std::move(args);
  const auto id = static_cast<NodeId>(g.nodes().size());
  const ValueId y = g.new_value(id, 0, -1, std::move(result));
  n.outputs = {Arg::value(y)};
  g.add_node(n);
  g.set_outputs({y}, {"y"}, {OutputKind::User});
  return g;
}

std::string run_error(const Graph& g, const std::vector<at::Tensor>& inputs) {
  try {
    interpret(g, inputs);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

#define EXPECT_RUN_FAILS(g, inputs, prefix, substring)                                                 \
  do {                                                                                                 \
    const std::string msg_ = run_error(g, inputs);                                                     \
    EXPECT_EQ(msg_.rfind(prefix, 0), 0u) << "expected a message starting with: " << (prefix)          \
                                         << "\n got: " << msg_;                                        \
    EXPECT_NE(msg_.find(substring), std::string::npos) << "expected: " << (substring) << "\n got: " << msg_; \
  } while (0)

// sum(x, dtype=-1) loaded, verified and segfaulted in at::empty_like. Now it does not
// verify, and the interpreter (which verifies what it is given) says why, by node.
TEST(Interpreter, IntWhereScalarTypeIsDeclaredIsAnErrorNotACrash) {
  const at::Tensor x = torch::randn({2, 3});
  for (int64_t bad : {int64_t{-1}, int64_t{65535}, std::numeric_limits<int64_t>::max()}) {
    const Graph g = one_call({meta({2, 3})}, "aten::sum", "", {Arg::value(0, "self"), Arg::integer(bad, "dtype")},
                             meta({}));
    EXPECT_RUN_FAILS(g, {x}, "tcap interpreter: the graph fails verify()",
                     "node 1 (call aten::sum) arg 1 (dtype) is " + std::to_string(bad) + ", not a valid dtype");
  }
  // ones_like(x, dtype=-1) and new_empty_strided(x, ..., dtype=255) crashed the same way.
  const Graph ones = one_call({meta({2, 3})}, "aten::ones_like", "",
                              {Arg::value(0, "self"), Arg::integer(-1, "dtype"), Arg::none("layout"),
                               Arg::none("device"), Arg::none("pin_memory"), Arg::none("memory_format")},
                              meta({2, 3}));
  EXPECT_RUN_FAILS(ones, {x}, "tcap interpreter: the graph fails verify()", "arg 1 (dtype) is -1");
  Arg size, stride;
  size.kind = stride.kind = ArgKind::IntList;
  size.ints = {2};
  stride.ints = {1};
  const Graph strided = one_call({meta({2, 3})}, "aten::new_empty_strided", "",
                                 {Arg::value(0, "self"), size, stride, Arg::integer(255, "dtype"), Arg::none("layout"),
                                  Arg::none("device"), Arg::none("pin_memory")},
                                 meta({2}));
  EXPECT_RUN_FAILS(strided, {x}, "tcap interpreter: the graph fails verify()", "arg 3 (dtype) is 255");
}

// The golden graph with a hook threw std::out_of_range naming no node at its declared
// shapes (its call_hook had no results list). It now has capture's shape, and replays.
TEST(Interpreter, GoldenBackwardWithHooksReplays) {
  const Graph g = load_json(std::string(TCAP_GOLDEN_DIR) + "/backward_with_hooks.json");
  const at::Tensor grad = torch::randn({6}, torch::kDouble), saved = torch::randn({6}, torch::kDouble);
  const auto outs = interpret(g, {grad, saved});
  ASSERT_EQ(outs.size(), 2u);
  const at::Tensor expected = grad * 2.0 * saved;  // hook body: doubles the gradient
  EXPECT_TRUE(torch::allclose(outs[0], expected.slice(0, 0, 3)));
  EXPECT_TRUE(torch::allclose(outs[1], expected.slice(0, 3, 6)));
}

// A graph whose layer norm backward gets a grad_out smaller than its input verified, and
// ATen's CPU kernel read past grad_out (found by tcap_fuzz_interp under ASan). The
// interpreter now checks the arguments of such kernels first (Note [Kernels that trust
// their arguments]).
TEST(Interpreter, LayerNormBackwardWithMismatchedGradIsAnError) {
  const Graph g =
      load_json(std::string(TCAP_GOLDEN_DIR) + "/../fuzz/corpus/regress_layer_norm_backward_grad_smaller_than_input.json");
  const std::vector<at::Tensor> in{torch::randn({2, 3}), torch::randn({3, 3}), torch::randn({3}), torch::randn({3})};
  EXPECT_RUN_FAILS(g, in, "tcap interpreter: node %5 (aten::native_layer_norm_backward): ",
                   "grad_out has sizes [2, 3] but input has [3, 3]");
}

TEST(Interpreter, GoldenMlpForwardReplays) {
  const Graph g = load_json(std::string(TCAP_GOLDEN_DIR) + "/mlp_forward.json");
  const at::Tensor x = torch::randn({4, 3}), w = torch::randn({5, 3}), b = torch::randn({5});
  const auto outs = interpret(g, {x, w, b});
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_TRUE(torch::allclose(outs[0], torch::relu(torch::addmm(b, x, w.t(), 1, 0.5)).sum(1)));
}

TEST(Interpreter, KernelErrorsNameTheNode) {
  const Graph g = one_call({meta({2, 3}), meta({4})}, "aten::mul", "Tensor",
                           {Arg::value(0, "self"), Arg::value(1, "other")}, meta({2, 3}));
  EXPECT_RUN_FAILS(g, (std::vector<at::Tensor>{torch::randn({2, 3}), torch::randn({4})}),
                   "tcap interpreter: node %2 (aten::mul.Tensor): ", "must match the size of tensor b");
}

TEST(Interpreter, InputErrorsNameTheInputNode) {
  Graph g = one_call({meta({2, 3})}, "aten::relu", "", {Arg::value(0, "self")}, meta({2, 3}));
  g.edit_node(0, [&](auto& n) { n.name = "x\x1b[2J"; });
  EXPECT_RUN_FAILS(g, {torch::randn({3})}, "tcap interpreter: node %0 (input 'x\\x1b[2J'): ",
                   "input 0 should be f32[2, 3] but is f32[3]");
  EXPECT_RUN_FAILS(g, {at::Tensor()}, "tcap interpreter: node %0 (input 'x\\x1b[2J'): ", "input 0 is undefined");
}

Graph opaque_hook_graph() {
  Graph g;
  const int hook = g.add_hook(HookKind::TensorPreHook, "MulBackward0", /*slot=*/0);
  const ValueId x = g.add_input(InputKind::Tangent, "grad", meta({3}));
  Node h;
  h.kind = NodeKind::CallHook;
  h.hook = hook;
  h.phase = Phase::Backward;
  h.args = {Arg::value_list({x}, true, "inputs")};
  const ValueId y = g.new_value(1, 0, 0, meta({3}));
  h.outputs = {Arg::value_list({y}, true)};
  g.add_node(h);
  g.set_outputs({y}, {"g"}, {OutputKind::Grad});
  return g;
}

TEST(Interpreter, HookErrorsNameTheNode) {
  const Graph g = opaque_hook_graph();
  const std::vector<at::Tensor> in{torch::randn({3})};
  EXPECT_RUN_FAILS(g, in, "tcap interpreter: node %1 (call_hook #0): ", "no hook runner is installed");
  const interp::HookRunner throws = [](int, const std::vector<at::Tensor>&, const std::vector<at::Tensor>&)
      -> std::vector<at::Tensor> { throw std::runtime_error("the hook failed"); };
  {
    interp::HookRunnerScope scope(&throws);
    EXPECT_RUN_FAILS(g, in, "tcap interpreter: node %1 (call_hook #0): ", "the hook failed");
  }
  const interp::HookRunner two = [](int, const std::vector<at::Tensor>& ins, const std::vector<at::Tensor>&) {
    return std::vector<at::Tensor>{ins[0], ins[0]};
  };
  interp::HookRunnerScope scope(&two);
  EXPECT_RUN_FAILS(g, in, "tcap interpreter: node %1 (call_hook #0): ", "the hook returned 2 gradients, 1 when captured");
}

// Arguments are built as the schema declares them.
TEST(Interpreter, ListArgumentsAreTypedBySchema) {
  const at::Tensor x = torch::randn({2, 3});
  // One int for sum.dim_IntList's int[1]? dim.
  const Graph sum = one_call({meta({2, 3})}, "aten::sum", "dim_IntList",
                             {Arg::value(0, "self"), Arg::integer(1, "dim"), Arg::boolean(false, "keepdim"),
                              Arg::none("dtype")},
                             meta({2}));
  EXPECT_TRUE(torch::allclose(interpret(sum, {x})[0], x.sum(1)));
  // Capture records an empty SymInt[] as an empty value list: view(x1, []) is a 0-dim view.
  const at::Tensor one = torch::randn({1});
  const Graph view = one_call({meta({1})}, "aten::view", "", {Arg::value(0, "self"), Arg::value_list({}, true, "size")},
                              meta({}));
  const at::Tensor v = interpret(view, {one})[0];
  EXPECT_EQ(v.dim(), 0);
  EXPECT_EQ(v.item<float>(), one.item<float>());
}

// Note [Sizes that come from values]: with check_host_values, the interpreter compares the
// sizes of nonzero's result with the recorded ones as soon as it has run and stops with
// HostValueChanged naming the node, before the op after it runs; a mask with as many
// entries set runs through; without the check the graph runs at any count.
TEST(Interpreter, SizesFromValuesAreCheckedWhenAsked) {
  Graph g;
  const ValueId m = g.add_input(InputKind::UserInput, "m", meta({5}, c10::kBool));
  Node nz;
  nz.kind = NodeKind::Call;
  nz.op = "aten::nonzero";
  nz.args = {Arg::value(m, "self")};
  const ValueId idx = g.new_value(static_cast<NodeId>(g.nodes().size()), 0, -1, meta({2, 1}, c10::kLong));
  nz.outputs = {Arg::value(idx)};
  g.add_node(nz);
  Node neg;
  neg.kind = NodeKind::Call;
  neg.op = "aten::neg";
  neg.args = {Arg::value(idx, "self")};
  const ValueId out = g.new_value(static_cast<NodeId>(g.nodes().size()), 0, -1, meta({2, 1}, c10::kLong));
  neg.outputs = {Arg::value(out)};
  g.add_node(neg);
  g.set_outputs({out}, {"y"}, {OutputKind::User});
  EXPECT_TRUE(sizes_from_values(g, g.node(1)));
  EXPECT_FALSE(sizes_from_values(g, g.node(2)));
  auto mask = [](std::vector<int64_t> v) { return torch::tensor(v).to(torch::kBool); };
  Interpreter checked(g);
  checked.check_host_values(true);
  const at::Tensor two = mask({0, 1, 0, 0, 1}), three = mask({1, 1, 1, 0, 0});
  EXPECT_TRUE(torch::equal(checked.run(std::vector<at::Tensor>{two})[0], -torch::nonzero(two)));
  try {
    checked.run(std::vector<at::Tensor>{three});
    FAIL() << "no HostValueChanged";
  } catch (const HostValueChanged& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("aten::nonzero (node %1)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 1] -> [3, 1]"), std::string::npos) << msg;
  }
  EXPECT_TRUE(torch::equal(interpret(g, std::vector<at::Tensor>{three})[0], -torch::nonzero(three)));
}

}  // namespace
}  // namespace tcap
