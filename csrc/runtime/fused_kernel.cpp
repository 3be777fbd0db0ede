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

namespace tcap::runtime {

namespace {

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
std::atomic<int64_t> g_horizontal_launches{0};

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

}  // namespace

// Runs a CUDA kernel on the current stream of its device; outputs from the caching allocator.
std::vector<at::Tensor> CudaCode::launch(const FusedKernel& k, const std::vector<at::Tensor>& inputs) const {
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
  const codegen::cuda::LaunchPlan& plan = cuda->plan;
  at::Tensor scratch;
  if (plan.scratch_bytes > 0) {
    scratch = at::empty({plan.scratch_bytes}, at::TensorOptions().dtype(at::kByte).device(k.device));
  }
  void* stream = c10::impl::getDeviceGuardImpl(k.device.type())->getStream(k.device).native_handle();
  codegen::cuda::launch(*cuda, k.device.index(), stream, args.data(), args.size(),
                        scratch.defined() ? scratch.mutable_data_ptr() : nullptr);
  return outs;
}

std::pair<std::string, std::string> CudaCode::dump() const { return {".cu", cuda->code->source}; }

std::pair<std::string, std::string> CpuCode::dump() const {
  if (!main || !main->llvm_ir) return {};
  return {".ll", *main->llvm_ir};
}

namespace {

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

// The operators exist so that graphs with fused nodes verify and print with their
// schemas; the nodes themselves run only through their graph's kernel table (Note [A
// compiled graph owns its kernels]).
[[noreturn]] void refuse_dispatched(const char* op) {
  throw c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                   std::string(op) +
                       " was called through the dispatcher: its kernels belong to the compiled graph that holds the "
                       "node and run only through that graph's kernel table (a graph with fused nodes, such as a "
                       "*.fused.json dump, cannot be replayed on its own: replay the graph dumped before fusion instead)");
}

std::vector<at::Tensor> fused_op(at::TensorList, int64_t) { refuse_dispatched("tcap::fused"); }

std::vector<at::Tensor> fused_horizontal_op(at::TensorList, at::IntArrayRef, at::IntArrayRef) {
  refuse_dispatched("tcap::fused_horizontal");
}

}  // namespace

FusedKernel::~FusedKernel() = default;

std::vector<at::Tensor> FusedKernel::call(const std::vector<at::Tensor>& inputs) { return run_fused(*this, inputs); }

std::vector<at::Tensor> FusedKernel::call_ops(const std::vector<at::Tensor>& inputs) {
  return run_aten_ops(*this, inputs, nullptr);
}

RuntimeStats runtime_stats() {
  return {g_launches.load(), g_fallbacks.load(), g_split_launches.load(), g_horizontal_launches.load()};
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

namespace {

// Why k's generated code cannot run on `inputs` (Note [Fused kernel guards]), or "".
std::string mismatch_of(const FusedKernel& k, const std::vector<at::Tensor>& inputs) {
  if (inputs.size() != k.inputs.size()) {
    return "expected " + std::to_string(k.inputs.size()) + " inputs, got " + std::to_string(inputs.size());
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!matches(inputs[i], k.inputs[i])) {
      return "input " + std::to_string(i) + " is " + describe(inputs[i]) + ", the kernel was built for " +
             describe(k.inputs[i]);
    }
  }
  return "";
}

// A CPU launch of k's generated code: its first (or only) kernel, its results (written
// inputs, or buffers from the pool) and the pointers its code takes, inputs then results
// then scratch.
struct CpuLaunch {
  const codegen::cpu_llvm::CpuKernel* ck = nullptr;
  std::vector<at::Tensor> outs;
  c10::SmallVector<void*, 16> args;
  c10::SmallVector<at::Tensor, 2> scratch;  // Note [Split reductions]: the partials
};

void prepare_cpu(const FusedKernel& k, const CpuCode& c, const std::vector<at::Tensor>& inputs, CpuLaunch* l) {
  l->ck = c.main.get();
  l->outs.resize(k.outputs.size());
  PoolScope pool;
  for (size_t i = 0; i < l->outs.size(); ++i) {
    const int j = into_input(k, i);
    l->outs[i] = j >= 0 ? written_input(inputs, j) : allocate(k.outputs[i]);
  }
  for (const auto& t : inputs) l->args.push_back(const_cast<void*>(t.const_data_ptr()));
  for (auto& t : l->outs) l->args.push_back(t.mutable_data_ptr());
  for (int64_t bytes : c.scratch_bytes) l->scratch.push_back(at::empty({bytes}, at::kByte));
  for (auto& t : l->scratch) l->args.push_back(t.mutable_data_ptr());
}

}  // namespace

std::vector<at::Tensor> run_fused(FusedKernel& k, const std::vector<at::Tensor>& inputs) {
  // The kernel by its name, fused ops included, in the profiler (Note [Profiler names]).
  RECORD_USER_SCOPE(std::string_view(k.name));
  k.calls.fetch_add(1, std::memory_order_relaxed);
  const std::string mismatch = mismatch_of(k, inputs);
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
  if (!k.compiled) {  // a maker that made no code (Note [A backend's kernel object]): never a crash
    static const std::string none = "its backend made no code for it";
    k.fallbacks.fetch_add(1, std::memory_order_relaxed);
    g_fallbacks.fetch_add(1, std::memory_order_relaxed);
    return run_aten_ops(k, inputs, &none);
  }
  g_launches.fetch_add(1, std::memory_order_relaxed);
  return k.compiled->launch(k, inputs);
}

std::vector<at::Tensor> CpuCode::launch(const FusedKernel& k, const std::vector<at::Tensor>& inputs) const {
  CpuLaunch l;
  prepare_cpu(k, *this, inputs, &l);
  void* const* a = l.args.data();
  run_cpu(*main, a);
  for (const auto& t : then) run_cpu(*t, a);
  return std::move(l.outs);
}

// Note [Horizontal kernels] (fuse/horizontal.cpp): the launches share one parallel
// region. Each kernel's work is its iterations over its grain (the iterations
// at::parallel_for would give one thread); the threads take equal shares of the summed
// work, each share mapped back to iteration ranges of the kernels it covers. A boundary
// is computed by one formula from one number, so neighbouring shares meet exactly and
// every iteration runs once. Under one grain of work in all, as at::parallel_for, the
// calling thread runs everything.
namespace {

void run_cpu_together(const std::vector<CpuLaunch>& ls) {
  const size_t n = ls.size();
  std::vector<double> start(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) {
    const auto& ck = *ls[i].ck;
    start[i + 1] = start[i] + static_cast<double>(std::max<int64_t>(ck.range, 0)) /
                                  static_cast<double>(std::max<int64_t>(ck.grain, 1));
  }
  const double total = start[n];
  const int threads = at::get_num_threads();
  if (total <= 1.0 || threads <= 1 || at::in_parallel_region()) {
    for (const auto& l : ls) {
      if (l.ck->range > 0) l.ck->run(l.args.data(), 0, l.ck->range);
    }
    return;
  }
  // The iteration of kernel i at work position w.
  auto iteration = [&](size_t i, double w) -> int64_t {
    const int64_t range = ls[i].ck->range;
    if (w <= start[i]) return 0;
    if (w >= start[i + 1]) return range;
    const double f = (w - start[i]) / (start[i + 1] - start[i]);
    return std::min<int64_t>(range, static_cast<int64_t>(f * static_cast<double>(range)));
  };
  std::atomic<bool> split{false};
  at::parallel_for(0, threads, 1, [&](int64_t b, int64_t e) {
    if (at::get_thread_num() != 0) split.store(true, std::memory_order_relaxed);
    for (int64_t t = b; t < e; ++t) {
      const double lo = total * static_cast<double>(t) / threads;
      const double hi = t + 1 == threads ? total : total * static_cast<double>(t + 1) / threads;
      for (size_t i = 0; i < n; ++i) {
        if (start[i + 1] <= lo || start[i] >= hi) continue;
        const int64_t first = iteration(i, lo), last = iteration(i, hi);
        if (first < last) ls[i].ck->run(ls[i].args.data(), first, last);
      }
    }
  });
  if (split.load(std::memory_order_relaxed)) g_split_launches.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

std::vector<std::vector<at::Tensor>> HorizontalKernel::inputs_of_members(const std::vector<at::Tensor>& inputs) const {
  std::vector<std::vector<at::Tensor>> out(members.size());
  size_t at = 0;
  for (size_t m = 0; m < members.size(); ++m) {
    const auto count = static_cast<size_t>(arity[m]);
    TORCH_CHECK(at + count <= inputs.size(), "tcap::fused_horizontal: ", inputs.size(), " inputs for kernels that take more");
    out[m].assign(inputs.begin() + static_cast<std::ptrdiff_t>(at), inputs.begin() + static_cast<std::ptrdiff_t>(at + count));
    at += count;
  }
  TORCH_CHECK(at == inputs.size(), "tcap::fused_horizontal: ", inputs.size(), " inputs for kernels that take ", at);
  return out;
}

std::vector<at::Tensor> HorizontalKernel::call(const std::vector<at::Tensor>& inputs) {
  RECORD_USER_SCOPE(std::string_view(name));
  g_horizontal_launches.fetch_add(1, std::memory_order_relaxed);
  std::vector<CpuLaunch> together;
  together.reserve(members.size());
  std::vector<std::vector<at::Tensor>> results(members.size());
  const std::vector<std::vector<at::Tensor>> member_inputs = inputs_of_members(inputs);
  for (size_t m = 0; m < members.size(); ++m) {
    FusedKernel& k = *members[m];
    const std::vector<at::Tensor>& ins = member_inputs[m];
    // A kernel of one launch whose code can run on these inputs joins the shared region;
    // any other runs as its own tcap::fused call (guards, fallback, split launches).
    const CpuCode* cpu = k.code.load(std::memory_order_acquire) == FusedKernel::Ready
                             ? dynamic_cast<const CpuCode*>(k.compiled.get())
                             : nullptr;
    if (!cpu || !cpu->single() || !mismatch_of(k, ins).empty()) {
      results[m] = run_fused(k, ins);
      continue;
    }
    k.calls.fetch_add(1, std::memory_order_relaxed);
    g_launches.fetch_add(1, std::memory_order_relaxed);
    together.emplace_back();
    prepare_cpu(k, *cpu, ins, &together.back());
    together.back().outs.swap(results[m]);  // the buffers stay alive in results
  }
  run_cpu_together(together);
  std::vector<at::Tensor> outs;
  for (auto& r : results) outs.insert(outs.end(), std::make_move_iterator(r.begin()), std::make_move_iterator(r.end()));
  return outs;
}

std::vector<at::Tensor> HorizontalKernel::call_ops(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> outs;
  const std::vector<std::vector<at::Tensor>> member_inputs = inputs_of_members(inputs);
  for (size_t m = 0; m < members.size(); ++m) {
    for (auto& t : members[m]->call_ops(member_inputs[m])) outs.push_back(std::move(t));
  }
  return outs;
}

int64_t KernelTable::add(std::shared_ptr<FusedKernel> k) {
  TORCH_CHECK(k, "tcap: a null kernel cannot join a kernel table");
  std::lock_guard<std::mutex> lock(mu_);
  kernels_.push_back(std::move(k));
  return static_cast<int64_t>(kernels_.size()) - 1;
}

int64_t KernelTable::put(int64_t place, std::shared_ptr<FusedKernel> k) {
  TORCH_CHECK(k, "tcap: a null kernel cannot join a kernel table");
  TORCH_CHECK(place >= 0, "tcap: kernel table place ", place);
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<size_t>(place) >= kernels_.size()) kernels_.resize(static_cast<size_t>(place) + 1);
  TORCH_CHECK(!kernels_[static_cast<size_t>(place)], "tcap: kernel table place ", place, " is taken");
  kernels_[static_cast<size_t>(place)] = std::move(k);
  return place;
}

std::shared_ptr<FusedKernel> KernelTable::at(int64_t i) const {
  std::lock_guard<std::mutex> lock(mu_);
  return i >= 0 && static_cast<size_t>(i) < kernels_.size() ? kernels_[static_cast<size_t>(i)] : nullptr;
}

size_t KernelTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kernels_.size();
}

std::shared_ptr<interp::DirectCall> KernelTable::find(const ir::Node& n) const {
  auto kernel = [this](int64_t i) {
    auto k = at(i);
    TORCH_CHECK(k, "names kernel ", i, ", and its graph's kernel table holds none there (", size(), " places)");
    return k;
  };
  if (n.op == "tcap::fused" && n.args.size() == 2 && n.args[1].kind == ir::ArgKind::Int) return kernel(n.args[1].i);
  TORCH_CHECK(n.op == "tcap::fused_horizontal" && n.args.size() == 3 && n.args[1].kind == ir::ArgKind::IntList &&
                  n.args[2].kind == ir::ArgKind::IntList && n.args[1].ints.size() == n.args[2].ints.size(),
              "is not a fused node this kernel table can run");
  const auto& ids = n.args[1].ints;
  auto h = std::make_shared<HorizontalKernel>();
  for (int64_t id : ids) h->members.push_back(kernel(id));
  h->name = "fused_horizontal_" + (ids.empty() ? std::string("none") : std::to_string(ids[0])) + "_x" +
            std::to_string(ids.size());
  h->arity = n.args[2].ints;
  return h;
}

}  // namespace tcap::runtime

TORCH_LIBRARY(tcap, m) {
  m.def("fused(Tensor[] inputs, int kernel) -> Tensor[]");
  m.def("fused_horizontal(Tensor[] inputs, int[] kernels, int[] arity) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(tcap, CompositeExplicitAutograd, m) {
  m.impl("fused", &tcap::runtime::fused_op);
  m.impl("fused_horizontal", &tcap::runtime::fused_horizontal_op);
}
