// The public entry points of the cpu_llvm backend (cpu_llvm.h): caches in front of the
// renderer and the JIT. Compiles of different kernels run in parallel (Note [Parallel
// kernel compilation]); compiled kernels run lock-free.
#include "codegen/cpu_llvm/cpu_llvm.h"

#include "codegen/cpu_llvm/jit.h"
#include "codegen/kernel_cache.h"
#include "codegen/cpu_llvm/plan.h"
#include "codegen/cpu_llvm/testing.h"
#include "support/logging.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <mutex>
#include <unordered_map>

#include <unistd.h>

namespace tcap::codegen::cpu_llvm {

namespace {

// Bump whenever the renderer emits different code for the same kernel IR, so that old
// disk cache entries stop matching (libtcap's build id in the key catches the changes
// nobody bumped this for; see kernel_cache.h).
constexpr int kCodegenVersion = 2;  // 2: inline f32 sin/cos (Note [CPU sin and cos])

struct Backend {
  std::mutex mu;  // the maps and stats
  std::unordered_map<std::string, std::shared_ptr<const CpuKernel>> memory;  // full key text -> kernel
  CpuLlvmStats stats;
  KeyLocks key_locks;
};

Backend& backend() {
  static Backend* b = new Backend;  // never destroyed: kernels may run during static destruction
  return *b;
}

CpuJit& jit_or_throw() {
  std::string why;
  CpuJit* jit = CpuJit::get(&why);
  TORCH_CHECK(jit != nullptr, "tcap cpu_llvm: the LLVM CPU backend is not available: ", why);
  return *jit;
}

// See Note [Kernel cache files] in kernel_cache.h.
std::string cache_key(const kir::Kernel& k, const CpuJit& jit) {
  // Neither the kernel's name nor its buffers' names (graph value names) change the
  // machine code: kernels that differ only there (the same layer norm in every layer)
  // share one compiled kernel.
  kir::Kernel anonymous = k;
  anonymous.name.clear();
  for (kir::Buffer& b : anonymous.buffers) b.name.clear();
  return "tcap cpu_llvm codegen " + std::to_string(kCodegenVersion) + "\nbuild " + library_build_id() + "\n" +
         jit.target_key() + "\n" + kir::to_string(anonymous);
}

std::string symbol_for(const std::string& key_hash) { return "tcap_k_" + key_hash; }

}  // namespace

bool cpu_llvm_available(std::string* why) { return CpuJit::get(why) != nullptr; }

std::shared_ptr<const CpuKernel> compile_cpu_kernel(const kir::Kernel& k) {
  const auto t0 = std::chrono::steady_clock::now();
  Backend& be = backend();
  CpuJit& jit = jit_or_throw();
  const std::string key = cache_key(k, jit);
  // Note [Parallel kernel compilation]; be.mu only guards the maps and stats.
  std::lock_guard<std::mutex> key_lock(be.key_locks.of(key));
  {
    std::lock_guard<std::mutex> lock(be.mu);
    if (auto it = be.memory.find(key); it != be.memory.end()) {
      ++be.stats.memory_hits;
      return it->second;
    }
  }
  auto count = [&be](int CpuLlvmStats::*field) {
    std::lock_guard<std::mutex> lock(be.mu);
    ++(be.stats.*field);
  };
  const KernelPlan plan = make_plan(k, jit.target());  // throws on unsupported kernels
  TORCH_CHECK(jit.target_runnable(), "tcap cpu_llvm: kernel ", k.name,
              ": the testing vector width is wider than this CPU runs; use cpu_kernel_llvm_ir");
  auto out = std::make_shared<CpuKernel>();
  out->key_hash = kir::hash_hex(kir::fnv1a(key));
  out->name = symbol_for(out->key_hash);
  out->range = k.parallel_range();
  out->grain = plan.grain;

  const std::string path = cache_file_path(Config::get().cache_dir, out->key_hash);
  CacheEntry entry;
  std::string why;
  CacheRead read = read_cache_file(path, key, &entry, &why);
  if (read == CacheRead::Hit) {
    try {
      out->fn = jit.load(out->name, entry.object);
      out->from_disk = true;
      count(&CpuLlvmStats::disk_hits);
    } catch (const c10::Error& e) {
      read = CacheRead::Corrupt;
      why = std::string("the object does not link: ") + e.what_without_backtrace();
    }
  }
  if (read == CacheRead::Corrupt) {
    count(&CpuLlvmStats::corrupt_cache_files);
    TCAP_LOG(Perf, "cpu_llvm: cache file " << path << " of kernel " << k.name << " rejected (" << why
                                           << "); recompiling");
    ::unlink(path.c_str());
  }
  if (!out->fn) {
    CompiledKernel compiled = jit.compile(k, plan, out->name, /*want_object=*/true);
    entry.object = std::move(compiled.object);
    entry.ir = std::move(compiled.ir);
    out->fn = jit.load(out->name, entry.object);
    count(&CpuLlvmStats::compiled);
    if (!write_cache_file(path, key, entry, &why)) {
      TCAP_LOG(Perf, "cpu_llvm: kernel " << k.name << " not written to the disk cache: " << why);
    }
  }
  out->llvm_ir = std::move(entry.ir);
  out->compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  TCAP_LOG(Perf, "cpu_llvm: " << k.name << " -> " << out->name << (out->from_disk ? " loaded from disk" : " compiled")
                              << " in " << out->compile_ms << " ms");
  TCAP_LOG(Fusion, "cpu_llvm: " << k.name << " -> " << out->name << ": " << to_string(plan));
  std::lock_guard<std::mutex> lock(be.mu);
  be.memory.emplace(key, out);
  return out;
}

std::string cpu_kernel_llvm_ir(const kir::Kernel& k) {
  CpuJit& jit = jit_or_throw();
  const KernelPlan plan = make_plan(k, jit.target());
  const std::string key = cache_key(k, jit);
  return jit.compile(k, plan, symbol_for(kir::hash_hex(kir::fnv1a(key))), /*want_object=*/false).ir;
}

std::string cpu_target_description() {
  std::string why;
  CpuJit* jit = CpuJit::get(&why);
  if (!jit) return "unavailable: " + why;
  const TargetInfo t = jit->target();
  std::string s = t.triple + " " + t.cpu;
  std::string shown;
  for (const char* f : {"+avx512f", "+avx512bf16", "+avx512fp16", "+avx2", "+fma", "+f16c", "+sse4.1", "+neon"}) {
    const std::string needle(f);
    const std::string& fs = t.features;
    for (size_t at = fs.find(needle); at != std::string::npos; at = fs.find(needle, at + 1)) {
      const size_t end = at + needle.size();
      if ((at == 0 || fs[at - 1] == ',') && (end == fs.size() || fs[end] == ',')) {
        shown += (shown.empty() ? "" : ",") + needle;
        break;
      }
    }
  }
  return s + " " + shown + " vf32=" + std::to_string(t.vector_bits / 32) + (t.libmvec ? " libmvec" : " no-libmvec");
}

CpuLlvmStats cpu_llvm_stats() {
  Backend& be = backend();
  std::lock_guard<std::mutex> lock(be.mu);
  return be.stats;
}

void cpu_llvm_clear_memory_cache_for_testing() {
  Backend& be = backend();
  std::lock_guard<std::mutex> lock(be.mu);
  be.memory.clear();
}

void cpu_llvm_set_vector_bits_for_testing(int bits) {
  Backend& be = backend();
  std::lock_guard<std::mutex> lock(be.mu);
  set_vector_bits_override(bits);
}

}  // namespace tcap::codegen::cpu_llvm
