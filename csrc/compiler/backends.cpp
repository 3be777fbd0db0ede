// Note [The backend table]
// One row per backend: its name (CompileOptions::backend by name, the environment, the
// tools), whether this build and machine can use it (and why not), the device its
// kernels run on, and how a fused group's kernel is made. choose_target reads the table;
// Auto is the one backend that is not a row: it picks the first row that can compile a
// graph (cuda for CUDA graphs, llvm for CPU graphs), else the interpreter. A new backend
// is a row here, with the maker of its kernel objects (Note [A backend's kernel object],
// runtime/fused_kernel.h).
#include "compiler/backends.h"

#include "kir/split_reduction.h"

#include "codegen/cpu_llvm/cpu_llvm.h"
#include "codegen/cuda/cuda.h"
#include "fuse/fusion.h"
#include "runtime/background_compiles.h"
#include "runtime/fused_kernel.h"
#include "support/logging.h"
#include "support/parallel.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <optional>

namespace tcap {

namespace {

bool always(std::string*) { return true; }

// The CPU code of kernel k: one kernel, or a split reduction's sequence (Note [Split
// reductions], kir/split_reduction.h); null when `compile` is false and some part is not
// in the cache.
std::shared_ptr<runtime::CpuCode> cpu_code(const kir::Kernel& k, bool compile) {
  auto out = std::make_shared<runtime::CpuCode>();
  runtime::CpuCode& c = *out;
  auto get = [&](const kir::Kernel& part) {
    return compile ? codegen::cpu_llvm::compile_cpu_kernel(part) : codegen::cpu_llvm::find_cpu_kernel(part);
  };
  if (auto split = kir::split_reduction(k)) {
    for (const kir::Kernel& part : split->kernels) {
      auto code = get(part);
      if (!code) return nullptr;
      if (!c.main) c.main = std::move(code);
      else c.then.push_back(std::move(code));
    }
    for (size_t i = 0; i < split->scratch.size(); ++i) {
      const auto& b = split->kernels[0].buffers[k.buffers.size() + i];
      c.scratch_bytes.push_back(split->scratch[i] * kir::dtype_size(b.dtype));
    }
    TCAP_LOG(Fusion, k.name << ": a reduction into " << k.outer_numel() << " outputs of " << k.reduce_numel()
                            << " elements each, split in " << split->splits << " chunks reduced in parallel and combined, "
                            << split->kernels.size() << " kernels (Note [Split reductions])");
    return out;
  }
  c.main = get(k);
  return c.main ? out : nullptr;
}

// The llvm backend's kernels (Note [A backend's kernel object]: runtime::CpuCode). With
// `later`, a kernel whose code is not in the cache is left Compiling (Note [Kernels
// compiled at their first run]).
KernelMaker llvm_maker(const compiler::Target&, bool later) {
  if (later) {
    return [](const fuse::FusedGroup& fg, runtime::FusedKernel& fk) {
      auto c = cpu_code(fg.kernel, false);  // throws where compile_cpu_kernel would
      if (!c) fk.code.store(runtime::FusedKernel::Compiling, std::memory_order_relaxed);
      else fk.compiled = std::move(c);
    };
  }
  return [](const fuse::FusedGroup& fg, runtime::FusedKernel& fk) {
    auto c = cpu_code(fg.kernel, true);
    TORCH_CHECK(c, "the llvm backend made no code for ", fg.name);
    fk.compiled = std::move(c);
  };
}

// The cuda backend's kernels (runtime::CudaCode), for the target's device.
KernelMaker cuda_maker(const compiler::Target& t, bool) {
  const codegen::cuda::Target target = codegen::cuda::target_for(t.device.index());
  return [target](const fuse::FusedGroup& fg, runtime::FusedKernel& fk) {
    auto c = std::make_shared<runtime::CudaCode>();
    c->cuda = codegen::cuda::compile_cuda_kernel(fg.kernel, target);
    fk.compiled = std::move(c);
  };
}

struct Row {
  Backend::Kind kind;
  const char* name;
  bool (*available)(std::string* why);
  bool cuda;  // its kernels run on a CUDA device (else on the CPU)
  // Makes the backend's kernel objects (null: it makes none, the interpreter runs graphs).
  KernelMaker (*maker)(const compiler::Target& t, bool later);
};

// Auto last: it is not a target, only a choice among the others.
const Row kBackends[] = {
    {Backend::Eager, "eager", always, false, nullptr},
    {Backend::Llvm, "llvm", codegen::cpu_llvm::cpu_llvm_available, false, llvm_maker},
    {Backend::Cuda, "cuda", codegen::cuda::cuda_available, true, cuda_maker},
    {Backend::Auto, "auto", always, false, nullptr},
};

const Row& row(Backend::Kind k) {
  for (const auto& r : kBackends) {
    if (r.kind == k) return r;
  }
  TORCH_INTERNAL_ASSERT(false, "tcap: backend kind ", static_cast<int>(k), " has no row in the backend table");
}

std::string names() {
  std::string s;
  for (const auto& r : kBackends) s += (s.empty() ? "" : ", ") + std::string(r.name);
  return s;
}

// The devices of the graph's tensors (CPU scalars next to CUDA tensors count).
std::vector<c10::Device> devices_of(const ir::Graph& g) {
  std::vector<c10::Device> out;
  for (const auto& v : g.values()) {
    if (std::find(out.begin(), out.end(), v.meta.device) == out.end()) out.push_back(v.meta.device);
  }
  return out;
}

}  // namespace

Backend::Backend(const std::string& name) {
  for (const auto& r : kBackends) {
    if (name == r.name) {
      kind_ = r.kind;
      return;
    }
  }
  TORCH_CHECK(false, "tcap: unknown backend '", name, "' (", names(), ")");
}

const char* Backend::name() const { return row(kind_).name; }

bool Backend::available(std::string* why) const { return row(kind_).available(why); }

namespace compiler {

Target choose_target(const Backend& backend, const ir::Graph& g, const std::string& what) {
  if (backend == Backend::Eager) return {};
  // The device the kernels run on: the one device of the graph's tensors, ignoring CPU
  // tensors next to CUDA ones (scalars; they stay ATen inputs).
  const std::vector<c10::Device> devices = devices_of(g);
  std::optional<c10::Device> cuda_device;
  bool several = false;
  for (const auto& d : devices) {
    if (!d.is_cuda()) continue;
    several = several || (cuda_device && *cuda_device != d);
    cuda_device = d;
  }
  const Row& r = backend == Backend::Auto ? row(cuda_device ? Backend::Cuda : Backend::Llvm) : row(backend.kind());
  std::string why;
  if (!r.cuda) {
    if (cuda_device) {
      why = "the graph has tensors on " + cuda_device->str() + " (backend '" + r.name + "' compiles CPU graphs)";
    } else if (std::any_of(devices.begin(), devices.end(), [](const c10::Device& d) { return !d.is_cpu(); })) {
      why = "the graph has tensors that are neither on the CPU nor on a CUDA device";
    } else if (r.available(&why)) {
      return {r.kind, c10::Device(c10::kCPU)};
    }
  } else {
    if (!cuda_device) {
      why = std::string("the graph has no CUDA tensors (backend '") + r.name + "' compiles CUDA graphs)";
    } else if (several) {
      why = "the graph's tensors are on more than one CUDA device";
    } else if (r.available(&why)) {
      return {r.kind, *cuda_device};
    }
  }
  TORCH_CHECK(backend == Backend::Auto, "tcap::compile: backend '", backend.name(), "' cannot compile ", what, ": ",
              why);
  TCAP_LOG(GraphBreaks, what << ": backend 'auto' runs the eager backend: " << why);
  return {};
}

KernelMaker kernel_maker(const Target& t, bool later) {
  TORCH_INTERNAL_ASSERT(t.fuses(), "tcap: the eager target makes no kernels");
  const auto maker = row(t.kind).maker;
  TORCH_INTERNAL_ASSERT(maker, "tcap: backend '", row(t.kind).name, "' has no kernel maker");
  return maker(t, later);
}

bool compiles_in_background(const CompileOptions& o, const Target& t) {
  return t.kind == Backend::Llvm && runtime::background_compiles_on(o);
}

namespace {

struct Installed {
  int64_t ready = 0, failed = 0;
};

// Compiles `kernels` (left Compiling) on `threads` threads, then makes them Ready together:
// one change of their graph's allocations (Note [Memory plans]). A kernel that cannot
// compile is Failed and runs its ATen ops, logged under graph_breaks (`where` says how it
// was compiled); the LLVM IR of each goes to `ll_paths[i]` where that is not empty.
Installed compile_and_install(const std::string& what, const std::vector<std::shared_ptr<runtime::FusedKernel>>& kernels,
                              int threads, const std::vector<std::string>& ll_paths, const char* where) {
  std::vector<std::shared_ptr<runtime::CpuCode>> code(kernels.size());
  std::vector<std::string> errors(kernels.size());
  run_on_threads(kernels.size(), threads, [&](size_t i) {
    try {
      code[i] = cpu_code(kernels[i]->kernel, true);
    } catch (const c10::Error& e) {
      errors[i] = e.what_without_backtrace();
    }
  });
  Installed out;
  for (size_t i = 0; i < kernels.size(); ++i) {
    runtime::FusedKernel& k = *kernels[i];
    if (!code[i]) {
      ++out.failed;
      k.code.store(runtime::FusedKernel::Failed, std::memory_order_release);
      TCAP_LOG(GraphBreaks, what << ": fused kernel " << k.name << " could not be compiled" << where
                                 << "; it runs its ATen ops: " << errors[i]);
      continue;
    }
    if (i < ll_paths.size() && !ll_paths[i].empty()) {
      const auto file = code[i]->dump();
      if (!file.first.empty()) std::ofstream(ll_paths[i], std::ios::binary) << file.second;
    }
    k.compiled = std::move(code[i]);
    k.code.store(runtime::FusedKernel::Ready, std::memory_order_release);
    ++out.ready;
  }
  return out;
}

std::string failed_note(int64_t failed) { return failed ? ", " + std::to_string(failed) + " failed" : std::string(); }

}  // namespace

void compile_later(const std::string& what, const std::vector<std::shared_ptr<runtime::FusedKernel>>& kernels,
                   const std::vector<std::string>& ll_paths) {
  if (kernels.empty()) return;
  std::vector<std::weak_ptr<runtime::FusedKernel>> weak(kernels.begin(), kernels.end());
  const auto submitted = std::chrono::steady_clock::now();
  TCAP_LOG(Perf, what << ": " << kernels.size()
                      << " kernels compile in the background; their ATen ops run until they are ready");
  runtime::submit_background_compile(what, [what, weak = std::move(weak), ll_paths, submitted] {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::shared_ptr<runtime::FusedKernel>> live;
    std::vector<std::string> live_paths;
    int64_t skipped = 0;
    for (size_t i = 0; i < weak.size(); ++i) {
      if (auto k = weak[i].lock()) {
        live.push_back(std::move(k));
        live_paths.push_back(i < ll_paths.size() ? ll_paths[i] : "");
      } else {
        ++skipped;  // its graph died
      }
    }
    // One background thread: the compiles leave the program's threads alone.
    const Installed done = compile_and_install(what, live, 1, live_paths, " in the background");
    runtime::count_background_kernels(done.ready, done.failed);
    using ms = std::chrono::duration<double, std::milli>;
    const auto t1 = std::chrono::steady_clock::now();
    TCAP_LOG(Perf, what << ": " << done.ready << " kernels ready, compiled in the background in "
                        << ms(t1 - t0).count() << " ms (" << ms(t1 - submitted).count() << " ms after the graph)"
                        << failed_note(done.failed)
                        << (skipped ? ", " + std::to_string(skipped) + " skipped (the graph died)" : std::string()));
  });
}

void compile_now(const std::string& what, const std::vector<std::shared_ptr<runtime::FusedKernel>>& kernels,
                 const std::vector<std::string>& ll_paths) {
  const auto t0 = std::chrono::steady_clock::now();
  // Note [Parallel kernel compilation]: as many threads as fusion compiles with.
  const Installed done = compile_and_install(what, kernels, compile_threads(kernels.size()), ll_paths, "");
  using ms = std::chrono::duration<double, std::milli>;
  const double took = ms(std::chrono::steady_clock::now() - t0).count();
  TCAP_LOG(Perf, what << ": " << done.ready << " kernels compiled at the graph's first run in " << took
                      << " ms (Note [Kernels compiled at their first run])" << failed_note(done.failed));
}

}  // namespace compiler
}  // namespace tcap
