// The public entry points of the cuda backend (cuda.h): caches in front of the renderer
// and NVRTC, and the launch. Compiles of different kernels run in parallel (Note
// [Parallel kernel compilation]); a launch takes only the kernel's own lock (briefly; the
// first launch on a device loads the module there).
#include "codegen/cuda/cuda.h"

#include "codegen/cuda/driver.h"
#include "codegen/cuda/numbers.h"
#include "codegen/kernel_cache.h"
#include "support/logging.h"

#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

#include <unistd.h>

namespace tcap::codegen::cuda {

namespace {

// Bump whenever the renderer emits different code for the same kernel IR (the source is
// in the key too, so this only documents intent; libtcap's build id also changes).
constexpr int kCodegenVersion = 2;  // 2: numbers read at launch (Note [CUDA sizes at launch])

struct Backend {
  std::mutex mu;  // the maps and stats
  std::unordered_map<std::string, std::shared_ptr<const CudaCode>> code;      // key text -> code
  std::unordered_map<std::string, std::shared_ptr<const CudaKernel>> memory;  // key text + numbers -> kernel
  CudaStats stats;
  std::unordered_map<int, DeviceInfo> devices;
  KeyLocks key_locks;
  LaunchShapes shapes;
};

Backend& backend() {
  static auto* b = new Backend;  // never destroyed: kernels may run during static destruction
  return *b;
}

std::atomic<int64_t> g_launches{0};

std::string arch_name(const Target& t) { return (t.cubin ? "sm_" : "compute_") + std::to_string(t.arch); }

std::string cache_key(const CudaSource& src, const Target& t) {
  return "tcap cuda codegen " + std::to_string(kCodegenVersion) + "\nbuild " + library_build_id() + "\nnvrtc " +
         nvrtc_version() + "\narch " + arch_name(t) + "\n" + src.source;
}

const DeviceInfo& info_of(int device) {
  Backend& be = backend();
  std::lock_guard<std::mutex> lock(be.mu);
  auto it = be.devices.find(device);
  if (it == be.devices.end()) it = be.devices.emplace(device, device_info(device)).first;
  return it->second;
}

}  // namespace

bool cuda_available(std::string* why) {
  std::string w;
  if (!nvrtc_available(&w) || !driver_available(&w)) {
    if (why) *why = w;
    return false;
  }
  if (why) why->clear();
  return true;
}

Target target_for(int device) {
  const int cc = info_of(device).capability;
  std::vector<int> archs = nvrtc_supported_archs();
  TORCH_CHECK(!archs.empty(), "tcap cuda: NVRTC ", nvrtc_version(), " reports no supported architecture");
  std::sort(archs.begin(), archs.end());
  if (std::find(archs.begin(), archs.end(), cc) != archs.end()) return {cc, /*cubin=*/true};
  TORCH_CHECK(cc > archs.back(), "tcap cuda: device ", device, " is sm_", cc, ", older than anything NVRTC ",
              nvrtc_version(), " compiles for (sm_", archs.front(), " and newer)");
  return {archs.back(), /*cubin=*/false};  // the driver JIT-compiles PTX for newer devices
}

namespace {

// The code of source `src` for `target`, from memory (*found), the disk cache or NVRTC
// (the caller holds the key's lock).
std::shared_ptr<const CudaCode> code_for(const kir::Kernel& k, const CudaSource& src, bool reads_numbers,
                                         const Target& target, const std::string& key, bool* found) {
  Backend& be = backend();
  {
    std::lock_guard<std::mutex> lock(be.mu);
    *found = false;
    if (auto it = be.code.find(key); it != be.code.end()) {
      *found = true;
      return it->second;
    }
  }
  auto count = [&be](int CudaStats::*field) {
    std::lock_guard<std::mutex> lock(be.mu);
    ++(be.stats.*field);
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto out = std::make_shared<CudaCode>();
  out->entry = src.entry;
  out->arch = target.arch;
  out->is_ptx = !target.cubin;
  out->reads_numbers = reads_numbers;
  out->key_hash = "cuda-" + kir::hash_hex(kir::fnv1a(key));
  const std::string path = cache_file_path(Config::get().cache_dir, out->key_hash);
  CacheEntry entry;
  std::string why;
  CacheRead read = read_cache_file(path, key, &entry, &why);
  if (read == CacheRead::Hit && entry.object.empty()) {
    read = CacheRead::Corrupt;
    why = "empty binary";
  }
  if (read == CacheRead::Hit) {
    out->binary = std::move(entry.object);
    out->from_disk = true;
    count(&CudaStats::disk_hits);
  } else {
    if (read == CacheRead::Corrupt) {
      count(&CudaStats::corrupt_cache_files);
      TCAP_LOG(Perf, "cuda: cache file " << path << " of kernel " << k.name << " rejected (" << why << "); recompiling");
      ::unlink(path.c_str());
    }
    std::string log;
    const bool ok = nvrtc_compile(src.source, src.entry, target.arch, target.cubin, &out->binary, &log);
    TORCH_CHECK(ok, "tcap cuda: NVRTC ", nvrtc_version(), " could not compile kernel ", k.name, " for ",
                arch_name(target), ":\n", log, "\n--- source ---\n", src.source);
    out->compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    count(&CudaStats::compiled);
    if (reads_numbers) count(&CudaStats::compiled_at_launch);
    entry.object = out->binary;
    entry.ir = src.source;
    if (!write_cache_file(path, key, entry, &why)) {
      TCAP_LOG(Perf, "cuda: kernel " << k.name << " not written to the disk cache: " << why);
    }
  }
  out->source = src.source;
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  TCAP_LOG(Perf, "cuda: " << k.name << " -> " << out->entry << " (" << arch_name(target) << ")"
                          << (out->from_disk ? " loaded from disk" : " compiled") << " in " << ms << " ms"
                          << (reads_numbers ? ", reading the numbers that vary in its structure at launch (Note [CUDA "
                                              "sizes at launch])"
                                            : ""));
  std::lock_guard<std::mutex> lock(be.mu);
  return be.code.emplace(key, std::move(out)).first->second;
}

}  // namespace

std::shared_ptr<const CudaKernel> compile_cuda_kernel(const kir::Kernel& k, const Target& target) {
  Backend& be = backend();
  LaunchSource ls = render_for_launch(k, be.shapes);  // throws on unsupported kernels
  const std::string key = cache_key(ls.src, target);
  std::string kernel_key = key;
  if (ls.reads_numbers) {
    for (int64_t n : ls.numbers) kernel_key += " " + std::to_string(n);
  }
  // Note [Parallel kernel compilation] (NVRTC programs are independent); be.mu only
  // guards the maps and stats.
  std::lock_guard<std::mutex> key_lock(be.key_locks.of(key));
  {
    std::lock_guard<std::mutex> lock(be.mu);
    if (auto it = be.memory.find(kernel_key); it != be.memory.end()) {
      ++be.stats.memory_hits;
      return it->second;
    }
  }
  auto out = std::make_shared<CudaKernel>();
  out->name = k.name;
  bool found = false;
  out->code = code_for(k, ls.src, ls.reads_numbers, target, key, &found);
  out->plan = ls.src.plan;
  if (ls.reads_numbers) out->numbers = std::move(ls.numbers);
  out->num_buffers = k.buffers.size();
  for (const kir::Buffer& b : k.buffers) out->by_value.push_back(b.param);
  TCAP_LOG(Fusion, "cuda: " << k.name << " -> " << out->code->entry << ": " << to_string(out->plan));
  std::lock_guard<std::mutex> lock(be.mu);
  if (ls.reads_numbers && found) ++be.stats.served_at_launch;
  return be.memory.emplace(kernel_key, std::move(out)).first->second;
}

std::string compile_to_ptx(const kir::Kernel& k, int arch, std::string* source) {
  CudaSource src = render(k);
  std::string ptx, log;
  const bool ok = nvrtc_compile(src.source, src.entry, arch, /*cubin=*/false, &ptx, &log);
  TORCH_CHECK(ok, "tcap cuda: NVRTC ", nvrtc_version(), " could not compile kernel ", k.name, " for compute_", arch,
              ":\n", log, "\n--- source ---\n", src.source);
  if (source) *source = std::move(src.source);
  return ptx;
}

void launch(const CudaKernel& k, int device, void* stream, void* const* buffers, size_t num_buffers, void* scratch) {
  const LaunchPlan& p = k.plan;
  TORCH_CHECK(num_buffers == k.num_buffers, "tcap cuda: kernel ", k.name, " takes ", k.num_buffers, " buffers, got ",
              num_buffers);
  if (p.work_items == 0) return;
  TORCH_CHECK(p.scratch_bytes == 0 || scratch, "tcap cuda: kernel ", k.name, " needs ", p.scratch_bytes,
              " bytes of scratch memory and was launched without");
  const CudaCode& code = *k.code;
  void* fn = nullptr;
  {
    std::lock_guard<std::mutex> lock(code.mu);
    auto it = code.functions.find(device);
    if (it == code.functions.end()) it = code.functions.emplace(device, load_function(device, code.binary, code.entry, k.name)).first;
    fn = it->second;
  }
  int64_t grid = 1;
  {
    std::lock_guard<std::mutex> lock(k.mu);
    auto it = k.grids.find(device);
    if (it == k.grids.end()) it = k.grids.emplace(device, launch_grid(p, info_of(device).multiprocessors)).first;
    grid = it->second;
  }
  int vec_ok = vector_path_ok(p, buffers);
  // cuLaunchKernel takes a pointer to each argument: a buffer's data pointer, or a
  // parameter's number, whose address the caller passed (Note [Kernel parameters]).
  c10::SmallVector<void*, 16> params;
  for (size_t b = 0; b < num_buffers; ++b) {
    params.push_back(k.by_value[b] ? buffers[b] : const_cast<void**>(&buffers[b]));
  }
  if (p.scratch_bytes > 0) {
    params.push_back(&scratch);
    cuda::memset32(device, scratch, 0, static_cast<size_t>(p.semaphore_bytes / 4), stream, k.name);  // the semaphores
  }
  // The numbers read at launch: a `tcap_numbers` struct by value, whose bytes are the
  // kernel's numbers in slot order (Note [CUDA sizes at launch]).
  if (code.reads_numbers) params.push_back(const_cast<int64_t*>(k.numbers.data()));
  params.push_back(&vec_ok);
  cuda::launch(device, fn, grid, p.block, stream, params.data(), k.name);
  g_launches.fetch_add(1, std::memory_order_relaxed);
}

CudaStats cuda_stats() {
  Backend& be = backend();
  std::lock_guard<std::mutex> lock(be.mu);
  CudaStats s = be.stats;
  s.launches = g_launches.load();
  return s;
}

void cuda_clear_memory_cache_for_testing() {
  Backend& be = backend();
  {
    std::lock_guard<std::mutex> lock(be.mu);
    be.memory.clear();
    be.code.clear();
  }
  be.shapes.clear();
}

}  // namespace tcap::codegen::cuda
