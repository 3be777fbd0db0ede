// Graph construction, access and structural equality. See include/tcap/graph.h.
#include <tcap/graph.h>

#include "ir/verify_args.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>

#include <algorithm>
#include <limits>
#include <numeric>

namespace tcap::ir {

bool Node::draws_random_numbers() const {
  if (kind != NodeKind::Call) return false;
  auto schema = c10::Dispatcher::singleton().findSchema({op, overload});
  return schema && schema->hasTag(at::Tag::nondeterministic_seeded);
}

Arg Arg::none(std::string name) {
  Arg a;
  a.name = std::move(name);
  return a;
}
Arg Arg::value(ValueId v, std::string name) {
  Arg a;
  a.kind = ArgKind::Value;
  a.values = {v};
  a.name = std::move(name);
  return a;
}
Arg Arg::value_list(std::vector<ValueId> vs, bool optional, std::string name) {
  Arg a;
  a.kind = optional ? ArgKind::OptValueList : ArgKind::ValueList;
  a.values.assign(vs.begin(), vs.end());
  a.name = std::move(name);
  return a;
}
Arg Arg::integer(int64_t v, std::string name) {
  Arg a;
  a.kind = ArgKind::Int;
  a.i = v;
  a.name = std::move(name);
  return a;
}
Arg Arg::real(double v, std::string name) {
  Arg a;
  a.kind = ArgKind::Double;
  a.d = v;
  a.name = std::move(name);
  return a;
}
Arg Arg::boolean(bool v, std::string name) {
  Arg a;
  a.kind = ArgKind::Bool;
  a.i = v ? 1 : 0;
  a.name = std::move(name);
  return a;
}

static bool same_double(double a, double b) {
  // NaN payloads compare equal to each other: a constant NaN round-trips.
  return (a == b) || (a != a && b != b);
}

bool Arg::operator==(const Arg& o) const {
  if (kind != o.kind || name != o.name || values != o.values || i != o.i || i2 != o.i2 ||
      s != o.s || ints != o.ints || doubles.size() != o.doubles.size()) {
    return false;
  }
  if (!same_double(d, o.d) || !same_double(d_imag, o.d_imag)) return false;
  for (size_t k = 0; k < doubles.size(); ++k) {
    if (!same_double(doubles[k], o.doubles[k])) return false;
  }
  return true;
}

bool TensorMeta::operator==(const TensorMeta& o) const {
  return dtype == o.dtype && sizes == o.sizes && strides == o.strides &&
         storage_offset == o.storage_offset && device == o.device &&
         requires_grad == o.requires_grad;
}

// Both are safe on metadata verify() rejects (the printer shows such graphs): an
// overflowing product saturates, mismatched strides are not contiguous.
int64_t TensorMeta::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) {
    if (c10::mul_overflows(n, s, &n)) return std::numeric_limits<int64_t>::max();
  }
  return n;
}

bool TensorMeta::is_contiguous() const {
  if (strides.size() != sizes.size()) return false;
  int64_t expected = 1;
  for (size_t k = sizes.size(); k-- > 0;) {
    if (sizes[k] != 1 && strides[k] != expected) return false;
    if (c10::mul_overflows(expected, sizes[k], &expected)) return false;
  }
  return true;
}

bool Value::operator==(const Value& o) const {
  return id == o.id && producer == o.producer && output_index == o.output_index &&
         list_index == o.list_index && meta == o.meta && version_of == o.version_of &&
         view_of == o.view_of;
}

bool Node::operator==(const Node& o) const {
  return id == o.id && kind == o.kind && op == o.op && overload == o.overload &&
         args == o.args && outputs == o.outputs && phase == o.phase &&
         grad_mode == o.grad_mode && autograd_node == o.autograd_node && hook == o.hook &&
         input_kind == o.input_kind && name == o.name && output_names == o.output_names &&
         output_kinds == o.output_kinds;
}

bool Hook::operator==(const Hook& o) const {
  return id == o.id && kind == o.kind && autograd_node == o.autograd_node && slot == o.slot;
}

bool Graph::operator==(const Graph& o) const {
  return nodes_ == o.nodes_ && values_ == o.values_ && hooks_ == o.hooks_ &&
         schemas_ == o.schemas_ && meta_ == o.meta_;
}

ValueId Graph::new_value(NodeId producer, int output_index, int list_index, TensorMeta meta) {
  Value& v = emplace_value(producer, output_index, list_index);
  v.meta = std::move(meta);
  return v.id;
}

Value& Graph::emplace_value(NodeId producer, int output_index, int list_index) {
  uses_.emplace_back();
  Value& v = values_.emplace_back();
  v.id = static_cast<ValueId>(values_.size() - 1);
  v.producer = producer;
  v.output_index = output_index;
  v.list_index = list_index;
  return v;
}

Node& Graph::emplace_node(NodeKind kind) {
  Node& n = nodes_.emplace_back();
  n.id = static_cast<NodeId>(nodes_.size() - 1);
  n.kind = kind;
  return n;
}

ValueId Graph::add_input(InputKind kind, std::string name, TensorMeta meta) {
  Node n;
  n.kind = NodeKind::Input;
  n.input_kind = kind;
  n.name = std::move(name);
  n.id = static_cast<NodeId>(nodes_.size());
  const ValueId v = new_value(n.id, 0, -1, std::move(meta));
  n.outputs.push_back(Arg::value(v));
  nodes_.push_back(std::move(n));
  return v;
}

NodeId Graph::add_node(Node node) {
  node.id = static_cast<NodeId>(nodes_.size());
  nodes_.push_back(std::move(node));
  note_reads(nodes_.back().id, nodes_.back().args);
  return nodes_.back().id;
}

ValueId Graph::add_call(const std::string& op, const std::string& overload, std::vector<Arg> args, TensorMeta meta,
                        const Node* like, ValueId view_of) {
  Node m;
  m.kind = NodeKind::Call;
  m.op = op;
  m.overload = overload;
  m.args = std::move(args);
  if (like) {
    m.phase = like->phase;
    m.grad_mode = like->grad_mode;
    m.autograd_node = like->autograd_node;
    m.hook = like->hook;
  }
  const auto id = static_cast<NodeId>(nodes_.size());
  const ValueId v = new_value(id, 0, -1, std::move(meta));
  values_[static_cast<size_t>(v)].view_of = view_of;
  m.outputs.push_back(Arg::value(v));
  const std::string q = m.qualified_op();
  add_node(std::move(m));
  if (!schemas_.count(q)) schemas_[q] = known_schema_string(op, overload);
  return v;
}

void Graph::set_outputs(std::vector<ValueId> values, std::vector<std::string> names,
                        std::vector<OutputKind> kinds) {
  TORCH_CHECK(values.size() == names.size() && values.size() == kinds.size(),
              "tcap: set_outputs needs one name and one kind per value");
  if (!nodes_.empty() && nodes_.back().kind == NodeKind::Output) {
    forget_reads(nodes_.back().id, nodes_.back().args);
    nodes_.pop_back();
  }
  Node n;
  n.kind = NodeKind::Output;
  n.args.reserve(values.size());
  for (ValueId v : values) n.args.push_back(Arg::value(v));
  n.output_names = std::move(names);
  n.output_kinds = std::move(kinds);
  add_node(std::move(n));
}

int Graph::add_hook(HookKind kind, std::string autograd_node, int slot) {
  Hook h;
  h.slot = slot;
  h.id = static_cast<int>(hooks_.size());
  h.kind = kind;
  h.autograd_node = std::move(autograd_node);
  hooks_.push_back(std::move(h));
  return hooks_.back().id;
}

void Graph::note_reads(NodeId n, const std::vector<Arg>& args) {
  for_each_value(args, [&](ValueId v) {
    if (v < 0 || static_cast<size_t>(v) >= uses_.size()) return;  // malformed: verify() says so
    auto& u = uses_[static_cast<size_t>(v)];
    if (u.empty() || u.back() < n) {
      u.push_back(n);  // the common case: a node added after every other reader
    } else {
      auto at = std::lower_bound(u.begin(), u.end(), n);
      if (at == u.end() || *at != n) u.insert(at, n);
    }
  });
}

void Graph::forget_reads(NodeId n, const std::vector<Arg>& args) {
  for_each_value(args, [&](ValueId v) {
    if (v < 0 || static_cast<size_t>(v) >= uses_.size()) return;
    auto& u = uses_[static_cast<size_t>(v)];
    auto at = std::lower_bound(u.begin(), u.end(), n);
    if (at != u.end() && *at == n) u.erase(at);
  });
}

void Graph::check_constant(NodeId n, size_t i, const Arg& a) {
  TORCH_CHECK(!a.refers_to_values(), "tcap: argument ", i, " of node %", n,
              " refers to values: edit it with Graph::edit_node, which keeps the use lists");
}

void Graph::replace_all_uses_with(ValueId from, ValueId to) { replace_uses({{from, to}}); }

void Graph::replace_uses(const std::unordered_map<ValueId, ValueId>& renames) {
  if (renames.empty()) return;
  auto last_name = [&](ValueId v) {
    for (size_t hops = 0; hops <= renames.size(); ++hops) {
      auto it = renames.find(v);
      if (it == renames.end() || it->second == v) return v;
      v = it->second;
    }
    TORCH_CHECK(false, "tcap: replace_uses: the renames form a cycle through %", v);
  };
  std::vector<NodeId> readers;
  for (const auto& [from, to] : renames) {
    const NodeId start = value(from).producer;
    for (NodeId u : users(from)) {
      if (u > start) readers.push_back(u);
    }
  }
  std::sort(readers.begin(), readers.end());
  readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
  for (NodeId u : readers) {
    edit_node(u, [&](Node& n) {
      for (auto& a : n.args) {
        for (auto& v : a.values) {
          if (v != kNoValue && renames.count(v) && u > value(v).producer) v = last_name(v);
        }
      }
    });
  }
  for (auto& v : values_) {
    if (v.version_of != kNoValue && renames.count(v.version_of)) v.version_of = last_name(v.version_of);
    if (v.view_of != kNoValue && renames.count(v.view_of)) v.view_of = last_name(v.view_of);
  }
}

std::vector<NodeId> Graph::input_nodes() const {
  std::vector<NodeId> out;
  for (const auto& n : nodes_) {
    if (n.kind == NodeKind::Input) out.push_back(n.id);
  }
  return out;
}

const Node* Graph::output_node() const {
  if (!nodes_.empty() && nodes_.back().kind == NodeKind::Output) return &nodes_.back();
  return nullptr;
}

std::vector<ValueId> Graph::output_values() const {
  std::vector<ValueId> out;
  if (const Node* n = output_node()) {
    for (const auto& a : n->args) out.push_back(a.values.at(0));
  }
  return out;
}

c10::ArrayRef<NodeId> Graph::users(ValueId v) const {
  if (v < 0 || static_cast<size_t>(v) >= uses_.size()) return {};
  return uses_[static_cast<size_t>(v)];
}

std::vector<NodeId> Graph::last_readers() const {
  std::vector<NodeId> last(values_.size(), -1);
  for (size_t v = 0; v < uses_.size(); ++v) {
    if (!uses_[v].empty()) last[v] = uses_[v].back();  // the lists are sorted (Note [Use lists])
  }
  return last;
}

ValueId Graph::alias_root(ValueId v) const {
  while (true) {
    const Value& val = value(v);
    if (val.view_of != kNoValue) v = val.view_of;
    else if (val.version_of != kNoValue) v = val.version_of;
    else return v;
  }
}

std::vector<size_t> Graph::written_inputs() const {
  std::vector<size_t> out;
  const auto inputs = input_nodes();
  for (const auto& val : values_) {
    if (val.version_of == kNoValue) continue;
    const Node& p = node(value(alias_root(val.id)).producer);
    if (p.kind != NodeKind::Input) continue;
    const auto pos = static_cast<size_t>(std::find(inputs.begin(), inputs.end(), p.id) - inputs.begin());
    if (std::find(out.begin(), out.end(), pos) == out.end()) out.push_back(pos);
  }
  return out;
}

size_t Graph::num_calls() const {
  return static_cast<size_t>(std::count_if(nodes_.begin(), nodes_.end(), [](const Node& n) {
    return n.kind == NodeKind::Call;
  }));
}

}  // namespace tcap::ir
