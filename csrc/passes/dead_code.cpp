// Dead-code elimination (tcap::eliminate_dead_code, include/tcap/partition.h): keeps the
// nodes the Output node depends on, the nodes that write into a graph input (an
// in-place update of a parameter or buffer is an effect even when nothing reads it) and
// opaque hook calls.
#include <tcap/partition.h>

#include "ir/op_facts.h"
#include "passes/keep_nodes.h"

#include <algorithm>
#include <unordered_set>

namespace tcap {

ir::Graph eliminate_dead_code(const ir::Graph& g) {
  auto root_is_input = [&](ir::ValueId v) { return ir::input_aliased_by(g, v) != nullptr; };
  std::unordered_set<ir::ValueId> needed;
  for (ir::ValueId v : g.output_values()) needed.insert(v);
  std::vector<ir::NodeId> keep;
  for (auto it = g.nodes().rbegin(); it != g.nodes().rend(); ++it) {
    const ir::Node& n = *it;
    if (n.kind != ir::NodeKind::Call && n.kind != ir::NodeKind::CallHook) continue;
    // An opaque hook call has effects of its own (Note [Opaque hooks]).
    bool live = n.kind == ir::NodeKind::CallHook && g.hooks().at(static_cast<size_t>(n.hook)).slot >= 0;
    ir::for_each_value(n.outputs, [&](ir::ValueId v) {
      live = live || needed.count(v) || (g.value(v).version_of != ir::kNoValue && root_is_input(v));
    });
    if (!live) continue;
    keep.push_back(n.id);
    ir::for_each_value(n.args, [&](ir::ValueId v) { needed.insert(v); });
  }
  std::reverse(keep.begin(), keep.end());
  return passes::keep_nodes(g, keep);
}

}  // namespace tcap
