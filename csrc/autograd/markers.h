// Compiled autograd's capture observers (compiled_autograd.cpp): what each AccumulateGrad
// node is handed, and a pool of BackwardWalks.
#pragma once

#include "autograd/walk.h"
#include "capture/session.h"

#include <tcap/graph.h>

#include <memory>
#include <utility>
#include <vector>

namespace tcap::ca {

// Note [Leaves accumulated where the engine would]
// A hit hands each leaf gradient to its AccumulateGrad node after the whole compiled graph
// has run. For a leaf with a post-accumulate-grad hook that is late: the hook of
// tcap::DistributedDataParallel starts a bucket's all-reduce as soon as the bucket's
// gradients are in, to overlap it with the rest of the backward. So for such leaves the
// capture records, where the engine ran AccumulateGrad, an opaque CallHook (kind
// accumulate_grad, slot num_hooks + i) taking the delivered gradient, and the replay's
// hook runner calls the real AccumulateGrad there: accumulation and hooks at the same
// point of the backward as under the engine. Cost: AccumulateGrad cannot steal a
// gradient the graph still holds, so it copies it.

// Observers on every AccumulateGrad of a walk while a capture records: delivered[i] is
// the value handed to AccumulateGrad i; in_graph[i] is set when the graph accumulates it.
class Markers {
 public:
  Markers(const BackwardWalk& w, capture::Session* s, bool accumulate);
  ~Markers();
  Markers(const Markers&) = delete;
  Markers& operator=(const Markers&) = delete;
  std::vector<ir::ValueId> delivered;
  std::vector<char> in_graph;  // accumulated by a CallHook in the graph

 private:
  std::vector<std::pair<torch::autograd::Node*, const void*>> placed_;
};

// A BackwardWalk from this thread's pool: the walk runs on every backward, and reusing
// its buffers keeps it from allocating (see the lookup_us benchmark). It goes back
// cleared, holding no node or tensor. A backward started from inside another (a hook
// calling backward) takes a second one.
class PooledWalk {
 public:
  PooledWalk();
  ~PooledWalk();
  PooledWalk(const PooledWalk&) = delete;
  PooledWalk& operator=(const PooledWalk&) = delete;
  BackwardWalk& walk() { return *w_; }

 private:
  std::unique_ptr<BackwardWalk> w_;
};

}  // namespace tcap::ca
