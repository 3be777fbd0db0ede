// The gradient bucketing engine of tcap::DistributedDataParallel (docs/distributed.md).
#pragma once

#include <tcap/distributed.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <tuple>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tcap {

// Tensors that can share one flat buffer: same dtype and device.
using FlatKey = std::tuple<int, int, int>;
inline FlatKey flat_key(const at::Tensor& t) {
  return {static_cast<int>(t.scalar_type()), static_cast<int>(t.device().type()), t.device().index()};
}

// The tensors of `group` flattened into one (their elements in order).
inline at::Tensor flatten(const std::vector<at::Tensor>& group) {
  std::vector<at::Tensor> parts;
  parts.reserve(group.size());
  for (const auto& t : group) parts.push_back(t.reshape({-1}));
  return at::cat(parts);
}

// An exception's message without c10::Error's backtrace (for the causes our errors quote).
inline const char* message_of(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  return c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
}

// Note [DDP buckets driven by post-accumulate-grad hooks]
// c10d::Reducer, the engine of PyTorch's DDP, has a public C++ constructor, but it drives
// itself with *post hooks on AccumulateGrad nodes* (whose compiled_args throws) and ends
// every backward with Engine::queue_callback, which needs the engine's GraphTask. tcap's
// compiled autograd replaces the engine and hands each leaf gradient to its
// AccumulateGrad directly (docs/compiled-autograd.md): Reducer's hooks would not run and
// its final callback could not be queued, and the walk refuses AccumulateGrad post hooks.
// So buckets are driven by *tensor post-accumulate-grad hooks* (one per parameter), which
// AccumulateGrad::apply runs itself: under the engine, under a tcap::compile region's
// backward (AccumulateGrad stays the engine's), and under compiled autograd (the replay
// calls the real AccumulateGrad after the compiled graph). A hook copies the gradient into
// its bucket; when a bucket is full, it and every full bucket before it start their
// all-reduce (in bucket order, so every rank issues the same collectives in the same order
// whatever order gradients arrive in); the hook that starts the last bucket waits for all
// of them and writes the averages back into .grad. No final callback is needed for the
// result; one is queued where the engine allows it, only to report unused parameters at
// the end of that backward (elsewhere the next pre_forward() reports them).
//
// Note [Unused parameters]
// With DDPOptions::find_unused_parameters, a parameter that gets no gradient on this rank
// is reduced as if its gradient were its current .grad (zeros when it has none), as
// PyTorch's Reducer does. Which parameters those are is known at two points: forward()
// walks the autograd graph from its output (prepare_for_backward) and the first hook of
// the backward marks the unreachable ones ready, so buckets start as early as they can
// and compiled autograd, which has no final callback, completes in the hooks; under the
// engine, the final callback marks whatever is still missing (a forward that did not go
// through forward(), a compiled wrapper's replay). Every rank marks alike the buckets it
// launches, in bucket order, so the collectives match across ranks. After the buckets, a
// small all-reduce of the "used here" flags tells which parameters no rank used: their
// .grad is left as it was (an optimizer skips an undefined one), the others get the
// average.
struct DistributedDataParallelImpl::Reducer {
  struct Bucket {
    std::vector<size_t> params;    // indices into Reducer::params
    std::vector<int64_t> offsets;  // each parameter's first element in `flat`
    at::Tensor flat;               // the bucket's gradients, flattened
    size_t pending = 0;            // gradients still to come in this backward
  };

  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, c10::intrusive_ptr<c10d::Backend> pg,
          const DDPOptions& options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Installs one post-accumulate-grad hook per parameter; they hold `self` weakly.
  static void install_hooks(const std::shared_ptr<Reducer>& self);
  void remove_hooks();

  // The hook body: parameter `index` has its gradient accumulated.
  void on_grad(size_t index, const at::Tensor& param);
  // Throws (and resets) if a synced backward left gradients unreduced.
  void check_finished();
  // With find_unused_parameters: the parameters `output`'s autograd graph cannot reach get
  // no gradient in the coming backward (Note [Unused parameters]).
  void prepare_for_backward(const at::Tensor& output);

  // Note [Collectives in a compiled step] (collectives.h): the ops' kernels. The average
  // over ranks of each bucket's flat gradients (fresh tensors; the inputs are not
  // changed), and rank 0's values of each flat buffer group.
  std::vector<at::Tensor> all_reduce_flats(const std::vector<at::Tensor>& flats);
  std::vector<at::Tensor> broadcast_flats(const std::vector<at::Tensor>& flats);

  bool sync = true;  // false inside DistributedDataParallel::no_sync()
  int64_t id = 0;    // in the collectives' registry (collectives.h)
  DDPStats stats;

 private:
  void reset_locked();
  // on_grad while a capture records collectives: the gradients are collected, and the
  // last one reduces them all with recorded ops (Note [Collectives in a compiled step]).
  void on_grad_recorded(size_t index, const at::Tensor& param);
  void queue_end_of_backward_locked();
  [[noreturn]] void fail_collective_unlocked(const std::exception& e);
  void launch_ready_locked();
  void finish_locked();
  void end_of_backward();
  [[noreturn]] void fail_unfinished_locked();
  void mark_unused_locked(size_t index);
  // Copies parameter `index`'s .grad (zeros when undefined) into its bucket, one fewer
  // pending; true when it had a gradient.
  bool stage_grad_locked(size_t index);
  std::string missing_locked() const;
  std::string bucket_text(size_t b) const;
  [[noreturn]] void fail_collective(const std::exception& e);

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  c10::intrusive_ptr<c10d::Backend> pg_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> slot_;  // per parameter: (bucket, position in bucket)
  std::vector<char> seen_;                       // per parameter, this backward
  std::vector<char> used_;                       // per parameter: had a gradient here, this backward
  std::vector<at::Tensor> recorded_;             // per parameter: its .grad, while recording
  const bool find_unused_;
  std::unordered_map<const c10::TensorImpl*, size_t> index_of_;  // parameter -> index, for the walk
  std::vector<size_t> unreachable_;  // found by prepare_for_backward, for the next backward
  bool prepared_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  size_t next_launch_ = 0;
  bool started_ = false;    // a synced backward is under way
  std::string unfinished_;  // set when a backward ended with gradients unreduced
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point first_launch_;
  std::chrono::steady_clock::time_point first_grad_;
  mutable std::mutex mutex_;
};

// Runs collectives and their bookkeeping with tcap's recording key off when a capture is
// recording on this thread, so that they are neither recorded nor replayed; the callers
// decide whether the capture may still be compiled (capture::Session::note_unreplayable).
class HiddenFromCapture {
 public:
  HiddenFromCapture();
  bool capturing() const { return capturing_; }

 private:
  bool capturing_ = false;
  std::optional<c10::impl::ExcludeDispatchKeyGuard> guard_;
};

}  // namespace tcap
