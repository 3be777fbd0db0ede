#include "passes/max_flow.h"

#include <algorithm>
#include <queue>

namespace tcap::passes {

MaxFlow::MaxFlow(int num_nodes) : adj_(static_cast<size_t>(num_nodes)) {}

void MaxFlow::add_edge(int from, int to, int64_t capacity) {
  adj_[static_cast<size_t>(from)].push_back(static_cast<int>(edges_.size()));
  edges_.push_back({to, capacity});
  adj_[static_cast<size_t>(to)].push_back(static_cast<int>(edges_.size()));
  edges_.push_back({from, 0});
}

int64_t MaxFlow::run(int s, int t) {
  int64_t flow = 0;
  while (bfs(s, t)) {
    it_.assign(adj_.size(), 0);
    while (int64_t f = dfs(s, t, kInf)) flow += f;
  }
  return flow;
}

std::vector<bool> MaxFlow::reachable(int s) const {
  std::vector<bool> seen(adj_.size(), false);
  std::vector<int> todo{s};
  seen[static_cast<size_t>(s)] = true;
  while (!todo.empty()) {
    const int u = todo.back();
    todo.pop_back();
    for (int e : adj_[static_cast<size_t>(u)]) {
      const auto& ed = edges_[static_cast<size_t>(e)];
      if (ed.cap > 0 && !seen[static_cast<size_t>(ed.to)]) {
        seen[static_cast<size_t>(ed.to)] = true;
        todo.push_back(ed.to);
      }
    }
  }
  return seen;
}

bool MaxFlow::bfs(int s, int t) {
  level_.assign(adj_.size(), -1);
  std::queue<int> q;
  level_[static_cast<size_t>(s)] = 0;
  q.push(s);
  while (!q.empty()) {
    const int u = q.front();
    q.pop();
    for (int e : adj_[static_cast<size_t>(u)]) {
      const auto& ed = edges_[static_cast<size_t>(e)];
      if (ed.cap > 0 && level_[static_cast<size_t>(ed.to)] < 0) {
        level_[static_cast<size_t>(ed.to)] = level_[static_cast<size_t>(u)] + 1;
        q.push(ed.to);
      }
    }
  }
  return level_[static_cast<size_t>(t)] >= 0;
}

int64_t MaxFlow::dfs(int u, int t, int64_t f) {
  if (u == t) return f;
  for (size_t& i = it_[static_cast<size_t>(u)]; i < adj_[static_cast<size_t>(u)].size(); ++i) {
    const int e = adj_[static_cast<size_t>(u)][i];
    auto& ed = edges_[static_cast<size_t>(e)];
    if (ed.cap <= 0 || level_[static_cast<size_t>(ed.to)] != level_[static_cast<size_t>(u)] + 1) continue;
    if (int64_t d = dfs(ed.to, t, std::min(f, ed.cap))) {
      ed.cap -= d;
      edges_[static_cast<size_t>(e ^ 1)].cap += d;
      return d;
    }
  }
  return 0;
}

}  // namespace tcap::passes
