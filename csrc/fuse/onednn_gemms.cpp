#include "fuse/onednn_gemms.h"

#include "fuse/rewriter.h"

#include <set>
#include <unordered_map>

namespace tcap::fuse {
namespace {

bool one(const ir::Arg& a) {
  return (a.kind == ir::ArgKind::Int && a.i == 1) || (a.kind == ir::ArgKind::Double && a.d == 1.0);
}

// Why node n stays ATen's (before measuring), or "".
std::string refusal(const ir::Graph& g, const ir::Node& n, bool addmm) {
  const size_t a = addmm ? 1 : 0;
  if (n.args.size() != (addmm ? 5u : 2u) || n.outputs.size() != 1) return "unexpected arguments";
  if (ir::reads_host_scalar(g, n)) return "a host scalar argument";
  if (!n.args[a].is_value() || !n.args[a + 1].is_value()) return "unexpected arguments";
  if (addmm && (!n.args[0].is_value() || !one(n.args[3]) || !one(n.args[4]))) return "beta or alpha is not 1";
  const auto& am = g.value(n.args[a].values[0]).meta;
  const auto& bm = g.value(n.args[a + 1].values[0]).meta;
  const auto& om = g.value(n.outputs[0].values[0]).meta;
  for (const auto* m : {&am, &bm, &om}) {
    if (m->dtype != c10::kFloat) return "not float32";
    if (!m->device.is_cpu()) return "not on the CPU";
    if (m->sizes.size() != 2) return "not two-dimensional";
  }
  if (!om.is_contiguous()) return "its result is not row-major";
  if (addmm) {
    const auto& bias = g.value(n.args[0].values[0]).meta;
    if (bias.dtype != c10::kFloat || bias.sizes.size() != 1 || bias.sizes[0] != bm.sizes[1] || !bias.is_contiguous()) {
      return "its self is not one row of bias";
    }
  }
  if (am.sizes[0] * am.sizes[1] * bm.sizes[1] < kMinOneDnnMacs) return "too small";
  return "";
}

// Whether product n (which `refusal` accepts) goes through oneDNN, by `choose`; asked
// with a bias where n is an addmm or `bias_after` (an mm whose bias an add adds after it).
bool chosen(const ir::Graph& g, const ir::Node& n, const GemmChooser& choose, bool bias_after, std::string* why) {
  const bool addmm = n.op == "aten::addmm";
  const size_t a = addmm ? 1 : 0;
  const auto& am = g.value(n.args[a].values[0]).meta;
  const auto& bm = g.value(n.args[a + 1].values[0]).meta;
  return choose(am.sizes[0], am.sizes[1], bm.sizes[1], std::vector<int64_t>(am.strides.begin(), am.strides.end()),
                std::vector<int64_t>(bm.strides.begin(), bm.strides.end()), addmm || bias_after, why);
}

// Product n as tcap::onednn_mm(self, mat2, bias, activation), its operands mapped by `map`.
std::vector<ir::Arg> onednn_args(const ir::Node& n, const std::unordered_map<ir::ValueId, ir::ValueId>& map,
                                 const char* activation) {
  const bool addmm = n.op == "aten::addmm";
  const size_t a = addmm ? 1 : 0;
  std::vector<ir::Arg> args{ir::Arg::value(map.at(n.args[a].values[0]), "self"),
                            ir::Arg::value(map.at(n.args[a + 1].values[0]), "mat2"),
                            addmm ? ir::Arg::value(map.at(n.args[0].values[0]), "bias") : ir::Arg::none("bias")};
  ir::Arg act;
  act.kind = ir::ArgKind::String;
  act.s = activation;
  act.name = "activation";
  args.push_back(std::move(act));
  return args;
}

class GemmRewriter : public Rewriter {
 public:
  GemmRewriter(const ir::Graph& g, const GemmChooser& choose) : Rewriter(g, c10::Device(c10::kCPU)), choose_(choose) {}

 private:
  void plan(Decomposed* d) override {
    for (const auto& n : g_.nodes()) {
      const bool mm = is_call(n, "aten::mm"), addmm = is_call(n, "aten::addmm");
      if (!mm && !addmm) continue;
      std::string why = refusal(g_, n, addmm);
      const bool yes = why.empty() && chosen(g_, n, choose_, false, &why);
      if (yes) chosen_.insert(n.id);
      d->decisions.push_back("node %" + std::to_string(n.id) + " (" + n.qualified_op() + ") " +
                             (yes ? "runs as tcap::onednn_mm: " : "stays ATen's: ") + why);
    }
  }

  bool selected(const ir::Node& n) const override { return chosen_.count(n.id) > 0; }

  bool rewrite(const ir::Node& n) override {
    result(n, 0, call(n, "tcap::onednn_mm", "", onednn_args(n, map_, "none"), g_.value(n.outputs[0].values[0]).meta));
    return true;
  }

  const GemmChooser& choose_;
  std::set<ir::NodeId> chosen_;
};

// Note [ReLU inside the product] (runtime/onednn_gemm.cpp): relu(p), relu(view(p)) or
// relu(view(p) + bias) (a Linear over a 3-d input: mm, _unsafe_view, add_) of a product p
// that goes through oneDNN, each op the only reader of the one before.
class ReluRewriter : public Rewriter {
 public:
  ReluRewriter(const ir::Graph& g, const GemmChooser& choose, const GemmChooser& choose_relu)
      : Rewriter(g, c10::Device(c10::kCPU)), choose_(choose), choose_relu_(choose_relu) {}

 private:
  struct Match {
    ir::NodeId product = -1, view = -1, add = -1;
    std::string reason;  // the measurement's, when the ReLU goes inside
    ir::ValueId bias = ir::kNoValue;  // the bias an add after the product adds (a Linear over a 3-d input)
  };

  bool only_reader(ir::ValueId v, ir::NodeId n) const {
    const auto users = g_.users(v);
    return users.size() == 1 && users[0] == n;
  }

  const ir::Node& producer(ir::ValueId v) const { return g_.node(g_.value(v).producer); }

  // Whether node p adds a bias row of the last dim's size to its self, which only p
  // reads: add(x, bias) or add_(x, bias) with alpha 1.
  bool adds_bias(const ir::Node& p) const {
    if (p.kind != ir::NodeKind::Call || (p.op != "aten::add" && p.op != "aten::add_") || p.overload != "Tensor" ||
        p.args.size() != 3 || !p.args[0].is_value() || !p.args[1].is_value() || !one(p.args[2])) {
      return false;
    }
    const auto& x = g_.value(p.args[0].values[0]).meta;
    const auto& b = g_.value(p.args[1].values[0]).meta;
    return !x.sizes.empty() && b.dtype == c10::kFloat && b.sizes.size() == 1 && b.sizes[0] == x.sizes.back() &&
           b.is_contiguous() && only_reader(p.args[0].values[0], p.id);
  }

  // The product under ReLU node r: relu([add bias]([view](mm or addmm))), each step the
  // only reader of the one before. False when r reads no product; else true, with *why
  // empty when the ReLU goes inside.
  bool match(const ir::Node& r, Match* m, std::string* why) const {
    if (r.args.size() != 1 || !r.args[0].is_value() || r.outputs.size() != 1) return false;
    ir::ValueId v = r.args[0].values[0];
    ir::NodeId reader = r.id;
    const ir::Node* p = &producer(v);
    if (p->kind == ir::NodeKind::Call && adds_bias(*p) && only_reader(v, reader)) {
      m->add = p->id;
      m->bias = p->args[1].values[0];
      reader = p->id;
      v = p->args[0].values[0];
      p = &producer(v);
    }
    if (p->kind == ir::NodeKind::Call && (is_call(*p, "aten::view") || is_call(*p, "aten::_unsafe_view")) &&
        !p->args.empty() && p->args[0].is_value() && only_reader(v, reader)) {
      m->view = p->id;
      reader = p->id;
      v = p->args[0].values[0];
      p = &producer(v);
    }
    const bool addmm = is_call(*p, "aten::addmm");
    if (!addmm && !is_call(*p, "aten::mm")) return false;
    if (!only_reader(v, reader)) {
      *why = "node %" + std::to_string(p->id) + "'s result has other readers";
      return true;
    }
    *why = refusal(g_, *p, addmm);
    if (why->empty() && addmm && m->add >= 0) *why = "a bias added twice";
    if (why->empty() && m->add >= 0 && g_.value(m->bias).meta.sizes[0] != g_.value(v).meta.sizes.back()) {
      *why = "the add's row is not the product's";
    }
    if (!why->empty()) return true;
    // Measured as the product with its bias (an addmm, or the mm and the add after it).
    std::string reason;
    if (!chosen(g_, *p, choose_, m->add >= 0, &reason)) {
      *why = "the product stays ATen's: " + reason;
    } else if (!chosen(g_, *p, choose_relu_, m->add >= 0, &reason)) {
      *why = "measured slower inside: " + reason;
    } else {
      m->reason = reason;
    }
    m->product = p->id;
    return true;
  }

  void plan(Decomposed* d) override {
    for (const auto& n : g_.nodes()) {
      if (!is_call(n, "aten::relu")) continue;
      Match m;
      std::string why;
      if (!match(n, &m, &why)) continue;
      if (!why.empty()) {
        d->decisions.push_back("node %" + std::to_string(n.id) + " (aten::relu) stays after its product: " + why);
        continue;
      }
      matches_[n.id] = m;
      for (ir::NodeId id : {m.product, m.view, m.add}) {
        if (id >= 0) skipped_.insert(id);
      }
      d->decisions.push_back("node %" + std::to_string(n.id) + " (aten::relu) runs inside tcap::onednn_mm with node %" +
                             std::to_string(m.product) + (m.add >= 0 ? " and the bias of node %" + std::to_string(m.add) : "") +
                             ": " + m.reason);
    }
  }

  bool selected(const ir::Node& n) const override { return matches_.count(n.id) > 0 || skipped_.count(n.id) > 0; }

  // The product (its bias, and the view) are made at the ReLU, their only reader.
  bool rewrite(const ir::Node& n) override {
    auto it = matches_.find(n.id);
    if (it == matches_.end()) return false;
    const ir::Node& p = g_.node(it->second.product);
    std::vector<ir::Arg> args = onednn_args(p, map_, "relu");
    if (it->second.bias != ir::kNoValue) args[2] = ir::Arg::value(map_.at(it->second.bias), "bias");
    ir::ValueId y = call(p, "tcap::onednn_mm", "", std::move(args), g_.value(p.outputs[0].values[0]).meta);
    if (it->second.view >= 0) {
      const auto& sizes = g_.value(n.outputs[0].values[0]).meta.sizes;
      y = view(g_.node(it->second.view), y, std::vector<int64_t>(sizes.begin(), sizes.end()));
    }
    result(n, 0, y);
    return true;
  }

  const GemmChooser& choose_;
  const GemmChooser& choose_relu_;
  std::unordered_map<ir::NodeId, Match> matches_;
  std::set<ir::NodeId> skipped_;
};

}  // namespace

Decomposed relu_inside_gemms(const ir::Graph& g, const GemmChooser& choose, const GemmChooser& choose_relu) {
  return ReluRewriter(g, choose, choose_relu).run();
}

Decomposed gemms_through_onednn(const ir::Graph& g, const GemmChooser& choose) { return GemmRewriter(g, choose).run(); }

}  // namespace tcap::fuse
