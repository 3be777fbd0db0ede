// The public CaptureGuard (include/tcap/capture.h).
#include <tcap/capture.h>

#include "capture/hooks.h"
#include "capture/recorder.h"
#include "capture/session.h"
#include "support/logging.h"

#include <c10/core/AutogradState.h>
#include <torch/nn/module.h>
#include <torch/version.h>

namespace tcap {

CaptureGuard::CaptureGuard(CaptureOptions options)
    : session_(std::make_unique<capture::Session>(options)) {
  auto& s = *session_;
  const c10::DispatchKey key = capture::recording_key();
  s.graph_.meta()["torch_version"] = TORCH_VERSION;
  s.graph_.meta()["dispatch_key"] = c10::toString(key);
  if (options.record_backward) {
    s.engine_lease_ = std::make_unique<capture::EngineHookLease>(&capture::capture_backward_driver);
  }
  auto& autograd_tls = c10::AutogradState::get_tls_state();
  s.prev_multithreading_ = autograd_tls.get_multithreading_enabled();
  if (options.single_threaded_autograd) autograd_tls.set_multithreading_enabled(false);
  capture::push_session(session_.get());
}

CaptureGuard::~CaptureGuard() { stop(); }

void CaptureGuard::stop() {
  if (stopped_) return;
  stopped_ = true;
  auto& s = *session_;
  s.set_recording(false);
  capture::pop_session(session_.get());
  c10::AutogradState::get_tls_state().set_multithreading_enabled(s.prev_multithreading_);
  s.engine_lease_.reset();
}

bool CaptureGuard::active() const { return !stopped_; }

void CaptureGuard::register_module(const torch::nn::Module& module, const std::string& prefix) {
  const std::string p = prefix.empty() ? "" : prefix + ".";
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    session_->name_tensor(item.value(), ir::InputKind::Parameter, p + item.key());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    session_->name_tensor(item.value(), ir::InputKind::Buffer, p + item.key());
  }
}

const at::Tensor& CaptureGuard::input(const at::Tensor& t, const std::string& name) {
  session_->declare_input(t, name);
  return t;
}

void CaptureGuard::output(const at::Tensor& t, const std::string& name) {
  session_->mark_output(t, name);
}

ir::Graph CaptureGuard::graph() const {
  ir::Graph g = session_->snapshot();
  TCAP_LOG(Graphs, "captured graph:\n" << ir::to_string(g));
  return g;
}

std::vector<at::Tensor> CaptureGuard::input_tensors() const { return session_->input_tensors(); }

std::optional<ir::ValueId> CaptureGuard::value_of(const at::Tensor& t) const {
  return session_->lookup(t);
}

std::string capture_dispatch_key() { return c10::toString(capture::recording_key()); }

}  // namespace tcap
