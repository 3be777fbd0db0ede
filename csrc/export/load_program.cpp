// tcap::load_program (include/tcap/export.h): a PT2 archive that torch.export.save (or
// export_program) wrote, read into a torch::nn::Module whose forward runs the graph's ATen
// ops through the dispatcher, served by tcap::compile (docs/export.md, "Loading").
#include <tcap/capture.h>
#include <tcap/export.h>

#include "export/program_nodes.h"
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

using pt2::Json;
using pt2::OpNode;

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

using pt2::bad;
using pt2::Env;
using pt2::lookup;
using pt2::parse_node;
using pt2::run_node;
using PlainJson = nlohmann::json;

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
