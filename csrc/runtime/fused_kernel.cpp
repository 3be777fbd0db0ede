#include "runtime/fused_kernel.h"

#include "runtime/background_compiles.h"
#include "runtime/buffer_pool.h"

#include "support/logging.h"

#include <tcap/interpreter.h>

#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <unordered_map>

namespace tcap::runtime {

namespace {

struct Registry {
  std::mutex mu;
  std::unordered_map<int64_t, std::shared_ptr<FusedKernel>> kernels;
  int64_t next = 1;
};

Registry& registry() {
  static auto* r = new Registry();  // leaked: kernels may run during static destruction
  return *r;
}

bool matches(const at::Tensor& t, const ir::TensorMeta& m) {
  if (!t.defined() || t.scalar_type() != m.dtype || t.device() != m.device) return false;
  const auto sizes = t.sizes();
  if (sizes.size() != m.sizes.size()) return false;
  const auto strides = t.strides();
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] != m.sizes[d]) return false;
    if (sizes[d] != 1 && strides[d] != m.strides[d]) return false;
  }
  return true;
}

std::string describe(const at::Tensor& t) {
  std::ostringstream os;
  if (!t.defined()) return "undefined";
  os << ir::dtype_short_name(t.scalar_type()) << t.sizes() << " stride " << t.strides() << " on " << t.device();
  return os.str();
}

std::string describe(const ir::TensorMeta& m) {
  std::ostringstream os;
  os << ir::dtype_short_name(m.dtype) << c10::IntArrayRef(m.sizes) << " stride " << c10::IntArrayRef(m.strides)
     << " on " << m.device;
  return os.str();
}

// An output tensor with the recorded layout, from the buffer pool (the caller holds a
// PoolScope). See Note [Fused kernel outputs].
at::Tensor allocate(const ir::TensorMeta& m) {
  return at::Tensor(at::detail::empty_strided_cpu(m.sizes, m.strides, m.dtype));
}

std::atomic<int64_t> g_launches{0};
std::atomic<int64_t> g_fallbacks{0};
std::atomic<int64_t> g_split_launches{0};

// The input output i is written into, or -1 (FusedKernel::output_into_input).
int into_input(const FusedKernel& k, size_t i) {
  return i < k.output_into_input.size() ? k.output_into_input[i] : -1;
}

// An output written into its input: that tensor, its version bumped as an in-place op's.
at::Tensor written_input(const std::vector<at::Tensor>& inputs, int j) {
  const at::Tensor& t = inputs[static_cast<size_t>(j)];
  t.unsafeGetTensorImpl()->bump_version();
  return t;
}

// Runs a CUDA kernel on the current stream of its device; outputs from the caching allocator.
std::vector<at::Tensor> run_cuda(FusedKernel& k, const std::vector<at::Tensor>& inputs) {
  c10::DeviceGuard guard(k.device);
  std::vector<at::Tensor> outs;
  outs.reserve(k.outputs.size());
  for (size_t i = 0; i < k.outputs.size(); ++i) {
    const auto& m = k.outputs[i];
    const int j = into_input(k, i);
    outs.push_back(j >= 0 ? written_input(inputs, j)
                          : at::empty_strided(m.sizes, m.strides, at::TensorOptions().dtype(m.dtype).device(k.device)));
  }
  c10::SmallVector<void*, 16> args;
  for (const auto& t : inputs) args.push_back(const_cast<void*>(t.const_data_ptr()));
  for (auto& t : outs) args.push_back(t.mutable_data_ptr());
  // Split reductions' semaphores and workspace (Note [Split column reductions]), from the
  // caching allocator in the stream's order like the outputs; the launch zeroes the
  // semaphores.
  const codegen::cuda::LaunchPlan& plan = k.cuda->plan;
  at::Tensor scratch;
  if (plan.scratch_bytes > 0) {
    scratch = at::empty({plan.scratch_bytes}, at::TensorOptions().dtype(at::kByte).device(k.device));
  }
  void* stream = c10::impl::getDeviceGuardImpl(k.device.type())->getStream(k.device).native_handle();
  codegen::cuda::launch(*k.cuda, k.device.index(), stream, args.data(), args.size(),
                        scratch.defined() ? scratch.mutable_data_ptr() : nullptr);
  return outs;
}

// The group's own ATen ops (its fallback graph); `mismatch`, when given, is logged once.
std::vector<at::Tensor> run_aten_ops(FusedKernel& k, const std::vector<at::Tensor>& inputs,
                                     const std::string* mismatch) {
  std::lock_guard<std::mutex> lock(k.mu);
  if (mismatch && !k.logged_fallback) {
    k.logged_fallback = true;
    TCAP_LOG(GraphBreaks, "fused kernel " << k.name << " runs its ATen ops instead: " << *mismatch);
  }
  if (!k.fallback_interp) {
    k.fallback_interp = std::make_unique<Interpreter>(k.fallback);
    k.fallback_interp->keep_values(false);
  }
  std::vector<at::Tensor> outs = k.fallback_interp->run(inputs);
  // The fallback graph is functional: results the kernel writes in place are copied there,
  // and the input's version is bumped as the kernel's write bumps it (below autograd's
  // in-place key, copy_ itself does not).
  for (size_t i = 0; i < outs.size(); ++i) {
    const int j = into_input(k, i);
    if (j < 0) continue;
    inputs[static_cast<size_t>(j)].copy_(outs[i]);
    outs[i] = written_input(inputs, j);
  }
  return outs;
}

std::vector<at::Tensor> fused_op(at::TensorList inputs, int64_t id) {
  return run_fused(inputs.vec(), id);
}

}  // namespace

FusedKernel::~FusedKernel() = default;

std::vector<at::Tensor> FusedKernel::call(const std::vector<at::Tensor>& inputs) { return run_fused(*this, inputs); }

namespace {

// Note [Direct fused calls] (interp/interpreter.cpp): an interpreter built over a graph
// with tcap::fused nodes holds their kernels and calls them without the dispatcher.
std::shared_ptr<interp::DirectCall> find_fused(const ir::Node& n) {
  if (n.op != "tcap::fused" || n.args.size() != 2 || n.args[1].kind != ir::ArgKind::Int) return nullptr;
  return find_kernel(n.args[1].i);
}

}  // namespace

int64_t register_kernel(std::shared_ptr<FusedKernel> k) {
  static const bool installed = [] {
    interp::set_direct_call_finder(&find_fused);
    return true;
  }();
  (void)installed;
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const int64_t id = r.next++;
  r.kernels[id] = std::move(k);
  return id;
}

void release_kernel(int64_t id) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.kernels.erase(id);
}

RuntimeStats runtime_stats() {
  return {g_launches.load(), g_fallbacks.load(), g_split_launches.load()};
}

std::shared_ptr<FusedKernel> find_kernel(int64_t id) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.kernels.find(id);
  return it == r.kernels.end() ? nullptr : it->second;
}

std::vector<at::Tensor> run_fused(const std::vector<at::Tensor>& inputs, int64_t id) {
  auto k = find_kernel(id);
  TORCH_CHECK(k, "tcap::fused: kernel ", id,
              " is not loaded in this process (graphs with fused nodes run only in the process that compiled them; "
              "replay the graph dumped before fusion instead)");
  return run_fused(*k, inputs);
}

namespace {

// Runs ck's range over the intra-op threads. Splits only because this file is compiled
// with OpenMP (Note [at::parallel_for needs OpenMP in the caller], cmake/TcapTorch.cmake).
void run_cpu(const codegen::cpu_llvm::CpuKernel& ck, void* const* a) {
  if (ck.range <= 0) return;
  std::atomic<bool> split{false};
  at::parallel_for(0, ck.range, std::max<int64_t>(ck.grain, 1), [&](int64_t b, int64_t e) {
    if (at::get_thread_num() != 0) split.store(true, std::memory_order_relaxed);
    ck.run(a, b, e);
  });
  if (split.load(std::memory_order_relaxed)) g_split_launches.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

std::vector<at::Tensor> run_fused(FusedKernel& k, const std::vector<at::Tensor>& inputs) {
  // The kernel by its name, fused ops included, in the profiler (Note [Profiler names]).
  RECORD_USER_SCOPE(std::string_view(k.name));
  k.calls.fetch_add(1, std::memory_order_relaxed);
  std::string mismatch;
  if (inputs.size() != k.inputs.size()) {
    mismatch = "expected " + std::to_string(k.inputs.size()) + " inputs, got " + std::to_string(inputs.size());
  } else {
    for (size_t i = 0; i < inputs.size() && mismatch.empty(); ++i) {
      if (!matches(inputs[i], k.inputs[i])) {
        mismatch = "input " + std::to_string(i) + " is " + describe(inputs[i]) + ", the kernel was built for " +
                   describe(k.inputs[i]);
      }
    }
  }
  if (!mismatch.empty()) {
    k.fallbacks.fetch_add(1, std::memory_order_relaxed);
    g_fallbacks.fetch_add(1, std::memory_order_relaxed);
    return run_aten_ops(k, inputs, &mismatch);
  }
  if (k.code.load(std::memory_order_acquire) != FusedKernel::Ready) {
    // Note [Kernels compiled in the background]: not compiled (yet).
    count_unfused_run();
    return run_aten_ops(k, inputs, nullptr);
  }
  if (k.cuda) {
    g_launches.fetch_add(1, std::memory_order_relaxed);
    return run_cuda(k, inputs);
  }
  std::vector<at::Tensor> outs(k.outputs.size());
  {
    PoolScope pool;
    for (size_t i = 0; i < outs.size(); ++i) {
      const int j = into_input(k, i);
      outs[i] = j >= 0 ? written_input(inputs, j) : allocate(k.outputs[i]);
    }
  }
  g_launches.fetch_add(1, std::memory_order_relaxed);
  c10::SmallVector<void*, 16> args;
  for (const auto& t : inputs) args.push_back(const_cast<void*>(t.const_data_ptr()));
  for (auto& t : outs) args.push_back(t.mutable_data_ptr());
  c10::SmallVector<at::Tensor, 2> scratch;  // Note [Split reductions]: the partials
  {
    PoolScope pool;
    for (int64_t bytes : k.scratch_bytes) scratch.push_back(at::empty({bytes}, at::kByte));
  }
  for (auto& t : scratch) args.push_back(t.mutable_data_ptr());
  void* const* a = args.data();
  run_cpu(*k.cpu, a);
  for (const auto& then : k.cpu_then) run_cpu(*then, a);
  return outs;
}

}  // namespace tcap::runtime

TORCH_LIBRARY(tcap, m) {
  m.def("fused(Tensor[] inputs, int kernel) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(tcap, CompositeExplicitAutograd, m) {
  m.impl("fused", &tcap::runtime::fused_op);
}
