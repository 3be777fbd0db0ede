// Note [Kernel parameters] (kir/kir.h): a kernel argument that is one f64 number taken at
// launch. Hand-built kernels of each strategy (pointwise with its vector path, a row
// reduction, a column reduction) read two parameters; each runs through cpu_llvm, through
// the CUDA renderer in the host emulator (Note [CUDA host emulation]) and through NVRTC to
// PTX, against ATen with the same numbers, for several values of the parameters with one
// compiled kernel. And kir::verify refuses a parameter read like a buffer.
#include "codegen/cuda/cuda.h"
#include "codegen/cuda/driver.h"
#include "kernel_builder.h"
#include "support/cuda_emu.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace {

using tcap::kir::DType;
using tcap::kir::OpCode;
using tcap::test::KernelBuilder;
namespace cuda = tcap::codegen::cuda;
namespace cuda_emu = tcap::testing::cuda_emu;

int32_t param_buffer(KernelBuilder& kb) {
  kb.k.buffers.push_back(tcap::kir::Buffer{"%p" + std::to_string(kb.k.buffers.size()), DType::F64, false, true});
  return static_cast<int32_t>(kb.k.buffers.size() - 1);
}

// A parameter read as eager reads a Scalar: the number, cast to the dtype computed in.
int32_t param_as(KernelBuilder& kb, int32_t buf, DType t) {
  return kb.cast(kb.load(buf, std::vector<int64_t>(kb.k.sizes.size(), 0)), t);
}

// One case: a kernel over x (f32) with parameters a and b, and what ATen computes.
struct ParamCase {
  tcap::kir::Kernel k;
  std::vector<int64_t> x_sizes;
  std::vector<int64_t> out_sizes;
  std::function<at::Tensor(const at::Tensor&, double, double)> eager;
};

// out[i] = x[i] * a + b over 1003 elements (the vector path and its tail).
ParamCase pointwise_case() {
  KernelBuilder kb("params_pointwise", {1003});
  const int32_t x = kb.input(DType::F32), a = param_buffer(kb), b = param_buffer(kb), out = kb.output(DType::F32);
  const int32_t y = kb.bin(OpCode::Add, kb.bin(OpCode::Mul, kb.load(x, {1}), param_as(kb, a, DType::F32)),
                           param_as(kb, b, DType::F32));
  kb.store(y, out, {1});
  return {kb.k, {1003}, {1003}, [](const at::Tensor& xs, double av, double bv) { return xs * av + bv; }};
}

// out = sum(x * a) + b over 37 rows of 300 (a row reduction) or 37 columns of 300 (a
// column reduction); the parameters read per element and once per output.
ParamCase reduction_case(bool columns) {
  KernelBuilder kb(columns ? "params_column" : "params_row", {37, 300}, 1);
  const int32_t x = kb.input(DType::F32), a = param_buffer(kb), b = param_buffer(kb), out = kb.output(DType::F32);
  const std::vector<int64_t> strides = columns ? std::vector<int64_t>{1, 37} : std::vector<int64_t>{300, 1};
  const int32_t s = kb.reduce(OpCode::ReduceSum, kb.bin(OpCode::Mul, kb.load(x, strides), param_as(kb, a, DType::F32)));
  kb.store(kb.bin(OpCode::Add, s, param_as(kb, b, DType::F32)), out, {1, 0});
  const int64_t dim = columns ? 0 : 1;
  return {kb.k, columns ? std::vector<int64_t>{300, 37} : std::vector<int64_t>{37, 300}, {37},
          [dim](const at::Tensor& xs, double av, double bv) { return (xs * av).sum(dim) + bv; }};
}

std::vector<ParamCase> param_cases() { return {pointwise_case(), reduction_case(false), reduction_case(true)}; }

const std::vector<std::pair<double, double>> kParamValues = {{0.5, -1.25}, {-3e-3, 7.0}, {1.0 / 3.0, 0.1}};

// Runs `run(args, 0, range)` for each parameter value, the same compiled kernel every time.
void check_values(const ParamCase& c, const tcap::codegen::cpu_llvm::CpuKernel& ck) {
  for (const auto& [av, bv] : kParamValues) {
    SCOPED_TRACE(c.k.name + " a=" + std::to_string(av) + " b=" + std::to_string(bv));
    const at::Tensor x = at::randn(c.x_sizes);
    const at::Tensor a = at::scalar_tensor(av, at::kDouble), b = at::scalar_tensor(bv, at::kDouble);
    const at::Tensor out = at::full(c.out_sizes, std::nan(""), at::kFloat);
    tcap::test::run(ck, {x, a, b, out});
    EXPECT_TRUE(tcap::test::close(out, c.eager(x, av, bv), 1e-4, 1e-4, c.k));
  }
}

TEST(KernelParams, PrintedAndVerified) {
  const ParamCase c = pointwise_case();
  tcap::kir::verify(c.k);
  const std::string text = tcap::kir::to_string(c.k);
  EXPECT_NE(text.find("buf1 param f64"), std::string::npos) << text;
  // A parameter is read at element 0, never along a dim.
  tcap::kir::Kernel bad = c.k;
  for (auto& in : bad.instrs) {
    if (in.op == OpCode::Load && bad.buffers[static_cast<size_t>(in.buffer)].param) in.strides = {1};
  }
  EXPECT_THROW(tcap::kir::verify(bad), c10::Error);
  tcap::kir::Kernel not_f64 = c.k;
  not_f64.buffers[1].dtype = DType::F32;
  EXPECT_THROW(tcap::kir::verify(not_f64), c10::Error);
  // The structural hash tells a parameter from a buffer.
  tcap::kir::Kernel as_buffer = c.k;
  as_buffer.buffers[1].param = false;
  EXPECT_NE(tcap::kir::structural_hash(as_buffer), tcap::kir::structural_hash(c.k));
}

#if TCAP_HAVE_LLVM
TEST(KernelParams, CpuLlvmReadsThemAtEachLaunch) {
  for (const ParamCase& c : param_cases()) check_values(c, *tcap::codegen::cpu_llvm::compile_cpu_kernel(c.k));
}
#endif

TEST(KernelParams, TheCudaRendererTakesThemByValue) {
  for (const ParamCase& c : param_cases()) {
    const cuda::CudaSource src = cuda::render(c.k);
    SCOPED_TRACE(c.k.name + " " + cuda::to_string(src.plan));
    EXPECT_NE(src.source.find("const double b1_param"), std::string::npos) << src.source;
    EXPECT_NE(src.source.find("const double b1[1] = {b1_param};"), std::string::npos) << src.source;
    std::string why;
    if (cuda_emu::available(&why)) {
      const int64_t before = cuda_emu::stats().launches;
      check_values(c, *cuda_emu::build(c.k));
      EXPECT_EQ(cuda_emu::stats().launches - before, static_cast<int64_t>(kParamValues.size()));
    }
    if (cuda::nvrtc_available(&why)) {
      const std::string ptx = cuda::compile_to_ptx(c.k, 80);
      EXPECT_NE(ptx.find(".param .f64"), std::string::npos) << ptx.substr(0, 2000);
    }
  }
}

}  // namespace
