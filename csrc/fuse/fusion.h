// The fusion pass: groups pointwise ops and reductions of a forward or backward graph into
// kernels (kir::Kernel) and rewrites the graph so each group is one `tcap::fused` call.
#pragma once

#include "kir/kir.h"
#include "support/stage_clock.h"

#include <tcap/graph.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tcap::fuse {

// Node and value ids of a group refer to the graph the fusion pass grouped: the input graph
// after decompose_for_fusion (decompose.h), which may differ from the graph handed to fuse().
struct FusedGroup {
  std::string name;                  // "fused_3_add_cos_cos"
  std::vector<ir::NodeId> nodes;     // in order
  std::vector<ir::ValueId> inputs;   // values the kernel reads (kernel buffers 0..)
  std::vector<ir::ValueId> outputs;  // values it writes (the buffers after the inputs)
  std::vector<ir::TensorMeta> input_metas;  // per input: the recorded tensor
  // Layout the kernel writes each output in: the recorded one when it is dense (the usual
  // case: eager's TensorIterator layout), else contiguous. See Note [Fused output layout].
  std::vector<ir::TensorMeta> output_metas;
  kir::Kernel kernel;
  int64_t kernel_id = -1;            // from FusionOptions::compile
  // Its place among the groups handed to FusionOptions::compile, in group order: a backend
  // may keep its kernel there, so that the fused graph does not depend on the order in
  // which compiles on several threads finish (Note [Parallel kernel compilation]).
  int64_t ordinal = -1;
  // The group's nodes as a standalone graph (inputs -> outputs): the runtime runs it
  // through the interpreter if a call ever sees tensors unlike the recorded ones.
  ir::Graph fallback;
  // Per output: the input whose buffer the kernel writes it into, or -1 for a buffer of
  // its own (Note [Fused results written in place] in fusion.cpp). Decided when the graph
  // is rewritten, after the kernel is compiled: the same code serves either way.
  std::vector<int> output_into_input;
};

// Note [Parallel kernel compilation]
// A graph's kernels are independent, and compiling them is most of a cold compile (LLVM's
// O3 pipeline and code generation, 10-25 ms a kernel; NVRTC, more). fuse() therefore forms
// and lowers every group first, then calls `compile` for the groups on up to
// `compile_threads` threads at once, and keeps or dissolves the groups in group order
// afterwards: the fused graph and the decisions do not depend on the number of threads
// (only the order of the backends' per-kernel log lines does). The backends make this
// safe: cpu_llvm compiles each kernel in its own LLVM context with the thread's own
// TargetMachine and links under a lock; cuda runs NVRTC programs side by side; both (and
// the tests' CUDA emulator) compile one kernel key at a time, so that a second caller
// finds the first one's kernel, and guard their caches with a mutex.
// TCAP_SMALL_MATMUL_MACS when set (0 turns small-matmul kernels off), else the limit
// bench/RESULTS.md ("Small matmuls as kernels") measured.
int64_t default_max_matmul_macs();

struct FusionOptions {
  // Registers a group's kernel for execution; returns its id, or -1 and sets *why if it
  // cannot (the group's nodes then stay ATen calls). Required; called from several
  // threads at once (Note [Parallel kernel compilation]), so it must be thread-safe.
  std::function<int64_t(const FusedGroup&, std::string* why)> compile;
  // Threads compiling at once: 0 takes TCAP_COMPILE_THREADS, else the machine's cores (at
  // most 8); 1 compiles one group after the other on the calling thread.
  int compile_threads = 0;
  // Groups of fewer nodes than this stay ATen calls (1: every lowerable op is a kernel).
  int min_nodes = 1;
  // Where the kernels run: only nodes whose tensors all live on this device are fused.
  c10::Device device = c10::Device(c10::kCPU);
  // Matmuls (mm, addmm, bmm, baddbmm) of at most this many multiply-adds become kernels
  // (Note [Small matmuls as kernels]); 0 keeps every matmul an ATen call. The default
  // is default_max_matmul_macs().
  int64_t max_matmul_macs = default_max_matmul_macs();
};

struct FusionResult {
  ir::Graph graph;                  // each group replaced by one tcap::fused node
  std::vector<FusedGroup> groups;   // kept groups (compile succeeded)
  // Why nodes are not in a kernel, or why a node did not join its producer's kernel:
  // "%12 aten::mm: no kernel IR lowering ...", "%14 aten::add.Tensor not fused with
  // fused_2: shape [4] differs from the group's [4, 5]".
  std::vector<std::string> decisions;
  // How long each step took, in ms, in order: decompose, group, lower (kernel IR and each
  // group's fallback), kernels (the backend's plans, lookups and compiles), rewrite.
  StageClock::Laps times;
  std::string explain() const;      // groups and decisions, one per line
};

// Fusion rules (Note [Fusion groups] in groups.h): a node joins the group of one of its
// producers when it is lowerable (lowering.h), works on the group's iteration space (same
// full shape, or the group's reduced shape after its reductions) and joining creates no
// cycle; groups never span a mutation (an in-place or out= ATen call) or a hook call.
// The rewritten graph runs the same computation: the interpreter executes `tcap::fused`
// through the runtime (runtime/fused_kernel.h).
FusionResult fuse(const ir::Graph& g, const FusionOptions& options);

// The operator that runs a fused kernel; its schema.
constexpr const char* kFusedOp = "tcap::fused";
constexpr const char* kFusedSchema = "tcap::fused(Tensor[] inputs, int kernel) -> Tensor[]";

}  // namespace tcap::fuse
