#include "compile/backends.h"

#include "codegen/cpu_llvm/cpu_llvm.h"
#include "codegen/cuda/cuda.h"
#include "fuse/fusion.h"
#include "runtime/fused_kernel.h"
#include "support/logging.h"

#include <tcap/graph_json.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>

namespace tcap {

namespace {

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
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

Executable fused_backend(const ir::Graph& g, const std::string& what, const std::string& dump_dir,
                         const c10::Device& device, const KernelMaker& make_kernel) {
  const auto t0 = std::chrono::steady_clock::now();
  auto ids = std::make_shared<std::vector<int64_t>>();
  std::mutex ids_mu;  // compile runs on several threads (Note [Parallel kernel compilation])
  fuse::FusionOptions opts;
  opts.device = device;
  opts.compile = [&](const fuse::FusedGroup& fg, std::string* why) -> int64_t {
    try {
      auto fk = std::make_shared<runtime::FusedKernel>();
      fk->name = fg.name;
      fk->kernel = fg.kernel;
      fk->device = device;
      make_kernel(fg, *fk);
      fk->inputs = fg.input_metas;
      fk->outputs = fg.output_metas;
      fk->fallback = fg.fallback;
      if (!dump_dir.empty()) {
        const std::string base = dump_dir + "/kernels/" + what + "." + fg.name;
        std::filesystem::create_directories(dump_dir + "/kernels");
        write_file(base + ".kir", kir::to_string(fg.kernel));
        if (fk->cpu) write_file(base + ".ll", fk->cpu->llvm_ir);
        if (fk->cuda) write_file(base + ".cu", fk->cuda->source);
      }
      const int64_t id = runtime::register_kernel(std::move(fk));
      std::lock_guard<std::mutex> lock(ids_mu);
      ids->push_back(id);
      return id;
    } catch (const c10::Error& e) {
      *why = e.what_without_backtrace();
      return -1;
    }
  };
  fuse::FusionResult res = fuse::fuse(g, opts);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  TCAP_LOG(Fusion, what << ": " << res.groups.size() << " fused kernels (" << ms << " ms)\n"
                        << res.explain() << "fused graph:\n" << ir::to_string(res.graph));
  if (log_enabled(LogChannel::Fusion)) {
    for (const auto& fg : res.groups) TCAP_LOG(Fusion, kir::to_string(fg.kernel));
  }
  if (!dump_dir.empty()) ir::save_json(res.graph, dump_dir + "/" + what + ".fused.json");
  Executable inner = eager_backend(res.graph);
  // The kernels live as long as the executable.
  auto owner = std::shared_ptr<void>(nullptr, [ids](void*) {
    for (int64_t id : *ids) runtime::release_kernel(id);
  });
  return [inner, owner](std::vector<at::Tensor> in) { return inner(std::move(in)); };
}

Executable llvm_backend(const ir::Graph& g) { return compile_with_backend("llvm", g, "graph", ""); }

Executable compile_with_backend(const std::string& backend, const ir::Graph& g, const std::string& what,
                                const std::string& dump_dir) {
  if (backend == "eager") return eager_backend(g);
  TORCH_CHECK(backend == "llvm" || backend == "cuda" || backend == "auto", "tcap::compile: unknown backend '", backend,
              "' (available: eager, llvm, cuda, auto)");
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
  std::string why;
  if (backend == "llvm" || (backend == "auto" && !cuda_device)) {
    if (cuda_device) {
      why = "the graph has tensors on " + cuda_device->str() + " (backend 'llvm' compiles CPU graphs)";
    } else if (std::any_of(devices.begin(), devices.end(), [](const c10::Device& d) { return !d.is_cpu(); })) {
      why = "the graph has tensors that are neither on the CPU nor on a CUDA device";
    } else if (codegen::cpu_llvm_available(&why)) {
      return fused_backend(g, what, dump_dir, c10::Device(c10::kCPU), [](const fuse::FusedGroup& fg, runtime::FusedKernel& fk) {
        fk.cpu = codegen::compile_cpu_kernel(fg.kernel);
      });
    }
  } else {
    if (!cuda_device) {
      why = "the graph has no CUDA tensors (backend 'cuda' compiles CUDA graphs)";
    } else if (several) {
      why = "the graph's tensors are on more than one CUDA device";
    } else if (codegen::cuda::cuda_available(&why)) {
      const codegen::cuda::Target target = codegen::cuda::target_for(cuda_device->index());
      return fused_backend(g, what, dump_dir, *cuda_device, [target](const fuse::FusedGroup& fg, runtime::FusedKernel& fk) {
        fk.cuda = codegen::cuda::compile_cuda_kernel(fg.kernel, target);
      });
    }
  }
  TORCH_CHECK(backend == "auto", "tcap::compile: backend '", backend, "' cannot compile ", what, ": ", why);
  TCAP_LOG(GraphBreaks, what << ": backend 'auto' runs the eager backend: " << why);
  return eager_backend(g);
}

}  // namespace tcap
