#include "fuse/sink_reshapes.h"

#include "fuse/lowering.h"
#include "fuse/rewriter.h"

#include "ir/op_facts.h"

#include <map>
#include <set>

namespace tcap::fuse {

// Note [Reshapes sunk below pointwise ops]
// A decomposition that computes in a reshaped view of its tensors (a group norm over
// [N, G, D, HxW], Note [Group norm as kernels]) hands back view(y, sizes). The pointwise ops
// after it (a U-Net block's SiLU, its residual add) then have another shape than y's kernel
// and make kernels of their own, which read y back. For a pointwise op whose tensor
// operands are dense row-major reshapes of one shape S, dense row-major tensors of the op's
// own shape, or 0-dim tensors, computing the op in S and reshaping its result gives the
// same elements in the same order:
//
//   op(view(a, T), b) = view(op(a, view(b, S)), T)     a of shape S; b, T dense, of shape T
//
// so the op is moved above the reshape, and the next op sees a reshape again: a chain
// SiLU, add sinks whole and joins the group norm's kernel, which writes the chain's result.
// Moved only where it joins a kernel and leaves none: the reshaped operands are made by ops
// fusion puts in kernels (computed in S), the others are not (a convolution's result, an
// input); a group norm backward's view of its incoming gradient stays where it is.
// A reshape whose every reader moved above it is dropped. Only views (aten::view,
// aten::_unsafe_view, aten::reshape returning a view) between dense row-major tensors of
// the same dtype and element count, and ops of the lowering table's pointwise class that
// write no input, are touched: anything else is copied as it is.

namespace {

bool dense(const ir::TensorMeta& m) { return m.is_contiguous() && m.storage_offset == 0; }

class ReshapeSinker : public Rewriter {
 public:
  using Rewriter::Rewriter;

 private:
  // A dense reshape: its input value, or kNoValue.
  ir::ValueId reshape_input(const ir::Node& n) const {
    if (n.kind != ir::NodeKind::Call || n.outputs.size() != 1 || n.outputs[0].kind != ir::ArgKind::Value ||
        n.args.empty() || n.args[0].kind != ir::ArgKind::Value) {
      return ir::kNoValue;
    }
    if (n.op != "aten::view" && n.op != "aten::_unsafe_view" && n.op != "aten::reshape") return ir::kNoValue;
    const ir::ValueId in = n.args[0].values[0], out = n.outputs[0].values[0];
    const auto& a = g_.value(in).meta;
    const auto& b = g_.value(out).meta;
    if (g_.value(out).view_of == ir::kNoValue || !dense(a) || !dense(b) || a.dtype != b.dtype || a.numel() != b.numel() ||
        a.device != b.device || a.sizes == b.sizes) {
      return ir::kNoValue;
    }
    return in;
  }

  // Whether pointwise node n can be computed in shape S (set from its reshaped operands);
  // `from_source[i]`: argument i is read as the value it reshapes (else as it is, or
  // viewed to S when it has the op's shape).
  bool sinks(const ir::Node& n, std::vector<int64_t>* S, std::vector<bool>* from_source) const {
    if (n.kind != ir::NodeKind::Call || n.outputs.size() != 1 || n.outputs[0].kind != ir::ArgKind::Value) return false;
    const LoweringRow* row = find_lowering(n);
    if (!row || row->cls != OpClass::Pointwise || !ir::op_has(n.op, ir::OpFact::Pointwise)) return false;
    const ir::ValueId out = n.outputs[0].values[0];
    const auto& om = g_.value(out).meta;
    if (!dense(om) || g_.value(out).version_of != ir::kNoValue || g_.value(out).view_of != ir::kNoValue) return false;
    bool any = false, ok = true;
    S->clear();
    from_source->assign(n.args.size(), false);
    for (size_t i = 0; i < n.args.size(); ++i) {
      const ir::Arg& a = n.args[i];
      if (!ok) break;
      if (a.kind == ir::ArgKind::ValueList || a.kind == ir::ArgKind::OptValueList) ok = false;
      if (a.kind != ir::ArgKind::Value) continue;
      const ir::ValueId v = a.values[0];
      const auto& m = g_.value(v).meta;
      auto it = shape_.find(v);
      if (it != shape_.end() && m.sizes == om.sizes && computed_in_kernel(source_.at(v))) {
        if (any && *S != it->second) ok = false;
        *S = it->second;
        any = true;
        (*from_source)[i] = true;
      } else if (m.sizes.empty()) {
        continue;  // a 0-dim tensor broadcasts in any shape
      } else if (!dense(m) || m.sizes != om.sizes || computed_in_kernel(v)) {
        ok = false;  // (moving the op would take it away from its operand's kernel)
      }
    }
    return ok && any;
  }

  // Whether v is made by an op that fusion puts in a kernel (the kernel it would join).
  bool computed_in_kernel(ir::ValueId v) const {
    const ir::NodeId p = g_.value(v).producer;
    return p >= 0 && (sunk_.count(p) || joins_kernels(g_.node(p)));
  }

  void plan(Decomposed* d) override {
    const auto outs = g_.output_values();
    const std::set<ir::ValueId> graph_outputs(outs.begin(), outs.end());
    for (const auto& n : g_.nodes()) {
      const ir::ValueId in = reshape_input(n);
      if (in != ir::kNoValue) {
        const auto& s = g_.value(in).meta.sizes;
        shape_[n.outputs[0].values[0]] = std::vector<int64_t>(s.begin(), s.end());
        source_[n.outputs[0].values[0]] = in;
        continue;
      }
      std::vector<int64_t> S;
      std::vector<bool> from_source;
      if (!sinks(n, &S, &from_source)) continue;
      sunk_.insert(n.id);
      from_source_[n.id] = std::move(from_source);
      shape_[n.outputs[0].values[0]] = S;
      source_[n.outputs[0].values[0]] = n.outputs[0].values[0];
    }
    // Values read only by sunk ops, as the values they reshape, need no reshape (back).
    for (const auto& [v, S] : shape_) {
      bool needed = graph_outputs.count(v) > 0;
      for (ir::NodeId u : g_.users(v)) {
        if (!sunk_.count(u)) {
          needed = true;
          continue;
        }
        const auto& args = g_.node(u).args;
        for (size_t i = 0; i < args.size(); ++i) {
          const bool reads_v = args[i].kind == ir::ArgKind::Value && args[i].values[0] == v;
          if (reads_v && !from_source_.at(u)[i]) needed = true;
        }
      }
      if (!needed) unread_.insert(v);
    }
    if (!sunk_.empty()) {
      d->decisions.push_back(std::to_string(sunk_.size()) +
                             " pointwise ops computed above the reshape of their operands (Note [Reshapes sunk below "
                             "pointwise ops])");
    }
  }
  bool selected(const ir::Node& n) const override {
    if (sunk_.empty()) return false;
    if (sunk_.count(n.id)) return true;
    return reshape_input(n) != ir::kNoValue;  // to note its input, and to drop it when unread
  }
  bool rewrite(const ir::Node& n) override {
    const ir::ValueId out = n.outputs[0].values[0];
    if (!sunk_.count(n.id)) {  // a reshape
      const ir::ValueId in = reshape_input(n);
      in_shape_[out] = map_.at(in);
      if (!unread_.count(out)) ir::copy_node(g_, n, out_, map_);
      return false;
    }
    const std::vector<int64_t>& S = shape_.at(out);
    const std::vector<bool>& from_source = from_source_.at(n.id);
    ir::Node m = n;
    for (size_t i = 0; i < m.args.size(); ++i) {
      ir::Arg& a = m.args[i];
      if (a.kind != ir::ArgKind::Value) continue;
      const ir::ValueId v = a.values[0];
      if (from_source[i]) {
        a.values[0] = in_shape_.at(v);
      } else if (g_.value(v).meta.sizes.empty()) {
        a.values[0] = map_.at(v);
      } else {
        a.values[0] = view(n, map_.at(v), S);
      }
    }
    ir::TensorMeta meta = g_.value(out).meta;
    meta.sizes.assign(S.begin(), S.end());
    const ir::TensorMeta dm = dense_meta(meta.dtype, S, meta.device);
    meta.strides = dm.strides;
    const auto id = static_cast<ir::NodeId>(out_.nodes().size());
    const ir::ValueId made = out_.new_value(id, 0, -1, meta);
    m.outputs = {ir::Arg::value(made)};
    out_.add_node(std::move(m));
    in_shape_[out] = made;
    if (!unread_.count(out)) {
      const auto& s = g_.value(out).meta.sizes;
      const ir::ValueId back = view(n, made, std::vector<int64_t>(s.begin(), s.end()));
      out_.value(back).meta = g_.value(out).meta;
      map_[out] = back;
    }
    return true;
  }

  std::map<ir::ValueId, std::vector<int64_t>> shape_;  // in g_: the shape S a value is a dense reshape of
  std::map<ir::ValueId, ir::ValueId> source_;          // in g_: the value of shape S it reshapes
  std::set<ir::NodeId> sunk_;
  std::map<ir::NodeId, std::vector<bool>> from_source_;  // per sunk node (sinks())
  std::set<ir::ValueId> unread_;                       // in g_: reshapes only sunk ops read
  std::map<ir::ValueId, ir::ValueId> in_shape_;        // g_ value -> out_ value of shape S
};

}  // namespace

Decomposed sink_reshapes(const ir::Graph& g) { return ReshapeSinker(g, c10::Device(c10::kCPU)).run(); }

}  // namespace tcap::fuse
