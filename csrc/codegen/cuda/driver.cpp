#include "codegen/cuda/driver.h"

#include "support/logging.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include <dlfcn.h>

namespace tcap::codegen::cuda {

namespace {

// --- The C ABI of the two libraries (types as in nvrtc.h and cuda.h). ---
using nvrtcResult = int;
using nvrtcProgram = struct _nvrtcProgram*;
using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
constexpr int kAttrMultiprocessors = 16;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
constexpr int kAttrCapabilityMajor = 75;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrCapabilityMinor = 76;

struct Nvrtc {
  void* handle = nullptr;
  std::string path;
  const char* (*GetErrorString)(nvrtcResult) = nullptr;
  nvrtcResult (*Version)(int*, int*) = nullptr;
  nvrtcResult (*GetNumSupportedArchs)(int*) = nullptr;
  nvrtcResult (*GetSupportedArchs)(int*) = nullptr;
  nvrtcResult (*CreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                               const char* const*) = nullptr;
  nvrtcResult (*DestroyProgram)(nvrtcProgram*) = nullptr;
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char* const*) = nullptr;
  nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*GetPTX)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char*) = nullptr;
  std::string error;  // why it could not be loaded
};

struct Driver {
  void* handle = nullptr;
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*Init)(unsigned int) = nullptr;
  CUresult (*DeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*DeviceGetCount)(int*) = nullptr;
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*CtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*CtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*ModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void**, void**) = nullptr;
  CUresult (*MemsetD32Async)(unsigned long long, unsigned int, size_t, CUstream) = nullptr;  // CUdeviceptr is 64-bit
  std::string error;
  std::mutex mu;
  std::unordered_map<int, CUcontext> contexts;  // primary context per device, retained forever
};

template <typename F>
bool bind(void* handle, const char* name, F* slot, std::string* error) {
  *slot = reinterpret_cast<F>(::dlsym(handle, name));
  if (*slot == nullptr && error->empty()) *error = std::string("symbol ") + name + " is missing";
  return *slot != nullptr;
}

// The folder of the loaded LibTorch (libc10.so), to find the wheel's own NVRTC.
std::string torch_lib_dir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&c10::GetCPUAllocator), &info) == 0 || info.dli_fname == nullptr) return "";
  std::string p = info.dli_fname;
  const auto slash = p.rfind('/');
  return slash == std::string::npos ? "" : p.substr(0, slash);
}

Nvrtc* load_nvrtc() {
  static Nvrtc* n = [] {
    auto* r = new Nvrtc();  // leaked: used until exit
    std::vector<std::string> candidates;
    if (const char* e = std::getenv("TCAP_NVRTC_LIBRARY"); e && *e) candidates.emplace_back(e);
    for (const char* s : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}) candidates.emplace_back(s);
    if (const std::string d = torch_lib_dir(); !d.empty()) {
      candidates.push_back(d + "/../../nvidia/cu13/lib/libnvrtc.so.13");
      candidates.push_back(d + "/../../nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
    }
    candidates.emplace_back("/usr/local/cuda/lib64/libnvrtc.so");
    std::string tried;
    for (const auto& c : candidates) {
      r->handle = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (r->handle) {
        r->path = c;
        break;
      }
      tried += (tried.empty() ? "" : ", ") + c;
    }
    if (!r->handle) {
      r->error = "NVRTC was not found (tried " + tried + "; set TCAP_NVRTC_LIBRARY)";
      return r;
    }
    std::string& e = r->error;
    bind(r->handle, "nvrtcGetErrorString", &r->GetErrorString, &e);
    bind(r->handle, "nvrtcVersion", &r->Version, &e);
    bind(r->handle, "nvrtcGetNumSupportedArchs", &r->GetNumSupportedArchs, &e);
    bind(r->handle, "nvrtcGetSupportedArchs", &r->GetSupportedArchs, &e);
    bind(r->handle, "nvrtcCreateProgram", &r->CreateProgram, &e);
    bind(r->handle, "nvrtcDestroyProgram", &r->DestroyProgram, &e);
    bind(r->handle, "nvrtcCompileProgram", &r->CompileProgram, &e);
    bind(r->handle, "nvrtcGetPTXSize", &r->GetPTXSize, &e);
    bind(r->handle, "nvrtcGetPTX", &r->GetPTX, &e);
    bind(r->handle, "nvrtcGetCUBINSize", &r->GetCUBINSize, &e);
    bind(r->handle, "nvrtcGetCUBIN", &r->GetCUBIN, &e);
    bind(r->handle, "nvrtcGetProgramLogSize", &r->GetProgramLogSize, &e);
    bind(r->handle, "nvrtcGetProgramLog", &r->GetProgramLog, &e);
    if (!e.empty()) e = r->path + ": " + e;
    return r;
  }();
  return n;
}

const Nvrtc& nvrtc() {
  Nvrtc* n = load_nvrtc();
  TORCH_CHECK(n->error.empty(), "tcap cuda: ", n->error);
  return *n;
}

void check_nvrtc(nvrtcResult r, const char* call) {
  if (r == 0) return;
  const Nvrtc& n = nvrtc();
  TORCH_CHECK(false, "tcap cuda: ", call, " failed: ", n.GetErrorString ? n.GetErrorString(r) : "?", " (", r, ")");
}

Driver* load_driver() {
  static Driver* d = [] {
    auto* r = new Driver();  // leaked: used until exit
    r->handle = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!r->handle) {
      r->error = "no CUDA driver (libcuda.so.1 cannot be loaded: " + std::string(::dlerror()) + ")";
      return r;
    }
    std::string& e = r->error;
    bind(r->handle, "cuGetErrorString", &r->GetErrorString, &e);
    bind(r->handle, "cuInit", &r->Init, &e);
    bind(r->handle, "cuDeviceGet", &r->DeviceGet, &e);
    bind(r->handle, "cuDeviceGetCount", &r->DeviceGetCount, &e);
    bind(r->handle, "cuDeviceGetAttribute", &r->DeviceGetAttribute, &e);
    bind(r->handle, "cuDevicePrimaryCtxRetain", &r->DevicePrimaryCtxRetain, &e);
    bind(r->handle, "cuCtxGetCurrent", &r->CtxGetCurrent, &e);
    bind(r->handle, "cuCtxSetCurrent", &r->CtxSetCurrent, &e);
    bind(r->handle, "cuModuleLoadData", &r->ModuleLoadData, &e);
    bind(r->handle, "cuModuleGetFunction", &r->ModuleGetFunction, &e);
    bind(r->handle, "cuLaunchKernel", &r->LaunchKernel, &e);
    bind(r->handle, "cuMemsetD32Async", &r->MemsetD32Async, &e);
    if (!e.empty()) {
      e = "libcuda.so.1: " + e;
      return r;
    }
    if (const CUresult res = r->Init(0); res != 0) {
      const char* s = nullptr;
      r->GetErrorString(res, &s);
      e = std::string("cuInit failed: ") + (s ? s : "?") + " (" + std::to_string(res) + ")";
      return r;
    }
    int count = 0;
    if (r->DeviceGetCount(&count) != 0 || count == 0) e = "the CUDA driver reports no device";
    return r;
  }();
  return d;
}

Driver& driver() {
  Driver* d = load_driver();
  TORCH_CHECK(d->error.empty(), "tcap cuda: ", d->error);
  return *d;
}

void check_cu(CUresult r, const char* call, const std::string& what) {
  if (r == 0) return;
  const char* s = nullptr;
  driver().GetErrorString(r, &s);
  TORCH_CHECK(false, "tcap cuda: ", call, " failed for ", what, ": ", s ? s : "unknown error", " (", r, ")");
}

// Makes the primary context of `device` current on this thread (the context LibTorch's
// runtime API calls use), retaining it on first use. Runs on every launch: after a
// thread's first launch on a device it takes no lock, only cuCtxGetCurrent.
void make_current(int device, const std::string& what) {
  Driver& d = driver();
  thread_local std::unordered_map<int, CUcontext> known;  // this thread's view of d.contexts
  CUcontext ctx = nullptr;
  if (auto it = known.find(device); it != known.end()) {
    ctx = it->second;
  } else {
    std::lock_guard<std::mutex> lock(d.mu);
    auto at = d.contexts.find(device);
    if (at == d.contexts.end()) {
      CUdevice dev = 0;
      check_cu(d.DeviceGet(&dev, device), "cuDeviceGet", what);
      check_cu(d.DevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain", what);
      at = d.contexts.emplace(device, ctx).first;
    }
    ctx = at->second;
    known.emplace(device, ctx);
  }
  CUcontext cur = nullptr;
  check_cu(d.CtxGetCurrent(&cur), "cuCtxGetCurrent", what);
  if (cur != ctx) check_cu(d.CtxSetCurrent(ctx), "cuCtxSetCurrent", what);
}

}  // namespace

bool nvrtc_available(std::string* why) {
  Nvrtc* n = load_nvrtc();
  if (why) *why = n->error;
  return n->error.empty();
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  check_nvrtc(nvrtc().Version(&major, &minor), "nvrtcVersion");
  return std::to_string(major) + "." + std::to_string(minor);
}

std::string nvrtc_library_path() { return nvrtc().path; }

std::vector<int> nvrtc_supported_archs() {
  const Nvrtc& n = nvrtc();
  int count = 0;
  check_nvrtc(n.GetNumSupportedArchs(&count), "nvrtcGetNumSupportedArchs");
  std::vector<int> archs(static_cast<size_t>(count));
  if (count > 0) check_nvrtc(n.GetSupportedArchs(archs.data()), "nvrtcGetSupportedArchs");
  return archs;
}

bool nvrtc_compile(const std::string& source, const std::string& name, int arch, bool cubin, std::string* binary,
                   std::string* log) {
  const Nvrtc& n = nvrtc();
  nvrtcProgram prog = nullptr;
  check_nvrtc(n.CreateProgram(&prog, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr),
              "nvrtcCreateProgram");
  struct Destroy {
    const Nvrtc& n;
    nvrtcProgram* p;
    ~Destroy() { n.DestroyProgram(p); }
  } destroy{n, &prog};
  const std::string arch_opt =
      std::string("--gpu-architecture=") + (cubin ? "sm_" : "compute_") + std::to_string(arch);
  const char* opts[] = {arch_opt.c_str(), "--std=c++17", "-default-device", "-lineinfo"};
  const nvrtcResult r = n.CompileProgram(prog, 4, opts);
  size_t log_size = 0;
  check_nvrtc(n.GetProgramLogSize(prog, &log_size), "nvrtcGetProgramLogSize");
  log->assign(log_size, '\0');
  if (log_size > 0) check_nvrtc(n.GetProgramLog(prog, log->data()), "nvrtcGetProgramLog");
  while (!log->empty() && (log->back() == '\0' || log->back() == '\n')) log->pop_back();
  if (r != 0) return false;
  size_t size = 0;
  if (cubin) {
    check_nvrtc(n.GetCUBINSize(prog, &size), "nvrtcGetCUBINSize");
    binary->assign(size, '\0');
    check_nvrtc(n.GetCUBIN(prog, binary->data()), "nvrtcGetCUBIN");
  } else {
    check_nvrtc(n.GetPTXSize(prog, &size), "nvrtcGetPTXSize");
    binary->assign(size, '\0');
    check_nvrtc(n.GetPTX(prog, binary->data()), "nvrtcGetPTX");  // NUL-terminated, as cuModuleLoadData wants
  }
  return true;
}

bool driver_available(std::string* why) {
  Driver* d = load_driver();
  if (why) *why = d->error;
  return d->error.empty();
}

DeviceInfo device_info(int device) {
  Driver& d = driver();
  const std::string what = "device " + std::to_string(device);
  CUdevice dev = 0;
  check_cu(d.DeviceGet(&dev, device), "cuDeviceGet", what);
  int major = 0, minor = 0;
  DeviceInfo info;
  check_cu(d.DeviceGetAttribute(&major, kAttrCapabilityMajor, dev), "cuDeviceGetAttribute", what);
  check_cu(d.DeviceGetAttribute(&minor, kAttrCapabilityMinor, dev), "cuDeviceGetAttribute", what);
  check_cu(d.DeviceGetAttribute(&info.multiprocessors, kAttrMultiprocessors, dev), "cuDeviceGetAttribute", what);
  info.capability = major * 10 + minor;
  return info;
}

void* load_function(int device, const std::string& image, const std::string& entry, const std::string& what) {
  Driver& d = driver();
  make_current(device, what);
  CUmodule mod = nullptr;
  check_cu(d.ModuleLoadData(&mod, image.data()), "cuModuleLoadData", what);
  CUfunction fn = nullptr;
  check_cu(d.ModuleGetFunction(&fn, mod, entry.c_str()), "cuModuleGetFunction", what);
  return fn;
}

void launch(int device, void* fn, int64_t grid, int block, void* stream, void** params, const std::string& what) {
  Driver& d = driver();
  make_current(device, what);
  check_cu(d.LaunchKernel(static_cast<CUfunction>(fn), static_cast<unsigned>(grid), 1, 1, static_cast<unsigned>(block),
                          1, 1, 0, static_cast<CUstream>(stream), params, nullptr),
           "cuLaunchKernel", what);
}

void memset32(int device, void* ptr, unsigned int value, size_t count, void* stream, const std::string& what) {
  Driver& d = driver();
  make_current(device, what);
  check_cu(d.MemsetD32Async(static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(ptr)), value, count,
                            static_cast<CUstream>(stream)),
           "cuMemsetD32Async", what);
}

}  // namespace tcap::codegen::cuda
