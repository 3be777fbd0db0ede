// Graphs built by hand for the graph JSON tests (json_test.cpp, json_malformed_test.cpp):
// one of every argument kind, an MLP forward, a backward with hooks.
#pragma once

#include <tcap/graph.h>

#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ir/contiguous_meta.h"

namespace tcap::ir::testing {


using tcap::ir::testing::contiguous_meta;
using tcap::ir::testing::edit;
using tcap::ir::testing::error_of;
using tcap::ir::testing::meta;

// Appends `n` with one Value result per entry of `results`; returns the result ids.
inline std::vector<ValueId> add_call(Graph& g, Node n, std::vector<TensorMeta> results) {
  const auto id = static_cast<NodeId>(g.nodes().size());
  for (size_t k = 0; k < results.size(); ++k) {
    n.outputs.push_back(Arg::value(g.new_value(id, static_cast<int>(k), -1, results[k])));
  }
  std::vector<ValueId> out;
  for (const Arg& a : n.outputs) out.push_back(a.values[0]);
  g.add_node(std::move(n));
  return out;
}

inline Node call(std::string op, std::string overload, std::vector<Arg> args) {
  Node n;
  n.kind = NodeKind::Call;
  n.op = std::move(op);
  n.overload = std::move(overload);
  n.args = std::move(args);
  return n;
}

inline Arg make_arg(ArgKind kind, std::string name = {}) {
  Arg a;
  a.kind = kind;
  a.name = std::move(name);
  return a;
}
inline Arg complex_arg(double re, double im) {
  Arg a = make_arg(ArgKind::Complex);
  a.d = re;
  a.d_imag = im;
  return a;
}
inline Arg string_arg(std::string s, std::string name = {}) {
  Arg a = make_arg(ArgKind::String, std::move(name));
  a.s = std::move(s);
  return a;
}
inline Arg int_list(std::vector<int64_t> v, std::string name = {}) {
  Arg a = make_arg(ArgKind::IntList, std::move(name));
  a.ints = std::move(v);
  return a;
}
inline Arg double_list(std::vector<double> v) {
  Arg a = make_arg(ArgKind::DoubleList);
  a.doubles = std::move(v);
  return a;
}
inline Arg bool_list(std::vector<int64_t> v) {
  Arg a = make_arg(ArgKind::BoolList);
  a.ints = std::move(v);
  return a;
}
inline Arg enum_arg(ArgKind kind, int64_t raw, std::string name = {}) {
  Arg a = make_arg(kind, std::move(name));
  a.i = raw;
  return a;
}
inline Arg device_arg(std::string device) {
  Arg a = make_arg(ArgKind::Device, "device");
  a.s = std::move(device);
  return a;
}
// See graph.h: integral (and bool) wrapped numbers live in i, the others in d (+ d_imag).
inline Arg wrapped(c10::ScalarType dtype, double d, int64_t i = 0, double imag = 0.0) {
  Arg a = make_arg(ArgKind::WrappedScalar, "other");
  a.i2 = static_cast<int64_t>(dtype);
  a.d = d;
  a.i = i;
  a.d_imag = imag;
  return a;
}
inline Arg opaque(std::string type) {
  Arg a = make_arg(ArgKind::Opaque, "generator");
  a.s = std::move(type);
  return a;
}

// Golden graph 1: a small forward pass with a view (t), an in-place op (relu_) and a
// reduction, with schemas and meta.
inline Graph mlp_forward() {
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
inline Graph backward_with_hooks() {
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
inline Graph every_arg_kind() {
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

}  // namespace tcap::ir::testing
