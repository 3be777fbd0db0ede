// The program side of the real-programs tier (test/programs/, docs/programs.md): what a
// program written once as ordinary LibTorch code gives the runners (the test harness,
// harness.h, and tcap-bench's program workloads): its models, optimizers, seeded data and
// train_step, and a way to route its forwards through tcap::compile.
#pragma once

#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/train_step.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tcap::programs {

using Tensors = std::vector<at::Tensor>;
using Forward = std::function<at::Tensor(const at::Tensor&)>;

class Program {
 public:
  virtual ~Program() = default;
  virtual std::string name() const = 0;
  // The models (parameters and buffers compared; compile_step's models) and optimizers.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> modules() = 0;
  virtual std::vector<torch::optim::Optimizer*> optimizers() = 0;
  // The batch of a step: the same tensors for every run (a generator seeded per step).
  virtual Tensors batch(int step) = 0;
  // Host-side work before a step (a learning-rate schedule).
  virtual void before_step(int /*step*/) {}
  // The training step: returns the losses (scalar tensors).
  virtual Tensors train_step(const Tensors& batch) = 0;
  // Compile mode: route forward(i, .) through tcap::compile; returns the compiled functions.
  virtual std::vector<std::shared_ptr<CompiledFunction>> compile_forwards(const CompileOptions& options) = 0;
  // The part of a parameter compared with eager (all of it unless a program says why not).
  virtual at::Tensor comparable(const std::string& /*name*/, const at::Tensor& param) { return param; }
  // Options a program needs for compile_step (observe_host_values, with its reason).
  virtual void adjust_step_options(CompileOptions& /*options*/) {}
  // compile_step replayed a step: its code did not run. `host_values` are the values that
  // code would have read on the host (CompiledStep::last_call), for the host work it does
  // with them (logging).
  virtual void replayed_step(const std::vector<c10::IValue>& /*host_values*/) {}

  // Host-side side effects of a step (gradient norms logged by hooks, clip_grad_norm_'s
  // result): compared with eager as a multiset per step.
  std::vector<double> host_log;

 protected:
  at::Tensor forward(size_t i, const at::Tensor& x) { return forwards_.at(i)(x); }
  // A program of one model: forward(0, x) calls model->forward(x) ...
  template <class M>
  void set_model(const torch::nn::ModuleHolder<M>& model) {
    std::shared_ptr<M> impl = model.ptr();
    forwards_ = {[impl](const at::Tensor& x) { return impl->forward(x); }};
  }
  // ... or, in compile mode, the model's compiled forward.
  template <class M>
  std::vector<std::shared_ptr<CompiledFunction>> compile_model(const torch::nn::ModuleHolder<M>& model,
                                                               const CompileOptions& options) {
    auto compiled = tcap::compile(model, options);
    forwards_ = {[compiled](const at::Tensor& x) { return compiled->forward(x); }};
    return {compiled};
  }
  std::vector<Forward> forwards_;
};

// Declared as a program's first member: seeds LibTorch before its models are built, so
// every run starts from the same initial weights.
struct Seed {
  explicit Seed(uint64_t seed) { torch::manual_seed(seed); }
};

using ProgramFactory = std::function<std::unique_ptr<Program>()>;

enum class Mode { Eager, Capture, Compile, CompileStep, CompiledAutograd };

// Runs a program's steps in one mode (eager, compile, compile_step or compiled autograd;
// capture is the test harness's own): the mode is set up at construction, step() runs one
// training step in it, served() says how many calls compiled graphs served.
class ModeRunner {
 public:
  // fused_optimizers: CompileOptions::fused_optimizers for compile_step.
  ModeRunner(Program& p, Mode mode, const std::string& backend, bool fused_optimizers = false) : p_(p), mode_(mode) {
    options_.name = p.name();
    options_.backend = backend;
    options_.fused_optimizers = fused_optimizers;
    if (mode == Mode::Compile) compiled_ = p.compile_forwards(options_);
    if (mode == Mode::CompileStep) {
      p.adjust_step_options(options_);
      std::vector<std::reference_wrapper<torch::optim::Optimizer>> opts;
      for (auto* o : p.optimizers()) opts.emplace_back(*o);
      step_ = compile_step(p.modules(), opts, [&p](const Tensors& in) { return p.train_step(in); }, options_);
    }
    if (mode == Mode::CompiledAutograd) reset_compiled_autograd();
  }
  Tensors step(const Tensors& batch) {
    ++steps_;
    switch (mode_) {
      case Mode::CompileStep: {
        auto losses = (*step_)(batch);
        if (step_->last_call().kind == CompiledStep::Call::Kind::Replayed) p_.replayed_step(step_->last_call().host_values);
        return losses;
      }
      case Mode::CompiledAutograd: {
        CompiledAutogradGuard guard(options_);
        auto losses = p_.train_step(batch);
        ca_stats_ = guard.stats();
        return losses;
      }
      default: return p_.train_step(batch);
    }
  }
  // {calls served by compiled graphs, calls}: replays of the compiled forwards or step,
  // hits of the compiled backwards; every step for eager.
  std::pair<int, int> served() const {
    int served = 0, calls = 0;
    switch (mode_) {
      case Mode::Compile:
        for (const auto& f : compiled_) {
          auto s = f->stats();
          served += s.replays;
          calls += s.replays + s.captures + s.eager_calls;
        }
        return {served, calls};
      case Mode::CompileStep: return {step_->stats().replays, steps_};
      case Mode::CompiledAutograd: return {ca_stats_.replays, ca_stats_.calls};
      default: return {steps_, steps_};
    }
  }

 private:
  Program& p_;
  Mode mode_;
  CompileOptions options_;
  std::vector<std::shared_ptr<CompiledFunction>> compiled_;
  std::shared_ptr<CompiledStep> step_;
  CompiledAutogradStats ca_stats_;
  int steps_ = 0;
};

// A generator seeded for one step of one program.
inline at::Generator step_generator(uint64_t program_seed, int step) {
  return at::make_generator<at::CPUGeneratorImpl>(program_seed * 1000003 + static_cast<uint64_t>(step));
}

}  // namespace tcap::programs
