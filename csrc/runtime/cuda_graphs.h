// CUDA-graph replay of a compiled region's graphs (CompileOptions::cuda_graphs).
//
// Note [CUDA graphs of compiled regions]
// For launch-bound models. An executable whose graph qualifies runs normally on its first
// call (the warm-up: lazy initialisation such as cuBLAS handles happens outside any
// capture), is captured on its second into an at::cuda::CUDAGraph (LibTorch's; its memory
// comes from a private pool of the caching allocator) on a side stream, as CUDA requires,
// with static copies of the inputs, and is replayed from then on: a call copies its inputs
// into the static ones, replays the graph on the current stream and returns clones of the
// static outputs (the next replay overwrites those); an output that is an input is the
// caller's tensor, and outputs that are one graph value are one tensor, as without graphs.
//
// A graph qualifies when every tensor is on one CUDA device and it calls no hook, writes
// no input in place, reads no value on the host, draws random numbers only from the
// default generator and returns no view of an input (an output that is an input is
// returned as the caller's tensor). Otherwise the executable runs as it is and
// TCAP_LOGS=graph_breaks says why. Random ops stay right under replay: the device's
// default generator is registered with the graph (LibTorch's Note [CUDA Graph-safe RNG
// states]), so each replay reads the generator's current seed and offset and advances it
// by the graph's whole draw: the same numbers eager draws from the same state. A call whose inputs differ from the captured ones (sizes,
// strides, dtype, device, defined or not) runs the executable without the graph (logged
// once); a capture that fails disables the graph for that executable (logged).
//
// This is the only file that includes LibTorch's CUDA headers; a build without them
// (TCAP_HAVE_CUDA_GRAPHS=0) runs every executable as it is, logged.
#pragma once

#include <tcap/compile.h>
#include <tcap/graph.h>

#include <cstdint>
#include <string>

namespace tcap {

// Why `g` cannot be replayed as a CUDA graph ("" when it can).
std::string cuda_graph_refusal(const ir::Graph& g);

// `inner` wrapped as above, or `inner` itself (with the reason logged) when `g` does not
// qualify. `what` names the graph in logs.
Executable with_cuda_graphs(Executable inner, const ir::Graph& g, const std::string& what);

// Whether this build can capture CUDA graphs (LibTorch's CUDA headers were found).
bool cuda_graphs_built();

// Process-wide counts (tests, benchmarks): graphs captured, and calls served by a replay.
struct CudaGraphStats {
  int64_t captures = 0;
  int64_t replays = 0;
};
CudaGraphStats cuda_graph_stats();

}  // namespace tcap
