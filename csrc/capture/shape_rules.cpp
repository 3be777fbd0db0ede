#include "capture/shape_rules.h"

#include "support/logging.h"

#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <mutex>
#include <vector>

namespace tcap::capture {
namespace {

bool integral(const at::Tensor& t) { return t.defined() && c10::isIntegralType(t.scalar_type(), /*includeBool=*/true); }

// Whether any tensor argument holds integers or booleans; whether any is not a plain
// strided tensor (sparse, quantized, nested: not probed).
void scan(const c10::IValue& v, bool& reads_integral, bool& unprobeable) {
  auto one = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    if (t.layout() != c10::kStrided || t.is_quantized() || t.is_nested() || t.device().is_meta()) unprobeable = true;
    if (integral(t)) reads_integral = true;
  };
  if (v.isTensor()) {
    one(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) one(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) one(e.toTensor());
    }
  } else if (v.isGenerator() || v.isObject() || v.isCapsule() || v.isStorage()) {
    unprobeable = true;
  }
}

at::Tensor meta_of(const at::Tensor& t) {
  if (!t.defined()) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta).requires_grad(false));
}

// v with each tensor in it (a tensor, a list of tensors, a list of optional tensors)
// replaced by f(tensor); other values as they are.
template <class F>
c10::IValue map_tensors(const c10::IValue& v, F&& f) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(f(t));
    return out;
  }
  if (v.isList() && v.toList().elementType()->kind() == c10::TypeKind::OptionalType) {
    c10::List<std::optional<at::Tensor>> out;
    for (const c10::IValue& e : v.toListRef()) {
      out.push_back(e.isTensor() ? std::optional<at::Tensor>(f(e.toTensor())) : std::nullopt);
    }
    return out;
  }
  return v;
}

std::string shape_str(c10::IntArrayRef s) {
  std::string out = "[";
  for (size_t k = 0; k < s.size(); ++k) out += (k ? ", " : "") + std::to_string(s[k]);
  return out + "]";
}

// Note [Operators without a meta function]
// An operator whose meta call threw once (index_select's meta function lives in Python, so
// embedding's throws from C++) throws again at every later call: the exception, and the
// meta tensors of its probe, would cost each recording of it some microseconds, and each
// check capture of a new size records it again (Note [Checking a new size]). So the first
// throw is remembered per operator, and later probes go straight to the rerun on other
// values, which is what the throw led to anyway. An operator that cannot be run again
// (it writes an argument or draws random numbers) keeps its meta probe at every call.
std::mutex g_without_meta_mutex;
std::vector<bool> g_without_meta;  // by OpInfo::id, under g_without_meta_mutex

bool without_meta(const OpInfo& info) {
  if (!info.rerunnable) return false;  // its probe is the only check it gets
  std::lock_guard<std::mutex> lock(g_without_meta_mutex);
  const auto id = static_cast<size_t>(info.id);
  return id < g_without_meta.size() && g_without_meta[id];
}

void note_without_meta(const OpInfo& info) {
  std::lock_guard<std::mutex> lock(g_without_meta_mutex);
  const auto id = static_cast<size_t>(info.id);
  if (id >= g_without_meta.size()) g_without_meta.resize(id + 1, false);
  g_without_meta[id] = true;
}

}  // namespace

ShapeCheck before_op_shapes(const OpInfo& info, c10::ArrayRef<c10::IValue> args) {
  ShapeCheck c;
  if (!info.returns_tensors) return c;
  // Tagged by LibTorch: recorded like any op; a replay checks its results' sizes (Note
  // [Sizes that come from values], ir/op_facts.h).
  if (info.dynamic_output_shape) return c;
  bool reads_integral = false, unprobeable = false;
  for (const c10::IValue& a : args) scan(a, reads_integral, unprobeable);
  if (!reads_integral || unprobeable) return c;
  torch::jit::Stack probe;
  if (!without_meta(info)) {  // Note [Operators without a meta function]
    probe.reserve(args.size());
    for (const c10::IValue& a : args) probe.push_back(map_tensors(a, meta_of));
  }
  c.probe = std::move(probe);
  if (info.rerunnable) c.args = torch::jit::Stack(args.begin(), args.end());
  return c;
}

namespace {

// The same tensor with other values: integers each one down within the tensor's own range
// (indices stay valid), booleans flipped.
at::Tensor other_values(const at::Tensor& t) {
  if (!integral(t) || t.numel() == 0) return t;
  if (t.scalar_type() == c10::kBool) return t.logical_not();
  return t.sub(1).clamp_min(t.min().item());
}

// "" when `a` and `b` (the returns of two runs) have the same shapes, else what differs.
std::string shapes_differ(const std::string& qualified, c10::ArrayRef<c10::IValue> a, c10::ArrayRef<c10::IValue> b,
                          const char* other) {
  if (a.size() != b.size()) return "";
  for (size_t r = 0; r < a.size(); ++r) {
    auto differs = [&](const at::Tensor& x, const at::Tensor& y) {
      return x.defined() && y.defined() && x.sizes() != y.sizes();
    };
    if (a[r].isTensor() && b[r].isTensor()) {
      if (differs(a[r].toTensor(), b[r].toTensor())) {
        return qualified + " has a data-dependent output shape: its output " + std::to_string(r) + " is " +
               shape_str(a[r].toTensor().sizes()) + " where " + other + " gives " + shape_str(b[r].toTensor().sizes());
      }
    } else if (a[r].isTensorList() && b[r].isTensorList()) {
      const auto x = a[r].toTensorList(), y = b[r].toTensorList();
      if (x.size() != y.size()) return qualified + " has a data-dependent number of outputs";
      for (size_t k = 0; k < x.size(); ++k) {
        if (differs(x[k], y[k])) return qualified + " has a data-dependent output shape";
      }
    }
  }
  return "";
}

}  // namespace

std::string check_with_meta(const c10::OperatorHandle& op, const OpInfo& info, ShapeCheck& check,
                            c10::ArrayRef<c10::IValue> rets, c10::DispatchKey hide) {
  const std::string& qualified = info.qualified;
  c10::impl::ExcludeDispatchKeyGuard off(c10::DispatchKeySet(hide) | c10::autograd_dispatch_keyset);
  if (!without_meta(info)) {
    torch::jit::Stack& probe = *check.probe;
    try {
      op.callBoxed(probe);
      return shapes_differ(qualified, rets, probe, "its meta function for these input shapes");
    } catch (const std::exception& e) {
      TCAP_LOG(Capture, qualified << " has no meta function (" << c10::GetExceptionString(e).substr(0, 160)
                                  << "...): run once more on other integer values, at this and every later call");
      note_without_meta(info);
    }
  }
  if (!check.args) return "";  // writes its arguments or draws random numbers: shapes are its inputs' or arguments'
  torch::jit::Stack again;
  again.reserve(check.args->size());
  for (const c10::IValue& a : *check.args) again.push_back(map_tensors(a, other_values));
  try {
    at::NoGradGuard no_grad;
    op.callBoxed(again);
  } catch (const std::exception&) {
    return qualified + " reads integer tensors, has no meta function to tell its output shapes from its input shapes, "
                       "and refuses other values of them: its output shapes may depend on the values (a "
                       "data-dependent output shape)";
  }
  return shapes_differ(qualified, rets, again, "the same call with other integer values");
}

}  // namespace tcap::capture
