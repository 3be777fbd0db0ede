// torch.export both ways: a LibTorch C++ model written to a PT2 archive that PyTorch reads
// (torch.export.load, AOTInductor, nativert), and a PT2 archive PyTorch wrote loaded into
// C++ as a torch::nn::Module that trains with tcap.
//
//   tcap::export_program(model, {torch::randn({8, 16})}, "mlp.pt2");   // C++ -> PyTorch
//   // python: ep = torch.export.load("mlp.pt2"); ep.module()(x)
//
//   auto m = tcap::load_program("resnet.pt2");                       // PyTorch -> C++
//   torch::optim::SGD opt(m->parameters(), 0.1);
//   auto loss = torch::mse_loss(m->forward({x})[0], y);
//   loss.backward();
//   opt.step();
//
// See docs/export.md for what is written (the archive, the IR level, dynamic dims) and the
// limits of each direction.
#pragma once

#include <tcap/compile.h>
#include <tcap/graph.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace tcap {

// A size of an example input that the exported program accepts in a range, as
// torch.export.Dim does: dim `dim` of user input `input`. `name` is the caller's label
// only: the program calls the k-th dynamic size s<k> (AOTInductor takes no other names),
// and errors name the input and dim.
struct DynamicDim {
  size_t input = 0;
  int64_t dim = 0;
  int64_t min = 2;
  int64_t max = std::numeric_limits<int32_t>::max() - 1;
  std::string name;
};

struct ExportOptions {
  std::string model_name = "model";  // models/<model_name>.json in the archive
  // Names of the user inputs as Python sees them (forward_arg_names); default x0, x1, ...
  std::vector<std::string> input_names;
  std::vector<DynamicDim> dynamic_dims;
};

// What export_program wrote, for logs and tests.
struct ExportReport {
  std::string path;
  int64_t nodes = 0;
  int64_t parameters = 0;
  int64_t buffers = 0;
  int64_t constants = 0;
  std::vector<std::string> ops;  // "aten.addmm.default", in first-use order
  // The ops of `ops` LibTorch does not tag core ATen (written as recorded: torch.export.load
  // and AOTInductor accept them; Note [Export lowering] lists the rewrites to core).
  std::vector<std::string> non_core;
};

using ExportFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// Runs `forward` once on `example_inputs` in eval mode with grad off (the module's training
// flags are restored after), records the ATen calls, lowers them to core ATen IR (functional
// ops only) and writes a PT2 archive at `path`. The module's parameters and buffers become
// the program's parameters and buffers, under their names; tensors the function reads from
// elsewhere become lifted constants. Throws c10::Error with the reason when the function
// cannot be exported (an op with no functional form, a value read on the host, ...).
ExportReport export_program(const std::shared_ptr<torch::nn::Module>& module, const ExportFn& forward,
                            const std::vector<at::Tensor>& example_inputs, const std::string& path,
                            const ExportOptions& options = {});
// A function over tensors (no module): every tensor it reads besides its inputs is a
// constant of the program.
ExportReport export_function(const ExportFn& fn, const std::vector<at::Tensor>& example_inputs,
                             const std::string& path, const ExportOptions& options = {});
template <class F,
          std::enable_if_t<std::conjunction_v<
                               std::negation<std::is_base_of<torch::detail::ModuleHolderIndicator, std::decay_t<F>>>,
                               std::is_constructible<ExportFn, F>>,
                           int> = 0>
ExportReport export_program(F&& fn, const std::vector<at::Tensor>& example_inputs, const std::string& path,
                            const ExportOptions& options = {}) {
  return export_function(ExportFn(std::forward<F>(fn)), example_inputs, path, options);
}
// A module holder whose forward takes one tensor and returns one.
template <class M>
ExportReport export_program(const torch::nn::ModuleHolder<M>& holder, const std::vector<at::Tensor>& example_inputs,
                            const std::string& path, const ExportOptions& options = {}) {
  std::shared_ptr<M> impl = holder.ptr();
  return export_program(
      std::static_pointer_cast<torch::nn::Module>(impl),
      [impl](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{impl->forward(in.at(0))}; },
      example_inputs, path, options);
}

// A program loaded from a PT2 archive: its parameters and buffers are registered under
// their original names ("layer1.0.conv1.weight"), so parameters(), named_parameters(),
// optimizers, to(), train()/eval() and torch::save work. forward() runs the graph through
// tcap::compile (captured on the first call, then compiled replays with autograd).
class ExportedProgramModule : public torch::nn::Module {
 public:
  ~ExportedProgramModule() override;
  // The program's outputs for its user inputs, in order.
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& inputs);
  // Runs the graph eagerly, op by op through the dispatcher (what forward compiles).
  std::vector<at::Tensor> run_eager(const std::vector<at::Tensor>& inputs);
  // The graph in readable form, one op per line, as the archive writes it.
  std::string graph_string() const;
  // The program as a tcap graph: one run recorded by capture, with grad off, on inputs of
  // the sizes and dtypes the program was exported with (zeros; a dynamic size at its
  // hint). What tcap-inspect prints for a .pt2. The module's buffers are left as they were.
  ir::Graph graph();
  const std::vector<std::string>& input_names() const;
  // The compiled forward's counters (all zero before the first forward).
  CompileStats stats() const;
  CompileOptions& compile_options() { return compile_options_; }  // read at the first forward

  struct Program;  // the parsed graph (export/load_program.cpp)

 private:
  friend std::shared_ptr<ExportedProgramModule> load_program(const std::string&, const std::string&);
  ExportedProgramModule() = default;
  std::vector<at::Tensor> run_graph(const std::vector<at::Tensor>& inputs);
  std::vector<at::Tensor> apply_buffer_updates(std::vector<at::Tensor> all);
  std::shared_ptr<Program> program_;
  CompileOptions compile_options_;
  std::shared_ptr<CompiledFunction> compiled_;  // the tcap::compile'd forward, made on first use
};

// Reads models/<model_name>.json of the archive at `path` (any model when it holds one).
// Throws c10::Error naming what it cannot read: not a zip, a schema major version it does
// not know, an op this LibTorch lacks, a higher-order op, weights that disagree with the
// graph.
std::shared_ptr<ExportedProgramModule> load_program(const std::string& path, const std::string& model_name = "");

}  // namespace tcap
