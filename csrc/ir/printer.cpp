// Printers for ir::Graph: readable text (the main debugging surface), a table, and
// Graphviz DOT. All three are deterministic (golden tests compare them) and never
// throw on a malformed graph: verify() prints the graph it rejects.
//
// Readable format (to_string), one line per node (from test/ir/printer_test.cpp):
//
//   graph(%0 : f32[4, 10] x [user_input], %1 : f32[5, 10]@rg fc1.weight [parameter]):
//     %2 : f32[10, 5]{1, 10}@rg = aten::t(%1)  # view of %1, users=1
//     %3 : f32[4, 5]@rg = aten::mm(%0, %2)  # users=2
//     (%4 : f32[4]@rg, %5 : i64[4]) = aten::max.dim(%3, dim=1, keepdim=False)  # users=[1, 0]
//     [%6 : f32[2, 5]@rg, %7 : f32[2, 5]@rg] = aten::split.Tensor(%3, split_size=2, dim=0)  # view of %3, users=[1, 0]
//     %8 : f32[4, 5] = aten::add_.Tensor(%3, 1.0, alpha=1)  # no_grad, writes %3, users=0
//     %9 : f32[]@rg = aten::sum(%6, dtype=None)  # users=1
//     # ---- backward ----
//     %10 : f32[] = input grad_loss [tangent]
//     %11 : f32[2, 5]{0, 0} = aten::expand(%10, size=[2, 5], implicit=False)  # backward SumBackward0, view of %10, users=2
//     %12 : f32[2, 5] = aten::mul.Tensor(%11, 2.0)  # backward, hook#0, users=1
//     %13 : f32[2, 5] = call_hook[#0 tensor_pre_hook on SplitBackward0](%11) -> (%12)  # backward, users=1
//     ...
//     return (%9 loss, %19 grad(fc1.weight))
//
// - `%N` is Value N (ids are stable: they are the value's index in the graph).
// - Types: short dtype and sizes; then `{strides}` when not contiguous, `+offset`
//   when the storage offset is not 0, `@cuda:0` when not on the CPU, `@rg` when the
//   value requires grad.
// - The header lists the leading Input nodes as `%N : type name [kind]`, on one line
//   when it fits in kHeaderWidth columns, else one input per line. An Input node
//   after the first non-input prints in the body as `%N : type = input name [kind]`.
// - Left-hand side: a node's outputs. Value -> `%N : type`, Tensor[] ->
//   `[%a : type, %b : type]`, None -> `_`, host scalars -> their value; several
//   outputs form a tuple `(..., ...)`; a node with no outputs has no `=`.
// - Arguments: the leading tensor arguments (and always the first argument) print
//   positionally; from the first other argument on, named arguments print as
//   `name=value`. Constants print Python-style: `1`, `2.0`, `True`, `None`,
//   `[4, 5]`, `"str"`, `torch.float32`, `torch.strided`, `torch.channels_last`,
//   devices bare (`cuda:0`), wrapped scalars as the number, opaque as `<Generator>`,
//   an undefined tensor as `<undefined>`, a Tensor?[] entry that is None as `None`.
// - A CallHook prints `call_hook[#id kind on AutogradNode](inputs) -> (results)`
//   from its args[0] and args[1].
// - Trailing comment, in this order: `backward AutogradNode` (backward phase),
//   `hook#K` (a call inside hook K's body), `no_grad` (forward op run with grad mode
//   off) or `enable_grad` (backward op run with grad mode on, i.e. create_graph),
//   `writes %N` (in-place / out= write: Value::version_of), `view of %N`
//   (Value::view_of; said once when several results view the same base), `users=N`
//   (distinct nodes reading the value; a list for several results).
// - A comment line `# ---- backward ----` marks each change of phase.
// - The Output node prints as `return (%N name, %M grad(name))`.
//
// to_table: one row per node under a header and a dashed rule, columns aligned:
// opcode | name | target | args | meta (types and the trailing comment above).
// to_dot: one DOT node per graph node (inputs as ellipses coloured by kind,
// parameters and buffers double-bordered, forward calls blue boxes, backward calls
// red boxes, hook-body calls dashed, call_hook nodes yellow hexagons, the output a
// double octagon) and one edge per (value, reading node) labelled `%N`.
#include <tcap/graph.h>

#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

namespace tcap::ir {

namespace {

constexpr size_t kHeaderWidth = 100;

const Value* find_value(const Graph& g, ValueId v) {
  if (v < 0 || static_cast<size_t>(v) >= g.values().size()) return nullptr;
  return &g.value(v);
}

template <typename Container, typename F>
std::string join(const Container& xs, const std::string& sep, F f) {
  std::string out;
  for (size_t k = 0; k < xs.size(); ++k) {
    if (k) out += sep;
    out += f(xs[k]);
  }
  return out;
}

std::string join_strings(const std::vector<std::string>& xs, const std::string& sep) {
  return join(xs, sep, [](const std::string& s) { return s; });
}

// Shortest text that parses back to the same double; always looks like a float.
std::string format_double(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  if (d == std::trunc(d) && std::fabs(d) < 1e16) {  // 100000.0, not 1e+05
    std::snprintf(buf, sizeof(buf), "%.1f", d);
    return buf;
  }
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string format_complex(double re, double im) {
  std::string imag = format_double(im);
  if (imag[0] != '-') imag = "+" + imag;
  return "(" + format_double(re) + imag + "j)";
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string layout_name(int64_t l) {
  switch (static_cast<c10::Layout>(l)) {
    case c10::Layout::Strided: return "torch.strided";
    case c10::Layout::Sparse: return "torch.sparse_coo";
    case c10::Layout::SparseCsr: return "torch.sparse_csr";
    case c10::Layout::Mkldnn: return "torch._mkldnn";
    case c10::Layout::SparseCsc: return "torch.sparse_csc";
    case c10::Layout::SparseBsr: return "torch.sparse_bsr";
    case c10::Layout::SparseBsc: return "torch.sparse_bsc";
    case c10::Layout::Jagged: return "torch.jagged";
    default: return "layout(" + std::to_string(l) + ")";
  }
}

std::string memory_format_name(int64_t m) {
  switch (static_cast<c10::MemoryFormat>(m)) {
    case c10::MemoryFormat::Contiguous: return "torch.contiguous_format";
    case c10::MemoryFormat::Preserve: return "torch.preserve_format";
    case c10::MemoryFormat::ChannelsLast: return "torch.channels_last";
    case c10::MemoryFormat::ChannelsLast3d: return "torch.channels_last_3d";
    default: return "memory_format(" + std::to_string(m) + ")";
  }
}

std::string int_list(c10::ArrayRef<int64_t> xs) {
  return "[" + join(xs, ", ", [](int64_t x) { return std::to_string(x); }) + "]";
}

std::string type_str(const TensorMeta& m) {
  std::string s = dtype_short_name(m.dtype) + int_list(m.sizes);
  if (m.strides.size() != m.sizes.size() || !m.is_contiguous()) {
    s += "{" + join(m.strides, ", ", [](int64_t x) { return std::to_string(x); }) + "}";
  }
  if (m.storage_offset != 0) s += "+" + std::to_string(m.storage_offset);
  if (!m.device.is_cpu()) s += "@" + m.device.str();
  if (m.requires_grad) s += "@rg";
  return s;
}

std::string ref(ValueId v) { return v == kNoValue ? "None" : "%" + std::to_string(v); }

std::string value_with_type(const Graph& g, ValueId v) {
  const Value* val = find_value(g, v);
  return ref(v) + " : " + (val ? type_str(val->meta) : "?");
}

std::string wrapped_scalar(const Arg& a) {
  const auto t = static_cast<c10::ScalarType>(a.i2);
  if (t == c10::ScalarType::Bool) return a.i ? "True" : "False";
  if (c10::isComplexType(t)) return format_complex(a.d, a.d_imag);
  if (c10::isFloatingType(t)) return format_double(a.d);
  return std::to_string(a.i);
}

// An argument (or a host-scalar result) as text, without its name.
std::string arg_str(const Arg& a) {
  switch (a.kind) {
    case ArgKind::None: return "None";
    case ArgKind::UndefinedTensor: return "<undefined>";
    case ArgKind::Value: return a.values.size() == 1 ? ref(a.values[0]) : "%?";
    case ArgKind::ValueList:
    case ArgKind::OptValueList: return "[" + join(a.values, ", ", ref) + "]";
    case ArgKind::Bool: return a.i ? "True" : "False";
    case ArgKind::Int: return std::to_string(a.i);
    case ArgKind::Double: return format_double(a.d);
    case ArgKind::Complex: return format_complex(a.d, a.d_imag);
    case ArgKind::String: return quote(a.s);
    case ArgKind::IntList: return int_list(a.ints);
    case ArgKind::DoubleList: return "[" + join(a.doubles, ", ", format_double) + "]";
    case ArgKind::BoolList:
      return "[" + join(a.ints, ", ", [](int64_t b) { return std::string(b ? "True" : "False"); }) +
             "]";
    case ArgKind::ScalarType:
      return "torch." + dtype_name(static_cast<c10::ScalarType>(a.i));
    case ArgKind::Layout: return layout_name(a.i);
    case ArgKind::MemoryFormat: return memory_format_name(a.i);
    case ArgKind::Device: return a.s;
    case ArgKind::WrappedScalar: return wrapped_scalar(a);
    case ArgKind::Opaque: return "<" + (a.s.empty() ? std::string("opaque") : a.s) + ">";
  }
  return "<?>";
}

bool is_tensor_like(const Arg& a) {
  return a.refers_to_values() || a.kind == ArgKind::UndefinedTensor ||
         a.kind == ArgKind::WrappedScalar;
}

// See "Arguments" in the format note at the top of this file.
std::string args_str(const std::vector<Arg>& args) {
  std::vector<std::string> parts;
  bool named = false;
  for (size_t k = 0; k < args.size(); ++k) {
    const Arg& a = args[k];
    if (k > 0 && !is_tensor_like(a)) named = true;
    parts.push_back(named && !a.name.empty() ? a.name + "=" + arg_str(a) : arg_str(a));
  }
  return join_strings(parts, ", ");
}

std::vector<ValueId> output_value_ids(const Node& n) {
  std::vector<ValueId> out;
  for (const Arg& a : n.outputs) {
    if (!a.refers_to_values()) continue;
    for (ValueId v : a.values) {
      if (v != kNoValue) out.push_back(v);
    }
  }
  return out;
}

// One result: `%N : type`, `[%a : type, ...]`, `_`, or a host scalar.
std::string result_str(const Graph& g, const Arg& a, bool with_types) {
  auto one = [&](ValueId v) { return with_types && v != kNoValue ? value_with_type(g, v) : ref(v); };
  switch (a.kind) {
    case ArgKind::None: return "_";
    case ArgKind::Value: return a.values.size() == 1 ? one(a.values[0]) : "%?";
    case ArgKind::ValueList:
    case ArgKind::OptValueList: return "[" + join(a.values, ", ", one) + "]";
    default: return arg_str(a);
  }
}

std::string lhs_str(const Graph& g, const Node& n, bool with_types) {
  if (n.outputs.size() == 1) return result_str(g, n.outputs[0], with_types);
  return "(" + join(n.outputs, ", ", [&](const Arg& a) { return result_str(g, a, with_types); }) +
         ")";
}

std::string hook_str(const Graph& g, int hook) {
  std::string s = "#" + std::to_string(hook);
  if (hook >= 0 && static_cast<size_t>(hook) < g.hooks().size()) {
    const Hook& h = g.hooks()[static_cast<size_t>(hook)];
    s += " " + to_string(h.kind);
    if (!h.autograd_node.empty()) s += " on " + h.autograd_node;
  } else {
    s += " <unknown hook>";
  }
  return s;
}

std::string list_contents(const Arg& a) {
  return a.refers_to_values() ? join(a.values, ", ", ref) : arg_str(a);
}

std::string call_hook_args_str(const Node& n) {
  if (n.args.size() == 2) {
    return "(" + list_contents(n.args[0]) + ") -> (" + list_contents(n.args[1]) + ")";
  }
  return "(" + args_str(n.args) + ")";
}

std::string output_entry(const Node& n, size_t k) {
  std::string s = arg_str(n.args[k]);
  const std::string name = k < n.output_names.size() ? n.output_names[k] : "";
  const bool grad = k < n.output_kinds.size() && n.output_kinds[k] == OutputKind::Grad;
  if (grad) return s + " grad(" + name + ")";
  if (k < n.output_kinds.size() && n.output_kinds[k] == OutputKind::Saved) return s + " saved(" + name + ")";
  return name.empty() ? s : s + " " + name;
}

std::string output_args_str(const Node& n) {
  std::vector<std::string> parts;
  for (size_t k = 0; k < n.args.size(); ++k) parts.push_back(output_entry(n, k));
  return "(" + join_strings(parts, ", ") + ")";
}

// The right-hand side of a node line ("aten::mul.Tensor(%1, 2.0)").
std::string rhs_str(const Graph& g, const Node& n) {
  switch (n.kind) {
    case NodeKind::Input:
      return "input " + n.name + (n.name.empty() ? "" : " ") + "[" + to_string(n.input_kind) + "]";
    case NodeKind::Call: return n.qualified_op() + "(" + args_str(n.args) + ")";
    case NodeKind::CallHook: return "call_hook[" + hook_str(g, n.hook) + "]" + call_hook_args_str(n);
    case NodeKind::Output: return "return " + output_args_str(n);
  }
  return "?";
}

// Comment parts of a Call / CallHook node (see the format note).
std::vector<std::string> notes(const Graph& g, const Node& n) {
  std::vector<std::string> out;
  if (n.phase == Phase::Backward) {
    out.push_back(n.autograd_node.empty() ? "backward" : "backward " + n.autograd_node);
  } else if (!n.autograd_node.empty()) {
    out.push_back(n.autograd_node);
  }
  if (n.kind == NodeKind::Call && n.hook >= 0) out.push_back("hook#" + std::to_string(n.hook));
  if (n.phase == Phase::Forward && !n.grad_mode) out.push_back("no_grad");
  if (n.phase == Phase::Backward && n.grad_mode) out.push_back("enable_grad");
  const std::vector<ValueId> results = output_value_ids(n);
  // Several results of one node usually alias the same base (split, unbind): one note.
  auto add_once = [&](std::string note) {
    if (std::find(out.begin(), out.end(), note) == out.end()) out.push_back(std::move(note));
  };
  for (ValueId v : results) {
    const Value* val = find_value(g, v);
    if (val && val->version_of != kNoValue) add_once("writes " + ref(val->version_of));
  }
  for (ValueId v : results) {
    const Value* val = find_value(g, v);
    if (val && val->view_of != kNoValue) add_once("view of " + ref(val->view_of));
  }
  auto count = [&](ValueId v) {
    return std::to_string(g.users(v).size());  // 0 for an id the graph lacks
  };
  if (results.size() == 1) out.push_back("users=" + count(results[0]));
  if (results.size() > 1) out.push_back("users=[" + join(results, ", ", count) + "]");
  return out;
}

std::string input_decl(const Graph& g, const Node& n) {
  const ValueId v = !n.outputs.empty() && n.outputs[0].values.size() == 1 ? n.outputs[0].values[0]
                                                                          : kNoValue;
  std::string s = value_with_type(g, v);
  if (!n.name.empty()) s += " " + n.name;
  return s + " [" + to_string(n.input_kind) + "]";
}

std::string header(const Graph& g, size_t num_leading_inputs) {
  std::vector<std::string> decls;
  for (size_t k = 0; k < num_leading_inputs; ++k) decls.push_back(input_decl(g, g.nodes()[k]));
  const std::string one_line = "graph(" + join_strings(decls, ", ") + "):\n";
  if (one_line.size() <= kHeaderWidth + 1) return one_line;
  std::string s = "graph(\n";
  for (const auto& d : decls) s += "    " + d + ",\n";
  return s + "):\n";
}

// Table / DOT helpers -------------------------------------------------------------

std::string target_str(const Graph& g, const Node& n) {
  switch (n.kind) {
    case NodeKind::Input: return n.name;
    case NodeKind::Call: return n.qualified_op();
    case NodeKind::CallHook: return hook_str(g, n.hook);
    case NodeKind::Output: return "output";
  }
  return "?";
}

std::string table_args(const Graph& g, const Node& n) {
  switch (n.kind) {
    case NodeKind::Input: return "[" + to_string(n.input_kind) + "]";
    case NodeKind::Call: return "(" + args_str(n.args) + ")";
    case NodeKind::CallHook: return call_hook_args_str(n);
    case NodeKind::Output: return output_args_str(n);
  }
  return "?";
}

std::string table_meta(const Graph& g, const Node& n) {
  std::string s = join(output_value_ids(n), ", ", [&](ValueId v) {
    const Value* val = find_value(g, v);
    return val ? type_str(val->meta) : std::string("?");
  });
  if (n.kind == NodeKind::Call || n.kind == NodeKind::CallHook) {
    const auto parts = notes(g, n);
    if (!parts.empty()) s += (s.empty() ? "# " : "  # ") + join_strings(parts, ", ");
  }
  return s;
}

std::string dot_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// Cuts long labels so that a node with hundreds of results stays drawable.
std::string clip(const std::string& s, size_t width = 60) {
  return s.size() <= width ? s : s.substr(0, width - 3) + "...";
}

struct DotStyle {
  const char* shape;
  const char* fill;
  const char* extra;
};

DotStyle dot_style(const Node& n) {
  switch (n.kind) {
    case NodeKind::Input:
      switch (n.input_kind) {
        case InputKind::UserInput: return {"ellipse", "#d5e8d4", ""};
        case InputKind::Parameter: return {"ellipse", "#e1d5e7", ", peripheries=2"};
        case InputKind::Buffer: return {"ellipse", "#eeeeee", ", peripheries=2, style=\"filled,dashed\""};
        case InputKind::Tangent: return {"ellipse", "#ffe6cc", ""};
        case InputKind::Constant: return {"ellipse", "#ffffff", ", style=\"filled,dashed\""};
        case InputKind::Saved: return {"ellipse", "#dae8fc", ""};
        case InputKind::HostScalar: return {"diamond", "#fff2cc", ""};
      }
      break;
    case NodeKind::Call:
      if (n.phase == Phase::Backward) {
        return {"box", "#f8cecc", n.hook >= 0 ? ", style=\"filled,dashed\"" : ""};
      }
      return {"box", "#dae8fc", n.hook >= 0 ? ", style=\"filled,dashed\"" : ""};
    case NodeKind::CallHook: return {"hexagon", "#fff2cc", ", color=\"#d6b656\", penwidth=2"};
    case NodeKind::Output: return {"doubleoctagon", "#f5f5f5", ""};
  }
  return {"box", "#ffffff", ""};
}

std::string dot_label(const Graph& g, const Node& n) {
  std::vector<std::string> lines;
  switch (n.kind) {
    case NodeKind::Input:
      lines.push_back(n.name.empty() ? "[" + to_string(n.input_kind) + "]"
                                     : n.name + " [" + to_string(n.input_kind) + "]");
      lines.push_back(clip(lhs_str(g, n, true)));
      break;
    case NodeKind::Call:
    case NodeKind::CallHook:
      if (n.kind == NodeKind::Call) {
        lines.push_back(clip(n.qualified_op()));
      } else {  // "call_hook #0" over "tensor_pre_hook on MulBackward0"
        std::string h = hook_str(g, n.hook);
        const size_t space = h.find(' ');
        lines.push_back("call_hook " + h.substr(0, space));
        if (space != std::string::npos) lines.push_back(clip(h.substr(space + 1)));
      }
      if (!n.outputs.empty()) lines.push_back(clip(lhs_str(g, n, true)));
      for (const auto& note : notes(g, n)) {
        if (note.rfind("users=", 0) != 0) lines.push_back(clip(note));
      }
      break;
    case NodeKind::Output:
      lines.push_back("output");
      lines.push_back(clip(output_args_str(n)));
      break;
  }
  return join_strings(lines, "\n");
}

}  // namespace

std::string to_string(const Graph& g) {
  const auto& nodes = g.nodes();
  size_t leading = 0;
  while (leading < nodes.size() && nodes[leading].kind == NodeKind::Input) ++leading;
  std::string out = header(g, leading);
  Phase phase = Phase::Forward;
  for (size_t k = leading; k < nodes.size(); ++k) {
    const Node& n = nodes[k];
    if (n.kind == NodeKind::Output) {
      out += "  " + rhs_str(g, n) + "\n";
      continue;
    }
    if (n.phase != phase) {
      phase = n.phase;
      out += "  # ---- " + to_string(phase) + " ----\n";
    }
    std::string line = "  ";
    if (!n.outputs.empty()) line += lhs_str(g, n, true) + " = ";
    line += rhs_str(g, n);
    if (n.kind != NodeKind::Input) {
      const auto parts = notes(g, n);
      if (!parts.empty()) line += "  # " + join_strings(parts, ", ");
    }
    out += line + "\n";
  }
  return out;
}

std::string to_table(const Graph& g) {
  std::vector<std::vector<std::string>> rows = {{"opcode", "name", "target", "args", "meta"}};
  for (const Node& n : g.nodes()) {
    rows.push_back({to_string(n.kind), n.outputs.empty() ? "_" : lhs_str(g, n, false),
                    target_str(g, n), table_args(g, n), table_meta(g, n)});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows) {
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  rows.insert(rows.begin() + 1, std::vector<std::string>());
  for (size_t c = 0; c < width.size(); ++c) rows[1].push_back(std::string(width[c], '-'));
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      line += r[c];
      if (c + 1 < r.size()) line += std::string(width[c] - r[c].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string to_dot(const Graph& g) {
  std::ostringstream os;
  os << "digraph tcap {\n"
     << "  rankdir=TB;\n"
     << "  node [fontname=\"Courier\", fontsize=10, style=filled];\n"
     << "  edge [fontname=\"Courier\", fontsize=9];\n";
  for (const Node& n : g.nodes()) {
    const DotStyle st = dot_style(n);
    os << "  n" << n.id << " [label=\"" << dot_escape(dot_label(g, n)) << "\", shape="
       << st.shape << ", fillcolor=\"" << st.fill << "\"" << st.extra << "];\n";
  }
  // One edge per (value, reading node), labelled with the value id.
  for (const Node& n : g.nodes()) {
    std::vector<ValueId> seen;
    for (const Arg& a : n.args) {
      for (ValueId v : a.values) {
        const Value* val = find_value(g, v);
        if (!val || std::find(seen.begin(), seen.end(), v) != seen.end()) continue;
        seen.push_back(v);
        os << "  n" << val->producer << " -> n" << n.id << " [label=\"%" << v << "\"];\n";
      }
    }
  }
  os << "}\n";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Graph& g) { return os << to_string(g); }

}  // namespace tcap::ir
