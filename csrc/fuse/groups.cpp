#include "fuse/groups.h"

#include "fuse/classify.h"
#include "ir/op_facts.h"

#include <algorithm>
#include <set>
#include <sstream>

namespace tcap::fuse {

// Note [Sibling reductions]
// A group grows along producers, so two kernels that only share an input stay apart. For
// reductions that costs a whole extra read of a tensor when, as in a layer norm's weight
// and bias gradients (sum(go * xhat) and sum(go) over the batch), they reduce the same
// tensor over the same dims. So a reduction that joins none of its producers' groups may
// join an earlier group that reads its input, under the same rules (same shape and
// reduced dims, no cycle): its kernel then also writes the second sum.

std::string shape_str(c10::ArrayRef<int64_t> s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

std::vector<int64_t> out_sizes(const ir::Graph& g, const ir::Node& n) {
  for (const auto& o : n.outputs) {
    if (o.kind == ir::ArgKind::Value) {
      const auto& s = g.value(o.values[0]).meta.sizes;
      return std::vector<int64_t>(s.begin(), s.end());
    }
  }
  return {};
}

bool is_mutation(const ir::Graph& g, const ir::Node& n) {
  for (const auto& o : n.outputs) {
    if (!o.refers_to_values()) continue;
    for (ir::ValueId v : o.values) {
      if (v != ir::kNoValue && g.value(v).version_of != ir::kNoValue) return true;
    }
  }
  return false;
}

bool is_barrier(const ir::Graph& g, const ir::Node& n) {
  return n.kind == ir::NodeKind::CallHook || (n.kind == ir::NodeKind::Call && is_mutation(g, n));
}

bool is_effect(const ir::Graph& g, const ir::Node& n) {
  if (n.kind != ir::NodeKind::Call) return true;
  if (is_mutation(g, n)) return true;
  // Random ops by their schema's nondeterministic_seeded tag (ir/op_facts.h).
  if (n.draws_random_numbers()) return true;
  return ir::reads_on_host(g, n);
}

bool broadcast_src(c10::ArrayRef<int64_t> u, const std::vector<int64_t>& target, std::vector<int>* src) {
  if (u.size() > target.size()) return false;
  src->assign(target.size(), -1);
  const size_t off = target.size() - u.size();
  for (size_t d = off; d < target.size(); ++d) {
    const int64_t us = u[d - off];
    if (us == target[d]) {
      (*src)[d] = static_cast<int>(d - off);
      if (us == 1) (*src)[d] = -1;
    } else if (us != 1) {
      return false;
    }
  }
  return true;
}

bool outer_src(c10::ArrayRef<int64_t> u, const Group& gr, std::vector<int>* src) {
  src->assign(gr.S.size(), -1);
  const bool keep = u.size() == gr.S.size();
  if (!keep && u.size() != gr.S.size() - gr.R.size()) return false;
  int ud = 0;
  for (size_t d = 0; d < gr.S.size(); ++d) {
    const bool red = std::binary_search(gr.R.begin(), gr.R.end(), static_cast<int64_t>(d));
    if (red) {
      if (keep) {
        if (u[d] != 1) return false;
        ++ud;
      }
      continue;
    }
    if (u[static_cast<size_t>(ud)] != gr.S[d]) return false;
    (*src)[d] = gr.S[d] == 1 ? -1 : ud;
    ++ud;
  }
  return true;
}

// Whether a layout covers its elements exactly once (c10's _compute_non_overlapping_and_dense
// says the same but draws a false GCC 12 -Wmaybe-uninitialized from its SmallVector here).
bool dense_layout(const ir::TensorMeta& m) {
  std::vector<size_t> perm;
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    if (m.sizes[d] == 0) return true;
    if (m.sizes[d] != 1) perm.push_back(d);
  }
  std::sort(perm.begin(), perm.end(), [&](size_t a, size_t b) { return m.strides[a] < m.strides[b]; });
  int64_t expected = 1;
  for (size_t d : perm) {
    if (m.strides[d] != expected) return false;
    expected *= m.sizes[d];
  }
  return true;
}

std::string decision(const ir::Node& n, const std::string& why) {
  return "%" + std::to_string(n.id) + " " + n.qualified_op() + ": " + why;
}

namespace {

std::vector<int64_t> outer_shape(const std::vector<int64_t>& S, const std::vector<int64_t>& R, bool keep) {
  std::vector<int64_t> o;
  for (size_t d = 0; d < S.size(); ++d) {
    const bool red = std::binary_search(R.begin(), R.end(), static_cast<int64_t>(d));
    if (!red) o.push_back(S[d]);
    else if (keep) o.push_back(1);
  }
  return o;
}

bool same(c10::ArrayRef<int64_t> a, const std::vector<int64_t>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

class Grouper {
 public:
  Grouper(const ir::Graph& g, const c10::Device& device, int64_t max_matmul_macs, Grouping& out)
      : g_(g), device_(device), max_matmul_macs_(max_matmul_macs), out_(out) {}

  void run() {
    const size_t n_nodes = g_.nodes().size();
    group_of_node_.assign(n_nodes, -1);
    group_of_value_.assign(g_.values().size(), -1);
    space_of_value_.assign(g_.values().size(), Space::Full);
    prev_effect_.assign(n_nodes, -1);
    ir::NodeId last_effect = -1;
    for (const auto& n : g_.nodes()) {
      if (is_effect(g_, n)) {
        prev_effect_[static_cast<size_t>(n.id)] = last_effect;
        last_effect = n.id;
      }
    }
    for (const auto& n : g_.nodes()) visit(n);
    absorb_views();
  }

 private:
  void visit(const ir::Node& n) {
    if (is_barrier(g_, n)) {
      for (auto& gr : groups_) gr.closed = true;
    }
    if (n.kind != ir::NodeKind::Call) {
      return;
    }
    NodeClass info;
    if (auto why = classify(g_, n, &info, device_, max_matmul_macs_)) {
      if (n.op.rfind("aten::", 0) == 0 && !is_view_like(n)) decide(n, *why);
      return;
    }
    // Candidate groups: those of the node's producers, in argument order.
    std::vector<int> candidates;
    ir::for_each_value(n.args, [&](ir::ValueId v) {
      const int gid = group_of_value_[static_cast<size_t>(v)];
      if (gid >= 0 && std::find(candidates.begin(), candidates.end(), gid) == candidates.end()) candidates.push_back(gid);
    });
    // Then, for a reduction, the groups that already read its input (Note [Sibling reductions]).
    const size_t n_producer_groups = candidates.size();
    if (info.cls == OpClass::Reduction) {
      const ir::ValueId src = n.args.at(0).values.at(0);
      for (ir::NodeId u : g_.users(src)) {
        if (u >= n.id) break;
        const int gid = group_of_node_[static_cast<size_t>(u)];
        if (gid >= 0 && std::find(candidates.begin(), candidates.end(), gid) == candidates.end()) candidates.push_back(gid);
      }
    }
    int chosen = -1;
    Space space = Space::Full;
    // A matmul reads its operands through their strides along its own space: it starts a
    // group (Note [Small matmuls as kernels]).
    if (info.cls == OpClass::Contraction) candidates.clear();
    for (size_t c = 0; c < candidates.size(); ++c) {
      const int gid = candidates[c];
      std::string why;
      if (try_join(n, info, groups_[static_cast<size_t>(gid)], &space, &why)) {
        chosen = gid;
        break;
      }
      if (c < n_producer_groups) decide(n, "not fused with " + group_name(gid) + ": " + why);
    }
    if (chosen < 0) {
      Group gr;
      gr.id = static_cast<int>(groups_.size());
      if (info.cls == OpClass::Pointwise) {
        gr.S = out_sizes(g_, n);
      } else if (info.cls == OpClass::Contraction) {
        gr.S = contraction_space(g_, n);
        gr.R = info.reduce_dims;
        gr.contraction = true;
      } else {
        const auto& in = g_.value(n.args.at(0).values.at(0)).meta.sizes;
        gr.S.assign(in.begin(), in.end());
        gr.R = info.reduce_dims;
      }
      space = info.cls == OpClass::Reduction || info.cls == OpClass::Contraction ? Space::Outer : Space::Full;
      if (numel(gr.S) == 0) {
        decide(n, "empty tensor");
          return;
      }
      // A pointwise group started on a reduction's result is an Outer node of no group.
      groups_.push_back(gr);
      chosen = gr.id;
    }
    // The node is a member before any merge is weighed: can_merge's path check must see
    // the node's own arguments (a relu's threshold_backward reads the relu group's result
    // and the max_pool backward computed from it: merging the two would be a cycle).
    {
      Group& gr = groups_[static_cast<size_t>(chosen)];
      if (info.cls != OpClass::Pointwise && gr.R.empty()) gr.R = info.reduce_dims;
      gr.nodes.push_back(n.id);
      group_of_node_[static_cast<size_t>(n.id)] = chosen;
    }
    if ((info.cls != OpClass::Pointwise || space == Space::Full) && info.cls != OpClass::Contraction) {
      // The node also reads other groups of the same shape: merge them into this one
      // (coscos backward: sin(x) and the chain through cos(x) meet at the last mul).
      for (size_t c = 0; c < n_producer_groups; ++c) {
        const int h = candidates[c];
        if (h != chosen && can_merge(chosen, h)) merge(chosen, h);
      }
    }
    node_space_[n.id] = space;
    node_class_[n.id] = info.cls;
    // Output spaces.
    size_t k = 0;
    for (const auto& o : n.outputs) {
      if (o.kind != ir::ArgKind::Value) continue;
      const ir::ValueId v = o.values[0];
      group_of_value_[static_cast<size_t>(v)] = chosen;
      Space s = space;
      if (info.cls == OpClass::Row) s = k == 0 ? Space::Full : Space::Outer;  // layer_norm's mean, rstd
      space_of_value_[static_cast<size_t>(v)] = s;
      ++k;
    }
  }

  static bool is_view_like(const ir::Node& n) { return ir::op_has(n.op, ir::OpFact::View); }

  // Note [Views read through their base] (groups.h): views that keep their base's first
  // element, with their base and result.
  bool offset_keeping_view(const ir::Node& n, ir::ValueId* base, ir::ValueId* result) const {
    if (n.kind != ir::NodeKind::Call || !ir::op_has(n.op, ir::OpFact::KeepsOffset) || n.args.empty() ||
        n.args[0].kind != ir::ArgKind::Value || n.outputs.size() != 1 || n.outputs[0].kind != ir::ArgKind::Value) {
      return false;
    }
    *base = n.args[0].values[0];
    *result = n.outputs[0].values[0];
    const auto& b = g_.value(*base).meta;
    const auto& v = g_.value(*result).meta;
    return g_.value(*result).view_of != ir::kNoValue && b.dtype == v.dtype && b.device == v.device &&
           b.storage_offset == v.storage_offset && b.device == device_;
  }

  // Whether a mutation or hook call lies strictly between nodes a and b. A view is not
  // taken across one: the rewrite orders every unit around such a barrier (Note [Fusion
  // groups]), and a group whose members stood on both sides of it would have to run both
  // before and after it (the rewrite finds the cycle and runs the whole graph unfused);
  // and a view taken into a later kernel must see its base as it was when it was made (an
  // in-place t_() in between would change what the kernel's fallback computes).
  bool effect_between(ir::NodeId a, ir::NodeId b) const {
    for (ir::NodeId x = a + 1; x < b; ++x) {
      if (is_barrier(g_, g_.node(x))) return true;
    }
    return false;
  }

  void absorb_views() {
    const auto outs = g_.output_values();
    const std::set<ir::ValueId> graph_outputs(outs.begin(), outs.end());
    auto all_readers_in = [&](ir::ValueId v, int gid) {
      if (graph_outputs.count(v)) return false;
      const auto& users = g_.users(v);
      return !users.empty() && std::all_of(users.begin(), users.end(), [&](ir::NodeId u) {
        return group_of_node_[static_cast<size_t>(u)] == gid;
      });
    };
    auto take = [&](ir::NodeId p, int gid, ir::ValueId base, ir::ValueId result) {
      Group& gr = groups_[static_cast<size_t>(gid)];
      gr.nodes.insert(std::upper_bound(gr.nodes.begin(), gr.nodes.end(), p), p);
      group_of_node_[static_cast<size_t>(p)] = gid;
      group_of_value_[static_cast<size_t>(result)] = gid;
      out_.view_nodes.insert(p);
      out_.view_source[result] = base;
    };
    // Views of outside values, walking back through chains of views (t(view(x))).
    for (Group& gr : groups_) {
      if (gr.nodes.empty() || gr.dissolved) continue;
      for (bool grew = true; grew;) {
        grew = false;
        for (ir::NodeId id : std::vector<ir::NodeId>(gr.nodes)) {
          ir::for_each_value(g_.node(id).args, [&](ir::ValueId v) {
            const ir::NodeId p = g_.value(v).producer;
            if (p < 0 || group_of_node_[static_cast<size_t>(p)] >= 0) return;
            ir::ValueId base = ir::kNoValue, result = ir::kNoValue;
            if (!offset_keeping_view(g_.node(p), &base, &result) || result != v) return;
            if (group_of_value_[static_cast<size_t>(base)] == gr.id || !all_readers_in(v, gr.id)) return;
            if (effect_between(p, gr.nodes.back())) return;
            take(p, gr.id, base, result);
            grew = true;
          });
        }
      }
    }
    // Views of a group's result (or of such a view) that nothing else reads.
    for (const auto& n : g_.nodes()) {
      if (group_of_node_[static_cast<size_t>(n.id)] >= 0) continue;
      ir::ValueId base = ir::kNoValue, result = ir::kNoValue;
      if (!offset_keeping_view(n, &base, &result)) continue;
      const int gid = group_of_value_[static_cast<size_t>(base)];
      if (gid < 0 || graph_outputs.count(base)) continue;
      const auto& users = g_.users(base);
      if (users.size() != 1 || users[0] != n.id) continue;
      const auto& bm = g_.value(base).meta;
      const auto& rm = g_.value(result).meta;
      if (!dense_layout(bm) || !dense_layout(rm) || bm.numel() != rm.numel()) continue;
      if (effect_between(groups_[static_cast<size_t>(gid)].nodes.back(), n.id)) continue;
      take(n.id, gid, base, result);
    }
  }

  static int64_t numel(const std::vector<int64_t>& s) {
    int64_t n = 1;
    for (auto x : s) n *= x;
    return n;
  }

  bool try_join(const ir::Node& n, const NodeClass& info, const Group& gr, Space* space, std::string* why) {
    if (gr.closed) {
      *why = "the group ended at a mutation or hook call";
      return false;
    }
    if (gr.dissolved) return false;
    if (gr.contraction && (info.cls != OpClass::Pointwise || same(out_sizes(g_, n), gr.S))) {
      *why = "only pointwise ops on a matmul's result join its kernel";
      return false;
    }
    // No cycle: a producer outside the group must not depend on the group.
    bool cycle = false;
    ir::for_each_value(n.args, [&](ir::ValueId v) {
      const auto p = g_.value(v).producer;
      if (cycle || p < 0 || group_of_node_[static_cast<size_t>(p)] == gr.id) return;
      if (reaches_group(p, gr.id)) cycle = true;
    });
    if (cycle) {
      *why = "it also reads a value computed outside the group from the group's results (a cycle)";
      return false;
    }
    if (info.cls == OpClass::Pointwise) {
      const auto out = out_sizes(g_, n);
      if (same(out, gr.S)) {
        *space = Space::Full;
        if (!gr.R.empty() && feeds_only_other_reductions(n, gr.R)) {
          // Joining would make this kernel write the value out for the other reduction's
          // kernel to read back (a layer norm's weight gradient after its row kernel).
          *why = "its result only feeds reductions over other dims than the group's";
          return false;
        }
        return full_args_ok(n, gr, why);
      }
      if (!gr.R.empty() && (out == outer_shape(gr.S, gr.R, true) || out == outer_shape(gr.S, gr.R, false))) {
        *space = Space::Outer;
        bool ok = true;
        ir::for_each_value(n.args, [&](ir::ValueId v) {
          if (group_of_value_[static_cast<size_t>(v)] != gr.id) return;
          if (space_of_value_[static_cast<size_t>(v)] != Space::Outer || !same(g_.value(v).meta.sizes, out)) ok = false;
        });
        if (!ok) *why = "it mixes the group's reduced results with full-shape values";
        return ok;
      }
      *why = "shape " + shape_str(out) + " differs from the group's " + shape_str(gr.S);
      return false;
    }
    const auto& in = g_.value(n.args.at(0).values.at(0)).meta.sizes;
    if (!same(in, gr.S)) {
      *why = "it reduces a " + shape_str(in) + " tensor, the group's shape is " + shape_str(gr.S);
      return false;
    }
    if (!gr.R.empty() && gr.R != info.reduce_dims) {
      *why = "it reduces other dims than the group's reductions";
      return false;
    }
    *space = info.cls == OpClass::Reduction ? Space::Outer : Space::Full;
    std::vector<int64_t> R = gr.R.empty() ? info.reduce_dims : gr.R;
    Group probe = gr;
    probe.R = R;
    return full_args_ok(n, probe, why);
  }

  // Whether every reader of n's result is a reduction over other dims than R.
  bool feeds_only_other_reductions(const ir::Node& n, const std::vector<int64_t>& R) const {
    bool any = false;
    for (const auto& o : n.outputs) {
      if (o.kind != ir::ArgKind::Value) continue;
      for (ir::NodeId u : g_.users(o.values[0])) {
        NodeClass ui;
        if (classify(g_, g_.node(u), &ui, device_, max_matmul_macs_) || ui.cls != OpClass::Reduction || ui.reduce_dims == R) {
          return false;
        }
        any = true;
      }
    }
    return any;
  }

  bool can_merge(int gid, int hid) const {
    const Group& g = groups_[static_cast<size_t>(gid)];
    const Group& h = groups_[static_cast<size_t>(hid)];
    if (h.closed || h.dissolved || h.nodes.empty() || h.S != g.S || g.contraction || h.contraction) return false;
    if (!h.R.empty() && h.R != g.R) return false;
    // No path between the two through nodes outside both.
    auto outside_reaches = [&](const Group& from, int target) {
      for (ir::NodeId m : from.nodes) {
        bool hit = false;
        ir::for_each_value(g_.node(m).args, [&](ir::ValueId v) {
          const auto p = g_.value(v).producer;
          if (hit || p < 0) return;
          const int pg = group_of_node_[static_cast<size_t>(p)];
          if (pg == gid || pg == hid) return;
          hit = reaches_group(p, target);
        });
        if (hit) return true;
      }
      return false;
    };
    return !outside_reaches(h, gid) && !outside_reaches(g, hid);
  }

  void merge(int gid, int hid) {
    Group& g = groups_[static_cast<size_t>(gid)];
    Group& h = groups_[static_cast<size_t>(hid)];
    for (ir::NodeId m : h.nodes) {
      group_of_node_[static_cast<size_t>(m)] = gid;
      for (const auto& o : g_.node(m).outputs) {
        if (o.kind == ir::ArgKind::Value) group_of_value_[static_cast<size_t>(o.values[0])] = gid;
      }
    }
    if (g.R.empty()) g.R = h.R;
    g.nodes.insert(g.nodes.end(), h.nodes.begin(), h.nodes.end());
    std::sort(g.nodes.begin(), g.nodes.end());
    h.nodes.clear();
    h.dissolved = true;
  }

  // Whether node `start` depends on group `gid`, walking producers backwards; a node of a
  // group stands for the whole group (the group runs as one unit). Walked afresh each
  // time: what a node depends on grows as groups gain members.
  bool reaches_group(ir::NodeId start, int gid) const {
    std::vector<char> seen(g_.nodes().size(), 0);
    std::vector<char> seen_group(groups_.size(), 0);
    std::vector<ir::NodeId> stack{start};
    seen[static_cast<size_t>(start)] = 1;
    auto push = [&](ir::NodeId p) {
      if (p >= 0 && !seen[static_cast<size_t>(p)]) {
        seen[static_cast<size_t>(p)] = 1;
        stack.push_back(p);
      }
    };
    auto push_inputs = [&](ir::NodeId x) {
      ir::for_each_value(g_.node(x).args, [&](ir::ValueId v) { push(g_.value(v).producer); });
      // Effects run in program order (rewrite() chains them): the previous one is a
      // dependency too.
      push(prev_effect_[static_cast<size_t>(x)]);
    };
    while (!stack.empty()) {
      const ir::NodeId x = stack.back();
      stack.pop_back();
      const int h = group_of_node_[static_cast<size_t>(x)];
      if (h == gid) return true;
      if (h >= 0) {
        if (seen_group[static_cast<size_t>(h)]) continue;
        seen_group[static_cast<size_t>(h)] = 1;
        for (ir::NodeId m : groups_[static_cast<size_t>(h)].nodes) push_inputs(m);
      } else {
        push_inputs(x);
      }
    }
    return false;
  }

  // A Full node's arguments from its group: Full values, or Outer values that broadcast
  // onto the outer dims.
  bool full_args_ok(const ir::Node& n, const Group& gr, std::string* why) {
    bool ok = true;
    ir::for_each_value(n.args, [&](ir::ValueId v) {
      if (!ok || group_of_value_[static_cast<size_t>(v)] != gr.id) return;
      if (space_of_value_[static_cast<size_t>(v)] == Space::Full) return;
      const auto& u = g_.value(v).meta.sizes;
      std::vector<int> bsrc, osrc;
      if (!broadcast_src(u, gr.S, &bsrc) || !outer_src(u, gr, &osrc) || bsrc != osrc) {
        ok = false;
        *why = "it broadcasts the reduced value %" + std::to_string(v) + " " + shape_str(u) +
               " along other dims than the reduced ones";
      }
    });
    return ok;
  }

  std::string group_name(int gid) const { return "group " + std::to_string(gid); }

  void decide(const ir::Node& n, const std::string& why) { decisions_.push_back(decision(n, why)); }

  const ir::Graph& g_;
  const c10::Device device_;
  const int64_t max_matmul_macs_;
  Grouping& out_;
  std::vector<Group>& groups_ = out_.groups;
  std::vector<int>& group_of_node_ = out_.group_of_node;
  std::vector<int>& group_of_value_ = out_.group_of_value;
  std::vector<Space>& space_of_value_ = out_.space_of_value;
  std::map<ir::NodeId, Space>& node_space_ = out_.node_space;
  std::map<ir::NodeId, OpClass>& node_class_ = out_.node_class;
  std::vector<std::string>& decisions_ = out_.decisions;
  std::vector<ir::NodeId> prev_effect_;  // per node: the previous effect node if it is one
};

}  // namespace

Grouping form_groups(const ir::Graph& g, const c10::Device& device, int64_t max_matmul_macs) {
  Grouping out;
  Grouper(g, device, max_matmul_macs, out).run();
  return out;
}

}  // namespace tcap::fuse
