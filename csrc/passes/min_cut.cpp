// Note [Min-cut recomputation]
// As in AOTAutograd's min_cut_rematerialization_partition: every forward tensor v becomes
// two flow nodes v_in -> v_out with capacity = bytes(v). Data dependencies are infinite
// edges u_out -> v_in. Primals, and the outputs of ops that must not be recomputed, hang
// off the source with infinite capacity (they exist in the forward anyway); tensors the
// backward reads hang off the sink. A minimum s-t cut then cuts a set of v_in -> v_out
// edges: those tensors are saved, everything the backward needs beyond them is recomputed
// from them. On cos(cos(a+b+c+d)) the cut is the single tensor a+b+c+d, where saving
// what the backward reads would keep cos(...) too. Recomputed ops are only cheap pointwise
// and view ops that read tensors no later forward op overwrites. Among cuts of equal bytes
// the one of later tensors is taken (MinCutOptions::prefer_later_tensors: capacities carry
// a bias below one byte, larger for earlier values): as AOTAutograd's bias towards nodes
// close to the backward, it saves relu(x) rather than x when the backward reads relu(x),
// instead of recomputing relu. With ties going to the earliest tensors (before commit
// b88a32b), transformer_block's backward recomputed a relu of f32[128, 8, 2048], a
// residual add, a scaling and three clones.
#include "passes/min_cut.h"

#include "passes/max_flow.h"

#include "ir/op_facts.h"

#include <algorithm>
#include <unordered_set>

namespace tcap::passes {

// Note [Saving what fusion would not write]
// Saved bytes are not the whole cost of a save: a value that fusion keeps in registers (a
// pointwise or row op's result read in the forward only by ops of fused kernels) is written
// to memory only because it is saved, and read back by the backward; a value written
// anyway (a primal, a matmul's result, one an ATen op reads, a user output) is only kept
// longer. With MinCutOptions::fuses set (targets that fuse), the first kind costs twice
// its bytes, as AOTAutograd weighs what is not materialized otherwise. Cross-entropy after
// a Linear: the logits (a matmul's result, written anyway) and two numbers per row are
// saved, not the log-probabilities of the same size, which the forward would write only to
// save them (Note [Cross-entropy at the bandwidth floor]).
namespace {

bool written_anyway(const ir::Graph& g, const JointPhases& ph, ir::ValueId v,
                    const std::unordered_set<ir::ValueId>& user_outputs, const MinCutOptions& options) {
  if (!options.fuses || ph.primal_set.count(v) || user_outputs.count(v)) return true;
  auto it = ph.forward_producer.find(v);
  if (it == ph.forward_producer.end()) return true;
  const ir::Node& p = g.node(it->second);
  if (p.kind != ir::NodeKind::Call || ir::op_has(p.op, ir::OpFact::View) || !options.fuses(p)) return true;
  for (ir::NodeId u : g.users(v)) {
    const ir::Node& n = g.node(u);
    if (n.phase == ir::Phase::Forward && (n.kind != ir::NodeKind::Call || !options.fuses(n))) return true;
  }
  return false;
}

}  // namespace

std::vector<ir::ValueId> min_cut_saved(const ir::Graph& g, const JointPhases& ph, const MinCutOptions& options) {
  // Flow nodes: 2 per forward value, plus source and sink.
  std::vector<ir::ValueId> fvals(ph.primals.begin(), ph.primals.end());
  for (ir::NodeId id : ph.forward) ir::for_each_value(g.node(id).outputs, [&](ir::ValueId v) { fvals.push_back(v); });
  std::unordered_map<ir::ValueId, int> idx;
  for (size_t k = 0; k < fvals.size(); ++k) idx[fvals[k]] = static_cast<int>(k);
  const int S = static_cast<int>(2 * fvals.size()), T = S + 1;
  MaxFlow mf(T + 1);
  // Capacities in 1/2^24 bytes plus a tie-break: the biases of all values together stay
  // under one byte, so they never outweigh a byte.
  const int64_t n_vals = static_cast<int64_t>(fvals.size());
  const int64_t step = options.prefer_later_tensors ? (int64_t{1} << 24) / std::max<int64_t>(1, n_vals * n_vals) : 0;
  const std::unordered_set<ir::ValueId> user_outputs(ph.user_outputs.begin(), ph.user_outputs.end());
  for (ir::ValueId v : fvals) {
    const int k = idx[v];
    const int64_t factor = written_anyway(g, ph, v, user_outputs, options) ? 1 : 2;
    const int64_t bytes = std::min<int64_t>(tensor_bytes(g.value(v).meta) * factor, options.max_tensor_bytes);
    mf.add_edge(2 * k, 2 * k + 1, (bytes << 24) + (n_vals - 1 - k) * step);
    if (ph.primal_set.count(v)) mf.add_edge(S, 2 * k, MaxFlow::kInf);
  }
  for (ir::NodeId id : ph.forward) {
    const ir::Node& n = g.node(id);
    const bool ban = never_recomputed(g, ph, id, nullptr);
    ir::for_each_value(n.outputs, [&](ir::ValueId v) {
      const int k = idx[v];
      if (ban) mf.add_edge(S, 2 * k, MaxFlow::kInf);
      ir::for_each_value(n.args, [&](ir::ValueId u) {
        auto it = idx.find(u);
        if (it != idx.end()) mf.add_edge(2 * it->second + 1, 2 * k, MaxFlow::kInf);
      });
    });
  }
  for (ir::ValueId v : ph.read_by_backward) mf.add_edge(2 * idx[v] + 1, T, MaxFlow::kInf);
  mf.run(S, T);
  const auto reach = mf.reachable(S);
  std::vector<ir::ValueId> saved;
  for (ir::ValueId v : fvals) {
    const int k = idx[v];
    if (reach[static_cast<size_t>(2 * k)] && !reach[static_cast<size_t>(2 * k + 1)]) saved.push_back(v);
  }
  return saved;
}

}  // namespace tcap::passes
