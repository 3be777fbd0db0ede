// tcap::export_program's lowering: a recorded graph written as the PT2 program's JSON in
// the functional core ATen IR (Note [Export lowering]).
#include "export/export_steps.h"
#include "export/program_writer.h"

#include <tcap/capture.h>
#include <tcap/partition.h>

#include "support/logging.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

namespace tcap::pt2 {

using ir::ValueId;

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

}  // namespace tcap::pt2
