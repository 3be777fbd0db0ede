// Capture: record the ATen calls a block of LibTorch code makes, forward and backward.
//
//   tcap::CaptureGuard capture;              // recording on (this thread) from here
//   capture.register_module(*model);         // name parameters and buffers
//   auto x = capture.input(torch::randn({4, 10}), "x");
//   auto loss = torch::mse_loss(model->forward(x), y);
//   capture.output(loss, "loss");
//   loss.backward();                         // recorded too, hooks as call_hook nodes
//   tcap::ir::save_json(capture.graph(), "step.json");
//
// See docs/architecture.md ("Capture") for what is recorded and how.
#pragma once

#include <tcap/graph.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace tcap {

namespace capture {
class Session;
}

struct CaptureOptions {
  // Record the ops of backward() / torch::autograd::grad() called inside the guard.
  bool record_backward = true;
  // Turn autograd's per-device worker threads off during capture, so that every op the
  // engine runs is recorded on this thread in a deterministic order.
  bool single_threaded_autograd = true;
};

// RAII: while alive, every ATen call made on this thread (and by the autograd engine
// serving backward() calls made on this thread) is recorded into graph(). Guards nest:
// an op is recorded by every guard alive on the thread.
class CaptureGuard {
 public:
  explicit CaptureGuard(CaptureOptions options = {});
  ~CaptureGuard();
  CaptureGuard(const CaptureGuard&) = delete;
  CaptureGuard& operator=(const CaptureGuard&) = delete;

  // Names the parameters ("fc1.weight") and buffers ("bn.running_mean") of a module, so
  // they become parameter / buffer inputs when first used.
  void register_module(const torch::nn::Module& module, const std::string& prefix = "");
  // Declares t a user input called `name` (an Input node is made now); returns t.
  const at::Tensor& input(const at::Tensor& t, const std::string& name);
  // Marks t (which must have been produced or read inside the capture) as a graph output.
  void output(const at::Tensor& t, const std::string& name = "");
  // Stops recording (the guard keeps the graph readable). Idempotent.
  void stop();
  bool active() const;

  // A snapshot of the graph so far, ended by an Output node: the marked outputs, then the
  // gradient of every input leaf (parameter or user input requiring grad) whose .grad was
  // produced inside the capture (named after the input, kind Grad). Ops recorded later are not in the returned copy.
  ir::Graph graph() const;
  // The tensors bound to the graph's Input nodes, in input order, as seen during capture.
  std::vector<at::Tensor> input_tensors() const;
  // The value currently bound to t in the graph, if t was seen.
  std::optional<ir::ValueId> value_of(const at::Tensor& t) const;

 private:
  std::unique_ptr<capture::Session> session_;
  bool stopped_ = false;
};

// The dispatch key tcap records on (chosen at first use among Fake, DeferredInit,
// TESTING_ONLY_GenericMode: the first without a backend fallback).
std::string capture_dispatch_key();

}  // namespace tcap
