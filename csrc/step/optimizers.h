// What compile_step needs to know about LibTorch's optimizers (torch::optim): their state
// tensors, the options a graph depends on, and the scalars they compute on the host every
// step, so that a replayed step recomputes those (Note [Host scalars of optimizers]).
//
// Supported: SGD, Adam, AdamW, Adagrad, RMSprop. LBFGS (which re-evaluates a closure a
// data-dependent number of times) and optimizers tcap does not know run eagerly.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

namespace tcap::step {

// Note [Host scalars of optimizers]
// An optimizer's step computes some scalars on the host and hands them to ATen ops: the
// learning rate (p.add_(d_p, -lr)), Adam's bias corrections (which change every step),
// Adagrad's decayed rate. A captured step records their values; compile_step finds each
// one again as an expression of the optimizer's host state (HostScalar below), by
// comparing two captures, and a replay evaluates the expression on the state of its own
// step. The learning rate is therefore a graph input: a schedule (StepLR, a hand-written
// warm-up) changes it without a recompile. The other options (betas, momentum, weight
// decay, eps, ...) are guarded: changing one recaptures.
enum class HostScalar {
  SqrtBiasCorrection2,      // sqrt(1 - beta2^s)
  NegLrOverBiasCorrection1, // -lr / (1 - beta1^s)   (Adam's -step_size)
  LrOverBiasCorrection1,    // lr / (1 - beta1^s)
  BiasCorrection1,          // 1 - beta1^s
  BiasCorrection2,          // 1 - beta2^s
  InvBiasCorrection1,       // 1 / (1 - beta1^s)
  InvSqrtBiasCorrection2,   // 1 / sqrt(1 - beta2^s)
  NegLr,                    // -lr   (SGD, RMSprop)
  Lr,                       // lr
  OneMinusLrTimesWd,        // 1 - lr * weight_decay   (AdamW's decoupled decay)
  NegDecayedLr,             // -lr / (1 + (s - 1) * lr_decay)   (Adagrad)
  Step,                     // s   (the step count a fused Adam reads, Note [Fused optimizer steps])
  kCount
};
bool depends_on_lr(HostScalar x);
const char* to_string(HostScalar x);

// The host state a scalar of one parameter's update is computed from.
struct HostState {
  double lr = 0, beta1 = 0, beta2 = 0, weight_decay = 0, lr_decay = 0;
  int64_t step = 0;  // the step count this update uses (after the optimizer's increment)
};
double evaluate(HostScalar x, const HostState& s);

// Which multi-tensor ATen op runs an optimizer's update of a parameter, with the options
// of its parameter group (Note [Fused optimizer steps] in step/fused_optimizers.cpp).
struct FusedForm {
  enum class Kind { None, Adam, AdamW, Sgd } kind = Kind::None;
  double beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;  // Adam, AdamW (and SGD's weight_decay)
  double momentum = 0, dampening = 0;                       // SGD
  bool amsgrad = false, nesterov = false;
  size_t group = 0;  // the parameter group
  bool operator==(const FusedForm& o) const {
    return kind == o.kind && beta1 == o.beta1 && beta2 == o.beta2 && eps == o.eps && weight_decay == o.weight_decay &&
           momentum == o.momentum && dampening == o.dampening && amsgrad == o.amsgrad && nesterov == o.nesterov &&
           group == o.group;
  }
};

// Where an optimizer's state tensors go: the tensors, with their names
// ("<prefix>p<j>.<what>") when `names` is set (a capture), and with a structure key (the
// parameter and slot of each, appended as bytes) when `key` is set. A replay's gather
// takes the key only: no string per tensor (Note [A structure key without names] in
// step_inputs.cpp).
struct StateSink {
  std::vector<at::Tensor>& ts;
  std::vector<std::string>* names = nullptr;
  std::string prefix;
  std::string* key = nullptr;
  std::vector<size_t>* params = nullptr;  // when set: the parameter index j of each tensor
  void add(const at::Tensor& t, size_t j, const char* what);
};

class OptimizerAdapter {
 public:
  // An adapter for `opt`, or nullptr with `why_not` set.
  static std::unique_ptr<OptimizerAdapter> make(torch::optim::Optimizer& opt, std::string* why_not);
  virtual ~OptimizerAdapter() = default;

  torch::optim::Optimizer& optimizer() const { return *opt_; }
  // The optimizer's parameters, in group order.
  std::vector<at::Tensor> params() const;
  // Its state tensors, in parameter order, into `sink`.
  virtual void state_tensors(StateSink& sink) const = 0;
  // The options a graph depends on (all but the learning rate), named when `names` is
  // given ("<prefix>group<g>.<option>").
  virtual void guarded_options(const std::string& prefix, std::vector<double>& values,
                               std::vector<std::string>* names) const = 0;
  // The host scalars its step() computes, in the order they are tried when explaining a
  // captured value (Note [Host scalars of optimizers]).
  virtual std::vector<HostScalar> host_scalars() const = 0;
  // The host state the next step() computes parameter j's scalars from.
  virtual HostState host_state(size_t j) const = 0;
  // How many arguments of parameter j's update the learning rate scales (for checking that
  // a capture found them all before the learning rate stops being guarded).
  virtual int lr_uses(size_t j) const { (void)j; return 1; }
  // After a replayed step: what step() does on the host besides ATen ops (step counters).
  virtual void advance() {}
  // The fused op that can run parameter j's update (Kind::None: none).
  virtual FusedForm fused_form(size_t j) const { (void)j; return {}; }

  // A copy of every parameter's state object (its step counter and the handles of its
  // state tensors, not their values), to put back with restore_state(): a verified step
  // undoes a replay's host effects (Note [Verifying a compiled step]).
  using StateCopy = std::vector<std::pair<void*, std::unique_ptr<torch::optim::OptimizerParamState>>>;
  StateCopy copy_state() const;
  void restore_state(const StateCopy& copy) const;

 protected:
  explicit OptimizerAdapter(torch::optim::Optimizer& opt) : opt_(&opt) {}
  torch::optim::OptimizerParamState* state_of(const at::Tensor& p) const;
  torch::optim::OptimizerOptions& group_options_of(size_t j) const;
  size_t group_of(size_t j) const;

 private:
  torch::optim::Optimizer* opt_;
};

}  // namespace tcap::step
