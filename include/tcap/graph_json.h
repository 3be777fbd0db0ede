// Versioned JSON for tcap graphs: {"format": "tcap.graph", "version": 1, ...}.
// The schema is documented in docs/graph-json.md; golden files live in test/golden/.
#pragma once

#include <tcap/graph.h>

#include <stdexcept>
#include <string>

namespace tcap::ir {

constexpr const char* kGraphFormat = "tcap.graph";
constexpr int kGraphFormatVersion = 1;

// Thrown for any malformed input: bad JSON syntax, wrong format tag, unknown version,
// missing or mistyped fields, unknown enum names, dangling value ids. what() is one
// line that names the problem and where it is (e.g. "nodes[3].args[1].kind").
class GraphFormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string to_json_string(const Graph& g, int indent = 1);
Graph from_json_string(const std::string& text);  // throws GraphFormatError; the result passes verify()
void save_json(const Graph& g, const std::string& path);   // throws std::runtime_error on I/O failure
Graph load_json(const std::string& path);                  // throws GraphFormatError (also for a missing file)

}  // namespace tcap::ir
