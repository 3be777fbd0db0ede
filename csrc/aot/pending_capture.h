// The capturing first call of a tcap::compile entry, waiting for its backward.
//
// The call ran eagerly with recording on (RegionCapture::record_forward) and returned
// eager outputs. When the user's backward reaches the region, observers record that
// backward and, on the backward's thread and inside it, the joint graph is compiled
// (Note [Cutting a region's backward]). The next call of the function collects the
// result: a compiled entry, or why the backward could not be captured. Calls made
// meanwhile run eagerly, until the capture is given up (Note [Waiting for the first
// backward]).
#pragma once

#include "aot/region.h"
#include "aot/region_entry.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tcap::aot {

class PendingCapture : public std::enable_shared_from_this<PendingCapture> {
 public:
  PendingCapture(std::shared_ptr<RegionCapture> capture, std::shared_ptr<RegionEntry> entry, CompileOptions options);
  ~PendingCapture();
  PendingCapture(const PendingCapture&) = delete;
  PendingCapture& operator=(const PendingCapture&) = delete;

  // Installs the observers on the outputs' autograd graph and arms the capture; "" on
  // success, else why the backward cannot be captured (nothing is left installed).
  std::string watch(const std::vector<at::Tensor>& outputs);
  // Whether the backward has come (and the entry was compiled, or failed).
  bool finished() const;
  // After finished(): the compiled entry, or nullptr with `failure` set. `replaces`
  // receives whether it generalizes host_miss_of (Note [Observed host values]).
  std::shared_ptr<RegionEntry> result(std::string* failure, bool* replaces = nullptr) const;
  // No backward came: compiles the forward alone. Throws c10::Error if it cannot. Returns
  // nullptr, changing nothing, when a backward (on another thread) is recording the
  // capture right now or already did: keep waiting for finished().
  std::shared_ptr<RegionEntry> compile_forward_only(bool* replaces = nullptr);
  // No backward came, and the capture goes: true when it was abandoned, false (changing
  // nothing) when a backward is recording it right now or already did.
  bool drop();
  // Removes the observers and disarms the capture (not from inside a backward).
  void close() { stop_watching(); }

  // Note [Waiting for the first backward]
  // Until the capturing call's backward comes, calls run eagerly. Two more calls on the
  // capturing thread without it mean none is coming (its outputs were used without a
  // backward: an evaluation under grad mode, or several calls summed into one loss): the
  // forward is compiled alone. Calls on other threads say nothing of that backward (the
  // threads of a served or Hogwild-trained model each run their own forward and backward,
  // and the capturing thread may merely be descheduled), so they count apart: after
  // kOtherThreadCalls of them the capture is dropped and the calling thread captures
  // again, its own backward completing the new one. Counting every call alike compiled a
  // forward-only entry whenever the capturing thread's backward came late, and the model
  // then trained at eager's speed for good.
  static constexpr int kOwnThreadCalls = 2;
  static constexpr int kOtherThreadCalls = 64;
  enum class Waited { StayEager, CompileForwardAlone, CaptureAgain };
  // Counts a call made while waiting (callers serialize these) and says what it does.
  Waited note_call() {
    if (std::this_thread::get_id() == capturer_) {
      return ++own_calls_ > kOwnThreadCalls ? Waited::CompileForwardAlone : Waited::StayEager;
    }
    return ++other_calls_ > kOtherThreadCalls ? Waited::CaptureAgain : Waited::StayEager;
  }

  // The entry that missed on sizes only when this capture started, and the sizes that
  // changed (for generalizing the new entry, Note [Dynamic sizes]).
  std::shared_ptr<cache::Entry> size_miss_of;
  std::vector<size_t> changed;
  // The entry that missed on a host value alone (Note [Observed host values]).
  std::shared_ptr<const RegionEntry> host_miss_of;

 private:
  void on_backward(RegionCapture& c);
  void stop_watching();

  std::shared_ptr<RegionCapture> capture_;
  std::shared_ptr<RegionEntry> entry_;
  CompileOptions options_;
  mutable std::mutex mutex_;
  bool finished_ = false;
  std::atomic<bool> watching_{false};
  std::shared_ptr<RegionEntry> ready_;
  bool replaces_ = false;
  std::string failure_;
  const std::thread::id capturer_ = std::this_thread::get_id();
  int own_calls_ = 0;
  int other_calls_ = 0;
};

}  // namespace tcap::aot
