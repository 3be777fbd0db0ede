#include "fuse/fusion.h"

#include "fuse/decompose.h"
#include "fuse/group_kernel.h"
#include "fuse/groups.h"
#include "ir/graph_copy.h"
#include "support/logging.h"
#include "support/parallel.h"
#include "support/stage_clock.h"

#include <c10/util/strides.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <map>
#include <queue>
#include <set>
#include <sstream>
#include <unordered_map>

namespace tcap::fuse {

namespace {

// Note [Fused output layout]
// A kernel writes its outputs in the layout recorded for them, so results look exactly like
// eager's. A recorded layout that is not dense (overlapping, such as the stride-0 strides
// seen on some gradient accumulations in captured backward graphs) cannot be written
// element by element; such outputs are written contiguously instead.
ir::TensorMeta written_layout(const ir::TensorMeta& m) {
  if (dense_layout(m)) return m;
  ir::TensorMeta c = m;
  const auto strides = c10::contiguous_strides(m.sizes);
  c.strides.assign(strides.begin(), strides.end());
  return c;
}

// Note [Fused results written in place]
// Functionalized updates (Note [In-place updates as kernels], functionalize.cpp) end in
// copy_(buffer, result). Where the kernel that computes `result` also reads `buffer`, it
// can write the result straight into the buffer instead (Inductor's re-inplacing), saving
// a buffer and a read and write of it, when:
//   - the kernel is pointwise (no reduce dims), reads the buffer only at the element it
//     writes (every Load of it has the Store's offset and strides) and only on the way to
//     that Store (each such Load is an operand, transitively, of the stored value), so
//     every read of an element comes before its write whatever order the Stores run in;
//   - the buffer and the result have one layout, and no other input of the kernel shares
//     the buffer's storage;
//   - `result` is not returned, and nothing between the kernel and the copy in the
//     rewritten graph reads the buffer or a view of it (the old value is dead there; the
//     readers of `result` read the buffer's new values, which are `result`'s).
// The copy is then dropped; the kernel's result becomes a new version of the buffer
// (what the copy's result was), and the runtime hands the kernel the buffer as that
// output (runtime/fused_kernel.h). Otherwise the copy stays, which is correct and moves
// the result once more.
namespace {

// Whether output `out` (a buffer index) may share memory with input buffer `in` in kernel k
// (the first condition of the note).
bool writes_where_it_reads(const kir::Kernel& k, int32_t in, int32_t out) {
  if (k.num_reduce_dims != 0) return false;
  const kir::Store* st = nullptr;
  for (const auto& s : k.stores) {
    if (s.buffer != out) continue;
    if (st) return false;
    st = &s;
  }
  if (!st) return false;
  std::vector<bool> feeds(k.instrs.size(), false);  // operands of the stored value
  feeds[static_cast<size_t>(st->value)] = true;
  for (size_t v = k.instrs.size(); v-- > 0;) {
    if (!feeds[v]) continue;
    for (int32_t a : k.instrs[v].args) feeds[static_cast<size_t>(a)] = true;
  }
  bool read = false;
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    const kir::Instr& i = k.instrs[v];
    if (i.op != kir::OpCode::Load || i.buffer != in) continue;
    if (!feeds[v] || i.offset != st->offset || i.strides != st->strides) return false;
    read = true;
  }
  return read;
}

}  // namespace

class Fuser {
 public:
  Fuser(const ir::Graph& g, const FusionOptions& opts) : g_(g), opts_(opts) {}

  // `clock` gets a lap per step (FusionResult::times).
  FusionResult run(StageClock& clock) {
    grouping_ = form_groups(g_, opts_.device, opts_.max_matmul_macs);
    clock.lap("group");
    build_kernels(clock);  // laps lower and kernels
    FusionResult res = rewrite();
    clock.lap("rewrite");
    return res;
  }

 private:
  void decide(const ir::Node& n, const std::string& why) { decisions_.push_back(decision(n, why)); }

  // --- kernels ---------------------------------------------------------------------
  // A lowered group waiting for its kernel (Note [Parallel kernel compilation]).
  struct Pending {
    Group* gr = nullptr;
    FusedGroup fg;
    int64_t id = -1;
    std::string why;
    std::exception_ptr error;  // anything but the -1 the callback returns for a refusal
  };

  void compile_all(std::vector<Pending>& pending) {
    run_on_threads(pending.size(), compile_threads(pending.size(), opts_.compile_threads), [&](size_t i) {
      try {
        pending[i].id = opts_.compile(pending[i].fg, &pending[i].why);
      } catch (...) {
        pending[i].error = std::current_exception();
      }
    });
  }

  void build_kernels(StageClock& clock) {
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
        if (grouping_.view_nodes.count(id)) continue;
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
        fg.kernel = lower_group(g_, grouping_, gr, fg);
        fg.fallback = subgraph(fg);
      } catch (const c10::Error& e) {
        decide(g_.node(gr.nodes[0]), "group " + fg.name + " not compiled: " + e.what_without_backtrace());
        gr.dissolved = true;
        continue;
      } catch (const std::exception& e) {  // a bug in lowering: the group's ops stay ATen calls
        decide(g_.node(gr.nodes[0]), "group " + fg.name + " not compiled (internal error): " + e.what());
        gr.dissolved = true;
        continue;
      }
      Pending p;
      p.gr = &gr;
      p.fg = std::move(fg);
      p.fg.ordinal = static_cast<int64_t>(pending.size());
      pending.push_back(std::move(p));
    }
    clock.lap("lower");
    compile_all(pending);
    clock.lap("kernels");
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
    std::vector<ir::CutInput> ins;
    std::vector<ir::CutOutput> outs;
    for (ir::ValueId v : fg.inputs) {
      ins.push_back({v, ir::is_host_scalar(g_, v) ? ir::InputKind::HostScalar : ir::InputKind::UserInput,
                     "%" + std::to_string(v)});
    }
    for (ir::ValueId v : fg.outputs) outs.push_back({v, "%" + std::to_string(v)});
    return ir::extract_subgraph(g_, fg.nodes, ins, outs);
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
      const bool barrier = n.kind == ir::NodeKind::Output || is_barrier(g_, n);
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
    ir::copy_hooks(g_, out);
    std::unordered_map<ir::ValueId, ir::ValueId> remap;
    size_t emitted = 0;
    while (!ready.empty()) {
      const int u = ready.top().second;
      ready.pop();
      ++emitted;
      const Unit& unit = units[static_cast<size_t>(u)];
      if (unit.group >= 0) {
        emit_group(fused_[static_cast<size_t>(unit.group)], out, remap);
        note_reads(out);
      } else {
        const ir::Node& n = g_.node(unit.node);
        if (write_in_place(n, out, remap)) {
          // Note [Fused results written in place]: the copy is the kernel's own write.
        } else if (n.kind == ir::NodeKind::Input) {
          ir::copy_boundary(g_, n, out, remap);
        } else if (n.kind == ir::NodeKind::Output) {  // Note [Repeated gradient outputs]
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
          note_reads(out);
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
      std::string stuck;  // the groups left waiting: the cycle runs through some of them
      for (size_t u = 0; u < units.size(); ++u) {
        if (indeg[u] > 0 && units[u].group >= 0) stuck += " " + fused_[static_cast<size_t>(units[u].group)].name;
      }
      plain.decisions.push_back("internal error: the fused graph would have a cycle (groups left:" + stuck +
                                "); the graph runs unfused");
      TCAP_LOG(GraphBreaks, "tcap fusion: internal error: the fused graph would have a cycle; running unfused");
      return plain;
    }
    if (!fused_.empty()) out.schemas()[kFusedOp] = kFusedSchema;
    ir::finish_copy(g_, out);
    res.groups = std::move(fused_);
    res.decisions = std::move(decisions_);
    return res;
  }

  // The last node of `out` (so far) that read each alias root.
  void note_reads(const ir::Graph& out) {
    const ir::Node& n = out.nodes().back();
    ir::for_each_value(n.args, [&](ir::ValueId v) { last_reader_[out.alias_root(v)] = n.id; });
  }

  // Note [Fused results written in place]: whether copy node n of g_ became its source
  // kernel's write into the buffer (nothing emitted; n's result maps to the kernel's).
  bool write_in_place(const ir::Node& n, ir::Graph& out, std::unordered_map<ir::ValueId, ir::ValueId>& remap) {
    if (n.kind != ir::NodeKind::Call || n.op != "aten::copy_" || !n.overload.empty() || n.args.size() < 2 ||
        n.args[0].kind != ir::ArgKind::Value || n.args[1].kind != ir::ArgKind::Value ||
        n.outputs.size() != 1 || n.outputs[0].kind != ir::ArgKind::Value) {
      return false;
    }
    const ir::ValueId dst = n.args[0].values[0], src = n.args[1].values[0];
    const int gid = group_of_value_[static_cast<size_t>(src)];
    auto kit = gid >= 0 ? kept_.find(gid) : kept_.end();
    if (kit == kept_.end() || extra_outputs_.count(src)) return false;
    FusedGroup& fg = fused_[kit->second];
    // src is not returned (the Output node reads the copy's result, the caller's tensor).
    // Its other readers read the buffer once the kernel writes there: the same values.
    const ir::Node* output = g_.output_node();
    for (ir::NodeId u : g_.users(src)) {
      if (output && u == output->id) return false;
    }
    const auto i_it = std::find(fg.outputs.begin(), fg.outputs.end(), src);
    const auto j_it = std::find(fg.inputs.begin(), fg.inputs.end(), dst);
    if (i_it == fg.outputs.end() || j_it == fg.inputs.end()) return false;
    const auto i = static_cast<size_t>(i_it - fg.outputs.begin());
    const auto j = static_cast<size_t>(j_it - fg.inputs.begin());
    const ir::ValueId root = g_.alias_root(dst);
    for (size_t k = 0; k < fg.inputs.size(); ++k) {
      if (k != j && g_.alias_root(fg.inputs[k]) == root) return false;
    }
    const ir::TensorMeta &im = fg.input_metas[j], &om = fg.output_metas[i];
    if (im.dtype != om.dtype || im.sizes != om.sizes || im.strides != om.strides || im.device != om.device ||
        !dense_layout(om)) {
      return false;
    }
    if (!writes_where_it_reads(fg.kernel, static_cast<int32_t>(j), static_cast<int32_t>(fg.inputs.size() + i))) {
      return false;
    }
    // Nothing after the kernel read the buffer: its last reader is the kernel itself.
    const ir::ValueId odst = remap.at(dst), osrc = remap.at(src);
    const ir::NodeId kernel = out.value(osrc).producer;
    auto r = last_reader_.find(out.alias_root(odst));
    if (r == last_reader_.end() || r->second != kernel) return false;
    if (fg.output_into_input.empty()) fg.output_into_input.assign(fg.outputs.size(), -1);
    fg.output_into_input[i] = static_cast<int>(j);
    out.value(osrc).version_of = odst;
    remap[n.outputs[0].values[0]] = osrc;
    last_reader_[out.alias_root(odst)] = kernel;
    decide(n, "written in place by " + fg.name + " (Note [Fused results written in place])");
    return true;
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
  Grouping grouping_;
  std::vector<Group>& groups_ = grouping_.groups;
  std::vector<int>& group_of_node_ = grouping_.group_of_node;
  std::vector<int>& group_of_value_ = grouping_.group_of_value;
  std::map<ir::ValueId, std::vector<ir::ValueId>> extra_outputs_;  // Note [Repeated gradient outputs]
  std::vector<std::string>& decisions_ = grouping_.decisions;
  std::vector<FusedGroup> fused_;
  std::map<int, size_t> kept_;         // group id -> index in fused_
  std::set<int> dead_groups_;          // groups whose results nobody reads: dropped
  std::map<int, int> unit_of_group_;   // index in fused_ -> unit
  std::unordered_map<ir::ValueId, ir::NodeId> last_reader_;  // out's alias roots: their last reader so far
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

int64_t default_max_matmul_macs() {
  // Measured on the CPU (bench/RESULTS.md, "Small matmuls as kernels"): alone, a
  // generated Linear of 32^3 multiply-adds still beats BLAS, but program_transformer's
  // matmuls of 9216-24576 (bmm over 4 or 12 contracted elements, which the renderer does
  // not vectorise) cost it 10%; below 8192 every program measured gains or holds.
  constexpr int64_t kMeasured = 8192;
  const long long env = Config::get().small_matmul_macs;
  return env >= 0 ? static_cast<int64_t>(env) : kMeasured;
}

FusionResult fuse(const ir::Graph& g, const FusionOptions& options) {
  TORCH_CHECK(options.compile, "tcap::fuse::fuse: FusionOptions::compile is required");
  StageClock clock;
  Decomposed d = decompose_for_fusion(g, options.device);
  clock.lap("decompose");
  if (d.count == 0) {
    FusionResult res = Fuser(g, options).run(clock);
    res.times = clock.laps();
    res.decisions.insert(res.decisions.begin(), d.decisions.begin(), d.decisions.end());
    return res;
  }
  FusionResult res = Fuser(d.graph, options).run(clock);
  res.times = clock.laps();
  d.decisions.push_back("(the ids above are the input graph's; groups and the lines below number the nodes after " +
                        std::to_string(d.count) + " decomposition" + (d.count > 1 ? "s" : "") + ")");
  res.decisions.insert(res.decisions.begin(), d.decisions.begin(), d.decisions.end());
  return res;
}

}  // namespace tcap::fuse
