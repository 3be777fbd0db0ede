// The host side of the CUDA emulator: compile and load kernel libraries (their launches run
// in cuda_emu_grid.cpp). See Note [CUDA host emulation] in cuda_emu.h.
#include "support/cuda_emu.h"
#include "support/cuda_emu_grid.h"

#include "codegen/cuda/cuda.h"
#include "codegen/cuda/driver.h"
#include "codegen/cuda/render.h"
#include "codegen/kernel_cache.h"
#include "compiler/pipeline.h"
#include "fuse/fusion.h"
#include "runtime/fused_kernel.h"
#include "support/logging.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef TCAP_EMU_CXX
#define TCAP_EMU_CXX "c++"
#endif
#ifndef TCAP_EMU_LAUNCHER
#define TCAP_EMU_LAUNCHER ""
#endif
#ifndef TCAP_EMU_CACHE_DIR
#define TCAP_EMU_CACHE_DIR "/tmp/tcap-cuda-emu"
#endif
#ifndef TCAP_EMU_DEVICE_H
#error "TCAP_EMU_DEVICE_H must name test/support/cuda_emu_device.h"
#endif

namespace tcap::testing::cuda_emu {

namespace {

namespace cg = tcap::codegen::cuda;

using Extent = BufferExtent;
using grid::EmuKernel;

std::atomic<int64_t> g_built{0}, g_hits{0};
std::mutex g_sources_mu;
std::set<std::string> g_sources;  // the key hashes of the sources built or loaded

}  // namespace

std::vector<BufferExtent> buffer_extents(const kir::Kernel& k) {
  std::vector<BufferExtent> out(k.buffers.size());
  for (size_t b = 0; b < k.buffers.size(); ++b) {
    out[b].elem_size = kir::dtype_size(k.buffers[b].dtype);
    out[b].is_output = k.buffers[b].is_output;
  }
  auto reach = [&](int32_t b, const std::vector<int64_t>& strides, int64_t offset) {
    int64_t lo = offset, hi = offset;
    for (size_t d = 0; d < k.sizes.size(); ++d) {
      const int64_t span = (k.sizes[d] - 1) * strides[d];
      (span < 0 ? lo : hi) += span;
    }
    Extent& e = out[static_cast<size_t>(b)];
    if (e.hi < e.lo) {
      e.lo = lo;
      e.hi = hi;
    } else {
      e.lo = std::min(e.lo, lo);
      e.hi = std::max(e.hi, hi);
    }
  };
  for (const auto& in : k.instrs) {
    if (in.op == kir::OpCode::Load) reach(in.buffer, in.strides, in.offset);
  }
  for (const auto& st : k.stores) reach(st.buffer, st.strides, st.offset);
  return out;
}

namespace {

// --- building kernel libraries ---------------------------------------------------------

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string compiler() {
  const char* e = std::getenv("TCAP_EMU_CXX");
  return e && *e ? e : TCAP_EMU_CXX;
}

// Runs a shell command; its output goes to `log`. Returns the exit status.
int run(const std::string& cmd, std::string* log) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) log->append(buf, n);
  const int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// TCAP_EMU_CACHE_DIR, else the build folder's (not tcap's kernel cache, which the codegen
// tests point at a fresh folder per process).
const std::string& emu_dir() {
  static const std::string dir = [] {
    const char* e = std::getenv("TCAP_EMU_CACHE_DIR");
    std::string d = e && *e ? e : TCAP_EMU_CACHE_DIR;
    ::mkdir(d.c_str(), 0755);
    return d;
  }();
  return dir;
}

// The device header's text (part of every cache key), read once.
const std::string& device_header() {
  static const std::string text = read_file(TCAP_EMU_DEVICE_H);
  TORCH_CHECK(!text.empty(), "cuda_emu: cannot read ", TCAP_EMU_DEVICE_H);
  return text;
}

std::string launcher() {
  const char* e = std::getenv("TCAP_EMU_LAUNCHER");
  return e ? e : TCAP_EMU_LAUNCHER;
}

codegen::KeyLocks g_build_locks;

}  // namespace

bool available(std::string* why) {
  static const std::string reason = [] {
    std::string log;
    const int st = run(quote(compiler()) + " --version", &log);
    return st == 0 ? std::string() : "the host compiler " + compiler() + " does not run: " + log;
  }();
  if (why) *why = reason;
  return reason.empty();
}

namespace {

// The emulated kernel behind a library's entry comes with each call, in the CPU kernel's
// numbers: [the EmuKernel's address, whether numbers follow, the numbers read at launch...]
// (one library serves every kernel of a structure, Note [CUDA sizes at launch]).
std::shared_ptr<const codegen::cpu_llvm::CpuKernel> build_library(const std::string& name, const cg::CudaSource& src,
                                                        const Options& o, std::vector<Extent> extents,
                                                        std::vector<int64_t> numbers = {}, bool reads_numbers = false) {
  std::ostringstream tu;
  tu << src.source << "\n// --- tcap cuda_emu trailer\n"
     << "static void tcap_emu_call(void* const* args, int vec_ok) { tcap_emu_invoke(" << src.entry
     << ", args, vec_ok); }\n"
     << "extern \"C\" void tcap_emu_bind(const tcap_emu_api* api) { tcap_emu = api; }\n"
     << "extern \"C\" void tcap_emu_entry(void* const* args, int64_t, int64_t, const int64_t* n) {\n"
     << "  tcap_emu->launch(reinterpret_cast<void*>(n[0]), tcap_emu_call, args, n[1] ? n + 2 : nullptr);\n}\n";
  const std::string flags = "-std=c++17 -O1 -fPIC -w";
  const std::string key = compiler() + "\n" + flags + "\n" + device_header() + "\n" + tu.str();
  const std::string key_hash = kir::hash_hex(kir::fnv1a(key));
  const std::string base = emu_dir() + "/" + src.entry + "-" + key_hash;
  const std::string so = base + ".so";

  // One build per kernel at a time; different kernels build in parallel (tcap compiles a
  // graph's kernels on several threads, Note [Parallel kernel compilation]).
  std::lock_guard<std::mutex> lock(g_build_locks.of(key));
  if (exists(so)) {
    g_hits.fetch_add(1);
  } else {
    // Test processes run in parallel and may build the same kernel: every file appears
    // under its final name only when complete (the source keeps one name, for ccache).
    const std::string cpp = base + ".cpp";
    {
      const std::string part = cpp + "." + std::to_string(::getpid());
      {
        std::ofstream f(part, std::ios::binary);
        f << tu.str();
      }
      TORCH_CHECK(::rename(part.c_str(), cpp.c_str()) == 0, "cuda_emu: cannot write ", cpp);
    }
    // Compile (through ccache when the build uses it, so fresh clones reuse objects), then
    // link.
    const std::string tmp = base + "." + std::to_string(::getpid());
    const std::string cxx = quote(compiler());
    const std::string cc = launcher().empty() ? cxx : quote(launcher()) + " " + cxx;
    std::string log;
    int st = run(cc + " " + flags + " -c -include " + quote(TCAP_EMU_DEVICE_H) + " " + quote(cpp) + " -o " +
                     quote(tmp + ".o"),
                 &log);
    if (st == 0) st = run(cxx + " -shared " + quote(tmp + ".o") + " -o " + quote(tmp + ".so"), &log);
    ::unlink((tmp + ".o").c_str());
    TORCH_CHECK(st == 0, "cuda_emu: the host compiler could not compile kernel ", name, " (", cpp, "):\n", log);
    TORCH_CHECK(::rename((tmp + ".so").c_str(), so.c_str()) == 0, "cuda_emu: cannot move ", tmp, ".so to ", so);
    g_built.fetch_add(1);
  }
  {
    std::lock_guard<std::mutex> sources_lock(g_sources_mu);
    g_sources.insert(key_hash);
  }
  void* h = ::dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(h, "cuda_emu: cannot load ", so, ": ", ::dlerror());
  auto bind = reinterpret_cast<void (*)(const tcap_emu_api*)>(::dlsym(h, "tcap_emu_bind"));
  auto entry = reinterpret_cast<codegen::cpu_llvm::CpuKernel::Fn>(::dlsym(h, "tcap_emu_entry"));
  TORCH_CHECK(bind && entry, "cuda_emu: ", so, " lacks tcap_emu_bind / tcap_emu_entry");
  // Kernel libraries stay loaded for the process (kernels may be shared by executables).
  auto* ek = new EmuKernel{name, src.entry, src.plan, o, std::move(extents), numbers};  // lives for the process
  bind(&grid::api());
  auto ck = std::make_shared<codegen::cpu_llvm::CpuKernel>();
  ck->fn = entry;
  ck->numbers = {static_cast<int64_t>(reinterpret_cast<intptr_t>(ek)), reads_numbers ? 1 : 0};
  if (reads_numbers) ck->numbers.insert(ck->numbers.end(), numbers.begin(), numbers.end());
  ck->name = src.entry;
  ck->key_hash = key_hash;
  ck->range = 1;
  ck->grain = 1;
  return ck;
}

}  // namespace

std::shared_ptr<const codegen::cpu_llvm::CpuKernel> build(const kir::Kernel& k, const Options& o) {
  cg::LaunchSource ls = cg::render_for_launch(k, shapes());
  return build_library(k.name, ls.src, o, buffer_extents(k), std::move(ls.numbers), ls.reads_numbers);
}

cg::LaunchShapes& shapes() {
  static auto* s = [] {
    auto* made = new cg::LaunchShapes;
    const char* e = std::getenv("TCAP_EMU_NUMBERS_AT_LAUNCH");
    if (e && std::string(e) == "1") made->read_everything_for_testing(true);
    return made;
  }();
  return *s;
}

std::shared_ptr<const codegen::cpu_llvm::CpuKernel> build_source(const std::string& name, const cg::CudaSource& src,
                                                       const Options& o, const kir::Kernel* bounds) {
  return build_library(name, src, o, bounds ? buffer_extents(*bounds) : std::vector<Extent>{});
}

tcap::Executable compiler(const ir::Graph& g, bool also_ptx, const Options& o) {
  static const int arch = [] {
    std::string why;
    if (!cg::nvrtc_available(&why)) return 0;
    auto archs = cg::nvrtc_supported_archs();
    return std::find(archs.begin(), archs.end(), 90) != archs.end() ? 90 : *std::min_element(archs.begin(), archs.end());
  }();
  // Strict: a kernel the fusion pass forms must render, compile (host and PTX) and load,
  // or the test fails here (the cuda backend would leave it to ATen and log why).
  return fused_backend(g, "cuda_emu", "", c10::Device(c10::kCPU),
                       [&o, also_ptx](const fuse::FusedGroup& fg, runtime::FusedKernel& fk) {
                         try {
                           if (also_ptx && arch > 0) {
                             const std::string ptx = cg::compile_to_ptx(fg.kernel, arch);
                             TORCH_CHECK(ptx.find(".entry") != std::string::npos, "no .entry in the PTX");
                           }
                           auto code = std::make_shared<runtime::CpuCode>();
                           code->main = build(fg.kernel, o);
                           fk.compiled = std::move(code);
                         } catch (const std::exception& e) {
                           const auto* ce = dynamic_cast<const c10::Error*>(&e);
                           ADD_FAILURE() << "kernel " << fg.name << " cannot be emulated:\n"
                                         << (ce ? ce->what_without_backtrace() : e.what());
                           throw;
                         }
                       });
}

Stats stats() {
  Stats s;
  s.built = g_built.load();
  s.cache_hits = g_hits.load();
  {
    std::lock_guard<std::mutex> lock(g_sources_mu);
    s.sources = static_cast<int64_t>(g_sources.size());
  }
  const grid::LaunchCounts c = grid::launch_counts();
  s.launches = c.launches;
  s.vector_launches = c.vector_launches;
  s.column_launches = c.column_launches;
  s.split_launches = c.split_launches;
  s.fiber_switches = c.fiber_switches;
  return s;
}

}  // namespace tcap::testing::cuda_emu
