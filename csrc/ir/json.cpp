// Graph <-> versioned JSON ({"format": "tcap.graph", "version": 1, ...}).
// The schema is documented in docs/graph-json.md; golden files live in test/golden/.
//
// Enum spellings come from names.cpp (to_string, dtype_name) in both directions: the
// reader looks a name up by comparing it with to_string() of every enumerator, so
// the two directions cannot drift apart. Layout and MemoryFormat have no IR-wide
// names yet; their tables are private to this file.
#include "ir/json.h"

#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/util/Exception.h>
#include <tcap/graph_json.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>

namespace tcap::ir {
namespace {

// ordered_json keeps keys in insertion order, so "format" and "version" come first.
using OrderedJson = nlohmann::ordered_json;

// --- enum names ----------------------------------------------------------------

constexpr NodeKind kNodeKinds[] = {NodeKind::Input, NodeKind::Call, NodeKind::CallHook,
                                   NodeKind::Output};
constexpr InputKind kInputKinds[] = {InputKind::UserInput, InputKind::Parameter, InputKind::Buffer,
                                     InputKind::Tangent, InputKind::Constant, InputKind::Saved,
                                     InputKind::HostScalar};
constexpr Phase kPhases[] = {Phase::Forward, Phase::Backward};
constexpr OutputKind kOutputKinds[] = {OutputKind::User, OutputKind::Grad, OutputKind::Saved};
constexpr HookKind kHookKinds[] = {HookKind::TensorPreHook, HookKind::RetainsGradHook,
                                   HookKind::PreHook, HookKind::PostHook, HookKind::AccumulateGrad};
constexpr ArgKind kArgKinds[] = {
    ArgKind::None,         ArgKind::UndefinedTensor, ArgKind::Value,
    ArgKind::ValueList,    ArgKind::OptValueList,    ArgKind::Bool,
    ArgKind::Int,          ArgKind::Double,          ArgKind::Complex,
    ArgKind::String,       ArgKind::IntList,         ArgKind::DoubleList,
    ArgKind::BoolList,     ArgKind::ScalarType,      ArgKind::Layout,
    ArgKind::MemoryFormat, ArgKind::Device,          ArgKind::WrappedScalar,
    ArgKind::Opaque};

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// Python's spellings (torch.sparse_coo, torch._mkldnn without the underscore, ...).
constexpr EnumName<c10::Layout> kLayouts[] = {
    {c10::Layout::Strided, "strided"},      {c10::Layout::Sparse, "sparse_coo"},
    {c10::Layout::SparseCsr, "sparse_csr"}, {c10::Layout::SparseCsc, "sparse_csc"},
    {c10::Layout::SparseBsr, "sparse_bsr"}, {c10::Layout::SparseBsc, "sparse_bsc"},
    {c10::Layout::Mkldnn, "mkldnn"},        {c10::Layout::Jagged, "jagged"}};
constexpr EnumName<c10::MemoryFormat> kMemoryFormats[] = {
    {c10::MemoryFormat::Contiguous, "contiguous_format"},
    {c10::MemoryFormat::Preserve, "preserve_format"},
    {c10::MemoryFormat::ChannelsLast, "channels_last"},
    {c10::MemoryFormat::ChannelsLast3d, "channels_last_3d"}};

template <typename E, size_t N>
std::string table_name(const EnumName<E> (&table)[N], int64_t raw, const char* what) {
  for (const auto& row : table) {
    if (static_cast<int64_t>(row.value) == raw) return row.name;
  }
  return std::string(what) + std::to_string(raw);  // the reader rejects it, by name
}

// --- writing ---------------------------------------------------------------------

// Non-finite doubles are not JSON numbers; they are written as strings.
OrderedJson encode_double(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  return d;
}

OrderedJson encode_value_ids(c10::ArrayRef<ValueId> ids) {
  OrderedJson out = OrderedJson::array();
  for (ValueId v : ids) out.push_back(v == kNoValue ? OrderedJson(nullptr) : OrderedJson(v));
  return out;
}

// Note [Arg payload by kind]
// Each ArgKind stores its payload in a fixed subset of Arg's fields (graph.h) and
// only that subset is written, under the kind's own key names. Arg's factories and
// the recorder leave the other fields at their defaults, which is what the reader
// restores, so the round trip is exact for every Arg the IR builds.
OrderedJson arg_to_json(const Arg& a) {
  OrderedJson j;
  j["kind"] = to_string(a.kind);
  if (!a.name.empty()) j["name"] = a.name;
  switch (a.kind) {
    case ArgKind::None:
    case ArgKind::UndefinedTensor: break;
    case ArgKind::Value: j["value"] = a.values.empty() ? kNoValue : a.values[0]; break;
    case ArgKind::ValueList:
    case ArgKind::OptValueList: j["values"] = encode_value_ids(a.values); break;
    case ArgKind::Bool: j["value"] = a.i != 0; break;
    case ArgKind::Int: j["value"] = a.i; break;
    case ArgKind::Double: j["value"] = encode_double(a.d); break;
    case ArgKind::Complex:
      j["real"] = encode_double(a.d);
      j["imag"] = encode_double(a.d_imag);
      break;
    case ArgKind::String: j["value"] = a.s; break;
    case ArgKind::IntList: j["values"] = a.ints; break;
    case ArgKind::DoubleList: {
      OrderedJson values = OrderedJson::array();
      for (double d : a.doubles) values.push_back(encode_double(d));
      j["values"] = std::move(values);
      break;
    }
    case ArgKind::BoolList: {
      OrderedJson values = OrderedJson::array();
      for (int64_t b : a.ints) values.push_back(b != 0);
      j["values"] = std::move(values);
      break;
    }
    case ArgKind::ScalarType: j["value"] = dtype_name(static_cast<c10::ScalarType>(a.i)); break;
    case ArgKind::Layout: j["value"] = table_name(kLayouts, a.i, "layout"); break;
    case ArgKind::MemoryFormat:
      j["value"] = table_name(kMemoryFormats, a.i, "memory_format");
      break;
    case ArgKind::Device: j["value"] = a.s; break;
    case ArgKind::WrappedScalar: {
      const auto dtype = static_cast<c10::ScalarType>(a.i2);
      if (c10::isIntegralType(dtype, /*includeBool=*/true)) {
        j["value"] = a.i;
      } else {
        j["value"] = encode_double(a.d);
        if (c10::isComplexType(dtype)) j["imag"] = encode_double(a.d_imag);
      }
      j["dtype"] = dtype_name(dtype);
      break;
    }
    case ArgKind::Opaque: j["type"] = a.s; break;
  }
  return j;
}

OrderedJson args_to_json(const std::vector<Arg>& args) {
  OrderedJson out = OrderedJson::array();
  for (const Arg& a : args) out.push_back(arg_to_json(a));
  return out;
}

OrderedJson value_to_json(const Value& v) {
  OrderedJson j;
  j["id"] = v.id;
  j["producer"] = v.producer;
  j["output_index"] = v.output_index;
  if (v.list_index != -1) j["list_index"] = v.list_index;
  j["dtype"] = dtype_name(v.meta.dtype);
  j["shape"] = std::vector<int64_t>(v.meta.sizes.begin(), v.meta.sizes.end());
  j["strides"] = std::vector<int64_t>(v.meta.strides.begin(), v.meta.strides.end());
  j["storage_offset"] = v.meta.storage_offset;
  j["device"] = v.meta.device.str();
  j["requires_grad"] = v.meta.requires_grad;
  if (v.version_of != kNoValue) j["version_of"] = v.version_of;
  if (v.view_of != kNoValue) j["view_of"] = v.view_of;
  return j;
}

OrderedJson output_kinds_to_json(const std::vector<OutputKind>& kinds) {
  OrderedJson out = OrderedJson::array();
  for (OutputKind k : kinds) out.push_back(to_string(k));
  return out;
}

// Note [Node fields by kind]
// Each node kind always writes the fields it uses (docs/graph-json.md). Any other
// Node field is written only when it differs from its default, so a graph that sets
// one anyway (say a tangent input tagged phase "backward") still round-trips, and
// the reader treats such a field as optional for that kind.
OrderedJson node_to_json(const Node& n) {
  OrderedJson j;
  j["id"] = n.id;
  j["kind"] = to_string(n.kind);
  switch (n.kind) {
    case NodeKind::Input:
      j["input_kind"] = to_string(n.input_kind);
      j["name"] = n.name;
      j["outputs"] = args_to_json(n.outputs);
      break;
    case NodeKind::Call:
      j["op"] = n.op;
      j["overload"] = n.overload;
      j["args"] = args_to_json(n.args);
      j["outputs"] = args_to_json(n.outputs);
      j["phase"] = to_string(n.phase);
      j["grad_mode"] = n.grad_mode;
      break;
    case NodeKind::CallHook:
      j["hook"] = n.hook;
      j["args"] = args_to_json(n.args);
      j["outputs"] = args_to_json(n.outputs);
      j["phase"] = to_string(n.phase);
      j["autograd_node"] = n.autograd_node;
      break;
    case NodeKind::Output:
      j["args"] = args_to_json(n.args);
      j["output_names"] = n.output_names;
      j["output_kinds"] = output_kinds_to_json(n.output_kinds);
      break;
  }
  const Node d;  // defaults
  auto extra = [&](const char* key, bool is_set, auto make) {
    if (is_set && !j.contains(key)) j[key] = make();
  };
  extra("input_kind", n.input_kind != d.input_kind, [&] { return to_string(n.input_kind); });
  extra("name", !n.name.empty(), [&] { return n.name; });
  extra("op", !n.op.empty(), [&] { return n.op; });
  extra("overload", !n.overload.empty(), [&] { return n.overload; });
  extra("args", !n.args.empty(), [&] { return args_to_json(n.args); });
  extra("outputs", !n.outputs.empty(), [&] { return args_to_json(n.outputs); });
  extra("phase", n.phase != d.phase, [&] { return to_string(n.phase); });
  extra("grad_mode", n.grad_mode != d.grad_mode, [&] { return n.grad_mode; });
  extra("autograd_node", !n.autograd_node.empty(), [&] { return n.autograd_node; });
  extra("hook", n.hook != d.hook, [&] { return n.hook; });
  extra("output_names", !n.output_names.empty(), [&] { return n.output_names; });
  extra("output_kinds", !n.output_kinds.empty(),
        [&] { return output_kinds_to_json(n.output_kinds); });
  return j;
}

OrderedJson graph_to_json(const Graph& g) {
  OrderedJson j;
  j["format"] = kGraphFormat;
  j["version"] = kGraphFormatVersion;
  j["meta"] = OrderedJson::object();
  for (const auto& [k, v] : g.meta()) j["meta"][k] = v;
  j["schemas"] = OrderedJson::object();
  for (const auto& [k, v] : g.schemas()) j["schemas"][k] = v;
  j["hooks"] = OrderedJson::array();
  for (const Hook& h : g.hooks()) {
    j["hooks"].push_back(
        {{"id", h.id}, {"kind", to_string(h.kind)}, {"autograd_node", h.autograd_node}});
    if (h.slot >= 0) j["hooks"].back()["slot"] = h.slot;
  }
  j["values"] = OrderedJson::array();
  for (const Value& v : g.values()) j["values"].push_back(value_to_json(v));
  j["nodes"] = OrderedJson::array();
  for (const Node& n : g.nodes()) j["nodes"].push_back(node_to_json(n));
  return j;
}

// --- reading ---------------------------------------------------------------------

[[noreturn]] void fail_unknown(const JsonCursor& c, const char* what, const std::string& expected) {
  c.fail("unknown " + std::string(what) + " " + json_quoted(c.string()) +
         " (expected one of: " + expected + ")");
}

// An IR enum, spelled by to_string() (names.cpp).
template <typename E, size_t N>
E read_ir_enum(const JsonCursor& c, const E (&all)[N], const char* what) {
  const std::string& s = c.string();
  std::string expected;
  for (E e : all) {
    const std::string name = to_string(e);
    if (name == s) return e;
    expected += (expected.empty() ? "" : ", ") + name;
  }
  fail_unknown(c, what, expected);
}

template <typename E, size_t N>
E read_table_enum(const JsonCursor& c, const EnumName<E> (&table)[N], const char* what) {
  const std::string& s = c.string();
  std::string expected;
  for (const auto& row : table) {
    if (s == row.name) return row.value;
    expected += (expected.empty() ? "" : ", ") + std::string(row.name);
  }
  fail_unknown(c, what, expected);
}

c10::ScalarType read_dtype(const JsonCursor& c) {
  try {
    return dtype_from_name(c.string());
  } catch (const c10::Error&) {
    c.fail("unknown dtype " + json_quoted(c.string()));
  }
}

// Parsed, and so validated, by c10.
c10::Device read_device(const JsonCursor& c) {
  try {
    return c10::Device(c.string());
  } catch (const c10::Error&) {
    c.fail("invalid device " + json_quoted(c.string()));
  }
}

// Table sizes, known before the tables are read, for checking references.
struct Counts {
  size_t nodes = 0;
  size_t values = 0;
  size_t hooks = 0;
};

void check_dense_id(const JsonCursor& obj, size_t position) {
  const int64_t id = obj["id"].integer();
  if (id < 0 || static_cast<uint64_t>(id) != position) {
    obj.fail("id is " + std::to_string(id) + ", expected " + std::to_string(position) +
             " (ids must be dense and equal to the position in the list)");
  }
}

ValueIds read_value_ids(const JsonCursor& a, const Counts& c, bool nulls_allowed) {
  ValueIds out;
  for (const JsonCursor& e : a.elements()) {
    out.push_back(nulls_allowed && e.raw().is_null() ? kNoValue : e.index_into(c.values, "values"));
  }
  return out;
}

// See Note [Arg payload by kind].
Arg read_arg(const JsonCursor& a, const Counts& c) {
  Arg out;
  out.kind = read_ir_enum(a["kind"], kArgKinds, "arg kind");
  if (a.has("name")) out.name = a["name"].string();
  switch (out.kind) {
    case ArgKind::None:
    case ArgKind::UndefinedTensor: break;
    case ArgKind::Value: out.values = {a["value"].index_into(c.values, "values")}; break;
    case ArgKind::ValueList:
    case ArgKind::OptValueList:
      out.values = read_value_ids(a["values"], c, out.kind == ArgKind::OptValueList);
      break;
    case ArgKind::Bool: out.i = a["value"].boolean() ? 1 : 0; break;
    case ArgKind::Int: out.i = a["value"].integer(); break;
    case ArgKind::Double: out.d = a["value"].real(); break;
    case ArgKind::Complex:
      out.d = a["real"].real();
      out.d_imag = a["imag"].real();
      break;
    case ArgKind::String: out.s = a["value"].string(); break;
    case ArgKind::IntList:
      for (const JsonCursor& e : a["values"].elements()) out.ints.push_back(e.integer());
      break;
    case ArgKind::DoubleList:
      for (const JsonCursor& e : a["values"].elements()) out.doubles.push_back(e.real());
      break;
    case ArgKind::BoolList:
      for (const JsonCursor& e : a["values"].elements()) out.ints.push_back(e.boolean() ? 1 : 0);
      break;
    case ArgKind::ScalarType: out.i = static_cast<int64_t>(read_dtype(a["value"])); break;
    case ArgKind::Layout:
      out.i = static_cast<int64_t>(read_table_enum(a["value"], kLayouts, "layout"));
      break;
    case ArgKind::MemoryFormat:
      out.i = static_cast<int64_t>(read_table_enum(a["value"], kMemoryFormats, "memory format"));
      break;
    case ArgKind::Device:
      read_device(a["value"]);  // validate, but keep the text as written
      out.s = a["value"].string();
      break;
    case ArgKind::WrappedScalar: {
      const c10::ScalarType dtype = read_dtype(a["dtype"]);
      out.i2 = static_cast<int64_t>(dtype);
      if (c10::isIntegralType(dtype, /*includeBool=*/true)) {
        out.i = a["value"].integer();
      } else {
        out.d = a["value"].real();
        if (c10::isComplexType(dtype)) out.d_imag = a["imag"].real();
      }
      break;
    }
    case ArgKind::Opaque: out.s = a["type"].string(); break;
  }
  return out;
}

std::vector<Arg> read_args(const JsonCursor& a, const Counts& c) {
  std::vector<Arg> out;
  for (const JsonCursor& e : a.elements()) out.push_back(read_arg(e, c));
  return out;
}

TensorMeta read_meta(const JsonCursor& v) {
  TensorMeta m;
  m.dtype = read_dtype(v["dtype"]);
  for (const JsonCursor& e : v["shape"].elements()) m.sizes.push_back(e.integer());
  for (const JsonCursor& e : v["strides"].elements()) m.strides.push_back(e.integer());
  m.storage_offset = v["storage_offset"].integer();
  m.device = read_device(v["device"]);
  m.requires_grad = v["requires_grad"].boolean();
  return m;
}

void read_value(const JsonCursor& v, size_t position, const Counts& c, Graph& g) {
  check_dense_id(v, position);
  const NodeId producer = v["producer"].index_into(c.nodes, "nodes");
  const auto output_index = static_cast<int>(v["output_index"].integer_in(0, INT_MAX));
  const int list_index =
      v.has("list_index") ? static_cast<int>(v["list_index"].integer_in(-1, INT_MAX)) : -1;
  const ValueId id = g.new_value(producer, output_index, list_index, read_meta(v));
  if (v.has("version_of")) g.value(id).version_of = v["version_of"].index_into(c.values, "values");
  if (v.has("view_of")) g.value(id).view_of = v["view_of"].index_into(c.values, "values");
}

// See Note [Node fields by kind].
Node read_node(const JsonCursor& a, size_t position, const Counts& c) {
  check_dense_id(a, position);
  Node n;
  n.kind = read_ir_enum(a["kind"], kNodeKinds, "node kind");
  const NodeKind k = n.kind;
  const bool is_input = k == NodeKind::Input, is_call = k == NodeKind::Call;
  const bool is_hook = k == NodeKind::CallHook, is_output = k == NodeKind::Output;
  if (auto f = a.field("input_kind", is_input)) {
    n.input_kind = read_ir_enum(*f, kInputKinds, "input kind");
  }
  if (auto f = a.field("name", is_input)) n.name = f->string();
  if (auto f = a.field("op", is_call)) n.op = f->string();
  if (auto f = a.field("overload", is_call)) n.overload = f->string();
  if (auto f = a.field("args", !is_input)) n.args = read_args(*f, c);
  if (auto f = a.field("outputs", !is_output)) n.outputs = read_args(*f, c);
  if (auto f = a.field("phase", is_call || is_hook)) n.phase = read_ir_enum(*f, kPhases, "phase");
  if (auto f = a.field("grad_mode", is_call)) n.grad_mode = f->boolean();
  if (auto f = a.field("autograd_node", is_hook)) n.autograd_node = f->string();
  if (auto f = a.field("hook", is_hook)) n.hook = f->index_into(c.hooks, "hooks");
  if (auto f = a.field("output_names", is_output)) {
    for (const JsonCursor& e : f->elements()) n.output_names.push_back(e.string());
  }
  if (auto f = a.field("output_kinds", is_output)) {
    for (const JsonCursor& e : f->elements()) {
      n.output_kinds.push_back(read_ir_enum(e, kOutputKinds, "output kind"));
    }
  }
  return n;
}

Graph graph_from_json(const Json& root) {
  const JsonCursor r(root, "");
  if (!root.is_object()) {
    throw_format_error(
        "", "not a tcap graph (expected a JSON object, got " + json_describe(root) + ")");
  }
  if (!root.contains("format")) throw_format_error("", "not a tcap graph (no \"format\" field)");
  const Json& format = root.at("format");
  if (format != kGraphFormat) {
    throw_format_error("", "not a tcap graph (format is " + json_describe(format) + ")");
  }
  const int64_t version = r["version"].integer();
  if (version != kGraphFormatVersion) {
    throw_format_error("", "unsupported version " + std::to_string(version) +
                               " (this build reads version " + std::to_string(kGraphFormatVersion) +
                               ")");
  }
  // "meta", "schemas" and "hooks" may be left out when empty.
  static const Json kEmptyArray = Json::array();
  const JsonElements hooks =
      r.has("hooks") ? r["hooks"].elements() : JsonCursor(kEmptyArray, "hooks").elements();
  const JsonElements values = r["values"].elements();
  const JsonElements nodes = r["nodes"].elements();
  const Counts c{nodes.size(), values.size(), hooks.size()};

  Graph g;
  g.reserve(nodes.size(), values.size());
  for (size_t k = 0; k < hooks.size(); ++k) {
    const JsonCursor h = hooks[k];
    check_dense_id(h, k);
    int slot = -1;  // -1: the body was recorded; >= 0: a position in the replay's hook list
    if (auto f = h.field("slot", false)) slot = static_cast<int>(f->integer_in(-1, INT_MAX));
    g.add_hook(read_ir_enum(h["kind"], kHookKinds, "hook kind"), h["autograd_node"].string(), slot);
  }
  for (size_t k = 0; k < values.size(); ++k) read_value(values[k], k, c, g);
  for (size_t k = 0; k < nodes.size(); ++k) g.add_node(read_node(nodes[k], k, c));
  if (auto f = r.field("schemas", false)) {
    for (const auto& [op, schema] : f->object().items()) {
      g.schemas()[op] = JsonCursor(schema, key_path("schemas", op)).string();
    }
  }
  if (auto f = r.field("meta", false)) {
    for (const auto& [key, text] : f->object().items()) {
      g.meta()[key] = JsonCursor(text, key_path("meta", key)).string();
    }
  }

  try {
    verify(g);
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    throw_format_error("", "graph fails verify(): " + msg.substr(0, msg.find('\n')));
  }
  return g;
}

}  // namespace

std::string to_json_string(const Graph& g, int indent) {
  try {
    return graph_to_json(g).dump(indent);
  } catch (const OrderedJson::exception& e) {  // a string that is not UTF-8
    throw_format_error("", std::string("cannot serialize the graph: ") + e.what());
  }
}

Graph from_json_string(const std::string& text, const JsonReadOptions& options) {
  check_input_limits(text, options);
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::parse_error& e) {
    std::string why = e.what();
    const size_t prefix = why.find("] ");  // "[json.exception.parse_error.101] "
    if (prefix != std::string::npos) why = why.substr(prefix + 2);
    throw_format_error("", "invalid JSON at byte " + std::to_string(e.byte) + ": " + why);
  } catch (const Json::exception& e) {  // a number that overflows a double (1e999)
    std::string why = e.what();
    const size_t prefix = why.find("] ");
    if (prefix != std::string::npos) why = why.substr(prefix + 2);
    throw_format_error("", "invalid JSON: " + why);
  }
  try {
    return graph_from_json(root);
  } catch (const Json::exception& e) {  // not expected: every access above is checked
    throw_format_error("", std::string("malformed graph: ") + e.what());
  }
}

void save_json(const Graph& g, const std::string& path) {
  const std::string text = to_json_string(g) + "\n";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    throw std::runtime_error(std::string(kGraphFormat) + ": cannot write " + path + ": " +
                             std::strerror(errno));
  }
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int saved_errno = errno;
  if (std::fclose(f) != 0 || !written) {
    throw std::runtime_error(std::string(kGraphFormat) + ": cannot write " + path + ": " +
                             std::strerror(written ? errno : saved_errno));
  }
}

Graph load_json(const std::string& path, const JsonReadOptions& options) {
  const std::string text = read_graph_file(path, options);  // its errors name the file
  try {
    return from_json_string(text, options);
  } catch (const GraphFormatError& e) {
    // Name the file: "tcap.graph: model.json: nodes[3]: ...".
    const std::string prefix = std::string(kGraphFormat) + ": ";
    throw GraphFormatError(printable(prefix + path + ": " + std::string(e.what()).substr(prefix.size()),
                                     kMaxMessageBytes));
  }
}

}  // namespace tcap::ir
