// Capturing one call of a compiled function: its forward (recorded while it runs) and the
// backward of that region (recorded when the user's backward() reaches it), turned into
// a JointGraph. See Note [Cutting a region's backward] in region.cpp.
#pragma once

#include <tcap/partition.h>

#include "capture/armed.h"
#include "capture/session.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tcap::aot {

// Why a recorded call cannot be replayed ("" if it can): an operator this LibTorch does not
// have, an argument that cannot be rebuilt (a generator). Data-dependent output shapes are
// found while recording (Note [Output shapes that depend on values] in capture/shape_rules.h).
std::string unreplayable(const ir::Graph& g, const ir::Node& n);

// Whether two gradients alias: one tensor, or one storage seen with the same offset,
// sizes, strides and dtype (Note [Tangents that alias] in region.cpp).
bool tangents_alias(const at::Tensor& a, const at::Tensor& b);

class RegionCapture : public capture::BackwardWatcher,
                      public std::enable_shared_from_this<RegionCapture> {
 public:
  // Called once, from the backward that completed the capture (or with an error).
  using Done = std::function<void(RegionCapture&)>;

  RegionCapture();
  ~RegionCapture() override;

  capture::Session& session() override { return *session_; }
  void backward_finished(bool ok) override;
  bool done() const override;

  // --- forward -----------------------------------------------------------------------
  // Declares the call's inputs, then runs fn with recording on. Returns fn's outputs.
  std::vector<at::Tensor> record_forward(
      const std::function<std::vector<at::Tensor>()>& fn,
      const std::vector<std::pair<at::Tensor, std::pair<ir::InputKind, std::string>>>& inputs);
  // Why the recorded forward cannot be compiled ("" if it can).
  std::string check_forward(const std::vector<at::Tensor>& outputs);
  // Forward-only capture (no backward needed): the joint graph now.
  JointGraph joint_without_backward() const;
  // Installs the observers that cut the backward; "" on success, else why not.
  std::string watch_backward(const std::vector<at::Tensor>& outputs, Done done);
  // After the backward: the joint graph, or throws c10::Error saying why it cannot be built.
  JointGraph joint_with_backward();
  // Removes the observers from autograd nodes still alive, on the thread that recorded the
  // forward only: another thread may be running a backward over those nodes, so elsewhere
  // they stay, inert (Note [Abandoning a capture]).
  void remove_observers();
  // No backward will be recorded: true if none has started (later observer calls do
  // nothing), false if a backward is recording the region now or already did.
  bool abandon();

  // The tensors of the forward's Input nodes (primals), in order.
  std::vector<at::Tensor> primal_tensors() const;
  // Pairs of outputs whose gradients aliased (one storage, one geometry) when the backward
  // was recorded (Note [Tangents that alias]).
  std::vector<std::pair<int, int>> aliased_tangents() const;

  // Observer callbacks (autograd engine thread).
  void on_tangent(size_t output, const at::Tensor& grad);
  void on_contribution(size_t primal, const at::Tensor& grad);

 private:
  JointGraph build_joint(bool with_backward) const;

  void erase_observers_now();

  std::unique_ptr<capture::Session> session_;
  const std::thread::id owner_ = std::this_thread::get_id();  // the thread that records the forward
  mutable std::mutex mutex_;
  uint64_t seq_begin_ = 0, seq_end_ = 0;
  size_t fw_end_ = 0;
  std::vector<ir::ValueId> output_values_;
  std::vector<std::string> output_names_;
  std::vector<ir::ValueId> primal_values_;
  // Backward observation.
  bool started_ = false;
  bool done_ = false;
  std::string failure_;
  std::vector<ir::ValueId> tangent_value_;                // per output
  std::vector<at::Tensor> tangent_tensor_;                // per output, while recording
  std::vector<std::pair<int, int>> aliased_tangents_;
  std::vector<std::vector<ir::ValueId>> contributions_;   // per primal
  std::mutex observed_mutex_;
  std::vector<std::weak_ptr<torch::autograd::Node>> observed_nodes_;
  Done on_done_;
};

}  // namespace tcap::aot
