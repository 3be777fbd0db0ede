// Guards on the values a function read on the host (HostReads, cache/guards.h): checked
// inline by the replay, or before it by a guard graph.
#include "cache/guards.h"

#include "ir/op_facts.h"
#include "passes/host_graph.h"

#include <algorithm>

namespace tcap::cache {

bool has_host_reads(const ir::Graph& g) {
  return std::any_of(g.nodes().begin(), g.nodes().end(), [&](const ir::Node& n) { return ir::reads_on_host(g, n); });
}

void HostReads::set_inline(const ir::Graph& g) {
  *this = HostReads();
  for (const auto& n : g.nodes()) {
    if (n.kind != ir::NodeKind::Call) continue;
    const std::string where = n.qualified_op() + " (node %" + std::to_string(n.id) + ")";
    for (const auto& a : n.outputs) {
      if (!ir::is_host_value(a)) continue;
      what_.push_back(where);
    }
    // Note [Sizes that come from values]: checked by the interpreter, as it runs n.
    if (ir::sizes_from_values(g, n)) sizes_of_.push_back(where);
  }
  if (!empty()) mode_ = Mode::Inline;
}

void HostReads::build_precheck(const ir::Graph& g) {
  *this = HostReads();
  passes::HostGraph h = passes::host_read_graph(g);
  if (h.reads.empty() && h.sizes_read.empty()) return;
  for (const auto& r : h.reads) what_.push_back(r.what);
  sizes_of_ = h.sizes_read;
  graph_ = std::make_shared<Interpreter>(h.graph);
  graph_->keep_values(false);
  // The guard graph's interpreter compares each value read on the host, and the sizes that
  // come from values (Note [Sizes that come from values]), as it runs.
  graph_->check_host_values(true);
  // A read after a training batch norm (MultiheadAttention's equal() after a BatchNorm):
  // the guard graph runs the batch norm too, and must not update the running statistics
  // a second time (Note [Writes a schema does not show]).
  copied_ = ir::hidden_written_inputs(h.graph);
  mode_ = Mode::PreCheck;
}

std::string HostReads::check(const std::vector<at::Tensor>& primals) const {
  if (mode_ != Mode::PreCheck) return "";
  try {
    if (copied_.empty()) {
      graph_->run(primals);
    } else {
      std::vector<at::Tensor> ins = primals;
      for (size_t j : copied_) {
        if (j < ins.size() && ins[j].defined()) ins[j] = ins[j].detach().clone();
      }
      graph_->run(ins);
    }
  } catch (const HostValueChanged& e) {
    return e.what_without_backtrace();
  }
  return "";
}

std::string host_reads_keep_static(const Guards& a, const Guards& b) {
  using Mode = HostReads::Mode;
  if ((!a.host.empty() && a.host.mode() != Mode::Inline) || (!b.host.empty() && b.host.mode() != Mode::Inline)) {
    return "values are read on the host after a write into the inputs (their guard runs at one size)";
  }
  return "";
}

}  // namespace tcap::cache
