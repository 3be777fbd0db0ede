// Partitioning a joint graph into forward and backward graphs (include/tcap/partition.h).
//
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
// the one of later tensors is taken (capacities carry a bias below one byte, larger for
// earlier values): as AOTAutograd's bias towards nodes close to the backward, it saves
// relu(x) rather than x when the backward reads relu(x), instead of recomputing relu.
// Before session 11 ties went to the earliest tensors: transformer_block's backward
// recomputed a relu of f32[128, 8, 2048], a residual add, a scaling and three clones.
#include <tcap/partition.h>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <map>
#include <queue>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace tcap {

std::string to_string(Partitioner p) {
  switch (p) {
    case Partitioner::Default: return "default";
    case Partitioner::MinCut: return "min_cut";
  }
  return "partitioner" + std::to_string(static_cast<int>(p));
}

namespace {

using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::ValueId;

int64_t nbytes(const ir::TensorMeta& m) {
  return std::max<int64_t>(1, m.numel() * static_cast<int64_t>(c10::elementSize(m.dtype)));
}

// Tensor values a node reads / defines.
template <class F>
void for_each_read(const Node& n, F&& f) {
  ir::for_each_value(n.args, std::forward<F>(f));
}
template <class F>
void for_each_def(const Node& n, F&& f) {
  ir::for_each_value(n.outputs, std::forward<F>(f));
}

// Ops cheap enough to recompute in the backward: pointwise math, casts, views, fills.
bool recomputable_op(const std::string& op) {
  static const std::unordered_set<std::string> ops = {
      "aten::add", "aten::sub", "aten::mul", "aten::div", "aten::neg", "aten::rsub",
      "aten::cos", "aten::sin", "aten::tan", "aten::exp", "aten::exp2", "aten::expm1",
      "aten::log", "aten::log1p", "aten::log2", "aten::tanh", "aten::sigmoid", "aten::relu",
      "aten::threshold", "aten::gelu", "aten::silu", "aten::hardtanh", "aten::elu",
      "aten::leaky_relu", "aten::softplus", "aten::pow", "aten::sqrt", "aten::rsqrt",
      "aten::abs", "aten::sign", "aten::reciprocal", "aten::where", "aten::clamp",
      "aten::clamp_min", "aten::clamp_max", "aten::maximum", "aten::minimum", "aten::eq",
      "aten::ne", "aten::gt", "aten::ge", "aten::lt", "aten::le", "aten::logical_not",
      "aten::_to_copy", "aten::to", "aten::clone", "aten::view", "aten::reshape",
      "aten::_unsafe_view", "aten::expand", "aten::permute", "aten::t", "aten::transpose",
      "aten::unsqueeze", "aten::squeeze", "aten::slice", "aten::select", "aten::alias",
      "aten::detach", "aten::zeros_like", "aten::ones_like", "aten::full_like",
      "aten::fill", "aten::lift_fresh", "aten::erf", "aten::masked_fill", "aten::lerp",
      "aten::addcmul", "aten::addcdiv", "aten::square", "aten::floor", "aten::ceil",
      "aten::round", "aten::trunc", "aten::frac", "aten::atan", "aten::asin", "aten::acos",
      "aten::sinh", "aten::cosh", "aten::asinh", "aten::acosh", "aten::atanh", "aten::erfc",
  };
  return ops.count(op) > 0;
}

struct Phases {
  std::vector<NodeId> forward, backward;
  std::vector<ValueId> primals, tangents, user_outputs, grads;
};

Phases split(const JointGraph& j) {
  const Graph& g = j.graph;
  Phases p;
  const auto inputs = g.input_nodes();
  TORCH_CHECK(inputs.size() == j.num_primals + j.num_tangents, "tcap partition: the joint graph has ",
              inputs.size(), " inputs but declares ", j.num_primals, " primals and ", j.num_tangents,
              " tangents");
  for (size_t k = 0; k < inputs.size(); ++k) {
    const ValueId v = g.node(inputs[k]).outputs.at(0).values.at(0);
    (k < j.num_primals ? p.primals : p.tangents).push_back(v);
  }
  const Node* out = g.output_node();
  TORCH_CHECK(out != nullptr, "tcap partition: the joint graph has no output node");
  const auto outs = g.output_values();
  TORCH_CHECK(outs.size() == j.num_user_outputs + j.grad_of.size(), "tcap partition: the joint graph has ",
              outs.size(), " outputs but declares ", j.num_user_outputs, " user outputs and ",
              j.grad_of.size(), " gradients");
  p.user_outputs.assign(outs.begin(), outs.begin() + static_cast<std::ptrdiff_t>(j.num_user_outputs));
  p.grads.assign(outs.begin() + static_cast<std::ptrdiff_t>(j.num_user_outputs), outs.end());
  for (const Node& n : g.nodes()) {
    if (n.kind != ir::NodeKind::Call && n.kind != ir::NodeKind::CallHook) continue;
    (n.phase == ir::Phase::Forward ? p.forward : p.backward).push_back(n.id);
  }
  return p;
}

// Dinic's max-flow on a small graph.
class MaxFlow {
 public:
  static constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;
  explicit MaxFlow(int n) : adj_(static_cast<size_t>(n)) {}
  void add_edge(int u, int v, int64_t cap) {
    adj_[static_cast<size_t>(u)].push_back(static_cast<int>(edges_.size()));
    edges_.push_back({v, cap});
    adj_[static_cast<size_t>(v)].push_back(static_cast<int>(edges_.size()));
    edges_.push_back({u, 0});
  }
  int64_t run(int s, int t) {
    int64_t flow = 0;
    while (bfs(s, t)) {
      it_.assign(adj_.size(), 0);
      while (int64_t f = dfs(s, t, kInf)) flow += f;
    }
    return flow;
  }
  // After run(): nodes reachable from s in the residual graph.
  std::vector<bool> reachable(int s) const {
    std::vector<bool> seen(adj_.size(), false);
    std::vector<int> todo{s};
    seen[static_cast<size_t>(s)] = true;
    while (!todo.empty()) {
      int u = todo.back();
      todo.pop_back();
      for (int e : adj_[static_cast<size_t>(u)]) {
        const auto& ed = edges_[static_cast<size_t>(e)];
        if (ed.cap > 0 && !seen[static_cast<size_t>(ed.to)]) {
          seen[static_cast<size_t>(ed.to)] = true;
          todo.push_back(ed.to);
        }
      }
    }
    return seen;
  }

 private:
  struct Edge {
    int to;
    int64_t cap;
  };
  bool bfs(int s, int t) {
    level_.assign(adj_.size(), -1);
    std::queue<int> q;
    level_[static_cast<size_t>(s)] = 0;
    q.push(s);
    while (!q.empty()) {
      int u = q.front();
      q.pop();
      for (int e : adj_[static_cast<size_t>(u)]) {
        const auto& ed = edges_[static_cast<size_t>(e)];
        if (ed.cap > 0 && level_[static_cast<size_t>(ed.to)] < 0) {
          level_[static_cast<size_t>(ed.to)] = level_[static_cast<size_t>(u)] + 1;
          q.push(ed.to);
        }
      }
    }
    return level_[static_cast<size_t>(t)] >= 0;
  }
  int64_t dfs(int u, int t, int64_t f) {
    if (u == t) return f;
    for (size_t& i = it_[static_cast<size_t>(u)]; i < adj_[static_cast<size_t>(u)].size(); ++i) {
      const int e = adj_[static_cast<size_t>(u)][i];
      auto& ed = edges_[static_cast<size_t>(e)];
      if (ed.cap <= 0 || level_[static_cast<size_t>(ed.to)] != level_[static_cast<size_t>(u)] + 1) continue;
      if (int64_t d = dfs(ed.to, t, std::min(f, ed.cap))) {
        ed.cap -= d;
        edges_[static_cast<size_t>(e ^ 1)].cap += d;
        return d;
      }
    }
    return 0;
  }
  std::vector<std::vector<int>> adj_;
  std::vector<Edge> edges_;
  std::vector<int> level_;
  std::vector<size_t> it_;
};


}  // namespace

Graph eliminate_dead_code(const Graph& g) {
  auto root_is_input = [&](ValueId v) {
    return g.node(g.value(g.alias_root(v)).producer).kind == ir::NodeKind::Input;
  };
  std::unordered_set<ValueId> needed;
  for (ValueId v : g.output_values()) needed.insert(v);
  std::vector<NodeId> keep;
  for (auto it = g.nodes().rbegin(); it != g.nodes().rend(); ++it) {
    const Node& n = *it;
    if (n.kind != ir::NodeKind::Call && n.kind != ir::NodeKind::CallHook) continue;
    bool live = false;
    for_each_def(n, [&](ValueId v) {
      live = live || needed.count(v) || (g.value(v).version_of != ir::kNoValue && root_is_input(v));
    });
    if (!live) continue;
    keep.push_back(n.id);
    for_each_read(n, [&](ValueId v) { needed.insert(v); });
  }
  std::reverse(keep.begin(), keep.end());
  std::vector<ValueId> ins;
  std::vector<ir::InputKind> kinds;
  std::vector<std::string> names;
  for (NodeId id : g.input_nodes()) {
    ins.push_back(g.node(id).outputs.at(0).values.at(0));
    kinds.push_back(g.node(id).input_kind);
    names.push_back(g.node(id).name);
  }
  const Node* out = g.output_node();
  std::vector<std::string> onames = out ? out->output_names : std::vector<std::string>{};
  std::vector<ir::OutputKind> okinds = out ? out->output_kinds : std::vector<ir::OutputKind>{};
  return extract_subgraph(g, keep, ins, kinds, names, g.output_values(), onames, okinds);
}

PartitionResult partition(const JointGraph& joint, Partitioner which) {
  const Graph& g = joint.graph;
  const Phases ph = split(joint);
  PartitionResult r;
  r.partitioner = which;
  r.num_user_outputs = joint.num_user_outputs;
  r.grad_of = joint.grad_of;
  r.tangent_of = joint.tangent_of;

  std::unordered_set<ValueId> primal_set(ph.primals.begin(), ph.primals.end());
  std::unordered_map<ValueId, NodeId> fwd_producer;  // forward values made by forward nodes
  std::unordered_set<NodeId> fwd_nodes(ph.forward.begin(), ph.forward.end());
  for (NodeId id : ph.forward) for_each_def(g.node(id), [&](ValueId v) { fwd_producer[v] = id; });
  auto is_forward_value = [&](ValueId v) { return primal_set.count(v) || fwd_producer.count(v); };

  // R: forward values the backward reads, and who reads them first.
  std::vector<ValueId> read;
  std::unordered_map<ValueId, NodeId> first_reader;
  for (NodeId id : ph.backward) {
    for_each_read(g.node(id), [&](ValueId v) {
      if (is_forward_value(v) && !first_reader.count(v)) {
        first_reader[v] = id;
        read.push_back(v);
      }
    });
  }
  // Gradients that are forward values themselves (rare: a gradient equal to a saved
  // constant) must also be available in the backward.
  for (ValueId v : ph.grads) {
    if (is_forward_value(v) && !first_reader.count(v)) {
      first_reader[v] = -1;
      read.push_back(v);
    }
  }
  std::sort(read.begin(), read.end());

  // Values overwritten by a later forward op: nothing may be recomputed from them.
  std::unordered_set<ValueId> overwritten;
  for (const auto& val : g.values()) {
    if (val.version_of != ir::kNoValue) overwritten.insert(val.version_of);
  }
  auto banned = [&](NodeId id, std::string* why) {
    const Node& n = g.node(id);
    if (n.kind != ir::NodeKind::Call) {
      if (why) *why = "a hook call is never recomputed";
      return true;
    }
    if (!recomputable_op(n.op)) {
      if (why) *why = n.qualified_op() + " is never recomputed (not a cheap pointwise or view op)";
      return true;
    }
    bool writes = false;
    for_each_def(n, [&](ValueId v) { writes = writes || g.value(v).version_of != ir::kNoValue; });
    if (writes) {
      if (why) *why = n.qualified_op() + " writes in place and is never recomputed";
      return true;
    }
    bool reads_overwritten = false;
    for_each_read(n, [&](ValueId v) { reads_overwritten = reads_overwritten || overwritten.count(v); });
    if (reads_overwritten) {
      if (why) *why = n.qualified_op() + " reads a tensor that a later forward op overwrites";
      return true;
    }
    return false;
  };

  std::vector<ValueId> saved;
  std::unordered_set<ValueId> saved_set;
  if (which == Partitioner::Default) {
    saved = read;
  } else {
    // Flow nodes: 2 per forward value, plus source and sink.
    std::vector<ValueId> fvals(ph.primals.begin(), ph.primals.end());
    for (NodeId id : ph.forward) for_each_def(g.node(id), [&](ValueId v) { fvals.push_back(v); });
    std::unordered_map<ValueId, int> idx;
    for (size_t k = 0; k < fvals.size(); ++k) idx[fvals[k]] = static_cast<int>(k);
    const int S = static_cast<int>(2 * fvals.size()), T = S + 1;
    MaxFlow mf(T + 1);
    // Capacities in 1/2^24 bytes plus a tie-break (Note [Min-cut recomputation]): among
    // cuts of equal bytes, the one of later tensors wins, i.e. the one that recomputes
    // least (relu's output rather than its input, when the backward reads the output). The
    // biases of all values together stay under one byte, so they never outweigh a byte.
    const int64_t n_vals = static_cast<int64_t>(fvals.size());
    const int64_t step = (int64_t{1} << 24) / std::max<int64_t>(1, n_vals * n_vals);
    for (ValueId v : fvals) {
      const int k = idx[v];
      const int64_t bytes = std::min<int64_t>(nbytes(g.value(v).meta), int64_t{1} << 36);
      mf.add_edge(2 * k, 2 * k + 1, (bytes << 24) + (n_vals - 1 - k) * step);
      if (primal_set.count(v)) mf.add_edge(S, 2 * k, MaxFlow::kInf);
    }
    for (NodeId id : ph.forward) {
      const Node& n = g.node(id);
      const bool ban = banned(id, nullptr);
      for_each_def(n, [&](ValueId v) {
        const int k = idx[v];
        if (ban) mf.add_edge(S, 2 * k, MaxFlow::kInf);
        for_each_read(n, [&](ValueId u) {
          auto it = idx.find(u);
          if (it != idx.end()) mf.add_edge(2 * it->second + 1, 2 * k, MaxFlow::kInf);
        });
      });
    }
    for (ValueId v : read) mf.add_edge(2 * idx[v] + 1, T, MaxFlow::kInf);
    mf.run(S, T);
    const auto reach = mf.reachable(S);
    for (ValueId v : fvals) {
      const int k = idx[v];
      if (reach[static_cast<size_t>(2 * k)] && !reach[static_cast<size_t>(2 * k + 1)]) saved.push_back(v);
    }
  }
  saved_set.insert(saved.begin(), saved.end());

  // Forward nodes to recompute in the backward: producers of read values not saved.
  std::set<NodeId> recompute;
  {
    std::vector<ValueId> todo(read.begin(), read.end());
    std::unordered_set<ValueId> seen;
    while (!todo.empty()) {
      ValueId v = todo.back();
      todo.pop_back();
      if (saved_set.count(v) || !seen.insert(v).second) continue;
      TORCH_CHECK(!primal_set.count(v), "tcap partition: the backward needs primal ", ir::describe(g, v),
                  " but it was not saved (internal error)");
      const NodeId p = fwd_producer.at(v);
      if (!recompute.insert(p).second) continue;
      std::string why;
      TORCH_CHECK(!banned(p, &why), "tcap partition: would recompute ", ir::describe(g, v), " but ", why,
                  " (internal error)");
      for_each_read(g.node(p), [&](ValueId u) { todo.push_back(u); });
      // Other outputs of the same node are recomputed too.
    }
  }
  r.recomputed_nodes = recompute.size();

  // Decisions, one per forward value the backward depends on.
  auto add_decision = [&](ValueId v, ValueDecision::Kind k, std::string reason) {
    r.decisions.push_back({v, k, std::move(reason)});
  };
  for (ValueId v : saved) {
    std::string reason;
    if (primal_set.count(v)) {
      reason = "saved: a primal input (kept by reference, no extra memory)";
    } else if (which == Partitioner::Default) {
      const NodeId rd = first_reader.at(v);
      reason = "saved: read by the backward" + (rd >= 0 ? " (" + g.node(rd).qualified_op() + ")" : std::string());
    } else {
      std::string why;
      if (banned(fwd_producer.at(v), &why)) reason = "saved: " + why;
      else reason = "saved: cheaper to keep (" + std::to_string(nbytes(g.value(v).meta)) + " bytes) than to recompute what depends on it";
    }
    add_decision(v, ValueDecision::Kind::Saved, std::move(reason));
  }
  for (NodeId id : recompute) {
    for_each_def(g.node(id), [&](ValueId v) {
      std::ostringstream ss;
      ss << "recomputed in the backward: " << g.node(id).qualified_op() << " is cheap, from";
      for_each_read(g.node(id), [&](ValueId u) { ss << " %" << u; });
      add_decision(v, ValueDecision::Kind::Recomputed, ss.str());
    });
  }

  // The two graphs.
  // saved_bytes: memory the saving keeps alive that would otherwise be freed: not
  // primals, not tensors returned to the user anyway, not views of primals.
  std::unordered_set<ValueId> user_out(ph.user_outputs.begin(), ph.user_outputs.end());
  for (ValueId v : saved) {
    r.saved.push_back(v);
    r.saved_is_primal.push_back(primal_set.count(v) > 0);
    if (!primal_set.count(g.alias_root(v)) && !user_out.count(v)) r.saved_bytes += nbytes(g.value(v).meta);
  }
  {
    std::vector<ir::InputKind> kinds;
    std::vector<std::string> names;
    for (NodeId id : g.input_nodes()) {
      if (kinds.size() == ph.primals.size()) break;
      kinds.push_back(g.node(id).input_kind);
      names.push_back(g.node(id).name);
    }
    std::vector<ValueId> outs = ph.user_outputs;
    std::vector<std::string> onames;
    std::vector<ir::OutputKind> okinds;
    const ir::Node* on = g.output_node();
    for (size_t k = 0; k < ph.user_outputs.size(); ++k) {
      onames.push_back(k < on->output_names.size() ? on->output_names[k] : "out" + std::to_string(k));
      okinds.push_back(ir::OutputKind::User);
    }
    for (size_t k = 0; k < saved.size(); ++k) {
      outs.push_back(saved[k]);
      onames.push_back("saved" + std::to_string(k));
      okinds.push_back(ir::OutputKind::Saved);
    }
    r.forward = extract_subgraph(g, ph.forward, ph.primals, kinds, names, outs, onames, okinds);
  }
  {
    std::vector<NodeId> nodes(recompute.begin(), recompute.end());
    nodes.insert(nodes.end(), ph.backward.begin(), ph.backward.end());
    std::vector<ValueId> ins = saved;
    std::vector<ir::InputKind> kinds(saved.size(), ir::InputKind::Saved);
    std::vector<std::string> names;
    for (size_t k = 0; k < saved.size(); ++k) names.push_back("saved" + std::to_string(k));
    for (size_t k = 0; k < ph.tangents.size(); ++k) {
      ins.push_back(ph.tangents[k]);
      kinds.push_back(ir::InputKind::Tangent);
      names.push_back(g.node(g.value(ph.tangents[k]).producer).name);
    }
    std::vector<std::string> onames;
    const ir::Node* on = g.output_node();
    for (size_t k = 0; k < ph.grads.size(); ++k) {
      const size_t pos = ph.user_outputs.size() + k;
      onames.push_back(pos < on->output_names.size() ? on->output_names[pos] : "grad" + std::to_string(k));
    }
    r.backward = extract_subgraph(g, nodes, ins, kinds, names, ph.grads, onames,
                                  std::vector<ir::OutputKind>(ph.grads.size(), ir::OutputKind::Grad));
    // Recomputed forward ops run in the backward: mark them so printouts say so.
    auto& bn = r.backward.mutable_nodes();
    for (auto& n : bn) {
      if ((n.kind == ir::NodeKind::Call || n.kind == ir::NodeKind::CallHook) && n.phase == ir::Phase::Forward) {
        n.phase = ir::Phase::Backward;
        n.autograd_node = "recomputed";
        n.grad_mode = false;
      }
    }
  }
  return r;
}

std::string PartitionResult::explain() const {
  std::ostringstream ss;
  ss << to_string(partitioner) << " partition: " << saved.size() << " saved ("
     << saved_bytes << " bytes beyond primals), " << recomputed_nodes << " ops recomputed\n";
  for (const auto& d : decisions) ss << "  %" << d.value << ": " << d.reason << "\n";
  return ss.str();
}

}  // namespace tcap
