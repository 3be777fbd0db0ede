#include "cache/context_settings.h"

#include <ATen/Context.h>

#include <iterator>
#include <string_view>

namespace tcap::cache {
namespace {

at::Context& ctx() { return at::globalContext(); }

int64_t b(bool v) { return v ? 1 : 0; }

// The attention backends in the order SDPA tries them, one byte each.
int64_t sdp_order() {
  int64_t packed = 0;
  for (at::SDPBackend s : ctx().sDPPriorityOrder()) packed = packed * 256 + (static_cast<int64_t>(s) + 1);
  return packed;
}

template <at::Float32Backend B, at::Float32Op O>
int64_t fp32() {
  return static_cast<int64_t>(ctx().float32Precision(B, O));
}

using FB = at::Float32Backend;
using FO = at::Float32Op;

// The setters that write at::Context's float32 precision table, legacy ones included
// (setAllowTF32CuBLAS and setFloat32MatmulPrecision write the table's CUDA and oneDNN
// matmul rows, setAllowTF32CuDNN its CUDA conv and rnn rows). The table is read row by
// row: the legacy getters (float32MatmulPrecision) throw once the new API has been used.
constexpr const char* kFp32Setters = "setFloat32Precision setFloat32MatmulPrecision setAllowTF32CuBLAS setAllowTF32CuDNN";

using K = ContextSetting::Kind;

const ContextSetting kSettings[] = {
    {"cuDNN enabled", "setUserEnabledCuDNN", [] { return b(ctx().userEnabledCuDNN()); }, K::Flag},
    {"oneDNN enabled", "setUserEnabledMkldnn", [] { return b(ctx().userEnabledMkldnn()); }, K::Flag},
    {"cuDNN benchmark", "setBenchmarkCuDNN", [] { return b(ctx().benchmarkCuDNN()); }, K::Flag},
    {"cuDNN benchmark limit", "setBenchmarkLimitCuDNN", [] { return int64_t{ctx().benchmarkLimitCuDNN()}; }, K::Number},
    {"MIOpen immediate mode", "setImmediateMiopen", [] { return b(ctx().immediateMiopen()); }, K::Flag},
    {"cuDNN deterministic", "setDeterministicCuDNN", [] { return b(ctx().deterministicCuDNN()); }, K::Flag},
    {"oneDNN deterministic", "setDeterministicMkldnn", [] { return b(ctx().deterministicMkldnn()); }, K::Flag},
    {"NNPACK enabled", "setUserEnabledNNPACK", [] { return b(ctx().userEnabledNNPACK()); }, K::Flag},
    {"attention backend order", "setSDPPriorityOrder", sdp_order, K::Number},
    {"flash attention", "setSDPUseFlash", [] { return b(ctx().userEnabledFlashSDP()); }, K::Flag},
    {"flash attention 3", "setSDPUseFA3", [] { return b(ctx().userEnabledFA3SDP()); }, K::Flag},
    {"memory-efficient attention", "setSDPUseMemEfficient", [] { return b(ctx().userEnabledMemEfficientSDP()); }, K::Flag},
    {"math attention", "setSDPUseMath", [] { return b(ctx().userEnabledMathSDP()); }, K::Flag},
    {"cuDNN attention", "setSDPUseCuDNN", [] { return b(ctx().userEnabledCuDNNSDP()); }, K::Flag},
    {"fp16/bf16 reduction in math attention", "setAllowFP16BF16ReductionMathSDP",
     [] { return b(ctx().allowFP16BF16ReductionMathSDP()); }, K::Flag},
    {"overrideable attention", "setSDPUseOverrideable", [] { return b(ctx().userEnabledOverrideableSDP()); }, K::Flag},
    {"preferred linalg backend", "setLinalgPreferredBackend",
     [] { return static_cast<int64_t>(ctx().linalgPreferredBackend()); }, K::Number},
    {"preferred BLAS backend", "setBlasPreferredBackend",
     [] { return static_cast<int64_t>(ctx().blasPreferredBackend()); }, K::Number},
    {"preferred ROCm flash-attention backend", "setROCmFAPreferredBackend",
     [] { return static_cast<int64_t>(ctx().getROCmFAPreferredBackend()); }, K::Number},
    {"deterministic algorithms", "setDeterministicAlgorithms", [] { return b(ctx().deterministicAlgorithms()); }, K::Flag},
    {"deterministic algorithms warn only", "setDeterministicAlgorithms",
     [] { return b(ctx().deterministicAlgorithms() && ctx().deterministicAlgorithmsWarnOnly()); }, K::Flag},
    {"deterministic fill of uninitialized memory", "setDeterministicFillUninitializedMemory",
     [] { return b(ctx().deterministicFillUninitializedMemory()); }, K::Flag},
    {"float32 precision (generic)", kFp32Setters, fp32<FB::GENERIC, FO::ALL>, K::Precision},
    {"float32 precision (CUDA)", kFp32Setters, fp32<FB::CUDA, FO::ALL>, K::Precision},
    {"float32 precision (CUDA matmul)", kFp32Setters, fp32<FB::CUDA, FO::MATMUL>, K::Precision},
    {"float32 precision (CUDA conv)", kFp32Setters, fp32<FB::CUDA, FO::CONV>, K::Precision},
    {"float32 precision (CUDA rnn)", kFp32Setters, fp32<FB::CUDA, FO::RNN>, K::Precision},
    {"float32 precision (oneDNN)", kFp32Setters, fp32<FB::MKLDNN, FO::ALL>, K::Precision},
    {"float32 precision (oneDNN matmul)", kFp32Setters, fp32<FB::MKLDNN, FO::MATMUL>, K::Precision},
    {"float32 precision (oneDNN conv)", kFp32Setters, fp32<FB::MKLDNN, FO::CONV>, K::Precision},
    {"float32 precision (oneDNN rnn)", kFp32Setters, fp32<FB::MKLDNN, FO::RNN>, K::Precision},
    {"fp16 reduction in cuBLAS", "setAllowFP16ReductionCuBLAS",
     [] { return static_cast<int64_t>(ctx().allowFP16ReductionCuBLAS()); }, K::Number},
    {"bf16 reduction in cuBLAS", "setAllowBF16ReductionCuBLAS",
     [] { return static_cast<int64_t>(ctx().allowBF16ReductionCuBLAS()); }, K::Number},
    {"fp16 accumulation in cuBLAS", "setAllowFP16AccumulationCuBLAS",
     [] { return b(ctx().allowFP16AccumulationCuBLAS()); }, K::Flag},
    {"SM carveout of matmuls", "_setSMCarveout_EXPERIMENTAL",
     [] {
       auto c = ctx()._SMCarveout_EXPERIMENTAL();
       return c ? int64_t{*c} : int64_t{-1};
     }, K::Number},
    {"quantized engine", "setQEngine", [] { return static_cast<int64_t>(ctx().qEngine()); }, K::Number},
    {"sparse tensor invariant checks", "setCheckSparseTensorInvariants",
     [] {
       auto c = ctx().checkSparseTensorInvariants(/*warn_when_uninitialized=*/false);
       return c ? b(*c) : int64_t{-1};
     }, K::Number},
    {"fp16 reduction on the CPU", "setAllowFP16ReductionCPU", [] { return b(ctx().allowFP16ReductionCPU()); }, K::Flag},
    {"TF32 in oneDNN", "setAllowTF32OneDNN", [] { return b(ctx().allowTF32OneDNN()); }, K::Flag},
};
static_assert(std::size(kSettings) == kContextSettings, "kContextSettings (context_settings.h) counts kSettings");

std::string show(size_t k, int64_t v) {
  switch (kSettings[k].kind) {
    case K::Flag: return v ? "on" : "off";
    case K::Precision:
      switch (static_cast<at::Float32Precision>(v)) {
        case at::Float32Precision::NONE: return "none";
        case at::Float32Precision::IEEE: return "ieee";
        case at::Float32Precision::TF32: return "tf32";
        case at::Float32Precision::BF16: return "bf16";
      }
      break;
    case K::Number: break;
  }
  return std::to_string(v);
}

}  // namespace

c10::ArrayRef<ContextSetting> context_settings() { return kSettings; }

ContextValues read_context() {
  ContextValues v{};
  for (size_t k = 0; k < kContextSettings; ++k) v[k] = kSettings[k].read();
  return v;
}

bool context_matches(const ContextValues& v) {
  for (size_t k = 0; k < kContextSettings; ++k) {
    if (kSettings[k].read() != v[k]) return false;
  }
  return true;
}

std::string context_mismatch(const ContextValues& was, const ContextValues& now) {
  for (size_t k = 0; k < kContextSettings; ++k) {
    if (was[k] != now[k]) {
      return std::string(kSettings[k].name) + " changed: " + show(k, was[k]) + " -> " + show(k, now[k]);
    }
  }
  return "";
}

std::vector<std::string> describe_context(const ContextValues& v) {
  std::vector<std::string> out;
  for (size_t k = 0; k < kContextSettings; ++k) {
    if (std::string_view(kSettings[k].setters) == "setDeterministicAlgorithms" && v[k]) {
      out.push_back(std::string(kSettings[k].name) + " on");
    }
  }
  out.push_back("the " + std::to_string(kContextSettings) + " settings of at::Context as captured");
  return out;
}

const std::vector<std::pair<std::string, std::string>>& context_setters_not_guarded() {
  static const std::vector<std::pair<std::string, std::string>> kNot = {
      {"setFlushDenormal",
       "the calling thread's floating-point mode (FTZ/DAZ): replayed kernels run on the threads eager would, under "
       "the mode set there, and nothing recorded depends on it"},
      {"setReleaseWeightsWhenPrepacking", "memory of prepacked mobile weights, not results"},
      {"setDisplayVmapFallbackWarnings", "warnings only"},
      {"setWarnOnAccumulateGradStreamMismatch", "warnings only"},
      {"setDefaultMobileCPUAllocator", "which allocator serves memory, not results"},
      {"unsetDefaultMobileCPUAllocator", "which allocator serves memory, not results"},
  };
  return kNot;
}

}  // namespace tcap::cache
