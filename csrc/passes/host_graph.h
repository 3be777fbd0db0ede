// The host-read guard graph: the part of a forward graph that computes the values the
// function read on the host (item(), equal(), is_nonzero(): non-tensor results of Call
// nodes) and the results whose sizes come from values (ir::sizes_from_values), so that a
// guard can recompute them from a later call's inputs and compare (cache::HostReads).
//
// Precondition: g verifies. Postcondition: `graph` has g's inputs and no outputs, holds
// the host reads and their ancestors in g's order, and none of them writes in place or
// draws random numbers (else host_read_graph throws c10::Error naming the op: such a
// value cannot be recomputed without changing the program's state).
#pragma once

#include <tcap/graph.h>

#include <string>
#include <vector>

namespace tcap::passes {

struct HostGraph {
  struct Read {
    ir::Arg value;     // the value recorded
    std::string what;  // "aten::equal (node %12)"
  };
  ir::Graph graph;
  std::vector<Read> reads;  // in the order the interpreter reports host values
  // Ops whose results' sizes come from values (Note [Sizes that come from values],
  // ir/op_facts.h), "aten::nonzero (node %4)": an interpreter of `graph` with
  // check_host_values checks them.
  std::vector<std::string> sizes_read;
};

HostGraph host_read_graph(const ir::Graph& g);

}  // namespace tcap::passes

namespace tcap::passes {

// The Call nodes of g that read something on the host (ir::reads_on_host), in order.
std::vector<ir::NodeId> host_read_nodes(const ir::Graph& g);

// Whether every host read of g comes before every node that writes into one of g's inputs
// (in place, or as a training batch norm writes its running statistics), or runs a
// collective (ir::OpFact::Collective).
// Then a replay that stops at a read whose value changed (Interpreter::check_host_values)
// has changed nothing its caller can see, and the call can run another way instead.
bool host_reads_precede_input_writes(const ir::Graph& g);

// Whether ga and gb are the same graph but for the values some of their nodes read on the
// host; `nodes` receives those nodes (empty when the graphs are equal).
bool same_but_host_values(const ir::Graph& ga, const ir::Graph& gb, std::vector<ir::NodeId>* nodes);

// g with the values `nodes` read on the host forgotten (their results become None): values
// read only for the host's own use (a logged loss, the norm clip_grad_norm_ returns) are
// observations, not guards. The reads still run (node ids stay as they are); nothing in
// the graph reads their results. Each node must be a Call whose results are host values.
ir::Graph forget_host_reads(const ir::Graph& g, const std::vector<ir::NodeId>& nodes);

}  // namespace tcap::passes
