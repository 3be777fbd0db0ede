#include "fuse/horizontal.h"

#include "fuse/fusion.h"
#include "fuse/rewriter.h"
#include "ir/graph_copy.h"
#include "ir/op_facts.h"

#include <algorithm>
#include <set>
#include <sstream>
#include <unordered_map>

namespace tcap::fuse {

// Note [Horizontal kernels]
// An optimizer step updates its parameters one at a time: once fused (Note [In-place
// updates as kernels]), a step over P parameters is P kernels in a row, each a launch
// (interpreter, guards, a parallel region) that for a small parameter costs more than
// its arithmetic. Inductor fuses such independent loops horizontally (its foreach and
// combo kernels); so does this pass, after fusion, for the llvm backend: each run of
// tcap::fused nodes that follow each other in the graph and are independent becomes one
// tcap::fused_horizontal node at the run's last position. Independent: no kernel of a
// run reads or writes memory another kernel of the run writes or makes, by the alias
// roots of the graph (a write into a view is a write into its base), and no kernel
// writes an input that shares its storage with another input (Note [Inputs that share
// storage]: the IR does not link those); and a run keeps to one phase and grad mode
// (the node it becomes carries one of each). Nodes keep their order with every other node,
// since a run holds only adjacent kernels; so the results are the kernels' own, bit for
// bit, whatever order they run in.
// At run time (runtime/fused_kernel.cpp) the kernels that may run their generated code
// share one parallel region, their iterations split over the threads in proportion to
// their work; a kernel whose inputs differ from its recorded ones, whose code is not
// ready, or that needs more than one launch (a split reduction) runs as a tcap::fused
// call of its own, as before.

namespace {

struct Member {
  std::set<ir::ValueId> reads;   // alias roots of its inputs
  std::set<ir::ValueId> writes;  // alias roots of the inputs it writes (results that are versions)
  std::set<ir::ValueId> makes;   // its fresh results
};

bool is_fused(const ir::Node& n) {
  return n.kind == ir::NodeKind::Call && n.op == kFusedOp && n.args.size() == 2 &&
         n.args[0].kind == ir::ArgKind::ValueList && n.args[1].kind == ir::ArgKind::Int && n.outputs.size() == 1 &&
         n.outputs[0].kind == ir::ArgKind::ValueList;
}

bool intersects(const std::set<ir::ValueId>& a, const std::set<ir::ValueId>& b) {
  return std::any_of(a.begin(), a.end(), [&](ir::ValueId v) { return b.count(v) > 0; });
}

class Horizontal {
 public:
  explicit Horizontal(const ir::Graph& g) : g_(g) {
    auto it = g.meta().find(ir::kInputsShareStorage);
    if (it != g.meta().end()) shared_ = it->second;
  }

  HorizontalResult run() {
    HorizontalResult res;
    // First, whether any run exists (else the caller keeps its graph).
    std::vector<std::vector<ir::NodeId>> runs;
    std::vector<ir::NodeId> current;
    Member acc;
    auto close = [&] {
      if (current.size() >= 2) runs.push_back(current);
      current.clear();
      acc = Member();
    };
    for (const auto& n : g_.nodes()) {
      std::string why;
      if (!is_fused(n)) {
        close();
        continue;
      }
      Member m;
      if (!member(n, &m, &why)) {
        if (!current.empty()) res.decisions.push_back(name(n) + " joins no run: " + why);
        close();
        continue;
      }
      if (!current.empty()) {
        const ir::Node& head = g_.node(current.front());
        if (head.phase != n.phase || head.grad_mode != n.grad_mode) {
          why = "it runs in another phase or grad mode";
        } else if (intersects(m.reads, acc.writes) || intersects(m.reads, acc.makes)) {
          why = "it reads what the run before it writes";
        } else if (intersects(m.writes, acc.reads) || intersects(m.writes, acc.writes)) {
          why = "it writes what the run before it reads";
        }
        if (!why.empty()) {
          res.decisions.push_back(name(n) + " starts a run of its own: " + why);
          close();
        }
      }
      current.push_back(n.id);
      acc.reads.insert(m.reads.begin(), m.reads.end());
      acc.writes.insert(m.writes.begin(), m.writes.end());
      acc.makes.insert(m.makes.begin(), m.makes.end());
    }
    close();
    if (runs.empty()) return res;

    std::unordered_map<ir::NodeId, size_t> last_of_run;  // a run's last node -> the run
    std::set<ir::NodeId> in_run;
    for (size_t r = 0; r < runs.size(); ++r) {
      last_of_run[runs[r].back()] = r;
      in_run.insert(runs[r].begin(), runs[r].end());
    }
    ir::Graph out;
    std::unordered_map<ir::ValueId, ir::ValueId> map;
    ir::copy_hooks(g_, out);
    for (const auto& n : g_.nodes()) {
      if (ir::copy_boundary(g_, n, out, map)) continue;
      if (!in_run.count(n.id)) {
        ir::copy_node(g_, n, out, map);
      } else if (auto it = last_of_run.find(n.id); it != last_of_run.end()) {
        emit(runs[it->second], out, map);
        ++res.runs;
        res.kernels += static_cast<int>(runs[it->second].size());
        std::ostringstream s;
        s << "one launch for " << runs[it->second].size() << " independent kernels:";
        for (ir::NodeId id : runs[it->second]) s << " " << name(g_.node(id));
        res.decisions.push_back(s.str());
      }
      // (a run's other nodes: emitted with its last one; nothing between them reads them)
    }
    out.schemas()[kHorizontalOp] = kHorizontalSchema;
    ir::finish_copy(g_, out);
    res.graph = std::move(out);
    return res;
  }

 private:
  static std::string name(const ir::Node& n) {
    return "%" + std::to_string(n.id) + " (kernel " + std::to_string(n.args[1].i) + ")";
  }

  bool member(const ir::Node& n, Member* m, std::string* why) const {
    for (ir::ValueId v : n.args[0].values) {
      if (v == ir::kNoValue) {
        *why = "an absent input";
        return false;
      }
      m->reads.insert(g_.alias_root(v));
    }
    for (ir::ValueId v : n.outputs[0].values) {
      const ir::Value& val = g_.value(v);
      if (!val.meta.device.is_cpu()) {
        *why = "not on the CPU";
        return false;
      }
      if (val.view_of != ir::kNoValue) {
        *why = "a result that views another tensor";
        return false;
      }
      if (val.version_of == ir::kNoValue) {
        m->makes.insert(v);
        continue;
      }
      const ir::ValueId root = g_.alias_root(v);
      const ir::Node& p = g_.node(g_.value(root).producer);
      if (p.kind == ir::NodeKind::Input && !shared_.empty() && ir::lists_input(shared_, p.name)) {
        *why = "it writes input '" + p.name + "', which shares its storage with another input";
        return false;
      }
      m->writes.insert(root);
    }
    return true;
  }

  // The run's kernels as one node, through copy_node (which maps the arguments and makes
  // the results, versions included); results then numbered in the node's one list.
  void emit(const std::vector<ir::NodeId>& run, ir::Graph& out, std::unordered_map<ir::ValueId, ir::ValueId>& map) {
    const ir::Node& first = g_.node(run.front());
    ir::Node n;
    n.kind = ir::NodeKind::Call;
    n.op = kHorizontalOp;
    n.phase = first.phase;
    n.grad_mode = first.grad_mode;
    n.autograd_node = first.autograd_node;
    std::vector<ir::ValueId> ins, outs;
    std::vector<int64_t> kernels, arity;
    for (ir::NodeId id : run) {
      const ir::Node& k = g_.node(id);
      ins.insert(ins.end(), k.args[0].values.begin(), k.args[0].values.end());
      outs.insert(outs.end(), k.outputs[0].values.begin(), k.outputs[0].values.end());
      kernels.push_back(k.args[1].i);
      arity.push_back(static_cast<int64_t>(k.args[0].values.size()));
    }
    n.args.push_back(ir::Arg::value_list(ins, false, "inputs"));
    n.args.push_back(int_list_arg(std::move(kernels), "kernels"));
    n.args.push_back(int_list_arg(std::move(arity), "arity"));
    n.outputs.push_back(ir::Arg::value_list(outs, false));
    const ir::NodeId id = ir::copy_node(g_, n, out, map);
    const auto& made = out.node(id).outputs[0].values;
    for (size_t i = 0; i < made.size(); ++i) {
      out.value(made[i]).output_index = 0;
      out.value(made[i]).list_index = static_cast<int>(i);
    }
  }

  const ir::Graph& g_;
  std::string shared_;
};

}  // namespace

HorizontalResult horizontal_kernels(const ir::Graph& g) { return Horizontal(g).run(); }

}  // namespace tcap::fuse
