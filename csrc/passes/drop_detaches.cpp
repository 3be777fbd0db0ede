// Note: see passes/drop_detaches.h.
#include "passes/drop_detaches.h"

#include "passes/keep_nodes.h"

#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace tcap::passes {

ir::Graph drop_detaches(const ir::Graph& g, int* dropped) {
  if (dropped) *dropped = 0;
  std::vector<int> reads(g.values().size(), 0);
  for (const auto& n : g.nodes()) ir::for_each_value(n.args, [&](ir::ValueId v) { ++reads[static_cast<size_t>(v)]; });
  std::unordered_map<ir::ValueId, ir::ValueId> renames;
  std::unordered_set<ir::NodeId> drop;
  for (const auto& n : g.nodes()) {
    if (n.kind != ir::NodeKind::Call || n.op != "aten::detach" || !n.overload.empty() || n.args.size() != 1 ||
        !n.args[0].is_value() || n.outputs.size() != 1 || !n.outputs[0].is_value()) {
      continue;
    }
    const ir::ValueId x = n.args[0].values[0];
    const ir::ValueId out = n.outputs[0].values[0];
    const ir::ValueId root = g.alias_root(x);
    if (g.node(g.value(root).producer).kind != ir::NodeKind::Call) continue;  // a graph input's alias
    if (reads[static_cast<size_t>(x)] != 1) continue;
    renames.emplace(out, x);  // readers, writers (version_of) and views of out
    drop.insert(n.id);
    if (dropped) ++*dropped;
  }
  if (drop.empty()) return g;
  ir::Graph h = g;
  h.replace_uses(renames);  // one pass: a detach of a dropped detach reads the first one's input
  return drop_nodes(h, drop);
}

}  // namespace tcap::passes
