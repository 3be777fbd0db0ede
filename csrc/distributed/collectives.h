// The collectives of tcap::DistributedDataParallel as dispatcher operators, so that a
// capture records them and a replay issues them (Note [Collectives in a compiled step]).
#pragma once

#include <tcap/distributed.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace tcap {

// Note [Collectives in a compiled step]
// compile_step replays a whole training step, and a replay runs no AccumulateGrad and no
// host code, so DDP's hooks and buffer broadcast would not run. While a capture records
// collectives (compile_step's; capture::records_collectives()), DDP does that work with
// recorded operators instead of hiding it from the capture:
//   tcap_dist::ddp_broadcast(Tensor[] flats, int reducer) -> Tensor[]
//     rank 0's values of each flat tensor (buffers, flattened per dtype/device);
//   tcap_dist::ddp_all_reduce(Tensor[] flats, int reducer) -> Tensor[]
//     the average over ranks of each flat tensor (one per bucket, in bucket order).
// The flattening (cat), the ops and the copies back (into .grad, into the buffers) are
// graph nodes, so a replay does the same work, and the graph dump shows it. `reducer`
// names the DDP's reducer in a registry (a c10d ProcessGroup cannot be a graph argument);
// the op fails with a clear error when that DDP is gone.
//
// Every rank must issue the same collectives in the same order, whichever way each step
// runs (replayed, captured, eager): the ops issue exactly the collectives the eager hooks
// issue (one broadcast per dtype group, then one all-reduce per bucket in bucket order,
// each of the same size), so a rank that recaptures while the others replay stays in step.
// Within a graph, the all-reduce depends on every gradient and the broadcast precedes the
// forward that reads the buffers, so node order is launch order. The ops are
// ir::OpFact::Collective: a host-value guard never runs ahead of one and never checks a
// value after one inline (it could fail after the collective ran and the call be redone).
// In a replay the bucket all-reduces start together once the whole backward has run: no
// overlap with the backward (as under compiled autograd).

// Registers a reducer for the ops; the id is their int argument.
int64_t register_reducer(const std::shared_ptr<DistributedDataParallelImpl::Reducer>& reducer);
void unregister_reducer(int64_t id);

// Calls the ops through the dispatcher (recorded by a capture that is recording).
std::vector<at::Tensor> ddp_all_reduce(const std::vector<at::Tensor>& flats, int64_t reducer);
std::vector<at::Tensor> ddp_broadcast(const std::vector<at::Tensor>& flats, int64_t reducer);

}  // namespace tcap
