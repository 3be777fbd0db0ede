#include "aot/pending_capture.h"

#include "capture/armed.h"

namespace tcap::aot {

PendingCapture::PendingCapture(std::shared_ptr<RegionCapture> capture, std::shared_ptr<RegionEntry> entry,
                               CompileOptions options)
    : capture_(std::move(capture)), entry_(std::move(entry)), options_(std::move(options)) {}

PendingCapture::~PendingCapture() { stop_watching(); }

void PendingCapture::stop_watching() {
  if (!watching_.exchange(false)) return;
  capture_->remove_observers();
  capture::disarm_watcher(capture_.get());
}

std::string PendingCapture::watch(const std::vector<at::Tensor>& outputs) {
  std::weak_ptr<PendingCapture> weak = weak_from_this();
  // Runs on the thread that ran the backward, inside it.
  std::string why = capture_->watch_backward(outputs, [weak](RegionCapture& c) {
    if (auto self = weak.lock()) self->on_backward(c);
  });
  if (!why.empty()) {
    capture_->remove_observers();
    return why;
  }
  watching_.store(true);
  capture::arm_watcher(capture_);
  return "";
}

void PendingCapture::on_backward(RegionCapture& c) {
  std::shared_ptr<RegionEntry> ready;
  std::string failure;
  bool replaces = false;
  try {
    replaces = compile_region(*entry_, c.joint_with_backward(), /*has_backward=*/true, c.primal_tensors(), options_,
                              host_miss_of.get());
    entry_->aliased_tangents = c.aliased_tangents();
    ready = entry_;
  } catch (const c10::Error& err) {
    failure = err.what_without_backtrace();
  } catch (const std::exception& err) {
    failure = err.what();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  ready_ = std::move(ready);
  replaces_ = replaces;
  failure_ = std::move(failure);
  finished_ = true;
}

bool PendingCapture::finished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_;
}

std::shared_ptr<RegionEntry> PendingCapture::result(std::string* failure, bool* replaces) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!ready_ && failure) *failure = failure_;
  if (replaces) *replaces = replaces_;
  return ready_;
}

bool PendingCapture::drop() {
  if (!capture_->abandon()) return false;  // Note [Abandoning a capture]
  stop_watching();
  return true;
}

std::shared_ptr<RegionEntry> PendingCapture::compile_forward_only(bool* replaces) {
  if (!drop()) return nullptr;
  const bool r = compile_region(*entry_, capture_->joint_without_backward(), /*has_backward=*/false,
                                capture_->primal_tensors(), options_, host_miss_of.get());
  if (replaces) *replaces = r;
  return entry_;
}

}  // namespace tcap::aot
