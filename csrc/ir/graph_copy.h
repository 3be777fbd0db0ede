// Copying a graph with some of its nodes rewritten: what every rewriting pass does around
// its rewrites (fuse::Rewriter, the horizontal-kernel pass).
#pragma once

#include <tcap/graph.h>

#include <unordered_map>

namespace tcap::ir {

// Copies `from`'s hooks into `to` (their ids kept): the first step of a copy.
void copy_hooks(const Graph& from, Graph& to);

// Copies node n of `from` into `to` if it is an Input node (a new input of `to`, its value
// added to `map`) or the Output node (`to`'s outputs, renamed by `map`); returns false for
// any other node, which the caller copies (copy_node) or rewrites.
bool copy_boundary(const Graph& from, const Node& n, Graph& to, std::unordered_map<ValueId, ValueId>& map);

// The last step of a copy: `from`'s schemas that `to` lacks and its meta, then verifies `to`.
void finish_copy(const Graph& from, Graph& to);

}  // namespace tcap::ir
