#include "fuse/functionalize.h"

#include "fuse/classify.h"
#include "fuse/groups.h"
#include "fuse/rewriter.h"
#include "ir/op_facts.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>

namespace tcap::fuse {

// Note [In-place updates as kernels]
// An optimizer's step is a chain of in-place ops per parameter: Adam records mul_, add_,
// mul_, addcmul_ on its two moments, a sqrt, a div and an add_ on a temporary, and an
// addcdiv_ on the parameter. A mutation closes every fusion group (Note [Fusion groups]),
// so each op stayed an ATen call that reads and writes its whole tensor: about 2.5 times
// the bytes the update needs. As Inductor does (functionalization, then re-inplacing),
// the chain is made functional here, where fusion can see it, and written back in place
// after (Note [Fused results written in place], fusion.cpp):
//   - a buffer's writes are made functional when all of them are pointwise ops with a
//     lowering (their functional forms classify as Pointwise on the kernels' device) that
//     write the buffer itself, not a view of it, each on the previous version, with every
//     tensor of the buffer's floating dtype; the buffer is an input of the graph (a
//     parameter, a moment, a gradient) or the fresh result of a pointwise or
//     fresh-result op (the temporary `denom`), dense, on the kernels' device; an input
//     only when it did not share a storage with another input when the graph was
//     captured (gradients sliced from one tensor may share one, being only read) (Note
//     [Inputs that share storage] in ir/op_facts.h: a write into one would reach another,
//     and moving it to the end would let the other's readers see the old values);
//   - every reader of a version (and of a view of it) other than the next write comes
//     before that write, so the functional values the readers get hold what they read; the
//     Output node reads only the last version, and no opaque hook runs after the first
//     write (it may read the buffer by itself);
//   - an out= overload's write into its `out` (amsgrad's maximum.out) counts as an
//     in-place write when its functional overload (the same arguments without `out`) is
//     pointwise; its other arguments may read the buffer's previous version (Note [Writes
//     are not lowered] in classify.cpp);
//   - an input's buffer gets the last value back with copy_(input, last) just before the
//     Output node, which reads the copy's result (still the caller's tensor). The copies
//     are mutations, so groups close there, after the update kernels; fusion then lets a
//     kernel write a result straight into the buffer it replaces.
// Readers after the last write read the functional value, whose bits are the buffer's.
// What stays as it was: writes through views, writes by ops with no lowering (copy_,
// zero_, the batch norm's running statistics), a buffer read in ways the order above
// does not allow, and buffers of other dtypes or devices.

namespace {

constexpr const char* kWhy = "in-place update not made functional: ";

// The functional form of a writing overload: the op and overload computing the value it
// writes, and the argument that form leaves out (-1 for none).
struct Functional {
  std::string op, overload;
  int drop = -1;  // an out= overload's `out`
};

// The functional form of in-place or out= overload op.`overload`, or nullopt:
//   in-place  mul_.Tensor -> mul.Tensor: the overload of the name without `_` that takes
//             the same arguments (names and types; the in-place self's alias annotation
//             aside), the same overload name first. Overload names do not always pair
//             up: pow_.Scalar takes (Tensor self, Scalar exponent), as pow.Tensor_Scalar
//             does, while pow.Scalar takes (Scalar self, Tensor exponent).
//   out=      maximum.out(self, other, *, out!) -> maximum(self, other): an overload of the
//             same name taking the arguments without the one written, which must be the
//             last, a keyword-only `out`, and the only one written.
// A functional form returns one value and writes nothing. Read once per overload.
std::optional<Functional> functional_form(const std::string& op, const std::string& overload) {
  static std::mutex mu;
  static std::map<std::string, std::optional<Functional>> cache;
  const std::string key = op + "." + overload;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::optional<Functional> found;
  auto& d = c10::Dispatcher::singleton();
  auto writer = op.rfind("aten::", 0) == 0 ? d.findSchema({op, overload}) : std::nullopt;
  if (writer) {
    const auto& want = writer->schema().arguments();
    const bool in_place = op.size() > 2 && op.back() == '_' && op[op.size() - 2] != '_';
    size_t writes = 0;
    for (const auto& a : want) writes += a.alias_info() && a.alias_info()->isWrite() ? 1 : 0;
    const bool last_is_out = !want.empty() && want.back().name() == "out" && want.back().kwarg_only() &&
                             want.back().alias_info() && want.back().alias_info()->isWrite();
    Functional f;
    f.op = in_place ? op.substr(0, op.size() - 1) : op;
    f.drop = in_place ? -1 : static_cast<int>(want.size()) - 1;
    const size_t n = in_place ? want.size() : want.size() - 1;  // the arguments the form takes
    for (const c10::OperatorName& name : d.getAllOpNames()) {
      if ((!in_place && (writes != 1 || !last_is_out)) || name.name != f.op || name == writer->operator_name()) continue;
      auto candidate = d.findSchema(name);
      if (!candidate) continue;
      const auto& have = candidate->schema().arguments();
      bool same = have.size() == n && candidate->schema().returns().size() == 1 && !candidate->schema().is_mutable();
      for (size_t i = 0; same && i < n; ++i) {
        same = have[i].name() == want[i].name() && *have[i].type() == *want[i].type();
      }
      if (!same) continue;
      f.overload = name.overload_name;
      found = f;
      if (name.overload_name == overload) break;  // the same name first
    }
  }
  cache.emplace(key, found);
  return found;
}

class Functionalizer : public Rewriter {
 public:
  using Rewriter::Rewriter;

 private:
  struct Chain {
    ir::ValueId base = ir::kNoValue;
    std::vector<ir::NodeId> writes;     // in order
    std::vector<ir::ValueId> versions;  // base, then each write's result
    bool input = false;                 // base is an input of the graph: written back
  };

  // Why write n (its result a version of `self`) cannot be made functional, or "" with
  // its functional form in `functional`. An in-place op (mul_) writes its first argument;
  // an out= overload (maximum.out, which amsgrad's torch::max_out records) its `out`, which
  // its functional form leaves out; either may also read `self` in other arguments (they
  // read the version before the write, as the functional form does).
  std::string write_refusal(const ir::Node& n, ir::ValueId self, Functional* functional) const {
    const auto form = n.kind == ir::NodeKind::Call ? functional_form(n.op, n.overload) : std::nullopt;
    if (!form) return n.qualified_op() + " has no functional form here";
    if (n.outputs.size() != 1 || n.outputs[0].kind != ir::ArgKind::Value) return "several results";
    const size_t written = form->drop >= 0 ? static_cast<size_t>(form->drop) : 0;
    if (n.args.size() <= written || n.args[written].kind != ir::ArgKind::Value || n.args[written].values[0] != self) {
      return form->drop >= 0 ? "it does not write its out argument" : "it does not write its first argument";
    }
    const ir::TensorMeta& sm = g_.value(self).meta;
    // An out= overload resizes an `out` of another shape: the write-back copy_ would
    // broadcast the new value into the old shape.
    const ir::TensorMeta& rm = g_.value(n.outputs[0].values[0]).meta;
    if (rm.sizes != sm.sizes || rm.strides != sm.strides) return "it resizes the buffer it writes";
    std::string why;
    ir::for_each_value(n.args, [&](ir::ValueId v) {
      if (why.empty() && !ir::is_host_scalar(g_, v) && g_.value(v).meta.dtype != sm.dtype) why = "mixed dtypes";
    });
    if (!why.empty()) return why;
    ir::Node f = n;
    f.op = form->op;
    f.overload = form->overload;
    if (form->drop >= 0) f.args.erase(f.args.begin() + form->drop);
    NodeClass info;
    if (auto refusal = classify(g_, f, &info, device_)) return *refusal;
    if (info.cls != OpClass::Pointwise) return form->op + " is not pointwise";
    *functional = *form;
    return "";
  }

  // What plan() learns about the graph once, for every chain.
  struct GraphFacts {
    // Per value that views are made from (the bottom of a view_of chain): the last node
    // that reads any of its views, and whether the Output node reads one.
    std::unordered_map<ir::ValueId, ir::NodeId> last_view_reader;
    std::set<ir::ValueId> returned_through_a_view;
    ir::NodeId last_opaque_hook = -1;  // the last call of a hook whose body was not recorded
  };

  GraphFacts graph_facts() const {
    GraphFacts f;
    const std::vector<ir::NodeId> last = g_.last_readers();
    const ir::Node* out = g_.output_node();
    for (const ir::Value& v : g_.values()) {
      if (v.view_of == ir::kNoValue) continue;
      ir::ValueId s = v.view_of;
      while (g_.value(s).view_of != ir::kNoValue) s = g_.value(s).view_of;
      const ir::NodeId r = last[static_cast<size_t>(v.id)];
      if (out && r == out->id) f.returned_through_a_view.insert(s);
      auto [it, fresh] = f.last_view_reader.emplace(s, r);
      if (!fresh) it->second = std::max(it->second, r);
    }
    for (const ir::Node& n : g_.nodes()) {
      if (n.kind == ir::NodeKind::CallHook && g_.hooks().at(static_cast<size_t>(n.hook)).slot >= 0) {
        f.last_opaque_hook = n.id;
      }
    }
    return f;
  }

  // Why a buffer's chain cannot be made functional, or "" with the writes' functional ops
  // in `functional` (in order).
  std::string chain_refusal(const Chain& c, const GraphFacts& f,
                            std::vector<Functional>* functional) const {
    const ir::Value& base = g_.value(c.base);
    const ir::TensorMeta& m = base.meta;
    if (m.dtype != c10::kFloat && m.dtype != c10::kDouble) return std::string("dtype ") + c10::toString(m.dtype);
    if (m.device != device_) return "a buffer on " + m.device.str();
    if (!dense_layout(m)) return "a buffer that is not dense";
    functional->assign(c.writes.size(), {});
    for (size_t i = 0; i < c.writes.size(); ++i) {
      if (auto why = write_refusal(g_.node(c.writes[i]), c.versions[i], &(*functional)[i]); !why.empty()) {
        if (i == 0) return why;  // said of the first write's node
        return "%" + std::to_string(c.writes[i]) + " " + g_.node(c.writes[i]).qualified_op() + ": " + why;
      }
    }
    if (c.input) {
      auto shared = g_.meta().find(ir::kInputsShareStorage);
      const std::string& name = g_.node(base.producer).name;
      // A graph from before the names were listed holds "true": every input counts.
      if (shared != g_.meta().end() && (shared->second == "true" || ir::lists_input(shared->second, name))) {
        return "input " + name + " shared a storage with another input when the graph was captured (" +
               shared->second + ", Note [Inputs that share storage])";
      }
    }
    if (!c.input) {
      const ir::Node& p = g_.node(base.producer);
      if (p.kind != ir::NodeKind::Call ||
          !(ir::op_has(p.op, ir::OpFact::FreshResult) || ir::op_has(p.op, ir::OpFact::Pointwise))) {
        return "a buffer made by " + p.qualified_op() + ", which may share another's storage";
      }
    }
    for (size_t i = 0; i < c.writes.size(); ++i) {
      // Readers of version i come before write i (its own read aside).
      for (ir::NodeId u : g_.users(c.versions[i])) {
        if (u > c.writes[i]) return "%" + std::to_string(c.versions[i]) + " is read after it is overwritten";
      }
    }
    for (size_t i = 0; i + 1 < c.versions.size(); ++i) {
      auto r = f.last_view_reader.find(c.versions[i]);
      if (r != f.last_view_reader.end() && r->second > c.writes[i]) {
        return "a view of the buffer is read after the buffer is overwritten";
      }
    }
    // An opaque hook may read the buffer by itself, where the deferred write-back has not
    // reached it yet.
    if (f.last_opaque_hook > c.writes.front()) return "an opaque hook runs after the update";
    return "";
  }

  void plan(Decomposed* d) override {
    // Chains by base: each write's result is a version of the previous one.
    std::map<ir::ValueId, Chain> chains;
    std::set<ir::ValueId> refused;  // bases written through a view, or not in one chain
    for (const ir::Node& n : g_.nodes()) {
      ir::for_each_value(n.outputs, [&](ir::ValueId v) {
        const ir::ValueId prev = g_.value(v).version_of;
        if (prev == ir::kNoValue) return;
        const ir::ValueId root = g_.alias_root(v);
        ir::ValueId b = prev;
        while (g_.value(b).version_of != ir::kNoValue) b = g_.value(b).version_of;
        if (g_.value(b).view_of != ir::kNoValue) {  // a write through a view
          if (refused.insert(root).second) d->decisions.push_back(decision(n, kWhy + std::string("it writes a view")));
          return;
        }
        Chain& c = chains[b];
        if (c.versions.empty()) {
          c.base = b;
          c.versions.push_back(b);
          c.input = g_.node(g_.value(b).producer).kind == ir::NodeKind::Input;
        }
        if (c.versions.back() != prev) refused.insert(b);  // two writes of one version
        c.writes.push_back(n.id);
        c.versions.push_back(v);
      });
    }
    if (chains.empty()) return;
    const GraphFacts f = graph_facts();
    const ir::Node* out = g_.output_node();
    for (auto& [b, c] : chains) {
      if (refused.count(b)) continue;
      // The Output node reads only the last version, and no view of any.
      bool output_reads_old = false;
      for (size_t i = 0; i < c.versions.size(); ++i) {
        const bool overwritten = i + 1 < c.versions.size();
        output_reads_old = output_reads_old || f.returned_through_a_view.count(c.versions[i]) ||
                           (overwritten && out && std::count(g_.users(c.versions[i]).begin(),
                                                              g_.users(c.versions[i]).end(), out->id));
      }
      std::vector<Functional> functional;
      std::string why = output_reads_old ? "the graph returns an overwritten version or a view of the buffer"
                                         : chain_refusal(c, f, &functional);
      if (!why.empty()) {
        d->decisions.push_back(decision(g_.node(c.writes.front()), kWhy + why));
        continue;
      }
      for (size_t i = 0; i < c.writes.size(); ++i) selected_.emplace(c.writes[i], std::move(functional[i]));
      if (c.input) write_backs_.push_back({c.base, c.versions.back()});
    }
  }

  bool selected(const ir::Node& n) const override { return selected_.count(n.id) > 0; }

  bool rewrite(const ir::Node& n) override {
    const Functional& fn = selected_.at(n.id);
    std::vector<ir::Arg> args = n.args;
    if (fn.drop >= 0) args.erase(args.begin() + fn.drop);
    for (auto& a : args) {
      for (auto& v : a.values) {
        if (v != ir::kNoValue) v = map_.at(v);
      }
    }
    const ir::ValueId orig = n.outputs[0].values[0];
    ir::TensorMeta m = g_.value(orig).meta;
    const ir::ValueId v = out_.add_call(fn.op, fn.overload, std::move(args), m, &n);
    map_[orig] = v;
    return true;
  }

  // The write-backs, before the Output node, which reads their results.
  void before(const ir::Node& n) override {
    if (n.kind != ir::NodeKind::Output) return;
    for (const auto& [base, last_version] : write_backs_) {
      const ir::ValueId target = map_.at(base);
      const ir::Node& from = g_.node(g_.value(last_version).producer);
      const ir::ValueId v =
          out_.add_call("aten::copy_", "",
                        {ir::Arg::value(target, "self"), ir::Arg::value(map_.at(last_version), "src"),
                         ir::Arg::boolean(false, "non_blocking")},
                        g_.value(base).meta, &from);
      out_.value(v).version_of = target;
      map_[last_version] = v;
    }
  }

  std::map<ir::NodeId, Functional> selected_;  // write -> its functional form
  std::vector<std::pair<ir::ValueId, ir::ValueId>> write_backs_;  // (input, its last version)
};

}  // namespace

Decomposed functionalize_updates(const ir::Graph& g, const c10::Device& device) {
  return Functionalizer(g, device).run();
}

}  // namespace tcap::fuse
