// Graph JSON: exact round trips, golden files and strict, one-line errors.
//
// Needs the compile definition TCAP_GOLDEN_DIR, the absolute path of test/golden:
//   target_compile_definitions(<test> PRIVATE
//                              TCAP_GOLDEN_DIR="${PROJECT_SOURCE_DIR}/test/golden")
#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <gtest/gtest.h>
#include <tcap/graph_json.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#ifndef TCAP_GOLDEN_DIR
#error "json_test needs -DTCAP_GOLDEN_DIR=\"<source>/test/golden\""
#endif

#include "ir/contiguous_meta.h"

namespace tcap::ir {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// --- building graphs by hand -----------------------------------------------------

using tcap::ir::testing::contiguous_meta;
using tcap::ir::testing::edit;
using tcap::ir::testing::error_of;
using tcap::ir::testing::meta;

// Appends `n` with one Value result per entry of `results`; returns the result ids.
std::vector<ValueId> add_call(Graph& g, Node n, std::vector<TensorMeta> results) {
  const auto id = static_cast<NodeId>(g.nodes().size());
  for (size_t k = 0; k < results.size(); ++k) {
    n.outputs.push_back(Arg::value(g.new_value(id, static_cast<int>(k), -1, results[k])));
  }
  std::vector<ValueId> out;
  for (const Arg& a : n.outputs) out.push_back(a.values[0]);
  g.add_node(std::move(n));
  return out;
}

Node call(std::string op, std::string overload, std::vector<Arg> args) {
  Node n;
  n.kind = NodeKind::Call;
  n.op = std::move(op);
  n.overload = std::move(overload);
  n.args = std::move(args);
  return n;
}

Arg make_arg(ArgKind kind, std::string name = {}) {
  Arg a;
  a.kind = kind;
  a.name = std::move(name);
  return a;
}
Arg complex_arg(double re, double im) {
  Arg a = make_arg(ArgKind::Complex);
  a.d = re;
  a.d_imag = im;
  return a;
}
Arg string_arg(std::string s, std::string name = {}) {
  Arg a = make_arg(ArgKind::String, std::move(name));
  a.s = std::move(s);
  return a;
}
Arg int_list(std::vector<int64_t> v, std::string name = {}) {
  Arg a = make_arg(ArgKind::IntList, std::move(name));
  a.ints = std::move(v);
  return a;
}
Arg double_list(std::vector<double> v) {
  Arg a = make_arg(ArgKind::DoubleList);
  a.doubles = std::move(v);
  return a;
}
Arg bool_list(std::vector<int64_t> v) {
  Arg a = make_arg(ArgKind::BoolList);
  a.ints = std::move(v);
  return a;
}
Arg enum_arg(ArgKind kind, int64_t raw, std::string name = {}) {
  Arg a = make_arg(kind, std::move(name));
  a.i = raw;
  return a;
}
Arg device_arg(std::string device) {
  Arg a = make_arg(ArgKind::Device, "device");
  a.s = std::move(device);
  return a;
}
// See graph.h: integral (and bool) wrapped numbers live in i, the others in d (+ d_imag).
Arg wrapped(c10::ScalarType dtype, double d, int64_t i = 0, double imag = 0.0) {
  Arg a = make_arg(ArgKind::WrappedScalar, "other");
  a.i2 = static_cast<int64_t>(dtype);
  a.d = d;
  a.i = i;
  a.d_imag = imag;
  return a;
}
Arg opaque(std::string type) {
  Arg a = make_arg(ArgKind::Opaque, "generator");
  a.s = std::move(type);
  return a;
}

// Golden graph 1: a small forward pass with a view (t), an in-place op (relu_) and a
// reduction, with schemas and meta.
Graph mlp_forward() {
  Graph g;
  g.meta()["torch_version"] = "2.11.0";
  g.schemas()["aten::t"] = "aten::t(Tensor(a) self) -> Tensor(a)";
  g.schemas()["aten::addmm"] =
      "aten::addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) "
      "-> Tensor";
  g.schemas()["aten::relu_"] = "aten::relu_(Tensor(a!) self) -> Tensor(a!)";
  g.schemas()["aten::sum.dim_IntList"] =
      "aten::sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, "
      "ScalarType? dtype=None) -> Tensor";
  TensorMeta x_meta = meta({4, 3});
  TensorMeta w_meta = meta({5, 3});
  w_meta.requires_grad = true;
  TensorMeta b_meta = meta({5});
  b_meta.requires_grad = true;
  const ValueId x = g.add_input(InputKind::UserInput, "x", x_meta);
  const ValueId w = g.add_input(InputKind::Parameter, "fc.weight", w_meta);
  const ValueId b = g.add_input(InputKind::Parameter, "fc.bias", b_meta);

  TensorMeta wt_meta = meta({3, 5});
  wt_meta.strides = {1, 3};
  wt_meta.requires_grad = true;
  const ValueId wt = add_call(g, call("aten::t", "", {Arg::value(w, "self")}), {wt_meta})[0];
  g.value(wt).view_of = w;

  TensorMeta h_meta = meta({4, 5});
  h_meta.requires_grad = true;
  const ValueId h =
      add_call(g,
               call("aten::addmm", "",
                    {Arg::value(b, "self"), Arg::value(x, "mat1"), Arg::value(wt, "mat2"),
                     Arg::integer(1, "beta"), Arg::real(0.5, "alpha")}),
               {h_meta})[0];
  const ValueId h2 = add_call(g, call("aten::relu_", "", {Arg::value(h, "self")}), {h_meta})[0];
  g.value(h2).version_of = h;

  TensorMeta s_meta = meta({4});
  s_meta.requires_grad = true;
  const ValueId s = add_call(g,
                             call("aten::sum", "dim_IntList",
                                  {Arg::value(h2, "self"), int_list({1}, "dim"),
                                   Arg::boolean(false, "keepdim"), Arg::none("dtype")}),
                             {s_meta})[0];
  g.set_outputs({s}, {"loss"}, {OutputKind::User});
  return g;
}

// Golden graph 2: a backward graph with hooks, as capture records it: a tangent input, an
// op that ran inside a tensor pre-hook's body, the call_hook node that passes the hook's
// results on (args: inputs, results), an autograd node's op, a Tensor[] result.
Graph backward_with_hooks() {
  Graph g;
  g.schemas()["aten::mul.Tensor"] = "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor";
  g.schemas()["aten::split.Tensor"] =
      "aten::split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]";
  const int hook = g.add_hook(HookKind::TensorPreHook, "MulBackward0");
  g.add_hook(HookKind::PostHook, "AccumulateGrad");
  const ValueId grad = g.add_input(InputKind::Tangent, "grad_out", meta({6}, c10::kDouble));
  const ValueId saved = g.add_input(InputKind::UserInput, "saved", meta({6}, c10::kDouble));

  Node in_hook = call("aten::mul", "Tensor", {Arg::value(grad, "self"), wrapped(c10::kDouble, 2.0)});
  in_hook.phase = Phase::Backward;
  in_hook.grad_mode = false;
  in_hook.hook = hook;
  const ValueId doubled = add_call(g, in_hook, {meta({6}, c10::kDouble)})[0];

  Node hook_call;
  hook_call.kind = NodeKind::CallHook;
  hook_call.hook = hook;
  hook_call.phase = Phase::Backward;
  hook_call.grad_mode = false;
  hook_call.autograd_node = "MulBackward0";
  hook_call.args = {Arg::value_list({grad}, /*optional=*/true, "inputs"),
                    Arg::value_list({doubled}, /*optional=*/true, "results")};
  const auto hook_id = static_cast<NodeId>(g.nodes().size());
  const ValueId hooked = g.new_value(hook_id, 0, 0, meta({6}, c10::kDouble));
  hook_call.outputs = {Arg::value_list({hooked}, /*optional=*/true)};
  g.add_node(hook_call);

  Node mul = call("aten::mul", "Tensor", {Arg::value(hooked, "self"), Arg::value(saved, "other")});
  mul.phase = Phase::Backward;
  mul.grad_mode = false;
  mul.autograd_node = "MulBackward0";
  const ValueId g_in = add_call(g, mul, {meta({6}, c10::kDouble)})[0];

  Node split =
      call("aten::split", "Tensor",
           {Arg::value(g_in, "self"), Arg::integer(3, "split_size"), Arg::integer(0, "dim")});
  split.phase = Phase::Backward;
  split.grad_mode = false;
  split.autograd_node = "MulBackward0";
  const auto split_id = static_cast<NodeId>(g.nodes().size());
  std::vector<ValueId> parts;
  for (int k = 0; k < 2; ++k) {
    TensorMeta m = meta({3}, c10::kDouble);
    m.storage_offset = 3 * k;
    parts.push_back(g.new_value(split_id, 0, k, m));
    g.value(parts.back()).view_of = g_in;
  }
  split.outputs = {Arg::value_list(parts, /*optional=*/false)};
  g.add_node(split);
  g.set_outputs(parts, {"grad_a", "grad_b"}, {OutputKind::Grad, OutputKind::Grad});
  return g;
}

// Every ArgKind (and most spellings of each) as arguments of one call.
Graph every_arg_kind() {
  Graph g;
  const ValueId a = g.add_input(InputKind::UserInput, "a", meta({2, 3}));
  const ValueId b = g.add_input(InputKind::UserInput, "b", meta({2, 3}));
  Node n = call("test::everything", "",
                {Arg::none("dtype"),
                 make_arg(ArgKind::UndefinedTensor, "weight"),
                 Arg::value(a, "self"),
                 Arg::value_list({a, b}, /*optional=*/false, "tensors"),
                 Arg::value_list({a, kNoValue, b}, /*optional=*/true, "indices"),
                 Arg::value_list({}, /*optional=*/false),
                 Arg::boolean(true, "keepdim"),
                 Arg::boolean(false),
                 Arg::integer(-7, "dim"),
                 Arg::integer(std::numeric_limits<int64_t>::min()),
                 Arg::integer(std::numeric_limits<int64_t>::max()),
                 Arg::real(0.1, "alpha"),
                 Arg::real(1e300),
                 Arg::real(5e-324),
                 Arg::real(3.0),
                 complex_arg(1.5, -2.25),
                 string_arg("tanh", "approximate"),
                 string_arg("quote \" backslash \\ newline \n unicode \xc3\xa9 tab \t"),
                 string_arg(""),
                 int_list({}),
                 int_list({1, -2, 3, std::numeric_limits<int64_t>::max()}),
                 double_list({0.5, -1.25, 1e-310}),
                 bool_list({1, 0, 1}),
                 enum_arg(ArgKind::ScalarType, static_cast<int64_t>(c10::kBFloat16), "dtype"),
                 enum_arg(ArgKind::Layout, static_cast<int64_t>(c10::Layout::SparseCsr), "layout"),
                 enum_arg(ArgKind::MemoryFormat,
                          static_cast<int64_t>(c10::MemoryFormat::ChannelsLast), "memory_format"),
                 device_arg("cuda:1"),
                 device_arg("cpu"),
                 wrapped(c10::kDouble, 2.5),
                 wrapped(c10::kFloat, -0.75),
                 wrapped(c10::kLong, 0.0, -3),
                 wrapped(c10::kBool, 0.0, 1),
                 wrapped(c10::kComplexFloat, 1.0, 0, -1.0),
                 opaque("Generator")});
  n.outputs = {Arg::integer(42), Arg::none()};
  const auto id = static_cast<NodeId>(g.nodes().size());
  const ValueId r = g.new_value(id, 2, -1, meta({2, 3}));
  n.outputs.push_back(Arg::value(r));
  g.add_node(n);
  g.set_outputs({r}, {"out"}, {OutputKind::User});
  return g;
}

// --- helpers -----------------------------------------------------------------------

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::string golden_path(const std::string& name) {
  return std::string(TCAP_GOLDEN_DIR) + "/" + name;
}

void expect_round_trip(const Graph& g) {
  const std::string text = to_json_string(g);
  const Graph back = from_json_string(text);
  EXPECT_TRUE(back == g) << "graph changed in the round trip\nwritten:\n"
                         << text << "\nread back and written again:\n"
                         << to_json_string(back);
  EXPECT_EQ(to_json_string(back), text);
  EXPECT_TRUE(from_json_string(to_json_string(g, -1)) == g) << "compact form";
}

// --- round trips ---------------------------------------------------------------------

TEST(GraphJson, RoundTripsEveryArgKind) {
  const Graph g = every_arg_kind();
  // Guard against a new ArgKind slipping past this test: every kind appears above.
  std::vector<bool> seen(static_cast<size_t>(ArgKind::Opaque) + 1, false);
  for (const Arg& a : g.node(2).args) seen[static_cast<size_t>(a.kind)] = true;
  for (size_t k = 0; k < seen.size(); ++k)
    EXPECT_TRUE(seen[k]) << "ArgKind " << k << " not covered";
  expect_round_trip(g);
}

TEST(GraphJson, RoundTripsEveryLayoutAndMemoryFormat) {
  const c10::Layout layouts[] = {
      c10::Layout::Strided,   c10::Layout::Sparse,    c10::Layout::SparseCsr, c10::Layout::Mkldnn,
      c10::Layout::SparseCsc, c10::Layout::SparseBsr, c10::Layout::SparseBsc, c10::Layout::Jagged};
  const c10::MemoryFormat formats[] = {c10::MemoryFormat::Contiguous, c10::MemoryFormat::Preserve,
                                       c10::MemoryFormat::ChannelsLast,
                                       c10::MemoryFormat::ChannelsLast3d};
  Graph g;
  const ValueId x = g.add_input(InputKind::UserInput, "x", meta({1}));
  Node n = call("test::enums", "", {Arg::value(x)});
  for (auto l : layouts) n.args.push_back(enum_arg(ArgKind::Layout, static_cast<int64_t>(l)));
  for (auto f : formats) n.args.push_back(enum_arg(ArgKind::MemoryFormat, static_cast<int64_t>(f)));
  g.add_node(n);
  expect_round_trip(g);
  const std::string text = to_json_string(g, -1);
  for (const char* name :
       {"\"strided\"", "\"sparse_coo\"", "\"sparse_csr\"", "\"mkldnn\"", "\"sparse_csc\"",
        "\"sparse_bsr\"", "\"sparse_bsc\"", "\"jagged\"", "\"contiguous_format\"",
        "\"preserve_format\"", "\"channels_last\"", "\"channels_last_3d\""}) {
    EXPECT_NE(text.find(name), std::string::npos) << name;
  }
}

TEST(GraphJson, RoundTripsNonFiniteAndSignedZeroDoubles) {
  Graph g;
  const ValueId x = g.add_input(InputKind::UserInput, "x", meta({3}));
  g.add_node(call("test::doubles", "",
                  {Arg::value(x), Arg::real(kNaN), Arg::real(kInf), Arg::real(-kInf),
                   Arg::real(-0.0), complex_arg(kNaN, -kInf), complex_arg(-0.0, kInf),
                   double_list({kNaN, kInf, -kInf, -0.0, 0.0}), wrapped(c10::kDouble, kNaN),
                   wrapped(c10::kFloat, -kInf), wrapped(c10::kComplexDouble, -0.0, 0, kNaN)}));
  expect_round_trip(g);

  const std::string text = to_json_string(g, -1);
  EXPECT_NE(text.find("\"value\":\"nan\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"value\":\"inf\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"value\":\"-inf\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"value\":-0.0"), std::string::npos) << text;

  // Graph::operator== treats -0.0 == 0.0; the sign must survive anyway.
  const Graph back = from_json_string(text);
  const auto& args = back.node(1).args;
  EXPECT_TRUE(std::isnan(args[1].d));
  EXPECT_TRUE(std::signbit(args[4].d) && args[4].d == 0.0);
  EXPECT_TRUE(std::isnan(args[5].d) && args[5].d_imag == -kInf);
  EXPECT_TRUE(std::signbit(args[6].d));
  EXPECT_TRUE(std::signbit(args[7].doubles[3]) && !std::signbit(args[7].doubles[4]));
  EXPECT_TRUE(std::signbit(args[10].d) && std::isnan(args[10].d_imag));
}

TEST(GraphJson, RoundTripsEveryNodeAndInputKindAndHooks) {
  Graph g;
  g.add_hook(HookKind::TensorPreHook, "MulBackward0");
  g.add_hook(HookKind::RetainsGradHook, "AddBackward0");
  g.add_hook(HookKind::PreHook, "SumBackward0");
  g.add_hook(HookKind::PostHook, "AccumulateGrad");
  std::vector<ValueId> ins;
  const InputKind kinds[] = {InputKind::UserInput, InputKind::Parameter, InputKind::Buffer,
                             InputKind::Tangent, InputKind::Constant};
  for (InputKind k : kinds)
    ins.push_back(g.add_input(k, "in" + std::to_string(ins.size()), meta({2})));
  g.add_hook(HookKind::PostHook, "MulBackward0", /*slot=*/0);  // called by slot (compiled autograd)
  g.add_hook(HookKind::PreHook, "MulBackward0", /*slot=*/7);
  for (int hook = 0; hook < 6; ++hook) {
    Node n;
    n.kind = NodeKind::CallHook;
    n.hook = hook;
    n.phase = Phase::Backward;
    n.autograd_node = g.hooks()[static_cast<size_t>(hook)].autograd_node;
    if (hook < 4) {  // the body was recorded: inputs, results
      n.args = {Arg::value_list({ins[3]}, /*optional=*/true, "inputs"),
                Arg::value_list({ins[4]}, /*optional=*/true, "results")};
    } else {  // called by slot: inputs, and a post-hook's node inputs
      n.args = {Arg::value_list({ins[3], kNoValue}, /*optional=*/true, "inputs")};
      if (hook == 4) n.args.push_back(Arg::value_list({ins[2]}, /*optional=*/true, "node_inputs"));
    }
    const auto id = static_cast<NodeId>(g.nodes().size());
    n.outputs = {Arg::value_list({g.new_value(id, 0, 0, meta({2})), kNoValue}, /*optional=*/true)};
    if (hook < 4) n.outputs[0].values.pop_back();
    g.add_node(n);
  }
  Node c = call("aten::neg", "", {Arg::value(ins[0], "self")});
  c.hook = 2;
  c.autograd_node = "SumBackward0";
  c.phase = Phase::Backward;
  const ValueId r = add_call(g, c, {meta({2})})[0];
  g.set_outputs({r, ins[1]}, {"r", "p"}, {OutputKind::User, OutputKind::Grad});
  expect_round_trip(g);
}

// See Note [Node fields by kind] in json.cpp: fields a kind does not use survive too.
TEST(GraphJson, RoundTripsFieldsUnusualForTheNodeKind) {
  Graph g;
  g.add_input(InputKind::Tangent, "grad", meta({2}));
  g.edit_node(0, [&](auto& n) { n.phase = Phase::Backward; });
  g.edit_node(0, [&](auto& n) { n.grad_mode = false; });
  g.edit_node(0, [&](auto& n) { n.autograd_node = "MulBackward0"; });
  g.set_outputs({0}, {"g"}, {OutputKind::Grad});
  g.edit_node(1, [&](auto& n) { n.phase = Phase::Backward; });
  g.edit_node(1, [&](auto& n) { n.name = "outputs"; });
  expect_round_trip(g);
}

TEST(GraphJson, RoundTripsViewsVersionsAndListIndices) {
  expect_round_trip(mlp_forward());
  expect_round_trip(backward_with_hooks());
}

TEST(GraphJson, RoundTripsEmptyGraphAndMeta) {
  Graph g;
  expect_round_trip(g);
  g.meta()["capture.options"] = "mode=joint";
  g.meta()["empty"] = "";
  expect_round_trip(g);
}

TEST(GraphJson, WritesFormatAndVersionFirst) {
  const std::string text = to_json_string(mlp_forward(), -1);
  EXPECT_EQ(text.rfind("{\"format\":\"tcap.graph\",\"version\":1,", 0), 0u) << text;
}

// --- golden files ----------------------------------------------------------------------

void check_golden(const Graph& g, const std::string& name) {
  const std::string expected = read_file(golden_path(name));  // "" if missing
  const std::string actual = to_json_string(g) + "\n";
  if (actual != expected) {
    const std::string out = ::testing::TempDir() + name;
    std::ofstream(out) << actual;
    ADD_FAILURE() << "serialized " << name << " differs from the golden file; the new text is in "
                  << out << " (copy it over " << golden_path(name)
                  << " if the change is intended and docs/graph-json.md agrees)";
  }
  ASSERT_FALSE(expected.empty()) << "missing golden file " << golden_path(name);
  const Graph loaded = load_json(golden_path(name));
  EXPECT_TRUE(loaded == g) << "loading " << name << " gives\n" << to_json_string(loaded);

  const std::string saved = ::testing::TempDir() + "saved_" + name;
  save_json(g, saved);
  EXPECT_EQ(read_file(saved), expected) << "save_json writes the golden text";
}

TEST(GraphJsonGolden, MlpForward) { check_golden(mlp_forward(), "mlp_forward.json"); }
TEST(GraphJsonGolden, BackwardWithHooks) {
  check_golden(backward_with_hooks(), "backward_with_hooks.json");
}

// --- malformed input -----------------------------------------------------------------


#define EXPECT_FORMAT_ERROR(text, substring)                                      \
  do {                                                                            \
    const std::string msg_ = error_of(text);                                      \
    EXPECT_NE(msg_.find(substring), std::string::npos)                            \
        << "expected an error containing: " << (substring) << "\n got: " << msg_; \
    EXPECT_EQ(msg_.rfind("tcap.graph: ", 0), 0u) << msg_;                         \
    EXPECT_EQ(msg_.find('\n'), std::string::npos) << "not one line: " << msg_;    \
  } while (0)

class GraphJsonMalformed : public ::testing::Test {
 protected:
  // Compact text of mlp_forward(): 3 inputs (values 0-2), t (value 3), addmm (value 4)...
  const std::string base = to_json_string(mlp_forward(), -1);
};

TEST_F(GraphJsonMalformed, BaseParses) { EXPECT_EQ(error_of(base), ""); }

TEST_F(GraphJsonMalformed, TruncatedJson) {
  EXPECT_FORMAT_ERROR(base.substr(0, base.size() / 2), "invalid JSON at byte");
  EXPECT_FORMAT_ERROR("", "invalid JSON at byte");
}

TEST_F(GraphJsonMalformed, NotAnObject) {
  EXPECT_FORMAT_ERROR("[1, 2]", "not a tcap graph (expected a JSON object, got array");
}

TEST_F(GraphJsonMalformed, WrongFormat) {
  EXPECT_FORMAT_ERROR(edit(base, "\"format\":\"tcap.graph\"", "\"format\":\"onnx\""),
                      "not a tcap graph (format is string \"onnx\")");
  EXPECT_FORMAT_ERROR(edit(base, "\"format\":\"tcap.graph\",", ""),
                      "not a tcap graph (no \"format\" field)");
}

TEST_F(GraphJsonMalformed, MissingVersion) {
  EXPECT_FORMAT_ERROR(edit(base, "\"version\":1,", ""), "tcap.graph: missing field \"version\"");
}

TEST_F(GraphJsonMalformed, UnsupportedVersion) {
  EXPECT_FORMAT_ERROR(edit(base, "\"version\":1", "\"version\":2"),
                      "tcap.graph: unsupported version 2 (this build reads version 1)");
  EXPECT_FORMAT_ERROR(edit(base, "\"version\":1", "\"version\":\"1\""),
                      "version: expected a 64-bit integer, got string \"1\"");
}

TEST_F(GraphJsonMalformed, FieldWithWrongType) {
  EXPECT_FORMAT_ERROR(edit(base, "\"shape\":[4,3]", "\"shape\":\"abc\""),
                      "tcap.graph: values[0].shape: expected an array, got string \"abc\"");
  EXPECT_FORMAT_ERROR(edit(base, "\"requires_grad\":false", "\"requires_grad\":0"),
                      "values[0].requires_grad: expected true or false, got number 0");
  EXPECT_FORMAT_ERROR(edit(base, "\"storage_offset\":0", "\"storage_offset\":18446744073709551615"),
                      "values[0].storage_offset: expected a 64-bit integer");
  EXPECT_FORMAT_ERROR(edit(base, "\"storage_offset\":0", "\"storage_offset\":1.5"),
                      "values[0].storage_offset: expected a 64-bit integer, got number 1.5");
  EXPECT_FORMAT_ERROR(edit(base, "\"nodes\":[", "\"nodes\":{\"x\":0},\"old_nodes\":["),
                      "nodes: expected an array, got object");
  EXPECT_FORMAT_ERROR(edit(base, "\"torch_version\":\"2.11.0\"", "\"torch_version\":2"),
                      "meta.torch_version: expected a string, got number 2");
}

TEST_F(GraphJsonMalformed, DeepNestingDoesNotOverflowTheStack) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  // Padding keeps the document under the reader's structure limit (Note [Reader memory]).
  const std::string pad = "\"pad\":\"" + std::string(8 * deep.size(), 'x') + "\",";
  EXPECT_FORMAT_ERROR(edit(edit(base, "\"version\":1,", "\"version\":1," + pad), "\"shape\":[4,3]",
                           "\"shape\":" + deep),
                      "values[0].shape[0]: expected a 64-bit integer, got array of size 1");
  EXPECT_EQ(error_of(edit(base, "\"version\":1,", "\"version\":1," + pad + "\"future\":" + deep + ",")), "");
}

TEST_F(GraphJsonMalformed, MissingField) {
  EXPECT_FORMAT_ERROR(edit(base, "\"device\":\"cpu\",", ""), "values[0]: missing field \"device\"");
  EXPECT_FORMAT_ERROR(edit(base, "\"op\":\"aten::t\",", ""), "nodes[3]: missing field \"op\"");
}

TEST_F(GraphJsonMalformed, UnknownEnumNames) {
  EXPECT_FORMAT_ERROR(edit(base, "\"kind\":\"call\"", "\"kind\":\"cal\""),
                      "nodes[3].kind: unknown node kind \"cal\" (expected one of: input, call, "
                      "call_hook, output)");
  EXPECT_FORMAT_ERROR(
      edit(base, "{\"kind\":\"value\",\"name\":\"self\"", "{\"kind\":\"foo\",\"name\":\"self\""),
      "nodes[3].args[0].kind: unknown arg kind \"foo\"");
  EXPECT_FORMAT_ERROR(edit(base, "\"dtype\":\"float32\"", "\"dtype\":\"float33\""),
                      "values[0].dtype: unknown dtype \"float33\"");
  EXPECT_FORMAT_ERROR(edit(base, "\"input_kind\":\"user_input\"", "\"input_kind\":\"user\""),
                      "nodes[0].input_kind: unknown input kind \"user\"");
  EXPECT_FORMAT_ERROR(edit(base, "\"device\":\"cpu\"", "\"device\":\"gpu:0\""),
                      "values[0].device: invalid device \"gpu:0\"");
}

TEST_F(GraphJsonMalformed, DanglingIds) {
  EXPECT_FORMAT_ERROR(edit(base, "{\"kind\":\"value\",\"name\":\"self\",\"value\":1}",
                           "{\"kind\":\"value\",\"name\":\"self\",\"value\":99}"),
                      "nodes[3].args[0].value: 99 is out of range (the graph has 7 values)");
  EXPECT_FORMAT_ERROR(edit(base, "\"producer\":0", "\"producer\":9"),
                      "values[0].producer: 9 is out of range (the graph has 8 nodes)");
  EXPECT_FORMAT_ERROR(edit(base, "\"view_of\":1", "\"view_of\":-5"),
                      "values[3].view_of: -5 is out of range");
}

TEST_F(GraphJsonMalformed, NonDenseIds) {
  EXPECT_FORMAT_ERROR(edit(base, "{\"id\":1,\"producer\":1", "{\"id\":7,\"producer\":1"),
                      "values[1]: id is 7, expected 1 (ids must be dense");
  EXPECT_FORMAT_ERROR(edit(base, "{\"id\":2,\"kind\":\"input\"", "{\"id\":3,\"kind\":\"input\""),
                      "nodes[2]: id is 3, expected 2");
}

TEST_F(GraphJsonMalformed, FailsVerify) {
  // addmm (node 4) reading relu_'s result (value 5, made by node 5): out of order.
  EXPECT_FORMAT_ERROR(edit(base, "{\"kind\":\"value\",\"name\":\"mat1\",\"value\":0}",
                           "{\"kind\":\"value\",\"name\":\"mat1\",\"value\":5}"),
                      "tcap.graph: graph fails verify(): ");
}

TEST(GraphJsonFiles, MissingFile) {
  try {
    load_json("/nonexistent/graph.json");
    FAIL() << "no error";
  } catch (const GraphFormatError& e) {
    EXPECT_STREQ(e.what(),
                 "tcap.graph: cannot open /nonexistent/graph.json: No such file or directory");
  }
}

TEST(GraphJsonFiles, ErrorsNameTheFile) {
  const std::string path = ::testing::TempDir() + "broken_graph.json";
  std::ofstream(path) << "{\"format\": \"tcap.graph\", \"version\": 7}";
  try {
    load_json(path);
    FAIL() << "no error";
  } catch (const GraphFormatError& e) {
    EXPECT_EQ(std::string(e.what()),
              "tcap.graph: " + path + ": unsupported version 7 (this build reads version 1)");
  }
}

TEST(GraphJsonFiles, SaveToUnwritablePathThrows) {
  EXPECT_THROW(save_json(Graph{}, "/nonexistent/dir/g.json"), std::runtime_error);
}

// Forward compatibility: readers ignore keys they do not know.
TEST_F(GraphJsonMalformed, IgnoresUnknownKeys) {
  std::string text = edit(base, "\"version\":1,", "\"version\":1,\"future\":{\"x\":[1]},");
  text = edit(text, "\"shape\":[4,3]", "\"shape\":[4,3],\"sparse_dim\":2");
  EXPECT_TRUE(from_json_string(text) == mlp_forward());
}

// Never crashes: every prefix and many one-byte corruptions give a GraphFormatError
// or (rarely) another valid graph, nothing else.
TEST_F(GraphJsonMalformed, CorruptionsNeverCrash) {
  for (size_t n = 0; n < base.size(); ++n) {
    EXPECT_THROW(from_json_string(base.substr(0, n)), GraphFormatError) << n;
  }
  for (size_t at = 0; at < base.size(); ++at) {
    for (char c : {'9', '-', '"', '}'}) {
      std::string text = base;
      text[at] = c;
      try {
        from_json_string(text);
      } catch (const GraphFormatError& e) {
        ASSERT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace tcap::ir
