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

// Note [One check, with or without words] (guards.h): the calling thread's state read
// field by field, as a hit needs, and a difference worded from the same reading.
bool GlobalState::check_now(const Why& why) const {
  const bool grad_now = at::GradMode::is_enabled();
  if (grad_now != grad_mode) {
    return why([&] { return std::string("grad mode changed: ") + (grad_mode ? "on -> off" : "off -> on"); });
  }
  const c10::ScalarType dtype_now = c10::get_default_dtype_as_scalartype();
  if (dtype_now != default_dtype) {
    return why([&] {
      return "the default dtype changed: " + ir::dtype_name(default_dtype) + " -> " + ir::dtype_name(dtype_now);
    });
  }
  const bool inference_now = c10::InferenceMode::is_enabled();
  if (inference_now != inference_mode) {
    return why([&] { return std::string("inference mode changed: ") + (inference_mode ? "on -> off" : "off -> on"); });
  }
  const c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
  const uint64_t included_now = keys.included_.raw_repr(), excluded_now = keys.excluded_.raw_repr();
  if (included_now != included_keys || excluded_now != excluded_keys) {
    return why([&] {
      // Which devices autocast is on for follows from the excluded keys: named first.
      for (c10::DeviceType t : kAutocastDevices) {
        if (autocast(t) != autocast_on(excluded_now, t)) {
          return "autocast state changed: " + c10::DeviceTypeName(t, /*lower_case=*/true) + " autocast " +
                 (autocast(t) ? "on -> off" : "off -> on");
        }
      }
      return "the thread's dispatch keys changed: included " + key_names(included_keys) + " -> " +
             key_names(included_now) + ", excluded " + key_names(excluded_keys) + " -> " + key_names(excluded_now);
    });
  }
  // The excluded keys are equal: autocast is on for the same devices, only the dtypes of
  // those that are on remain to compare.
  for (const auto& [t, dtype] : autocast_dtypes) {
    if (at::autocast::get_autocast_dtype(t) != dtype) {
      return why([&] { return std::string("autocast state changed: another autocast dtype"); });
    }
  }
  if (!context_matches(context)) return why([&] { return context_mismatch(context, read_context()); });
  const bool anomaly_now = torch::autograd::AnomalyMode::is_enabled();
  const bool check_nan_now = anomaly_now && torch::autograd::AnomalyMode::should_check_nan();
  if (anomaly_now != anomaly || check_nan_now != anomaly_check_nan) {
    return why([&] {
      return std::string("anomaly mode changed: ") + (anomaly ? "on" : "off") + " -> " + (anomaly_now ? "on" : "off");
    });
  }
  return true;
}

bool GlobalState::autocast(c10::DeviceType t) const { return autocast_on(excluded_keys, t); }

}  // namespace tcap::cache
