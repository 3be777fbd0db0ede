// tcap-inspect: looks at graph JSON files (tcap.graph, see docs/graph-json.md).
//
//   tcap-inspect code|table|dot|svg|summary [-o OUT] FILE.json
//   tcap-inspect diff [-o OUT] A.json B.json
//
// Exit status: 0 success (diff: the graphs are equal), 1 diff found differences,
// 2 bad usage or bad input. Every error is one line on stderr starting with
// "tcap-inspect: "; no input makes the tool crash. Files larger than TCAP_MAX_GRAPH_MB
// (64 MiB by default) and files that are not regular files (FIFOs, devices) are refused.
// Names in a graph are raw input: the output escapes control characters (\xNN), so a
// file cannot send escape sequences to the terminal.
#include <tcap/export.h>
#include <tcap/graph.h>
#include <tcap/graph_json.h>

#include "ir/printable.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace tcap::ir;

constexpr const char* kUsage = R"(usage: tcap-inspect COMMAND [-o OUT] FILE.json|FILE.pt2
       tcap-inspect diff [-o OUT] A.json|A.pt2 B.json|B.pt2

A .pt2 (a torch.export archive, tcap::export_program's or torch.export.save's) is loaded
with tcap::load_program and run once under capture on zeros of its input sizes: the
graph shown is what LibTorch runs for it.

Commands:
  code      readable printout, one line per node (the format of tcap::ir::to_string)
  table     one row per node: opcode | name | target | args | meta
  dot       Graphviz DOT
  svg       the DOT rendered by Graphviz (`dot -Tsvg`)
  summary   counts: inputs by kind and bytes, nodes by phase, top ops, hooks, values
  diff      structural diff of two graphs: inputs added/removed, the first differing
            line, op count changes; exit 0 when equal, 1 when different

Options:
  -o OUT      write the output to OUT instead of stdout
  -h, --help  show this help

Exit status: 0 success, 1 graphs differ (diff), 2 bad usage or bad input.
)";

// Bad usage or environment; reported like malformed input (exit 2).
struct ToolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  std::istringstream is(s);
  for (std::string line; std::getline(is, line);) lines.push_back(line);
  return lines;
}

std::string first_line(const std::string& s) {
  const auto lines = split_lines(s);
  return lines.empty() ? std::string("unknown error") : lines[0];
}

// --- summary ---------------------------------------------------------------------

// A double: sizes whose product fits in int64_t (verify() checks it) times an element
// size, summed over inputs, may not.
double input_bytes(const TensorMeta& m) {
  try {
    return static_cast<double>(m.numel()) * static_cast<double>(c10::elementSize(m.dtype));
  } catch (const std::exception&) {
    return 0;  // a dtype without an element size (undefined, bits): counted as 0
  }
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = b;
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  }
  return buf;
}

std::map<std::string, int> op_histogram(const Graph& g) {
  std::map<std::string, int> ops;
  for (const Node& n : g.nodes()) {
    if (n.kind == NodeKind::Call) ++ops[n.qualified_op()];
  }
  return ops;
}

std::string summary(const Graph& g, const std::string& path) {
  std::ostringstream os;
  std::map<NodeKind, int> by_kind;
  std::map<Phase, int> by_phase;
  std::map<int, int> hook_calls;
  int writes = 0, views = 0;
  for (const Node& n : g.nodes()) {
    ++by_kind[n.kind];
    if (n.kind == NodeKind::Call || n.kind == NodeKind::CallHook) ++by_phase[n.phase];
    if (n.kind == NodeKind::CallHook) ++hook_calls[n.hook];
  }
  for (const Value& v : g.values()) {
    writes += v.version_of != kNoValue;
    views += v.view_of != kNoValue;
  }
  os << "graph: " << path << "\n";
  os << "nodes: " << g.nodes().size() << " (input " << by_kind[NodeKind::Input] << ", call "
     << by_kind[NodeKind::Call] << ", call_hook " << by_kind[NodeKind::CallHook] << ", output "
     << by_kind[NodeKind::Output] << ")\n";
  os << "phases: forward " << by_phase[Phase::Forward] << ", backward "
     << by_phase[Phase::Backward] << "\n";
  os << "values: " << g.values().size() << " (in-place writes " << writes << ", views " << views
     << ")\n";

  std::map<InputKind, std::pair<int, double>> inputs;
  double total = 0;
  for (NodeId id : g.input_nodes()) {
    const Node& n = g.node(id);
    double bytes = 0;
    for (ValueId v : g.node(id).outputs.at(0).values) bytes += input_bytes(g.value(v).meta);
    ++inputs[n.input_kind].first;
    inputs[n.input_kind].second += bytes;
    total += bytes;
  }
  os << "inputs: " << g.input_nodes().size() << ", " << human_bytes(total) << "\n";
  for (const auto& [kind, count_bytes] : inputs) {
    os << "  " << to_string(kind) << ": " << count_bytes.first << ", "
       << human_bytes(count_bytes.second) << "\n";
  }
  if (const Node* out = g.output_node()) {
    int grads = static_cast<int>(
        std::count(out->output_kinds.begin(), out->output_kinds.end(), OutputKind::Grad));
    os << "outputs: " << out->args.size() << " (user " << out->args.size() - grads << ", grad "
       << grads << ")\n";
  } else {
    os << "outputs: none (no output node)\n";
  }
  os << "hooks: " << g.hooks().size() << "\n";
  for (const Hook& h : g.hooks()) {
    os << "  #" << h.id << " " << to_string(h.kind) << " on " << h.autograd_node << " (called "
       << hook_calls[h.id] << "x)\n";
  }

  const auto ops = op_histogram(g);
  std::vector<std::pair<int, std::string>> sorted;
  for (const auto& [op, count] : ops) sorted.emplace_back(-count, op);
  std::sort(sorted.begin(), sorted.end());
  constexpr size_t kTopOps = 15;
  os << "ops: " << g.num_calls() << " calls, " << ops.size() << " distinct"
     << (ops.size() > kTopOps ? " (top " + std::to_string(kTopOps) + ")" : "") << "\n";
  for (size_t k = 0; k < sorted.size() && k < kTopOps; ++k) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%6d  ", -sorted[k].first);
    os << buf << sorted[k].second << "\n";
  }
  if (!g.meta().empty()) {
    os << "meta:\n";
    for (const auto& [k, v] : g.meta()) os << "  " << k << ": " << v << "\n";
  }
  return os.str();
}

// --- diff ------------------------------------------------------------------------

// Inputs keyed by "name [kind]", with their printed declaration.
std::map<std::string, std::string> input_decls(const Graph& g) {
  std::map<std::string, std::string> out;
  for (NodeId id : g.input_nodes()) {
    const Node& n = g.node(id);
    const Value& v = g.value(n.outputs.at(0).values.at(0));
    std::ostringstream decl;
    decl << dtype_short_name(v.meta.dtype) << "[";
    for (size_t k = 0; k < v.meta.sizes.size(); ++k) decl << (k ? ", " : "") << v.meta.sizes[k];
    decl << "]" << (v.meta.requires_grad ? "@rg" : "");
    out[n.name + " [" + to_string(n.input_kind) + "]"] = decl.str();
  }
  return out;
}

// A printout split into the header's input declarations and the body's lines, so
// that a header printed on one line compares equal to the same inputs one per line.
struct Printed {
  std::vector<std::string> inputs;
  std::vector<std::string> body;
};

Printed printed(const Graph& g) {
  Printed p;
  const auto lines = split_lines(to_string(g));
  size_t k = 0;
  const std::string& head = lines.empty() ? std::string() : lines[0];
  if (head == "graph(") {  // one input per line, up to "):"
    for (k = 1; k < lines.size() && lines[k] != "):"; ++k) {
      std::string decl = lines[k].substr(lines[k].find_first_not_of(' '));
      if (!decl.empty() && decl.back() == ',') decl.pop_back();
      p.inputs.push_back(decl);
    }
  } else if (head.size() > std::strlen("graph():")) {  // "graph(%0 : ..., %1 : ...):"
    const std::string decls = head.substr(6, head.size() - 8);
    size_t start = 0;
    for (size_t at = decls.find(", %"); at != std::string::npos; at = decls.find(", %", at + 1)) {
      p.inputs.push_back(decls.substr(start, at - start));
      start = at + 2;
    }
    p.inputs.push_back(decls.substr(start));
  }
  for (++k; k < lines.size(); ++k) p.body.push_back(lines[k]);
  return p;
}

void first_difference(const std::string& what, const std::vector<std::string>& a,
                      const std::vector<std::string>& b, std::ostream& os) {
  for (size_t k = 0; k < std::max(a.size(), b.size()); ++k) {
    const std::string* x = k < a.size() ? &a[k] : nullptr;
    const std::string* y = k < b.size() ? &b[k] : nullptr;
    if (x && y && *x == *y) continue;
    os << "first differing " << what << " (" << (what == "node" ? "body line " : "input ") << k + 1
       << "):\n"
       << "- " << (x ? *x : "<none>") << "\n"
       << "+ " << (y ? *y : "<none>") << "\n";
    return;
  }
}

// Returns true when the graphs differ.
bool diff(const Graph& a, const Graph& b, std::ostream& os) {
  if (a == b) {
    os << "graphs are equal\n";
    return false;
  }
  std::vector<std::string> parts;
  if (a.nodes() != b.nodes()) parts.push_back("nodes");
  if (a.values() != b.values()) parts.push_back("values");
  if (a.hooks() != b.hooks()) parts.push_back("hooks");
  if (a.schemas() != b.schemas()) parts.push_back("schemas");
  if (a.meta() != b.meta()) parts.push_back("meta");
  os << "graphs differ in:";
  for (const auto& p : parts) os << " " << p;
  os << "\n";

  const auto ia = input_decls(a), ib = input_decls(b);
  for (const auto& [key, decl] : ia) {
    auto it = ib.find(key);
    if (it == ib.end()) {
      os << "input removed: " << key << " : " << decl << "\n";
    } else if (it->second != decl) {
      os << "input changed: " << key << " : " << decl << " -> " << it->second << "\n";
    }
  }
  for (const auto& [key, decl] : ib) {
    if (ia.count(key) == 0) os << "input added: " << key << " : " << decl << "\n";
  }

  const Printed pa = printed(a), pb = printed(b);
  first_difference("input", pa.inputs, pb.inputs, os);
  first_difference("node", pa.body, pb.body, os);

  const auto oa = op_histogram(a), ob = op_histogram(b);
  std::set<std::string> all_ops;
  for (const auto& kv : oa) all_ops.insert(kv.first);
  for (const auto& kv : ob) all_ops.insert(kv.first);
  bool header = false;
  for (const auto& op : all_ops) {
    const int ca = oa.count(op) ? oa.at(op) : 0, cb = ob.count(op) ? ob.at(op) : 0;
    if (ca == cb) continue;
    if (!header) os << "op count changes:\n";
    header = true;
    os << "  " << op << ": " << ca << " -> " << cb << "\n";
  }
  for (const auto& [key, value] : a.meta()) {
    auto it = b.meta().find(key);
    if (it == b.meta().end()) os << "meta removed: " << key << "\n";
    else if (it->second != value) os << "meta changed: " << key << ": " << value << " -> " << it->second << "\n";
  }
  for (const auto& kv : b.meta()) {
    if (a.meta().count(kv.first) == 0) os << "meta added: " << kv.first << "\n";
  }
  return true;
}

// --- main ------------------------------------------------------------------------

void emit(const std::string& raw, const std::string& out_path) {
  const std::string text = tcap::ir::printable(raw, SIZE_MAX, /*keep_lines=*/true);
  if (out_path.empty()) {
    std::cout << text << std::flush;
    if (!std::cout) throw ToolError("cannot write to stdout");
    return;
  }
  std::ofstream f(out_path, std::ios::binary);
  f << text;
  f.close();
  if (!f) throw ToolError("cannot write " + out_path);
}

Graph load_graph(const std::string& path) {
  if (path.size() > 4 && path.substr(path.size() - 4) == ".pt2") return tcap::load_program(path)->graph();
  return load_json(path);
}

int run(int argc, char** argv) {
  std::vector<std::string> pos;
  std::string out_path;
  for (int k = 1; k < argc; ++k) {
    const std::string a = argv[k];
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    }
    if (a == "-o" || a == "--output") {
      if (k + 1 >= argc) throw ToolError(a + " needs a file name");
      out_path = argv[++k];
    } else if (a.size() > 1 && a[0] == '-') {
      throw ToolError("unknown option '" + a + "' (see --help)");
    } else {
      pos.push_back(a);
    }
  }
  if (pos.empty()) throw ToolError("missing command (see --help)");
  const std::string cmd = pos[0];
  const std::set<std::string> one_file = {"code", "table", "dot", "svg", "summary"};
  if (cmd == "diff") {
    if (pos.size() != 3) throw ToolError("diff needs two graph files (see --help)");
    const Graph a = load_graph(pos[1]), b = load_graph(pos[2]);
    std::ostringstream os;
    const bool differ = diff(a, b, os);
    emit(os.str(), out_path);
    return differ ? 1 : 0;
  }
  if (one_file.count(cmd) == 0) throw ToolError("unknown command '" + cmd + "' (see --help)");
  if (pos.size() != 2) throw ToolError(cmd + " needs exactly one graph file (see --help)");
  const Graph g = load_graph(pos[1]);
  std::string text;
  if (cmd == "code") text = to_string(g);
  if (cmd == "table") text = to_table(g);
  if (cmd == "dot") text = to_dot(g);
  if (cmd == "svg") text = tcap::ir::to_svg(g);
  if (cmd == "summary") text = summary(g, pos[1]);
  emit(text, out_path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string msg;
  try {
    return run(argc, argv);
  } catch (const c10::Error& e) {
    msg = e.what_without_backtrace();
  } catch (const std::exception& e) {
    // GraphFormatError, ToolError and anything else from the standard library.
    msg = e.what();
  } catch (...) {
    msg = "unknown error";
  }
  std::cerr << "tcap-inspect: " << tcap::ir::printable(first_line(msg), tcap::ir::kMaxMessageBytes) << std::endl;
  return 2;
}
