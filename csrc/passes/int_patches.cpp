#include "passes/int_patches.h"

#include <algorithm>
#include <optional>
#include <sstream>

namespace tcap::passes {
namespace {

std::string arg_str(const ir::Arg& a) {
  std::ostringstream s;
  switch (a.kind) {
    case ir::ArgKind::Int: s << a.i; break;
    case ir::ArgKind::Bool: s << (a.i ? "true" : "false"); break;
    case ir::ArgKind::Double: s << a.d; break;
    case ir::ArgKind::IntList:
    case ir::ArgKind::BoolList: {
      s << '[';
      for (size_t k = 0; k < a.ints.size(); ++k) s << (k ? ", " : "") << a.ints[k];
      s << ']';
      break;
    }
    case ir::ArgKind::Value: s << '%' << (a.values.empty() ? -1 : a.values[0]); break;
    case ir::ArgKind::String:
    case ir::ArgKind::Device: s << '"' << a.s << '"'; break;
    default: s << ir::to_string(a.kind);
  }
  return s.str();
}

std::string node_str(const ir::Node& n) {
  if (n.kind != ir::NodeKind::Call) return ir::to_string(n.kind) + (n.name.empty() ? "" : " '" + n.name + "'");
  std::string s = n.qualified_op() + "(";
  for (size_t k = 0; k < n.args.size(); ++k) s += (k ? ", " : "") + arg_str(n.args[k]);
  return s + ")";
}

std::string dims_str(const ir::Dims& d) {
  std::string s = "[";
  for (size_t k = 0; k < d.size(); ++k) s += (k ? ", " : "") + std::to_string(d[k]);
  return s + "]";
}

}  // namespace

namespace {

// Whether a and b differ only in strides that say nothing about where an element is: those
// of dims of size 1, and all of a tensor without elements. ATen's contiguity and view rules
// ignore them, and so does every kernel's addressing (an index that is always 0). A
// transposed batch of one ([t, 1, c].transpose(0, 1)) records [c, c, 1] where a contiguous
// one records [t * c, c, 1], and the two are the same call.
bool same_but_meaningless_strides(const ir::Value& a, const ir::Value& b) {
  if (a.meta.sizes != b.meta.sizes || a.meta.strides.size() != b.meta.strides.size() ||
      a.meta.strides.size() != a.meta.sizes.size()) {
    return false;
  }
  ir::Value na = a, nb = b;
  const bool empty = a.meta.numel() == 0;
  for (size_t d = 0; d < a.meta.sizes.size(); ++d) {
    if (empty || a.meta.sizes[d] == 1) na.meta.strides[d] = nb.meta.strides[d] = 0;
  }
  return na == nb;
}

}  // namespace

std::string first_difference(const ir::Graph& want, const ir::Graph& got) {
  const size_t n = std::min(want.nodes().size(), got.nodes().size());
  for (size_t i = 0; i < n; ++i) {
    const ir::Node& a = want.nodes()[i];
    const ir::Node& b = got.nodes()[i];
    if (a == b) continue;
    const std::string where = "node %" + std::to_string(i);
    if (a.kind != b.kind || a.op != b.op || a.overload != b.overload || a.args.size() != b.args.size()) {
      return where + " is " + node_str(b) + " where the entry has " + node_str(a);
    }
    for (size_t k = 0; k < a.args.size(); ++k) {
      if (a.args[k] == b.args[k]) continue;
      const std::string name = b.args[k].name.empty() ? "argument " + std::to_string(k) : "argument '" + b.args[k].name + "'";
      return where + " (" + b.qualified_op() + ") " + name + " is " + arg_str(b.args[k]) + " where the entry has " +
             arg_str(a.args[k]);
    }
    if (a.outputs.size() == b.outputs.size()) {
      for (size_t k = 0; k < a.outputs.size(); ++k) {
        if (!(a.outputs[k] == b.outputs[k])) {
          return where + " (" + b.qualified_op() + ") result " + std::to_string(k) + " is " + arg_str(b.outputs[k]) +
                 " where the entry has " + arg_str(a.outputs[k]);
        }
      }
    }
    return where + " (" + b.qualified_op() + ") differs in its results, phase, grad mode or hook";
  }
  if (want.nodes().size() != got.nodes().size()) {
    const bool more = got.nodes().size() > want.nodes().size();
    const ir::Node& extra = more ? got.nodes()[n] : want.nodes()[n];
    return "it records " + std::to_string(got.nodes().size()) + " nodes where the entry has " +
           std::to_string(want.nodes().size()) + "; from node %" + std::to_string(n) + " on, " +
           (more ? "it records " : "the entry has ") + node_str(extra) + (more ? "" : " which it does not record");
  }
  for (size_t v = 0; v < want.values().size() && v < got.values().size(); ++v) {
    const auto& a = want.values()[v];
    const auto& b = got.values()[v];
    if (a == b || same_but_meaningless_strides(a, b)) continue;
    const std::string where = "value %" + std::to_string(v);
    if (a.meta.sizes != b.meta.sizes) {
      return where + " has shape " + dims_str(b.meta.sizes) + " where the entry has " + dims_str(a.meta.sizes);
    }
    if (a.meta.strides != b.meta.strides) {
      return where + " has strides " + dims_str(b.meta.strides) + " where the entry has " + dims_str(a.meta.strides);
    }
    return where + " differs in dtype, device, storage offset, requires_grad or aliasing";
  }
  if (want.values().size() != got.values().size()) return "the two graphs have different numbers of values";
  if (!(want.hooks() == got.hooks())) return "the graphs differ in their hooks";
  return "";
}

namespace {

// The contiguous stride of dim d of `sizes` (ATen's: sizes of 0 count as 1).
int64_t contiguous_stride(const ir::Dims& sizes, size_t d) {
  int64_t s = 1;
  for (size_t k = d + 1; k < sizes.size(); ++k) s *= std::max<int64_t>(sizes[k], 1);
  return s;
}

// m and add with x = m * sa + add and y = m * sb + add (m != 0); nullopt where none.
std::optional<std::pair<int64_t, int64_t>> linear_fit(int64_t x, int64_t y, int64_t sa, int64_t sb) {
  const int64_t da = sa - sb;
  if (da == 0 || (x - y) % da != 0) return std::nullopt;
  const int64_t m = (x - y) / da;
  if (m == 0) return std::nullopt;
  return std::make_pair(m, y - m * sb);
}

// m with x = m * pa and y = m * pb, pa and pb products of sizes at the two captures (m != 0);
// nullopt where none.
std::optional<int64_t> product_fit(int64_t x, int64_t y, int64_t pa, int64_t pb) {
  if (pa == 0 || pb == 0 || pa == pb || x % pa != 0 || y % pb != 0 || x / pa != y / pb || x / pa == 0) return std::nullopt;
  return x / pa;
}

// One step of the order in find_int_patches' header: `form` 0 (m * s), 1 (m * s * s'),
// 2 (m * s + c) or 3 (a derived size itself), over the classes alone or over combinations
// that involve a derived size.
struct Step {
  int form;
  enum Over { Classes, Derived } over;
};

}  // namespace

bool follows_sizes(int64_t x, int64_t y, const std::vector<std::pair<int64_t, int64_t>>& sizes, bool affine) {
  for (size_t c = 0; c < sizes.size(); ++c) {
    const auto [sa, sb] = sizes[c];
    if (const auto f = linear_fit(x, y, sa, sb); f && (affine || f->second == 0)) return true;
    for (size_t c2 = c; c2 < sizes.size(); ++c2) {
      if (product_fit(x, y, sa * sizes[c2].first, sb * sizes[c2].second)) return true;
    }
  }
  return false;
}

std::string find_int_patches(const ir::Graph& ga, const ir::Graph& gb,
                             const std::vector<std::pair<int64_t, int64_t>>& sizes, std::vector<IntPatch>& patches,
                             bool first_fit, size_t num_classes) {
  if (ga.nodes().size() != gb.nodes().size() || ga.values().size() != gb.values().size()) {
    return "the graphs at the two sizes differ in structure";
  }
  const size_t nc = std::min(num_classes, sizes.size());
  const bool derived = nc < sizes.size();
  // Note [Sizes the ops derive]: without derived sizes, the three forms over the classes.
  std::vector<Step> steps, offset_steps;
  if (!derived) {
    steps = {{0, Step::Classes}, {1, Step::Classes}, {2, Step::Classes}};
    offset_steps = steps;
  } else {
    steps = {{0, Step::Classes}, {3, Step::Derived}, {1, Step::Classes}, {1, Step::Derived},
             {0, Step::Derived}, {2, Step::Classes}, {2, Step::Derived}};
    // A view's storage offset is its start times a stride: where a start is derived (host
    // code divided a size), 4 * floor(n / 2) is 2 * n at two even n, and the derived
    // explanation is the one a view's offset has.
    offset_steps = {{3, Step::Derived}, {0, Step::Derived}, {1, Step::Derived}, {0, Step::Classes},
                    {1, Step::Classes}, {2, Step::Classes}, {2, Step::Derived}};
  }
  auto in = [&](Step::Over over, size_t c, int c2) {
    const bool any_derived = c >= nc || (c2 >= 0 && static_cast<size_t>(c2) >= nc);
    return (over == Step::Derived) == any_derived;
  };
  bool ambiguous = false;
  auto explain = [&](int64_t x, int64_t y, IntPatch p) {
    if (x == y) return true;
    for (const Step& step : p.kind == IntPatch::Offset ? offset_steps : steps) {
      bool found = false;
      IntPatch best = p;
      auto take = [&](size_t c, int c2, int64_t m, int64_t add) {
        if (found) {
          if (!first_fit) ambiguous = true;
          return;
        }
        found = true;
        best.size = c;
        best.size2 = c2;
        best.mul = m;
        best.add = add;
      };
      for (size_t c = 0; c < sizes.size() && !ambiguous; ++c) {
        const auto [sa, sb] = sizes[c];
        if (step.form == 3) {
          if (c >= nc && sa == x && sb == y) take(c, -1, 1, 0);
          continue;
        }
        if (step.form == 0 || step.form == 2) {
          if (!in(step.over, c, -1)) continue;
          if (const auto f = linear_fit(x, y, sa, sb); f && (step.form == 2 || f->second == 0)) {
            take(c, -1, f->first, f->second);
          }
          continue;
        }
        for (size_t c2 = c; c2 < sizes.size() && !ambiguous; ++c2) {
          if (!in(step.over, c, static_cast<int>(c2))) continue;
          if (const auto m = product_fit(x, y, sa * sizes[c2].first, sb * sizes[c2].second)) {
            take(c, static_cast<int>(c2), *m, 0);
          }
        }
      }
      if (ambiguous) return false;
      if (found) {
        patches.push_back(best);
        return true;
      }
    }
    return false;
  };
  auto fail = [&](const std::string& why) {
    return ambiguous ? why + " (it follows two of the changed sizes alike)" : why;
  };
  for (size_t i = 0; i < gb.nodes().size(); ++i) {
    const auto& na = ga.nodes()[i];
    const auto& nb = gb.nodes()[i];
    const std::string where = "node %" + std::to_string(i) + " (" + nb.qualified_op() + ")";
    if (na.kind != nb.kind || na.op != nb.op || na.overload != nb.overload || na.phase != nb.phase ||
        na.hook != nb.hook || na.args.size() != nb.args.size() || na.outputs != nb.outputs) {
      return "the graphs at the two sizes differ at " + where;
    }
    for (size_t k = 0; k < nb.args.size(); ++k) {
      const auto& x = na.args[k];
      const auto& y = nb.args[k];
      if (x.kind != y.kind) return "argument kinds differ at " + where;
      if (x.kind == ir::ArgKind::Int) {
        if (!explain(x.i, y.i, {IntPatch::Arg, static_cast<int64_t>(i), k, 0, 0, 0, 0})) {
          return fail("an integer argument of " + where + " does not follow the changed sizes");
        }
      } else if (x.kind == ir::ArgKind::IntList) {
        if (x.ints.size() != y.ints.size()) return "an int list of " + where + " changed length";
        for (size_t e = 0; e < x.ints.size(); ++e) {
          if (!explain(x.ints[e], y.ints[e], {IntPatch::ArgList, static_cast<int64_t>(i), k, e, 0, 0, 0})) {
            return fail("an int list argument of " + where + " does not follow the changed sizes");
          }
        }
      } else if (!(x == y)) {
        return "argument '" + y.name + "' of " + where + " changes with the size (" + ir::to_string(y.kind) + ")";
      }
    }
  }
  for (size_t v = 0; v < gb.values().size(); ++v) {
    const auto& ma = ga.values()[v].meta;
    const auto& mb = gb.values()[v].meta;
    if (ma.dtype != mb.dtype || ma.device != mb.device || ma.sizes.size() != mb.sizes.size() ||
        ma.strides.size() != mb.strides.size() || ga.values()[v].version_of != gb.values()[v].version_of ||
        ga.values()[v].view_of != gb.values()[v].view_of) {
      return "value %" + std::to_string(v) + " differs between the two sizes";
    }
    const auto vid = static_cast<int64_t>(v);
    const size_t first_size = patches.size();
    for (size_t d = 0; d < mb.sizes.size(); ++d) {
      if (!explain(ma.sizes[d], mb.sizes[d], {IntPatch::Size, vid, d, 0, 0, 0, 0})) {
        return fail("the shape of %" + std::to_string(v) + " does not follow the changed sizes");
      }
    }
    // Note [Sizes the ops derive]: the strides of a contiguous value whose sizes follow a
    // derived size are its sizes' (a product of derived sizes two captures cannot tell
    // from a product of classes: 8 * ceil(s / 2)^2 is 2 * s^2 at even sizes).
    bool follows_derived = false;
    for (size_t k = first_size; k < patches.size(); ++k) {
      follows_derived = follows_derived || patches[k].size >= nc || (patches[k].size2 >= 0 && static_cast<size_t>(patches[k].size2) >= nc);
    }
    if (follows_derived && ma.is_contiguous() && mb.is_contiguous()) {
      for (size_t d = 0; d < mb.strides.size(); ++d) {
        if (ma.strides[d] == mb.strides[d]) continue;
        IntPatch p{IntPatch::Stride, vid, d, 0, 0, 0, 0};
        p.layout = true;
        patches.push_back(p);
      }
    } else {
      for (size_t d = 0; d < mb.strides.size(); ++d) {
        if (!explain(ma.strides[d], mb.strides[d], {IntPatch::Stride, vid, d, 0, 0, 0, 0})) {
          return fail("the shape of %" + std::to_string(v) + " does not follow the changed sizes");
        }
      }
    }
    if (!explain(ma.storage_offset, mb.storage_offset, {IntPatch::Offset, vid, 0, 0, 0, 0, 0})) {
      return fail("the storage offset of %" + std::to_string(v) + " does not follow the changed sizes");
    }
  }
  return "";
}

int64_t patch_value(const ir::Graph& g, const IntPatch& p, const std::vector<int64_t>& sizes) {
  if (p.layout) return contiguous_stride(g.value(p.where).meta.sizes, p.index);
  return p.value(sizes);
}

void apply_int_patches(ir::Graph& g, const std::vector<IntPatch>& patches, const std::vector<int64_t>& sizes) {
  for (const auto& p : patches) {
    const int64_t v = patch_value(g, p, sizes);
    switch (p.kind) {
      case IntPatch::Arg: g.edit_constant(p.where, p.index, [v](ir::Arg& a) { a.i = v; }); break;
      case IntPatch::ArgList:
        g.edit_constant(p.where, p.index, [v, &p](ir::Arg& a) { a.ints.at(p.element) = v; });
        break;
      case IntPatch::Size: g.value(p.where).meta.sizes[p.index] = v; break;
      case IntPatch::Stride: g.value(p.where).meta.strides[p.index] = v; break;
      case IntPatch::Offset: g.value(p.where).meta.storage_offset = v; break;
    }
  }
}

}  // namespace tcap::passes
