// Runtime of fused kernels: the kernel table of a compiled graph, whose
// `tcap::fused(Tensor[] inputs, int kernel) -> Tensor[]` nodes name their kernels by place
// in it, output buffers, and the parallel launch.
//
// Note [A compiled graph owns its kernels]
// The fusion pass hands each group it keeps to the backend, which makes the group's kernel
// (a FusedKernel: generated code, the recorded metadata it is specialised to, the group's
// ATen ops) and appends it to the KernelTable of the graph being compiled; the fused node
// holds the kernel's place in that table. The table goes to the graph's interpreters,
// which resolve each fused node once when they are built, so the kernels live exactly as
// long as the executable that runs them and nothing outside it can name them: there is
// no process-wide registry, no finder installed in the interpreter, and no list of ids
// to release. A graph with fused nodes (a TCAP_DUMP_DIR `*.fused.json`) is therefore
// runnable only as the executable it was compiled into; its interpreter refuses it
// without its table, naming the node. A replay recorded by a capture (a compiled
// function called inside another's capture, or compiled autograd's) records the ATen ops
// each kernel stands for (interp::DirectCall::call_ops), not the kernel.
//
// Note [Fused kernel outputs]
// A kernel's outputs are allocated with the recorded sizes and strides (so they look
// exactly like eager's), through LibTorch's CPU allocator inside a PoolScope: a
// steady-state step takes its blocks from the CPU buffer pool and allocates no new ones
// (Note [CPU buffer pool]; docs/memory.md on why that matters: fresh pages are faulted in
// on every call otherwise).
//
// On CUDA (a kernel with `cuda` set) outputs come from LibTorch's caching allocator
// instead (it already reuses blocks per stream) and the kernel is launched on the
// current stream of its device.
//
// Note [Fused kernel guards]
// A kernel is specialised to the recorded device, dtypes, sizes and strides of its inputs. Each
// call checks them (a few compares per input); on a mismatch it runs the group's original
// ATen ops through the interpreter instead and logs why once (TCAP_LOGS=graph_breaks).
#pragma once

#include "codegen/cpu_llvm/cpu_llvm.h"
#include "codegen/cuda/cuda.h"
#include "interp/direct_calls.h"
#include "kir/kir.h"

#include <tcap/graph.h>
#include <tcap/interpreter.h>

#include <ATen/core/Tensor.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace tcap::runtime {

struct FusedKernel;

// Note [A backend's kernel object]
// What a backend makes of a fused group: its code, as one object that launches itself.
// A FusedKernel holds one and nothing of any backend (its guards, fallback graph and
// statistics are the same for all), so a backend is a row of the backend table (its
// name, availability, device and maker: compiler/backends.cpp) and a KernelCode of its
// own; nothing here branches on which backend made a kernel. The CPU and CUDA codes live
// here because their launches need this file's build (OpenMP for at::parallel_for, the
// buffer pool); a backend's code may live anywhere.
class KernelCode {
 public:
  virtual ~KernelCode() = default;
  // Runs the code of k on `inputs`, which passed k's guards (the recorded devices, dtypes,
  // sizes and strides); returns k's outputs, those written into an input included.
  virtual std::vector<at::Tensor> launch(const FusedKernel& k, const std::vector<at::Tensor>& inputs) const = 0;
  // TCAP_DUMP_DIR's file of the code: its extension (".ll", ".cu") and text; an empty
  // extension when there is none.
  virtual std::pair<std::string, std::string> dump() const { return {}; }
};

// The llvm backend's code: one CPU kernel, or a split reduction's sequence (Note [Split
// reductions], kir/split_reduction.h): `main` computes the first partials, the kernels of
// `then` run after it in order; all take the kernel's buffers and then scratch buffers of
// these many bytes.
struct CpuCode final : KernelCode {
  std::shared_ptr<const codegen::cpu_llvm::CpuKernel> main;
  std::vector<std::shared_ptr<const codegen::cpu_llvm::CpuKernel>> then;
  std::vector<int64_t> scratch_bytes;
  // Whether it is one kernel over one range, which a horizontal launch can share.
  bool single() const { return then.empty() && scratch_bytes.empty(); }
  std::vector<at::Tensor> launch(const FusedKernel& k, const std::vector<at::Tensor>& inputs) const override;
  std::pair<std::string, std::string> dump() const override;
};

// The cuda backend's code, launched on the current stream of the kernel's device.
struct CudaCode final : KernelCode {
  std::shared_ptr<const codegen::cuda::CudaKernel> cuda;
  std::vector<at::Tensor> launch(const FusedKernel& k, const std::vector<at::Tensor>& inputs) const override;
  std::pair<std::string, std::string> dump() const override;
};

struct FusedKernel : interp::DirectCall {
  std::string name;
  kir::Kernel kernel;
  c10::Device device = c10::Device(c10::kCPU);
  // Note [A backend's kernel object]. Written before the kernel joins its graph's table,
  // or (a kernel compiled later) before `code` becomes Ready; read only after `code` is
  // Ready.
  std::shared_ptr<const KernelCode> compiled;
  std::vector<ir::TensorMeta> inputs;   // recorded metadata, in kernel buffer order
  std::vector<ir::TensorMeta> outputs;
  ir::Graph fallback;                   // the group's ATen ops (inputs -> outputs)
  // Per output: the input it is written into (the kernel gets that input's buffer as the
  // output's, and the input's version counter is bumped, as an in-place op bumps it), or
  // -1 for a buffer of its own (Note [Fused results written in place], fuse/fusion.cpp).
  // Set before the kernel first runs; empty when no output is.
  std::vector<int> output_into_input;

  // Whether `compiled` exists (Note [Kernels compiled in the background]): a kernel that
  // is Compiling, or Failed to compile there, runs its fallback graph.
  enum Code : int { Ready = 0, Compiling = 1, Failed = 2 };
  std::atomic<int> code{Ready};

  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> fallbacks{0};

  // Internal state (fallback interpreter).
  std::mutex mu;
  std::unique_ptr<Interpreter> fallback_interp;
  bool logged_fallback = false;
  ~FusedKernel() override;
  std::vector<at::Tensor> call(const std::vector<at::Tensor>& inputs) override;
  std::vector<at::Tensor> call_ops(const std::vector<at::Tensor>& inputs) override;
};

// `tcap::fused_horizontal(Tensor[] inputs, int[] kernels, int[] arity) -> Tensor[]`: the
// kernels, independent of each other, launched together (Note [Horizontal kernels] in
// fuse/horizontal.cpp); kernel i takes the next arity[i] inputs, and the results are the
// kernels' results in order.
struct HorizontalKernel : interp::DirectCall {
  std::string name;  // "fused_horizontal_<first kernel's place>_x<kernels>", in the profiler
  std::vector<std::shared_ptr<FusedKernel>> members;
  std::vector<int64_t> arity;
  std::vector<at::Tensor> call(const std::vector<at::Tensor>& inputs) override;
  std::vector<at::Tensor> call_ops(const std::vector<at::Tensor>& inputs) override;
  // `inputs` cut into each member's, by `arity`; throws when the counts do not add up.
  std::vector<std::vector<at::Tensor>> inputs_of_members(const std::vector<at::Tensor>& inputs) const;
};

// Note [A compiled graph owns its kernels]: the kernels of one compiled graph, in the
// order the graph's fused nodes name them. `add` may be called from several threads at
// once (the fusion pass compiles groups in parallel); the table is read-only once the
// graph's first interpreter is built from it.
class KernelTable : public interp::DirectCalls {
 public:
  // Appends k; returns its place, the number a fused node names it by.
  int64_t add(std::shared_ptr<FusedKernel> k);
  // Puts k at `place` (a place left empty so far; the table grows to it); returns place.
  int64_t put(int64_t place, std::shared_ptr<FusedKernel> k);
  // The kernel at place i, or null when there is none.
  std::shared_ptr<FusedKernel> at(int64_t i) const;
  size_t size() const;  // places, empty ones included
  // tcap::fused: its kernel; tcap::fused_horizontal: its kernels launched together.
  std::shared_ptr<interp::DirectCall> find(const ir::Node& n) const override;

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<FusedKernel>> kernels_;
};

// Process-wide counters (tests, benchmarks).
struct RuntimeStats {
  int64_t launches = 0;   // fused kernel calls that ran generated code
  int64_t fallbacks = 0;  // calls that ran the group's ATen ops (Note [Fused kernel guards])
  int64_t split_launches = 0;  // CPU launches whose range ran on more than one thread
  int64_t horizontal_launches = 0;  // tcap::fused_horizontal calls (their kernels count in `launches`)
};
RuntimeStats runtime_stats();

// Runs kernel k on `inputs`: what the interpreter calls for a `tcap::fused` node whose
// kernel it resolved when it was built (Note [Direct fused calls] in interpreter.cpp).
std::vector<at::Tensor> run_fused(FusedKernel& k, const std::vector<at::Tensor>& inputs);

}  // namespace tcap::runtime
