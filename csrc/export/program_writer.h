// The serialized graph of a PT2 program being built (Writer) and the JSON of one recorded
// argument against its schema: what lower() (lower_program.cpp) writes with.
#pragma once

#include "export/export_steps.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/function_schema.h>

#include <map>
#include <string>
#include <vector>

namespace tcap::pt2 {

// The serialized graph being built: value names, tensor metadata, symbolic integers and
// nodes, filled by lower() and the rewrites of Note [Export lowering].
struct Writer {
  Writer(const ir::Graph& graph, const SymbolicInts& ints) : g(graph), sym(ints) {}

  std::string value_name(ir::ValueId v) const {
    auto it = names.find(v);
    TORCH_INTERNAL_ASSERT(it != names.end(), "tcap export: value %", v, " has no name");
    return it->second;
  }
  void name_value(ir::ValueId v, const std::string& name) {
    names[v] = name;
    tensor_values[name] = meta_json(v);
  }
  void alias(ir::ValueId v, ir::ValueId to) { names[v] = value_name(to); }
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

  Json meta_json(ir::ValueId v) const {
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
  void add_symbol_reads(const std::vector<DynamicDim>& dims, const std::vector<ir::ValueId>& user_inputs) {
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
  std::unordered_map<ir::ValueId, std::string> names;
  std::map<std::string, int> used;
  Json tensor_values = Json::object();
  Json sym_int_values = Json::object();
  Json nodes = Json::array();
  std::vector<std::string> symbol_names;
  std::map<std::string, std::string> sym_names;  // expression -> sym value name
};

// The JSON of node n's argument i, as schema_arg types it (SymInts where the fit found
// symbols).
Json arg_json(Writer& w, const ir::Node& n, size_t i, const c10::Argument& schema_arg);
// The operator named so; throws when this LibTorch has none.
c10::OperatorHandle handle_of(const std::string& op, const std::string& overload);
// "torch.ops.aten.add.Tensor".
std::string target_of(const std::string& op, const std::string& overload);
// The written argument of a mutable schema (alias_info is_write), -1 when none.
int written_arg(const c10::FunctionSchema& s);

}  // namespace tcap::pt2
