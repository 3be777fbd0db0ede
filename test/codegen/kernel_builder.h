// Helpers of the codegen tests: build kir kernels by hand and run compiled CPU kernels on
// ATen tensors.
#pragma once

#include "codegen/cpu_llvm/cpu_llvm.h"
#include "kir/kir.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>

namespace tcap::test {

using kir::DType;
using kir::OpCode;

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

inline DType kir_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBool: return DType::Bool;
    case at::kByte: return DType::U8;
    case at::kChar: return DType::I8;
    case at::kShort: return DType::I16;
    case at::kInt: return DType::I32;
    case at::kLong: return DType::I64;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    case at::kFloat: return DType::F32;
    case at::kDouble: return DType::F64;
    default: break;
  }
  ADD_FAILURE() << "no kir dtype for " << t;
  return DType::F32;
}

// The strides of `t` in domain order: dims[i] is the tensor dim of domain dim i (-1: a
// domain dim the tensor does not have, stride 0).
inline std::vector<int64_t> strides_of(const at::Tensor& t, std::vector<int64_t> dims = {}) {
  if (dims.empty()) return std::vector<int64_t>(t.strides().begin(), t.strides().end());
  std::vector<int64_t> s;
  for (int64_t d : dims) s.push_back(d < 0 ? 0 : t.stride(d));
  return s;
}

struct KernelBuilder {
  kir::Kernel k;

  KernelBuilder(std::string name, std::vector<int64_t> sizes, int num_reduce_dims = 0) {
    k.name = std::move(name);
    k.sizes = std::move(sizes);
    k.num_reduce_dims = num_reduce_dims;
  }
  int32_t buffer(DType t, bool is_output) {
    k.buffers.push_back(kir::Buffer{"%" + std::to_string(k.buffers.size()), t, is_output});
    return static_cast<int32_t>(k.buffers.size() - 1);
  }
  int32_t input(DType t) { return buffer(t, false); }
  int32_t output(DType t) { return buffer(t, true); }
  DType dtype(int32_t v) const { return k.instrs[static_cast<size_t>(v)].dtype; }

  int32_t load(int32_t buf, std::vector<int64_t> strides, int64_t offset = 0) {
    kir::Instr in;
    in.op = OpCode::Load;
    in.dtype = k.buffers[static_cast<size_t>(buf)].dtype;
    in.buffer = buf;
    in.strides = std::move(strides);
    in.offset = offset;
    return kir::add(k, in);
  }
  int32_t fconst(DType t, double v) {
    kir::Instr in;
    in.dtype = t;
    in.f = v;
    return kir::add(k, in);
  }
  int32_t iconst(DType t, int64_t v) {
    kir::Instr in;
    in.dtype = t;
    in.i = v;
    return kir::add(k, in);
  }
  int32_t op(OpCode op, DType t, std::vector<int32_t> args) {
    kir::Instr in;
    in.op = op;
    in.dtype = t;
    in.args = std::move(args);
    return kir::add(k, in);
  }
  int32_t un(OpCode o, int32_t a) { return op(o, o == OpCode::IsNan ? DType::Bool : dtype(a), {a}); }
  int32_t bin(OpCode o, int32_t a, int32_t b) {
    return op(o, kir::is_comparison(o) ? DType::Bool : dtype(a), {a, b});
  }
  int32_t where(int32_t c, int32_t a, int32_t b) { return op(OpCode::Where, dtype(a), {c, a, b}); }
  int32_t cast(int32_t a, DType t) { return op(OpCode::Cast, t, {a}); }
  int32_t reduce(OpCode o, int32_t a) { return op(o, dtype(a), {a}); }
  void store(int32_t v, int32_t buf, std::vector<int64_t> strides, int64_t offset = 0) {
    k.stores.push_back(kir::Store{v, buf, std::move(strides), offset});
  }
};

inline std::vector<void*> args_of(const std::vector<at::Tensor>& bufs) {
  std::vector<void*> args;
  for (const at::Tensor& t : bufs) args.push_back(t.data_ptr());
  return args;
}

// Runs the whole range on this thread.
inline void run(const codegen::cpu_llvm::CpuKernel& ck, const std::vector<at::Tensor>& bufs) {
  std::vector<void*> args = args_of(bufs);
  ck.run(args.data(), 0, ck.range);
}

inline std::shared_ptr<const codegen::cpu_llvm::CpuKernel> compile(const KernelBuilder& kb) {
  return codegen::cpu_llvm::compile_cpu_kernel(kb.k);
}

// A fresh seed per test, printed on failure (SCOPED_TRACE in the caller).
inline uint64_t fresh_seed() {
  static std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

inline ::testing::AssertionResult close(const at::Tensor& out, const at::Tensor& ref, double rtol, double atol,
                                        const kir::Kernel& k) {
  if (out.sizes() == ref.sizes() && at::allclose(out.to(at::kDouble), ref.to(at::kDouble), rtol, atol, /*equal_nan=*/true)) {
    return ::testing::AssertionSuccess();
  }
  at::Tensor diff = (out.to(at::kDouble) - ref.to(at::kDouble)).abs();
  return ::testing::AssertionFailure() << "kernel output differs from ATen (rtol " << rtol << ", atol " << atol
                                       << "); max abs diff " << diff.nan_to_num(0, 0, 0).max().item<double>()
                                       << "\nkernel:\n" << kir::to_string(k) << "\nout (first 8): "
                                       << out.flatten().slice(0, 0, 8) << "\nref (first 8): "
                                       << ref.flatten().slice(0, 0, 8);
}

inline ::testing::AssertionResult same(const at::Tensor& out, const at::Tensor& ref, const kir::Kernel& k) {
  if (out.sizes() == ref.sizes() && out.scalar_type() == ref.scalar_type() &&
      (out.is_floating_point() ? at::allclose(out.to(at::kDouble), ref.to(at::kDouble), 0, 0, true)
                               : at::equal(out, ref))) {
    return ::testing::AssertionSuccess();
  }
  auto f = ::testing::AssertionFailure() << "kernel output is not bit-identical to ATen";
  if (out.sizes() == ref.sizes()) {
    const at::Tensor o = out.to(at::kDouble).flatten(), r = ref.to(at::kDouble).flatten();
    const at::Tensor bad = (o != r) & ~(o.isnan() & r.isnan());
    const at::Tensor idx = bad.nonzero();
    if (idx.numel() > 0) {
      const int64_t i = idx[0][0].item<int64_t>();
      char buf[160];
      std::snprintf(buf, sizeof buf, "; %lld of %lld elements differ, first at %lld: out %.17g, ref %.17g",
                    static_cast<long long>(idx.size(0)), static_cast<long long>(o.numel()), static_cast<long long>(i),
                    o[i].item<double>(), r[i].item<double>());
      f << buf;
    }
  }
  return f << "\nkernel:\n" << kir::to_string(k);
}

// Temporary folders through POSIX: LibTorch exports its own copies of the
// std::filesystem symbols, and its remove_all crashes when called from here.
inline std::string make_temp_dir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "-XXXXXX";
  return ::mkdtemp(tmpl.data()) ? tmpl : std::string();
}
inline void remove_tree(const std::string& dir) {
  if (dir.empty()) return;
  ::nftw(dir.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
         FTW_DEPTH | FTW_PHYS);
}
inline bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}
inline std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
  }
  return names;
}

}  // namespace tcap::test
