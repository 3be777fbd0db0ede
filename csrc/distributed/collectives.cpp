// See Note [Collectives in a compiled step] (collectives.h).
#include "distributed/collectives.h"

#include "distributed/reducer.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_map>

namespace tcap {
namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<int64_t, std::weak_ptr<DistributedDataParallelImpl::Reducer>> reducers;
  int64_t next = 1;
};

Registry& registry() {
  static auto* r = new Registry();  // outlives every static DDP
  return *r;
}

std::shared_ptr<DistributedDataParallelImpl::Reducer> find(int64_t id, const char* op) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.reducers.find(id);
  auto reducer = it == r.reducers.end() ? nullptr : it->second.lock();
  TORCH_CHECK(reducer, "tcap_dist::", op, ": the tcap::DistributedDataParallel (reducer ", id,
              ") this graph was captured with no longer exists in this process");
  return reducer;
}

std::vector<at::Tensor> all_reduce_kernel(at::TensorList flats, int64_t id) {
  return find(id, "ddp_all_reduce")->all_reduce_flats(flats.vec());
}

std::vector<at::Tensor> broadcast_kernel(at::TensorList flats, int64_t id) {
  return find(id, "ddp_broadcast")->broadcast_flats(flats.vec());
}

}  // namespace

TORCH_LIBRARY(tcap_dist, m) {
  m.def("ddp_all_reduce(Tensor[] flats, int reducer) -> Tensor[]");
  m.def("ddp_broadcast(Tensor[] flats, int reducer) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(tcap_dist, CompositeExplicitAutograd, m) {
  m.impl("ddp_all_reduce", all_reduce_kernel);
  m.impl("ddp_broadcast", broadcast_kernel);
}

int64_t register_reducer(const std::shared_ptr<DistributedDataParallelImpl::Reducer>& reducer) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const int64_t id = r.next++;
  r.reducers.emplace(id, reducer);
  return id;
}

void unregister_reducer(int64_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.reducers.erase(id);
}

std::vector<at::Tensor> ddp_all_reduce(const std::vector<at::Tensor>& flats, int64_t reducer) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("tcap_dist::ddp_all_reduce", "")
                       .typed<std::vector<at::Tensor>(at::TensorList, int64_t)>();
  return op.call(flats, reducer);
}

std::vector<at::Tensor> ddp_broadcast(const std::vector<at::Tensor>& flats, int64_t reducer) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("tcap_dist::ddp_broadcast", "")
                       .typed<std::vector<at::Tensor>(at::TensorList, int64_t)>();
  return op.call(flats, reducer);
}

}  // namespace tcap
