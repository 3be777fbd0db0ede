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

#include <algorithm>
#include <chrono>
#include <mutex>
#include <unordered_map>

#include <unistd.h>

namespace tcap::codegen::cpu_llvm {

namespace {

// Bump whenever the renderer emits different code for the same kernel IR, so that old
// disk cache entries stop matching (libtcap's build id in the key catches the changes
// nobody bumped this for; see kernel_cache.h).
constexpr int kCodegenVersion = 8;  // 3: numbers read at launch (Note [Sizes at launch]); 4: remainder loops not unrolled;
                                    // 5: streaming stores (Note [Streaming stores]); 6: next-row prefetch;
                                    // 7: masked tails (Note [Masked tails]); 8: exp below -104 without an underflow

// Code for every kernel of one structure whose numbers outside `varying` are `numbers'`:
// it reads the varying ones at launch (make_plan with `varying`: its plan's at_launch).
struct Variant {
  std::vector<bool> varying;
  std::vector<int64_t> numbers;
  std::shared_ptr<const CpuKernel> code;
};

// The kernels of one structure (Note [Sizes at launch]).
struct Family {
  std::vector<int64_t> first;  // numbers of the first kernel, compiled with them built in
  std::vector<Variant> variants;
};

struct Backend {
  std::mutex mu;  // the maps and stats
  std::unordered_map<std::string, std::shared_ptr<const CpuKernel>> memory;  // full key text -> kernel
  std::unordered_map<std::string, Family> families;                          // structure key -> family
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

std::string key_prefix(const CpuJit& jit) {
  return "tcap cpu_llvm codegen " + std::to_string(kCodegenVersion) + (masked_tails_on() ? "" : " scalar tails") +
         "\nbuild " + library_build_id() + "\n" + jit.target_key() + "\n";
}

// See Note [Kernel cache files] in kernel_cache.h.
std::string cache_key(const kir::Kernel& k, const CpuJit& jit) {
  // Neither the kernel's name nor its buffers' names (graph value names) change the
  // machine code: kernels that differ only there (the same layer norm in every layer)
  // share one compiled kernel.
  kir::Kernel anonymous = k;
  anonymous.name.clear();
  for (kir::Buffer& b : anonymous.buffers) b.name.clear();
  return key_prefix(jit) + kir::to_string(anonymous);
}

// The key of code that reads the `varying` numbers at launch ("?") and has the other
// numbers built in.
std::string variant_key(const std::string& structure, const std::vector<bool>& varying,
                        const std::vector<int64_t>& numbers) {
  std::string s = structure + "numbers";
  for (size_t i = 0; i < numbers.size(); ++i) s += " " + (varying[i] ? std::string("?") : std::to_string(numbers[i]));
  return s;
}

std::string symbol_for(const std::string& key_hash) { return "tcap_k_" + key_hash; }

// Compiles `plan`'s code for k under `key` (or loads it from the disk cache) into out:
// fn, name, key_hash, llvm_ir, from_disk.
void build(const kir::Kernel& k, const KernelPlan& plan, const std::string& key, CpuJit& jit, CpuKernel& out) {
  Backend& be = backend();
  auto count = [&be](int CpuLlvmStats::*field) {
    std::lock_guard<std::mutex> lock(be.mu);
    ++(be.stats.*field);
  };
  TORCH_CHECK(jit.target_runnable(), "tcap cpu_llvm: kernel ", k.name,
              ": the testing vector width is wider than this CPU runs; use cpu_kernel_llvm_ir");
  out.key_hash = kir::hash_hex(kir::fnv1a(key));
  out.name = symbol_for(out.key_hash);
  const std::string path = cache_file_path(Config::get().cache_dir, out.key_hash);
  CacheEntry entry;
  std::string why;
  CacheRead read = read_cache_file(path, key, &entry, &why);
  if (read == CacheRead::Hit) {
    try {
      out.fn = jit.load(out.name, entry.object);
      out.from_disk = true;
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
  if (!out.fn) {
    CompiledKernel compiled = jit.compile(k, plan, out.name, /*want_object=*/true);
    entry.object = std::move(compiled.object);
    entry.ir = std::move(compiled.ir);
    out.fn = jit.load(out.name, entry.object);
    count(&CpuLlvmStats::compiled);
    if (!plan.at_launch.empty()) count(&CpuLlvmStats::compiled_at_launch);
    if (!write_cache_file(path, key, entry, &why)) {
      TCAP_LOG(Perf, "cpu_llvm: kernel " << k.name << " not written to the disk cache: " << why);
    }
  }
  out.llvm_ir = std::make_shared<const std::string>(std::move(entry.ir));
}

// The numbers a new variant of `f` takes as varying so that it serves `numbers`: those
// that differ from the first kernel's, and those earlier variants took. Empty when a
// number that differs cannot be read at launch (or none differs).
std::vector<bool> widen(const Family& f, const std::vector<int64_t>& numbers, const kir::Kernel& k,
                        const NumberSlots& slots) {
  // One structure, one count of numbers (Note [Kernel numbers]).
  TORCH_INTERNAL_ASSERT(f.first.size() == numbers.size(), "cpu_llvm: kernels of one structure with ",
                        f.first.size(), " and ", numbers.size(), " numbers");
  std::vector<bool> m(numbers.size(), false);
  bool any = false;
  for (size_t i = 0; i < numbers.size(); ++i) {
    m[i] = f.first[i] != numbers[i];
    for (const Variant& v : f.variants) m[i] = m[i] || v.varying[i];
    if (m[i] && !may_read_at_launch(k, slots, static_cast<int32_t>(i))) return {};
    any = any || m[i];
  }
  return any ? m : std::vector<bool>{};
}

bool serves(const Variant& v, const std::vector<int64_t>& numbers) {
  TORCH_INTERNAL_ASSERT(v.numbers.size() == numbers.size(), "cpu_llvm: kernels of one structure with ",
                        v.numbers.size(), " and ", numbers.size(), " numbers");
  for (size_t i = 0; i < numbers.size(); ++i) {
    if (!v.varying[i] && v.numbers[i] != numbers[i]) return false;
  }
  return true;
}

// The plan's sizes, those seen to vary as "?".
std::string varying_sizes(const KernelPlan& p, const std::vector<bool>& varying) {
  std::string s;
  for (int d = 0; d < p.rank(); ++d) {
    const bool v = varying[static_cast<size_t>(d)];
    s += (d ? ", " : "") + (v ? std::string("?") : std::to_string(p.sizes[static_cast<size_t>(d)]));
  }
  return "[" + s + "]";
}

// The kernel of `key` in the memory cache, or nullptr.
std::shared_ptr<const CpuKernel> memory_hit(Backend& be, const std::string& key) {
  std::lock_guard<std::mutex> lock(be.mu);
  auto it = be.memory.find(key);
  if (it == be.memory.end()) return nullptr;
  ++be.stats.memory_hits;
  return it->second;
}

// A kernel of `structure`, not yet served, with its numbers (Note [Sizes at launch]).
std::shared_ptr<CpuKernel> unserved(const kir::Kernel& k, const KernelPlan& plan, const NumberSlots& slots) {
  auto out = std::make_shared<CpuKernel>();
  out->range = k.parallel_range();
  out->grain = plan.grain;
  out->numbers = kernel_numbers(k, plan, slots);
  return out;
}

// Serves `out` by code of its family compiled for other sizes, if one reads at launch
// every number in which `out` differs (`be.mu` held); true if it did.
bool serve_from_family(Backend& be, const Family& f, const std::string& key, const std::shared_ptr<CpuKernel>& out) {
  for (const Variant& v : f.variants) {
    if (!serves(v, out->numbers)) continue;
    out->fn = v.code->fn;
    out->name = v.code->name;
    out->key_hash = v.code->key_hash;
    out->llvm_ir = v.code->llvm_ir;
    out->numbers_at_launch = v.code->numbers_at_launch;
    ++be.stats.served_at_launch;
    be.memory.emplace(key, out);
    return true;
  }
  return false;
}

}  // namespace

bool cpu_llvm_available(std::string* why) { return CpuJit::get(why) != nullptr; }

std::shared_ptr<const CpuKernel> find_cpu_kernel(const kir::Kernel& k) {
  Backend& be = backend();
  CpuJit& jit = jit_or_throw();
  const std::string key = cache_key(k, jit);
  if (auto hit = memory_hit(be, key)) return hit;
  const KernelPlan plan = make_plan(k, jit.target());  // throws on unsupported kernels
  const std::string structure = key_prefix(jit) + kernel_structure(k, plan);
  auto out = unserved(k, plan, number_slots(k, plan));
  // No structure lock: a compile of this structure in progress is not waited for.
  std::lock_guard<std::mutex> lock(be.mu);
  auto it = be.families.find(structure);
  if (it != be.families.end() && serve_from_family(be, it->second, key, out)) return out;
  // Note [Kernels compiled at their first run]: the first numbers of a structure are those
  // of the first kernel asked for, compiled or not, so that a kernel of other numbers
  // compiles code that reads the ones that differ.
  if (it == be.families.end()) be.families[structure].first = out->numbers;
  return nullptr;
}

std::shared_ptr<const CpuKernel> compile_cpu_kernel(const kir::Kernel& k) {
  const auto t0 = std::chrono::steady_clock::now();
  Backend& be = backend();
  CpuJit& jit = jit_or_throw();
  const std::string key = cache_key(k, jit);
  if (auto hit = memory_hit(be, key)) return hit;
  const KernelPlan plan = make_plan(k, jit.target());  // throws on unsupported kernels
  const std::string structure = key_prefix(jit) + kernel_structure(k, plan);
  // Note [Parallel kernel compilation]: kernels of one structure compile one at a time (a
  // later size is then served by code an earlier one compiled); be.mu only guards the
  // maps and stats.
  std::lock_guard<std::mutex> structure_lock(be.key_locks.of(structure));
  if (auto hit = memory_hit(be, key)) return hit;
  const NumberSlots slots = number_slots(k, plan);
  auto out = unserved(k, plan, slots);

  // Note [Sizes at launch]: code of this structure compiled for other sizes, or a reason
  // to compile such code now.
  std::vector<bool> varying;
  {
    std::lock_guard<std::mutex> lock(be.mu);
    Family& f = be.families[structure];
    if (serve_from_family(be, f, key, out)) return out;
    if (f.first.empty()) {
      f.first = out->numbers;
    } else {
      varying = widen(f, out->numbers, k, slots);
    }
  }
  const KernelPlan launch_plan = varying.empty() ? KernelPlan{} : make_plan(k, jit.target(), {}, &varying);
  if (!varying.empty()) {
    const std::string vkey = variant_key(structure, varying, out->numbers);
    build(k, launch_plan, vkey, jit, *out);
    out->numbers_at_launch = static_cast<int>(std::count(varying.begin(), varying.end(), true));
    std::lock_guard<std::mutex> lock(be.mu);
    be.families[structure].variants.push_back({varying, out->numbers, out});
  } else {
    build(k, plan, key, jit, *out);
  }
  out->compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const KernelPlan& used = varying.empty() ? plan : launch_plan;
  TCAP_LOG(Perf, "cpu_llvm: " << k.name << " -> " << out->name << (out->from_disk ? " loaded from disk" : " compiled")
                              << " in " << out->compile_ms << " ms");
  if (!varying.empty()) {
    TCAP_LOG(Perf, "cpu_llvm: " << k.name << ": a kernel of its structure was compiled for other sizes; this code "
                                << "reads the " << out->numbers_at_launch << " numbers that differed at launch (sizes "
                                << varying_sizes(used, varying)
                                << ", ? read at launch) and serves every later kernel that differs there only (Note [Sizes "
                                   "at launch])");
  }
  TCAP_LOG(Fusion, "cpu_llvm: " << k.name << " -> " << out->name << ": " << to_string(used));
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
  be.families.clear();
}

void cpu_llvm_set_vector_bits_for_testing(int bits) {
  Backend& be = backend();
  std::lock_guard<std::mutex> lock(be.mu);
  set_vector_bits_override(bits);
}

}  // namespace tcap::codegen::cpu_llvm
