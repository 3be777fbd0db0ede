// tcap::load_program (include/tcap/export.h): a PT2 archive that torch.export.save (or
// export_program) wrote, read into a torch::nn::Module whose forward runs the graph's ATen
// ops through the dispatcher, served by tcap::compile (docs/export.md, "Loading").
#include <tcap/capture.h>
#include <tcap/export.h>

#include "export/pt2_schema.h"
#include "support/logging.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <caffe2/serialize/inline_container.h>

#include <limits>
#include <map>
#include <sstream>
#include <unordered_map>

namespace tcap {

namespace {

using pt2::Json;
using PlainJson = nlohmann::json;

// Where an argument's value comes from when a node runs.
struct Source {
  enum Kind { Literal, Tensor, TensorList, OptTensorList, Sym, SymList } kind = Literal;
  c10::IValue literal;
  std::vector<std::string> names;  // Tensor / lists / Sym: names in the environment ("" for None)
  std::vector<c10::IValue> list_literals;  // SymList: literal ints where names[i] is ""
};

struct OpNode {
  std::string target;  // as written ("torch.ops.aten.addmm.default")
  enum Kind { Aten, SymSize, SymArith } kind = Aten;
  std::optional<c10::OperatorHandle> op;
  std::string arith;                  // SymArith: mul, add, sub, floordiv
  std::vector<std::optional<Source>> args;  // per schema argument; nullopt: its default
  // Per result: the name(s) bound ("" where unused); a list result binds several.
  std::vector<std::vector<std::string>> outputs;
  std::vector<bool> output_is_list;
};

}  // namespace

struct ExportedProgramModule::Program {
  std::string path;
  std::vector<std::string> input_names;    // graph input names, in order
  std::vector<std::string> user_inputs;    // names of user inputs, in order
  std::vector<at::Tensor> example_inputs;  // zeros shaped as each user input (sizes at their hints)
  std::vector<std::string> forward_names;  // as Python called them
  // Graph inputs that are state: graph name -> fqn (parameters and buffers) or a constant.
  std::map<std::string, std::string> state;
  std::map<std::string, at::Tensor> constants;
  std::vector<OpNode> nodes;
  std::vector<std::string> outputs;  // user outputs ("" for a None output)
  std::vector<std::pair<std::string, std::string>> buffer_mutations;  // graph value -> buffer fqn
};

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  TORCH_CHECK(false, "tcap load_program: ", path, ": ", what);
}

std::string record_text(caffe2::serialize::PyTorchStreamReader& zip, const std::string& name) {
  auto [data, size] = zip.getRecord(name);
  return std::string(static_cast<const char*>(data.get()), size);
}

at::Tensor read_tensor(caffe2::serialize::PyTorchStreamReader& zip, const std::string& path,
                       const std::string& record, const Json& meta, const std::string& what) {
  TORCH_CHECK(zip.hasRecord(record), "tcap load_program: ", path, ": ", what, " names ", record,
              ", which the archive lacks");
  const c10::ScalarType dtype = pt2::dtype_from_code(meta.at("dtype").get<int64_t>());
  std::vector<int64_t> sizes, strides;
  for (const auto& s : meta.at("sizes")) {
    TORCH_CHECK(s.contains("as_int"), "tcap load_program: ", path, ": ", what, " has a symbolic size");
    sizes.push_back(s.at("as_int").get<int64_t>());
  }
  for (const auto& s : meta.at("strides")) strides.push_back(s.at("as_int").get<int64_t>());
  const int64_t offset = meta.contains("storage_offset") ? meta.at("storage_offset").at("as_int").get<int64_t>() : 0;
  auto [data, nbytes] = zip.getRecord(record);
  const size_t item = c10::elementSize(dtype);
  TORCH_CHECK(nbytes % item == 0, "tcap load_program: ", path, ": ", what, " holds ", nbytes,
              " bytes, not a whole number of ", dtype, " elements");
  at::Tensor storage = at::empty({static_cast<int64_t>(nbytes / item)}, at::TensorOptions().dtype(dtype));
  if (nbytes) std::memcpy(storage.data_ptr(), data.get(), nbytes);
  int64_t needed = sizes.empty() ? offset + 1 : offset;
  bool empty = false;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) empty = true;
    needed += (sizes[d] - 1) * strides.at(d);
  }
  if (!sizes.empty()) needed += 1;
  TORCH_CHECK(empty || needed <= storage.numel(), "tcap load_program: ", path, ": ", what, " is ",
              c10::IntArrayRef(sizes), " with strides ", c10::IntArrayRef(strides), " but its file holds ",
              storage.numel(), " elements");
  return empty ? at::empty(sizes, storage.options()) : storage.as_strided(sizes, strides, offset).clone();
}

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

using Env = std::unordered_map<std::string, c10::IValue>;

const c10::IValue& lookup(const Env& env, const std::string& name, const std::string& target) {
  auto it = env.find(name);
  TORCH_CHECK(it != env.end(), "tcap load_program: ", target, " reads '", name, "', which no earlier node made");
  return it->second;
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

// Registers a parameter or buffer under its dotted name, making the submodules on its path.
torch::nn::Module& owner_of(torch::nn::Module& root, const std::string& fqn, std::string& leaf) {
  torch::nn::Module* m = &root;
  size_t start = 0;
  for (size_t dot = fqn.find('.'); dot != std::string::npos; dot = fqn.find('.', start)) {
    const std::string part = fqn.substr(start, dot - start);
    auto children = m->named_children();
    if (auto* c = children.find(part)) m = c->get();
    else m = m->register_module(part, std::make_shared<torch::nn::Module>()).get();
    start = dot + 1;
  }
  leaf = fqn.substr(start);
  return *m;
}

// The names of the root module's forward arguments, from the module call graph (empty
// when the archive does not record them).
std::vector<std::string> forward_names_of(const Json& model) {
  std::vector<std::string> names;
  for (const auto& e : model.at("graph_module").value("module_call_graph", Json::array())) {
    if (e.value("fqn", "x") != "" || e.at("signature").is_null()) continue;
    for (const auto& n : e.at("signature").value("forward_arg_names", Json::array())) names.push_back(n.get<std::string>());
  }
  return names;
}

}  // namespace

ExportedProgramModule::~ExportedProgramModule() = default;

std::shared_ptr<ExportedProgramModule> load_program(const std::string& path, const std::string& model_name) {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip;
  try {
    zip = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const c10::Error& e) {
    bad(path, std::string("not a PT2 archive (") + e.what_without_backtrace() + ")");
  }
  if (zip->hasRecord(pt2::kArchiveFormatRecord)) {
    const std::string format = record_text(*zip, pt2::kArchiveFormatRecord);
    TORCH_CHECK(format == pt2::kArchiveFormatValue, "tcap load_program: ", path, ": archive format '", format,
                "', not '", pt2::kArchiveFormatValue, "'");
  } else {
    bad(path, "not a PT2 archive (no archive_format record; a TorchScript or torch.save file?)");
  }
  // The model: the one named, or the only one.
  std::string name = model_name;
  if (name.empty()) {
    std::vector<std::string> models;
    for (const auto& r : zip->getAllRecords()) {
      if (r.rfind("models/", 0) == 0 && r.size() > 12 && r.substr(r.size() - 5) == ".json") {
        models.push_back(r.substr(7, r.size() - 12));
      }
    }
    TORCH_CHECK(!models.empty(), "tcap load_program: ", path, ": the archive holds no model (models/*.json)");
    TORCH_CHECK(models.size() == 1, "tcap load_program: ", path, ": the archive holds ", models.size(),
                " models; name one (", c10::Join(", ", models), ")");
    name = models[0];
  }
  const std::string model_record = pt2::model_record(name);
  TORCH_CHECK(zip->hasRecord(model_record), "tcap load_program: ", path, ": no model '", name, "' (", model_record,
              ")");
  Json model;
  try {
    model = Json::parse(record_text(*zip, model_record));
  } catch (const std::exception& e) {
    bad(path, model_record + " is not JSON: " + e.what());
  }
  try {
    const Json& version = model.at("schema_version");
    const int64_t major = version.at("major").get<int64_t>(), minor = version.at("minor").get<int64_t>();
    TORCH_CHECK(major == pt2::kSchemaMajor, "tcap load_program: ", path, ": written with ExportedProgram schema ",
                major, ".", minor, "; this LibTorch reads schema ", pt2::kSchemaMajor, ".x (", pt2::kSchemaMajor, ".",
                pt2::kSchemaMinor, ")");
    if (minor > pt2::kSchemaMinor) {
      TCAP_LOG(Export, path << ": schema " << major << "." << minor << " is newer than " << pt2::kSchemaMajor << "."
                            << pt2::kSchemaMinor << " (minor versions add optional fields)");
    }
    auto program = std::make_shared<ExportedProgramModule::Program>();
    program->path = path;
    program->forward_names = forward_names_of(model);
    const Json& gm = model.at("graph_module");
    const Json& graph = gm.at("graph");
    const Json& sig = gm.at("signature");
    const Json& tensor_values = graph.at("tensor_values");
    std::shared_ptr<ExportedProgramModule> module(new ExportedProgramModule());
    // Weights and constants, by fqn.
    auto config = [&](const std::string& record) {
      return zip->hasRecord(record) ? Json::parse(record_text(*zip, record)).at("config") : Json::object();
    };
    const Json weights = config(pt2::weights_config_record(name));
    const Json constants = config(pt2::constants_config_record(name));
    auto load_state = [&](const Json& cfg, const std::string& fqn, bool is_constant, const std::string& graph_name) {
      TORCH_CHECK(cfg.contains(fqn), "tcap load_program: ", path, ": '", fqn, "' has no entry in the ",
                  is_constant ? "constants" : "weights", " config");
      const Json& e = cfg.at(fqn);
      TORCH_CHECK(!e.value("use_pickle", false), "tcap load_program: ", path, ": '", fqn,
                  "' is pickled (a tensor subclass), which tcap cannot read");
      at::Tensor t = read_tensor(*zip, path,
                                 is_constant ? pt2::constant_record(e.at("path_name").get<std::string>())
                                             : pt2::weight_record(e.at("path_name").get<std::string>()),
                                 e.at("tensor_meta"), "'" + fqn + "'");
      if (tensor_values.contains(graph_name)) {  // the graph's view of it must agree
        const Json& gmeta = tensor_values.at(graph_name);
        std::vector<int64_t> sizes;
        for (const auto& s : gmeta.at("sizes")) sizes.push_back(s.value("as_int", int64_t{-1}));
        TORCH_CHECK(t.sizes().vec() == sizes && t.scalar_type() == pt2::dtype_from_code(gmeta.at("dtype").get<int64_t>()),
                    "tcap load_program: ", path, ": '", fqn, "' is stored as ", t.scalar_type(), t.sizes(),
                    " but the graph reads it as ", pt2::dtype_from_code(gmeta.at("dtype").get<int64_t>()),
                    c10::IntArrayRef(sizes));
      }
      return t;
    };
    for (const auto& in : graph.at("inputs")) {
      if (in.contains("as_tensor")) program->input_names.push_back(in.at("as_tensor").at("name").get<std::string>());
      else bad(path, "a graph input is not a tensor (" + in.dump() + "): symbolic or constant inputs are not supported");
    }
    for (const auto& spec : sig.at("input_specs")) {
      const std::string kind = spec.begin().key();
      const Json& v = spec.begin().value();
      if (kind == "parameter") {
        const std::string fqn = v.at("parameter_name").get<std::string>(), arg = v.at("arg").at("name").get<std::string>();
        std::string leaf;
        owner_of(*module, fqn, leaf).register_parameter(leaf, load_state(weights, fqn, false, arg), true);
        program->state[arg] = fqn;
      } else if (kind == "buffer") {
        const std::string fqn = v.at("buffer_name").get<std::string>(), arg = v.at("arg").at("name").get<std::string>();
        const bool persistent = v.value("persistent", true);
        std::string leaf;
        owner_of(*module, fqn, leaf).register_buffer(leaf, load_state(persistent ? weights : constants, fqn, !persistent, arg));
        program->state[arg] = fqn;
      } else if (kind == "tensor_constant") {
        const std::string fqn = v.at("tensor_constant_name").get<std::string>(),
                          arg = v.at("arg").at("name").get<std::string>();
        program->constants[arg] = load_state(constants, fqn, true, arg);
      } else if (kind == "user_input") {
        const Json& a = v.at("arg");
        TORCH_CHECK(a.contains("as_tensor"), "tcap load_program: ", path, ": a user input is not a tensor (",
                    a.dump(), "): only tensor inputs are supported");
        const std::string in_name = a.at("as_tensor").at("name").get<std::string>();
        program->user_inputs.push_back(in_name);
        if (tensor_values.contains(in_name)) {
          const Json& meta = tensor_values.at(in_name);
          std::vector<int64_t> sizes;
          for (const auto& sz : meta.at("sizes")) {
            sizes.push_back(sz.contains("as_int") ? sz.at("as_int").get<int64_t>()
                                                  : sz.at("as_expr").at("hint").at("as_int").get<int64_t>());
          }
          program->example_inputs.push_back(at::zeros(sizes, at::TensorOptions()
                                                                  .dtype(pt2::dtype_from_code(meta.at("dtype").get<int64_t>()))
                                                                  .device(pt2::device_from_json(meta.at("device")))));
        }
      } else {
        bad(path, "input kind '" + kind + "' is not supported (custom objects, tokens and constant inputs)");
      }
    }
    for (const auto& n : graph.at("nodes")) program->nodes.push_back(parse_node(path, n));
    for (const auto& spec : sig.at("output_specs")) {
      const std::string kind = spec.begin().key();
      const Json& v = spec.begin().value();
      const Json& a = v.at("arg");
      const std::string value = a.contains("as_tensor") ? a.at("as_tensor").at("name").get<std::string>()
                                                        : a.value("name", std::string());
      if (kind == "user_output") {
        TORCH_CHECK(a.contains("as_tensor") || a.contains("as_none"), "tcap load_program: ", path,
                    ": a user output is not a tensor (", a.dump(), ")");
        program->outputs.push_back(value);
      } else if (kind == "buffer_mutation") {
        program->buffer_mutations.emplace_back(value, v.at("buffer_name").get<std::string>());
      } else {
        bad(path, "output kind '" + kind + "' is not supported (input mutations, gradients, losses, tokens)");
      }
    }
    if (program->forward_names.size() != program->user_inputs.size()) program->forward_names = program->user_inputs;
    module->program_ = std::move(program);
    TCAP_LOG(Export, "loaded " << path << " (model '" << name << "'): " << module->program_->nodes.size() << " ops, "
                               << module->parameters().size() << " parameters, " << module->buffers().size()
                               << " buffers");
    return module;
  } catch (const nlohmann::json::exception& e) {
    bad(path, model_record + " does not follow the ExportedProgram schema: " + e.what());
  }
}

// The user outputs, then the new value of each mutated buffer (core ATen IR's functional
// BatchNorm returns its running statistics).
std::vector<at::Tensor> ExportedProgramModule::run_graph(const std::vector<at::Tensor>& inputs) {
  const Program& p = *program_;
  TORCH_CHECK(inputs.size() == p.user_inputs.size(), "tcap: the program loaded from ", p.path, " takes ",
              p.user_inputs.size(), " inputs (", c10::Join(", ", p.forward_names), "), not ", inputs.size());
  Env env;
  const auto params = named_parameters(/*recurse=*/true);
  const auto bufs = named_buffers(/*recurse=*/true);
  for (const auto& [graph_name, fqn] : p.state) {
    if (const auto* t = params.find(fqn)) env[graph_name] = *t;
    else env[graph_name] = bufs[fqn];
  }
  for (const auto& [graph_name, t] : p.constants) env[graph_name] = t;
  for (size_t i = 0; i < inputs.size(); ++i) env[p.user_inputs[i]] = inputs[i];
  for (const OpNode& n : p.nodes) run_node(n, env);
  std::vector<at::Tensor> out;
  for (const auto& o : p.outputs) out.push_back(o.empty() ? at::Tensor() : lookup(env, o, "the output").toTensor());
  for (const auto& m : p.buffer_mutations) out.push_back(lookup(env, m.first, "a buffer update").toTensor());
  return out;
}

// Note [Buffer updates of a loaded program]
// A buffer the program updates (an output of kind buffer_mutation) takes its new value
// after the graph has run, outside the compiled region, by pointing the buffer at the new
// value's storage (set_data): the buffer's identity stays (so tcap::compile's guards hold)
// and the old storage, which the forward may have saved for the backward, is left as it
// was (an in-place copy would bump the version autograd checks, or, through .data(),
// change what the backward reads).
std::vector<at::Tensor> ExportedProgramModule::apply_buffer_updates(std::vector<at::Tensor> all) {
  const Program& p = *program_;
  const size_t n_out = all.size() - p.buffer_mutations.size();
  if (!p.buffer_mutations.empty()) {
    at::NoGradGuard no_grad;
    const auto bufs = named_buffers(/*recurse=*/true);
    for (size_t k = 0; k < p.buffer_mutations.size(); ++k) {
      at::Tensor buffer = bufs[p.buffer_mutations[k].second];
      buffer.set_data(all[n_out + k].detach().clone());
    }
  }
  all.resize(n_out);
  return all;
}

std::vector<at::Tensor> ExportedProgramModule::run_eager(const std::vector<at::Tensor>& inputs) {
  return apply_buffer_updates(run_graph(inputs));
}

std::vector<at::Tensor> ExportedProgramModule::forward(const std::vector<at::Tensor>& inputs) {
  if (!compiled_) {
    CompileOptions o = compile_options_;
    if (o.name == "fn") o.name = "program";
    // A non-owning pointer: this module owns the compiled function, which must not own it
    // back.
    std::shared_ptr<torch::nn::Module> self(std::shared_ptr<torch::nn::Module>(), this);
    compiled_ = compile(self, [this](const std::vector<at::Tensor>& in) { return run_graph(in); }, std::move(o));
  }
  return apply_buffer_updates((*compiled_)(inputs));
}

std::string ExportedProgramModule::graph_string() const {
  std::ostringstream s;
  s << "program(" << c10::Join(", ", program_->user_inputs) << "):\n";
  for (const OpNode& n : program_->nodes) {
    std::vector<std::string> outs;
    for (const auto& o : n.outputs) outs.push_back(c10::Join(", ", o));
    s << "  " << c10::Join(", ", outs) << " = " << n.target << "\n";
  }
  s << "  return " << c10::Join(", ", program_->outputs) << "\n";
  return s.str();
}

const std::vector<std::string>& ExportedProgramModule::input_names() const { return program_->forward_names; }

ir::Graph ExportedProgramModule::graph() {
  const Program& p = *program_;
  TORCH_CHECK(p.example_inputs.size() == p.user_inputs.size(), "tcap: the program loaded from ", p.path,
              " does not describe its inputs (tensor_values), so it cannot be run to record its graph");
  std::vector<std::pair<at::Tensor, at::Tensor>> saved;  // a training-mode forward updates buffers
  for (const auto& b : buffers()) saved.emplace_back(b, b.clone());
  at::NoGradGuard no_grad;
  CaptureOptions co;
  co.record_backward = false;
  CaptureGuard capture(co);
  capture.register_module(*this);
  std::vector<at::Tensor> in;
  for (size_t i = 0; i < p.example_inputs.size(); ++i) in.push_back(capture.input(p.example_inputs[i], p.forward_names[i]));
  const auto out = run_graph(in);  // buffer updates are outputs of the graph too
  for (size_t k = 0; k < out.size(); ++k) {
    if (out[k].defined()) capture.output(out[k], "out" + std::to_string(k));
  }
  capture.stop();
  ir::Graph g = capture.graph();
  for (auto& [b, copy] : saved) b.copy_(copy);
  return g;
}

CompileStats ExportedProgramModule::stats() const { return compiled_ ? compiled_->stats() : CompileStats{}; }

}  // namespace tcap
