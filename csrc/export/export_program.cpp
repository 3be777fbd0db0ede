// tcap::export_program (include/tcap/export.h): a LibTorch function recorded by capture,
// lowered to functional ATen ops and written as a PT2 archive that torch.export.load,
// AOTInductor and nativert read (docs/export.md).
#include <tcap/capture.h>
#include <tcap/export.h>
#include <tcap/partition.h>

#include "export/export_steps.h"
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
using pt2::Lowered;
using pt2::Recording;
using pt2::SymbolicInts;

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
  Recording base = pt2::record(module, fn, example_inputs, names);
  SymbolicInts sym;
  if (!options.dynamic_dims.empty()) {
    sym = pt2::fit_dynamic_dims(module, fn, example_inputs, names, options.dynamic_dims, base);
  }
  Lowered low = pt2::lower(base.graph, base.tensors, sym, options.dynamic_dims, module);

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
