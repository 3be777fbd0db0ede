// See Note [DDP buckets driven by post-accumulate-grad hooks] (reducer.h).
#include "distributed/reducer.h"

#include "capture/engine_shim.h"
#include "capture/recorder.h"
#include "capture/session.h"
#include "distributed/collectives.h"
#include "support/logging.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <sstream>
#include <tuple>
#include <unordered_set>

namespace tcap {

HiddenFromCapture::HiddenFromCapture() {
  if (capture::thread_sessions().empty()) return;
  capturing_ = true;
  guard_.emplace(capture::recording_key());
}

namespace {

// A RecordedGradHook: under compile_step's capture it reduces through recorded ops
// (Note [Recorded post-accumulate-grad hooks]); what it records depends on no_sync().
struct GradHook : capture::RecordedGradHook {
  GradHook(std::weak_ptr<DistributedDataParallelImpl::Reducer> r, size_t index) : reducer(std::move(r)), index(index) {}
  void operator()(const torch::autograd::Variable& param) override {
    if (auto r = reducer.lock()) r->on_grad(index, param);
  }
  int64_t record_key() const override {
    auto r = reducer.lock();
    return r && r->sync ? 1 : 0;
  }
  std::weak_ptr<DistributedDataParallelImpl::Reducer> reducer;
  size_t index;
};

}  // namespace

DistributedDataParallelImpl::Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                                              c10::intrusive_ptr<c10d::Backend> pg, const DDPOptions& options)
    : params_(std::move(params)), names_(std::move(names)), pg_(std::move(pg)),
      find_unused_(options.find_unused_parameters), timeout_(pg_->getBackendOptions()->timeout) {
  TORCH_CHECK(options.bucket_cap_bytes > 0 && options.first_bucket_cap_bytes > 0,
              "tcap::DistributedDataParallel: bucket caps must be positive");
  // PyTorch's assignment: parameters in reverse order (their gradients come roughly in that
  // order), a new bucket when the cap is reached or the dtype/device changes; the first
  // bucket has its own, smaller cap.
  std::map<FlatKey, size_t> open;  // open bucket per dtype/device
  std::vector<int64_t> bucket_bytes;
  slot_.resize(params_.size());
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& p = params_[k];
    TORCH_CHECK(p.requires_grad(), "tcap::DistributedDataParallel: parameter ", names_[k],
                " does not require grad; leave it out of the module's parameters or set requires_grad");
    TORCH_CHECK(p.layout() == c10::kStrided, "tcap::DistributedDataParallel: parameter ", names_[k],
                " is not a dense tensor (sparse gradients are not supported)");
    const FlatKey key = flat_key(p);
    auto it = open.find(key);
    if (it == open.end() ||
        bucket_bytes[it->second] >= (it->second == 0 ? options.first_bucket_cap_bytes : options.bucket_cap_bytes)) {
      buckets_.emplace_back();
      bucket_bytes.push_back(0);
      it = open.insert_or_assign(key, buckets_.size() - 1).first;
    }
    Bucket& b = buckets_[it->second];
    const int64_t offset = b.offsets.empty() ? 0 : b.offsets.back() + params_[b.params.back()].numel();
    slot_[k] = {it->second, b.params.size()};
    b.params.push_back(k);
    b.offsets.push_back(offset);
    bucket_bytes[it->second] += p.numel() * static_cast<int64_t>(p.element_size());
  }
  for (Bucket& b : buckets_) {
    const at::Tensor& last = params_[b.params.back()];
    b.flat = at::empty({b.offsets.back() + last.numel()}, last.options().requires_grad(false));
    stats.bucket_numel.push_back(b.flat.numel());
  }
  stats.buckets = static_cast<int64_t>(buckets_.size());
  seen_.assign(params_.size(), 0);
  used_.assign(params_.size(), 0);
  for (size_t k = 0; k < params_.size(); ++k) index_of_.emplace(params_[k].unsafeGetTensorImpl(), k);
  reset_locked();
  if (log_enabled(LogChannel::Ddp)) {
    std::ostringstream m;
    m << "rank " << pg_->getRank() << " of " << pg_->getSize() << ": " << buckets_.size()
      << " bucket(s), all-reduced in this order:";
    for (size_t b = 0; b < buckets_.size(); ++b) m << "\n" << bucket_text(b);
    log_line(LogChannel::Ddp, m.str());
  }
}

std::string DistributedDataParallelImpl::Reducer::bucket_text(size_t b) const {
  const Bucket& bucket = buckets_[b];
  std::ostringstream m;
  m << "bucket " << b << ": " << bucket.params.size() << " parameter(s), "
    << static_cast<double>(bucket.flat.numel() * static_cast<int64_t>(bucket.flat.element_size())) / 1024.0
    << " KiB (" << names_[bucket.params.front()];
  if (bucket.params.size() > 1) m << " .. " << names_[bucket.params.back()];
  m << ")";
  return m.str();
}

DistributedDataParallelImpl::Reducer::~Reducer() = default;

void DistributedDataParallelImpl::Reducer::install_hooks(const std::shared_ptr<Reducer>& self) {
  for (size_t k = 0; k < self->params_.size(); ++k) {
    const at::Tensor& p = self->params_[k];
    TORCH_CHECK(!torch::autograd::impl::post_acc_grad_hooks(p), "tcap::DistributedDataParallel: parameter ",
                self->names_[k], " already has a post-accumulate-grad hook (is the model wrapped twice?)");
  }
  for (size_t k = 0; k < self->params_.size(); ++k) {
    torch::autograd::impl::set_post_acc_grad_hooks(self->params_[k], std::make_unique<GradHook>(self, k));
  }
}

void DistributedDataParallelImpl::Reducer::remove_hooks() {
  for (const at::Tensor& p : params_) {
    auto& hook = torch::autograd::impl::post_acc_grad_hooks(p);
    if (hook && dynamic_cast<GradHook*>(hook.get())) hook.reset();
  }
}

void DistributedDataParallelImpl::Reducer::reset_locked() {
  for (Bucket& b : buckets_) b.pending = b.params.size();
  std::fill(seen_.begin(), seen_.end(), 0);
  std::fill(used_.begin(), used_.end(), 0);
  unreachable_.clear();
  prepared_ = false;
  works_.clear();
  next_launch_ = 0;
  started_ = false;
}

void DistributedDataParallelImpl::Reducer::queue_end_of_backward_locked() {
  started_ = true;
  first_grad_ = std::chrono::steady_clock::now();
  // The engine's final callback reports unused parameters at the end of this backward;
  // where there is no engine GraphTask (compiled autograd's replay), pre_forward() does.
  try {
    torch::autograd::Engine::get_default_engine().queue_callback([this] { end_of_backward(); });
  } catch (const c10::Error&) {
  }
}

void DistributedDataParallelImpl::Reducer::on_grad(size_t index, const at::Tensor& param) {
  if (!sync) return;
  if (capture::records_collectives()) {
    if (!find_unused_) return on_grad_recorded(index, param);
    // Which parameters are reduced without a gradient is decided per backward, on the
    // host, across ranks: such a step runs eagerly, its collectives hidden as below.
    for (capture::Session* s : capture::thread_sessions()) {
      s->note_unreplayable(
          "tcap::DistributedDataParallel with find_unused_parameters decides on the host, per backward and "
          "across ranks, which parameters are reduced without a gradient; a replayed step cannot");
    }
  }
  HiddenFromCapture hidden;
  c10::AutoGradMode no_grad(false);
  std::unique_lock<std::mutex> lock(mutex_);
  if (!started_) queue_end_of_backward_locked();
  if (prepared_) {
    prepared_ = false;
    for (size_t k : unreachable_) mark_unused_locked(k);
  }
  TORCH_CHECK(seen_[index] != 2, "tcap::DistributedDataParallel: parameter ", names_[index],
              " received a gradient although forward()'s output does not depend on it: it was used outside the "
              "module's forward (find_unused_parameters walks the autograd graph from forward()'s output, and "
              "its bucket may already be reduced). Use it inside the forward, or mark it requires_grad=false.");
  TORCH_CHECK(!seen_[index], "tcap::DistributedDataParallel: parameter ", names_[index],
              " received two gradients in one backward");
  seen_[index] = 1;
  // A node that reaches the parameter but gave it no gradient (a compiled region's input
  // it did not differentiate) runs the hook with .grad undefined: not a use, as in PyTorch.
  used_[index] = stage_grad_locked(index) ? 1 : 0;
  launch_ready_locked();
  if (next_launch_ == buckets_.size()) finish_locked();
}

void DistributedDataParallelImpl::Reducer::on_grad_recorded(size_t index, const at::Tensor& param) {
  c10::AutoGradMode no_grad(false);
  std::vector<at::Tensor> grads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!started_) {
      queue_end_of_backward_locked();
      recorded_.assign(params_.size(), at::Tensor());
    }
    TORCH_CHECK(!seen_[index], "tcap::DistributedDataParallel: parameter ", names_[index],
                " received two gradients in one backward");
    seen_[index] = 1;
    recorded_[index] = param.grad();
    Bucket& bucket = buckets_[slot_[index].first];
    --bucket.pending;
    for (const Bucket& b : buckets_) {
      if (b.pending > 0) return;
    }
    grads = std::move(recorded_);
    recorded_.clear();
    reset_locked();
  }
  // Every gradient is in: each bucket flattened, one op for all buckets (it all-reduces
  // them in bucket order), the averages copied back into .grad, all of it recorded.
  std::vector<at::Tensor> flats;
  for (const Bucket& b : buckets_) {
    std::vector<at::Tensor> group;
    for (size_t k : b.params) group.push_back(grads[k].defined() ? grads[k] : at::zeros_like(params_[k]));
    flats.push_back(flatten(group));
  }
  const std::vector<at::Tensor> avg = ddp_all_reduce(flats, id);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    for (size_t pos = 0; pos < bucket.params.size(); ++pos) {
      at::Tensor& p = params_[bucket.params[pos]];
      at::Tensor piece = avg[b].narrow(0, bucket.offsets[pos], p.numel()).view(p.sizes());
      at::Tensor& g = p.mutable_grad();
      if (g.defined()) {
        g.copy_(piece);
      } else {
        g = piece.clone();
      }
    }
  }
}

namespace {

// Runs `issue` (one collective) on a fresh contiguous copy of each of `flats`, in order,
// and waits for all of them; the copies, as the collectives left them.
template <class Issue>
std::vector<at::Tensor> on_copies(const std::vector<at::Tensor>& flats, Issue issue) {
  std::vector<at::Tensor> out;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (const auto& f : flats) {
    out.push_back(f.contiguous().clone());
    std::vector<at::Tensor> one{out.back()};
    works.push_back(issue(one));
  }
  for (auto& w : works) w->wait();
  return out;
}

}  // namespace

std::vector<at::Tensor> DistributedDataParallelImpl::Reducer::all_reduce_flats(const std::vector<at::Tensor>& flats) {
  TORCH_CHECK(flats.size() == buckets_.size(), "tcap_dist::ddp_all_reduce: ", flats.size(),
              " flat gradients for a reducer of ", buckets_.size(), " buckets");
  c10::AutoGradMode no_grad(false);
  for (size_t b = 0; b < flats.size(); ++b) {
    TORCH_CHECK(flats[b].numel() == buckets_[b].flat.numel() && flats[b].scalar_type() == buckets_[b].flat.scalar_type(),
                "tcap_dist::ddp_all_reduce: bucket ", b, " holds ", buckets_[b].flat.numel(), " elements of ",
                buckets_[b].flat.scalar_type(), ", given ", flats[b].numel(), " of ", flats[b].scalar_type());
  }
  std::vector<at::Tensor> out;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    out = on_copies(flats, [&](std::vector<at::Tensor>& one) { return pg_->allreduce(one); });
  } catch (const std::exception& e) {
    fail_collective_unlocked(e);
  }
  const double world = static_cast<double>(pg_->getSize());
  for (auto& t : out) t.div_(world);
  const double waited = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats.allreduces += static_cast<int64_t>(flats.size());
    stats.exposed_wait_us += waited;
    ++stats.backwards_synced;
    ++stats.graph_syncs;
  }
  if (log_enabled(LogChannel::Ddp)) {
    std::ostringstream m;
    m << "rank " << pg_->getRank() << ": backward synced by a compiled step's all-reduce, " << flats.size()
      << " bucket(s) after the whole backward (no overlap), waited " << waited / 1000.0 << " ms";
    log_line(LogChannel::Ddp, m.str());
  }
  return out;
}

std::vector<at::Tensor> DistributedDataParallelImpl::Reducer::broadcast_flats(const std::vector<at::Tensor>& flats) {
  c10::AutoGradMode no_grad(false);
  std::vector<at::Tensor> out;
  try {
    c10d::BroadcastOptions o;
    o.rootRank = 0;
    out = on_copies(flats, [&](std::vector<at::Tensor>& one) { return pg_->broadcast(one, o); });
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "tcap::DistributedDataParallel (rank ", pg_->getRank(), " of ", pg_->getSize(),
                "): the buffer broadcast failed: another rank exited, failed, or did not reach this forward within "
                "the process group's timeout (", timeout_.count(), " ms). Cause: ", message_of(e));
  }
  return out;
}

void DistributedDataParallelImpl::Reducer::fail_collective_unlocked(const std::exception& e) {
  std::lock_guard<std::mutex> lock(mutex_);
  fail_collective(e);
}

bool DistributedDataParallelImpl::Reducer::stage_grad_locked(size_t index) {
  const at::Tensor& param = params_[index];
  const at::Tensor& grad = param.grad();
  const auto [b, pos] = slot_[index];
  Bucket& bucket = buckets_[b];
  at::Tensor view = bucket.flat.narrow(0, bucket.offsets[pos], param.numel()).view(param.sizes());
  if (grad.defined()) {
    view.copy_(grad);
  } else {
    view.zero_();
  }
  --bucket.pending;
  return grad.defined();
}

void DistributedDataParallelImpl::Reducer::mark_unused_locked(size_t index) {
  if (seen_[index]) return;
  seen_[index] = 2;
  // A gradient accumulated earlier (under no_sync) takes part; a parameter without one adds zeros.
  if (stage_grad_locked(index)) used_[index] = 1;
  ++stats.unused_marked;
}

void DistributedDataParallelImpl::Reducer::prepare_for_backward(const at::Tensor& output) {
  if (!find_unused_ || !sync || !output.defined() || !output.requires_grad()) return;
  // The parameters output's graph reaches, through the AccumulateGrad nodes it ends in (a
  // compiled region's node has edges to the parameters it read, as any autograd node).
  std::vector<char> reached(params_.size(), 0);
  std::unordered_set<const torch::autograd::Node*> visited;
  std::vector<torch::autograd::Node*> stack;
  if (auto root = torch::autograd::impl::gradient_edge(output).function) stack.push_back(root.get());
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!visited.insert(node).second) continue;
    if (const auto* acc = dynamic_cast<const torch::autograd::AccumulateGrad*>(node)) {
      const auto it = index_of_.find(acc->variable.unsafeGetTensorImpl());
      if (it != index_of_.end()) reached[it->second] = 1;
      continue;
    }
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (started_) return;  // a backward is under way: this forward's parameters are for the next one
  // Several forwards before one backward: a parameter any of them reaches is expected.
  if (!prepared_) {
    unreachable_.resize(params_.size());
    std::iota(unreachable_.begin(), unreachable_.end(), size_t{0});
  }
  unreachable_.erase(std::remove_if(unreachable_.begin(), unreachable_.end(), [&](size_t k) { return reached[k]; }),
                     unreachable_.end());
  prepared_ = true;
  if (log_enabled(LogChannel::Ddp) && !unreachable_.empty()) {
    std::ostringstream m;
    m << "rank " << pg_->getRank() << ": forward's output does not reach " << unreachable_.size()
      << " parameter(s) (" << names_[unreachable_.front()] << (unreachable_.size() > 1 ? ", .." : "")
      << "): reduced without a gradient of this rank";
    log_line(LogChannel::Ddp, m.str());
  }
}

void DistributedDataParallelImpl::Reducer::launch_ready_locked() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    if (next_launch_ == 0) first_launch_ = std::chrono::steady_clock::now();
    if (log_enabled(LogChannel::Ddp)) {
      const auto now = std::chrono::steady_clock::now();
      std::ostringstream m;
      m << "rank " << pg_->getRank() << ": all-reduce of bucket " << next_launch_ << " started "
        << std::chrono::duration<double, std::milli>(now - first_grad_).count() << " ms after the backward's first gradient";
      log_line(LogChannel::Ddp, m.str());
    }
    std::vector<at::Tensor> flat{buckets_[next_launch_].flat};
    try {
      works_.push_back(pg_->allreduce(flat));
    } catch (const std::exception& e) {
      fail_collective(e);
    }
    ++stats.allreduces;
    ++next_launch_;
  }
}

void DistributedDataParallelImpl::Reducer::finish_locked() {
  const auto t0 = std::chrono::steady_clock::now();
  stats.overlap_window_us += std::chrono::duration<double, std::micro>(t0 - first_launch_).count();
  // Which parameters some rank used (Note [Unused parameters]): issued after every bucket,
  // on every rank.
  at::Tensor used;
  if (find_unused_) {
    used = at::empty({static_cast<int64_t>(used_.size())}, at::kFloat);
    float* u = used.data_ptr<float>();
    for (size_t k = 0; k < used_.size(); ++k) u[k] = used_[k] ? 1.0f : 0.0f;
    std::vector<at::Tensor> flat{used};
    try {
      works_.push_back(pg_->allreduce(flat));
    } catch (const std::exception& e) {
      fail_collective(e);
    }
  }
  try {
    for (auto& w : works_) w->wait();
  } catch (const std::exception& e) {
    fail_collective(e);
  }
  const auto waited = std::chrono::steady_clock::now() - t0;
  stats.exposed_wait_us += std::chrono::duration<double, std::micro>(waited).count();
  if (log_enabled(LogChannel::Ddp)) {
    std::ostringstream m;
    m << "rank " << pg_->getRank() << ": backward synced, " << buckets_.size() << " bucket(s); the first started "
      << std::chrono::duration<double, std::milli>(t0 - first_launch_).count()
      << " ms before the last gradient, which then waited "
      << std::chrono::duration<double, std::milli>(waited).count() << " ms for the all-reduces";
    log_line(LogChannel::Ddp, m.str());
  }
  const float* used_anywhere = used.defined() ? used.data_ptr<float>() : nullptr;
  const double world = static_cast<double>(pg_->getSize());
  for (Bucket& b : buckets_) {
    b.flat.div_(world);
    for (size_t pos = 0; pos < b.params.size(); ++pos) {
      if (used_anywhere != nullptr && used_anywhere[b.params[pos]] == 0.0f) continue;  // its .grad stays as it was
      at::Tensor& p = params_[b.params[pos]];
      at::Tensor avg = b.flat.narrow(0, b.offsets[pos], p.numel()).view(p.sizes());
      at::Tensor& g = p.mutable_grad();
      if (g.defined()) {
        g.copy_(avg);
      } else {
        g = avg.clone();
      }
    }
  }
  ++stats.backwards_synced;
  reset_locked();
}

void DistributedDataParallelImpl::Reducer::fail_collective(const std::exception& e) {
  reset_locked();
  TORCH_CHECK(false, "tcap::DistributedDataParallel (rank ", pg_->getRank(), " of ", pg_->getSize(),
              "): a gradient all-reduce failed: another rank exited, failed, or did not reach this backward within "
              "the process group's timeout (", timeout_.count(), " ms). Cause: ", message_of(e));
}

std::string DistributedDataParallelImpl::Reducer::missing_locked() const {
  std::ostringstream s;
  int shown = 0;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (seen_[k]) continue;
    if (shown++ < 8) s << (shown > 1 ? ", " : "") << names_[k];
  }
  if (shown > 8) s << " and " << shown - 8 << " more";
  return s.str();
}

void DistributedDataParallelImpl::Reducer::end_of_backward() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!started_) return;  // every bucket was reduced
  if (find_unused_) {
    // The engine's final callback: nothing of this backward is left to come.
    HiddenFromCapture hidden;
    c10::AutoGradMode no_grad(false);
    if (log_enabled(LogChannel::Ddp)) {
      log_line(LogChannel::Ddp, "rank " + std::to_string(pg_->getRank()) + ": parameters " + missing_locked() +
                                    " got no gradient in this backward: reduced without a gradient of this rank");
    }
    for (size_t k = 0; k < params_.size(); ++k) mark_unused_locked(k);
    launch_ready_locked();
    finish_locked();
    return;
  }
  fail_unfinished_locked();
}

void DistributedDataParallelImpl::Reducer::fail_unfinished_locked() {
  const std::string missing = missing_locked();
  // The buckets started so far were started alike on every rank that used the same
  // parameters; let them finish so that no collective is left half done.
  for (auto& w : works_) {
    try {
      w->wait();
    } catch (const std::exception&) {
    }
  }
  reset_locked();
  TORCH_CHECK(!find_unused_, "tcap::DistributedDataParallel: parameters ", missing,
              " received no gradient in the last backward, which ended without the engine's final callback "
              "(compiled autograd), so their buckets were never all-reduced and the gradients the optimizer used "
              "were not averaged. With find_unused_parameters, unused parameters are found by forward()'s walk "
              "from its output: run the model through the wrapper's forward() before such a backward.");
  TORCH_CHECK(false, "tcap::DistributedDataParallel: parameters ", missing,
              " received no gradient in this backward (unused parameters), so their buckets were never "
              "all-reduced and the gradients are not averaged across ranks. Every parameter must take part in "
              "the loss on every rank (or have requires_grad=false), or set "
              "DDPOptions::find_unused_parameters = true.");
}

void DistributedDataParallelImpl::Reducer::check_finished() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!started_) return;
  fail_unfinished_locked();
}

}  // namespace tcap
