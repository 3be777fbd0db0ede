#include "soundness/soundness.h"

namespace tcap::soundness {

Runner::Runner(Mode mode, std::shared_ptr<Net> net, std::string backend, bool compiled)
    : mode_(mode), net_(std::move(net)), compiled_(compiled) {
  options.backend = std::move(backend);
  options.name = std::string("soundness_") + mode_name(mode);
  opt_ = std::make_unique<torch::optim::SGD>(net_->parameters(), torch::optim::SGDOptions(0.05).momentum(0.5));
  if (!compiled_) return;
  std::weak_ptr<Net> weak = net_;
  auto forward = [weak](const Tensors& in) { return Tensors{weak.lock()->run(in.at(0))}; };
  switch (mode_) {
    case Mode::Compile:
      fn_ = tcap::compile(std::static_pointer_cast<nn::Module>(net_), forward, options);
      break;
    case Mode::CompileFn: {
      CompileOptions o = options;
      o.modules = {net_};
      fn_ = tcap::compile(forward, o);
      break;
    }
    case Mode::CompileStep:
      step_ = tcap::compile_step(std::static_pointer_cast<nn::Module>(net_), *opt_,
                                 [this](const Tensors& in) { return Tensors{step_body(in.at(0), in.at(1))}; }, options);
      break;
    case Mode::CompiledAutograd:
      static int runners = 0;  // a cache of its own (guards share one per options)
      options.name += "_" + std::string(options.backend.name()) + "_" + std::to_string(runners++);
      break;
  }
}

at::Tensor Runner::step_body(const at::Tensor& x, const at::Tensor& y) {
  opt_->zero_grad();
  auto loss = torch::mse_loss(net_->run(x), y);
  loss.backward();
  opt_->step();
  return loss;
}

at::Tensor Runner::call(const at::Tensor& x, const at::Tensor& y) {
  if (!compiled_) {
    if (mode_ == Mode::CompileStep) return step_body(x, y);
    for (auto& p : net_->parameters()) p.mutable_grad().reset();
    auto loss = torch::mse_loss(net_->run(x), y);
    loss.backward();
    return loss;
  }
  switch (mode_) {
    case Mode::Compile:
    case Mode::CompileFn: {
      for (auto& p : net_->parameters()) p.mutable_grad().reset();
      auto loss = torch::mse_loss((*fn_)({x}).at(0), y);
      loss.backward();
      return loss;
    }
    case Mode::CompileStep:
      return (*step_)({x, y}).at(0);
    case Mode::CompiledAutograd: {
      for (auto& p : net_->parameters()) p.mutable_grad().reset();
      auto loss = torch::mse_loss(net_->run(x), y);
      CompiledAutogradGuard ca(options);
      loss.backward();
      return loss;
    }
  }
  return {};
}

int Runner::captures() const {
  if (fn_) return fn_->stats().captures;
  if (step_) return step_->stats().captures;
  return 0;
}

::testing::AssertionResult same_state(Net& a, Net& b, Tol tol) {
  auto pb = b.named_parameters();
  for (const auto& item : a.named_parameters()) {
    auto r = tcap::testing::close(item.value(), pb[item.key()], tol.rtol, tol.atol);
    if (!r) return r << " (parameter " << item.key() << ")";
    r = tcap::testing::close(item.value().grad(), pb[item.key()].grad(), tol.rtol, tol.atol);
    if (!r) return r << " (.grad of " << item.key() << ")";
  }
  auto bb = b.named_buffers();
  for (const auto& item : a.named_buffers()) {
    auto r = tcap::testing::close(item.value(), bb[item.key()], tol.rtol, tol.atol);
    if (!r) return r << " (buffer " << item.key() << ")";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace tcap::soundness
