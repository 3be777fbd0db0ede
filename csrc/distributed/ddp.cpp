// tcap::DistributedDataParallel: the module wrapper (docs/distributed.md). The gradient
// buckets are reducer.cpp's.
#include <tcap/distributed.h>

#include "capture/recorder.h"
#include "capture/session.h"
#include "distributed/collectives.h"
#include "distributed/reducer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <chrono>
#include <map>
#include <sstream>
#include <tuple>

namespace tcap {

namespace {

// ts grouped by dtype/device, in a fixed order (every rank the same).
std::vector<std::vector<at::Tensor>> flat_groups(const std::vector<at::Tensor>& ts) {
  std::map<FlatKey, std::vector<at::Tensor>> groups;
  for (const auto& t : ts) groups[flat_key(t)].push_back(t);
  std::vector<std::vector<at::Tensor>> out;
  for (auto& [key, group] : groups) out.push_back(std::move(group));
  return out;
}

void unflatten_into(const std::vector<at::Tensor>& group, const at::Tensor& flat) {
  int64_t off = 0;
  for (const auto& t : group) {
    at::Tensor(t).copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
}

// Rank 0's values into every rank's tensors, one broadcast per dtype/device.
void broadcast_from_rank0(c10d::Backend& pg, const std::vector<at::Tensor>& ts) {
  if (ts.empty() || pg.getSize() == 1) return;
  c10::AutoGradMode no_grad(false);
  for (const auto& group : flat_groups(ts)) {
    std::vector<at::Tensor> flat{flatten(group)};
    c10d::BroadcastOptions o;
    o.rootRank = 0;
    pg.broadcast(flat, o)->wait();
    unflatten_into(group, flat[0]);
  }
}

// The same broadcasts through the recorded op tcap_dist::ddp_broadcast (Note
// [Collectives in a compiled step]).
void broadcast_from_rank0_recorded(int64_t reducer, const std::vector<at::Tensor>& ts) {
  c10::AutoGradMode no_grad(false);
  const auto groups = flat_groups(ts);
  std::vector<at::Tensor> flats;
  for (const auto& group : groups) flats.push_back(flatten(group));
  const std::vector<at::Tensor> got = ddp_broadcast(flats, reducer);
  for (size_t k = 0; k < groups.size(); ++k) unflatten_into(groups[k], got[k]);
}

// What every rank must agree on: counts, element total and a hash of the shapes and
// dtypes, in order.
std::vector<int64_t> layout_of(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& buffers) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&](int64_t x) {
    h ^= static_cast<uint64_t>(x);
    h *= 1099511628211ULL;
  };
  int64_t numel = 0;
  for (const auto* list : {&params, &buffers}) {
    for (const auto& t : *list) {
      mix(static_cast<int64_t>(t.scalar_type()));
      mix(t.dim());
      for (auto s : t.sizes()) mix(s);
      numel += t.numel();
    }
    mix(-1);
  }
  return {static_cast<int64_t>(params.size()), static_cast<int64_t>(buffers.size()), numel,
          static_cast<int64_t>(h & 0x7fffffffffffffffULL)};
}

void check_same_model(c10d::Backend& pg, const std::vector<at::Tensor>& params,
                      const std::vector<at::Tensor>& buffers) {
  const int world = pg.getSize();
  if (world == 1) return;
  const auto mine = layout_of(params, buffers);
  std::vector<at::Tensor> in{at::tensor(mine, at::kLong)};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < world; ++r) out[0].push_back(at::empty({static_cast<int64_t>(mine.size())}, at::kLong));
  pg.allgather(out, in)->wait();
  bool same = true;
  std::ostringstream s;
  for (int r = 0; r < world; ++r) {
    const at::Tensor& t = out[0][static_cast<size_t>(r)];
    const auto* v = t.data_ptr<int64_t>();
    same = same && t.equal(out[0][0]);
    s << "\n  rank " << r << ": " << v[0] << " parameters, " << v[1] << " buffers, " << v[2]
      << " elements, shape hash " << std::hex << v[3] << std::dec;
  }
  TORCH_CHECK(same, "tcap::DistributedDataParallel (rank ", pg.getRank(), " of ", world,
              "): the model differs across ranks (parameter and buffer counts, shapes or dtypes):", s.str(),
              "\nEvery rank must build the same model before wrapping it.");
}

}  // namespace

DistributedDataParallelImpl::DistributedDataParallelImpl(std::shared_ptr<torch::nn::Module> module, Forward forward,
                                                         c10::intrusive_ptr<c10d::Backend> process_group,
                                                         DDPOptions options)
    : module_(std::move(module)), forward_(std::move(forward)), process_group_(std::move(process_group)),
      options_(options) {
  TORCH_CHECK(module_ != nullptr, "tcap::DistributedDataParallel: no module given");
  TORCH_CHECK(process_group_, "tcap::DistributedDataParallel: no process group given");
  TORCH_CHECK(forward_ != nullptr, "tcap::DistributedDataParallel: no forward function given");
  register_module("module", module_);
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (const auto& item : named_parameters(true)) {
    if (!item.value().requires_grad()) continue;
    params.push_back(item.value());
    names.push_back(item.key());
  }
  for (const auto& item : named_buffers(true)) buffers_.push_back(item.value());
  check_same_model(*process_group_, params, buffers_);
  std::vector<at::Tensor> state = params;
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  broadcast_from_rank0(*process_group_, state);
  reducer_ = std::make_shared<Reducer>(std::move(params), std::move(names), process_group_, options_);
  reducer_->id = register_reducer(reducer_);
  Reducer::install_hooks(reducer_);
}

DistributedDataParallelImpl::~DistributedDataParallelImpl() {
  if (reducer_) {
    reducer_->remove_hooks();
    unregister_reducer(reducer_->id);
  }
}

void DistributedDataParallelImpl::pre_forward() {
  reducer_->check_finished();
  if (!options_.broadcast_buffers || buffers_.empty() || process_group_->getSize() == 1) return;
  if (capture::records_collectives()) {
    // compile_step's capture: the broadcast as a graph op, so a replay redoes it.
    broadcast_from_rank0_recorded(reducer_->id, buffers_);
    return;
  }
  HiddenFromCapture hidden;
  if (hidden.capturing()) {
    // A capture that does not record collectives (a CaptureGuard, compiled autograd):
    // the broadcast is a collective its replay would not redo.
    for (capture::Session* s : capture::thread_sessions()) {
      s->note_unreplayable(
          "tcap::DistributedDataParallel broadcasts rank 0's buffers before each forward (broadcast_buffers), "
          "a collective this capture does not record (tcap::compile and compile_step do), so a replay would not "
          "redo it; or set DDPOptions::broadcast_buffers = false");
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  broadcast_from_rank0(*process_group_, buffers_);
  buffer_broadcast_us_ += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

at::Tensor DistributedDataParallelImpl::forward(const at::Tensor& x) {
  pre_forward();
  at::Tensor out = forward_(x);
  reducer_->prepare_for_backward(out);
  return out;
}

void DistributedDataParallelImpl::set_forward(Forward forward) {
  TORCH_CHECK(forward != nullptr, "tcap::DistributedDataParallel::set_forward: no function given");
  forward_ = std::move(forward);
}

DistributedDataParallelImpl::NoSync::NoSync(DistributedDataParallelImpl& ddp) : ddp_(&ddp) {
  prev_ = ddp.reducer_->sync;
  ddp.reducer_->sync = false;
}

DistributedDataParallelImpl::NoSync::NoSync(NoSync&& other) noexcept : ddp_(other.ddp_), prev_(other.prev_) {
  other.ddp_ = nullptr;
}

DistributedDataParallelImpl::NoSync::~NoSync() {
  if (ddp_ != nullptr) ddp_->reducer_->sync = prev_;
}

int DistributedDataParallelImpl::rank() const { return process_group_->getRank(); }
int DistributedDataParallelImpl::world_size() const { return process_group_->getSize(); }

DDPStats DistributedDataParallelImpl::stats() const {
  DDPStats s = reducer_->stats;
  s.buffer_broadcast_us = buffer_broadcast_us_;
  return s;
}

}  // namespace tcap
