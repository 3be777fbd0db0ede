// The CUDA host emulator (test/support/cuda_emu.h) on hand-built kernels: every op, dtype
// and reduction strategy of the renderer against the cpu_llvm backend, and the emulator's
// own checks (barriers, shuffles, guarded buffers) on broken kernels.
#include "codegen/cuda/cuda.h"
#include "cuda_test_util.h"
#include "kernel_builder.h"
#include "support/cuda_emu.h"

#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace {

using namespace tcap::test::cuda_kernels;
using tcap::test::KernelBuilder;
using Tensors = std::vector<at::Tensor>;

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
  tcap::test::run(*tcap::codegen::cpu_llvm::compile_cpu_kernel(k), a.views);
  const auto emu = cuda_emu::build(k);
  std::vector<void*> args = tcap::test::args_of(b.views);
  emu->run(args.data(), 0, emu->range);
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
  if (!tcap::codegen::cpu_llvm::cpu_llvm_available(&why)) GTEST_SKIP() << why;
  std::vector<tcap::kir::Kernel> kernels = every_op_kernels();
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
  if (!tcap::codegen::cpu_llvm::cpu_llvm_available(&why)) GTEST_SKIP() << why;
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

// y[b, h] = tanh(x[b, h]) * 1.5 + bias[h]; x transposed in storage when `transposed`.
tcap::kir::Kernel bias_tanh(int64_t b, int64_t h, bool transposed) {
  KernelBuilder kb("bias_tanh", {b, h});
  const int32_t bx = kb.input(DType::F32), bb = kb.input(DType::F32), by = kb.output(DType::F32);
  const int32_t x = kb.load(bx, transposed ? std::vector<int64_t>{1, b} : std::vector<int64_t>{h, 1});
  const int32_t y = kb.bin(OpCode::Add, kb.bin(OpCode::Mul, kb.un(OpCode::Tanh, x), kb.fconst(DType::F32, 1.5)),
                           kb.load(bb, {0, 1}));
  kb.store(y, by, {h, 1});
  return kb.k;
}

// Row means: sum over n points times the constant 1/n (a number read at launch).
tcap::kir::Kernel row_mean(int64_t rows, int64_t n) {
  KernelBuilder kb("row_mean", {rows, n}, 1);
  const int32_t bx = kb.input(DType::F32), by = kb.output(DType::F32);
  const int32_t sum = kb.reduce(OpCode::ReduceSum, kb.load(bx, {n, 1}));
  kb.store(kb.bin(OpCode::Mul, sum, kb.fconst(DType::F32, 1.0 / static_cast<double>(n))), by, {1, 0});
  return kb.k;
}

// Note [CUDA sizes at launch]: the kernels of one structure at many sizes (odd ones, a
// size that comes back, sizes below a block and a vector), each run by the emulator and
// compared with the cpu_llvm backend. The first size gets code with its numbers built in,
// every later one shares one code that reads the numbers that vary at launch (the
// emulator, as the backend, keys its libraries by the source, so the code built is
// counted by its entry names). Families: pointwise with a broadcast bias (contiguous and
// transposed), a row reduction over more rows, softmax over more rows and over longer
// rows (its reduce extent read at launch), column sums whose rows are split over blocks (the
// number of splits read at launch), and a mean whose 1/n is read at launch.
TEST(CudaEmulated, SizesAtLaunchServeEveryShapeOfAStructure) {
  SKIP_WITHOUT_EMULATOR();
  std::string why;
  if (!tcap::codegen::cpu_llvm::cpu_llvm_available(&why)) GTEST_SKIP() << why;
  struct Family {
    std::string what;
    std::function<tcap::kir::Kernel(int64_t)> make;
    std::vector<int64_t> sizes;
  };
  const std::vector<Family> families = {
      {"pointwise", [](int64_t n) { return bias_tanh(n, 37, false); }, {5, 17, 64, 3, 100, 17, 2}},
      {"pointwise, x transposed", [](int64_t n) { return bias_tanh(n, 37, true); }, {5, 17, 64, 3, 100, 17, 2}},
      {"row sums over more rows", [](int64_t n) { return reductions(DType::F32, {n, 45}, 1, {45, 1}); }, {37, 50, 3, 100, 37, 64}},
      {"softmax over more rows", [](int64_t n) { return softmax(DType::F32, n, 1000); }, {7, 20, 3, 33, 7}},
      {"softmax over longer rows", [](int64_t n) { return softmax(DType::F32, 13, n); }, {40, 56, 44, 60, 40, 48}},
      {"split column sums", [](int64_t n) { return bias_grad(DType::F32, n, 96); }, {1000, 700, 1333, 1000, 2900}},
      {"row means", [](int64_t n) { return row_mean(9, n); }, {300, 412, 260, 300, 500}},
  };
  for (const Family& f : families) {
    SCOPED_TRACE(f.what);
    cuda_emu::shapes().clear();
    std::set<std::string> code;
    int at_launch = 0;
    std::string structure;
    for (int64_t n : f.sizes) {
      SCOPED_TRACE("size " + std::to_string(n));
      const tcap::kir::Kernel k = f.make(n);
      for (int64_t pad : {64, 65}) emulated_matches_cpu(k, pad);
      const auto built = cuda_emu::build(k);
      code.insert(built->name);
      const bool reads = built->numbers.at(1) != 0;
      at_launch += reads;
      EXPECT_EQ(reads, n != f.sizes.front()) << "the first size's numbers are built in, every other size's read";
    }
    EXPECT_EQ(code.size(), 2u) << "one code with the first size's numbers, one for every other size";
    EXPECT_EQ(at_launch, static_cast<int>(std::count_if(f.sizes.begin(), f.sizes.end(),
                                                          [&](int64_t n) { return n != f.sizes.front(); })));
  }
}

// The launch path of the renderer on every kernel of the two tests above (every op and
// dtype, every reduction strategy, split rows and columns, persistent rows, warp rows):
// each kernel's code reading every number at launch gives, on the same inputs, the bits
// its code with the numbers built in gives (the same operations in the same order).
TEST(CudaEmulated, EveryKernelReadingEveryNumberAtLaunchIsBitwiseItsBuiltInCode) {
  SKIP_WITHOUT_EMULATOR();
  std::vector<tcap::kir::Kernel> kernels = every_op_kernels();
  for (DType t : kAll) {
    kernels.push_back(reductions(t, {37, 45}, 1, {45, 1}));
    kernels.push_back(reductions(t, {1100, 37}, 1, {1, 1100}));
    kernels.push_back(reductions(t, {6, 5, 7}, 2, {35, 7, 1}));
    kernels.push_back(reductions(t, {70, 2000}, 1, {1, 70}));
    kernels.push_back(reductions(t, {3, 50001}, 1, {50001, 1}));
  }
  for (DType t : kFloats) {
    kernels.push_back(softmax(t, 7, 1000));
    kernels.push_back(softmax(t, 13, 40));
    kernels.push_back(bias_grad(t, 1000, 96));
    kernels.push_back(ln_param_grads(t, 1500, 64));
  }
  kernels.push_back(column_softmax(300, 70));
  kernels.push_back(bias_tanh(33, 37, true));
  kernels.push_back(row_mean(9, 300));
  auto& shapes = cuda_emu::shapes();
  for (const auto& k : kernels) {
    SCOPED_TRACE(k.name + " " + cuda::to_string(cuda::render(k).plan));
    shapes.clear();
    const auto built_in = cuda_emu::build(k);
    shapes.read_everything_for_testing(true);
    const auto at_launch = cuda_emu::build(k);
    shapes.read_everything_for_testing(false);
    ASSERT_EQ(built_in->numbers.at(1), 0);
    ASSERT_NE(at_launch->numbers.at(1), 0) << "its code does not read its numbers at launch";
    for (int64_t pad : {64, 65}) {
      SCOPED_TRACE("pad " + std::to_string(pad));
      const KernelBuffers a = make_buffers(k, pad);
      const KernelBuffers b = clone(a);
      std::vector<void*> args_a = tcap::test::args_of(a.views), args_b = tcap::test::args_of(b.views);
      built_in->run(args_a.data(), 0, built_in->range);
      at_launch->run(args_b.data(), 0, at_launch->range);
      for (size_t i = 0; i < a.whole.size(); ++i) {
        EXPECT_TRUE(at::equal(a.whole[i].view(at::kByte), b.whole[i].view(at::kByte))) << "buffer " << i;
      }
    }
  }
  shapes.clear();
}

// A kernel whose sizes lead to another plan (a longer row: another block size) has another
// structure: its code never runs under a decision taken for other sizes.
TEST(CudaEmulated, SizesThatChangeThePlanGetCodeOfTheirOwn) {
  SKIP_WITHOUT_EMULATOR();
  std::string why;
  if (!tcap::codegen::cpu_llvm::cpu_llvm_available(&why)) GTEST_SKIP() << why;
  cuda_emu::shapes().clear();
  std::set<std::string> code;
  for (int64_t n : {40, 1000, 56, 3000}) {  // blocks of 32, 256, 32 and 512 threads
    SCOPED_TRACE("row length " + std::to_string(n));
    const tcap::kir::Kernel k = softmax(DType::F32, 13, n);
    emulated_matches_cpu(k, 64);
    const auto built = cuda_emu::build(k);
    code.insert(built->name);
    EXPECT_EQ(built->numbers.at(1) != 0, n == 56) << "only 56 shares 40's plan";
  }
  EXPECT_EQ(code.size(), 4u);
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
      k->run(args, 0, 1);
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
      guarded(name, body)->run(io, 0, 1);
      ADD_FAILURE() << "no error";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  guarded("read_past_the_end", "b1[i] = b0[i + 32];")->run(io, 0, 1);
  EXPECT_TRUE(at::equal(dst.slice(0, 0, 32), src_in.slice(0, 32)));
  EXPECT_TRUE(dst.slice(0, 32).isnan().all().item<bool>()) << "a read past the end did not read poison";
  guarded("in_bounds", "b1[i] = b0[i] * 2.0f;")->run(io, 0, 1);
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
  k->run(args, 0, 1);
  EXPECT_TRUE(at::equal(out.slice(0, 0, 3 * 64), torch::full({3 * 64}, 2016.0f + 3)));
  EXPECT_TRUE(at::equal(out.slice(0, 3 * 64), torch::zeros({2 * 64}))) << "more blocks ran than the grid has";
}

}  // namespace
