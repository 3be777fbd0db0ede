// tcap::export_program (include/tcap/export.h): a LibTorch function recorded by capture,
// lowered to functional ATen ops and written as a PT2 archive that torch.export.load,
// AOTInductor and nativert read (docs/export.md).
#include <tcap/capture.h>
#include <tcap/export.h>
#include <tcap/partition.h>

#include "export/pt2_schema.h"
#include "support/logging.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/nn/module.h>
#include <torch/version.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

namespace tcap {
namespace {

using pt2::Json;
using ir::ValueId;

struct Recording {
  ir::Graph graph;
  std::vector<at::Tensor> tensors;  // bound to the graph's Input nodes, in order
};

// A value handed to the host decides what the C++ code does next; a program has no host
// code, so it cannot be exported. One read is harmless: equal(x, x) is true whatever x holds
// (NaN aside), so the branch it decides is the one every call takes (LibTorch's
// MultiheadAttention asks it of self-attention).
void check_host_reads(const ir::Graph& g) {
  for (const ir::Node& n : g.nodes()) {
    if (n.kind != ir::NodeKind::Call) continue;
    bool host = false;
    for (const ir::Arg& r : n.outputs) host = host || ir::is_host_value(r);
    if (!host) continue;
    if (n.qualified_op() == "aten::equal" && n.args.size() == 2 && n.args[0].is_value() && n.args[1].is_value() &&
        n.args[0].values[0] == n.args[1].values[0]) {
      TCAP_LOG(Export, "equal(" << ir::describe(g, n.args[0].values[0])
                                << ", itself) read on the host: true for every input, left out");
      continue;
    }
    TORCH_CHECK(false, "tcap export: ", n.qualified_op(), " hands a value to the host (item(), equal(), a bool "
                "of a tensor): the C++ code can branch on it and a program cannot; compute it with tensor ops");
  }
}

// One run of fn under capture, eval mode and grad off already set by the caller.
Recording record(const std::shared_ptr<torch::nn::Module>& module, const ExportFn& fn,
                 const std::vector<at::Tensor>& inputs, const std::vector<std::string>& names) {
  CaptureOptions co;
  co.record_backward = false;
  CaptureGuard capture(co);
  if (module) capture.register_module(*module);
  std::vector<at::Tensor> in;
  for (size_t i = 0; i < inputs.size(); ++i) in.push_back(capture.input(inputs[i], names[i]));
  const std::vector<at::Tensor> outs = fn(in);
  TORCH_CHECK(!outs.empty(), "tcap export: the function returned no tensor");
  for (size_t k = 0; k < outs.size(); ++k) {
    TORCH_CHECK(outs[k].defined(), "tcap export: output ", k, " is an undefined tensor");
    capture.output(outs[k], "out" + std::to_string(k));
  }
  capture.stop();
  ir::Graph g = capture.graph();
  check_host_reads(g);
  // Ops whose results nothing reads (MultiheadAttention's averaged weights when the caller
  // drops them) are left out, as torch.export leaves them out.
  return {eliminate_dead_code(g), capture.input_tensors()};
}

// Note [Dynamic dims by linear fit]
// A size the user marks dynamic is found in the graph the way dynamo's automatic dynamic
// finds it: the function is recorded again with that size grown by one (an input made by
// appending its own first slice, so values stay valid indices and masks), and every integer
// of the graph that moved (a value's size, stride or offset, an integer argument) is taken
// as c + sum_j k_j * s_j, fitted from the records; a last record with every dynamic size
// grown by two checks the fit. Graphs whose ops differ between the records (a branch on a
// size) or an integer that is not linear in the sizes (s0*s1) are refused.
struct SymbolicInts {
  std::vector<std::string> symbols;  // s0, s1, ...
  std::vector<int64_t> base;         // each symbol's size in the example inputs
  // Keyed by slot ("v<id>.size<d>", "n<id>.a<i>.<j>"): coefficients per symbol, constant.
  struct Affine {
    std::vector<int64_t> k;
    int64_t c = 0;
  };
  std::map<std::string, Affine> slots;

  static std::string render(const Affine& a, const std::vector<std::string>& symbols) {
    std::ostringstream s;
    bool first = true;
    for (size_t j = 0; j < a.k.size(); ++j) {
      if (a.k[j] == 0) continue;
      if (!first) s << " + ";
      if (a.k[j] != 1) s << a.k[j] << "*";
      s << symbols[j];
      first = false;
    }
    if (a.c != 0 || first) {
      if (!first) s << (a.c < 0 ? " - " : " + ") << (a.c < 0 ? -a.c : a.c);
      else s << a.c;
    }
    return s.str();
  }
};

// Every integer of the graph that can depend on a size, by slot.
void collect_ints(const ir::Graph& g, std::map<std::string, int64_t>& out) {
  for (const ir::Value& v : g.values()) {
    const std::string p = "v" + std::to_string(v.id) + ".";
    for (size_t d = 0; d < v.meta.sizes.size(); ++d) out[p + "size" + std::to_string(d)] = v.meta.sizes[d];
    for (size_t d = 0; d < v.meta.strides.size(); ++d) out[p + "stride" + std::to_string(d)] = v.meta.strides[d];
    out[p + "offset"] = v.meta.storage_offset;
  }
  for (const ir::Node& n : g.nodes()) {
    if (n.kind != ir::NodeKind::Call) continue;
    for (size_t i = 0; i < n.args.size(); ++i) {
      const ir::Arg& a = n.args[i];
      const std::string p = "n" + std::to_string(n.id) + ".a" + std::to_string(i) + ".";
      if (a.kind == ir::ArgKind::Int) out[p + "0"] = a.i;
      if (a.kind == ir::ArgKind::IntList) {
        for (size_t j = 0; j < a.ints.size(); ++j) out[p + std::to_string(j)] = a.ints[j];
      }
    }
  }
}

std::string structure_of(const ir::Graph& g) {
  std::ostringstream s;
  for (const ir::Node& n : g.nodes()) {
    s << static_cast<int>(n.kind) << n.qualified_op() << ":" << n.args.size() << ":" << n.outputs.size() << ";";
  }
  s << "|" << g.values().size();
  return s.str();
}

at::Tensor grown(const at::Tensor& t, int64_t dim, int64_t by) {
  std::vector<at::Tensor> parts{t};
  for (int64_t i = 0; i < by; ++i) parts.push_back(t.narrow(dim, i % t.size(dim), 1));
  return at::cat(parts, dim);
}

SymbolicInts fit_dynamic_dims(const std::shared_ptr<torch::nn::Module>& module, const ExportFn& fn,
                              const std::vector<at::Tensor>& inputs, const std::vector<std::string>& names,
                              const std::vector<DynamicDim>& dims, const Recording& base) {
  SymbolicInts sym;
  std::map<std::string, int64_t> b;
  collect_ints(base.graph, b);
  const std::string shape = structure_of(base.graph);
  std::vector<std::map<std::string, int64_t>> moved;
  auto rerun = [&](const std::vector<int64_t>& growth, const char* why) {
    std::vector<at::Tensor> in = inputs;
    for (size_t j = 0; j < dims.size(); ++j) {
      if (growth[j] != 0) in[dims[j].input] = grown(in[dims[j].input], dims[j].dim, growth[j]);
    }
    Recording r = record(module, fn, in, names);
    TORCH_CHECK(structure_of(r.graph) == shape, "tcap export: the function records other ops when ", why,
                ": its code branches on that size; export it with that size static");
    std::map<std::string, int64_t> ints;
    collect_ints(r.graph, ints);
    TORCH_CHECK(ints.size() == b.size(), "tcap export: the graph's integers differ in number when ", why);
    return ints;
  };
  for (size_t j = 0; j < dims.size(); ++j) {
    const DynamicDim& d = dims[j];
    TORCH_CHECK(d.input < inputs.size(), "tcap export: dynamic dim ", j, " names input ", d.input, " of ",
                inputs.size());
    const at::Tensor& t = inputs[d.input];
    TORCH_CHECK(d.dim >= 0 && d.dim < t.dim(), "tcap export: dynamic dim ", j, " names dim ", d.dim, " of input ",
                d.input, ", which has ", t.dim());
    const int64_t n = t.size(d.dim);
    TORCH_CHECK(n >= 2 && n >= d.min && n <= d.max, "tcap export: input ", d.input, " has size ", n, " at dim ",
                d.dim, ", outside the dynamic range [", d.min, ", ", d.max, "] or below 2 (sizes 0 and 1 are "
                "special-cased by ATen, as torch.export's Dim does)");
    // Symbols are s0, s1, ... whatever the user calls the dim: AOTInductor's code generator
    // takes only names of that form for sizes (a symbol "batch" is left undeclared in its C++).
    sym.symbols.push_back("s" + std::to_string(j));
    sym.base.push_back(n);
    std::vector<int64_t> growth(dims.size(), 0);
    growth[j] = 1;
    moved.push_back(rerun(growth, ("input " + std::to_string(d.input) + "'s dim " + std::to_string(d.dim) +
                                   " grows").c_str()));
  }
  for (const auto& [slot, v0] : b) {
    SymbolicInts::Affine a;
    a.k.resize(dims.size());
    bool any = false;
    for (size_t j = 0; j < dims.size(); ++j) {
      a.k[j] = moved[j].at(slot) - v0;
      any = any || a.k[j] != 0;
    }
    if (!any) continue;
    a.c = v0;
    for (size_t j = 0; j < dims.size(); ++j) a.c -= a.k[j] * sym.base[j];
    sym.slots[slot] = a;
  }
  const auto check = rerun(std::vector<int64_t>(dims.size(), 2), "every dynamic size grows by two");
  for (const auto& [slot, v0] : b) {
    auto it = sym.slots.find(slot);
    int64_t predicted = v0;
    if (it != sym.slots.end()) {
      predicted = it->second.c;
      for (size_t j = 0; j < dims.size(); ++j) predicted += it->second.k[j] * (sym.base[j] + 2);
    }
    TORCH_CHECK(check.at(slot) == predicted, "tcap export: an integer of the graph (", slot,
                ") is not linear in the dynamic sizes (", predicted, " expected, ", check.at(slot),
                " seen): export with those sizes static");
  }
  return sym;
}

// The serialized graph being built: value names, tensor metadata, symbolic integers and
// nodes, filled by lower() and the rewrites of Note [Export lowering].
struct Writer {
  Writer(const ir::Graph& graph, const SymbolicInts& ints) : g(graph), sym(ints) {}

  std::string value_name(ValueId v) const {
    auto it = names.find(v);
    TORCH_INTERNAL_ASSERT(it != names.end(), "tcap export: value %", v, " has no name");
    return it->second;
  }
  void name_value(ValueId v, const std::string& name) {
    names[v] = name;
    tensor_values[name] = meta_json(v);
  }
  void alias(ValueId v, ValueId to) { names[v] = value_name(to); }
  std::string fresh(const std::string& base) {
    std::string clean;
    for (char c : base) clean += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    if (clean.empty() || std::isdigit(static_cast<unsigned char>(clean[0]))) clean = "v_" + clean;
    int& k = used[clean];
    std::string name = k == 0 ? clean : clean + "_" + std::to_string(k);
    ++k;
    while (used.count(name) && name != clean) name += "_";
    used[name];
    return name;
  }

  Json sym_or_int(const std::string& slot, int64_t v) const {
    auto it = sym.slots.find(slot);
    if (it == sym.slots.end()) return Json{{"as_int", v}};
    return Json{{"as_expr", {{"expr_str", SymbolicInts::render(it->second, sym.symbols)}, {"hint", {{"as_int", v}}}}}};
  }

  Json meta_json(ValueId v) const {
    const ir::Value& val = g.value(v);
    const ir::TensorMeta& m = val.meta;
    const std::string p = "v" + std::to_string(v) + ".";
    Json j;
    j["dtype"] = pt2::dtype_code(m.dtype);
    Json sizes = Json::array(), strides = Json::array();
    for (size_t d = 0; d < m.sizes.size(); ++d) sizes.push_back(sym_or_int(p + "size" + std::to_string(d), m.sizes[d]));
    for (size_t d = 0; d < m.strides.size(); ++d) {
      strides.push_back(sym_or_int(p + "stride" + std::to_string(d), m.strides[d]));
    }
    j["sizes"] = std::move(sizes);
    j["requires_grad"] = false;
    j["device"] = pt2::device_json(m.device);
    j["strides"] = std::move(strides);
    j["storage_offset"] = sym_or_int(p + "offset", m.storage_offset);
    j["layout"] = 7;
    return j;
  }

  // A symbolic integer argument: the name of a sym value holding expression `slot`.
  Json sym_int_arg(const SymbolicInts::Affine& a, int64_t hint) {
    const std::string expr = SymbolicInts::render(a, sym.symbols);
    auto it = sym_names.find(expr);
    if (it != sym_names.end()) return Json{{"as_name", it->second}};
    // c + sum k_j s_j from the sizes read with sym_size (made once per symbol), then
    // operator.mul / operator.add nodes, as torch.export writes symbolic arithmetic.
    std::string acc;
    int64_t acc_hint = 0;
    for (size_t j = 0; j < a.k.size(); ++j) {
      if (a.k[j] == 0) continue;
      std::string term = symbol_names.at(j);
      int64_t term_hint = sym.base[j];
      if (a.k[j] != 1) {
        term_hint *= a.k[j];
        term = sym_node("_operator.mul", Json{{"as_sym_int", {{"as_name", term}}}}, Json{{"as_int", a.k[j]}},
                        render_prefix(a, j, true), term_hint);
      }
      if (acc.empty()) {
        acc = term;
        acc_hint = term_hint;
      } else {
        acc_hint += term_hint;
        acc = sym_node("_operator.add", Json{{"as_sym_int", {{"as_name", acc}}}}, Json{{"as_sym_int", {{"as_name", term}}}},
                       render_prefix(a, j, false), acc_hint);
      }
    }
    if (a.c != 0) {
      acc_hint += a.c;
      acc = sym_node("_operator.add", Json{{"as_sym_int", {{"as_name", acc}}}}, Json{{"as_int", a.c}}, expr, acc_hint);
    }
    TORCH_INTERNAL_ASSERT(acc_hint == hint, "tcap export: symbolic integer ", expr, " hints ", acc_hint, ", not ", hint);
    sym_names[expr] = acc;
    return Json{{"as_name", acc}};
  }

  // The expression of a's terms up to j (k_j * s_j alone when `only_term`).
  std::string render_prefix(const SymbolicInts::Affine& a, size_t j, bool only_term) const {
    SymbolicInts::Affine p;
    p.k.assign(a.k.size(), 0);
    for (size_t i = only_term ? j : 0; i <= j; ++i) p.k[i] = a.k[i];
    return SymbolicInts::render(p, sym.symbols);
  }

  std::string sym_node(const std::string& target, Json a, Json b, const std::string& expr, int64_t hint) {
    auto it = sym_names.find(expr);
    if (it != sym_names.end()) return it->second;
    const std::string name = fresh(target == "_operator.mul" ? "mul" : "add");
    Json n;
    n["target"] = target;
    n["inputs"] = Json::array({Json{{"name", "a"}, {"arg", std::move(a)}, {"kind", 1}},
                               Json{{"name", "b"}, {"arg", std::move(b)}, {"kind", 1}}});
    n["outputs"] = Json::array({Json{{"as_sym_int", {{"as_name", name}}}}});
    n["metadata"] = Json::object();
    n["is_hop_single_tensor_return"] = nullptr;
    n["name"] = name;
    nodes.push_back(std::move(n));
    sym_int_values[name] = Json{{"as_expr", {{"expr_str", expr}, {"hint", {{"as_int", hint}}}}}};
    sym_names[expr] = name;
    return name;
  }

  // sym_size nodes reading each dynamic size from its input, first in the graph.
  void add_symbol_reads(const std::vector<DynamicDim>& dims, const std::vector<ValueId>& user_inputs) {
    for (size_t j = 0; j < dims.size(); ++j) {
      const std::string name = fresh("sym_size_int");
      Json n;
      n["target"] = "torch.ops.aten.sym_size.int";
      n["inputs"] = Json::array({Json{{"name", "self"}, {"arg", {{"as_tensor", {{"name", value_name(user_inputs.at(dims[j].input))}}}}}, {"kind", 1}},
                                 Json{{"name", "dim"}, {"arg", {{"as_int", dims[j].dim}}}, {"kind", 1}}});
      n["outputs"] = Json::array({Json{{"as_sym_int", {{"as_name", name}}}}});
      n["metadata"] = Json::object();
      n["is_hop_single_tensor_return"] = nullptr;
      n["name"] = name;
      nodes.push_back(std::move(n));
      sym_int_values[name] = Json{{"as_expr", {{"expr_str", sym.symbols[j]}, {"hint", {{"as_int", sym.base[j]}}}}}};
      symbol_names.push_back(name);
      sym_names[sym.symbols[j]] = name;
    }
  }

  const ir::Graph& g;
  const SymbolicInts& sym;
  std::unordered_map<ValueId, std::string> names;
  std::map<std::string, int> used;
  Json tensor_values = Json::object();
  Json sym_int_values = Json::object();
  Json nodes = Json::array();
  std::vector<std::string> symbol_names;
  std::map<std::string, std::string> sym_names;  // expression -> sym value name
};

bool is_sym_int_type(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::SymIntType) return true;
  if (auto l = t->cast<c10::ListType>()) return l->getElementType()->kind() == c10::TypeKind::SymIntType;
  if (auto o = t->cast<c10::OptionalType>()) return is_sym_int_type(o->getElementType());
  return false;
}

// Note [Export lowering]
// Capture records what LibTorch runs below autograd: CompositeImplicitAutograd ops are
// already decomposed (linear is t + addmm, batch_norm in eval is
// _native_batch_norm_legit_no_training). Writing the program in the functional core ATen
// IR that torch.export's run_decompositions gives takes a few rewrites here:
// - an in-place op (relu_, add_) becomes its functional form (relu, add) when it writes a
//   value made inside the graph that nothing else aliases afterwards; the recorder already
//   gave the written result a new value, so later readers read the functional result.
//   Writing into an input, a parameter, a buffer or a view (or into a value whose other
//   views are read later) is refused: the program would lose that write.
// - t and transpose become permute, _unsafe_view view, zeros full, split and unsafe_split
//   one slice per result (a static size), unbind one select per result, stack unsqueeze + cat
//   (static sizes), native_batch_norm in eval _native_batch_norm_legit_no_training;
//   detach, alias and lift_fresh become their input (no op in a program without autograd).
// Every other op is written as recorded; those LibTorch does not tag core are named in
// the export log line and the ExportReport (AOTInductor and torch.export.load accept them).
struct Lowered {
  Json graph;
  Json signature;
  Json range_constraints;
  Json weights_config;
  Json constants_config;
  std::vector<std::pair<std::string, std::string>> files;  // record -> bytes
  ExportReport report;
};

Json scalar_arg(const ir::Arg& a) {
  // A wrapped number: ATen promoted a C++ scalar; Python passes the number itself.
  if (c10::isIntegralType(static_cast<c10::ScalarType>(a.i2), /*includeBool=*/true)) {
    if (static_cast<c10::ScalarType>(a.i2) == c10::kBool) return Json{{"as_bool", a.i != 0}};
    return Json{{"as_int", a.i}};
  }
  return Json{{"as_float", a.d}};
}

}  // namespace

namespace {

Json arg_json(Writer& w, const ir::Node& n, size_t i, const c10::Argument& schema_arg) {
  const ir::Arg& a = n.args[i];
  const std::string slot = "n" + std::to_string(n.id) + ".a" + std::to_string(i) + ".";
  auto tensor = [&](ValueId v) { return Json{{"as_tensor", {{"name", w.value_name(v)}}}}; };
  const bool sym_type = is_sym_int_type(schema_arg.real_type());
  auto int_or_sym = [&](const std::string& s, int64_t v, bool& symbolic) -> Json {
    auto it = w.sym.slots.find(s);
    if (it == w.sym.slots.end()) return Json{{"as_int", v}};
    TORCH_CHECK(sym_type, "tcap export: argument '", schema_arg.name(), "' of ", n.qualified_op(),
                " depends on a dynamic size but the op takes a static int there: export with that size static");
    symbolic = true;
    return w.sym_int_arg(it->second, v);
  };
  switch (a.kind) {
    case ir::ArgKind::None:
    case ir::ArgKind::UndefinedTensor: return Json{{"as_none", true}};
    case ir::ArgKind::Value: return tensor(a.values.at(0));
    case ir::ArgKind::ValueList: {
      Json l = Json::array();
      for (ValueId v : a.values) l.push_back(Json{{"name", w.value_name(v)}});
      return Json{{"as_tensors", std::move(l)}};
    }
    case ir::ArgKind::OptValueList: {
      Json l = Json::array();
      for (ValueId v : a.values) {
        l.push_back(v == ir::kNoValue ? Json{{"as_none", true}} : Json{{"as_tensor", {{"name", w.value_name(v)}}}});
      }
      return Json{{"as_optional_tensors", std::move(l)}};
    }
    case ir::ArgKind::Bool: return Json{{"as_bool", a.i != 0}};
    case ir::ArgKind::Int: {
      bool symbolic = false;
      Json v = int_or_sym(slot + "0", a.i, symbolic);
      return symbolic ? Json{{"as_sym_int", std::move(v)}} : v;
    }
    case ir::ArgKind::Double: return Json{{"as_float", a.d}};
    case ir::ArgKind::Complex: return Json{{"as_complex", {{"real", a.d}, {"imag", a.d_imag}}}};
    case ir::ArgKind::String: return Json{{"as_string", a.s}};
    case ir::ArgKind::IntList: {
      bool symbolic = false;
      Json l = Json::array();
      for (size_t j = 0; j < a.ints.size(); ++j) l.push_back(int_or_sym(slot + std::to_string(j), a.ints[j], symbolic));
      if (!symbolic) {
        Json plain = Json::array();
        for (int64_t v : a.ints) plain.push_back(v);
        return Json{{"as_ints", std::move(plain)}};
      }
      return Json{{"as_sym_ints", std::move(l)}};
    }
    case ir::ArgKind::DoubleList: return Json{{"as_floats", a.doubles}};
    case ir::ArgKind::BoolList: {
      Json l = Json::array();
      for (int64_t v : a.ints) l.push_back(v != 0);
      return Json{{"as_bools", std::move(l)}};
    }
    case ir::ArgKind::ScalarType: return Json{{"as_scalar_type", pt2::dtype_code(static_cast<c10::ScalarType>(a.i))}};
    case ir::ArgKind::Layout: return Json{{"as_layout", pt2::layout_code(static_cast<c10::Layout>(a.i))}};
    case ir::ArgKind::MemoryFormat:
      return Json{{"as_memory_format", pt2::memory_format_code(static_cast<c10::MemoryFormat>(a.i))}};
    case ir::ArgKind::Device: return Json{{"as_device", pt2::device_json(c10::Device(a.s))}};
    case ir::ArgKind::WrappedScalar: return scalar_arg(a);
    case ir::ArgKind::Opaque: break;
  }
  TORCH_CHECK(false, "tcap export: argument '", schema_arg.name(), "' of ", n.qualified_op(), " is a ", a.s,
              ", which a program cannot hold");
}

c10::OperatorHandle handle_of(const std::string& op, const std::string& overload) {
  auto h = c10::Dispatcher::singleton().findSchema({op, overload});
  TORCH_CHECK(h.has_value(), "tcap export: operator ", op, overload.empty() ? "" : ".", overload,
              " is not registered");
  return *h;
}

std::string target_of(const std::string& op, const std::string& overload) {
  const auto colon = op.find("::");
  TORCH_CHECK(colon != std::string::npos, "tcap export: operator name '", op, "' has no namespace");
  return "torch.ops." + op.substr(0, colon) + "." + op.substr(colon + 2) + "." +
         (overload.empty() ? std::string("default") : overload);
}

// The written argument of a mutable schema (alias_info is_write), -1 when none.
int written_arg(const c10::FunctionSchema& s) {
  for (size_t i = 0; i < s.arguments().size(); ++i) {
    const auto* info = s.arguments()[i].alias_info();
    if (info && info->isWrite()) return static_cast<int>(i);
  }
  return -1;
}

Lowered lower(const ir::Graph& g, const std::vector<at::Tensor>& tensors, const SymbolicInts& sym,
              const std::vector<DynamicDim>& dims, const std::shared_ptr<torch::nn::Module>& module) {
  Lowered out;
  Writer w(g, sym);
  const std::vector<ir::NodeId> input_nodes = g.input_nodes();
  // Inputs: parameters, buffers, constants, then user inputs (torch.export's order). A
  // module's parameters and buffers the function does not read are inputs too, so the
  // program's state_dict is the module's.
  struct In {
    ValueId v = ir::kNoValue;
    at::Tensor t;
    std::string fqn;
  };
  std::vector<In> params, buffers, constants, users;
  std::map<std::string, size_t> param_at, buffer_at;
  if (module) {
    for (const auto& p : module->named_parameters(/*recurse=*/true)) {
      param_at[p.key()] = params.size();
      params.push_back({ir::kNoValue, p.value(), p.key()});
    }
    for (const auto& b : module->named_buffers(/*recurse=*/true)) {
      buffer_at[b.key()] = buffers.size();
      buffers.push_back({ir::kNoValue, b.value(), b.key()});
    }
  }
  for (size_t k = 0; k < input_nodes.size(); ++k) {
    const ir::Node& n = g.node(input_nodes[k]);
    const ValueId v = n.outputs.at(0).values.at(0);
    const at::Tensor& t = tensors.at(k);
    // A module's own parameter or buffer gets its value; one capture named otherwise is added.
    auto bind = [&](std::vector<In>& list, std::map<std::string, size_t>& at) {
      auto it = at.find(n.name);
      if (it != at.end()) {
        list[it->second].v = v;
        return;
      }
      at[n.name] = list.size();
      list.push_back({v, t, n.name});
    };
    switch (n.input_kind) {
      case ir::InputKind::Parameter: bind(params, param_at); break;
      case ir::InputKind::Buffer: bind(buffers, buffer_at); break;
      case ir::InputKind::UserInput: users.push_back({v, t, n.name}); break;
      case ir::InputKind::Constant: constants.push_back({v, t, n.name}); break;
      default: TORCH_CHECK(false, "tcap export: input '", n.name, "' is a ", ir::to_string(n.input_kind));
    }
  }
  Json inputs = Json::array(), input_specs = Json::array();
  Json weights = Json::object(), consts = Json::object();
  auto input_json = [&](const In& in, const std::string& prefix) {
    std::string clean = in.fqn;
    std::replace(clean.begin(), clean.end(), '.', '_');
    const std::string name = w.fresh(prefix + clean);
    if (in.v != ir::kNoValue) w.name_value(in.v, name);
    else w.tensor_values[name] = pt2::tensor_meta(in.t, false);
    inputs.push_back(Json{{"as_tensor", {{"name", name}}}});
    return name;
  };
  // A parameter, buffer or constant: its input, its spec (`kind`: {arg, then `fields`}), its
  // entry in the weights or constants table, and its file.
  auto add_state = [&](const In& in, const std::string& prefix, const char* kind, const Json& fields, Json& table,
                       const std::string& file, const std::string& record, bool is_param) {
    Json spec = Json::object();
    spec["arg"] = Json{{"name", input_json(in, prefix)}};
    for (const auto& [key, value] : fields.items()) spec[key] = value;
    input_specs.push_back(Json{{kind, std::move(spec)}});
    table[in.fqn] = Json{{"path_name", file}, {"is_param", is_param}, {"use_pickle", false},
                         {"tensor_meta", pt2::tensor_meta(in.t.contiguous(), is_param && in.t.requires_grad())}};
    out.files.emplace_back(record, pt2::tensor_bytes(in.t));
  };
  for (const In& p : params) {
    const std::string file = pt2::kWeightPrefix + std::to_string(weights.size());
    add_state(p, "p_", "parameter", Json{{"parameter_name", p.fqn}}, weights, file, pt2::weight_record(file), true);
  }
  for (const In& b : buffers) {
    const std::string file = pt2::kWeightPrefix + std::to_string(weights.size());
    add_state(b, "b_", "buffer", Json{{"buffer_name", b.fqn}, {"persistent", true}}, weights, file,
              pt2::weight_record(file), false);
  }
  for (size_t k = 0; k < constants.size(); ++k) {
    In c = constants[k];
    c.fqn = "lifted_tensor_" + std::to_string(k);
    const std::string file = pt2::kTensorConstantPrefix + std::to_string(k);
    add_state(c, "c_", "tensor_constant", Json{{"tensor_constant_name", c.fqn}}, consts, file,
              pt2::constant_record(file), false);
  }
  std::vector<ValueId> user_values;
  for (const In& u : users) {
    input_json(u, "");
    input_specs.push_back(Json{{"user_input", {{"arg", {{"as_tensor", {{"name", w.value_name(u.v)}}}}}}}});
    user_values.push_back(u.v);
  }
  w.add_symbol_reads(dims, user_values);

  // Note [Export lowering]: which values a mutation may write. The values of each alias
  // root, made once (a graph of many in-place ops asks per op).
  std::unordered_map<ValueId, std::vector<ValueId>> aliases_of_root;
  for (const ir::Value& v : g.values()) aliases_of_root[g.alias_root(v.id)].push_back(v.id);
  std::set<std::string> ops_seen;
  std::vector<std::string> non_core;
  for (const ir::Node& n : g.nodes()) {
    if (n.kind == ir::NodeKind::Input || n.kind == ir::NodeKind::Output) continue;
    TORCH_CHECK(n.kind == ir::NodeKind::Call, "tcap export: the graph calls a hook (node ", n.id,
                "): a program holds ATen ops only");
    std::string op = n.op, overload = n.overload;
    c10::OperatorHandle handle = handle_of(op, overload);
    const c10::FunctionSchema* schema = &handle.schema();
    const int written = written_arg(*schema);
    if (written >= 0) {
      const ir::Arg& target = n.args.at(static_cast<size_t>(written));
      TORCH_CHECK(target.is_value() && n.outputs.size() == 1 && n.outputs[0].is_value(), "tcap export: ",
                  n.qualified_op(), " writes into its arguments in a way a program cannot express");
      const ValueId old = target.values[0];
      const ir::Value& ov = g.value(old);
      const bool intermediate = ov.producer >= 0 && g.node(ov.producer).kind == ir::NodeKind::Call;
      TORCH_CHECK(intermediate && ov.view_of == ir::kNoValue,
                  "tcap export: ", n.qualified_op(), " writes into ", ir::describe(g, old),
                  ", an input, parameter, buffer or view: the exported program is functional and would lose "
                  "that write (export in eval mode, or write out of place)");
      for (ValueId other : aliases_of_root.at(g.alias_root(old))) {
        // Values made from the new contents (at or after this node) read them as eager does.
        if (other == old || g.value(other).producer >= n.id) continue;
        for (ir::NodeId u : g.users(other)) {
          TORCH_CHECK(u <= n.id, "tcap export: ", n.qualified_op(), " writes into a value that ",
                      ir::describe(g, other), " aliases and node ", u,
                      " reads afterwards: a functional program would read the old contents");
        }
      }
      std::string functional = op;
      TORCH_CHECK(functional.size() > 1 && functional.back() == '_', "tcap export: ", n.qualified_op(),
                  " writes into its argument and has no functional form (an out= variant)");
      functional.pop_back();
      auto h = c10::Dispatcher::singleton().findSchema({functional, overload});
      TORCH_CHECK(h.has_value(), "tcap export: ", n.qualified_op(), " has no functional form ", functional,
                  overload.empty() ? "" : ".", overload);
      op = functional;
      handle = *h;
      schema = &handle.schema();
    }
    const ValueId result = n.outputs.size() == 1 && n.outputs[0].is_value() ? n.outputs[0].values[0] : ir::kNoValue;
    if ((op == "aten::detach" || op == "aten::alias" || op == "aten::lift_fresh") && result != ir::kNoValue) {
      w.alias(result, n.args.at(0).values.at(0));
      continue;
    }
    Json inputs_json = Json::array();
    auto tensor_arg = [&](ValueId v) { return Json{{"as_tensor", {{"name", w.value_name(v)}}}}; };
    auto named = [](const std::string& name, Json arg) { return Json{{"name", name}, {"arg", std::move(arg)}, {"kind", 1}}; };
    auto static_size = [&](ValueId v, int64_t d) {
      return !w.sym.slots.count("v" + std::to_string(v) + ".size" + std::to_string(d)) &&
             !w.sym.slots.count("v" + std::to_string(v) + ".stride" + std::to_string(d));
    };
    auto switch_to = [&](const std::string& new_op, const std::string& new_overload) {
      op = new_op;
      overload = new_overload;
      handle = handle_of(op, overload);
      schema = &handle.schema();
    };
    // Writes a node of the program: the one this node becomes, or each of several it is
    // rewritten into.
    auto emit = [&](const std::string& emit_op, const std::string& emit_overload, Json in, Json outs) {
      Json e;
      e["target"] = target_of(emit_op, emit_overload);
      e["inputs"] = std::move(in);
      e["outputs"] = std::move(outs);
      e["metadata"] = Json::object();
      e["is_hop_single_tensor_return"] = nullptr;
      w.nodes.push_back(std::move(e));
      const std::string short_target = target_of(emit_op, emit_overload).substr(std::string("torch.ops.").size());
      if (ops_seen.insert(short_target).second) {
        out.report.ops.push_back(short_target);
        if (!handle_of(emit_op, emit_overload).hasTag(at::Tag::core)) non_core.push_back(short_target);
      }
      ++out.report.nodes;
    };
    if (op == "aten::_unsafe_view") switch_to("aten::view", "");  // the same arguments
    if ((op == "aten::unbind" && overload == "int") && n.outputs.size() == 1 &&
        n.outputs[0].kind == ir::ArgKind::ValueList) {
      // unbind(x, d) -> select(x, d, i) per result.
      const ValueId self = n.args.at(0).values.at(0);
      for (size_t i = 0; i < n.outputs[0].values.size(); ++i) {
        const ValueId v = n.outputs[0].values[i];
        const std::string name = w.fresh("select");
        w.name_value(v, name);
        emit("aten::select", "int",
             Json::array({named("self", tensor_arg(self)), named("dim", {{"as_int", n.args.at(1).i}}),
                          named("index", {{"as_int", static_cast<int64_t>(i)}})}),
             Json::array({Json{{"as_tensor", {{"name", name}}}}}));
      }
      continue;
    }
    if (op == "aten::stack" && n.args.size() == 2 && n.args[0].kind == ir::ArgKind::ValueList && result != ir::kNoValue) {
      // stack(ts, d) -> cat([unsqueeze(t, d) for t in ts], d), when every size is static.
      bool all_static = true;
      for (ValueId v : n.args[0].values) {
        for (size_t d = 0; d < g.value(v).meta.sizes.size(); ++d) all_static = all_static && static_size(v, static_cast<int64_t>(d));
      }
      if (all_static) {
        const int64_t rank = static_cast<int64_t>(g.value(n.args[0].values.at(0)).meta.sizes.size());
        const int64_t dim = n.args[1].i < 0 ? n.args[1].i + rank + 1 : n.args[1].i;
        Json parts = Json::array();
        for (ValueId v : n.args[0].values) {
          const ir::TensorMeta& m = g.value(v).meta;
          const std::string name = w.fresh("unsqueeze");
          Json meta = w.meta_json(v);
          const int64_t stride = dim < rank ? m.sizes[static_cast<size_t>(dim)] * m.strides[static_cast<size_t>(dim)] : 1;
          meta["sizes"].insert(meta["sizes"].begin() + dim, Json{{"as_int", 1}});
          meta["strides"].insert(meta["strides"].begin() + dim, Json{{"as_int", stride}});
          w.tensor_values[name] = std::move(meta);
          emit("aten::unsqueeze", "", Json::array({named("self", tensor_arg(v)), named("dim", {{"as_int", dim}})}),
               Json::array({Json{{"as_tensor", {{"name", name}}}}}));
          parts.push_back(Json{{"name", name}});
        }
        const std::string name = w.fresh("cat");
        w.name_value(result, name);
        emit("aten::cat", "", Json::array({named("tensors", {{"as_tensors", parts}}), named("dim", {{"as_int", dim}})}),
             Json::array({Json{{"as_tensor", {{"name", name}}}}}));
        continue;
      }
    }
    if ((op == "aten::split" || op == "aten::unsafe_split") && overload == "Tensor" && n.args.size() == 3 &&
        n.args[1].kind == ir::ArgKind::Int && n.outputs.size() == 1 && n.outputs[0].kind == ir::ArgKind::ValueList) {
      // split(x, k, d) -> slice(x, d, i*k, min((i+1)*k, n)) per result, when x's size at d is
      // static: one single-result node per piece.
      const ValueId self = n.args[0].values.at(0);
      const auto& sizes = g.value(self).meta.sizes;
      const int64_t rank = static_cast<int64_t>(sizes.size());
      const int64_t dim = n.args[2].i < 0 ? n.args[2].i + rank : n.args[2].i;
      if (dim >= 0 && dim < rank && static_size(self, dim) && n.args[1].i > 0 &&
          !w.sym.slots.count("n" + std::to_string(n.id) + ".a1.0")) {
        const int64_t total = sizes[static_cast<size_t>(dim)], k = n.args[1].i;
        for (size_t i = 0; i < n.outputs[0].values.size(); ++i) {
          const ValueId v = n.outputs[0].values[i];
          const std::string name = w.fresh("slice");
          w.name_value(v, name);
          const int64_t start = static_cast<int64_t>(i) * k;
          emit("aten::slice", "Tensor",
               Json::array({named("self", tensor_arg(self)), named("dim", {{"as_int", dim}}),
                            named("start", {{"as_int", start}}), named("end", {{"as_int", std::min(start + k, total)}}),
                            named("step", {{"as_int", 1}})}),
               Json::array({Json{{"as_tensor", {{"name", name}}}}}));
        }
        continue;
      }
    }
    if (op == "aten::transpose" && overload == "int" && result != ir::kNoValue) {
      const ValueId self = n.args.at(0).values.at(0);
      const int64_t rank = static_cast<int64_t>(g.value(self).meta.sizes.size());
      std::vector<int64_t> perm(static_cast<size_t>(std::max<int64_t>(rank, 1)));
      for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
      if (rank > 0) {
        auto wrap = [&](int64_t d) { return static_cast<size_t>(d < 0 ? d + rank : d); };
        std::swap(perm.at(wrap(n.args.at(1).i)), perm.at(wrap(n.args.at(2).i)));
        switch_to("aten::permute", "");
        inputs_json.push_back(named("self", tensor_arg(self)));
        inputs_json.push_back(named("dims", {{"as_ints", perm}}));
      }
    }
    if (op == "aten::zeros" && overload.empty() && result != ir::kNoValue && n.args.size() == 5) {
      // zeros(size, ...) -> full(size, 0, dtype=<the result's>, ...).
      const c10::ScalarType dtype = g.value(result).meta.dtype;
      const c10::OperatorHandle zeros = handle;
      switch_to("aten::full", "");
      const auto& zargs = zeros.schema().arguments();
      inputs_json.push_back(named("size", arg_json(w, n, 0, zargs.at(0))));
      inputs_json.push_back(named("fill_value", c10::isFloatingType(dtype) || c10::isComplexType(dtype)
                                                    ? Json{{"as_float", 0.0}}
                                                    : Json{{"as_int", 0}}));
      inputs_json.push_back(Json{{"name", "dtype"}, {"arg", {{"as_scalar_type", pt2::dtype_code(dtype)}}}, {"kind", 2}});
      for (size_t i = 2; i < 5; ++i) {
        inputs_json.push_back(Json{{"name", zargs.at(i).name()}, {"arg", arg_json(w, n, i, zargs.at(i))}, {"kind", 2}});
      }
    }
    if (!inputs_json.empty()) {
      // rewritten above
    } else if (op == "aten::native_batch_norm" && n.args.size() == 8 && n.args[5].kind == ir::ArgKind::Bool &&
        n.args[5].i == 0) {
      // In eval: core ATen's _native_batch_norm_legit_no_training, the same arguments but
      // `training`, the same three results.
      switch_to("aten::_native_batch_norm_legit_no_training", "");
      const auto& sargs = schema->arguments();
      size_t k = 0;
      for (size_t i = 0; i < n.args.size(); ++i) {
        if (i == 5) continue;
        inputs_json.push_back(Json{{"name", sargs.at(k).name()}, {"arg", arg_json(w, n, i, sargs.at(k))}, {"kind", 1}});
        ++k;
      }
    } else if (op == "aten::t" && result != ir::kNoValue) {
      const ValueId self = n.args.at(0).values.at(0);
      if (g.value(self).meta.sizes.size() < 2) {
        w.alias(result, self);
        continue;
      }
      switch_to("aten::permute", "");
      inputs_json.push_back(Json{{"name", "self"}, {"arg", {{"as_tensor", {{"name", w.value_name(self)}}}}}, {"kind", 1}});
      inputs_json.push_back(Json{{"name", "dims"}, {"arg", {{"as_ints", {1, 0}}}}, {"kind", 1}});
    } else {
      const auto& sargs = schema->arguments();
      TORCH_CHECK(n.args.size() == sargs.size(), "tcap export: ", n.qualified_op(), " was recorded with ",
                  n.args.size(), " arguments, its schema has ", sargs.size());
      for (size_t i = 0; i < n.args.size(); ++i) {
        inputs_json.push_back(Json{{"name", sargs[i].name()},
                                   {"arg", arg_json(w, n, i, sargs[i])},
                                   {"kind", sargs[i].kwarg_only() ? 2 : 1}});
      }
    }
    const std::string base = op.substr(op.find("::") + 2);
    Json outputs = Json::array();
    for (const ir::Arg& r : n.outputs) {
      if (r.kind == ir::ArgKind::Value) {
        const std::string name = w.fresh(base);
        w.name_value(r.values[0], name);
        outputs.push_back(Json{{"as_tensor", {{"name", name}}}});
      } else if (r.kind == ir::ArgKind::ValueList) {
        Json l = Json::array();
        for (ValueId v : r.values) {
          const std::string name = w.fresh(base);
          w.name_value(v, name);
          l.push_back(Json{{"name", name}});
        }
        outputs.push_back(Json{{"as_tensors", std::move(l)}});
      } else if (r.kind == ir::ArgKind::None || r.kind == ir::ArgKind::UndefinedTensor) {
        outputs.push_back(Json{{"as_none", true}});
      } else {
        TORCH_CHECK(false, "tcap export: ", n.qualified_op(), " returns a ", ir::to_string(r.kind));
      }
    }
    emit(op, overload, std::move(inputs_json), std::move(outputs));
  }

  const ir::Node* output = g.output_node();
  TORCH_CHECK(output, "tcap export: the graph has no outputs");
  Json outputs = Json::array(), output_specs = Json::array();
  for (const ir::Arg& a : output->args) {
    TORCH_CHECK(a.is_value(), "tcap export: an output is not a tensor");
    Json arg = Json{{"as_tensor", {{"name", w.value_name(a.values[0])}}}};
    outputs.push_back(arg);
    output_specs.push_back(Json{{"user_output", {{"arg", arg}}}});
  }
  out.report.non_core = non_core;
  if (!non_core.empty()) {
    std::ostringstream s;
    for (const auto& o : non_core) s << " " << o;
    TCAP_LOG(Export, "ops LibTorch does not tag core ATen, written as recorded (torch.export.load and AOTInductor "
                     "accept them):" << s.str());
  }
  out.graph["inputs"] = std::move(inputs);
  out.graph["outputs"] = std::move(outputs);
  out.graph["nodes"] = std::move(w.nodes);
  out.graph["tensor_values"] = std::move(w.tensor_values);
  out.graph["sym_int_values"] = std::move(w.sym_int_values);
  out.graph["sym_bool_values"] = Json::object();
  out.graph["is_single_tensor_return"] = false;
  out.graph["custom_obj_values"] = Json::object();
  out.graph["sym_float_values"] = Json::object();
  out.signature["input_specs"] = std::move(input_specs);
  out.signature["output_specs"] = std::move(output_specs);
  out.range_constraints = Json::object();
  for (size_t j = 0; j < dims.size(); ++j) {
    out.range_constraints[sym.symbols[j]] = Json{{"min_val", dims[j].min}, {"max_val", dims[j].max}};
  }
  out.weights_config = Json{{"config", std::move(weights)}};
  out.constants_config = Json{{"config", std::move(consts)}};
  out.report.parameters = static_cast<int64_t>(params.size());
  out.report.buffers = static_cast<int64_t>(buffers.size());
  out.report.constants = static_cast<int64_t>(constants.size());
  return out;
}

// The pytree spec strings of torch.utils._pytree (treespec_dumps, protocol 1).
std::string leaf_spec() { return R"({"type": null, "context": null, "children_spec": []})"; }
std::string tuple_spec(size_t n) {
  std::string s = R"({"type": "builtins.tuple", "context": "null", "children_spec": [)";
  for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + leaf_spec();
  return s + "]}";
}

Json module_call_graph(size_t n_inputs, size_t n_outputs, const std::vector<std::string>& names) {
  const std::string args = R"({"type": "builtins.tuple", "context": "null", "children_spec": [)" + tuple_spec(n_inputs) +
                           R"(, {"type": "builtins.dict", "context": "[]", "children_spec": []}]})";
  Json sig;
  sig["inputs"] = Json::array();
  sig["outputs"] = Json::array();
  sig["in_spec"] = "[1, " + args + "]";
  sig["out_spec"] = "[1, " + (n_outputs == 1 ? leaf_spec() : tuple_spec(n_outputs)) + "]";
  sig["forward_arg_names"] = names;
  return Json::array({Json{{"fqn", ""}, {"signature", std::move(sig)}}});
}

ExportReport export_impl(const std::shared_ptr<torch::nn::Module>& module, const ExportFn& fn,
                         const std::vector<at::Tensor>& example_inputs, const std::string& path,
                         const ExportOptions& options) {
  TORCH_CHECK(fn, "tcap export: the function is empty");
  TORCH_CHECK(!options.model_name.empty(), "tcap export: ExportOptions::model_name is empty");
  std::vector<std::string> names = options.input_names;
  TORCH_CHECK(names.empty() || names.size() == example_inputs.size(), "tcap export: ", names.size(),
              " input names for ", example_inputs.size(), " inputs");
  for (size_t i = names.size(); i < example_inputs.size(); ++i) names.push_back("x" + std::to_string(i));
  for (size_t i = 0; i < example_inputs.size(); ++i) {
    TORCH_CHECK(example_inputs[i].defined(), "tcap export: example input ", i, " is undefined");
  }
  // Eval mode and grad off while recording; the module's flags as they were afterwards.
  std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>> flags;
  if (module) {
    for (const auto& m : module->modules(/*include_self=*/true)) flags.emplace_back(m, m->is_training());
    module->eval();
  }
  struct Restore {
    std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>>& flags;
    ~Restore() {
      for (auto& [m, training] : flags) m->train(training);
    }
  } restore{flags};
  at::NoGradGuard no_grad;
  // Without oneDNN, LibTorch's CPU kernels of recurrent layers run as plain ATen ops
  // (addmm, sigmoid, tanh) instead of mkldnn_rnn_layer, which other devices and
  // AOTInductor do not have.
  struct MkldnnOff {
    bool was = at::globalContext().userEnabledMkldnn();
    MkldnnOff() { at::globalContext().setUserEnabledMkldnn(false); }
    ~MkldnnOff() { at::globalContext().setUserEnabledMkldnn(was); }
  } mkldnn_off;
  Recording base = record(module, fn, example_inputs, names);
  SymbolicInts sym;
  if (!options.dynamic_dims.empty()) {
    sym = fit_dynamic_dims(module, fn, example_inputs, names, options.dynamic_dims, base);
  }
  Lowered low = lower(base.graph, base.tensors, sym, options.dynamic_dims, module);

  Json model;
  model["graph_module"] = Json{{"graph", std::move(low.graph)},
                               {"signature", std::move(low.signature)},
                               {"module_call_graph", module_call_graph(example_inputs.size(), base.graph.output_node()->args.size(), names)},
                               {"metadata", Json::object()},
                               {"treespec_namedtuple_fields", Json::object()}};
  model["opset_version"] = Json{{"aten", pt2::kAtenOpset}};
  model["range_constraints"] = std::move(low.range_constraints);
  model["schema_version"] = Json{{"major", pt2::kSchemaMajor}, {"minor", pt2::kSchemaMinor}};
  model["verifiers"] = Json::array({"ATEN"});
  model["torch_version"] = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                           std::to_string(TORCH_VERSION_PATCH);

  // The calls torch.export.save makes (torch/export/pt2_archive/_package.py): the same
  // writer, so the same layout (a root folder named after the file, 64-byte aligned
  // records, .data/version and byteorder added by writeEndOfFile).
  caffe2::serialize::PyTorchStreamWriter zip(path);
  zip.setMinVersion(6);
  auto put = [&](const std::string& record, const std::string& bytes) {
    zip.writeRecord(record, bytes.data(), bytes.size());
  };
  put(pt2::kArchiveFormatRecord, pt2::kArchiveFormatValue);
  put(pt2::kArchiveVersionRecord, pt2::kArchiveVersionValue);
  put(pt2::model_record(options.model_name), model.dump());
  for (const auto& [record, bytes] : low.files) put(record, bytes);
  put(pt2::weights_config_record(options.model_name), low.weights_config.dump());
  put(pt2::constants_config_record(options.model_name), low.constants_config.dump());
  // torch.save(((inputs...), {})): ep.example_inputs, which AOTInductor compiles with.
  c10::impl::GenericList args(c10::AnyType::get());
  for (const at::Tensor& t : example_inputs) args.push_back(t.detach());
  const c10::IValue sample = c10::ivalue::Tuple::create(
      {c10::ivalue::Tuple::create(std::vector<c10::IValue>(args.begin(), args.end())),
       c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get())});
  put(pt2::sample_inputs_record(options.model_name), pt2::torch_save_bytes(sample));
  zip.writeEndOfFile();
  low.report.path = path;
  TCAP_LOG(Export, "wrote " << path << ": " << low.report.nodes << " ops, " << low.report.parameters
                            << " parameters, " << low.report.buffers << " buffers, " << low.report.constants
                            << " constants" << (options.dynamic_dims.empty() ? "" : ", dynamic sizes"));
  return low.report;
}

}  // namespace

ExportReport export_program(const std::shared_ptr<torch::nn::Module>& module, const ExportFn& forward,
                            const std::vector<at::Tensor>& example_inputs, const std::string& path,
                            const ExportOptions& options) {
  TORCH_CHECK(module, "tcap export: the module is null");
  return export_impl(module, forward, example_inputs, path, options);
}

ExportReport export_function(const ExportFn& fn, const std::vector<at::Tensor>& example_inputs,
                             const std::string& path, const ExportOptions& options) {
  return export_impl(nullptr, fn, example_inputs, path, options);
}

}  // namespace tcap
