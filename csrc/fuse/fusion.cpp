#include "fuse/fusion.h"

#include "fuse/decompose.h"
#include "fuse/classify.h"
#include "fuse/lowering.h"
#include "support/logging.h"

#include <c10/util/ArrayRef.h>
#include <c10/util/strides.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <map>
#include <queue>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace tcap::fuse {

// Note [Fusion groups]
// A group has a full shape S (the shape its pointwise ops produce, or the shape its
// reductions read) and a set R of reduced dims of S (empty for a pointwise group). Each
// node of a group works in one of two spaces:
//   Full:  its output has shape S (pointwise ops, softmax-like Row ops);
//   Outer: its output has the reduced shape, S without R (keepdim or not): reductions,
//          and pointwise ops on their results (mean = sum / n).
// The kernel's domain is S with R moved last; Full values are element-level, Outer values
// outer-level (kir.h). A Full node may read an Outer value of its group only if eager
// broadcasting lines that value up with the outer dims (keepdim results, or R leading);
// an Outer node reads Outer values of its own shape. A node joins a producer's group
// only when that holds, its reduce dims equal the group's (or the group has none yet),
// and no path leaves the group and comes back (checked with each node's set of groups
// it depends on). Groups are closed at every mutation and hook call, and the rewritten
// graph orders mutations after every group formed before them, so no kernel reads a
// buffer after (or writes one before) an in-place op that eager ordered differently.

// Note [Sibling reductions]
// A group grows along producers, so two kernels that only share an input stay apart. For
// reductions that costs a whole extra read of a tensor when, as in a layer norm's weight
// and bias gradients (sum(go * xhat) and sum(go) over the batch), they reduce the same
// tensor over the same dims. So a reduction that joins none of its producers' groups may
// join an earlier group that reads its input, under the same rules (same shape and
// reduced dims, no cycle): its kernel then also writes the second sum.

namespace {

enum class Space { Full, Outer };

struct Group {
  int id = 0;
  std::vector<int64_t> S;
  std::vector<int64_t> R;  // sorted dims of S
  std::vector<ir::NodeId> nodes;
  bool closed = false;
  bool dissolved = false;
};

std::string shape_str(c10::ArrayRef<int64_t> s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

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

bool is_mutation(const ir::Graph& g, const ir::Node& n) {
  for (const auto& o : n.outputs) {
    if (!o.refers_to_values()) continue;
    for (ir::ValueId v : o.values) {
      if (v != ir::kNoValue && g.value(v).version_of != ir::kNoValue) return true;
    }
  }
  return false;
}

// Nodes whose order among themselves matters beyond dataflow: mutations, hook calls, RNG,
// host reads, the graph's inputs and output. Pure ATen calls are ordered by dataflow only.
bool is_effect(const ir::Graph& g, const ir::Node& n) {
  if (n.kind != ir::NodeKind::Call) return true;
  if (is_mutation(g, n)) return true;
  static const char* rng[] = {"rand", "dropout", "bernoulli", "normal", "uniform", "multinomial", "poisson",
                              "exponential", "geometric", "cauchy", "random"};
  for (const char* r : rng) {
    if (n.op.find(r) != std::string::npos) return true;
  }
  return std::any_of(n.outputs.begin(), n.outputs.end(), ir::is_host_value);
}

// Per S dim: which dim of a tensor of shape `u` feeds it under right-aligned
// broadcasting (-1: broadcast). False if u does not broadcast to `target`.
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

// Note [Fused output layout]
// A kernel writes its outputs in the layout recorded for them, so results look exactly like
// eager's. A recorded layout that is not dense (overlapping, such as the stride-0 strides
// seen on some gradient accumulations in captured backward graphs) cannot be written
// element by element; such outputs are written contiguously instead.
// Whether a layout covers its elements exactly once (c10's _compute_non_overlapping_and_dense
// says the same but draws a false GCC 12 -Wmaybe-uninitialized from its SmallVector here).
bool dense(const ir::TensorMeta& m) {
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

ir::TensorMeta written_layout(const ir::TensorMeta& m) {
  if (dense(m)) return m;
  ir::TensorMeta c = m;
  const auto strides = c10::contiguous_strides(m.sizes);
  c.strides.assign(strides.begin(), strides.end());
  return c;
}

class Fuser {
 public:
  Fuser(const ir::Graph& g, const FusionOptions& opts) : g_(g), opts_(opts) {}

  FusionResult run() {
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
    build_kernels();
    return rewrite();
  }

 private:
  // --- grouping ------------------------------------------------------------------
  void visit(const ir::Node& n) {
    if (n.kind == ir::NodeKind::CallHook || (n.kind == ir::NodeKind::Call && is_mutation(g_, n))) {
      for (auto& gr : groups_) gr.closed = true;
    }
    if (n.kind != ir::NodeKind::Call) {
      return;
    }
    NodeClass info;
    if (auto why = classify(g_, n, &info, opts_.device)) {
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
        gr.S = out_sizes(n);
      } else {
        const auto& in = g_.value(n.args.at(0).values.at(0)).meta.sizes;
        gr.S.assign(in.begin(), in.end());
        gr.R = info.reduce_dims;
      }
      space = info.cls == OpClass::Reduction ? Space::Outer : Space::Full;
      if (numel(gr.S) == 0) {
        decide(n, "empty tensor");
          return;
      }
      // A pointwise group started on a reduction's result is an Outer node of no group.
      groups_.push_back(gr);
      chosen = gr.id;
    }
    if (info.cls != OpClass::Pointwise || space == Space::Full) {
      // The node also reads other groups of the same shape: merge them into this one
      // (coscos backward: sin(x) and the chain through cos(x) meet at the last mul).
      for (size_t c = 0; c < n_producer_groups; ++c) {
        const int h = candidates[c];
        if (h != chosen && can_merge(chosen, h)) merge(chosen, h);
      }
    }
    Group& gr = groups_[static_cast<size_t>(chosen)];
    if (info.cls != OpClass::Pointwise && gr.R.empty()) gr.R = info.reduce_dims;
    gr.nodes.push_back(n.id);
    group_of_node_[static_cast<size_t>(n.id)] = chosen;
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

  static bool is_view_like(const ir::Node& n) {
    static const std::set<std::string> views = {"aten::view", "aten::_unsafe_view", "aten::t", "aten::transpose",
                                                "aten::permute", "aten::expand", "aten::unsqueeze", "aten::squeeze",
                                                "aten::slice", "aten::select", "aten::detach", "aten::alias",
                                                "aten::as_strided", "aten::reshape", "aten::unbind", "aten::split",
                                                "aten::chunk", "aten::narrow", "aten::split_with_sizes"};
    return views.count(n.op) > 0;
  }

  std::vector<int64_t> out_sizes(const ir::Node& n) const {
    for (const auto& o : n.outputs) {
      if (o.kind == ir::ArgKind::Value) {
        const auto& s = g_.value(o.values[0]).meta.sizes;
        return std::vector<int64_t>(s.begin(), s.end());
      }
    }
    return {};
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
      const auto out = out_sizes(n);
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
        if (classify(g_, g_.node(u), &ui, opts_.device) || ui.cls != OpClass::Reduction || ui.reduce_dims == R) {
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
    if (h.closed || h.dissolved || h.nodes.empty() || h.S != g.S) return false;
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

  // Per S dim: which dim of an Outer value of shape u it comes from (-1 on reduced dims).
  static bool outer_src(c10::ArrayRef<int64_t> u, const Group& gr, std::vector<int>* src) {
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

  std::string group_name(int gid) const { return "group " + std::to_string(gid); }

  void decide(const ir::Node& n, const std::string& why) {
    decisions_.push_back("%" + std::to_string(n.id) + " " + n.qualified_op() + ": " + why);
  }

  // --- kernels ---------------------------------------------------------------------
  // A lowered group waiting for its kernel (Note [Parallel kernel compilation]).
  struct Pending {
    Group* gr = nullptr;
    FusedGroup fg;
    int64_t id = -1;
    std::string why;
    std::exception_ptr error;  // anything but the -1 the callback returns for a refusal
  };

  int compile_threads(size_t groups) const {
    int n = opts_.compile_threads > 0 ? opts_.compile_threads : Config::get().compile_threads;
    if (n <= 0) n = static_cast<int>(std::min<unsigned>(8, std::max(1u, std::thread::hardware_concurrency())));
    return static_cast<int>(std::min<size_t>(static_cast<size_t>(n), groups));
  }

  void compile_all(std::vector<Pending>& pending) {
    auto work = [&](size_t i) {
      try {
        pending[i].id = opts_.compile(pending[i].fg, &pending[i].why);
      } catch (...) {
        pending[i].error = std::current_exception();
      }
    };
    const int threads = compile_threads(pending.size());
    if (threads <= 1) {
      for (size_t i = 0; i < pending.size(); ++i) work(i);
      return;
    }
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    pool.reserve(static_cast<size_t>(threads));
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        for (size_t i = next.fetch_add(1); i < pending.size(); i = next.fetch_add(1)) work(i);
      });
    }
    for (auto& t : pool) t.join();
  }

  void build_kernels() {
    std::vector<Pending> pending;
    const auto outputs = g_.output_values();
    std::set<ir::ValueId> graph_outputs(outputs.begin(), outputs.end());
    for (auto& gr : groups_) {
      if (gr.nodes.empty()) continue;  // merged into another group
      if (static_cast<int>(gr.nodes.size()) < opts_.min_nodes) {
        gr.dissolved = true;
        continue;
      }
      FusedGroup fg;
      std::ostringstream name;
      name << "fused_" << gr.id;
      int shown = 0;
      for (ir::NodeId id : gr.nodes) {
        if (shown++ < 4) {
          std::string op = g_.node(id).op;
          name << "_" << op.substr(op.find("::") == std::string::npos ? 0 : op.find("::") + 2);
        }
      }
      fg.name = name.str();
      fg.nodes = gr.nodes;
      std::set<ir::NodeId> members(gr.nodes.begin(), gr.nodes.end());
      // Inputs in first-use order; outputs: results read outside the group.
      for (ir::NodeId id : gr.nodes) {
        ir::for_each_value(g_.node(id).args, [&](ir::ValueId v) {
          if (group_of_value_[static_cast<size_t>(v)] == gr.id) return;
          if (std::find(fg.inputs.begin(), fg.inputs.end(), v) == fg.inputs.end()) fg.inputs.push_back(v);
        });
      }
      for (ir::NodeId id : gr.nodes) {
        for (const auto& o : g_.node(id).outputs) {
          if (o.kind != ir::ArgKind::Value) continue;
          const ir::ValueId v = o.values[0];
          bool outside = graph_outputs.count(v) > 0;
          for (ir::NodeId u : g_.users(v)) outside = outside || !members.count(u);
          if (outside) {
            // See Note [Repeated gradient outputs]: one buffer per Grad occurrence beyond
            // the first.
            const int copies = 1 + std::max(0, grad_occurrences(v) - 1);
            for (int c = 0; c < copies; ++c) {
              fg.outputs.push_back(v);
              fg.output_metas.push_back(written_layout(g_.value(v).meta));
            }
          }
        }
      }
      if (fg.outputs.empty()) {
        // Nothing the group computes is read (an attention's averaged weights nobody
        // asked for): its ops are pure, so they are dropped instead of run.
        decide(g_.node(gr.nodes[0]), "group " + fg.name + " computes nothing that is read: its " +
                                         std::to_string(gr.nodes.size()) + " ops are dropped");
        dead_groups_.insert(gr.id);
        continue;
      }
      for (ir::ValueId v : fg.inputs) fg.input_metas.push_back(g_.value(v).meta);
      try {
        fg.kernel = lower_group(gr, fg);
        fg.fallback = subgraph(fg);
      } catch (const c10::Error& e) {
        decide(g_.node(gr.nodes[0]), "group " + fg.name + " not compiled: " + e.what_without_backtrace());
        gr.dissolved = true;
        continue;
      }
      Pending p;
      p.gr = &gr;
      p.fg = std::move(fg);
      pending.push_back(std::move(p));
    }
    compile_all(pending);
    for (Pending& p : pending) {
      if (p.error) std::rethrow_exception(p.error);
      if (p.id < 0) {
        decide(g_.node(p.gr->nodes[0]), "group " + p.fg.name + " not compiled: " + p.why);
        p.gr->dissolved = true;
        continue;
      }
      p.fg.kernel_id = p.id;
      kept_[p.gr->id] = fused_.size();
      fused_.push_back(std::move(p.fg));
    }
  }

  kir::Kernel lower_group(const Group& gr, const FusedGroup& fg) {
    kir::Kernel k;
    k.name = fg.name;
    const size_t rank = gr.S.size();
    std::vector<size_t> perm;  // domain dim -> S dim
    for (size_t d = 0; d < rank; ++d) {
      if (!std::binary_search(gr.R.begin(), gr.R.end(), static_cast<int64_t>(d))) perm.push_back(d);
    }
    for (int64_t d : gr.R) perm.push_back(static_cast<size_t>(d));
    for (size_t j : perm) k.sizes.push_back(gr.S[j]);
    k.num_reduce_dims = static_cast<int>(gr.R.size());
    auto to_domain = [&](const std::vector<int64_t>& s_strides) {
      std::vector<int64_t> out;
      for (size_t j : perm) out.push_back(s_strides[j]);
      return out;
    };
    // Strides over S of an outside value read by a node of the given space / output shape.
    auto load_strides = [&](const ir::TensorMeta& m, Space space, const std::vector<int64_t>& node_out) {
      std::vector<int64_t> st(rank, 0);
      if (space == Space::Full) {
        std::vector<int> src;
        TORCH_CHECK(broadcast_src(m.sizes, gr.S, &src), "input ", shape_str(m.sizes), " does not broadcast to ",
                    shape_str(gr.S));
        for (size_t d = 0; d < rank; ++d) st[d] = src[d] < 0 ? 0 : m.strides[static_cast<size_t>(src[d])];
        return st;
      }
      // Outer node: broadcast onto the node's output shape, then place its dims.
      std::vector<int> src;
      TORCH_CHECK(broadcast_src(m.sizes, node_out, &src), "input ", shape_str(m.sizes), " does not broadcast to ",
                  shape_str(node_out));
      std::vector<int> osrc;
      TORCH_CHECK(outer_src(node_out, gr, &osrc), "bad outer shape");
      for (size_t d = 0; d < rank; ++d) {
        if (osrc[d] < 0) continue;
        const int s = src[static_cast<size_t>(osrc[d])];
        st[d] = s < 0 ? 0 : m.strides[static_cast<size_t>(s)];
      }
      return st;
    };
    std::map<ir::ValueId, int32_t> buffer_of;
    for (ir::ValueId v : fg.inputs) {
      buffer_of[v] = static_cast<int32_t>(k.buffers.size());
      k.buffers.push_back({"%" + std::to_string(v), *to_kir(g_.value(v).meta.dtype), false});
    }
    std::map<ir::ValueId, Val> val_of;
    std::map<std::pair<ir::ValueId, std::vector<int64_t>>, Val> loads;
    Space cur_space = Space::Full;
    std::vector<int64_t> cur_out;
    Emitter em(g_, k, [&](ir::ValueId v) -> Val {
      auto it = val_of.find(v);
      if (it != val_of.end()) return it->second;
      const auto& m = g_.value(v).meta;
      auto strides = to_domain(load_strides(m, cur_space, cur_out));
      auto key = std::make_pair(v, strides);
      auto lit = loads.find(key);
      if (lit != loads.end()) return lit->second;
      kir::Instr in;
      in.op = kir::OpCode::Load;
      in.dtype = *to_kir(m.dtype);
      in.buffer = buffer_of.at(v);
      in.strides = strides;
      Val r{kir::add(k, std::move(in)), *to_kir(m.dtype)};
      loads[key] = r;
      return r;
    });
    for (ir::NodeId id : gr.nodes) {
      const ir::Node& n = g_.node(id);
      // Reductions and Row ops read their tensors in the full space.
      cur_space = node_class_.at(id) == OpClass::Pointwise ? node_space_.at(id) : Space::Full;
      cur_out = out_sizes(n);
      auto vals = lower(em, n);
      size_t i = 0;
      for (const auto& o : n.outputs) {
        if (o.kind != ir::ArgKind::Value) continue;
        TORCH_INTERNAL_ASSERT(i < vals.size(), "lowering of ", n.qualified_op(), " returned too few values");
        val_of[o.values[0]] = vals[i++];
      }
    }
    for (size_t oi = 0; oi < fg.outputs.size(); ++oi) {
      const ir::ValueId v = fg.outputs[oi];
      const auto& m = fg.output_metas[oi];
      const int32_t b = static_cast<int32_t>(k.buffers.size());
      const kir::DType dt = *to_kir(m.dtype);
      k.buffers.push_back({"%" + std::to_string(v), dt, true});
      std::vector<int64_t> st(rank, 0);
      if (space_of_value_[static_cast<size_t>(v)] == Space::Full) {
        for (size_t d = 0; d < rank; ++d) st[d] = m.sizes[d] == 1 ? 0 : m.strides[d];
      } else {
        std::vector<int> src;
        TORCH_CHECK(outer_src(m.sizes, gr, &src), "bad outer output shape");
        for (size_t d = 0; d < rank; ++d) st[d] = src[d] < 0 ? 0 : m.strides[static_cast<size_t>(src[d])];
      }
      kir::Store s;
      s.value = em.cast(val_of.at(v), dt).id;
      s.buffer = b;
      s.strides = to_domain(st);
      k.stores.push_back(std::move(s));
    }
    coalesce(k);
    kir::verify(k);
    return k;
  }

  // Merges adjacent domain dims that every access walks as one (d's stride = size(d+1) *
  // stride(d+1) everywhere) and drops size-1 dims, so contiguous tensors become one loop.
  static void coalesce(kir::Kernel& k) {
    std::vector<std::vector<int64_t>*> accesses;
    for (auto& in : k.instrs) {
      if (in.op == kir::OpCode::Load) accesses.push_back(&in.strides);
    }
    for (auto& s : k.stores) accesses.push_back(&s.strides);
    // Drop size-1 dims (keep at least one dim of each class present).
    auto drop = [&](size_t d) {
      k.sizes.erase(k.sizes.begin() + static_cast<long>(d));
      for (auto* a : accesses) a->erase(a->begin() + static_cast<long>(d));
    };
    const size_t outer = k.sizes.size() - static_cast<size_t>(k.num_reduce_dims);
    size_t n_outer = outer, n_red = static_cast<size_t>(k.num_reduce_dims);
    for (size_t d = k.sizes.size(); d-- > 0;) {
      const bool red = d >= n_outer;
      if (k.sizes[d] != 1) continue;
      if (red && n_red == 1) continue;
      drop(d);
      if (red) --n_red; else --n_outer;
    }
    k.num_reduce_dims = static_cast<int>(n_red);
    for (size_t d = 0; d + 1 < k.sizes.size();) {
      const bool same_class = (d + 1 < n_outer) || (d >= n_outer);
      bool ok = same_class;
      for (auto* a : accesses) ok = ok && (*a)[d] == (*a)[d + 1] * k.sizes[d + 1];
      if (!ok) {
        ++d;
        continue;
      }
      k.sizes[d + 1] *= k.sizes[d];
      k.sizes.erase(k.sizes.begin() + static_cast<long>(d));
      for (auto* a : accesses) a->erase(a->begin() + static_cast<long>(d));
      if (d < n_outer) --n_outer; else --n_red;
    }
    k.num_reduce_dims = static_cast<int>(n_red);
  }

  // Note [Repeated gradient outputs]
  // A backward graph often returns one value as the gradient of several inputs (coscos:
  // d(a+b+c+d) is the same tensor for a, b, c and d, as in the seed's min-cut graph).
  // autograd then accumulates each into a .grad by cloning it (only one can be stolen),
  // which reads and writes the whole tensor again per extra input and allocates fresh
  // pages each step. A fused kernel writes such a value into one buffer per Grad
  // occurrence instead, from registers: each .grad steals its own buffer, and the output
  // slots are reused next step. Forward (User) outputs keep their aliasing.
  int grad_occurrences(ir::ValueId v) const {
    const ir::Node* out = g_.output_node();
    if (!out) return 0;
    int n = 0;
    for (size_t i = 0; i < out->args.size(); ++i) {
      if (i < out->output_kinds.size() && out->output_kinds[i] == ir::OutputKind::Grad &&
          out->args[i].values.at(0) == v) {
        ++n;
      }
    }
    return n;
  }

  // The group's nodes as a standalone graph (FusedGroup::fallback).
  ir::Graph subgraph(const FusedGroup& fg) const {
    std::vector<ir::InputKind> kinds(fg.inputs.size(), ir::InputKind::UserInput);
    std::vector<std::string> names, out_names;
    for (ir::ValueId v : fg.inputs) names.push_back("%" + std::to_string(v));
    for (ir::ValueId v : fg.outputs) out_names.push_back("%" + std::to_string(v));
    return ir::extract_subgraph(g_, fg.nodes, fg.inputs, kinds, names, fg.outputs, out_names,
                                std::vector<ir::OutputKind>(fg.outputs.size(), ir::OutputKind::User));
  }

  // --- rewrite ---------------------------------------------------------------------
  FusionResult rewrite() {
    // Units: a kept group or a single node. Dependencies: dataflow, plus program order
    // among the node units (mutations and RNG keep their order) and every group formed
    // before a mutation ordered before it (Note [Fusion groups]).
    struct Unit {
      int group = -1;        // index into fused_ or -1
      ir::NodeId node = -1;  // single node
      ir::NodeId key = 0;    // position for tie-breaking: last member
    };
    std::vector<Unit> units;
    std::vector<int> unit_of_node(g_.nodes().size(), -1);
    for (const auto& n : g_.nodes()) {
      const int gid = group_of_node_[static_cast<size_t>(n.id)];
      if (dead_groups_.count(gid)) continue;  // unit_of_node stays -1
      auto kit = gid >= 0 ? kept_.find(gid) : kept_.end();
      if (kit != kept_.end()) {
        const int u = unit_index_of_group(units, static_cast<int>(kit->second));
        unit_of_node[static_cast<size_t>(n.id)] = u;
        units[static_cast<size_t>(u)].key = n.id;
      } else {
        Unit u;
        u.node = n.id;
        u.key = n.id;
        units.push_back(u);
        unit_of_node[static_cast<size_t>(n.id)] = static_cast<int>(units.size() - 1);
      }
    }
    // Barriers (mutations, hook calls, the output) run after every unit before them and
    // before every unit after them: a view read before an in-place write stays before it.
    // Other effects (RNG, host reads) keep their order among themselves.
    std::vector<std::set<int>> preds(units.size());
    int prev_effect_unit = -1;
    int last_barrier = -1;
    std::vector<int> seen_units;
    for (const auto& n : g_.nodes()) {
      const int u = unit_of_node[static_cast<size_t>(n.id)];
      if (u < 0) continue;  // a dropped group's node
      auto& pu = preds[static_cast<size_t>(u)];
      ir::for_each_value(n.args, [&](ir::ValueId v) {
        const auto p = g_.value(v).producer;
        if (p >= 0 && unit_of_node[static_cast<size_t>(p)] >= 0) pu.insert(unit_of_node[static_cast<size_t>(p)]);
      });
      const bool barrier = n.kind == ir::NodeKind::CallHook || n.kind == ir::NodeKind::Output ||
                           (n.kind == ir::NodeKind::Call && is_mutation(g_, n));
      if (barrier) {
        pu.insert(seen_units.begin(), seen_units.end());
        last_barrier = u;
      } else if (last_barrier >= 0) {
        pu.insert(last_barrier);
      }
      if (units[static_cast<size_t>(u)].group < 0 && is_effect(g_, n)) {
        if (prev_effect_unit >= 0) pu.insert(prev_effect_unit);
        prev_effect_unit = u;
      }
      seen_units.push_back(u);
    }
    // Kahn, smallest key first.
    std::vector<int> indeg(units.size(), 0);
    std::vector<std::vector<int>> succ(units.size());
    for (size_t u = 0; u < units.size(); ++u) {
      preds[u].erase(static_cast<int>(u));
      for (int p : preds[u]) {
        succ[static_cast<size_t>(p)].push_back(static_cast<int>(u));
        ++indeg[u];
      }
    }
    using Item = std::pair<ir::NodeId, int>;
    std::priority_queue<Item, std::vector<Item>, std::greater<Item>> ready;
    for (size_t u = 0; u < units.size(); ++u) {
      if (indeg[u] == 0) ready.push({units[u].key, static_cast<int>(u)});
    }
    FusionResult res;
    ir::Graph& out = res.graph;
    for (const auto& h : g_.hooks()) out.add_hook(h.kind, h.autograd_node, h.slot);
    std::unordered_map<ir::ValueId, ir::ValueId> remap;
    size_t emitted = 0;
    while (!ready.empty()) {
      const int u = ready.top().second;
      ready.pop();
      ++emitted;
      const Unit& unit = units[static_cast<size_t>(u)];
      if (unit.group >= 0) {
        emit_group(fused_[static_cast<size_t>(unit.group)], out, remap);
      } else {
        const ir::Node& n = g_.node(unit.node);
        if (n.kind == ir::NodeKind::Input) {
          remap[n.outputs.at(0).values.at(0)] = out.add_input(n.input_kind, n.name, g_.value(n.outputs[0].values[0]).meta);
        } else if (n.kind == ir::NodeKind::Output) {
          std::vector<ir::ValueId> vs;
          std::map<ir::ValueId, size_t> used;  // Grad occurrences of a value so far
          for (size_t i = 0; i < n.args.size(); ++i) {
            const ir::ValueId v = n.args[i].values.at(0);
            ir::ValueId nv = remap.at(v);
            auto copies = extra_outputs_.find(v);
            const bool grad = i < n.output_kinds.size() && n.output_kinds[i] == ir::OutputKind::Grad;
            if (grad && copies != extra_outputs_.end()) {
              const size_t k = used[v]++;
              if (k > 0 && k - 1 < copies->second.size()) nv = copies->second[k - 1];
            }
            vs.push_back(nv);
          }
          out.set_outputs(vs, n.output_names, n.output_kinds);
        } else {
          ir::copy_node(g_, n, out, remap);
        }
      }
      for (int s : succ[static_cast<size_t>(u)]) {
        if (--indeg[static_cast<size_t>(s)] == 0) ready.push({units[static_cast<size_t>(s)].key, s});
      }
    }
    if (emitted != units.size()) {
      // A bug in the cycle checks: never run a misordered graph. Leave it unfused.
      FusionResult plain;
      plain.graph = g_;
      plain.decisions = std::move(decisions_);
      plain.decisions.push_back("internal error: the fused graph would have a cycle; the graph runs unfused");
      TCAP_LOG(GraphBreaks, "tcap fusion: internal error: the fused graph would have a cycle; running unfused");
      return plain;
    }
    out.schemas() = g_.schemas();
    if (!fused_.empty()) out.schemas()[kFusedOp] = kFusedSchema;
    out.meta() = g_.meta();
    ir::verify(out);
    res.groups = std::move(fused_);
    res.decisions = std::move(decisions_);
    return res;
  }

  template <class Units>
  int unit_index_of_group(Units& units, int fused_index) {
    auto it = unit_of_group_.find(fused_index);
    if (it != unit_of_group_.end()) return it->second;
    typename Units::value_type u;
    u.group = fused_index;
    units.push_back(u);
    const int idx = static_cast<int>(units.size() - 1);
    unit_of_group_[fused_index] = idx;
    return idx;
  }

  void emit_group(const FusedGroup& fg, ir::Graph& out, std::unordered_map<ir::ValueId, ir::ValueId>& remap) {
    ir::Node n;
    n.kind = ir::NodeKind::Call;
    n.op = kFusedOp;
    n.overload = "";
    const ir::Node& first = g_.node(fg.nodes.front());
    n.phase = first.phase;
    n.grad_mode = first.grad_mode;
    n.autograd_node = first.autograd_node;
    std::vector<ir::ValueId> ins;
    for (ir::ValueId v : fg.inputs) ins.push_back(remap.at(v));
    n.args.push_back(ir::Arg::value_list(ins, false, "inputs"));
    n.args.push_back(ir::Arg::integer(fg.kernel_id, "kernel"));
    const ir::NodeId id = static_cast<ir::NodeId>(out.nodes().size());
    std::vector<ir::ValueId> outs;
    for (size_t i = 0; i < fg.outputs.size(); ++i) {
      const ir::ValueId nv = out.new_value(id, 0, static_cast<int>(i), fg.output_metas[i]);
      if (i > 0 && fg.outputs[i] == fg.outputs[i - 1]) {
        extra_outputs_[fg.outputs[i]].push_back(nv);  // Note [Repeated gradient outputs]
      } else {
        remap[fg.outputs[i]] = nv;
      }
      outs.push_back(nv);
    }
    n.outputs.push_back(ir::Arg::value_list(outs, false));
    out.add_node(std::move(n));
  }

  const ir::Graph& g_;
  const FusionOptions& opts_;
  std::vector<Group> groups_;
  std::vector<int> group_of_node_;
  std::vector<int> group_of_value_;
  std::vector<Space> space_of_value_;
  std::map<ir::NodeId, Space> node_space_;
  std::map<ir::NodeId, OpClass> node_class_;
  std::map<ir::ValueId, std::vector<ir::ValueId>> extra_outputs_;  // Note [Repeated gradient outputs]
  std::vector<ir::NodeId> prev_effect_;  // per node: the previous effect node if it is one
  std::vector<std::string> decisions_;
  std::vector<FusedGroup> fused_;
  std::map<int, size_t> kept_;         // group id -> index in fused_
  std::set<int> dead_groups_;          // groups whose results nobody reads: dropped
  std::map<int, int> unit_of_group_;   // index in fused_ -> unit
};

}  // namespace

std::string FusionResult::explain() const {
  std::ostringstream os;
  for (const auto& g : groups) {
    os << g.name << " (kernel " << g.kernel_id << "): " << g.nodes.size() << " ops [";
    for (size_t i = 0; i < g.nodes.size(); ++i) os << (i ? ", %" : "%") << g.nodes[i];
    os << "] reads " << g.inputs.size() << ", writes " << g.outputs.size() << ", domain [";
    for (size_t i = 0; i < g.kernel.sizes.size(); ++i) os << (i ? ", " : "") << g.kernel.sizes[i];
    os << "] reduce " << g.kernel.num_reduce_dims << "\n";
  }
  for (const auto& d : decisions) os << "  " << d << "\n";
  return os.str();
}

FusionResult fuse(const ir::Graph& g, const FusionOptions& options) {
  TORCH_CHECK(options.compile, "tcap::fuse::fuse: FusionOptions::compile is required");
  Decomposed d = decompose_for_fusion(g, options.device);
  if (d.count == 0) {
    FusionResult res = Fuser(g, options).run();
    res.decisions.insert(res.decisions.begin(), d.decisions.begin(), d.decisions.end());
    return res;
  }
  FusionResult res = Fuser(d.graph, options).run();
  d.decisions.push_back("(the ids above are the input graph's; groups and the lines below number the nodes after " +
                        std::to_string(d.count) + " decomposition" + (d.count > 1 ? "s" : "") + ")");
  res.decisions.insert(res.decisions.begin(), d.decisions.begin(), d.decisions.end());
  return res;
}

}  // namespace tcap::fuse
