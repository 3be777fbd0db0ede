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
// missing or mistyped fields, unknown enum names, dangling value ids, an input over the
// limits. what() is one line that names the problem and where it is (e.g.
// "nodes[3].args[1].kind"), at most 512 bytes, with control characters and invalid UTF-8
// escaped (\xNN): safe to print to a terminal.
class GraphFormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Limits of the reader (docs/graph-json.md, "Limits"). Reading never takes memory out of
// proportion to the input: past a limit it throws GraphFormatError before parsing.
struct JsonReadOptions {
  // The largest input read, in bytes. 0: the default, TCAP_MAX_GRAPH_MB mebibytes
  // (csrc/support/logging.h), 64 MiB when that is not set.
  size_t max_bytes = 0;
};

// The default JsonReadOptions::max_bytes (TCAP_MAX_GRAPH_MB, read once).
size_t default_max_graph_bytes();

std::string to_json_string(const Graph& g, int indent = 1);
// Throws GraphFormatError; the result passes verify().
Graph from_json_string(const std::string& text, const JsonReadOptions& options = {});
void save_json(const Graph& g, const std::string& path);   // throws std::runtime_error on I/O failure
// Throws GraphFormatError, also for a missing file and for one that is not a regular file
// (a directory, a FIFO, a device): those are refused before anything is read.
Graph load_json(const std::string& path, const JsonReadOptions& options = {});

}  // namespace tcap::ir
