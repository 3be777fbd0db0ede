// The cuda backend without a device: every op and dtype of the kernel IR renders and
// compiles to PTX with NVRTC, the launch plans (vector widths, reduction strategies, index
// width) are the intended ones, the caches work.
#include "codegen/cuda/cuda.h"
#include "codegen/cuda/numbers.h"
#include "codegen/kernel_cache.h"
#include "cuda_test_util.h"
#include "kernel_builder.h"
#include "support/logging.h"

#include <algorithm>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace tcap::test::cuda_kernels;
using tcap::test::KernelBuilder;

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
  std::vector<tcap::kir::Kernel> kernels = every_op_kernels();
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
  EXPECT_TRUE(first->code->is_ptx);
  EXPECT_FALSE(first->code->from_disk);
  EXPECT_NE(first->code->binary.find(".entry " + first->code->entry), std::string::npos);
  auto again = cuda::compile_cuda_kernel(k, target);
  EXPECT_EQ(again.get(), first.get());
  cuda::cuda_clear_memory_cache_for_testing();
  auto from_disk = cuda::compile_cuda_kernel(k, target);
  EXPECT_TRUE(from_disk->code->from_disk);
  EXPECT_EQ(from_disk->code->binary, first->code->binary);
  // Flip a byte of the file: rejected, counted, rebuilt.
  const std::string path = tcap::codegen::cache_file_path(tcap::Config::get().cache_dir, first->code->key_hash);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << path;
    f.seekp(100);
    f.put('\x5a');
  }
  cuda::cuda_clear_memory_cache_for_testing();
  auto rebuilt = cuda::compile_cuda_kernel(k, target);
  EXPECT_FALSE(rebuilt->code->from_disk);
  EXPECT_EQ(rebuilt->code->binary, first->code->binary);
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
      EXPECT_NE(k->code->binary.find(".entry " + k->code->entry), std::string::npos);
    }
  }
}

// Note [CUDA sizes at launch], through NVRTC (PTX, no device needed): softmax over 7 rows
// compiles with its numbers built in; over 20, 3 and 33 rows one code that reads the rows
// at launch serves all three (NVRTC takes the `tcap_numbers` parameter by value); each
// kernel keeps its own plan and numbers; 7 rows again is the first kernel.
TEST(CudaCache, SizesAtLaunchCompileOnceForEveryRowCount) {
  SKIP_WITHOUT_NVRTC();
  const cuda::Target target{archs_to_check().front(), /*cubin=*/false};
  cuda::cuda_clear_memory_cache_for_testing();
  const auto s0 = cuda::cuda_stats();
  std::vector<std::shared_ptr<const cuda::CudaKernel>> got;
  for (int64_t rows : {7, 20, 3, 33, 7}) got.push_back(cuda::compile_cuda_kernel(softmax(DType::F32, rows, 1000), target));
  const auto s1 = cuda::cuda_stats();
  EXPECT_EQ(s1.compiled + s1.disk_hits - s0.compiled - s0.disk_hits, 2) << "one code built in, one reading the rows";
  EXPECT_EQ(s1.served_at_launch - s0.served_at_launch, 2);
  EXPECT_EQ(s1.memory_hits - s0.memory_hits, 1);
  EXPECT_FALSE(got[0]->code->reads_numbers);
  EXPECT_EQ(got[4].get(), got[0].get());
  for (size_t i : {1, 2, 3}) {
    EXPECT_TRUE(got[i]->code->reads_numbers);
    EXPECT_EQ(got[i]->code.get(), got[1]->code.get());
    EXPECT_NE(got[i]->code->binary.find(".entry " + got[i]->code->entry), std::string::npos);
    EXPECT_NE(got[i]->code->source.find("const tcap_numbers tcap_n"), std::string::npos);
    cuda::LaunchShapes fresh;  // the kernel's own numbers, as a first kernel of its structure
    EXPECT_EQ(got[i]->numbers, cuda::render_for_launch(softmax(DType::F32, got[i]->plan.work_items, 1000), fresh).numbers);
  }
  EXPECT_EQ(got[1]->plan.work_items, 20);
  EXPECT_EQ(got[2]->plan.work_items, 3);
  EXPECT_EQ(got[3]->plan.work_items, 33);
}

}  // namespace
