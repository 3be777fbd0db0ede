// verify() checks every argument of a call against its operator's schema (Note
// [Arguments against the schema], csrc/ir/verify_args.cpp), CallHook nodes against what
// the interpreter reads, and tensor metadata: a graph that verifies does not crash the
// interpreter.
#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <tcap/graph.h>
#include <tcap/graph_json.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ir/contiguous_meta.h"

namespace tcap::ir {
namespace {

using tcap::ir::testing::contiguous_meta;
using tcap::ir::testing::edit;
using tcap::ir::testing::error_of;
using tcap::ir::testing::meta;

Arg make(ArgKind kind, std::string name, int64_t i = 0) {
  Arg a;
  a.kind = kind;
  a.name = std::move(name);
  a.i = i;
  return a;
}

// x -> op(args with x as "self" first) -> one tensor result.
Graph one_call(const std::string& op, const std::string& overload, std::vector<Arg> rest,
               std::vector<int64_t> result_sizes = {}) {
  Graph g;
  const ValueId x = g.add_input(InputKind::UserInput, "x", meta({2, 3}));
  Node n;
  n.kind = NodeKind::Call;
  n.op = op;
  n.overload = overload;
  n.args = {Arg::value(x, "self")};
  for (Arg& a : rest) n.args.push_back(std::move(a));
  const ValueId y = g.new_value(1, 0, -1, meta(std::move(result_sizes)));
  n.outputs = {Arg::value(y)};
  g.add_node(n);
  g.set_outputs({y}, {"y"}, {OutputKind::User});
  return g;
}

// aten::sum(Tensor self, *, ScalarType? dtype=None) -> Tensor
Graph sum_with_dtype(Arg dtype) { return one_call("aten::sum", "", {std::move(dtype)}); }

std::string verify_error(const Graph& g) {
  try {
    verify(g);
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    return msg.substr(0, msg.find('\n'));
  }
  return "";
}

#define EXPECT_VERIFY_FAILS(g, substring)                                              \
  do {                                                                                 \
    const std::string msg_ = verify_error(g);                                          \
    EXPECT_NE(msg_.find(substring), std::string::npos) << "expected: " << (substring) \
                                                       << "\n got: " << msg_;         \
  } while (0)

TEST(VerifyArgs, AcceptsWhatCaptureRecords) {
  EXPECT_EQ(verify_error(sum_with_dtype(Arg::none("dtype"))), "");
  EXPECT_EQ(verify_error(sum_with_dtype(make(ArgKind::ScalarType, "dtype", static_cast<int64_t>(c10::kDouble)))), "");
  // aten::ones_like(Tensor self, *, ScalarType? dtype, Layout? layout, Device? device,
  //                 bool? pin_memory, MemoryFormat? memory_format)
  Arg device = make(ArgKind::Device, "device");
  device.s = "cpu";
  EXPECT_EQ(verify_error(one_call("aten::ones_like", "",
                                  {make(ArgKind::ScalarType, "dtype", static_cast<int64_t>(c10::kHalf)),
                                   make(ArgKind::Layout, "layout", 0), device, Arg::boolean(false, "pin_memory"),
                                   make(ArgKind::MemoryFormat, "memory_format", 1)},
                                  {2, 3})),
            "");
}

// An int where ScalarType? is declared went straight into the kernel: a segfault.
TEST(VerifyArgs, ScalarTypeOutOfRange) {
  for (int64_t bad : {int64_t{-1}, int64_t{65535}, std::numeric_limits<int64_t>::max(),
                      static_cast<int64_t>(c10::ScalarType::Undefined)}) {
    EXPECT_VERIFY_FAILS(sum_with_dtype(Arg::integer(bad, "dtype")),
                        "node 1 (call aten::sum) arg 1 (dtype) is " + std::to_string(bad) + ", not a valid dtype");
    EXPECT_VERIFY_FAILS(sum_with_dtype(make(ArgKind::ScalarType, "dtype", bad)), "not a valid dtype");
  }
  EXPECT_EQ(verify_error(sum_with_dtype(Arg::integer(static_cast<int64_t>(c10::kInt), "dtype"))), "");
}

TEST(VerifyArgs, LayoutMemoryFormatAndDeviceOutOfRange) {
  auto ones_like = [](Arg layout, Arg device, Arg format) {
    return one_call("aten::ones_like", "",
                    {Arg::none("dtype"), std::move(layout), std::move(device), Arg::none("pin_memory"),
                     std::move(format)},
                    {2, 3});
  };
  EXPECT_VERIFY_FAILS(ones_like(make(ArgKind::Layout, "layout", 8), Arg::none(), Arg::none()),
                      "arg 2 (layout) is 8, not a valid layout (0 to 7)");
  EXPECT_VERIFY_FAILS(ones_like(Arg::none(), Arg::none(), make(ArgKind::MemoryFormat, "memory_format", -3)),
                      "arg 5 (memory_format) is -3, not a valid memory format");
  Arg gpu = make(ArgKind::Device, "device");
  gpu.s = "gpu:0";
  EXPECT_VERIFY_FAILS(ones_like(Arg::none(), gpu, Arg::none()), "arg 3 (device) is not a valid device");
}

TEST(VerifyArgs, KindsThatDoNotFitTheDeclaredType) {
  EXPECT_VERIFY_FAILS(sum_with_dtype(Arg::real(1.5, "dtype")),
                      "arg 1 (dtype) is double, which cannot be passed as ScalarType?");
  // aten::mul.Tensor(Tensor self, Tensor other)
  EXPECT_VERIFY_FAILS(one_call("aten::mul", "Tensor", {Arg::integer(2, "other")}, {2, 3}),
                      "arg 1 (other) is int, which cannot be passed as Tensor");
  EXPECT_VERIFY_FAILS(one_call("aten::mul", "Tensor", {Arg::none("other")}, {2, 3}),
                      "arg 1 (other) is None, but Tensor is not optional");
  // aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1): a Scalar takes numbers.
  Graph add = one_call("aten::add", "Tensor", {Arg::value(0, "other"), Arg::real(0.5, "alpha")}, {2, 3});
  EXPECT_EQ(verify_error(add), "");
  add.edit_node(1, [&](auto& n) { n.args[2] = Arg::value(0, "alpha"); });
  EXPECT_VERIFY_FAILS(add, "arg 2 (alpha) is value, which cannot be passed as Scalar");
}

TEST(VerifyArgs, Lists) {
  // aten::sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None)
  auto sum_dim = [](Arg dim) {
    return one_call("aten::sum", "dim_IntList", {std::move(dim), Arg::boolean(false, "keepdim"), Arg::none("dtype")},
                    {2});
  };
  Arg dims = make(ArgKind::IntList, "dim");
  dims.ints = {1, 0};
  EXPECT_EQ(verify_error(sum_dim(dims)), "");
  EXPECT_EQ(verify_error(sum_dim(Arg::integer(1, "dim"))), "");  // one int for an int[1]
  EXPECT_EQ(verify_error(sum_dim(Arg::value_list({}, true, "dim"))), "");  // capture's empty list
  EXPECT_VERIFY_FAILS(sum_dim(Arg::value_list({0}, true, "dim")), "arg 1 (dim) is opt_value_list");
  Arg doubles = make(ArgKind::DoubleList, "dim");
  doubles.doubles = {1.0};
  EXPECT_VERIFY_FAILS(sum_dim(doubles), "arg 1 (dim) is double_list, which cannot be passed as int[]?");
  // aten::cat(Tensor[] tensors, int dim=0): no None entries.
  Graph cat;
  const ValueId x = cat.add_input(InputKind::UserInput, "x", meta({2}));
  Node n;
  n.kind = NodeKind::Call;
  n.op = "aten::cat";
  n.args = {Arg::value_list({x, kNoValue}, true, "tensors"), Arg::integer(0, "dim")};
  n.outputs = {Arg::value(cat.new_value(1, 0, -1, meta({4})))};
  cat.add_node(n);
  EXPECT_VERIFY_FAILS(cat, "arg 0 (tensors) has a None entry, but Tensor[] holds tensors");
  cat.edit_node(1, [&](auto& n) { n.args[0] = Arg::value_list({x, x}, true, "tensors"); });
  EXPECT_EQ(verify_error(cat), "");
}

TEST(VerifyArgs, FixedLengthBoolLists) {
  // aten::native_layer_norm_backward(..., bool[3] output_mask)
  Graph g;
  std::vector<ValueId> in;
  for (int k = 0; k < 5; ++k) in.push_back(g.add_input(InputKind::UserInput, "in" + std::to_string(k), meta({2, 3})));
  Node n;
  n.kind = NodeKind::Call;
  n.op = "aten::native_layer_norm_backward";
  Arg shape = make(ArgKind::IntList, "normalized_shape");
  shape.ints = {3};
  Arg mask = make(ArgKind::BoolList, "output_mask");
  mask.ints = {1, 1};
  n.args = {Arg::value(in[0], "grad_out"), Arg::value(in[1], "input"), shape, Arg::value(in[2], "mean"),
            Arg::value(in[3], "rstd"), Arg::value(in[4], "weight"), Arg::none("bias"), mask};
  for (int r = 0; r < 3; ++r) n.outputs.push_back(Arg::value(g.new_value(5, r, -1, meta({2, 3}))));
  g.add_node(n);
  EXPECT_VERIFY_FAILS(g, "arg 7 (output_mask) has 2 entries, but bool[3] needs 3");
  g.edit_node(5, [&](auto& n) { n.args[7].ints = {1, 0, 1}; });
  EXPECT_EQ(verify_error(g), "");
}

TEST(VerifyArgs, Results) {
  Graph g = one_call("aten::relu", "", {}, {2, 3});
  g.edit_node(1, [&](auto& n) { n.outputs[0].kind = ArgKind::ValueList; });
  g.value(1).list_index = 0;
  EXPECT_VERIFY_FAILS(g, "output 0 is value_list, which cannot be passed as Tensor");
  // A result past the schema's: only the new version of a mutated argument.
  Graph extra = one_call("aten::relu", "", {}, {2, 3});
  extra.edit_node(1, [&](auto& n) { n.outputs.push_back(Arg::value(extra.new_value(1, 1, -1, meta({2, 3})))); });
  EXPECT_VERIFY_FAILS(extra, "output 1 is past the schema's 1 results but is not the new version");
  extra.value(2).version_of = 0;
  EXPECT_EQ(verify_error(extra), "");
}

// Another LibTorch's schema (another number of arguments) and unknown operators are left
// to the interpreter, which refuses them by name: such graphs still load and print.
TEST(VerifyArgs, UnknownOperatorsAndOtherVersionsAreNotChecked) {
  EXPECT_EQ(verify_error(one_call("aten::sum", "", {Arg::integer(-1, "dtype"), Arg::integer(7, "extra")})), "");
  EXPECT_EQ(verify_error(one_call("test::not_an_op", "", {Arg::integer(-1, "dtype")})), "");
}

TEST(VerifyArgs, TensorMetadata) {
  Graph g = sum_with_dtype(Arg::none("dtype"));
  g.value(0).meta.sizes = {-2, 3};  // strides {3, 1}
  EXPECT_VERIFY_FAILS(g, "value %0 has a negative size -2");
  g.value(0).meta.sizes = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_VERIFY_FAILS(g, "value %0 has sizes whose product overflows int64_t");
  g.value(0).meta.sizes = {0, int64_t{1} << 40};  // no elements, but a partial product still fits
  EXPECT_EQ(verify_error(g), "");
  g.value(0).meta.sizes = {0, int64_t{1} << 40, int64_t{1} << 40};
  g.value(0).meta.strides = {0, 0, 1};
  EXPECT_VERIFY_FAILS(g, "overflows");
  g.value(0).meta.sizes = {2, 3};
  g.value(0).meta.strides = {3};
  EXPECT_VERIFY_FAILS(g, "value %0 has 2 sizes but 1 strides");
  g.value(0).meta.strides = {};  // a layout without strides
  EXPECT_EQ(verify_error(g), "");
  g.value(0).meta.storage_offset = -1;
  EXPECT_VERIFY_FAILS(g, "value %0 has a negative storage offset -1");
}

// verify() prints the graph it refuses, so the printer reads metadata it has not checked:
// the fuzzer found is_contiguous() multiplying INT64_MIN by 1024 (undefined behaviour).
TEST(VerifyArgs, RefusedMetadataIsPrintedSafely) {
  Graph g = sum_with_dtype(Arg::none("dtype"));
  g.value(0).meta.sizes = {std::numeric_limits<int64_t>::min(), 1024};
  g.value(0).meta.strides = {1024, 1};
  EXPECT_FALSE(g.value(0).meta.is_contiguous());
  EXPECT_EQ(g.value(0).meta.numel(), std::numeric_limits<int64_t>::max());
  EXPECT_VERIFY_FAILS(g, "value %0 has a negative size");
  g.value(0).meta.strides = {1};
  EXPECT_FALSE(g.value(0).meta.is_contiguous());
}

// A CallHook node the interpreter could not read: the checked-in golden graph had one
// (one Value arg, no results), and replaying it threw std::out_of_range naming no node.
TEST(VerifyArgs, CallHookShapes) {
  Graph g;
  const int recorded = g.add_hook(HookKind::TensorPreHook, "MulBackward0");
  const int by_slot = g.add_hook(HookKind::TensorPreHook, "MulBackward0", 0);
  const ValueId x = g.add_input(InputKind::Tangent, "g", meta({3}));
  Node h;
  h.kind = NodeKind::CallHook;
  h.hook = recorded;
  h.phase = Phase::Backward;
  h.args = {Arg::value(x)};
  h.outputs = {Arg::value_list({g.new_value(1, 0, 0, meta({3}))}, true)};
  g.add_node(h);
  EXPECT_VERIFY_FAILS(g, "node 1 (call_hook #0) passes its recorded hook body on and must have two args");
  g.edit_node(1, [&](auto& n) { n.args = {Arg::value_list({x}, true, "inputs"), Arg::value_list({}, true, "results")}; });
  EXPECT_VERIFY_FAILS(g, "node 1 (call_hook #0) has 0 results but 1 outputs");
  g.edit_node(1, [&](auto& n) { n.args[1] = Arg::value_list({kNoValue}, true, "results"); });
  EXPECT_VERIFY_FAILS(g, "node 1 (call_hook #0) output 0 is a value but its result is None");
  g.edit_node(1, [&](auto& n) { n.args[1] = Arg::value_list({x}, true, "results"); });
  EXPECT_EQ(verify_error(g), "");
  g.edit_node(1, [&](auto& n) { n.hook = by_slot; });  // called by slot: inputs (and node inputs) only
  EXPECT_EQ(verify_error(g), "");
  g.edit_node(1, [&](auto& n) { n.args.push_back(Arg::value_list({x}, true)); });
  EXPECT_VERIFY_FAILS(g, "node 1 (call_hook #1) calls hook slot 0 and must have one or two args");
}

// The JSON reader runs verify(): the user's sum(dtype=-1) file no longer loads.
TEST(VerifyArgs, ReaderRefusesIntWhereScalarTypeIsDeclared) {
  const std::string text = to_json_string(sum_with_dtype(Arg::integer(65535, "dtype")));
  try {
    from_json_string(text);
    FAIL() << "loaded";
  } catch (const GraphFormatError& e) {
    EXPECT_NE(std::string(e.what()).find("graph fails verify(): tcap: verify failed: node 1 (call aten::sum) arg 1 "
                                         "(dtype) is 65535, not a valid dtype"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tcap::ir
