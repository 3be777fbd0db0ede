// An entry's guards checked against a call (Guards::check, Note [One check, with or without
// words] in guards.h), and what each tensor guard remembers. The other kinds live beside
// this file, one each: global_state.cpp, held_tensors.cpp, host_reads.cpp,
// alias_geometry.cpp.
#include "cache/guards.h"

#include <algorithm>
#include <sstream>

namespace tcap::cache {

std::string shape_str(c10::IntArrayRef s) {
  std::ostringstream ss;
  ss << s;
  return ss.str();
}

namespace {

bool contiguous_strides(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  int64_t expect = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] != 1 && strides[d] != expect) return false;
    expect *= sizes[d];
  }
  return true;
}

// Note [Dense inputs of a dynamic entry]
// A dynamic entry's graph follows its inputs' strides through the sizes (a fit, checked at
// each new size), which holds for a tensor whose strides its sizes determine: a dense one,
// its dims laid out in one order (contiguous, channels last, a transposed contiguous
// tensor). So an input with a symbolic size must be dense with its dims in the order it
// was captured in: the outermost dim has the largest stride, ties (dims of size 1, whose
// strides say nothing) broken by dim. The dims of `sizes`, outermost first, where `strides`
// are dense in that order; empty where they are not dense.
template <class Sizes, class Strides>
std::vector<size_t> dense_order(const Sizes& sizes, const Strides& strides) {
  const size_t n = sizes.size();
  std::vector<size_t> order(n);
  for (size_t d = 0; d < n; ++d) order[d] = d;
  // Dims of size 1 go innermost (their strides are meaningless), the others by stride.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const bool one_a = sizes[a] == 1, one_b = sizes[b] == 1;
    if (one_a != one_b) return one_b;
    return !one_a && strides[a] > strides[b];
  });
  int64_t expect = 1;
  for (size_t k = n; k-- > 0;) {
    const size_t d = order[k];
    if (sizes[d] != 1 && strides[d] != expect) return {};
    expect *= std::max<int64_t>(sizes[d], 1);
  }
  return order;
}

// Whether t is dense with the dims of size > 1 in the order the captured guard g's are
// (Note [Dense inputs of a dynamic entry]).
bool same_dense_layout(const at::Tensor& t, const TensorGuard& g) {
  if (t.is_contiguous() && contiguous_strides(g.sizes, g.strides)) return true;
  const auto want = dense_order(g.sizes, g.strides);
  const auto got = dense_order(t.sizes(), t.strides());
  if (want.empty() || got.empty()) return false;
  // Compare the orders of the dims that are not 1 in either.
  std::vector<size_t> a, b;
  for (size_t d : want) {
    if (g.sizes[d] != 1 && t.size(static_cast<int64_t>(d)) != 1) a.push_back(d);
  }
  for (size_t d : got) {
    if (g.sizes[d] != 1 && t.size(static_cast<int64_t>(d)) != 1) b.push_back(d);
  }
  return a == b;
}

}  // namespace

// --- TensorGuard ---------------------------------------------------------------------

TensorGuard TensorGuard::of(const at::Tensor& t, std::string name, bool guard_identity) {
  TensorGuard g;
  g.name = std::move(name);
  g.defined = t.defined();
  if (!g.defined) return g;
  g.dtype = t.scalar_type();
  g.device = t.device();
  g.sizes = t.sizes().vec();
  g.strides = t.strides().vec();
  g.requires_grad = t.requires_grad();
  g.inference = t.is_inference();
  if (guard_identity) g.identity = t.unsafeGetTensorImpl();
  return g;
}

bool TensorGuard::check_except_shape(const at::Tensor& t, const Why& why) const {
  if (t.defined() != defined) return why([&] { return std::string(defined ? "became undefined" : "became defined"); });
  if (!defined) return true;
  if (identity && t.unsafeGetTensorImpl() != identity) {
    return why([] { return std::string("was replaced by another tensor"); });
  }
  if (t.scalar_type() != dtype) {
    return why([&] { return "changed dtype: " + ir::dtype_name(dtype) + " -> " + ir::dtype_name(t.scalar_type()); });
  }
  if (t.device() != device) {
    return why([&] { return "changed device: " + device.str() + " -> " + t.device().str(); });
  }
  if (t.requires_grad() != requires_grad) {
    return why([&] { return std::string("changed requires_grad: ") + (requires_grad ? "true -> false" : "false -> true"); });
  }
  if (check_inference && t.is_inference() != inference) {
    return why([&] {
      return std::string(inference ? "is no longer an inference tensor"
                                   : "became an inference tensor (made under InferenceMode)");
    });
  }
  return true;
}

std::string TensorGuard::str(const DynamicSizes* dyn, size_t first_size) const {
  if (!defined) return "undefined";
  std::string shape = "[";
  bool any_dyn = false;
  for (size_t d = 0; d < sizes.size(); ++d) {
    const int c = dyn && dyn->is_dynamic(first_size + d) ? dyn->size_class[first_size + d] : -1;
    any_dyn = any_dyn || c >= 0;
    shape += (d ? ", " : "") + (c >= 0 ? "s" + std::to_string(c) : std::to_string(sizes[d]));
  }
  shape += "]";
  const std::string layout = contiguous_strides(sizes, strides) ? " contiguous" : " dense in its captured dim order";
  return ir::dtype_short_name(dtype) + shape + (any_dyn ? layout : " stride " + shape_str(strides)) + " " +
         device.str() + (requires_grad ? " requires_grad" : "") + (check_inference && inference ? " inference" : "");
}

// --- Guards -------------------------------------------------------------------------

void Guards::capture_call(const CallView& call, const std::vector<std::string>& names,
                          const std::vector<bool>& guard_identity) {
  global = GlobalState::now();
  tensors.clear();
  sizes.clear();
  for (size_t k = 0; k < call.tensors.size(); ++k) {
    const bool id = k < guard_identity.size() && guard_identity[k];
    tensors.push_back(TensorGuard::of(call.tensors[k], k < names.size() ? names[k] : "in" + std::to_string(k), id));
    // Only where autograd saves tensors does an inference tensor change what eager does.
    tensors.back().check_inference = global.grad_mode && !global.inference_mode;
    for (int64_t s : tensors.back().sizes) sizes.push_back(s);
  }
  if (call.scalars) scalars = *call.scalars;
  structure = std::string(call.structure);
  if (call.sizes) sizes.insert(sizes.end(), call.sizes->begin(), call.sizes->end());
  dyn = DynamicSizes{};
}

Miss Guards::check(const CallView& call, std::vector<int64_t>* key) const {
  Miss m;
  auto hard = [&](std::string why) {
    if (m.reason.empty()) m.reason = std::move(why);
    m.sizes_only = false;
  };
  if (structure != call.structure) {
    hard("the graph's structure changed");
    m.structure = true;
    return m;
  }
  int failing = kNone;  // Note [The failing guard first]
  if (check_global) {
    std::string g;
    if (!global.check_now(Why(&g))) {
      hard(std::move(g));
      failing = kGlobalState;
    }
  }
  if (call.modules) {
    // Note [Module state guards]: a tree that changed also changes the tensors gathered
    // from it, so it is named first.
    std::string why = modules.mismatch(*call.modules);
    if (!why.empty()) {
      hard(std::move(why));
      return m;
    }
  }
  if (call.tensors.size() != tensors.size()) {
    hard("number of inputs changed: " + std::to_string(tensors.size()) + " -> " + std::to_string(call.tensors.size()));
    return m;
  }
  // Note [One check, with or without words]: a tensor that fits builds nothing.
  SizeCheck fit(dyn, sizes);
  size_t pos = 0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const TensorGuard& g = tensors[k];
    const at::Tensor& t = call.tensors[k];
    const size_t first = pos;
    pos += g.sizes.size();
    std::string why;
    if (!g.check_except_shape(t, Why(&why))) {
      hard("input '" + g.name + "' " + why);
      if (failing == kNone) failing = static_cast<int>(k);
      continue;
    }
    if (!g.defined) continue;
    if (t.dim() != static_cast<int64_t>(g.sizes.size())) {
      hard("input '" + g.name + "' changed shape: " + shape_str(g.sizes) + " -> " + shape_str(t.sizes()));
      continue;
    }
    bool resized = false, any_dyn = false;
    // A static entry's sizes fit when they are the captured ones, which one comparison
    // tells; the loop below says which sizes changed, with the same answer.
    const bool same_sizes = !dyn.dynamic() && t.sizes() == c10::IntArrayRef(sizes.data() + first, g.sizes.size());
    for (size_t d = 0; d < g.sizes.size() && !same_sizes; ++d) {
      any_dyn = any_dyn || dyn.is_dynamic(first + d);
      if (!fit.fits(first + d, t.size(static_cast<int64_t>(d)))) {
        resized = true;
        m.changed.push_back(first + d);
      }
    }
    if (resized) {
      const bool candidate = same_dense_layout(t, g);
      const std::string what = "input '" + g.name + "' changed shape: " + shape_str(g.sizes) + " -> " +
                               shape_str(t.sizes()) + (any_dyn ? " (dynamic dims need a size >= 2)" : "");
      if (candidate) {
        if (m.reason.empty()) m.reason = what;
      } else {
        hard(what);
      }
      continue;
    }
    if (any_dyn) {
      if (!same_dense_layout(t, g)) {
        hard("input '" + g.name + "' is no longer dense in the dim order it was captured in (its dynamic dims need it)");
      }
    } else if (t.strides() != c10::IntArrayRef(g.strides)) {
      hard("input '" + g.name + "' changed strides: " + shape_str(g.strides) + " -> " + shape_str(t.strides()));
    }
  }
  if (call.sizes) {
    if (call.sizes->size() != sizes.size() - pos) {
      hard("the number of sizes changed");
      return m;
    }
    for (size_t i = 0; i < call.sizes->size(); ++i) {
      if (!fit.fits(pos + i, (*call.sizes)[i])) m.changed.push_back(pos + i);
    }
    if (!m.changed.empty() && m.reason.empty()) m.reason = "sizes changed";
  }
  if (call.scalars && *call.scalars != scalars) {
    for (size_t i = 0; i < scalars.size() && i < call.scalars->size(); ++i) {
      if (i < scalar_is_input.size() && scalar_is_input[i]) continue;
      if ((*call.scalars)[i] != scalars[i]) {
        std::ostringstream s;
        s << (i < scalar_names.size() ? scalar_names[i] : "host scalar " + std::to_string(i)) << " changed: "
          << scalars[i] << " -> " << (*call.scalars)[i];
        hard(s.str());
        break;
      }
    }
    if (call.scalars->size() != scalars.size()) hard("the number of host scalars changed");
  }
  if (failing != kNone) last_failed.which.store(failing, std::memory_order_relaxed);
  if (m.hit() && dyn.dynamic()) {
    std::vector<int64_t> k = fit.key();
    // Note [Checking a new size]: values checked and refused miss, and not as a size miss
    // (the entry is no candidate to generalize from at them).
    if (dyn.ledger) {
      std::optional<std::string> v = dyn.ledger->verdict(k);
      if (v && !v->empty()) {
        hard("sizes " + shape_str(k) + " of its dynamic dims were checked: " + *v);
        return m;
      }
      m.unchecked_sizes = !v.has_value();
    }
    if (key) *key = std::move(k);
  }
  return m;
}

bool Guards::fails_again(const CallView& call) const {
  const int which = last_failed.which.load(std::memory_order_relaxed);
  if (which == kGlobalState) return check_global && !global.check_now();
  if (which < 0) return false;
  const auto k = static_cast<size_t>(which);
  return k < tensors.size() && k < call.tensors.size() && !tensors[k].check_except_shape(call.tensors[k]);
}

std::string Guards::check_primals(const std::vector<at::Tensor>& primals, bool* host_only) const {
  if (host_only) *host_only = false;
  // Note [Alias geometry guards]
  std::string why;
  const bool aliased_so = aliases.check(
      primals, [&](size_t k) { return "'" + (k < tensors.size() ? tensors[k].name : held.name(k - tensors.size())) + "'"; },
      Why(&why));
  if (!aliased_so) return why;
  why = host.check(primals);
  if (host_only) *host_only = !why.empty();
  return why;
}

std::string Guards::describe_dynamic() const {
  if (!dyn.dynamic()) return "";
  std::vector<std::vector<std::string>> members(dyn.num_classes);
  std::vector<int64_t> captured(dyn.num_classes, 0);
  auto note = [&](size_t pos, std::string name) {
    if (!dyn.is_dynamic(pos) || pos >= sizes.size()) return;
    const auto c = static_cast<size_t>(dyn.size_class[pos]);
    if (c >= members.size()) return;
    // A backward's sizes are labelled by the node that reads them: one label per node.
    if (std::find(members[c].begin(), members[c].end(), name) == members[c].end()) members[c].push_back(std::move(name));
    captured[c] = sizes[pos];
  };
  size_t pos = 0;
  bool tensor_dims = false;
  for (const auto& t : tensors) {
    for (size_t d = 0; d < t.sizes.size(); ++d, ++pos) {
      tensor_dims = tensor_dims || dyn.is_dynamic(pos);
      note(pos, t.name + ".size(" + std::to_string(d) + ")");
    }
  }
  for (size_t k = 0; pos < sizes.size(); ++pos, ++k) {
    note(pos, k < size_labels.size() ? size_labels[k] : "size #" + std::to_string(pos));
  }
  std::ostringstream os;
  for (size_t c = 0; c < members.size(); ++c) {
    os << (c ? "; " : "") << "s" << c;
    for (const auto& m : members[c]) os << " = " << m;
    os << " (captured at " << captured[c] << ")";
  }
  os << "; guarded: ";
  for (size_t c = 0; c < members.size(); ++c) os << (c ? ", " : "") << "s" << c << " >= 2";
  bool shared = false;
  for (const auto& m : members) shared = shared || m.size() > 1;
  if (shared) os << ", the sizes of one symbol equal";
  if (tensor_dims) {
    bool all_contiguous = true;
    for (const auto& t : tensors) all_contiguous = all_contiguous && contiguous_strides(t.sizes, t.strides);
    os << (all_contiguous ? ", the tensors with a symbolic size contiguous"
                          : ", the tensors with a symbolic size dense in their captured dim order");
  }
  os << ", every other size as captured";
  return os.str();
}

std::vector<std::string> Guards::describe() const {
  std::vector<std::string> out;
  size_t pos = 0;
  for (const auto& t : tensors) {
    out.push_back(t.name + ": " + t.str(&dyn, pos) + (t.identity ? " (this very tensor)" : ""));
    pos += t.sizes.size();
  }
  if (check_global) {
    out.push_back(std::string("grad mode ") + (global.grad_mode ? "on" : "off"));
    if (global.inference_mode) out.push_back("inference mode on");
    for (const auto& [t, dtype] : global.autocast_dtypes) {
      out.push_back("autocast on for " + c10::DeviceTypeName(t, true) + " (" + ir::dtype_name(dtype) + ")");
    }
    for (auto& c : describe_context(global.context)) out.push_back(std::move(c));
    out.push_back("the thread's dispatch keys as captured");
  }
  for (auto& d : modules.describe()) out.push_back(std::move(d));
  for (size_t i = 0; i < scalars.size(); ++i) {
    std::ostringstream s;
    s << (i < scalar_names.size() ? scalar_names[i] : "host scalar " + std::to_string(i));
    if (i < scalar_is_input.size() && scalar_is_input[i]) s << " (an input of the graph)";
    else s << " == " << scalars[i];
    out.push_back(s.str());
  }
  for (const auto& h : held.describe()) out.push_back(h);
  for (const auto& w : host.what()) out.push_back("host value of " + w);
  for (const auto& w : host.sizes_of()) out.push_back("the sizes of the results of " + w + ", which come from values");
  return out;
}

}  // namespace tcap::cache
