#include "step/optimizers.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cmath>

namespace tcap::step {

bool depends_on_lr(HostScalar x) {
  switch (x) {
    case HostScalar::NegLrOverBiasCorrection1:
    case HostScalar::LrOverBiasCorrection1:
    case HostScalar::NegLr:
    case HostScalar::Lr:
    case HostScalar::OneMinusLrTimesWd:
    case HostScalar::NegDecayedLr: return true;
    default: return false;
  }
}

const char* to_string(HostScalar x) {
  switch (x) {
    case HostScalar::SqrtBiasCorrection2: return "sqrt(1 - beta2^step)";
    case HostScalar::NegLrOverBiasCorrection1: return "-lr / (1 - beta1^step)";
    case HostScalar::LrOverBiasCorrection1: return "lr / (1 - beta1^step)";
    case HostScalar::BiasCorrection1: return "1 - beta1^step";
    case HostScalar::BiasCorrection2: return "1 - beta2^step";
    case HostScalar::InvBiasCorrection1: return "1 / (1 - beta1^step)";
    case HostScalar::InvSqrtBiasCorrection2: return "1 / sqrt(1 - beta2^step)";
    case HostScalar::NegLr: return "-lr";
    case HostScalar::Lr: return "lr";
    case HostScalar::OneMinusLrTimesWd: return "1 - lr * weight_decay";
    case HostScalar::NegDecayedLr: return "-lr / (1 + (step - 1) * lr_decay)";
    case HostScalar::Step: return "step";
    case HostScalar::kCount: break;
  }
  return "?";
}

// The same arithmetic, in the same order, as torch::optim's step() implementations.
double evaluate(HostScalar x, const HostState& s) {
  const double c1 = 1 - std::pow(s.beta1, static_cast<double>(s.step));
  const double c2 = 1 - std::pow(s.beta2, static_cast<double>(s.step));
  switch (x) {
    case HostScalar::SqrtBiasCorrection2: return std::sqrt(c2);
    case HostScalar::NegLrOverBiasCorrection1: return -(s.lr / c1);
    case HostScalar::LrOverBiasCorrection1: return s.lr / c1;
    case HostScalar::BiasCorrection1: return c1;
    case HostScalar::BiasCorrection2: return c2;
    case HostScalar::InvBiasCorrection1: return 1 / c1;
    case HostScalar::InvSqrtBiasCorrection2: return 1 / std::sqrt(c2);
    case HostScalar::NegLr: return -1 * s.lr;
    case HostScalar::Lr: return s.lr;
    case HostScalar::OneMinusLrTimesWd: return 1 - s.lr * s.weight_decay;
    case HostScalar::NegDecayedLr: return -(s.lr / (1 + static_cast<double>(s.step - 1) * s.lr_decay));
    case HostScalar::Step: return static_cast<double>(s.step);
    case HostScalar::kCount: break;
  }
  return std::nan("");
}

std::vector<at::Tensor> OptimizerAdapter::params() const {
  std::vector<at::Tensor> ps;
  for (auto& g : opt_->param_groups()) {
    for (auto& p : g.params()) ps.push_back(p);
  }
  return ps;
}

torch::optim::OptimizerParamState* OptimizerAdapter::state_of(const at::Tensor& p) const {
  auto it = opt_->state().find(p.unsafeGetTensorImpl());
  return it == opt_->state().end() ? nullptr : it->second.get();
}

OptimizerAdapter::StateCopy OptimizerAdapter::copy_state() const {
  StateCopy out;
  for (const auto& [key, st] : opt_->state()) {
    if (st) out.emplace_back(key, st->clone());
  }
  return out;
}

void OptimizerAdapter::restore_state(const StateCopy& copy) const {
  auto& state = opt_->state();
  state.clear();
  for (const auto& [key, st] : copy) state[key] = st->clone();
}

torch::optim::OptimizerOptions& OptimizerAdapter::group_options_of(size_t j) const {
  size_t k = 0;
  for (auto& g : opt_->param_groups()) {
    if (j < k + g.params().size()) return g.options();
    k += g.params().size();
  }
  TORCH_CHECK(false, "tcap: parameter ", j, " is not in the optimizer");
}

size_t OptimizerAdapter::group_of(size_t j) const {
  size_t k = 0, g = 0;
  for (auto& group : opt_->param_groups()) {
    if (j < k + group.params().size()) return g;
    k += group.params().size();
    ++g;
  }
  TORCH_CHECK(false, "tcap: parameter ", j, " is not in the optimizer");
}

void StateSink::add(const at::Tensor& t, size_t j, const char* what) {
  if (!t.defined()) return;
  ts.push_back(t);
  if (params) params->push_back(j);
  if (names) names->push_back(prefix + "p" + std::to_string(j) + "." + what);
  if (key) {
    const auto k = static_cast<uint32_t>(j);
    key->append(reinterpret_cast<const char*>(&k), sizeof(k));
    key->append(what).push_back('\0');
  }
}

namespace {

// Parameter j of `opt`, in group order, without building the whole list: host_state(j)
// runs for every parameter on every replayed step, so params()[j] there made a step
// quadratic in the number of parameters.
const at::Tensor& param_at(torch::optim::Optimizer& opt, size_t j) {
  size_t k = 0;
  for (auto& g : opt.param_groups()) {
    if (j < k + g.params().size()) return g.params()[j - k];
    k += g.params().size();
  }
  TORCH_CHECK(false, "tcap: parameter ", j, " is not in the optimizer");
}

class SgdAdapter : public OptimizerAdapter {
 public:
  explicit SgdAdapter(torch::optim::SGD& o) : OptimizerAdapter(o) {}
  void state_tensors(StateSink& sink) const override {
    const auto ps = params();
    for (size_t j = 0; j < ps.size(); ++j) {
      if (auto* st = state_of(ps[j])) {
        sink.add(static_cast<torch::optim::SGDParamState&>(*st).momentum_buffer(), j, "momentum_buffer");
      }
    }
  }
  void guarded_options(const std::string& prefix, std::vector<double>& values,
                       std::vector<std::string>* names) const override {
    size_t g = 0;
    for (auto& group : optimizer().param_groups()) {
      auto& o = static_cast<torch::optim::SGDOptions&>(group.options());
      const std::string p = names ? prefix + "group" + std::to_string(g) + "." : std::string();
      ++g;
      for (auto [v, n] : {std::pair<double, const char*>{o.momentum(), "momentum"}, {o.dampening(), "dampening"},
                          {o.weight_decay(), "weight_decay"}, {o.nesterov() ? 1.0 : 0.0, "nesterov"}}) {
        values.push_back(v);
        if (names) names->push_back(p + n);
      }
    }
  }
  std::vector<HostScalar> host_scalars() const override { return {HostScalar::NegLr, HostScalar::Lr}; }
  HostState host_state(size_t j) const override {
    HostState s;
    s.lr = static_cast<torch::optim::SGDOptions&>(group_options_of(j)).lr();
    return s;
  }
  FusedForm fused_form(size_t j) const override {
    auto& o = static_cast<torch::optim::SGDOptions&>(group_options_of(j));
    FusedForm f;
    f.kind = FusedForm::Kind::Sgd;
    f.momentum = o.momentum();
    f.dampening = o.dampening();
    f.weight_decay = o.weight_decay();
    f.nesterov = o.nesterov();
    f.group = group_of(j);
    return f;
  }
};

// Adam and AdamW share their options' and state's shape under two types.
template <class Options, class State, bool kDecoupled>
class AdamAdapter : public OptimizerAdapter {
 public:
  explicit AdamAdapter(torch::optim::Optimizer& o) : OptimizerAdapter(o) {}
  void state_tensors(StateSink& sink) const override {
    const auto ps = params();
    for (size_t j = 0; j < ps.size(); ++j) {
      auto* st = state_of(ps[j]);
      if (!st) continue;
      auto& s = static_cast<State&>(*st);
      sink.add(s.exp_avg(), j, "exp_avg");
      sink.add(s.exp_avg_sq(), j, "exp_avg_sq");
      sink.add(s.max_exp_avg_sq(), j, "max_exp_avg_sq");
    }
  }
  void guarded_options(const std::string& prefix, std::vector<double>& values,
                       std::vector<std::string>* names) const override {
    size_t g = 0;
    for (auto& group : optimizer().param_groups()) {
      auto& o = static_cast<Options&>(group.options());
      const std::string p = names ? prefix + "group" + std::to_string(g) + "." : std::string();
      ++g;
      for (auto [v, n] : {std::pair<double, const char*>{std::get<0>(o.betas()), "beta1"},
                          {std::get<1>(o.betas()), "beta2"},
                          {o.eps(), "eps"},
                          {o.weight_decay(), "weight_decay"},
                          {o.amsgrad() ? 1.0 : 0.0, "amsgrad"}}) {
        values.push_back(v);
        if (names) names->push_back(p + n);
      }
    }
  }
  std::vector<HostScalar> host_scalars() const override {
    std::vector<HostScalar> x = {HostScalar::SqrtBiasCorrection2, HostScalar::NegLrOverBiasCorrection1,
                                 HostScalar::LrOverBiasCorrection1, HostScalar::BiasCorrection1,
                                 HostScalar::BiasCorrection2, HostScalar::InvBiasCorrection1,
                                 HostScalar::InvSqrtBiasCorrection2};
    if (kDecoupled) x.push_back(HostScalar::OneMinusLrTimesWd);
    return x;
  }
  HostState host_state(size_t j) const override {
    auto& o = static_cast<Options&>(group_options_of(j));
    HostState s;
    s.lr = o.lr();
    s.beta1 = std::get<0>(o.betas());
    s.beta2 = std::get<1>(o.betas());
    s.weight_decay = o.weight_decay();
    auto* st = state_of(param_at(optimizer(), j));
    s.step = (st ? static_cast<State&>(*st).step() : 0) + 1;
    return s;
  }
  int lr_uses(size_t j) const override {
    return kDecoupled && static_cast<Options&>(group_options_of(j)).weight_decay() != 0 ? 2 : 1;
  }
  FusedForm fused_form(size_t j) const override {
    auto& o = static_cast<Options&>(group_options_of(j));
    FusedForm f;
    f.kind = kDecoupled ? FusedForm::Kind::AdamW : FusedForm::Kind::Adam;
    f.beta1 = std::get<0>(o.betas());
    f.beta2 = std::get<1>(o.betas());
    f.eps = o.eps();
    f.weight_decay = o.weight_decay();
    f.amsgrad = o.amsgrad();
    f.group = group_of(j);
    return f;
  }
  void advance() override {
    for (const auto& p : params()) {
      if (!p.grad().defined()) continue;
      if (auto* st = state_of(p)) {
        auto& s = static_cast<State&>(*st);
        s.step(s.step() + 1);
      }
    }
  }
};

class AdagradAdapter : public OptimizerAdapter {
 public:
  explicit AdagradAdapter(torch::optim::Adagrad& o) : OptimizerAdapter(o) {}
  void state_tensors(StateSink& sink) const override {
    const auto ps = params();
    for (size_t j = 0; j < ps.size(); ++j) {
      if (auto* st = state_of(ps[j])) {
        sink.add(static_cast<torch::optim::AdagradParamState&>(*st).sum(), j, "sum");
      }
    }
  }
  void guarded_options(const std::string& prefix, std::vector<double>& values,
                       std::vector<std::string>* names) const override {
    size_t g = 0;
    for (auto& group : optimizer().param_groups()) {
      auto& o = static_cast<torch::optim::AdagradOptions&>(group.options());
      const std::string p = names ? prefix + "group" + std::to_string(g) + "." : std::string();
      ++g;
      for (auto [v, n] : {std::pair<double, const char*>{o.lr_decay(), "lr_decay"}, {o.weight_decay(), "weight_decay"},
                          {o.eps(), "eps"}}) {
        values.push_back(v);
        if (names) names->push_back(p + n);
      }
    }
  }
  std::vector<HostScalar> host_scalars() const override { return {HostScalar::NegDecayedLr, HostScalar::NegLr}; }
  HostState host_state(size_t j) const override {
    auto& o = static_cast<torch::optim::AdagradOptions&>(group_options_of(j));
    HostState s;
    s.lr = o.lr();
    s.weight_decay = o.weight_decay();
    s.lr_decay = o.lr_decay();
    auto* st = state_of(param_at(optimizer(), j));
    s.step = (st ? static_cast<torch::optim::AdagradParamState&>(*st).step() : 0) + 1;
    return s;
  }
  void advance() override {
    for (const auto& p : params()) {
      if (!p.grad().defined()) continue;
      if (auto* st = state_of(p)) {
        auto& s = static_cast<torch::optim::AdagradParamState&>(*st);
        s.step(s.step() + 1);
      }
    }
  }
};

class RmspropAdapter : public OptimizerAdapter {
 public:
  explicit RmspropAdapter(torch::optim::RMSprop& o) : OptimizerAdapter(o) {}
  void state_tensors(StateSink& sink) const override {
    const auto ps = params();
    for (size_t j = 0; j < ps.size(); ++j) {
      auto* st = state_of(ps[j]);
      if (!st) continue;
      auto& s = static_cast<torch::optim::RMSpropParamState&>(*st);
      sink.add(s.square_avg(), j, "square_avg");
      sink.add(s.momentum_buffer(), j, "momentum_buffer");
      sink.add(s.grad_avg(), j, "grad_avg");
    }
  }
  void guarded_options(const std::string& prefix, std::vector<double>& values,
                       std::vector<std::string>* names) const override {
    size_t g = 0;
    for (auto& group : optimizer().param_groups()) {
      auto& o = static_cast<torch::optim::RMSpropOptions&>(group.options());
      const std::string p = names ? prefix + "group" + std::to_string(g) + "." : std::string();
      ++g;
      for (auto [v, n] : {std::pair<double, const char*>{o.alpha(), "alpha"}, {o.eps(), "eps"},
                          {o.weight_decay(), "weight_decay"}, {o.momentum(), "momentum"},
                          {o.centered() ? 1.0 : 0.0, "centered"}}) {
        values.push_back(v);
        if (names) names->push_back(p + n);
      }
    }
  }
  std::vector<HostScalar> host_scalars() const override { return {HostScalar::NegLr, HostScalar::Lr}; }
  HostState host_state(size_t j) const override {
    HostState s;
    s.lr = static_cast<torch::optim::RMSpropOptions&>(group_options_of(j)).lr();
    return s;
  }
  void advance() override {
    for (const auto& p : params()) {
      if (!p.grad().defined()) continue;
      if (auto* st = state_of(p)) {
        auto& s = static_cast<torch::optim::RMSpropParamState&>(*st);
        s.step(s.step() + 1);
      }
    }
  }
};

}  // namespace

std::unique_ptr<OptimizerAdapter> OptimizerAdapter::make(torch::optim::Optimizer& opt, std::string* why_not) {
  // Most derived first: AdamW is not an Adam, but check the exact types anyway.
  if (auto* o = dynamic_cast<torch::optim::SGD*>(&opt)) return std::make_unique<SgdAdapter>(*o);
  if (auto* o = dynamic_cast<torch::optim::AdamW*>(&opt)) {
    return std::make_unique<AdamAdapter<torch::optim::AdamWOptions, torch::optim::AdamWParamState, true>>(*o);
  }
  if (auto* o = dynamic_cast<torch::optim::Adam*>(&opt)) {
    return std::make_unique<AdamAdapter<torch::optim::AdamOptions, torch::optim::AdamParamState, false>>(*o);
  }
  if (auto* o = dynamic_cast<torch::optim::Adagrad*>(&opt)) return std::make_unique<AdagradAdapter>(*o);
  if (auto* o = dynamic_cast<torch::optim::RMSprop*>(&opt)) return std::make_unique<RmspropAdapter>(*o);
  if (dynamic_cast<torch::optim::LBFGS*>(&opt)) {
    *why_not = "LBFGS re-evaluates its closure a data-dependent number of times per step";
  } else {
    *why_not = "compile_step knows SGD, Adam, AdamW, Adagrad and RMSprop; this optimizer is none of them";
  }
  return nullptr;
}

}  // namespace tcap::step
