// Note [Global state guards] (cache/guards.h): what a call's thread and process state is,
// and how it is compared with an entry's.
#include "cache/guards.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/anomaly_mode.h>

#include <sstream>

namespace tcap::cache {

namespace {

// The device types autocast knows (get_autocast_dispatch_key_from_device_type).
constexpr c10::DeviceType kAutocastDevices[] = {
    c10::DeviceType::CPU, c10::DeviceType::CUDA, c10::DeviceType::XPU, c10::DeviceType::MPS,
    c10::DeviceType::HPU, c10::DeviceType::XLA,  c10::DeviceType::IPU, c10::DeviceType::MTIA,
    c10::DeviceType::MAIA, c10::DeviceType::PrivateUse1};

bool autocast_on(uint64_t excluded, c10::DeviceType t) {
  return !c10::DispatchKeySet(c10::DispatchKeySet::RAW, excluded)
              .has(at::autocast::get_autocast_dispatch_key_from_device_type(t));
}

std::string key_names(uint64_t raw) {
  std::ostringstream s;
  s << c10::DispatchKeySet(c10::DispatchKeySet::RAW, raw);
  return s.str();
}

}  // namespace

GlobalState GlobalState::now() {
  GlobalState g;
  g.grad_mode = at::GradMode::is_enabled();
  g.default_dtype = c10::get_default_dtype_as_scalartype();
  g.inference_mode = c10::InferenceMode::is_enabled();
  const c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
  g.included_keys = keys.included_.raw_repr();
  g.excluded_keys = keys.excluded_.raw_repr();
  for (c10::DeviceType t : kAutocastDevices) {
    if (autocast_on(g.excluded_keys, t)) g.autocast_dtypes.emplace_back(t, at::autocast::get_autocast_dtype(t));
  }
  g.context = read_context();
  g.anomaly = torch::autograd::AnomalyMode::is_enabled();
  g.anomaly_check_nan = g.anomaly && torch::autograd::AnomalyMode::should_check_nan();
  return g;
}

bool GlobalState::matches_now() const {
  if (at::GradMode::is_enabled() != grad_mode || c10::InferenceMode::is_enabled() != inference_mode) return false;
  if (c10::get_default_dtype_as_scalartype() != default_dtype) return false;
  const c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
  if (keys.included_.raw_repr() != included_keys || keys.excluded_.raw_repr() != excluded_keys) return false;
  // Which devices autocast is on for follows from the excluded keys, equal here: only the
  // dtypes of those that are on remain to compare.
  for (const auto& [t, dtype] : autocast_dtypes) {
    if (at::autocast::get_autocast_dtype(t) != dtype) return false;
  }
  if (!context_matches(context)) return false;
  if (torch::autograd::AnomalyMode::is_enabled() != anomaly) return false;
  return !anomaly || torch::autograd::AnomalyMode::should_check_nan() == anomaly_check_nan;
}

bool GlobalState::operator==(const GlobalState& o) const {
  return grad_mode == o.grad_mode && default_dtype == o.default_dtype && inference_mode == o.inference_mode &&
         included_keys == o.included_keys &&
         excluded_keys == o.excluded_keys &&
         context == o.context &&
         anomaly == o.anomaly && anomaly_check_nan == o.anomaly_check_nan && autocast_dtypes == o.autocast_dtypes;
}

bool GlobalState::autocast(c10::DeviceType t) const { return autocast_on(excluded_keys, t); }

std::string GlobalState::mismatch(const GlobalState& now) const {
  if (*this == now) return "";
  if (now.grad_mode != grad_mode) return std::string("grad mode changed: ") + (grad_mode ? "on -> off" : "off -> on");
  if (now.default_dtype != default_dtype) {
    return "the default dtype changed: " + ir::dtype_name(default_dtype) + " -> " + ir::dtype_name(now.default_dtype);
  }
  if (now.inference_mode != inference_mode) {
    return std::string("inference mode changed: ") + (inference_mode ? "on -> off" : "off -> on");
  }
  for (c10::DeviceType t : kAutocastDevices) {
    if (autocast(t) != now.autocast(t)) {
      return "autocast state changed: " + c10::DeviceTypeName(t, /*lower_case=*/true) + " autocast " +
             (autocast(t) ? "on -> off" : "off -> on");
    }
  }
  if (autocast_dtypes != now.autocast_dtypes) return "autocast state changed: another autocast dtype";
  if (std::string c = context_mismatch(context, now.context); !c.empty()) return c;
  if (now.anomaly != anomaly || now.anomaly_check_nan != anomaly_check_nan) {
    return std::string("anomaly mode changed: ") + (anomaly ? "on" : "off") + " -> " + (now.anomaly ? "on" : "off");
  }
  return "the thread's dispatch keys changed: included " + key_names(included_keys) + " -> " +
         key_names(now.included_keys) + ", excluded " + key_names(excluded_keys) + " -> " + key_names(now.excluded_keys);
}

}  // namespace tcap::cache
