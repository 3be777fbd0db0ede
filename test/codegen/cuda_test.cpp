// The cuda backend (issue 6). Without a device: every op and dtype of the kernel IR renders
// and compiles to PTX with NVRTC, the launch plans (vector widths, reduction strategies,
// index width) are the intended ones, the caches work. With a device (skipped otherwise,
// saying why): generated kernels against ATen on CUDA, through tcap::compile's `cuda`
// backend, on odd sizes, broadcast and non-contiguous inputs, float32/float16/bfloat16.
#include "codegen/cuda/cuda.h"
#include "codegen/cuda/driver.h"
#include "codegen/kernel_cache.h"
#include "kernel_builder.h"
#include "support/compare.h"
#include "aot/cuda_graphs.h"
#include "support/cuda_emu.h"
#include "support/log_capture.h"
#include "support/logging.h"

#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>

#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace {

using tcap::test::KernelBuilder;
using tcap::kir::DType;
using tcap::kir::OpCode;
namespace cuda = tcap::codegen::cuda;
namespace cuda_emu = tcap::testing::cuda_emu;

#define SKIP_WITHOUT_NVRTC()                                                    \
  do {                                                                          \
    std::string why_;                                                           \
    if (!cuda::nvrtc_available(&why_)) GTEST_SKIP() << "no NVRTC here: " << why_; \
  } while (0)

const std::vector<DType> kFloats = {DType::F32, DType::F64, DType::F16, DType::BF16};
const std::vector<DType> kInts = {DType::U8, DType::I8, DType::I16, DType::I32, DType::I64};
const std::vector<DType> kAll = {DType::Bool, DType::U8, DType::I8, DType::I16, DType::I32,
                                 DType::I64,  DType::F16, DType::BF16, DType::F32, DType::F64};

DType compute(DType t) { return t == DType::F16 || t == DType::BF16 ? DType::F32 : t; }

// One pointwise kernel that uses every floating op on dtype t (computing in t itself, as
// kir allows, and in float for the 16-bit types), every comparison and every cast.
tcap::kir::Kernel every_float_op(DType t) {
  KernelBuilder kb(std::string("floats_") + tcap::kir::to_string(t), {5, 7});
  const int32_t ia = kb.input(t), ib = kb.input(t), out = kb.output(t), mask = kb.output(DType::Bool);
  const int32_t a = kb.load(ia, {7, 1}), b = kb.load(ib, {0, 1});
  int32_t acc = a;
  for (OpCode o : {OpCode::Neg, OpCode::Abs, OpCode::Exp, OpCode::Log, OpCode::Log1p, OpCode::Expm1, OpCode::Sin,
                   OpCode::Cos, OpCode::Tan, OpCode::Tanh, OpCode::Erf, OpCode::Sqrt, OpCode::Rsqrt, OpCode::Recip,
                   OpCode::Floor, OpCode::Ceil, OpCode::Round, OpCode::Trunc}) {
    acc = kb.bin(OpCode::Add, acc, kb.un(o, a));
  }
  for (OpCode o : {OpCode::Add, OpCode::Sub, OpCode::Mul, OpCode::Div, OpCode::Pow, OpCode::Max, OpCode::Min}) {
    acc = kb.bin(OpCode::Add, acc, kb.bin(o, a, b));
  }
  for (double p : {2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 1.7}) acc = kb.bin(OpCode::Add, acc, kb.bin(OpCode::Pow, a, kb.fconst(t, p)));
  int32_t m = kb.un(OpCode::IsNan, acc);
  for (OpCode o : {OpCode::Lt, OpCode::Le, OpCode::Gt, OpCode::Ge, OpCode::Eq, OpCode::Ne}) {
    m = kb.bin(OpCode::Or, m, kb.bin(o, a, b));
  }
  m = kb.bin(OpCode::And, kb.un(OpCode::Not, m), kb.bin(OpCode::Lt, a, kb.fconst(t, 0.25)));
  acc = kb.where(m, acc, b);
  for (DType to : kAll) {
    if (to == t) continue;
    acc = kb.bin(OpCode::Add, acc, kb.cast(kb.cast(acc, to), t));
  }
  kb.store(acc, out, {7, 1});
  kb.store(m, mask, {7, 1});
  return kb.k;
}

tcap::kir::Kernel every_int_op(DType t) {
  KernelBuilder kb(std::string("ints_") + tcap::kir::to_string(t), {9, 4});
  const int32_t ia = kb.input(t), ib = kb.input(t), out = kb.output(t);
  const int32_t a = kb.load(ia, {1, 9}), b = kb.load(ib, {4, 1});
  int32_t acc = kb.un(OpCode::Abs, kb.un(OpCode::Neg, a));
  for (OpCode o : {OpCode::Add, OpCode::Sub, OpCode::Mul, OpCode::Div, OpCode::Max, OpCode::Min}) {
    acc = kb.bin(OpCode::Add, acc, kb.bin(o, a, b));
  }
  acc = kb.where(kb.bin(OpCode::Ge, a, kb.iconst(t, 3)), acc, kb.iconst(t, -1));
  for (DType to : kAll) {
    if (to != t) acc = kb.bin(OpCode::Sub, acc, kb.cast(kb.cast(acc, to), t));
  }
  kb.store(acc, out, {4, 1});
  return kb.k;
}

tcap::kir::Kernel bool_ops() {
  KernelBuilder kb("bools", {13});
  const int32_t ia = kb.input(DType::Bool), out = kb.output(DType::Bool), f = kb.output(DType::F32);
  const int32_t a = kb.load(ia, {1}), b = kb.load(ia, {0});
  int32_t x = kb.bin(OpCode::Add, a, b);
  x = kb.bin(OpCode::Mul, x, kb.un(OpCode::Not, b));
  x = kb.bin(OpCode::Max, x, kb.bin(OpCode::Min, a, b));
  x = kb.bin(OpCode::Ne, x, kb.bin(OpCode::Eq, a, b));
  kb.store(x, out, {1});
  kb.store(kb.cast(x, DType::F32), f, {1});
  return kb.k;
}

// Sum, max and min over rows of dtype t, accumulating in the compute dtype.
tcap::kir::Kernel reductions(DType t, std::vector<int64_t> sizes, int nr, std::vector<int64_t> strides) {
  KernelBuilder kb(std::string("reduce_") + tcap::kir::to_string(t), sizes, nr);
  const int32_t in = kb.input(t);
  const int32_t os = kb.output(t), omax = kb.output(t), omin = kb.output(t);
  const DType c = t == DType::Bool ? DType::Bool : compute(t);
  const int32_t x = kb.cast(kb.load(in, strides), c);
  std::vector<int64_t> ostr(sizes.size(), 0);
  int64_t s = 1;
  for (int d = static_cast<int>(sizes.size()) - nr - 1; d >= 0; --d) {
    ostr[static_cast<size_t>(d)] = s;
    s *= sizes[static_cast<size_t>(d)];
  }
  if (t != DType::Bool) kb.store(kb.cast(kb.reduce(OpCode::ReduceSum, x), t), os, ostr);
  kb.store(kb.cast(kb.reduce(OpCode::ReduceMax, x), t), omax, ostr);
  kb.store(kb.cast(kb.reduce(OpCode::ReduceMin, x), t), omin, ostr);
  if (t == DType::Bool) kb.k.buffers.erase(kb.k.buffers.begin() + 1);  // no sum output
  if (t == DType::Bool) {
    for (auto& st : kb.k.stores) --st.buffer;
  }
  return kb.k;
}

// softmax over the last dim of [rows, cols] (contiguous): three passes.
tcap::kir::Kernel softmax(DType t, int64_t rows, int64_t cols) {
  KernelBuilder kb("softmax", {rows, cols}, 1);
  const int32_t in = kb.input(t), out = kb.output(t);
  const int32_t x = kb.cast(kb.load(in, {cols, 1}), compute(t));
  const int32_t m = kb.reduce(OpCode::ReduceMax, x);
  const int32_t e = kb.un(OpCode::Exp, kb.bin(OpCode::Sub, x, m));
  const int32_t y = kb.bin(OpCode::Div, e, kb.reduce(OpCode::ReduceSum, e));
  kb.store(kb.cast(y, t), out, {cols, 1});
  return kb.k;
}

std::string ptx_of(const tcap::kir::Kernel& k, int arch = 90) {
  std::string src;
  std::string ptx = cuda::compile_to_ptx(k, arch, &src);
  EXPECT_NE(ptx.find(".entry"), std::string::npos) << src;
  return ptx;
}

// The oldest architecture this NVRTC compiles for, and sm_90 (H100).
std::vector<int> archs_to_check() {
  std::vector<int> archs = cuda::nvrtc_supported_archs();
  std::sort(archs.begin(), archs.end());
  std::vector<int> out{archs.front()};
  if (std::find(archs.begin(), archs.end(), 90) != archs.end() && archs.front() != 90) out.push_back(90);
  return out;
}

TEST(CudaRender, EveryOpAndDtypeCompilesToPtx) {
  SKIP_WITHOUT_NVRTC();
  std::vector<tcap::kir::Kernel> kernels;
  for (DType t : kFloats) kernels.push_back(every_float_op(t));
  for (DType t : kInts) kernels.push_back(every_int_op(t));
  kernels.push_back(bool_ops());
  for (DType t : kAll) {
    kernels.push_back(reductions(t, {37, 45}, 1, {45, 1}));        // rows: block per row
    kernels.push_back(reductions(t, {3000, 5}, 1, {5, 1}));        // short rows: thread per row
    kernels.push_back(reductions(t, {2048, 4097}, 1, {1, 2048}));  // columns: thread per row
    kernels.push_back(reductions(t, {6, 5, 7}, 2, {35, 7, 1}));    // two reduce dims
  }
  for (DType t : kFloats) kernels.push_back(softmax(t, 7, 1000));
  for (int arch : archs_to_check()) {
    SCOPED_TRACE("compute_" + std::to_string(arch));
    for (const auto& k : kernels) {
      SCOPED_TRACE(k.name);
      EXPECT_NO_THROW(ptx_of(k, arch));
    }
  }
}

TEST(CudaRender, PointwiseVectorisesContiguousAndBroadcastRows) {
  SKIP_WITHOUT_NVRTC();
  {
    KernelBuilder kb("contig_f32", {1023});  // odd size: vector body + scalar tail
    const int32_t x = kb.load(kb.input(DType::F32), {1});
    kb.store(kb.un(OpCode::Cos, x), kb.output(DType::F32), {1});
    const auto src = cuda::render(kb.k);
    EXPECT_EQ(src.plan.vec, 4) << src.source;
    EXPECT_EQ(src.plan.aligned.size(), 2u);
    EXPECT_TRUE(src.plan.index32);
    EXPECT_NE(ptx_of(kb.k).find("v4.f32"), std::string::npos) << "no 16-byte vector access";
  }
  {
    KernelBuilder kb("bcast_f16", {67, 128});  // a [128] row broadcast over 67 rows
    const int32_t a = kb.load(kb.input(DType::F16), {128, 1});
    const int32_t b = kb.load(kb.input(DType::F16), {0, 1});
    kb.store(kb.cast(kb.bin(OpCode::Mul, kb.cast(a, DType::F32), kb.cast(b, DType::F32)), DType::F16),
             kb.output(DType::F16), {128, 1});
    const auto src = cuda::render(kb.k);
    EXPECT_EQ(src.plan.vec, 8) << src.source;
    EXPECT_NE(ptx_of(kb.k).find("v4.u32"), std::string::npos) << "no 16-byte vector access";
  }
  {
    // Rows of 30 read from a padded [67, 32] buffer (no coalescing): 30 % 4 != 0, so only
    // pairs fit in a row.
    KernelBuilder kb("rows_not_multiple", {67, 30});
    const int32_t a = kb.load(kb.input(DType::F32), {32, 1});
    kb.store(kb.un(OpCode::Exp, a), kb.output(DType::F32), {30, 1});
    EXPECT_EQ(cuda::render(kb.k).plan.vec, 2);
  }
  {
    KernelBuilder kb("transposed", {33, 17});  // an input read across rows: scalar code
    const int32_t a = kb.load(kb.input(DType::F32), {1, 33});
    kb.store(kb.un(OpCode::Exp, a), kb.output(DType::F32), {17, 1});
    const auto src = cuda::render(kb.k);
    EXPECT_EQ(src.plan.vec, 1);
    EXPECT_EQ(src.plan.strategy, cuda::Strategy::Pointwise);
    ptx_of(kb.k);
  }
}

TEST(CudaRender, ReductionStrategies) {
  SKIP_WITHOUT_NVRTC();
  const auto rows = cuda::render(softmax(DType::F32, 100, 1000));
  EXPECT_EQ(rows.plan.strategy, cuda::Strategy::BlockRow);
  EXPECT_EQ(rows.plan.vec, 4);      // contiguous rows of 1000 floats: 16-byte vectors
  EXPECT_EQ(rows.plan.block, 256);  // 250 vectors per row
  EXPECT_EQ(rows.plan.work_items, 100);
  const std::string ptx = ptx_of(softmax(DType::F32, 100, 1000));
  EXPECT_NE(ptx.find("shfl.sync.bfly"), std::string::npos);
  EXPECT_NE(ptx.find("ld.global.nc.v4.f32"), std::string::npos) << "no 16-byte vector load";
  EXPECT_NE(ptx.find("st.global.v4.f32"), std::string::npos) << "no 16-byte vector store";
  // Softmax's three passes read the row once: it stays in registers (no local memory).
  EXPECT_EQ(rows.plan.row_chunks, 1);
  EXPECT_EQ(ptx.find("ld.global.nc.v4.f32", ptx.find("ld.global.nc.v4.f32") + 1), std::string::npos)
      << "the row is loaded more than once";
  EXPECT_EQ(ptx.find(".local"), std::string::npos) << "the cached row spilled to local memory";
  EXPECT_EQ(cuda::render(softmax(DType::F32, 100, 8192)).plan.row_chunks, 4);  // 2048 vectors, 512 threads
  EXPECT_EQ(cuda::render(softmax(DType::F32, 100, 100000)).plan.row_chunks, 0);  // too long: re-read per pass
  EXPECT_EQ(cuda::render(softmax(DType::BF16, 100, 1000)).plan.vec, 8);
  // Short rows: a warp per row, eight rows per block, no block barrier.
  EXPECT_EQ(cuda::render(softmax(DType::F32, 100, 40)).plan.block, 256);
  EXPECT_EQ(cuda::render(softmax(DType::F32, 100, 40)).plan.rows_per_block, 8);
  EXPECT_EQ(cuda::render(softmax(DType::F32, 100, 40)).plan.row_chunks, 1);
  EXPECT_EQ(cuda::render(softmax(DType::F32, 100, 40)).plan.blocks_needed(), 13);
  EXPECT_EQ(cuda::render(softmax(DType::F32, 3, 40)).plan.rows_per_block, 4);
  {
    const std::string warp_ptx = ptx_of(softmax(DType::F32, 100, 40));
    EXPECT_NE(warp_ptx.find("shfl.sync.bfly"), std::string::npos);
    EXPECT_EQ(warp_ptx.find("bar.sync"), std::string::npos) << "a warp-per-row kernel waits for its block";
  }
  EXPECT_EQ(cuda::render(softmax(DType::F32, 100, 1000)).plan.rows_per_block, 1);
  EXPECT_EQ(cuda::render(softmax(DType::F32, 100, 1001)).plan.vec, 1);  // rows not a whole number of vectors
  EXPECT_EQ(cuda::render(softmax(DType::F32, 100, 1001)).plan.block, 512);
  EXPECT_EQ(cuda::render(softmax(DType::F32, 100, 1002)).plan.vec, 2);
  EXPECT_EQ(cuda::render(reductions(DType::F32, {3000, 5}, 1, {5, 1})).plan.strategy, cuda::Strategy::ThreadRow);
  // Column sums (Note [Split column reductions]): whatever the number of columns.
  EXPECT_EQ(cuda::render(reductions(DType::F32, {2048, 4097}, 1, {1, 2048})).plan.strategy, cuda::Strategy::Column);
  EXPECT_EQ(cuda::render(reductions(DType::F32, {33, 4097}, 1, {1, 33})).plan.strategy, cuda::Strategy::Column);
  // ... but a short column stays one thread per column.
  EXPECT_EQ(cuda::render(reductions(DType::F32, {2048, 16}, 1, {1, 2048})).plan.strategy, cuda::Strategy::ThreadRow);
}

// Softmax over dim 0 of [rows, cols] (contiguous): a column reduction with three passes.
tcap::kir::Kernel column_softmax(int64_t rows, int64_t cols) {
  KernelBuilder kb("column_softmax", {cols, rows}, 1);
  const int32_t in = kb.input(DType::F32), out = kb.output(DType::F32);
  const int32_t x = kb.load(in, {1, cols});
  const int32_t m = kb.reduce(OpCode::ReduceMax, x);
  const int32_t e = kb.un(OpCode::Exp, kb.bin(OpCode::Sub, x, m));
  const int32_t s = kb.reduce(OpCode::ReduceSum, e);
  kb.store(kb.bin(OpCode::Div, e, s), out, {1, cols});
  return kb.k;
}

// A bias gradient through a ReLU: the masked gradient stored per element, its column sums
// per column, and a per-column load in the epilogue (the sums scaled by a per-column value).
tcap::kir::Kernel bias_grad(DType t, int64_t rows, int64_t cols) {
  KernelBuilder kb(std::string("bias_grad_") + tcap::kir::to_string(t), {cols, rows}, 1);
  const int32_t grad = kb.input(t), act = kb.input(t), scale = kb.input(t);
  const int32_t masked = kb.output(t), sums = kb.output(t);
  const DType c = compute(t);
  const int32_t g = kb.cast(kb.load(grad, {1, cols}), c);
  const int32_t a = kb.cast(kb.load(act, {1, cols}), c);
  const int32_t zero = kb.fconst(c, 0.0);
  const int32_t m = kb.where(kb.bin(OpCode::Gt, a, zero), g, zero);
  kb.store(kb.cast(m, t), masked, {1, cols});
  const int32_t sum = kb.reduce(OpCode::ReduceSum, m);
  const int32_t s = kb.bin(OpCode::Mul, sum, kb.cast(kb.load(scale, {1, 0}), c));
  kb.store(kb.cast(s, t), sums, {1, 0});
  return kb.k;
}

// Layer norm's weight and bias gradients: column sums of g * (x - mean) * rstd and of g,
// with the per-row mean and rstd read with stride 0 along the columns.
tcap::kir::Kernel ln_param_grads(DType t, int64_t rows, int64_t cols) {
  KernelBuilder kb(std::string("ln_param_grads_") + tcap::kir::to_string(t), {cols, rows}, 1);
  const int32_t grad = kb.input(t), x = kb.input(t), mean = kb.input(DType::F32), rstd = kb.input(DType::F32);
  const int32_t wgrad = kb.output(t), bgrad = kb.output(t);
  const DType c = compute(t);
  const int32_t g = kb.cast(kb.load(grad, {1, cols}), c);
  const int32_t xv = kb.cast(kb.load(x, {1, cols}), c);
  const int32_t centred = kb.bin(OpCode::Sub, xv, kb.cast(kb.load(mean, {0, 1}), c));
  const int32_t xhat = kb.bin(OpCode::Mul, centred, kb.cast(kb.load(rstd, {0, 1}), c));
  const int32_t wsum = kb.reduce(OpCode::ReduceSum, kb.bin(OpCode::Mul, g, xhat));
  kb.store(kb.cast(wsum, t), wgrad, {1, 0});
  kb.store(kb.cast(kb.reduce(OpCode::ReduceSum, g), t), bgrad, {1, 0});
  return kb.k;
}

TEST(CudaRender, SplitReductionsSpreadRowsOverBlocks) {
  SKIP_WITHOUT_NVRTC();
  // [4097, 2048] summed over rows: 16 tiles of 32 lanes x 4 columns, 8 rows of threads, the
  // rows split 65 ways (64 rows a split: 8 per thread).
  const auto big = cuda::render(reductions(DType::F32, {2048, 4097}, 1, {1, 2048})).plan;
  EXPECT_EQ(big.vec, 4);
  EXPECT_EQ(big.lanes, 32);
  EXPECT_EQ(big.block, 256);
  EXPECT_EQ(big.splits, 65);
  EXPECT_EQ(big.work_items, 16 * 65);
  EXPECT_EQ(big.semaphore_bytes, 256);
  // Sum, max and min: 65 partial results per column each.
  EXPECT_EQ(big.scratch_bytes, 256 + 3 * 65 * 2048 * 4);
  // Few columns: narrower tiles, more rows of threads.
  const auto narrow = cuda::render(reductions(DType::F32, {8, 100000}, 1, {1, 8})).plan;
  EXPECT_EQ(narrow.strategy, cuda::Strategy::Column);
  EXPECT_EQ(narrow.vec, 4);
  EXPECT_EQ(narrow.lanes, 2);
  EXPECT_EQ(narrow.lanes * narrow.vec, 8);
  EXPECT_EQ(narrow.splits, 98);  // 128 rows of threads, 8 rows each
  // Short columns need no split: no scratch argument.
  const auto one = cuda::render(reductions(DType::F32, {2048, 50}, 1, {1, 2048}));
  EXPECT_EQ(one.plan.strategy, cuda::Strategy::Column);
  EXPECT_EQ(one.plan.splits, 1);
  EXPECT_EQ(one.plan.scratch_bytes, 0);
  EXPECT_EQ(one.source.find("tcap_scratch"), std::string::npos);
  // Odd columns: no vector path. Half: 8 columns a vector.
  EXPECT_EQ(cuda::render(reductions(DType::F32, {33, 4097}, 1, {1, 33})).plan.vec, 1);
  EXPECT_EQ(cuda::render(bias_grad(DType::F16, 1000, 96)).plan.vec, 8);
  // The PTX: 16-byte loads and stores, the semaphore, the fence, partial results read past L1.
  const std::string ptx = ptx_of(bias_grad(DType::F32, 4097, 2048));
  EXPECT_NE(ptx.find("ld.global.nc.v4.f32"), std::string::npos) << "no 16-byte vector load";
  EXPECT_NE(ptx.find("st.global.v4.f32"), std::string::npos) << "no 16-byte vector store";
  EXPECT_NE(ptx.find("atom.global.add.u32"), std::string::npos);
  EXPECT_TRUE(ptx.find("membar.gl") != std::string::npos || ptx.find("fence.sc.gpu") != std::string::npos);
  EXPECT_NE(ptx.find("ld.volatile.global.f32"), std::string::npos);
  EXPECT_EQ(ptx.find(".local"), std::string::npos) << "the per-column arrays spilled to local memory";
  EXPECT_EQ(ptx_of(bias_grad(DType::F16, 4097, 2048)).find(".local"), std::string::npos) << "8 columns a thread spilled";
  // Few long rows: each split over blocks (a loss: one row of 262144 floats, 16 blocks of
  // 512 threads reading 8 vectors each). Many rows need no split.
  const auto full = cuda::render(reductions(DType::F32, {262144}, 1, {1})).plan;
  EXPECT_EQ(full.strategy, cuda::Strategy::BlockRow);
  EXPECT_EQ(full.block, 512);
  EXPECT_EQ(full.vec, 4);
  EXPECT_EQ(full.splits, 16);
  EXPECT_EQ(full.work_items, 16);
  EXPECT_EQ(full.scratch_bytes, 256 + 3 * 256);
  EXPECT_EQ(cuda::render(reductions(DType::F32, {1000, 4096}, 1, {4096, 1})).plan.splits, 1);
  EXPECT_EQ(cuda::render(softmax(DType::F32, 3, 100000)).plan.splits, 1);  // several passes
  EXPECT_NE(ptx_of(reductions(DType::F32, {262144}, 1, {1})).find("atom.global.add.u32"), std::string::npos);
  // Several passes (a softmax over dim 0) stay one thread per column.
  EXPECT_EQ(cuda::render(column_softmax(1000, 2048)).plan.strategy, cuda::Strategy::ThreadRow);
  ptx_of(column_softmax(1000, 2048));
  for (DType t : kAll) ptx_of(reductions(t, {70, 2000}, 1, {1, 70}));
}

// Broadcast stores (kir.h): an outer-level value written at every point of its row is
// stored inside the pass loop, not once per row; in both reduction strategies.
TEST(CudaRender, BroadcastStoresWriteEveryElement) {
  SKIP_WITHOUT_NVRTC();
  for (int64_t cols : {5, 1000}) {
    KernelBuilder kb("broadcast_store", {64, cols}, 1);
    const int32_t in = kb.input(DType::F32), scale = kb.input(DType::F32);
    const int32_t out_scaled = kb.output(DType::F32), out_max = kb.output(DType::F32);
    const int32_t s = kb.bin(OpCode::Mul, kb.load(scale, {1, 0}), kb.fconst(DType::F32, 0.5));
    kb.store(s, out_scaled, {cols, 1});
    const int32_t m = kb.reduce(OpCode::ReduceMax, kb.bin(OpCode::Mul, kb.load(in, {cols, 1}), s));
    kb.store(m, out_max, {cols, 1});
    const auto r = cuda::render(kb.k);
    SCOPED_TRACE(r.source);
    // Both stores index with the reduce coordinate: they sit inside a loop over r.
    EXPECT_NE(r.source.find("b2[os0 + "), std::string::npos);
    EXPECT_NE(r.source.find("b3[os1 + "), std::string::npos);
    ptx_of(kb.k);
  }
}

TEST(CudaRender, SixtyFourBitIndexingOnlyWhenNeeded) {
  SKIP_WITHOUT_NVRTC();
  KernelBuilder big("big", {int64_t{3} << 30});
  big.store(big.un(OpCode::Neg, big.load(big.input(DType::F32), {1})), big.output(DType::F32), {1});
  const auto src = cuda::render(big.k);
  EXPECT_FALSE(src.plan.index32);
  EXPECT_NE(src.source.find("long long g ="), std::string::npos) << src.source;
  ptx_of(big.k);
  KernelBuilder far("far_offset", {4, 4});  // small domain, but a stride beyond int32
  far.store(far.load(far.input(DType::F32), {int64_t{1} << 31, 1}), far.output(DType::F32), {4, 1});
  EXPECT_FALSE(cuda::render(far.k).plan.index32);
  KernelBuilder small("small", {1000, 1000});
  small.store(small.load(small.input(DType::F32), {1000, 1}), small.output(DType::F32), {1000, 1});
  EXPECT_TRUE(cuda::render(small.k).plan.index32);
}

TEST(CudaRender, NamesDoNotChangeTheSource) {
  SKIP_WITHOUT_NVRTC();
  tcap::kir::Kernel a = softmax(DType::F32, 8, 100);
  tcap::kir::Kernel b = a;
  b.name = "another_layer";
  for (auto& buf : b.buffers) buf.name += "_x";
  EXPECT_EQ(cuda::render(a).source, cuda::render(b).source);
  tcap::kir::Kernel c = softmax(DType::F32, 8, 101);
  EXPECT_NE(cuda::render(a).entry, cuda::render(c).entry);
}

TEST(CudaRender, UnsupportedKernelsSayWhy) {
  KernelBuilder kb("ipow", {4});
  const int32_t a = kb.load(kb.input(DType::I32), {1});
  kb.store(kb.bin(OpCode::Pow, a, a), kb.output(DType::I32), {1});
  try {
    cuda::render(kb.k);
    FAIL() << "integer pow rendered";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("integer pow is not supported by the CUDA renderer"), std::string::npos)
        << e.what();
  }
}

TEST(CudaRender, NvrtcErrorsCarryTheLog) {
  SKIP_WITHOUT_NVRTC();
  std::string bin, log;
  EXPECT_FALSE(cuda::nvrtc_compile("extern \"C\" __global__ void k() { undefined_thing(); }", "broken", 90, false,
                                   &bin, &log));
  EXPECT_NE(log.find("undefined_thing"), std::string::npos) << log;
}

// compile_cuda_kernel for a PTX target needs NVRTC but no device: memory, disk and corrupt
// cache entries (Note [Kernel cache files]).
TEST(CudaCache, MemoryDiskAndCorruptEntries) {
  SKIP_WITHOUT_NVRTC();
  const cuda::Target target{archs_to_check().front(), /*cubin=*/false};
  tcap::kir::Kernel k = softmax(DType::BF16, 5, 77);
  const auto s0 = cuda::cuda_stats();
  auto first = cuda::compile_cuda_kernel(k, target);
  EXPECT_TRUE(first->is_ptx);
  EXPECT_FALSE(first->from_disk);
  EXPECT_NE(first->binary.find(".entry " + first->entry), std::string::npos);
  auto again = cuda::compile_cuda_kernel(k, target);
  EXPECT_EQ(again.get(), first.get());
  cuda::cuda_clear_memory_cache_for_testing();
  auto from_disk = cuda::compile_cuda_kernel(k, target);
  EXPECT_TRUE(from_disk->from_disk);
  EXPECT_EQ(from_disk->binary, first->binary);
  // Flip a byte of the file: rejected, counted, rebuilt.
  const std::string path = tcap::codegen::cache_file_path(tcap::Config::get().cache_dir, first->key_hash);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << path;
    f.seekp(100);
    f.put('\x5a');
  }
  cuda::cuda_clear_memory_cache_for_testing();
  auto rebuilt = cuda::compile_cuda_kernel(k, target);
  EXPECT_FALSE(rebuilt->from_disk);
  EXPECT_EQ(rebuilt->binary, first->binary);
  const auto s1 = cuda::cuda_stats();
  EXPECT_EQ(s1.compiled - s0.compiled, 2);
  EXPECT_EQ(s1.disk_hits - s0.disk_hits, 1);
  EXPECT_EQ(s1.memory_hits - s0.memory_hits, 1);
  EXPECT_EQ(s1.corrupt_cache_files - s0.corrupt_cache_files, 1);
}

// Note [Parallel kernel compilation]: NVRTC compiles of different kernels run side by
// side; the same kernel asked for by several threads at once is compiled once.
TEST(CudaCache, ParallelCompilesShareEachKernel) {
  SKIP_WITHOUT_NVRTC();
  const cuda::Target target{archs_to_check().front(), /*cubin=*/false};
  std::vector<tcap::kir::Kernel> kernels;
  for (DType t : {DType::F32, DType::F16, DType::I32, DType::F64}) kernels.push_back(reductions(t, {61, 3001}, 1, {1, 61}));
  kernels.push_back(softmax(DType::F32, 9, 333));
  kernels.push_back(bias_grad(DType::BF16, 100, 96));
  cuda::cuda_clear_memory_cache_for_testing();  // whatever ran before in this process
  const auto s0 = cuda::cuda_stats();
  std::vector<std::vector<std::shared_ptr<const cuda::CudaKernel>>> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < kernels.size(); ++i) got[t].push_back(cuda::compile_cuda_kernel(kernels[(i + t) % kernels.size()], target));
    });
  }
  for (auto& th : threads) th.join();
  const auto s1 = cuda::cuda_stats();
  EXPECT_EQ(s1.compiled + s1.disk_hits - s0.compiled - s0.disk_hits, static_cast<int>(kernels.size()));
  EXPECT_EQ(s1.memory_hits - s0.memory_hits, static_cast<int>(3 * kernels.size()));
  for (size_t t = 0; t < got.size(); ++t) {
    for (size_t i = 0; i < kernels.size(); ++i) {
      const auto& k = got[t][i];
      EXPECT_EQ(k.get(), got[0][(i + t) % kernels.size()].get()) << "one kernel object per kernel";
      EXPECT_NE(k->binary.find(".entry " + k->entry), std::string::npos);
    }
  }
}

// --- generated kernels against eager: on a device, and in the host emulator ------------
//
// The same checks run twice: CudaDevice.* through the `cuda` backend on a GPU (skipped
// without one), CudaEmulated.* on CPU tensors with every kernel the fusion pass forms
// rendered for CUDA and run by the host emulator (Note [CUDA host emulation]).

#define SKIP_WITHOUT_CUDA_DEVICE()                                                          \
  do {                                                                                      \
    std::string why_;                                                                       \
    if (!cuda::cuda_available(&why_)) GTEST_SKIP() << "needs a CUDA device: " << why_;      \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device: LibTorch sees none"; \
  } while (0)

#define SKIP_WITHOUT_EMULATOR()                                                                  \
  do {                                                                                           \
    std::string why_;                                                                            \
    if (!cuda_emu::available(&why_)) GTEST_SKIP() << "no CUDA host emulation here: " << why_;    \
  } while (0)

using Tensors = std::vector<at::Tensor>;
using Fn = std::function<Tensors(const Tensors&)>;

enum class Where { Device, Emulator };

torch::TensorOptions on(Where w) {
  return torch::TensorOptions().device(w == Where::Device ? torch::kCUDA : torch::kCPU);
}

int64_t launches(Where w) { return w == Where::Device ? cuda::cuda_stats().launches : cuda_emu::stats().launches; }

// tcap::compile with CUDA kernels against eager: outputs and input gradients, three calls
// on fresh inputs, generated kernels ran.
void check_cuda(Where w, const std::string& name, const Fn& fn, const std::function<Tensors()>& make, double rtol,
                double atol, bool cuda_graphs = false) {
  SCOPED_TRACE(name);
  tcap::CompileOptions o;
  o.name = name;
  o.cuda_graphs = cuda_graphs;
  if (w == Where::Device) {
    o.backend = "cuda";
  } else {
    o.fw_compiler = [](const tcap::ir::Graph& g) { return cuda_emu::compiler(g); };
    o.bw_compiler = o.fw_compiler;
  }
  auto f = tcap::compile(fn, o);
  // With CUDA graphs: call 2 warms the executables up, call 3 captures, call 4 replays.
  for (int call = 0; call < (cuda_graphs ? 4 : 3); ++call) {
    SCOPED_TRACE("call " + std::to_string(call + 1));
    Tensors in = make();
    const auto before = launches(w);
    Tensors out = (*f)(in);
    Tensors wts;
    for (const auto& t : out) wts.push_back(torch::randn_like(t));
    if (at::Tensor loss = tcap::testing::weighted_loss(out, wts); loss.defined()) loss.backward();
    const Tensors got_grads = tcap::testing::take_grads(in);
    ASSERT_EQ(f->eager_reason(), "");
    if (call > 0) {
      EXPECT_GT(launches(w), before) << "no generated CUDA kernel ran";
    }
    Tensors ref = fn(in);
    if (at::Tensor loss = tcap::testing::weighted_loss(ref, wts); loss.defined()) loss.backward();
    const Tensors want_grads = tcap::testing::take_grads(in);
    for (size_t k = 0; k < out.size(); ++k) {
      EXPECT_TRUE(tcap::testing::close(out[k].detach().cpu(), ref[k].detach().cpu(), rtol, atol)) << "output " << k;
    }
    auto cpu = [](const at::Tensor& t) { return t.defined() ? t.cpu() : t; };
    for (size_t k = 0; k < in.size(); ++k) {
      EXPECT_TRUE(tcap::testing::close(cpu(got_grads[k]), cpu(want_grads[k]), rtol, atol)) << "grad of input " << k;
    }
  }
}

at::Tensor leaf(const at::Tensor& t) { return t.detach().requires_grad_(true); }

void fused_patterns(Where w) {
  const auto dev = on(w);
  for (int64_t n : {1, 3, 1023, 4097}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    check_cuda(w, "pointwise_broadcast",
               [](const Tensors& in) { return Tensors{torch::gelu(in[0] + in[1]) * torch::sigmoid(in[0]) - 0.5 * in[1]}; },
               [&] { return Tensors{leaf(torch::randn({n, 33}, dev)), leaf(torch::randn({33}, dev))}; }, 1e-4, 1e-5);
    check_cuda(w, "pointwise_rows", [](const Tensors& in) { return Tensors{torch::tanh(in[0]) * in[1] + in[1].exp()}; },
               [&] { return Tensors{leaf(torch::randn({n, 64}, dev)), leaf(torch::randn({64}, dev))}; }, 1e-4, 1e-5);
    check_cuda(w, "noncontiguous",
               [](const Tensors& in) { return Tensors{torch::tanh(in[0].t()) * torch::exp(-in[1]) + torch::cos(in[1])}; },
               [&] {
                 return Tensors{leaf(torch::randn({33, n}, dev)), leaf(torch::randn({n, 66}, dev).slice(1, 0, 66, 2))};
               },
               1e-4, 1e-5);
    check_cuda(w, "softmax", [](const Tensors& in) { return Tensors{torch::softmax(in[0] * 2.0, -1)}; },
               [&] { return Tensors{leaf(torch::randn({n, 1000}, dev))}; }, 1e-4, 1e-6);
    check_cuda(w, "layer_norm",
               [](const Tensors& in) { return Tensors{torch::layer_norm(in[0], {33}, in[1], in[2], 1e-5)}; },
               [&] {
                 return Tensors{leaf(torch::randn({n, 33}, dev) * 3 + 1), leaf(torch::randn({33}, dev)),
                                leaf(torch::randn({33}, dev))};
               },
               1e-4, 1e-4);
    check_cuda(w, "reductions",
               [](const Tensors& in) {
                 auto x = in[0] * in[0];
                 return Tensors{x.sum(std::vector<int64_t>{0, 2}), x.mean(-1, true) - x.amax(-1, true), in[0].sum()};
               },
               [&] { return Tensors{leaf(torch::randn({n, 3, 5}, dev))}; }, 1e-4, 1e-4);
    check_cuda(w, "short_softmax", [](const Tensors& in) { return Tensors{torch::softmax(in[0] * 2.0, -1)}; },
               [&] { return Tensors{leaf(torch::randn({n, 24}, dev))}; }, 1e-4, 1e-6);
    check_cuda(w, "column_sum", [](const Tensors& in) { return Tensors{(in[0] * in[0]).sum(0)}; },
               [&] { return Tensors{leaf(torch::randn({n, 1031}, dev))}; }, 1e-4, 1e-4);
    // A linear layer's bias gradient through a ReLU: a column sum with a per-element store.
    check_cuda(w, "bias_relu", [](const Tensors& in) { return Tensors{torch::relu(in[0] + in[1]) * 3.0}; },
               [&] { return Tensors{leaf(torch::randn({n, 96}, dev)), leaf(torch::randn({96}, dev))}; }, 1e-4, 1e-4);
  }
}

void half_and_bfloat16(Where w) {
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const auto o = on(w).dtype(dtype);
    // One rounding (fused) against eager's per-op rounding: bounded by a few ulps of the dtype.
    const double tol = dtype == at::kHalf ? 4e-3 : 3e-2;
    check_cuda(w, "half_pointwise",
               [](const Tensors& in) { return Tensors{torch::silu(in[0] * in[1] + 1.0), torch::softmax(in[0], -1)}; },
               [&] { return Tensors{leaf(torch::randn({37, 45}, o)), leaf(torch::randn({45}, o))}; }, tol, tol);
  }
}

// A view starting one element in: the vector path's alignment check must refuse it.
void misaligned(Where w) {
  check_cuda(w, "misaligned", [](const Tensors& in) { return Tensors{torch::exp(in[0]) * 2.0}; },
             [&] {
               auto base = torch::randn({4098}, on(w));
               return Tensors{leaf(base.slice(0, 1, 4098))};
             },
             1e-5, 1e-6);
}

// Compiled autograd (docs/compiled-autograd.md) with the backward's kernels on CUDA: an MLP
// block's parameter gradients against the eager engine's, three steps on fresh inputs.
void compiled_autograd_backward(Where w) {
  torch::manual_seed(7);
  torch::nn::Sequential net(torch::nn::Linear(33, 64), torch::nn::GELU(), torch::nn::LayerNorm(torch::nn::LayerNormOptions({64})),
                            torch::nn::Linear(64, 10));
  net->to(on(w).device());
  tcap::CompileOptions o;
  o.name = w == Where::Device ? "ca_cuda" : "ca_cuda_emulated";
  if (w == Where::Device) {
    o.backend = "cuda";
  } else {
    o.bw_compiler = [](const tcap::ir::Graph& g) { return cuda_emu::compiler(g); };
  }
  int64_t hits = 0;
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step + 1));
    const at::Tensor x = torch::randn({45, 33}, on(w));
    const at::Tensor target = torch::randn({45, 10}, on(w));
    auto loss_of = [&] { return (torch::log_softmax(net->forward(x), -1) * target).sum(); };
    net->zero_grad();
    loss_of().backward();
    std::vector<at::Tensor> want;
    for (const auto& p : net->parameters()) want.push_back(p.grad().clone());
    net->zero_grad();
    const auto before = launches(w);
    {
      tcap::CompiledAutogradGuard ca(o);
      loss_of().backward();
      hits = ca.stats().hits;
    }
    if (step > 0) {
      EXPECT_GT(launches(w), before) << "no generated CUDA kernel ran in the compiled backward";
    }
    const auto params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(tcap::testing::close(params[i].grad().cpu(), want[i].cpu(), 1e-4, 1e-5)) << "grad of parameter " << i;
    }
  }
  EXPECT_GE(hits, 2) << "the compiled backward did not serve steps 2 and 3";
}

// --- CUDA graphs (Note [CUDA graphs of compiled regions]) ----------------------------

// The forward graph tcap::compile makes of fn (inputs without grad), with every tensor's
// device set to cuda:0 in the metadata: the refusal rules read only the graph.
tcap::ir::Graph forward_graph_on_cuda(const Fn& fn, const Tensors& in) {
  auto captured = std::make_shared<tcap::ir::Graph>();
  tcap::CompileOptions o;
  o.name = "graph_for_cuda_graphs";
  o.fw_compiler = [captured](const tcap::ir::Graph& g) {
    *captured = g;
    return tcap::eager_backend(g);
  };
  auto f = tcap::compile(fn, o);
  (*f)(in);
  (*f)(in);
  EXPECT_GT(captured->values().size(), 0u) << "no forward graph was compiled";
  for (size_t v = 0; v < captured->values().size(); ++v) {
    captured->value(static_cast<tcap::ir::ValueId>(v)).meta.device = c10::Device(c10::kCUDA, 0);
  }
  return *captured;
}

TEST(CudaGraphs, RefusalsNameTheReason) {
  const Tensors xy{torch::randn({4, 5}), torch::randn({4, 5})};
  EXPECT_EQ(tcap::cuda_graph_refusal(
                forward_graph_on_cuda([](const Tensors& in) { return Tensors{in[0].sin() * in[1] + 1.0}; }, xy)),
            "");
  auto refusal = [&](const Fn& fn) { return tcap::cuda_graph_refusal(forward_graph_on_cuda(fn, xy)); };
  // Random numbers from the default generator replay right (Note [CUDA graphs of compiled
  // regions]); an explicit generator is refused.
  EXPECT_EQ(refusal([](const Tensors& in) { return Tensors{torch::dropout(in[0], 0.5, true)}; }), "");
  // (tcap::compile runs functions with explicit generators eagerly, so the graph is made
  // by hand: the dropout's random op given a generator argument.)
  tcap::ir::Graph with_generator =
      forward_graph_on_cuda([](const Tensors& in) { return Tensors{torch::dropout(in[0], 0.5, true)}; }, xy);
  bool found = false;
  for (auto& n : with_generator.mutable_nodes()) {
    if (!n.draws_random_numbers()) continue;
    tcap::ir::Arg gen;
    gen.kind = tcap::ir::ArgKind::Opaque;
    gen.name = "generator";
    gen.s = "Generator";
    n.args.push_back(gen);
    found = true;
  }
  ASSERT_TRUE(found) << "no random op in the dropout graph";
  EXPECT_NE(tcap::cuda_graph_refusal(with_generator).find("draws from an explicit generator"), std::string::npos);
  EXPECT_NE(refusal([](const Tensors& in) {
              in[0].add_(1.0);
              return Tensors{in[0] * 2.0};
            }).find("writes into an input"),
            std::string::npos);
  EXPECT_NE(refusal([](const Tensors& in) { return Tensors{in[0].t(), in[1] * 2.0}; }).find("a view of an input"),
            std::string::npos);
  EXPECT_NE(refusal([](const Tensors& in) { return Tensors{in[0] * in[1].sum().item<double>()}; }).find("on the host"),
            std::string::npos);
}

// On the CPU, cuda_graphs changes nothing but a log line saying why.
TEST(CudaGraphs, CpuGraphsRunAsUsualAndSayWhy) {
  tcap::testing::LogCapture logs("graph_breaks");
  tcap::CompileOptions o;
  o.name = "cpu_cuda_graphs";
  o.cuda_graphs = true;
  const Fn fn = [](const Tensors& in) { return Tensors{torch::tanh(in[0]) * 3.0}; };
  auto f = tcap::compile(fn, o);
  for (int call = 0; call < 4; ++call) {
    Tensors in{leaf(torch::randn({6, 7}))};
    Tensors out = (*f)(in);
    out[0].sum().backward();
    EXPECT_TRUE(tcap::testing::close(out[0], fn({in[0].detach()})[0]));
    EXPECT_TRUE(tcap::testing::close(in[0].grad(), 3.0 * (1 - in[0].detach().tanh().pow(2))));
  }
  EXPECT_EQ(f->eager_reason(), "");
  EXPECT_GE(logs.count("runs without a CUDA graph: value %"), 2) << logs.text();  // forward and backward
  EXPECT_NE(logs.text().find("is on cpu"), std::string::npos) << logs.text();
}

TEST(CudaDevice, CudaGraphsReplayMatchesEager) {
  SKIP_WITHOUT_CUDA_DEVICE();
  ASSERT_TRUE(tcap::cuda_graphs_built()) << "this build has no CUDA graph support";
  tcap::testing::LogCapture logs("graph_breaks,perf");
  const auto s0 = tcap::cuda_graph_stats();
  const auto dev = on(Where::Device);
  check_cuda(Where::Device, "cuda_graphs_mlp",
             [](const Tensors& in) {
               auto h = torch::gelu(torch::mm(in[0], in[1]) + in[2]);
               return Tensors{torch::layer_norm(h, {64}, {}, {}, 1e-5).softmax(-1)};
             },
             [&] {
               return Tensors{leaf(torch::randn({37, 33}, dev)), leaf(torch::randn({33, 64}, dev)),
                              leaf(torch::randn({64}, dev))};
             },
             1e-4, 1e-5, /*cuda_graphs=*/true);
  const auto s1 = tcap::cuda_graph_stats();
  EXPECT_EQ(s1.captures - s0.captures, 2) << "the forward and the backward graph\n" << logs.text();
  EXPECT_GE(s1.replays - s0.replays, 4) << "calls 3 and 4, forward and backward\n" << logs.text();

  // Dropout under replay: from the same generator state, the same mask as eager; from the
  // next state, a new one (a graph that froze its random numbers would repeat the mask).
  tcap::CompileOptions o;
  o.name = "cuda_graphs_dropout";
  o.backend = "cuda";
  o.cuda_graphs = true;
  const Fn fn = [](const Tensors& in) { return Tensors{torch::dropout(torch::tanh(in[0]) * 2.0, 0.5, true)}; };
  auto f = tcap::compile(fn, o);
  const at::Tensor x = torch::randn({61, 67}, dev);
  at::Tensor previous;
  for (int call = 0; call < 8; ++call) {  // eager, forward-only confirmation, warm-up, capture, replays
    SCOPED_TRACE("call " + std::to_string(call + 1));
    torch::manual_seed(1000 + call);
    const at::Tensor got = (*f)({x})[0];
    torch::manual_seed(1000 + call);
    const at::Tensor want = fn({x})[0];
    EXPECT_TRUE(at::equal(got.cpu(), want.cpu()));
    if (previous.defined()) {
      EXPECT_FALSE(at::equal(got.cpu(), previous.cpu())) << "the mask repeats";
    }
    previous = got;
  }
  EXPECT_EQ(f->eager_reason(), "");
  EXPECT_GT(tcap::cuda_graph_stats().replays, s1.replays) << logs.text();
}

TEST(CudaDevice, FusedPatternsMatchEager) {
  SKIP_WITHOUT_CUDA_DEVICE();
  fused_patterns(Where::Device);
}

TEST(CudaDevice, HalfAndBFloat16ComputeInFloat) {
  SKIP_WITHOUT_CUDA_DEVICE();
  half_and_bfloat16(Where::Device);
}

TEST(CudaDevice, MisalignedInputsTakeTheScalarPath) {
  SKIP_WITHOUT_CUDA_DEVICE();
  misaligned(Where::Device);
}

TEST(CudaDevice, CompiledAutogradBackward) {
  SKIP_WITHOUT_CUDA_DEVICE();
  compiled_autograd_backward(Where::Device);
}

TEST(CudaEmulated, CompiledAutogradBackward) {
  SKIP_WITHOUT_EMULATOR();
  compiled_autograd_backward(Where::Emulator);
}

TEST(CudaEmulated, FusedPatternsMatchEager) {
  SKIP_WITHOUT_EMULATOR();
  const auto before = cuda_emu::stats();
  fused_patterns(Where::Emulator);
  // Layer norm's weight and bias gradients and the bias gradient are split column sums.
  EXPECT_GT(cuda_emu::stats().split_launches, before.split_launches);
}

TEST(CudaEmulated, HalfAndBFloat16ComputeInFloat) {
  SKIP_WITHOUT_EMULATOR();
  half_and_bfloat16(Where::Emulator);
}

// Inference (no backward, whose kernels read only aligned tensors): a view one element in
// takes the scalar loop, an aligned tensor the vector path.
TEST(CudaEmulated, VectorPathOnlyWhenAligned) {
  SKIP_WITHOUT_EMULATOR();
  const Fn fn = [](const Tensors& in) { return Tensors{torch::exp(in[0]) * 2.0}; };
  const auto v0 = cuda_emu::stats();
  check_cuda(Where::Emulator, "misaligned_inference", fn, [] { return Tensors{torch::randn({4098}).slice(0, 1)}; },
             1e-5, 1e-6);
  const auto v1 = cuda_emu::stats();
  EXPECT_GT(v1.launches, v0.launches);
  EXPECT_EQ(v1.vector_launches, v0.vector_launches) << "a misaligned view took the vector path";
  check_cuda(Where::Emulator, "aligned_inference", fn, [] { return Tensors{torch::randn({4097})}; }, 1e-5, 1e-6);
  const auto v2 = cuda_emu::stats();
  EXPECT_GT(v2.vector_launches, v1.vector_launches) << "an aligned tensor took the scalar path";
  // Rows (BlockRow's vector path): contiguous rows that start one element in.
  const Fn rows = [](const Tensors& in) { return Tensors{torch::softmax(in[0] * 2.0, -1)}; };
  check_cuda(Where::Emulator, "misaligned_rows", rows,
             [] { return Tensors{torch::randn({7 * 1000 + 1}).slice(0, 1).view({7, 1000})}; }, 1e-5, 1e-6);
  const auto v3 = cuda_emu::stats();
  EXPECT_GT(v3.launches, v2.launches);
  EXPECT_EQ(v3.vector_launches, v2.vector_launches) << "misaligned rows took the vector path";
  check_cuda(Where::Emulator, "aligned_rows", rows, [] { return Tensors{torch::randn({7, 1000})}; }, 1e-5, 1e-6);
  EXPECT_GT(cuda_emu::stats().vector_launches, v3.vector_launches) << "aligned rows took the scalar path";
  misaligned(Where::Emulator);  // and with gradients
}

#if TCAP_HAVE_LLVM
// Buffers for a hand-built kernel: each a view `pad` elements into a larger tensor whose
// padding holds a sentinel, so writes out of bounds show and float reads out of bounds
// turn into NaN.
struct KernelBuffers {
  Tensors whole, views;
};

at::ScalarType scalar_type(DType t) {
  switch (t) {
    case DType::Bool: return at::kBool;
    case DType::U8: return at::kByte;
    case DType::I8: return at::kChar;
    case DType::I16: return at::kShort;
    case DType::I32: return at::kInt;
    case DType::I64: return at::kLong;
    case DType::F16: return at::kHalf;
    case DType::BF16: return at::kBFloat16;
    case DType::F32: return at::kFloat;
    case DType::F64: return at::kDouble;
  }
  return at::kFloat;
}

KernelBuffers make_buffers(const tcap::kir::Kernel& k, int64_t pad) {
  std::vector<int64_t> extent;
  for (const auto& e : cuda_emu::buffer_extents(k)) {
    EXPECT_EQ(e.lo, 0) << "the test kernels start each buffer at its first element";
    extent.push_back(std::max<int64_t>(e.hi + 1, 1));
  }
  KernelBuffers out;
  for (size_t b = 0; b < k.buffers.size(); ++b) {
    const at::ScalarType st = scalar_type(k.buffers[b].dtype);
    const auto opts = at::TensorOptions().dtype(st);
    at::Tensor whole = c10::isFloatingType(st) ? at::full({extent[b] + 2 * pad}, NAN, opts)
                                                : at::full({extent[b] + 2 * pad}, st == at::kBool ? 1 : 91, opts);
    at::Tensor view = whole.slice(0, pad, pad + extent[b]);
    if (!k.buffers[b].is_output) {
      if (c10::isFloatingType(st)) {
        view.copy_(at::randn({extent[b]}) * 3);
      } else if (st == at::kBool) {
        view.copy_(at::randint(0, 2, {extent[b]}));
      } else {
        view.copy_(at::randint(st == at::kByte ? 0 : -60, 60, {extent[b]}));
      }
    }
    out.whole.push_back(whole);
    out.views.push_back(view);
  }
  return out;
}

KernelBuffers clone(const KernelBuffers& b) {
  KernelBuffers c;
  for (size_t i = 0; i < b.whole.size(); ++i) {
    c.whole.push_back(b.whole[i].clone());
    c.views.push_back(c.whole[i].slice(0, b.views[i].storage_offset(), b.views[i].storage_offset() + b.views[i].numel()));
  }
  return c;
}

// Kernel k run by the emulator and by the cpu_llvm backend on the same random inputs, in
// buffers `pad` elements into padded tensors, whole buffers compared: integers and bools
// bit for bit, floats within what libm against libmvec and a different summation order
// allow; the padding untouched.
void emulated_matches_cpu(const tcap::kir::Kernel& k, int64_t pad) {
  SCOPED_TRACE(k.name + " " + cuda::to_string(cuda::render(k).plan));
  const KernelBuffers a = make_buffers(k, pad);
  const KernelBuffers b = clone(a);
  tcap::test::run(*tcap::codegen::compile_cpu_kernel(k), a.views);
  const auto emu = cuda_emu::build(k);
  std::vector<void*> args = tcap::test::args_of(b.views);
  emu->fn(args.data(), 0, emu->range);
  for (size_t i = 0; i < a.whole.size(); ++i) {
    SCOPED_TRACE("buffer " + std::to_string(i));
    const at::Tensor x = a.whole[i], y = b.whole[i];
    if (!x.is_floating_point()) {
      EXPECT_TRUE(at::equal(x, y)) << "cpu " << x.slice(0, pad - 4, pad + 16) << "\nemulated " << y.slice(0, pad - 4, pad + 16);
      continue;
    }
    const DType t = k.buffers[i].dtype;
    const double rtol = t == DType::F64 ? 1e-9 : t == DType::F32 ? 1e-4 : t == DType::F16 ? 1e-2 : 4e-2;
    EXPECT_TRUE(tcap::test::close(y, x, rtol, rtol, k));
    // The padding is untouched: NaN in both (a write out of bounds would be a number).
    EXPECT_TRUE(y.slice(0, 0, pad).isnan().all().item<bool>()) << "write before the buffer";
    EXPECT_TRUE(y.slice(0, y.numel() - pad).isnan().all().item<bool>()) << "write after the buffer";
  }
}

// Every kernel of the PTX test, run by the emulator and by the cpu_llvm backend (the same
// kernel IR semantics) on the same random inputs, whole padded buffers compared: integers
// and bools bit for bit, floats within what libm against libmvec and a different summation
// order allow.
TEST(CudaEmulated, EveryOpAndDtypeMatchesTheCpuBackend) {
  SKIP_WITHOUT_EMULATOR();
  std::string why;
  if (!tcap::codegen::cpu_llvm_available(&why)) GTEST_SKIP() << why;
  std::vector<tcap::kir::Kernel> kernels;
  for (DType t : kFloats) kernels.push_back(every_float_op(t));
  for (DType t : kInts) kernels.push_back(every_int_op(t));
  kernels.push_back(bool_ops());
  for (DType t : kAll) {
    kernels.push_back(reductions(t, {37, 45}, 1, {45, 1}));
    kernels.push_back(reductions(t, {300, 5}, 1, {5, 1}));
    kernels.push_back(reductions(t, {1100, 37}, 1, {1, 1100}));
    kernels.push_back(reductions(t, {6, 5, 7}, 2, {35, 7, 1}));
  }
  for (DType t : kFloats) kernels.push_back(softmax(t, 7, 1000));
  for (DType t : kFloats) kernels.push_back(softmax(t, 13, 40));  // a warp per row, a partial last block
  for (DType t : kAll) kernels.push_back(reductions(t, {29, 30}, 1, {30, 1}));
  kernels.push_back(column_softmax(300, 70));
  for (const auto& k : kernels) emulated_matches_cpu(k, 64);
}

// Column kernels and split rows (Note [Split column reductions]) against the cpu_llvm
// backend: several tiles and splits, odd column counts, two reduce dims, a per-element
// store and a per-column load; full reductions and a few long rows. Aligned buffers take
// the vector path, buffers one element in the scalar.
TEST(CudaEmulated, SplitReductionsMatchTheCpuBackend) {
  SKIP_WITHOUT_EMULATOR();
  std::string why;
  if (!tcap::codegen::cpu_llvm_available(&why)) GTEST_SKIP() << why;
  std::vector<tcap::kir::Kernel> kernels;
  for (DType t : kAll) {
    kernels.push_back(reductions(t, {70, 2000}, 1, {1, 70}));
    kernels.push_back(reductions(t, {96, 700}, 1, {1, 96}));
    kernels.push_back(reductions(t, {64, 30, 40}, 2, {1, 64 * 41, 64}));
  }
  for (DType t : kFloats) {
    kernels.push_back(bias_grad(t, 1000, 96));
    kernels.push_back(bias_grad(t, 333, 37));
    kernels.push_back(ln_param_grads(t, 1500, 64));
  }
  const size_t columns = kernels.size();
  for (DType t : kAll) {
    kernels.push_back(reductions(t, {60000}, 1, {1}));
    kernels.push_back(reductions(t, {3, 50001}, 1, {50001, 1}));
  }
  const auto before = cuda_emu::stats();
  for (size_t i = 0; i < kernels.size(); ++i) {
    const auto& k = kernels[i];
    const cuda::LaunchPlan plan = cuda::render(k).plan;
    EXPECT_EQ(plan.strategy, i < columns ? cuda::Strategy::Column : cuda::Strategy::BlockRow)
        << k.name << " " << cuda::to_string(plan);
    if (i >= columns) {
      EXPECT_GT(plan.splits, 1) << k.name << " " << cuda::to_string(plan);
    }
    for (int64_t pad : {64, 65}) {
      SCOPED_TRACE("pad " + std::to_string(pad));
      const auto v0 = cuda_emu::stats().vector_launches;
      emulated_matches_cpu(k, pad);
      EXPECT_EQ(cuda_emu::stats().vector_launches - v0, pad == 64 && plan.vec > 1 ? 1 : 0);
    }
  }
  const auto after = cuda_emu::stats();
  EXPECT_EQ(after.column_launches - before.column_launches, static_cast<int64_t>(2 * columns));
  EXPECT_GT(after.split_launches - before.split_launches, static_cast<int64_t>(kernels.size()));
}
#endif

// The emulator enforces CUDA's rules and the kernel IR's bounds: a barrier some threads
// skip, a partial shuffle, a write out of bounds or into an input are errors, not silent
// successes.
TEST(CudaEmulated, BrokenKernelsAreErrors) {
  SKIP_WITHOUT_EMULATOR();
  auto expect_error = [](const std::string& name, const std::string& body, const std::string& want) {
    SCOPED_TRACE(name);
    cuda::CudaSource src;
    src.entry = "emu_" + name;
    src.source = "extern \"C\" __global__ void emu_" + name + "(float* b0, int vec_ok) {\n" + body + "\n}\n";
    src.plan.block = 64;
    src.plan.work_items = 64;
    auto k = cuda_emu::build_source(name, src);
    at::Tensor out = torch::zeros({64});
    void* args[] = {out.data_ptr()};
    try {
      k->fn(args, 0, 1);
      ADD_FAILURE() << "no error";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  expect_error("divergent_barrier", "if (threadIdx.x < 16) __syncthreads();\nb0[threadIdx.x] = 1.0f;",
               "exited while 16 threads of its block wait at __syncthreads");
  expect_error("partial_warp", "if (threadIdx.x % 32 < 8) b0[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);",
               "exited while lanes of its warp wait");
  expect_error("partial_mask", "b0[threadIdx.x] = __shfl_xor_sync(0xffu, 1.0f, 1);", "partial mask");

  // Guarded buffers: writes outside the kernel IR's extents or into an input are errors,
  // reads outside return poison (NaN).
  KernelBuilder kb("bounds", {64});
  const int32_t input = kb.input(DType::F32), output = kb.output(DType::F32);  // buffers 0 and 1
  kb.store(kb.load(input, {1}), output, {1});
  auto guarded = [&](const std::string& name, const std::string& body) {
    cuda::CudaSource src;
    src.entry = "emu_" + name;
    src.source = "extern \"C\" __global__ void emu_" + name + "(const float* b0, float* b1, int vec_ok) {\n" +
                 "  const int i = threadIdx.x;\n" + body + "\n}\n";
    src.plan.block = 64;
    src.plan.work_items = 64;
    return cuda_emu::build_source(name, src, {}, &kb.k);
  };
  const at::Tensor src_in = torch::randn({64}), dst = torch::zeros({64});
  void* io[] = {src_in.data_ptr(), dst.data_ptr()};
  for (const auto& [name, body, want] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"write_past_the_end", "b1[i + 1] = b0[i];", "wrote outside buffer 1"},
           {"write_before_the_start", "b1[i - 3] = b0[i];", "wrote outside buffer 1"},
           {"write_into_an_input", "((float*)b0)[i] = 0.0f; b1[i] = 1.0f;", "wrote into input buffer 0"}}) {
    SCOPED_TRACE(name);
    try {
      guarded(name, body)->fn(io, 0, 1);
      ADD_FAILURE() << "no error";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  guarded("read_past_the_end", "b1[i] = b0[i + 32];")->fn(io, 0, 1);
  EXPECT_TRUE(at::equal(dst.slice(0, 0, 32), src_in.slice(0, 32)));
  EXPECT_TRUE(dst.slice(0, 32).isnan().all().item<bool>()) << "a read past the end did not read poison";
  guarded("in_bounds", "b1[i] = b0[i] * 2.0f;")->fn(io, 0, 1);
  EXPECT_TRUE(at::equal(dst, src_in * 2)) << "outputs are copied back";

  // And a correct kernel runs: block-wide sum through shuffles and a barrier, grid-stride.
  cuda::CudaSource ok;
  ok.entry = "emu_block_sum";
  ok.source = R"(extern "C" __global__ void emu_block_sum(float* b0, int vec_ok) {
  __shared__ float partial[2];
  float v = (float)threadIdx.x;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  b0[blockIdx.x * blockDim.x + threadIdx.x] = partial[0] + partial[1] + (float)gridDim.x;
})";
  ok.plan.block = 64;
  ok.plan.work_items = 5 * 64;  // Pointwise: 5 blocks needed, capped at 3
  auto k = cuda_emu::build_source("block_sum", ok);
  at::Tensor out = torch::zeros({5 * 64});
  void* args[] = {out.data_ptr()};
  k->fn(args, 0, 1);
  EXPECT_TRUE(at::equal(out.slice(0, 0, 3 * 64), torch::full({3 * 64}, 2016.0f + 3)));
  EXPECT_TRUE(at::equal(out.slice(0, 3 * 64), torch::zeros({2 * 64}))) << "more blocks ran than the grid has";
}

TEST(CudaBackend, CpuGraphsAreRefusedWithAReason) {
  tcap::CompileOptions o;
  o.backend = "cuda";
  auto f = tcap::compile([](const Tensors& in) { return Tensors{in[0].cos()}; }, o);
  for (int call = 0; call < 2; ++call) {
    Tensors in{leaf(torch::randn({4}))};
    Tensors out = (*f)(in);
    out[0].sum().backward();
    EXPECT_TRUE(tcap::testing::close(in[0].grad(), -in[0].detach().sin()));
  }
  EXPECT_NE(f->eager_reason().find("backend 'cuda' cannot compile"), std::string::npos) << f->eager_reason();
  EXPECT_NE(f->eager_reason().find("has no CUDA tensors"), std::string::npos) << f->eager_reason();
}

}  // namespace
