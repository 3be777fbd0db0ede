#include "cache/verify.h"

#include "support/logging.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <sstream>

namespace tcap::cache {

Tolerance Tolerances::of(c10::ScalarType t) const {
  if (exact || !(c10::isFloatingType(t) || c10::isComplexType(t))) return Tolerance{};
  if (t == c10::kDouble || t == c10::kComplexDouble) return Tolerance{false, 1e-9, 1e-12};
  if (t == c10::kHalf || t == c10::kBFloat16) return Tolerance{false, 1e-2, 1e-3};
  return Tolerance{false, 1e-4, 1e-5};
}

Tolerances Tolerances::for_options(const CompileOptions& o) {
  Tolerances t;
  t.exact = o.backend == Backend::Eager && !o.fw_compiler && !o.bw_compiler && !o.fused_optimizers;
  return t;
}

namespace {

// Note [Verify tolerances]: atol times eager's largest finite magnitude when that is above 1.
double scaled_atol(const Tolerance& tol, const at::Tensor& eager) {
  if (!(eager.is_floating_point() || eager.is_complex())) return tol.atol;
  const double scale = eager.abs().nan_to_num(0, 0, 0).max().item<double>();
  return tol.atol * std::max(1.0, scale);
}

}  // namespace

std::string compare_tensors(const at::Tensor& compiled, const at::Tensor& eager, const Tolerances& tols) {
  if (compiled.defined() != eager.defined()) {
    return compiled.defined() ? "defined where eager's is undefined" : "undefined where eager's is defined";
  }
  if (!compiled.defined()) return "";
  std::ostringstream s;
  if (compiled.sizes() != eager.sizes()) {
    s << "shape " << compiled.sizes() << " where eager's is " << eager.sizes();
    return s.str();
  }
  if (compiled.scalar_type() != eager.scalar_type()) {
    s << "dtype " << compiled.scalar_type() << " where eager's is " << eager.scalar_type();
    return s.str();
  }
  if (compiled.device() != eager.device()) {
    s << "on " << compiled.device() << " where eager's is on " << eager.device();
    return s.str();
  }
  if (compiled.numel() == 0) return "";
  if (compiled.layout() != eager.layout()) {
    s << "layout " << compiled.layout() << " where eager's is " << eager.layout();
    return s.str();
  }
  const Tolerance tol = tols.of(compiled.scalar_type());
  at::NoGradGuard no_grad;
  // Sparse gradients (an Embedding's with sparse=true) are compared as the dense tensors
  // they stand for: their index lists may be ordered or coalesced differently.
  const bool sparse = compiled.layout() != c10::kStrided;
  const at::Tensor c = sparse ? compiled.detach().to_dense() : compiled.detach();
  const at::Tensor e = sparse ? eager.detach().to_dense() : eager.detach();
  bool same = false;
  if (tol.exact) {
    at::Tensor eq = at::eq(c, e);
    if (c.is_floating_point() || c.is_complex()) eq = eq.logical_or(at::isnan(c).logical_and(at::isnan(e)));
    same = eq.all().item<bool>();
  } else {
    same = at::allclose(c, e, tol.rtol, scaled_atol(tol, e), /*equal_nan=*/true);
  }
  if (same) return "";
  // Where: the element furthest outside the tolerance, measured as |c - e| / (atol + rtol |e|)
  // (NaN where the other is not counts as infinite); the element with the largest absolute
  // difference can be well inside it when its value is large.
  const bool fp = c.is_floating_point() || c.is_complex();
  at::Tensor diff = fp ? (c.to(at::kDouble) - e.to(at::kDouble)).abs() : c.ne(e).to(at::kDouble);
  if (fp) diff = diff.nan_to_num(std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity());
  at::Tensor excess = diff;
  if (fp && !tol.exact) excess = diff / (e.to(at::kDouble).abs().nan_to_num(0, 0, 0) * tol.rtol + scaled_atol(tol, e));
  const int64_t flat = excess.reshape(-1).argmax().item<int64_t>();
  std::vector<int64_t> index(static_cast<size_t>(c.dim()));
  int64_t rest = flat;
  for (int64_t d = c.dim() - 1; d >= 0; --d) {
    index[static_cast<size_t>(d)] = rest % c.size(d);
    rest /= c.size(d);
  }
  const at::Tensor cf = c.reshape(-1)[flat].to(at::kDouble), ef = e.reshape(-1)[flat].to(at::kDouble);
  s << "a difference of " << diff.reshape(-1)[flat].item<double>()
    << " at " << c10::IntArrayRef(index)
    << " (compiled " << cf.item<double>() << ", eager " << ef.item<double>() << "; ";
  if (tol.exact) s << "compared exactly";
  else s << "rtol " << tol.rtol << ", atol " << scaled_atol(tol, e) << "; the element furthest outside them";
  s << ")";
  return s.str();
}

VerifyOptions verify_options_for(const CompileOptions& options) {
  return options.verify ? *options.verify : verify_options();
}

void report_mismatch(const VerifyOptions& v, const VerifyReport& r) {
  const std::string msg = "tcap verify: " + r.who + " replayed differently from eager: " + r.what + " has " + r.how +
                          ". Likely cause: " + r.likely;
  TCAP_LOG(Verify, msg);
  if (!v.log_only) throw VerifyError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg);
  TORCH_WARN(msg);
}

void report_match(const std::string& who, size_t compared) {
  TCAP_LOG(Verify, who << " matched eager (" << compared << " tensors compared)");
}

}  // namespace tcap::cache
