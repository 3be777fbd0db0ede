// The one file that talks to NVRTC and the CUDA driver API (D7).
//
// Both libraries are loaded with dlopen on first use, never linked: libtcap builds and
// runs without the CUDA toolkit or a driver, and a machine without them gets a one-line
// reason instead of a loader error. NVRTC is searched as TCAP_NVRTC_LIBRARY, then
// libnvrtc.so.13 / .12 / libnvrtc.so on the loader path, then next to LibTorch (the PyPI
// wheel's nvidia/cu13/lib), then /usr/local/cuda/lib64. The driver is libcuda.so.1.
//
// The types below are the driver's and NVRTC's own, declared here (opaque handles, int
// result codes) so that no CUDA header is needed to build.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tcap::codegen::cuda {

// NVRTC.
bool nvrtc_available(std::string* why = nullptr);
std::string nvrtc_version();         // "13.0"; throws if NVRTC cannot be loaded
std::string nvrtc_library_path();    // where it was loaded from
std::vector<int> nvrtc_supported_archs();  // compute capabilities as 75, 80, 90, ...

// Compiles one translation unit. arch is a compute capability (90); `cubin` asks for
// machine code for sm_<arch>, otherwise PTX for compute_<arch>. Returns false with the
// compiler log in *log when the source does not compile; throws on API failures.
bool nvrtc_compile(const std::string& source, const std::string& name, int arch, bool cubin, std::string* binary,
                   std::string* log);

// The driver.
bool driver_available(std::string* why = nullptr);  // libcuda loads and cuInit succeeds

struct DeviceInfo {
  int capability = 0;        // 90 for sm_90
  int multiprocessors = 0;
};
DeviceInfo device_info(int device);

// Loads a cubin or PTX image into device `device`'s primary context and returns the
// function `entry` (a CUfunction). The module is never unloaded: kernels live as long as
// the process, as in the CPU backend. `what` names the kernel in error messages.
void* load_function(int device, const std::string& image, const std::string& entry, const std::string& what);

// Launches `fn` on `stream` (a cudaStream_t / CUstream) with the primary context of
// `device` current. params: the kernel's argument pointers, as cuLaunchKernel takes them.
void launch(int device, void* fn, int64_t grid, int block, void* stream, void** params, const std::string& what);

// Sets `count` 32-bit words at device address `ptr` to `value`, in `stream`'s order
// (cuMemsetD32Async). `what` names the kernel the memory is for in error messages.
void memset32(int device, void* ptr, unsigned int value, size_t count, void* stream, const std::string& what);

}  // namespace tcap::codegen::cuda
