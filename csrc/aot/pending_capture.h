// The capturing first call of a tcap::compile entry, waiting for its backward.
//
// The call ran eagerly with recording on (RegionCapture::record_forward) and returned
// eager outputs. When the user's backward reaches the region, observers record that
// backward and, on the backward's thread and inside it, the joint graph is compiled
// (Note [Cutting a region's backward]). The next call of the function collects the
// result: a compiled entry, or why the backward could not be captured. If two more calls
// pass without a backward, the forward is compiled alone (a backward then recomputes).
#pragma once

#include "aot/region.h"
#include "aot/region_entry.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
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
  // Removes the observers and disarms the capture (not from inside a backward).
  void close() { stop_watching(); }
  // Counts a call made while waiting; returns how many.
  int note_call() { return ++calls_since_; }

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
  int calls_since_ = 0;
};

}  // namespace tcap::aot
