// Whole training steps: tcap::compile_step captures a function that runs the forward,
// loss.backward() and optimizer.step(), and replays the entire step as one graph.
//
//   torch::optim::Adam opt(model->parameters(), 1e-3);
//   auto step = tcap::compile_step(model, opt, [&](const std::vector<at::Tensor>& in) {
//     opt.zero_grad();
//     auto loss = torch::mse_loss(model->forward(in[0]), in[1]);
//     loss.backward();
//     opt.step();
//     return std::vector<at::Tensor>{loss};
//   });
//   for (...) auto loss = step({x, y})[0];
//
// Parameters, buffers, their .grad tensors and the optimizer's state tensors are inputs of
// the graph; parameter, buffer, .grad and optimizer-state updates happen exactly as eager
// (in place, .grad set or cleared, step counters advanced). A step is compiled after two
// eager steps with the same guards recorded the same graph: scalars the optimizers compute
// on the host (the learning rate, Adam's bias corrections) are recomputed per call, so a
// learning-rate schedule needs no recompile; values read on the host (a logged
// loss.item(), MultiheadAttention's equal(), clip_grad_norm_'s norm) are guarded, or
// observed when they change without changing the graph; tensors the step reads from
// outside (labels, masks) are held and watched (Note [Held tensors]). Optimizers: SGD,
// Adam, AdamW, Adagrad, RMSprop, several at once (a GAN's two). See docs/compile.md.
#pragma once

#include <tcap/compile.h>

#include <torch/optim/optimizer.h>

#include <functional>

namespace tcap {

class CompiledStep {
 public:
  // How the latest call ran, and the values it read on the host (item(), equal(),
  // clip_grad_norm_'s norm), in the order the step read them. A replay runs the graph,
  // not the step's code, so host code in the step (a log line, a counter) does not run:
  // these are the values that code would have seen, read where the graph read them. A
  // captured call ran the code and lists the values it recorded; an eager call lists
  // none. Hooks registered before the step run on replays too and read for themselves.
  //   auto loss = (*step)({x, y})[0];
  //   if (step->last_call().kind == tcap::CompiledStep::Call::Kind::Replayed)
  //     norms.push_back(step->last_call().host_values.at(0).toDouble());
  struct Call {
    enum class Kind { Eager, Captured, Replayed };
    Kind kind = Kind::Eager;
    std::vector<c10::IValue> host_values;
  };
  struct Impl;
  explicit CompiledStep(std::unique_ptr<Impl> impl);
  ~CompiledStep();
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& inputs);
  CompileStats stats() const;
  std::string eager_reason() const;
  // The graph of the newest compiled entry (nullptr if none).
  const ir::Graph* graph() const;
  // The latest call (see Call); not synchronized with calls on other threads.
  const Call& last_call() const;

 private:
  std::unique_ptr<Impl> impl_;
};

std::shared_ptr<CompiledStep> compile_step(std::shared_ptr<torch::nn::Module> model,
                                           torch::optim::Optimizer& optimizer,
                                           CompiledFunction::Fn step, CompileOptions options = {});

template <class M>
std::shared_ptr<CompiledStep> compile_step(const torch::nn::ModuleHolder<M>& model, torch::optim::Optimizer& optimizer,
                                           CompiledFunction::Fn step, CompileOptions options = {}) {
  return compile_step(std::static_pointer_cast<torch::nn::Module>(model.ptr()), optimizer, std::move(step),
                      std::move(options));
}

// Several models and optimizers stepped by one function (a GAN's generator and
// discriminator with an optimizer each):
//   auto step = tcap::compile_step({gen.ptr(), disc.ptr()}, {opt_g, opt_d}, fn);
std::shared_ptr<CompiledStep> compile_step(std::vector<std::shared_ptr<torch::nn::Module>> models,
                                           std::vector<std::reference_wrapper<torch::optim::Optimizer>> optimizers,
                                           CompiledFunction::Fn step, CompileOptions options = {});

}  // namespace tcap
