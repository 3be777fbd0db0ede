// Note: see passes/fold_transposes.h.
#include "passes/fold_transposes.h"

#include "passes/keep_nodes.h"

#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace tcap::passes {
namespace {

bool is_t(const ir::Node& n) {
  return n.kind == ir::NodeKind::Call && n.op == "aten::t" && n.overload.empty() && n.args.size() == 1 &&
         n.args[0].is_value() && n.outputs.size() == 1 && n.outputs[0].is_value();
}

bool same_layout(const ir::TensorMeta& a, const ir::TensorMeta& b) {
  return a.dtype == b.dtype && a.device == b.device && a.sizes == b.sizes && a.strides == b.strides &&
         a.storage_offset == b.storage_offset;
}

}  // namespace

ir::Graph fold_transposes(const ir::Graph& g, int* folded) {
  if (folded) *folded = 0;
  std::vector<int> reads(g.values().size(), 0);
  for (const auto& n : g.nodes()) ir::for_each_value(n.args, [&](ir::ValueId v) { ++reads[static_cast<size_t>(v)]; });
  std::unordered_set<ir::ValueId> written;  // values an in-place or out= op writes a new version of
  for (const auto& v : g.values()) {
    if (v.version_of != ir::kNoValue) written.insert(v.version_of);
  }
  std::unordered_set<ir::ValueId> views_written;  // bases of a view written in place
  for (const auto& v : g.values()) {
    if (v.view_of != ir::kNoValue && written.count(v.id)) views_written.insert(v.view_of);
  }
  std::unordered_map<ir::ValueId, ir::ValueId> renames;
  std::unordered_set<ir::NodeId> drop;
  for (const auto& outer : g.nodes()) {
    if (!is_t(outer)) continue;
    const ir::ValueId x = outer.args[0].values[0];
    const ir::ValueId out = outer.outputs[0].values[0];
    const ir::Node& inner = g.node(g.value(x).producer);
    if (!is_t(inner) || drop.count(inner.id)) continue;
    const ir::ValueId y = inner.args[0].values[0];
    const ir::Value& yv = g.value(y);
    const bool made_here = g.node(yv.producer).kind == ir::NodeKind::Call && yv.view_of == ir::kNoValue;
    if (!made_here || reads[static_cast<size_t>(y)] != 1 || reads[static_cast<size_t>(x)] != 1) continue;
    if (written.count(y) || written.count(x) || written.count(out)) continue;
    if (!same_layout(yv.meta, g.value(out).meta)) continue;
    if (views_written.count(out) || views_written.count(x)) continue;  // a view of the pair written in place
    renames.emplace(out, y);
    drop.insert(inner.id);
    drop.insert(outer.id);
    if (folded) ++*folded;
  }
  if (drop.empty()) return g;
  ir::Graph h = g;
  h.replace_uses(renames);
  return drop_nodes(h, drop);
}

}  // namespace tcap::passes
