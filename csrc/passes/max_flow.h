// Maximum flow and minimum s-t cut on a small directed graph (Dinic's algorithm), for
// the min-cut partitioner (passes/min_cut.h).
//
// Capacities are int64; kInf marks edges that must never be cut. After run(s, t),
// reachable(s) gives the source side of a minimum cut: the edges from reachable to
// unreachable nodes are the cut.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace tcap::passes {

class MaxFlow {
 public:
  static constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;
  explicit MaxFlow(int num_nodes);
  void add_edge(int from, int to, int64_t capacity);
  // The value of a maximum flow from s to t.
  int64_t run(int s, int t);
  // After run(): per node, whether it is reachable from s in the residual graph.
  std::vector<bool> reachable(int s) const;

 private:
  struct Edge {
    int to;
    int64_t cap;
  };
  bool bfs(int s, int t);
  int64_t dfs(int u, int t, int64_t f);
  std::vector<std::vector<int>> adj_;
  std::vector<Edge> edges_;
  std::vector<int> level_;
  std::vector<size_t> it_;
};

}  // namespace tcap::passes
