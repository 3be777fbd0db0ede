// Tests of the IR printers (to_string, to_table, to_dot), verify() and the dtype /
// enum names. The golden printout below is the documented format of printer.cpp:
// change both together.
#include <tcap/graph.h>

#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace tcap::ir {
namespace {

TensorMeta meta(c10::ScalarType dtype, std::vector<int64_t> sizes, bool requires_grad = false,
                std::vector<int64_t> strides = {}) {
  TensorMeta m;
  m.dtype = dtype;
  m.sizes = std::move(sizes);
  if (strides.empty()) {
    strides.assign(m.sizes.size(), 1);
    for (size_t k = m.sizes.size(); k-- > 1;) strides[k - 1] = strides[k] * m.sizes[k];
  }
  m.strides = std::move(strides);
  m.requires_grad = requires_grad;
  return m;
}

constexpr auto kF32 = c10::ScalarType::Float;

Arg wrapped(double d) {
  Arg a;
  a.kind = ArgKind::WrappedScalar;
  a.d = d;
  a.i2 = static_cast<int64_t>(c10::ScalarType::Double);
  a.name = "other";
  return a;
}

Arg typed(ArgKind kind, std::string name) {
  Arg a;
  a.kind = kind;
  a.name = std::move(name);
  return a;
}

// Appends nodes with fresh result values; every op gets a (fake) schema so that
// verify() checks schema presence.
struct Builder {
  Graph g;

  // One Value result per entry of `results`.
  std::vector<ValueId> call(const std::string& op, const std::string& overload,
                            std::vector<Arg> args, std::vector<TensorMeta> results,
                            Phase phase = Phase::Forward, std::string autograd_node = {}) {
    Node n = make(op, overload, std::move(args), phase, std::move(autograd_node));
    std::vector<ValueId> out;
    for (size_t k = 0; k < results.size(); ++k) {
      out.push_back(g.new_value(next_id(), static_cast<int>(k), -1, results[k]));
      n.outputs.push_back(Arg::value(out.back()));
    }
    g.add_node(std::move(n));
    return out;
  }
  ValueId call1(const std::string& op, const std::string& overload, std::vector<Arg> args,
                TensorMeta result, Phase phase = Phase::Forward, std::string autograd_node = {}) {
    return call(op, overload, std::move(args), {std::move(result)}, phase,
                std::move(autograd_node))[0];
  }
  // One Tensor[] result.
  std::vector<ValueId> call_list(const std::string& op, const std::string& overload,
                                 std::vector<Arg> args, std::vector<TensorMeta> results) {
    Node n = make(op, overload, std::move(args), Phase::Forward, {});
    std::vector<ValueId> out;
    for (size_t k = 0; k < results.size(); ++k) {
      out.push_back(g.new_value(next_id(), 0, static_cast<int>(k), results[k]));
    }
    n.outputs.push_back(Arg::value_list(out, false));
    g.add_node(std::move(n));
    return out;
  }
  ValueId call_hook(int hook, std::vector<ValueId> inputs, std::vector<ValueId> results,
                    TensorMeta m) {
    Node n;
    n.kind = NodeKind::CallHook;
    n.hook = hook;
    n.phase = Phase::Backward;
    n.grad_mode = false;
    n.args = {Arg::value_list(std::move(inputs), false), Arg::value_list(std::move(results), false)};
    const ValueId v = g.new_value(next_id(), 0, -1, std::move(m));
    n.outputs.push_back(Arg::value(v));
    g.add_node(std::move(n));
    return v;
  }

 private:
  NodeId next_id() const { return static_cast<NodeId>(g.nodes().size()); }
  Node make(const std::string& op, const std::string& overload, std::vector<Arg> args, Phase phase,
            std::string autograd_node) {
    Node n;
    n.kind = NodeKind::Call;
    n.op = op;
    n.overload = overload;
    n.args = std::move(args);
    n.phase = phase;
    n.grad_mode = phase == Phase::Forward;
    n.autograd_node = std::move(autograd_node);
    g.schemas()[n.qualified_op()] = op + "(...) -> ...";
    return n;
  }
};

// A small training-step-like graph covering every printed construct: input kinds,
// a view, a call with scalar args, a tuple result, a Tensor[] result, an in-place
// write under no_grad, constants of many kinds, a mid-graph tangent input, backward
// nodes, a hook body and its call_hook node, and the output node.
Graph sample_graph() {
  Builder b;
  Graph& g = b.g;
  const ValueId x = g.add_input(InputKind::UserInput, "x", meta(kF32, {4, 10}));
  const ValueId w = g.add_input(InputKind::Parameter, "fc1.weight", meta(kF32, {5, 10}, true));
  const ValueId bias = g.add_input(InputKind::Parameter, "fc1.bias", meta(kF32, {5}, true));
  const ValueId rm = g.add_input(InputKind::Buffer, "running_mean", meta(kF32, {5}));
  const ValueId wt = b.call1("aten::t", "", {Arg::value(w, "self")},
                             meta(kF32, {10, 5}, true, {1, 10}));
  g.value(wt).view_of = w;
  const ValueId h = b.call1("aten::addmm", "",
                            {Arg::value(bias, "self"), Arg::value(x, "mat1"), Arg::value(wt, "mat2"),
                             Arg::integer(1, "beta"), Arg::integer(1, "alpha")},
                            meta(kF32, {4, 5}, true));
  const auto mx = b.call("aten::max", "dim",
                         {Arg::value(h, "self"), Arg::integer(1, "dim"), Arg::boolean(false, "keepdim")},
                         {meta(kF32, {4}, true), meta(c10::ScalarType::Long, {4})});
  Arg dtype = typed(ArgKind::ScalarType, "dtype");
  dtype.i = static_cast<int64_t>(c10::ScalarType::Double);
  Arg device = typed(ArgKind::Device, "device");
  device.s = "cpu";
  Arg mf = typed(ArgKind::MemoryFormat, "memory_format");
  mf.i = static_cast<int64_t>(c10::MemoryFormat::Preserve);
  b.call1("aten::_to_copy", "",
          {Arg::value(mx[0], "self"), dtype, Arg::none("layout"), device, Arg::none("pin_memory"),
           Arg::boolean(false, "non_blocking"), mf},
          meta(c10::ScalarType::Double, {4}, true));
  const auto parts = b.call_list("aten::split", "Tensor",
                                 {Arg::value(h, "self"), Arg::integer(2, "split_size"),
                                  Arg::integer(0, "dim")},
                                 {meta(kF32, {2, 5}, true), meta(kF32, {2, 5}, true)});
  g.value(parts[0]).view_of = h;
  g.value(parts[1]).view_of = h;
  const ValueId rm2 = b.call1("aten::add_", "Tensor",
                              {Arg::value(rm, "self"), wrapped(1.0), Arg::integer(1, "alpha")},
                              meta(kF32, {5}));
  g.value(rm2).version_of = rm;
  g.edit_node(static_cast<NodeId>(g.nodes().size() - 1), [&](auto& n) { n.grad_mode = false; });
  const ValueId loss = b.call1("aten::sum", "",
                               {Arg::value(parts[0], "self"), Arg::none("dtype")},
                               meta(kF32, {}, true));
  // Backward.
  const ValueId gl = g.add_input(InputKind::Tangent, "grad_loss", meta(kF32, {}));
  g.edit_node(static_cast<NodeId>(g.nodes().size() - 1), [&](auto& n) { n.phase = Phase::Backward; });
  Arg size = typed(ArgKind::IntList, "size");
  size.ints = {2, 5};
  const ValueId ge = b.call1("aten::expand", "",
                             {Arg::value(gl, "self"), size, Arg::boolean(false, "implicit")},
                             meta(kF32, {2, 5}, false, {0, 0}), Phase::Backward, "SumBackward0");
  g.value(ge).view_of = gl;
  const int hook = g.add_hook(HookKind::TensorPreHook, "SplitBackward0");
  const ValueId gh = b.call1("aten::mul", "Tensor", {Arg::value(ge, "self"), wrapped(2.0)},
                             meta(kF32, {2, 5}), Phase::Backward);
  g.edit_node(static_cast<NodeId>(g.nodes().size() - 1), [&](auto& n) { n.hook = hook; });
  const ValueId hooked = b.call_hook(hook, {ge}, {gh}, meta(kF32, {2, 5}));
  const ValueId gcat = b.call1("aten::cat", "",
                               {Arg::value_list({hooked, hooked}, false, "tensors"),
                                Arg::integer(0, "dim")},
                               meta(kF32, {4, 5}), Phase::Backward, "SplitBackward0");
  const ValueId gt = b.call1("aten::t", "", {Arg::value(gcat, "self")},
                             meta(kF32, {5, 4}, false, {1, 5}), Phase::Backward,
                             "AddmmBackward0");
  g.value(gt).view_of = gcat;
  const ValueId gw = b.call1("aten::mm", "", {Arg::value(gt, "self"), Arg::value(x, "mat2")},
                             meta(kF32, {5, 10}), Phase::Backward, "AddmmBackward0");
  g.set_outputs({loss, gw}, {"loss", "fc1.weight"}, {OutputKind::User, OutputKind::Grad});
  return g;
}

constexpr const char* kGolden =
    R"(graph(
    %0 : f32[4, 10] x [user_input],
    %1 : f32[5, 10]@rg fc1.weight [parameter],
    %2 : f32[5]@rg fc1.bias [parameter],
    %3 : f32[5] running_mean [buffer],
):
  %4 : f32[10, 5]{1, 10}@rg = aten::t(%1)  # view of %1, users=1
  %5 : f32[4, 5]@rg = aten::addmm(%2, %0, %4, beta=1, alpha=1)  # users=2
  (%6 : f32[4]@rg, %7 : i64[4]) = aten::max.dim(%5, dim=1, keepdim=False)  # users=[1, 0]
  %8 : f64[4]@rg = aten::_to_copy(%6, dtype=torch.float64, layout=None, device=cpu, pin_memory=None, non_blocking=False, memory_format=torch.preserve_format)  # users=0
  [%9 : f32[2, 5]@rg, %10 : f32[2, 5]@rg] = aten::split.Tensor(%5, split_size=2, dim=0)  # view of %5, users=[1, 0]
  %11 : f32[5] = aten::add_.Tensor(%3, 1.0, alpha=1)  # no_grad, writes %3, users=0
  %12 : f32[]@rg = aten::sum(%9, dtype=None)  # users=1
  # ---- backward ----
  %13 : f32[] = input grad_loss [tangent]
  %14 : f32[2, 5]{0, 0} = aten::expand(%13, size=[2, 5], implicit=False)  # backward SumBackward0, view of %13, users=2
  %15 : f32[2, 5] = aten::mul.Tensor(%14, 2.0)  # backward, hook#0, users=1
  %16 : f32[2, 5] = call_hook[#0 tensor_pre_hook on SplitBackward0](%14) -> (%15)  # backward, users=1
  %17 : f32[4, 5] = aten::cat([%16, %16], dim=0)  # backward SplitBackward0, users=1
  %18 : f32[5, 4]{1, 5} = aten::t(%17)  # backward AddmmBackward0, view of %17, users=1
  %19 : f32[5, 10] = aten::mm(%18, %0)  # backward AddmmBackward0, users=1
  return (%12 loss, %19 grad(fc1.weight))
)";

TEST(Printer, GoldenReadable) {
  const Graph g = sample_graph();
  ASSERT_NO_THROW(verify(g)) << to_string(g);
  EXPECT_EQ(to_string(g), kGolden) << to_string(g);
  std::ostringstream os;
  os << g;
  EXPECT_EQ(os.str(), to_string(g));
}

TEST(Printer, ShortHeaderFitsOnOneLine) {
  Builder b;
  const ValueId x = b.g.add_input(InputKind::UserInput, "x", meta(kF32, {3}));
  TensorMeta cuda = meta(c10::ScalarType::Half, {3, 7}, false, {1, 3});
  cuda.device = c10::Device("cuda:1");
  cuda.storage_offset = 2;
  const ValueId y = b.g.add_input(InputKind::Constant, "", cuda);
  const ValueId z = b.call1("aten::relu", "", {Arg::value(x, "self")}, meta(kF32, {3}));
  // The first node is already backward, and ran with grad mode on (create_graph).
  b.g.edit_node(static_cast<NodeId>(b.g.nodes().size() - 1), [&](auto& n) { n.phase = Phase::Backward; });
  b.g.set_outputs({z, y}, {"", "y"}, {OutputKind::User, OutputKind::User});
  EXPECT_EQ(to_string(b.g),
            "graph(%0 : f32[3] x [user_input], %1 : f16[3, 7]{1, 3}+2@cuda:1 [constant]):\n"
            "  # ---- backward ----\n"
            "  %2 : f32[3] = aten::relu(%0)  # backward, enable_grad, users=1\n"
            "  return (%2, %1 y)\n");
}

TEST(Printer, ConstantsPrintPythonStyle) {
  Builder b;
  const ValueId x = b.g.add_input(InputKind::UserInput, "x", meta(kF32, {2}));
  Arg dl = typed(ArgKind::DoubleList, "ds");
  dl.doubles = {0.1, 1e-05, 3.0, 100000.0, -0.0, 1e16, -2.5e300, std::numeric_limits<double>::infinity(),
                std::numeric_limits<double>::quiet_NaN()};
  Arg bl = typed(ArgKind::BoolList, "bs");
  bl.ints = {1, 0};
  Arg cx = typed(ArgKind::Complex, "c");
  cx.d = 1.5;
  cx.d_imag = -2.0;
  Arg str = typed(ArgKind::String, "s");
  str.s = "a\"b\\c";
  Arg lay = typed(ArgKind::Layout, "layout");
  lay.i = static_cast<int64_t>(c10::Layout::Strided);
  Arg opaque = typed(ArgKind::Opaque, "generator");
  opaque.s = "Generator";
  Arg wi = wrapped(0.0);
  wi.i = 3;
  wi.i2 = static_cast<int64_t>(c10::ScalarType::Long);
  Arg wb = wrapped(0.0);
  wb.i = 1;
  wb.i2 = static_cast<int64_t>(c10::ScalarType::Bool);
  Arg scalar_out = Arg::integer(7);
  Node n;
  n.op = "test::all";
  n.args = {Arg::value(x, "self"),
            wi,
            wb,
            typed(ArgKind::UndefinedTensor, "u"),
            Arg::value_list({x, kNoValue}, true, "opt"),
            Arg::real(0.5, "r"),
            dl,
            bl,
            cx,
            str,
            lay,
            opaque};
  n.outputs = {Arg::none(), scalar_out};
  b.g.schemas()["test::all"] = "test::all(...)";
  b.g.add_node(n);
  ASSERT_NO_THROW(verify(b.g));
  const std::string s = to_string(b.g);
  EXPECT_NE(s.find("  (_, 7) = test::all(%0, 3, True, <undefined>, [%0, None], r=0.5, "
                   "ds=[0.1, 1e-05, 3.0, 100000.0, -0.0, 1e+16, -2.5e+300, inf, nan], bs=[True, False], "
                   "c=(1.5-2.0j), s=\"a\\\"b\\\\c\", layout=torch.strided, "
                   "generator=<Generator>)\n"),
            std::string::npos)
      << s;
}

TEST(Printer, NeverThrowsOnBrokenGraph) {
  Graph g = sample_graph();
  g.edit_node(5, [&](auto& n) { n.args[0].values[0] = 999; });
  g.edit_node(6, [&](auto& n) { n.hook = 42; });
  g.value(3).producer = -5;
  std::string s;
  EXPECT_NO_THROW(s = to_string(g));
  EXPECT_NE(s.find("aten::addmm(%999"), std::string::npos) << s;
  EXPECT_NO_THROW(to_table(g));
  EXPECT_NO_THROW(to_dot(g));
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream is(s);
  for (std::string line; std::getline(is, line);) out.push_back(line);
  return out;
}

TEST(Printer, TableHasHeaderAndOneAlignedRowPerNode) {
  const Graph g = sample_graph();
  const auto lines = lines_of(to_table(g));
  ASSERT_EQ(lines.size(), g.nodes().size() + 2) << to_table(g);
  EXPECT_EQ(lines[0].rfind("opcode", 0), 0u);
  EXPECT_EQ(lines[1].find_first_not_of("- "), std::string::npos);
  // Every column starts at the offset of its header.
  for (const char* column : {"name", "target", "args", "meta"}) {
    const size_t at = lines[0].find(column);
    ASSERT_NE(at, std::string::npos);
    for (size_t k = 2; k < lines.size(); ++k) {
      if (lines[k].size() <= at && std::string(column) == "meta") continue;  // empty last cell
      ASSERT_GT(lines[k].size(), at) << lines[k];
      EXPECT_EQ(lines[k][at - 1], ' ') << lines[k];
      EXPECT_NE(lines[k][at], ' ') << lines[k];
    }
  }
  EXPECT_EQ(lines[2].rfind("input", 0), 0u);
  EXPECT_NE(lines[6].find("aten::t"), std::string::npos) << lines[6];
  EXPECT_NE(lines.back().find("(%12 loss, %19 grad(fc1.weight))"), std::string::npos);
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(Printer, DotHasOneNodePerNodeAndOneEdgePerUse) {
  const Graph g = sample_graph();
  const std::string dot = to_dot(g);
  EXPECT_EQ(dot.rfind("digraph", 0), 0u) << dot;
  EXPECT_EQ(dot.substr(dot.size() - 2), "}\n");
  size_t uses = 0;
  for (const Value& v : g.values()) uses += g.users(v.id).size();
  EXPECT_EQ(count(dot, " -> "), uses) << dot;
  for (const Node& n : g.nodes()) {
    EXPECT_NE(dot.find("  n" + std::to_string(n.id) + " [label="), std::string::npos);
  }
  EXPECT_NE(dot.find("n3 -> n9 [label=\"%3\"]"), std::string::npos) << dot;  // buffer -> add_
  EXPECT_NE(dot.find("hexagon"), std::string::npos);  // the call_hook node
  EXPECT_NE(dot.find("doubleoctagon"), std::string::npos);  // the output node
  // Forward and backward calls are drawn differently.
  auto style_of = [&](NodeId id) {
    const std::string head = "  n" + std::to_string(id) + " [";
    const size_t at = dot.find(head);
    const size_t fill = dot.find("fillcolor", at);
    return dot.substr(fill, dot.find('\n', fill) - fill);
  };
  EXPECT_NE(style_of(5), style_of(17));  // addmm vs backward mm
  EXPECT_NE(style_of(0), style_of(1));   // user input vs parameter
  EXPECT_NE(style_of(1), style_of(3));   // parameter vs buffer
}

// --- verify ------------------------------------------------------------------------

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

void expect_verify_fails(const Graph& g, const std::string& needle) {
  try {
    verify(g);
    ADD_FAILURE() << "verify passed, expected a failure mentioning '" << needle << "'\n"
                  << to_string(g);
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), msg.find("\ngraph(")) << "one-line problem, then the graph:\n"
                                                   << msg;
    EXPECT_TRUE(ends_with(msg, "\n" + to_string(g))) << msg;
  }
}

TEST(Verify, AcceptsSampleAndEmptyGraphs) {
  EXPECT_NO_THROW(verify(sample_graph()));
  EXPECT_NO_THROW(verify(Graph()));
  Graph no_schemas = sample_graph();
  no_schemas.schemas().clear();  // schemas are only required when the graph has some
  EXPECT_NO_THROW(verify(no_schemas));
}

TEST(Verify, NodeIdNotPosition) {
  Graph g = sample_graph();
  g.edit_node(5, [&](auto& n) { n.id = 9; });
  expect_verify_fails(g, "node at position 5 has id 9");
}

TEST(Verify, ValueIdNotPosition) {
  Graph g = sample_graph();
  g.value(4).id = 40;
  expect_verify_fails(g, "value %4 has id 40");
}

TEST(Verify, ProducerDoesNotListValue) {
  Graph g = sample_graph();
  g.value(5).output_index = 1;
  expect_verify_fails(g, "value %5 says it is output 1 of node 5 (call aten::addmm)");
  Graph g2 = sample_graph();
  g2.value(10).list_index = 0;  // split's second result claims slot 0
  expect_verify_fails(g2, "value %10 says it is output 0[0]");
  Graph g3 = sample_graph();
  g3.value(4).producer = 77;
  expect_verify_fails(g3, "value %4 names producer node 77, which does not exist");
}

TEST(Verify, OutputsPointBackAtTheirNode) {
  Graph g = sample_graph();
  g.edit_node(4, [&](auto& n) { n.outputs.push_back(Arg::value(5)); });  // aten::t also claims addmm's result
  expect_verify_fails(g, "node 4 (call aten::t) output 1 names %5");
}

TEST(Verify, ArgUsesLaterValue) {
  Graph g = sample_graph();
  g.edit_node(5, [&](auto& n) { n.args[0] = Arg::value(12, "self"); });  // addmm reads the loss
  expect_verify_fails(g, "node 5 (call aten::addmm) arg 0 (self) uses %12, which is produced by "
                         "node 10, not an earlier node");
}

TEST(Verify, ArgUsesMissingValue) {
  Graph g = sample_graph();
  g.edit_node(15, [&](auto& n) { n.args[0].values[1] = 123; });  // inside cat's Tensor[]
  expect_verify_fails(g, "node 15 (call aten::cat) arg 0 (tensors) uses %123, which does not exist");
}

TEST(Verify, VersionAndViewLinks) {
  Graph g = sample_graph();
  g.value(11).version_of = 19;
  expect_verify_fails(g, "value %11 has version_of %19, which is not produced by an earlier node");
  Graph g2 = sample_graph();
  g2.value(4).view_of = 500;
  expect_verify_fails(g2, "value %4 has view_of %500, which does not exist");
  Graph g3 = sample_graph();
  g3.value(4).view_of = 4;
  expect_verify_fails(g3, "value %4 has view_of %4, which is not produced by an earlier node");
}

TEST(Verify, OutputNodeMustBeLastAndUnique) {
  Graph g = sample_graph();
  Node extra;
  extra.op = "aten::relu";
  extra.args = {Arg::value(0)};
  g.add_node(extra);
  expect_verify_fails(g, "node 18 (output) is not the last node");
  Graph g2 = sample_graph();
  Node second;
  second.kind = NodeKind::Output;
  g2.add_node(second);
  expect_verify_fails(g2, "node 18 (output) is not the last node");
}

TEST(Verify, OutputNamesAndKindsMatchArgs) {
  Graph g = sample_graph();
  g.edit_node(static_cast<NodeId>(g.nodes().size() - 1), [&](auto& n) { n.output_names.pop_back(); });
  expect_verify_fails(g, "node 18 (output) has 2 args but 1 output_names and 2 output_kinds");
}

// Found by the interpreter's fuzz target: an Output arg of kind int made output_values()
// read a value id that is not there.
TEST(Verify, OutputArgsAreValues) {
  Graph g = sample_graph();
  g.edit_node(static_cast<NodeId>(g.nodes().size() - 1), [&](auto& n) { n.args[0] = Arg::integer(1); });
  expect_verify_fails(g, "node 18 (output) output 0 is not a value");
  Graph g2 = sample_graph();
  g2.edit_node(static_cast<NodeId>(g2.nodes().size() - 1), [&](auto& n) { n.args[1] = Arg::value_list({3, 4}, false); });
  expect_verify_fails(g2, "node 18 (output) output 1 is not a value");
}

TEST(Verify, InputHasOneValueOutput) {
  Graph g = sample_graph();
  g.edit_node(1, [&](auto& n) { n.outputs.push_back(Arg::none()); });
  expect_verify_fails(g, "node 1 (input fc1.weight) must have exactly one Value output");
}

TEST(Verify, CallHookNamesExistingHook) {
  Graph g = sample_graph();
  g.edit_node(14, [&](auto& n) { n.hook = 3; });
  expect_verify_fails(g, "node 14 (call_hook #3) calls hook #3, which does not exist");
  Graph g2 = sample_graph();
  g2.edit_node(13, [&](auto& n) { n.hook = 2; });
  expect_verify_fails(g2, "node 13 (call aten::mul.Tensor) ran inside hook #2");
}

TEST(Verify, CallNeedsOpAndSchema) {
  Graph g = sample_graph();
  g.edit_node(4, [&](auto& n) { n.op = ""; });
  g.edit_node(4, [&](auto& n) { n.overload = ""; });
  expect_verify_fails(g, "node 4 (call ) has an empty op");
  Graph g2 = sample_graph();
  g2.schemas().erase("aten::addmm");
  expect_verify_fails(g2, "node 5 (call aten::addmm) has no entry in the graph's schemas");
}

// --- names -------------------------------------------------------------------------

TEST(Names, DtypeNamesRoundTrip) {
  const std::vector<std::pair<c10::ScalarType, std::pair<const char*, const char*>>> expected = {
      {c10::ScalarType::Float, {"float32", "f32"}},
      {c10::ScalarType::Double, {"float64", "f64"}},
      {c10::ScalarType::Half, {"float16", "f16"}},
      {c10::ScalarType::BFloat16, {"bfloat16", "bf16"}},
      {c10::ScalarType::Long, {"int64", "i64"}},
      {c10::ScalarType::Int, {"int32", "i32"}},
      {c10::ScalarType::Short, {"int16", "i16"}},
      {c10::ScalarType::Char, {"int8", "i8"}},
      {c10::ScalarType::Byte, {"uint8", "u8"}},
      {c10::ScalarType::Bool, {"bool", "b8"}},
      {c10::ScalarType::ComplexFloat, {"complex64", "c64"}},
      {c10::ScalarType::ComplexDouble, {"complex128", "c128"}},
      {c10::ScalarType::Float8_e4m3fn, {"float8_e4m3fn", "f8e4m3fn"}},
      {c10::ScalarType::Float8_e5m2, {"float8_e5m2", "f8e5m2"}},
      {c10::ScalarType::UInt16, {"uint16", "u16"}},
  };
  for (const auto& [t, names] : expected) {
    EXPECT_EQ(dtype_name(t), names.first);
    EXPECT_EQ(dtype_short_name(t), names.second);
    EXPECT_EQ(dtype_from_name(names.first), t);
    EXPECT_EQ(dtype_from_name(names.second), t);
  }
  // Every dtype c10 knows has a distinct name that maps back to it.
  std::set<std::string> seen;
  for (int k = 0; k < static_cast<int>(c10::ScalarType::NumOptions); ++k) {
    const auto t = static_cast<c10::ScalarType>(k);
    const std::string name = dtype_name(t);
    EXPECT_TRUE(seen.insert(name).second) << name;
    EXPECT_EQ(dtype_from_name(name), t) << name;
  }
}

TEST(Names, UnknownDtypeThrows) {
  try {
    dtype_from_name("float33");
    ADD_FAILURE() << "expected c10::Error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("unknown dtype 'float33'"),
              std::string::npos);
  }
  EXPECT_THROW(dtype_from_name(""), c10::Error);
  EXPECT_THROW(dtype_from_name("torch.float32"), c10::Error);
}

TEST(Names, EnumSpellings) {
  EXPECT_EQ(to_string(NodeKind::Input), "input");
  EXPECT_EQ(to_string(NodeKind::Call), "call");
  EXPECT_EQ(to_string(NodeKind::CallHook), "call_hook");
  EXPECT_EQ(to_string(NodeKind::Output), "output");
  EXPECT_EQ(to_string(InputKind::UserInput), "user_input");
  EXPECT_EQ(to_string(InputKind::Parameter), "parameter");
  EXPECT_EQ(to_string(InputKind::Buffer), "buffer");
  EXPECT_EQ(to_string(InputKind::Tangent), "tangent");
  EXPECT_EQ(to_string(InputKind::Constant), "constant");
  EXPECT_EQ(to_string(Phase::Forward), "forward");
  EXPECT_EQ(to_string(Phase::Backward), "backward");
  EXPECT_EQ(to_string(OutputKind::User), "user");
  EXPECT_EQ(to_string(OutputKind::Grad), "grad");
  EXPECT_EQ(to_string(HookKind::TensorPreHook), "tensor_pre_hook");
  EXPECT_EQ(to_string(HookKind::RetainsGradHook), "retains_grad_hook");
  EXPECT_EQ(to_string(HookKind::PreHook), "pre_hook");
  EXPECT_EQ(to_string(HookKind::PostHook), "post_hook");
  EXPECT_EQ(to_string(HookKind::AccumulateGrad), "accumulate_grad");
  const std::vector<std::pair<ArgKind, const char*>> args = {
      {ArgKind::None, "none"},
      {ArgKind::UndefinedTensor, "undefined_tensor"},
      {ArgKind::Value, "value"},
      {ArgKind::ValueList, "value_list"},
      {ArgKind::OptValueList, "opt_value_list"},
      {ArgKind::Bool, "bool"},
      {ArgKind::Int, "int"},
      {ArgKind::Double, "double"},
      {ArgKind::Complex, "complex"},
      {ArgKind::String, "string"},
      {ArgKind::IntList, "int_list"},
      {ArgKind::DoubleList, "double_list"},
      {ArgKind::BoolList, "bool_list"},
      {ArgKind::ScalarType, "scalar_type"},
      {ArgKind::Layout, "layout"},
      {ArgKind::MemoryFormat, "memory_format"},
      {ArgKind::Device, "device"},
      {ArgKind::WrappedScalar, "wrapped_scalar"},
      {ArgKind::Opaque, "opaque"},
  };
  for (const auto& [kind, name] : args) EXPECT_EQ(to_string(kind), name);
}

}  // namespace
}  // namespace tcap::ir
