// See Note [Leaves accumulated where the engine would] (markers.h).
#include "autograd/markers.h"

#include "capture/engine_shim.h"
#include "capture/armed.h"

#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <algorithm>
#include <string>

namespace tcap::ca {
namespace {

// The AccumulateGrad observer: names the value delivered to the node (after its tensor
// pre-hooks and pre-hooks), so the graph can output it, or accumulates it in the graph.
struct DeliveredMarker : capture::ObserverPreHook {
  using variable_list = torch::autograd::variable_list;
  DeliveredMarker(capture::Session* s, ir::ValueId* slot, int acc_slot, std::string label, char* in_graph)
      : session(s), out(slot), acc_slot(acc_slot), label(std::move(label)), in_graph(in_graph) {}
  variable_list operator()(const variable_list& grads) override {
    if (!grads.empty() && grads[0].defined()) {
      if (auto v = session->lookup(grads[0])) {
        *out = *v;
        if (acc_slot >= 0) {
          const int h = session->begin_hook(ir::HookKind::AccumulateGrad, label, acc_slot);
          session->end_opaque_hook(h, {grads[0]}, {}, {});
          *in_graph = 1;
        }
      }
    }
    return grads;
  }
  capture::Session* session;
  ir::ValueId* out;
  int acc_slot;  // -1: the graph outputs the gradient
  std::string label;
  char* in_graph;
};

}  // namespace

Markers::Markers(const BackwardWalk& w, capture::Session* s, bool accumulate)
    : delivered(w.accumulate.size(), ir::kNoValue), in_graph(w.accumulate.size(), 0) {
  for (size_t i = 0; i < w.accumulate.size(); ++i) {
    torch::autograd::Node* n = w.nodes[w.accumulate[i]];
    const auto* acc = dynamic_cast<const torch::autograd::AccumulateGrad*>(n);
    const bool early = accumulate && acc != nullptr && capture::has_post_accumulate_grad_hook(acc->variable);
    auto m = std::make_unique<DeliveredMarker>(s, &delivered[i], early ? static_cast<int>(w.hooks.size() + i) : -1,
                                               w.label(w.accumulate[i]), &in_graph[i]);
    placed_.emplace_back(n, m.get());
    n->pre_hooks().push_back(std::move(m));
  }
}

Markers::~Markers() {
  for (auto& [n, m] : placed_) {
    auto& hs = n->pre_hooks();
    hs.erase(std::remove_if(hs.begin(), hs.end(), [&](const auto& h) { return h.get() == m; }), hs.end());
  }
}

namespace {
constexpr size_t kMaxPooled = 4;
std::vector<std::unique_ptr<BackwardWalk>>& pool() {
  thread_local std::vector<std::unique_ptr<BackwardWalk>> p;
  return p;
}
}  // namespace

PooledWalk::PooledWalk() {
  auto& p = pool();
  if (p.empty()) {
    w_ = std::make_unique<BackwardWalk>();
  } else {
    w_ = std::move(p.back());
    p.pop_back();
  }
}

PooledWalk::~PooledWalk() {
  w_->clear();
  auto& p = pool();
  if (p.size() < kMaxPooled) p.push_back(std::move(w_));
}

}  // namespace tcap::ca
