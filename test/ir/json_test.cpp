// Graph JSON: exact round trips and golden files (malformed input: json_malformed_test.cpp).
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
#include "ir/json_sample_graphs.h"

namespace tcap::ir {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

using namespace tcap::ir::testing;

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

}  // namespace
}  // namespace tcap::ir
