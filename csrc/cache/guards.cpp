#include "cache/guards.h"

#include "ir/op_facts.h"
#include "passes/host_graph.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/anomaly_mode.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <unordered_map>

namespace tcap::cache {
namespace {

std::string shape_str(c10::IntArrayRef s) {
  std::ostringstream ss;
  ss << s;
  return ss.str();
}

bool contiguous_strides(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  int64_t expect = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] != 1 && strides[d] != expect) return false;
    expect *= sizes[d];
  }
  return true;
}

// Note [Guard fast path]
// Most calls hit, and a hit needs no words: for an entry without dynamic dims, one flat
// pass compares each tensor's recorded metadata (defined, identity, dtype, device,
// requires_grad, the captured sizes, strides) with the call's, building nothing. Only when it finds a
// difference does check() run the detailed pass, which says what changed and which sizes
// could become dynamic. The fast pass accepts exactly what the detailed one accepts: for a
// static entry every size must equal the captured one and every stride too.
// Returns whether every tensor matches; `dims` gets the number of tensor dims (the
// position of the plain sizes in Guards::sizes).
bool tensors_match_exactly(const std::vector<TensorGuard>& guards, const std::vector<int64_t>& sizes,
                           c10::ArrayRef<at::Tensor> ts, size_t* dims) {
  size_t pos = 0;
  for (size_t k = 0; k < guards.size(); ++k) {
    const TensorGuard& g = guards[k];
    const at::Tensor& t = ts[k];
    if (t.defined() != g.defined) return false;
    const size_t first = pos;
    pos += g.sizes.size();
    if (!g.defined) continue;
    if (g.identity && t.unsafeGetTensorImpl() != g.identity) return false;
    if (t.scalar_type() != g.dtype || t.device() != g.device || t.requires_grad() != g.requires_grad ||
        (g.check_inference && t.is_inference() != g.inference)) {
      return false;
    }
    if (pos > sizes.size() || t.sizes() != c10::IntArrayRef(sizes.data() + first, g.sizes.size()) ||
        t.strides() != c10::IntArrayRef(g.strides)) {
      return false;
    }
  }
  *dims = pos;
  return true;
}

}  // namespace

// --- GlobalState (Note [Global state guards]) -------------------------------------------

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

std::string TensorGuard::mismatch_except_shape(const at::Tensor& t) const {
  if (t.defined() != defined) return defined ? "became undefined" : "became defined";
  if (!defined) return "";
  if (identity && t.unsafeGetTensorImpl() != identity) return "was replaced by another tensor";
  if (t.scalar_type() != dtype) {
    return "changed dtype: " + ir::dtype_name(dtype) + " -> " + ir::dtype_name(t.scalar_type());
  }
  if (t.device() != device) return "changed device: " + device.str() + " -> " + t.device().str();
  if (t.requires_grad() != requires_grad) {
    return std::string("changed requires_grad: ") + (requires_grad ? "true -> false" : "false -> true");
  }
  if (check_inference && t.is_inference() != inference) {
    return std::string(inference ? "is no longer an inference tensor" : "became an inference tensor (made under "
                                                                         "InferenceMode)");
  }
  return "";
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
  return ir::dtype_short_name(dtype) + shape + (any_dyn ? " contiguous" : " stride " + shape_str(strides)) + " " +
         device.str() + (requires_grad ? " requires_grad" : "") + (check_inference && inference ? " inference" : "");
}

// --- HeldTensors (Note [Held tensors]) ---------------------------------------------------

void HeldTensors::hold(const std::vector<at::Tensor>& tensors, const std::vector<std::string>& names) {
  held_.clear();
  for (size_t k = 0; k < tensors.size(); ++k) {
    Held h;
    h.weak = c10::weak_intrusive_ptr<c10::TensorImpl>(tensors[k].getIntrusivePtr());
    h.impl = tensors[k].unsafeGetTensorImpl();
    h.meta = TensorGuard::of(tensors[k], k < names.size() ? names[k] : "held" + std::to_string(k));
    held_.push_back(std::move(h));
  }
}

std::string HeldTensors::lock(std::vector<at::Tensor>& out) const {
  const size_t first = out.size();
  auto fail = [&](const std::string& why) {
    out.resize(first);
    return why;
  };
  for (const Held& h : held_) {
    // The strong references before this call takes one: the program's and tcap's own.
    const int64_t refs = static_cast<int64_t>(h.weak.use_count()) - h.own->load(std::memory_order_relaxed);
    if (h.weak.expired()) return fail("the tensor '" + h.meta.name + "' it read from outside its inputs was freed");
    if (refs <= 0) {
      return fail("the tensor '" + h.meta.name + "' it read from outside its inputs is no longer referred to by " +
                  "the program (it was replaced)");
    }
    at::Tensor t(h.weak.lock());
    if (!t.defined()) return fail("the tensor '" + h.meta.name + "' it read from outside its inputs was freed");
    std::string m = h.meta.mismatch_except_shape(t);
    if (m.empty() && (t.sizes() != c10::IntArrayRef(h.meta.sizes) || t.strides() != c10::IntArrayRef(h.meta.strides))) {
      m = "changed shape: " + shape_str(h.meta.sizes) + " stride " + shape_str(h.meta.strides) + " -> " +
          shape_str(t.sizes()) + " stride " + shape_str(t.strides());
    }
    if (!m.empty()) return fail("the tensor '" + h.meta.name + "' it read from outside its inputs " + m);
    out.push_back(std::move(t));
  }
  return "";
}

std::vector<std::string> HeldTensors::describe() const {
  std::vector<std::string> out;
  for (const Held& h : held_) out.push_back("held " + h.meta.name + ": " + h.meta.str() + ", alive and referred to by the program");
  return out;
}

OwnRefsLease::OwnRefsLease(const HeldTensors& held, c10::ArrayRef<at::Tensor> tensors) {
  for (size_t k = 0; k < held.size(); ++k) {
    int n = 0;
    for (const auto& t : tensors) n += t.defined() && t.unsafeGetTensorImpl() == held.impl(k);
    if (n == 0) continue;
    held.own_refs(k)->fetch_add(n, std::memory_order_relaxed);
    counts_.emplace_back(held.own_refs(k), n);
  }
}

OwnRefsLease& OwnRefsLease::operator=(OwnRefsLease&& o) noexcept {
  if (this != &o) {
    release();
    counts_ = std::move(o.counts_);
  }
  return *this;
}

void OwnRefsLease::release() {
  for (auto& [counter, n] : counts_) counter->fetch_sub(n, std::memory_order_relaxed);
  counts_.clear();
}

// --- HostReads ---------------------------------------------------------------------

bool has_host_reads(const ir::Graph& g) {
  return std::any_of(g.nodes().begin(), g.nodes().end(), [&](const ir::Node& n) { return ir::reads_on_host(g, n); });
}

void HostReads::set_inline(const ir::Graph& g) {
  *this = HostReads();
  for (const auto& n : g.nodes()) {
    if (n.kind != ir::NodeKind::Call) continue;
    const std::string where = n.qualified_op() + " (node %" + std::to_string(n.id) + ")";
    for (const auto& a : n.outputs) {
      if (!ir::is_host_value(a)) continue;
      what_.push_back(where);
    }
    // Note [Sizes that come from values]: checked by the interpreter, as it runs n.
    if (ir::sizes_from_values(g, n)) sizes_of_.push_back(where);
  }
  if (!empty()) mode_ = Mode::Inline;
}

void HostReads::build_precheck(const ir::Graph& g) {
  *this = HostReads();
  passes::HostGraph h = passes::host_read_graph(g);
  if (h.reads.empty() && h.sizes_read.empty()) return;
  for (const auto& r : h.reads) what_.push_back(r.what);
  sizes_of_ = h.sizes_read;
  graph_ = std::make_shared<Interpreter>(h.graph);
  graph_->keep_values(false);
  // The guard graph's interpreter compares each value read on the host, and the sizes that
  // come from values (Note [Sizes that come from values]), as it runs.
  graph_->check_host_values(true);
  // A read after a training batch norm (MultiheadAttention's equal() after a BatchNorm):
  // the guard graph runs the batch norm too, and must not update the running statistics
  // a second time (Note [Writes a schema does not show]).
  copied_ = ir::hidden_written_inputs(h.graph);
  mode_ = Mode::PreCheck;
}

std::string HostReads::check(const std::vector<at::Tensor>& primals) const {
  if (mode_ != Mode::PreCheck) return "";
  try {
    if (copied_.empty()) {
      graph_->run(primals);
    } else {
      std::vector<at::Tensor> ins = primals;
      for (size_t j : copied_) {
        if (j < ins.size() && ins[j].defined()) ins[j] = ins[j].detach().clone();
      }
      graph_->run(ins);
    }
  } catch (const HostValueChanged& e) {
    return e.what_without_backtrace();
  }
  return "";
}

// --- Guards -------------------------------------------------------------------------

namespace {

const void* alias_key(const at::Tensor& t) {
  return t.defined() && t.has_storage() ? static_cast<const void*>(t.storage().unsafeGetStorageImpl())
                                        : static_cast<const void*>(t.unsafeGetTensorImpl());
}

// Whether ts's alias classes are `classes` (as alias_classes would compute them), without
// building them: every tensor shares its class representative's memory, and the
// representatives' memories are distinct (sorted, not compared pairwise: a step has
// hundreds of tensors).
bool same_alias_classes(c10::ArrayRef<at::Tensor> ts, const std::vector<int>& classes) {
  if (ts.size() != classes.size()) return false;
  c10::SmallVector<const void*, 32> reps;
  for (size_t k = 0; k < ts.size(); ++k) {
    const auto f = static_cast<size_t>(classes[k]);
    if (f == k) {
      reps.push_back(alias_key(ts[k]));
    } else if (f > k || alias_key(ts[k]) != alias_key(ts[f])) {
      return false;
    }
  }
  std::sort(reps.begin(), reps.end());
  return std::adjacent_find(reps.begin(), reps.end()) == reps.end();
}

// Where t's data starts relative to `first`'s, in bytes (both in one storage), or
// kSameTensor.
int64_t relative_start(const at::Tensor& t, const at::Tensor& first) {
  if (t.unsafeGetTensorImpl() == first.unsafeGetTensorImpl()) return AliasGeometry::kSameTensor;
  if (!t.has_storage() || !first.has_storage()) return 0;
  return t.storage_offset() * static_cast<int64_t>(t.itemsize()) -
         first.storage_offset() * static_cast<int64_t>(first.itemsize());
}

std::string relation(int64_t r) {
  return r == AliasGeometry::kSameTensor ? "the same tensor" : "a view " + std::to_string(r) + " bytes from its start";
}

}  // namespace

std::vector<int> alias_classes(c10::ArrayRef<at::Tensor> ts) {
  std::vector<const void*> keys(ts.size());
  for (size_t k = 0; k < ts.size(); ++k) keys[k] = alias_key(ts[k]);
  std::vector<int> out(ts.size());
  if (ts.size() <= 32) {  // the usual case: no hashing
    for (size_t k = 0; k < ts.size(); ++k) {
      size_t f = 0;
      while (keys[f] != keys[k]) ++f;
      out[k] = static_cast<int>(f);
    }
    return out;
  }
  std::unordered_map<const void*, int> first;
  for (size_t k = 0; k < ts.size(); ++k) out[k] = first.emplace(keys[k], static_cast<int>(k)).first->second;
  return out;
}

AliasGeometry AliasGeometry::of(c10::ArrayRef<at::Tensor> ts) {
  AliasGeometry a;
  a.classes = alias_classes(ts);
  a.relative.assign(ts.size(), 0);
  for (size_t k = 0; k < ts.size(); ++k) {
    const auto f = static_cast<size_t>(a.classes[k]);
    if (f != k) a.relative[k] = relative_start(ts[k], ts[f]);
  }
  return a;
}

bool AliasGeometry::matches(c10::ArrayRef<at::Tensor> ts) const {
  if (!same_alias_classes(ts, classes)) return false;
  for (size_t k = 0; k < ts.size(); ++k) {
    const auto f = static_cast<size_t>(classes[k]);
    if (f != k && relative_start(ts[k], ts[f]) != relative[k]) return false;
  }
  return true;
}

std::string AliasGeometry::mismatch(c10::ArrayRef<at::Tensor> ts, const std::function<std::string(size_t)>& name) const {
  if (matches(ts)) return "";
  if (!same_alias_classes(ts, classes)) {
    const std::vector<int> now = alias_classes(ts);
    for (size_t k = 0; k < ts.size() && k < classes.size(); ++k) {
      if (now[k] == classes[k]) continue;
      const auto was = static_cast<size_t>(classes[k]), is = static_cast<size_t>(now[k]);
      if (was != k) return "inputs that shared memory changed: " + name(k) + " no longer shares memory with " + name(was);
      return "inputs that shared memory changed: " + name(k) + " shares memory with " + name(is) + " now";
    }
    return "inputs that shared memory changed";
  }
  for (size_t k = 0; k < ts.size(); ++k) {
    const auto f = static_cast<size_t>(classes[k]);
    if (f == k) continue;
    const int64_t r = relative_start(ts[k], ts[f]);
    if (r != relative[k]) {
      return "inputs that share memory share it another way: " + name(k) + " was " + relation(relative[k]) + " of " +
             name(f) + ", now " + relation(r);
    }
  }
  return "";
}

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
  if (check_global && !global.matches_now()) {
    std::string g = global.mismatch(GlobalState::now());
    if (!g.empty()) hard(std::move(g));
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
  SizeCheck fit(dyn, sizes);
  size_t pos = 0;
  // See Note [Guard fast path].
  const bool exact = !dyn.dynamic() && tensors_match_exactly(tensors, sizes, call.tensors, &pos);
  for (size_t k = 0; k < tensors.size() && !exact; ++k) {
    const TensorGuard& g = tensors[k];
    const at::Tensor& t = call.tensors[k];
    const size_t first = pos;
    pos += g.sizes.size();
    std::string why = g.mismatch_except_shape(t);
    if (!why.empty()) {
      hard("input '" + g.name + "' " + why);
      continue;
    }
    if (!g.defined) continue;
    if (t.dim() != static_cast<int64_t>(g.sizes.size())) {
      hard("input '" + g.name + "' changed shape: " + shape_str(g.sizes) + " -> " + shape_str(t.sizes()));
      continue;
    }
    bool resized = false, any_dyn = false;
    for (size_t d = 0; d < g.sizes.size(); ++d) {
      any_dyn = any_dyn || dyn.is_dynamic(first + d);
      if (!fit.fits(first + d, t.size(static_cast<int64_t>(d)))) {
        resized = true;
        m.changed.push_back(first + d);
      }
    }
    if (resized) {
      const bool candidate = t.is_contiguous() && contiguous_strides(g.sizes, g.strides);
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
      if (!t.is_contiguous()) hard("input '" + g.name + "' is no longer contiguous (its dynamic dims need it)");
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

std::string Guards::check_primals(const std::vector<at::Tensor>& primals, bool* host_only) const {
  if (host_only) *host_only = false;
  // Note [Alias geometry guards]
  if (!aliases.matches(primals)) {
    return aliases.mismatch(primals, [&](size_t k) {
      return "'" + (k < tensors.size() ? tensors[k].name : held.name(k - tensors.size())) + "'";
    });
  }
  std::string why = host.check(primals);
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
  if (tensor_dims) os << ", the tensors with a symbolic size contiguous";
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
