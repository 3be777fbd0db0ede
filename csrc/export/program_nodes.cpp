// Parsing and running the nodes of a loaded PT2 program (program_nodes.h).
#include "export/program_nodes.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>

#include <limits>
#include <sstream>

namespace tcap::pt2 {

void bad(const std::string& path, const std::string& what) {
  TORCH_CHECK(false, "tcap load_program: ", path, ": ", what);
}

namespace {

// "torch.ops.aten.addmm.default" -> {"aten::addmm", ""}.
std::optional<std::pair<std::string, std::string>> aten_name(const std::string& target) {
  const std::string prefix = "torch.ops.";
  if (target.rfind(prefix, 0) != 0) return std::nullopt;
  const std::string rest = target.substr(prefix.size());
  const auto a = rest.find('.');
  const auto b = rest.rfind('.');
  if (a == std::string::npos || a == b) return std::nullopt;
  const std::string overload = rest.substr(b + 1);
  return std::make_pair(rest.substr(0, a) + "::" + rest.substr(a + 1, b - a - 1),
                        overload == "default" ? std::string() : overload);
}

// A float of the schema: a JSON number, or "Infinity", "-Infinity", "NaN" (how Python's
// serializer writes the values JSON lacks).
double number(const Json& v) {
  if (v.is_number()) return v.get<double>();
  const std::string s = v.get<std::string>();
  if (s == "Infinity") return std::numeric_limits<double>::infinity();
  if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
  if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
  TORCH_CHECK(false, "tcap load_program: '", s, "' is not a number");
}

c10::IValue int_list(const Json& l) {
  c10::List<int64_t> out;
  for (const auto& v : l) out.push_back(v.get<int64_t>());
  return out;
}

// One serialized argument: what it refers to, or its value.
Source source_of(const std::string& path, const std::string& target, const std::string& arg_name, const Json& a) {
  Source s;
  auto fail = [&](const std::string& why) {
    bad(path, "argument '" + arg_name + "' of " + target + ": " + why);
  };
  TORCH_CHECK(a.is_object() && a.size() == 1, "tcap load_program: ", path, ": argument '", arg_name, "' of ",
              target, " is not a one-field union");
  const std::string kind = a.begin().key();
  const Json& v = a.begin().value();
  if (kind == "as_none") return s;
  if (kind == "as_tensor" || kind == "as_optional_tensor") {
    if (kind == "as_optional_tensor" && v.contains("as_none")) return s;
    s.kind = Source::Tensor;
    s.names.push_back(kind == "as_tensor" ? v.at("name").get<std::string>() : v.at("as_tensor").at("name").get<std::string>());
    return s;
  }
  if (kind == "as_tensors") {
    s.kind = Source::TensorList;
    for (const auto& t : v) s.names.push_back(t.at("name").get<std::string>());
    return s;
  }
  if (kind == "as_optional_tensors") {
    s.kind = Source::OptTensorList;
    for (const auto& t : v) s.names.push_back(t.contains("as_tensor") ? t.at("as_tensor").at("name").get<std::string>() : "");
    return s;
  }
  if (kind == "as_int") s.literal = v.get<int64_t>();
  else if (kind == "as_ints") s.literal = int_list(v);
  else if (kind == "as_float") s.literal = number(v);
  else if (kind == "as_floats") {
    c10::List<double> l;
    for (const auto& e : v) l.push_back(number(e));
    s.literal = l;
  }
  else if (kind == "as_string") s.literal = v.get<std::string>();
  else if (kind == "as_strings") {
    c10::List<std::string> l;
    for (const auto& e : v) l.push_back(e.get<std::string>());
    s.literal = l;
  } else if (kind == "as_bool") s.literal = v.get<bool>();
  else if (kind == "as_bools") {
    c10::List<bool> l;
    for (const auto& e : v) l.push_back(e.get<bool>());
    s.literal = l;
  }
  else if (kind == "as_scalar_type") s.literal = static_cast<int64_t>(pt2::dtype_from_code(v.get<int64_t>()));
  else if (kind == "as_memory_format") s.literal = static_cast<int64_t>(pt2::memory_format_from_code(v.get<int64_t>()));
  else if (kind == "as_layout") s.literal = static_cast<int64_t>(pt2::layout_from_code(v.get<int64_t>()));
  else if (kind == "as_device") s.literal = pt2::device_from_json(v);
  else if (kind == "as_complex") s.literal = c10::complex<double>(number(v.at("real")), number(v.at("imag")));
  else if (kind == "as_sym_int" || kind == "as_sym_float" || kind == "as_sym_bool") {
    if (v.contains("as_name")) {
      s.kind = Source::Sym;
      s.names.push_back(v.at("as_name").get<std::string>());
    } else if (v.contains("as_int")) s.literal = v.at("as_int").get<int64_t>();
    else if (v.contains("as_float")) s.literal = number(v.at("as_float"));
    else if (v.contains("as_bool")) s.literal = v.at("as_bool").get<bool>();
    else fail("a symbolic value with neither a name nor a value");
  } else if (kind == "as_sym_ints") {
    s.kind = Source::SymList;
    for (const auto& e : v) {
      if (e.contains("as_name")) {
        s.names.push_back(e.at("as_name").get<std::string>());
        s.list_literals.emplace_back();
      } else {
        s.names.push_back("");
        s.list_literals.emplace_back(e.at("as_int").get<int64_t>());
      }
    }
  } else if (kind == "as_graph") {
    fail("a subgraph (higher-order ops such as cond, while_loop and wrap_with_* are not supported)");
  } else if (kind == "as_custom_obj") {
    fail("a custom object (TorchBind classes are not supported)");
  } else {
    fail("argument kind '" + kind + "' is not supported");
  }
  return s;
}

c10::IValue value_of(const Source& s, const Env& env, const std::string& target) {
  switch (s.kind) {
    case Source::Literal: return s.literal;
    case Source::Tensor:
    case Source::Sym: return lookup(env, s.names[0], target);
    case Source::TensorList: {
      c10::List<at::Tensor> l;
      for (const auto& n : s.names) l.push_back(lookup(env, n, target).toTensor());
      return l;
    }
    case Source::OptTensorList: {
      c10::List<std::optional<at::Tensor>> l;
      for (const auto& n : s.names) {
        l.push_back(n.empty() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(lookup(env, n, target).toTensor()));
      }
      return l;
    }
    case Source::SymList: {
      c10::List<int64_t> l;
      for (size_t i = 0; i < s.names.size(); ++i) {
        l.push_back(s.names[i].empty() ? s.list_literals[i].toInt() : lookup(env, s.names[i], target).toInt());
      }
      return l;
    }
  }
  return {};
}

}  // namespace

OpNode parse_node(const std::string& path, const Json& n) {
  OpNode out;
  out.target = n.at("target").get<std::string>();
  const std::string& t = out.target;
  if (t.rfind("torch.ops.higher_order.", 0) == 0) {
    bad(path, "higher-order op " + t + " is not supported (cond, while_loop, map, wrap_with_* and the other "
              "subgraph ops have no ATen form to run)");
  }
  if (t.rfind("_operator.", 0) == 0) {
    out.kind = OpNode::SymArith;
    out.arith = t.substr(std::string("_operator.").size());
    TORCH_CHECK(out.arith == "mul" || out.arith == "add" || out.arith == "sub" || out.arith == "floordiv" ||
                    out.arith == "mod",
                "tcap load_program: ", path, ": symbolic operator ", t, " is not supported");
    for (const auto& in : n.at("inputs")) out.args.push_back(source_of(path, t, in.value("name", ""), in.at("arg")));
  } else {
    const auto name = aten_name(t);
    if (!name) bad(path, "node target " + t + " is not an operator of torch.ops");
    auto h = c10::Dispatcher::singleton().findSchema({name->first, name->second});
    if (!h) {
      bad(path, "operator " + t + " is not registered in this process" +
                    (name->first.rfind("aten::", 0) == 0
                         ? std::string(" (this LibTorch lacks it: the program was written by another version)")
                         : std::string(" (a custom op: load the library that registers it first)")));
    }
    out.kind = name->first == "aten::sym_size" ? OpNode::SymSize : OpNode::Aten;
    out.op = *h;
    const auto& schema = h->schema();
    std::map<std::string, Source> given;
    for (const auto& in : n.at("inputs")) {
      const std::string arg = in.at("name").get<std::string>();
      given[arg] = source_of(path, t, arg, in.at("arg"));
    }
    for (const auto& sa : schema.arguments()) {
      auto it = given.find(sa.name());
      if (it != given.end()) {
        out.args.emplace_back(std::move(it->second));
        given.erase(it);
      } else {
        TORCH_CHECK(sa.default_value().has_value(), "tcap load_program: ", path, ": ", t, " is missing argument '",
                    sa.name(), "', which has no default");
        out.args.emplace_back(std::nullopt);
      }
    }
    TORCH_CHECK(given.empty(), "tcap load_program: ", path, ": ", t, " is given argument '",
                given.empty() ? "" : given.begin()->first, "', which its schema in this LibTorch lacks");
  }
  for (const auto& r : n.at("outputs")) {
    TORCH_CHECK(r.is_object() && r.size() == 1, "tcap load_program: ", path, ": a result of ", t,
                " is not a one-field union");
    const std::string kind = r.begin().key();
    const Json& v = r.begin().value();
    std::vector<std::string> names;
    bool list = false;
    if (kind == "as_tensor") names.push_back(v.at("name").get<std::string>());
    else if (kind == "as_tensors") {
      list = true;
      for (const auto& e : v) names.push_back(e.at("name").get<std::string>());
    } else if (kind == "as_sym_int" || kind == "as_sym_float" || kind == "as_sym_bool") {
      names.push_back(v.value("as_name", ""));
    } else if (kind == "as_none") {
      names.push_back("");
    } else if (kind == "as_optional_tensors") {
      list = true;
      for (const auto& e : v) names.push_back(e.contains("as_tensor") ? e.at("as_tensor").at("name").get<std::string>() : "");
    } else {
      bad(path, "result kind '" + kind + "' of " + t + " is not supported");
    }
    out.outputs.push_back(std::move(names));
    out.output_is_list.push_back(list);
  }
  return out;
}


const c10::IValue& lookup(const Env& env, const std::string& name, const std::string& target) {
  auto it = env.find(name);
  TORCH_CHECK(it != env.end(), "tcap load_program: ", target, " reads '", name, "', which no earlier node made");
  return it->second;
}

void run_node(const OpNode& n, Env& env) {
  if (n.kind == OpNode::SymArith) {
    TORCH_CHECK(n.args.size() == 2 && n.args[0] && n.args[1], "tcap load_program: ", n.target, " needs two operands");
    const int64_t a = value_of(*n.args[0], env, n.target).toInt(), b = value_of(*n.args[1], env, n.target).toInt();
    int64_t r = 0;
    if (n.arith == "mul") r = a * b;
    else if (n.arith == "add") r = a + b;
    else if (n.arith == "sub") r = a - b;
    else if (n.arith == "floordiv") r = b == 0 ? 0 : (a / b - ((a % b != 0) && ((a < 0) != (b < 0))));
    else r = b == 0 ? 0 : ((a % b) + b) % b;
    if (!n.outputs.at(0).at(0).empty()) env[n.outputs[0][0]] = r;
    return;
  }
  const auto& schema = n.op->schema();
  torch::jit::Stack stack;
  stack.reserve(schema.arguments().size());
  for (size_t i = 0; i < n.args.size(); ++i) {
    c10::IValue v = n.args[i] ? value_of(*n.args[i], env, n.target) : *schema.arguments()[i].default_value();
    // A number where the schema takes a Tensor (add_(buffer, 1)): Python's argument parser
    // wraps it in a 0-dim tensor marked as a wrapped number, which type promotion ignores.
    if ((v.isInt() || v.isDouble() || v.isBool() || v.isComplexDouble()) &&
        schema.arguments()[i].type()->kind() == c10::TypeKind::TensorType) {
      at::Tensor t = c10::scalar_to_tensor(v.toScalar());
      t.unsafeGetTensorImpl()->set_wrapped_number(true);
      v = std::move(t);
    }
    stack.push_back(std::move(v));
  }
  n.op->callBoxed(stack);
  TORCH_CHECK(stack.size() >= n.outputs.size(), "tcap load_program: ", n.target, " returned ", stack.size(),
              " results, the program names ", n.outputs.size());
  for (size_t k = 0; k < n.outputs.size(); ++k) {
    c10::IValue& r = stack[k];
    if (n.output_is_list[k]) {
      const auto l = r.toList();
      for (size_t j = 0; j < n.outputs[k].size() && j < l.size(); ++j) {
        if (!n.outputs[k][j].empty()) env[n.outputs[k][j]] = l.get(j);
      }
    } else if (!n.outputs[k].at(0).empty()) {
      // A SymInt result (sym_size) is a plain integer here: sizes are concrete at run time.
      env[n.outputs[k][0]] = r.isSymInt() ? c10::IValue(r.toSymInt().guard_int(__FILE__, __LINE__)) : r;
    }
  }
}

}  // namespace tcap::pt2
