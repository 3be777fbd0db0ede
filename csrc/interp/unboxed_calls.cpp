// Note [Unboxed extern calls]
// Why: DESIGN.md D12 has compiled graphs call extern ATen kernels directly, with argument
// lists resolved at compile time, as Inductor's C++ wrapper does. Through the dispatcher a
// call copies its node's prepared IValue stack, computes the dispatch key set from its
// tensors, looks the kernel up, and the boxed wrapper unboxes every argument and boxes the
// results again: about 80 ns of a tiny op's 480 (docs/overhead.md, "Extern ATen calls").
//
// How: for the ops compiled training steps keep as ATen calls (matmuls, convolutions and
// their backward, pooling, the loss, the views and factories around them, the
// multi-tensor optimizer updates), an adapter calls the kernel LibTorch registers for the
// CPU key (`at::cpu::` for a CPU kernel, `at::compositeexplicitautograd::` for a composite
// one), with its constant arguments (sizes, strides, scalars, dtypes) converted once from
// the prepared stack and its tensors read from the interpreter's environment. The
// interpreter uses it where the dispatcher would go straight to that kernel anyway:
//   - below autograd (a non-differentiable interpreter), with no mode key in the thread's
//     included set and the default keys still excluded (no capture recording the run, no
//     autocast, no functorch or Python mode), as for fused kernels, and no RecordFunction
//     observer installed (a profiler sees every ATen op, as it did);
//   - every tensor read is a plain dense CPU tensor: its key set holds no key beyond a
//     fresh CPU tensor's (a conjugate or negative view, a wrapper or a tensor on another
//     device takes the dispatcher, which handles it);
//   - when built, this LibTorch registers the kernel the adapter calls: a CPU kernel for an
//     `at::cpu::` adapter, none but the composite one for a composite adapter; factories
//     only for a CPU (or absent) device argument.
// Anything else is a boxed call as before, so an op without an adapter, or a call that
// fails a check, is never wrong, only slower. The adapters are written against the
// schemas of the LibTorch this project pins; an argument of an unexpected kind leaves
// the node boxed.
#include "interp/unboxed_calls.h"

#include "support/logging.h"

#include <ATen/CPUFunctions.h>
#include <ATen/CompositeExplicitAutogradFunctions.h>
#include <c10/core/DispatchKeySet.h>

#include <array>
#include <atomic>
#include <optional>

namespace tcap::interp {

namespace {

std::atomic<bool> g_off{false};
std::atomic<int64_t> g_made{0};

// The keys a plain dense CPU tensor may carry (a fresh one has them all; an inference
// tensor lacks the autograd ones).
const uint64_t kPlainCpuKeys = (c10::DispatchKeySet(c10::DispatchKey::CPU) |
                                c10::getAutogradRelatedKeySetFromBackend(c10::BackendComponent::CPUBit) |
                                c10::getAutocastRelatedKeySetFromBackend(c10::BackendComponent::CPUBit))
                                   .raw_repr();

using Env = UnboxedCall::Env;

// Reads a node's arguments for an adapter: tensors as value ids (collected for the
// accepts() check), constants converted from the prepared stack. Any argument of another
// kind than the adapter expects clears ok.
class Args {
 public:
  Args(const ir::Node& n, const torch::jit::Stack& prepared) : n_(n), prepared_(prepared) {}
  bool ok = true;
  std::vector<ir::ValueId> ids;

  ir::ValueId tensor(size_t i) {
    const ir::Arg* a = arg(i);
    if (!a || a->kind != ir::ArgKind::Value || a->values.size() != 1) return fail();
    ids.push_back(a->values[0]);
    return a->values[0];
  }
  std::optional<ir::ValueId> opt_tensor(size_t i) {
    const ir::Arg* a = arg(i);
    if (a && (a->kind == ir::ArgKind::None || a->kind == ir::ArgKind::UndefinedTensor)) return std::nullopt;
    return tensor(i);
  }
  std::vector<ir::ValueId> tensors(size_t i) {
    const ir::Arg* a = arg(i);
    if (!a || a->kind != ir::ArgKind::ValueList) return fail(), std::vector<ir::ValueId>{};
    for (ir::ValueId v : a->values) {
      if (v == ir::kNoValue) return fail(), std::vector<ir::ValueId>{};
    }
    ids.insert(ids.end(), a->values.begin(), a->values.end());
    return std::vector<ir::ValueId>(a->values.begin(), a->values.end());
  }
  std::vector<int64_t> ints(size_t i) {
    const c10::IValue* v = constant(i);
    if (!v || !v->isIntList()) return fail(), std::vector<int64_t>{};
    return v->toIntVector();
  }
  std::optional<std::vector<int64_t>> opt_ints(size_t i) {
    const c10::IValue* v = constant(i);
    if (v && v->isNone()) return std::nullopt;
    return ints(i);
  }
  int64_t integer(size_t i) {
    const c10::IValue* v = constant(i);
    if (!v || !v->isInt()) return fail(), 0;
    return v->toInt();
  }
  // A float argument: read from the prepared stack at each call (a host scalar input,
  // such as Adam's bias-corrected step size, changes between calls).
  size_t real(size_t i) {
    const c10::IValue* v = per_call(i);
    if (!v || !v->isDouble()) fail();
    return i;
  }
  bool boolean(size_t i) {
    const c10::IValue* v = constant(i);
    if (!v || !v->isBool()) return fail(), false;
    return v->toBool();
  }
  // A Scalar argument: read from the prepared stack at each call, as real() is.
  size_t scalar(size_t i) {
    const c10::IValue* v = per_call(i);
    if (!v || !(v->isInt() || v->isDouble() || v->isBool() || v->isComplexDouble())) fail();
    return i;
  }
  template <class E>
  std::optional<E> opt_enum(size_t i) {
    const c10::IValue* v = constant(i);
    if (v && v->isNone()) return std::nullopt;
    if (!v || !v->isInt()) return fail(), std::nullopt;
    return static_cast<E>(v->toInt());
  }
  std::optional<bool> opt_bool(size_t i) {
    const c10::IValue* v = constant(i);
    if (v && v->isNone()) return std::nullopt;
    return boolean(i);
  }
  // A factory's device: None or the CPU (the adapters call CPU kernels).
  std::optional<at::Device> cpu_device(size_t i) {
    const c10::IValue* v = constant(i);
    if (v && v->isNone()) return std::nullopt;
    if (!v || !v->isDevice() || v->toDevice().type() != c10::DeviceType::CPU) return fail(), std::nullopt;
    return v->toDevice();
  }
  // A factory's dtype, layout, device (the CPU's, or none) and pin_memory, from `first` on.
  struct Factory {
    std::optional<at::ScalarType> dtype;
    std::optional<at::Layout> layout;
    std::optional<at::Device> device;
    std::optional<bool> pin;
  };
  Factory factory(size_t first) {
    return {opt_enum<at::ScalarType>(first), opt_enum<at::Layout>(first + 1), cpu_device(first + 2),
            opt_bool(first + 3)};
  }
  std::array<bool, 3> bools3(size_t i) {
    const c10::IValue* v = constant(i);
    if (!v || !v->isBoolList() || v->toBoolList().size() != 3) return fail(), std::array<bool, 3>{};
    const auto l = v->toBoolList();
    return {l.get(0), l.get(1), l.get(2)};
  }

 private:
  const ir::Arg* arg(size_t i) const { return i < n_.args.size() ? &n_.args[i] : nullptr; }
  // A number the adapter reads at each call: a constant, or an argument that reads a host
  // scalar input, which the interpreter writes into the prepared stack before each run
  // (Note [Host scalars as graph inputs]; its placeholder there is a number, not None).
  const c10::IValue* per_call(size_t i) {
    const ir::Arg* a = arg(i);
    if (a && a->kind == ir::ArgKind::Value && i < prepared_.size() && !prepared_[i].isNone()) return &prepared_[i];
    return constant(i);
  }
  const c10::IValue* constant(size_t i) {
    const ir::Arg* a = arg(i);
    if (!a || a->refers_to_values() || i >= prepared_.size()) return fail(), nullptr;
    return &prepared_[i];
  }
  ir::ValueId fail() {
    ok = false;
    return ir::kNoValue;
  }
  const ir::Node& n_;
  const torch::jit::Stack& prepared_;
};

std::optional<at::Tensor> opt(const Env& e, const std::optional<ir::ValueId>& v) {
  return v ? std::optional<at::Tensor>(e[static_cast<size_t>(*v)]) : std::nullopt;
}

std::vector<at::Tensor> list(const Env& e, const std::vector<ir::ValueId>& ids) {
  std::vector<at::Tensor> l;
  l.reserve(ids.size());
  for (ir::ValueId v : ids) l.push_back(e[static_cast<size_t>(v)]);
  return l;
}

const at::Tensor& at_(const Env& e, ir::ValueId v) { return e[static_cast<size_t>(v)]; }

double real(const torch::jit::Stack& p, size_t i) { return p[i].toDouble(); }
c10::Scalar scalar(const torch::jit::Stack& p, size_t i) { return p[i].toScalar(); }

enum class Kernel { Cpu, Composite };

// The adapter's body for node n, or null when it has none (then `kernel` is unset).
UnboxedCall::Body body_for(const ir::Node& n, Args& a, Kernel* kernel) {
  namespace cpu = at::cpu;
  namespace cea = at::compositeexplicitautograd;
  const std::string& op = n.op;
  const std::string& ov = n.overload;
  *kernel = Kernel::Cpu;
  if (op == "aten::mm" && ov.empty()) {
    auto x = a.tensor(0), y = a.tensor(1);
    return [=](const Env& e, const torch::jit::Stack& pre) { return std::vector<at::Tensor>{cpu::mm(at_(e, x), at_(e, y))}; };
  }
  if (op == "aten::addmm" && ov.empty()) {
    auto s = a.tensor(0), x = a.tensor(1), y = a.tensor(2);
    auto beta = a.scalar(3), alpha = a.scalar(4);
    return [=](const Env& e, const torch::jit::Stack& pre) {
      return std::vector<at::Tensor>{cpu::addmm(at_(e, s), at_(e, x), at_(e, y), scalar(pre, beta), scalar(pre, alpha))};
    };
  }
  if (op == "aten::view" && ov.empty()) {
    auto s = a.tensor(0);
    auto size = a.ints(1);
    return [=](const Env& e, const torch::jit::Stack& pre) { return std::vector<at::Tensor>{cpu::view(at_(e, s), size)}; };
  }
  if (op == "aten::max_pool2d_with_indices" && ov.empty()) {
    auto s = a.tensor(0);
    auto k = a.ints(1), st = a.ints(2), p = a.ints(3), d = a.ints(4);
    auto ceil = a.boolean(5);
    return [=](const Env& e, const torch::jit::Stack& pre) {
      auto [out, idx] = cpu::max_pool2d_with_indices(at_(e, s), k, st, p, d, ceil);
      return std::vector<at::Tensor>{std::move(out), std::move(idx)};
    };
  }
  if (op == "aten::max_pool2d_with_indices_backward" && ov.empty()) {
    auto g = a.tensor(0), s = a.tensor(1);
    auto k = a.ints(2), st = a.ints(3), p = a.ints(4), d = a.ints(5);
    auto ceil = a.boolean(6);
    auto idx = a.tensor(7);
    return [=](const Env& e, const torch::jit::Stack& pre) {
      return std::vector<at::Tensor>{
          cpu::max_pool2d_with_indices_backward(at_(e, g), at_(e, s), k, st, p, d, ceil, at_(e, idx))};
    };
  }
  if (op == "aten::nll_loss_forward" && ov.empty()) {
    auto s = a.tensor(0), t = a.tensor(1);
    auto w = a.opt_tensor(2);
    auto reduction = a.integer(3), ignore = a.integer(4);
    return [=](const Env& e, const torch::jit::Stack& pre) {
      auto [out, total] = cpu::nll_loss_forward(at_(e, s), at_(e, t), opt(e, w), reduction, ignore);
      return std::vector<at::Tensor>{std::move(out), std::move(total)};
    };
  }
  if (op == "aten::nll_loss_backward" && ov.empty()) {
    auto g = a.tensor(0), s = a.tensor(1), t = a.tensor(2);
    auto w = a.opt_tensor(3);
    auto reduction = a.integer(4), ignore = a.integer(5);
    auto total = a.tensor(6);
    return [=](const Env& e, const torch::jit::Stack& pre) {
      return std::vector<at::Tensor>{
          cpu::nll_loss_backward(at_(e, g), at_(e, s), at_(e, t), opt(e, w), reduction, ignore, at_(e, total))};
    };
  }
  if (op == "aten::empty" && ov == "memory_format") {
    auto size = a.ints(0);
    auto f = a.factory(1);
    auto mf = a.opt_enum<at::MemoryFormat>(5);
    return [=](const Env&, const torch::jit::Stack&) {
      return std::vector<at::Tensor>{cpu::empty(size, f.dtype, f.layout, f.device, f.pin, mf)};
    };
  }
  if (op == "aten::_fused_adam_" && ov.empty()) {
    auto ps = a.tensors(0), g = a.tensors(1), m = a.tensors(2), v = a.tensors(3), vmax = a.tensors(4), st = a.tensors(5);
    auto lr = a.real(6), b1 = a.real(7), b2 = a.real(8), wd = a.real(9), eps = a.real(10);
    auto amsgrad = a.boolean(11), maximize = a.boolean(12);
    auto scale = a.opt_tensor(13), inf = a.opt_tensor(14);
    return [=](const Env& e, const torch::jit::Stack& pre) {
      cpu::_fused_adam_(list(e, ps), list(e, g), list(e, m), list(e, v), list(e, vmax), list(e, st), real(pre, lr),
                        real(pre, b1), real(pre, b2), real(pre, wd), real(pre, eps), amsgrad, maximize, opt(e, scale),
                        opt(e, inf));
      return std::vector<at::Tensor>{};
    };
  }
  if (op == "aten::_fused_sgd_" && ov.empty()) {
    auto ps = a.tensors(0), g = a.tensors(1), buf = a.tensors(2);
    auto wd = a.real(3), momentum = a.real(4), lr = a.real(5), dampening = a.real(6);
    auto nesterov = a.boolean(7), maximize = a.boolean(8), first = a.boolean(9);
    auto scale = a.opt_tensor(10), inf = a.opt_tensor(11);
    return [=](const Env& e, const torch::jit::Stack& pre) {
      cpu::_fused_sgd_(list(e, ps), list(e, g), list(e, buf), real(pre, wd), real(pre, momentum), real(pre, lr),
                       real(pre, dampening), nesterov, maximize, first, opt(e, scale), opt(e, inf));
      return std::vector<at::Tensor>{};
    };
  }
  *kernel = Kernel::Composite;
  if (op == "aten::t" && ov.empty()) {
    auto s = a.tensor(0);
    return [=](const Env& e, const torch::jit::Stack& pre) { return std::vector<at::Tensor>{cea::t(at_(e, s))}; };
  }
  if (op == "aten::detach" && ov.empty()) {
    auto s = a.tensor(0);
    return [=](const Env& e, const torch::jit::Stack& pre) { return std::vector<at::Tensor>{cea::detach(at_(e, s))}; };
  }
  if (op == "aten::ones_like" && ov.empty()) {
    auto s = a.tensor(0);
    auto f = a.factory(1);
    auto mf = a.opt_enum<at::MemoryFormat>(5);
    return [=](const Env& e, const torch::jit::Stack&) {
      return std::vector<at::Tensor>{cea::ones_like(at_(e, s), f.dtype, f.layout, f.device, f.pin, mf)};
    };
  }
  if (op == "aten::full" && ov.empty()) {
    auto size = a.ints(0);
    auto value = a.scalar(1);
    auto f = a.factory(2);
    return [=](const Env&, const torch::jit::Stack& pre) {
      return std::vector<at::Tensor>{cea::full(size, scalar(pre, value), f.dtype, f.layout, f.device, f.pin)};
    };
  }
  if (op == "aten::convolution" && ov.empty()) {
    auto x = a.tensor(0), w = a.tensor(1);
    auto b = a.opt_tensor(2);
    auto stride = a.ints(3), padding = a.ints(4), dilation = a.ints(5);
    auto transposed = a.boolean(6);
    auto out_pad = a.ints(7);
    auto groups = a.integer(8);
    return [=](const Env& e, const torch::jit::Stack& pre) {
      return std::vector<at::Tensor>{
          cea::convolution(at_(e, x), at_(e, w), opt(e, b), stride, padding, dilation, transposed, out_pad, groups)};
    };
  }
  if (op == "aten::convolution_backward" && ov.empty()) {
    auto g = a.tensor(0), x = a.tensor(1), w = a.tensor(2);
    auto bias_sizes = a.opt_ints(3);
    auto stride = a.ints(4), padding = a.ints(5), dilation = a.ints(6);
    auto transposed = a.boolean(7);
    auto out_pad = a.ints(8);
    auto groups = a.integer(9);
    auto mask = a.bools3(10);
    return [=](const Env& e, const torch::jit::Stack& pre) {
      auto [gi, gw, gb] = cea::convolution_backward(
          at_(e, g), at_(e, x), at_(e, w), bias_sizes ? at::OptionalIntArrayRef(*bias_sizes) : at::OptionalIntArrayRef(),
          stride, padding, dilation, transposed, out_pad, groups, mask);
      return std::vector<at::Tensor>{std::move(gi), std::move(gw), std::move(gb)};
    };
  }
  if (op == "aten::copy_" && ov.empty()) {
    auto s = a.tensor(0), src = a.tensor(1);
    auto non_blocking = a.boolean(2);
    return [=](const Env& e, const torch::jit::Stack& pre) {
      at::Tensor self = at_(e, s);
      cea::copy_(self, at_(e, src), non_blocking);
      return std::vector<at::Tensor>{std::move(self)};
    };
  }
  if (op == "aten::add_" && ov == "Scalar") {
    auto s = a.tensor(0);
    auto other = a.scalar(1), alpha = a.scalar(2);
    return [=](const Env& e, const torch::jit::Stack& pre) {
      at::Tensor self = at_(e, s);
      cea::add_(self, scalar(pre, other), scalar(pre, alpha));
      return std::vector<at::Tensor>{std::move(self)};
    };
  }
  return nullptr;
}

}  // namespace

bool UnboxedCall::accepts(const Env& env) const {
  for (ir::ValueId v : tensors_) {
    const at::Tensor& t = env[static_cast<size_t>(v)];
    if (!t.defined()) return false;
    const uint64_t keys = t.key_set().raw_repr();
    if ((keys & ~kPlainCpuKeys) != 0 || !t.key_set().has(c10::DispatchKey::CPU)) return false;
  }
  return true;
}

std::vector<at::Tensor> UnboxedCall::run(const Env& env, const torch::jit::Stack& prepared) const {
  g_made.fetch_add(1, std::memory_order_relaxed);
  return body_(env, prepared);
}

std::unique_ptr<UnboxedCall> make_unboxed_call(const ir::Node& n, const c10::OperatorHandle& op,
                                               const torch::jit::Stack& prepared) {
  if (g_off.load(std::memory_order_relaxed) || !Config::get().unboxed_calls || n.kind != ir::NodeKind::Call) {
    return nullptr;  // TCAP_UNBOXED_CALLS=0: every extern op through the dispatcher
  }
  Args a(n, prepared);
  Kernel kernel = Kernel::Cpu;
  UnboxedCall::Body body = body_for(n, a, &kernel);
  if (!body || !a.ok) return nullptr;
  // The kernel the dispatcher would reach for the CPU key must be the one the adapter calls.
  const bool registered = kernel == Kernel::Cpu
                              ? op.hasKernelForDispatchKey(c10::DispatchKey::CPU)
                              : !op.hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
                                    op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd);
  if (!registered) return nullptr;
  return std::make_unique<UnboxedCall>(std::move(body), std::move(a.ids));
}

void disable_unboxed_calls_for_testing(bool off) { g_off.store(off, std::memory_order_relaxed); }

int64_t unboxed_calls_made() { return g_made.load(std::memory_order_relaxed); }

}  // namespace tcap::interp
