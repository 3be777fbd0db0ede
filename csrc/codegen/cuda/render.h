// cuda renderer: a kir::Kernel as CUDA C++ source for NVRTC (D7). Pure C++: nothing here
// needs the CUDA toolkit, so rendering is tested on machines without one.
//
// Note [CUDA kernel shapes]
// One __global__ function per kernel, `extern "C"`, taking one pointer per kernel buffer
// (inputs `const T* __restrict__`, outputs `T* __restrict__`), the scratch pointer of a
// split kernel, the numbers read at launch (Note [CUDA sizes at launch]) and an int `vec_ok`:
//   Pointwise  no reduce dims. A grid-stride loop over the elements in row-major domain
//              order; coordinates come from the linear index by division by constant sizes
//              of the coalesced domain (kir::coalesce). When every access has stride 0
//              or 1 along the innermost dim (stores: 1), each thread also has a vector
//              path over `vec` elements at once with 16-byte loads and stores (narrower
//              for 1-byte types), taken when the host says every unit-stride access is
//              aligned (vec_ok). With several dims, vectors stay inside a row (the row
//              length and the unit-stride accesses' outer strides are multiples of vec);
//              with one dim, a scalar tail finishes the odd elements.
//   BlockRow   reductions over a long or contiguous reduce extent: one block per outer
//              index (grid-stride over outer indices); the block's threads stride the
//              reduce points, combine with warp shuffles and one shared-memory step, and
//              every thread gets the result (Reduces of later passes need it). When the
//              row is one contiguous dim for every element load and per-element store,
//              each pass also has a vector path: a thread takes `vec` consecutive points
//              per step with 16-byte loads and stores (rows a whole number of vectors,
//              taken when the host says the accesses are aligned, as for Pointwise).
//              A kernel with several passes (softmax, layer norm) whose share of the row
//              per thread is small keeps it in registers ("persistent", row_chunks):
//              the first pass that reads a load fills them, later passes reuse them.
//              Rows short enough for one warp (32 threads) run a warp per row and
//              `rows_per_block` rows per block (warp shuffles only, no shared memory), so
//              that the limit on resident blocks per SM does not halve the threads.
//   Column     single-pass reductions whose element loads are contiguous along the
//              outer dims rather than the reduce dims (column sums: bias and layer-norm
//              weight gradients). A block is `lanes` columns wide (each lane `vec`
//              adjacent columns, 16-byte loads on the vector path) and 256 / lanes rows
//              tall: its threads stride the rows of their columns and combine through
//              shared memory, so a warp reads whole rows' worth of contiguous columns.
//              The rows are also split over `splits` blocks (a constant of the kernel's
//              shape, never of the device, so results are the same on every GPU): each
//              writes its partial results to a workspace, and the last block of a column
//              tile to arrive (a counter per tile, atomicAdd after __threadfence) combines
//              them in split order and runs the epilogue. See Note [Split column
//              reductions].
//   ThreadRow  reductions with a short reduce extent, or column reductions with several
//              passes: one thread per outer index, a serial loop over the reduce points,
//              so adjacent threads read adjacent outputs' data.
// A reduction kernel runs kir's passes (kir::reduce_level) one after the other per outer
// index; outer-level values are computed by every thread of the row, stored by one.
//
// How values are held and computed: Note [CUDA value representation] (ops.h). How a
// strategy, block and vector width are chosen: plan.h.
//
// Indexing is 32-bit when every offset the kernel can form (plus one grid stride) fits in
// an int32, 64-bit otherwise.
#pragma once

#include "kir/kir.h"

#include <cstdint>
#include <string>
#include <vector>

namespace tcap::codegen::cuda {

enum class Strategy { Pointwise, BlockRow, ThreadRow, Column };
const char* to_string(Strategy s);

// What the host needs to launch a rendered kernel.
struct LaunchPlan {
  Strategy strategy = Strategy::Pointwise;
  int block = 256;            // threads per block (a multiple of 32)
  int64_t work_items = 0;     // parallel items: vector groups or elements (Pointwise), outer
                              // indices (BlockRow: one block each; ThreadRow: one thread each),
                              // column tiles times splits (Column: one block each)
  int64_t elements = 0;       // Pointwise: domain points (numel)
  int vec = 1;                // Pointwise, BlockRow: elements per vector access (1 = no vector path)
  int row_chunks = 0;         // BlockRow vector path: vectors per element load each thread keeps
                              // in registers across the passes (0: rows are re-read per pass)
  int rows_per_block = 1;     // BlockRow: rows a block runs at once, a warp each (short rows)
  int lanes = 0;              // Column: threads across the columns of a block (a power of two)
  int splits = 1;             // Column, BlockRow: blocks the rows of a column tile (a row) are split over
  // splits > 1: the kernel takes one more pointer, `scratch_bytes` of device memory whose
  // first `semaphore_bytes` are zero at launch (the per-tile or per-row counters; the
  // rest is the partial results' workspace, written before it is read).
  int64_t scratch_bytes = 0;
  int64_t semaphore_bytes = 0;
  // Vector path: for each buffer read or written with unit stride, its kernel buffer
  // index, element offset and element size; the host sets vec_ok when every
  // (data pointer + offset * size) is aligned to vec * size bytes.
  struct Aligned {
    int buffer = 0;
    int64_t offset = 0;
    int64_t elem_size = 0;
  };
  std::vector<Aligned> aligned;
  bool index32 = true;
  int64_t blocks_needed() const;
};

// Grid size of a launch on a device with `multiprocessors` SMs: what the work needs,
// capped at four waves of resident blocks (the grid-stride loops cover the rest).
int64_t launch_grid(const LaunchPlan& p, int multiprocessors);

// The kernel's `vec_ok` argument for these buffer pointers (one per kernel buffer): 1 when
// the plan has a vector path and every unit-stride access is aligned to the vector width.
int vector_path_ok(const LaunchPlan& p, void* const* buffers);

struct CudaSource {
  std::string entry;   // the __global__ function's name
  std::string source;  // the whole translation unit
  LaunchPlan plan;
};

struct RenderOptions {
  int pointwise_block = 256;
  int row_block_max = 512;      // BlockRow: threads per block are the reduce extent (in
                                // vectors, on the vector path) rounded up to a power of
                                // two, between 32 and this
  int64_t thread_row_max = 16;  // reduce extents up to this run as ThreadRow
};

// Renders a kernel (calls kir::check_renderable). Deterministic: the same kernel IR gives the
// same source, whatever its name (the entry is named after the structural hash).
CudaSource render(const kir::Kernel& k, const RenderOptions& o = {});

class LaunchShapes;  // numbers.h

// A kernel rendered to share its code with the other kernels of its structure (Note [CUDA
// sizes at launch], numbers.h): `src` reads the numbers `shapes` says vary at launch, from
// a `const tcap_numbers tcap_n` parameter after the scratch pointer (when reads_numbers;
// else every number is built in and `src` is render(k)'s). `src.plan` is this kernel's
// own launch plan; `numbers` its numbers, the launch's `tcap_n`.
struct LaunchSource {
  CudaSource src;
  std::vector<int64_t> numbers;
  bool reads_numbers = false;
};
LaunchSource render_for_launch(const kir::Kernel& k, LaunchShapes& shapes, const RenderOptions& o = {});

// One line: strategy, block, vector width, index width (TCAP_LOGS=fusion, test messages).
std::string to_string(const LaunchPlan& p);

}  // namespace tcap::codegen::cuda
