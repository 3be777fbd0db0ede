#include "compile/backends.h"

#include "codegen/cpu_llvm/cpu_llvm.h"
#include "fuse/fusion.h"
#include "runtime/fused_kernel.h"
#include "support/logging.h"

#include <tcap/graph_json.h>

#include <chrono>
#include <filesystem>
#include <fstream>

namespace tcap {

namespace {

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

bool all_cpu(const ir::Graph& g) {
  for (const auto& v : g.values()) {
    if (!v.meta.device.is_cpu()) return false;
  }
  return true;
}

Executable fused_backend(const ir::Graph& g, const std::string& what, const std::string& dump_dir) {
  const auto t0 = std::chrono::steady_clock::now();
  auto ids = std::make_shared<std::vector<int64_t>>();
  fuse::FusionOptions opts;
  opts.compile = [&](const fuse::FusedGroup& fg, std::string* why) -> int64_t {
    try {
      auto fk = std::make_shared<runtime::FusedKernel>();
      fk->name = fg.name;
      fk->kernel = fg.kernel;
      fk->cpu = codegen::compile_cpu_kernel(fg.kernel);
      for (ir::ValueId v : fg.inputs) fk->inputs.push_back(g.value(v).meta);
      fk->outputs = fg.output_metas;
      fk->fallback = fg.fallback;
      if (!dump_dir.empty()) {
        const std::string base = dump_dir + "/kernels/" + what + "." + fg.name;
        std::filesystem::create_directories(dump_dir + "/kernels");
        write_file(base + ".kir", kir::to_string(fg.kernel));
        write_file(base + ".ll", fk->cpu->llvm_ir);
      }
      const int64_t id = runtime::register_kernel(std::move(fk));
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
  return [inner, owner](const std::vector<at::Tensor>& in) { return inner(in); };
}

}  // namespace

Executable llvm_backend(const ir::Graph& g) { return compile_with_backend("llvm", g, "graph", ""); }

Executable compile_with_backend(const std::string& backend, const ir::Graph& g, const std::string& what,
                                const std::string& dump_dir) {
  if (backend == "eager") return eager_backend(g);
  if (backend == "llvm" || backend == "auto") {
    std::string why;
    if (!all_cpu(g)) {
      why = "the graph has tensors that are not on the CPU";
    } else if (!codegen::cpu_llvm_available(&why)) {
      // why set
    } else {
      return fused_backend(g, what, dump_dir);
    }
    TORCH_CHECK(backend == "auto", "tcap::compile: backend 'llvm' cannot compile ", what, ": ", why);
    TCAP_LOG(GraphBreaks, what << ": backend 'auto' runs the eager backend: " << why);
    return eager_backend(g);
  }
  TORCH_CHECK(false, "tcap::compile: unknown backend '", backend, "' (available: eager, llvm, auto)");
}

}  // namespace tcap
