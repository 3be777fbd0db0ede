// cpu_llvm: the memory and disk kernel caches (Note [Kernel cache files]): round
// trips, corrupt files detected and rebuilt, and compile / warm-start times.
#include "kernel_builder.h"
#include "support/logging.h"

#include <tcap/compile.h>

#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>

#include <time.h>

#include <unistd.h>

namespace tcap::test {
namespace {

#if TCAP_HAVE_LLVM

// Points TCAP_CACHE_DIR at a fresh folder for one test, then back.
class ScopedCacheDir {
 public:
  ScopedCacheDir() {
    const char* old = std::getenv("TCAP_CACHE_DIR");
    old_ = old ? old : "";
    dir_ = make_temp_dir("tcap-cache-test");
    EXPECT_FALSE(dir_.empty());
    ::setenv("TCAP_CACHE_DIR", dir_.c_str(), 1);
    reload_config_for_testing();
  }
  ~ScopedCacheDir() {
    if (old_.empty()) {
      ::unsetenv("TCAP_CACHE_DIR");
    } else {
      ::setenv("TCAP_CACHE_DIR", old_.c_str(), 1);
    }
    reload_config_for_testing();
    remove_tree(dir_);
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string old_, dir_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_file(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(data.data(), static_cast<std::streamsize>(data.size()));
}

// y = exp(x * c) + c with a random c, so no other test (or run) has this kernel cached.
KernelBuilder unique_kernel(const std::string& name, int64_t n, double c) {
  KernelBuilder kb(name, {n});
  int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
  int32_t cc = kb.fconst(DType::F32, c);
  kb.store(kb.bin(OpCode::Add, kb.un(OpCode::Exp, kb.bin(OpCode::Mul, kb.load(bx, {1}), cc)), cc), bo, {1});
  return kb;
}

void expect_correct(const codegen::cpu_llvm::CpuKernel& ck, const KernelBuilder& kb, double c) {
  const int64_t n = kb.k.sizes[0];
  at::Tensor x = at::randn({n}), out = at::empty({n});
  run(ck, {x, out});
  const float cf = static_cast<float>(c);
  EXPECT_TRUE(close(out, (x * cf).exp() + cf, 1e-5, 1e-6, kb.k));
}

TEST(CpuLlvmCache, DiskRoundTripAndCorruptFiles) {
  ScopedCacheDir cache;
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  const double ca = 0.5 + static_cast<double>(seed % 100000) * 1e-7;
  const double cb = ca + 0.25;
  KernelBuilder ka = unique_kernel("cache_a", 1031, ca);
  KernelBuilder kbb = unique_kernel("cache_b", 1031, cb);

  const codegen::cpu_llvm::CpuLlvmStats s0 = codegen::cpu_llvm::cpu_llvm_stats();
  auto a1 = compile(ka);
  EXPECT_FALSE(a1->from_disk);
  EXPECT_EQ(codegen::cpu_llvm::cpu_llvm_stats().compiled, s0.compiled + 1);
  const std::string path = cache.dir() + "/kernels/" + a1->key_hash + ".bin";
  ASSERT_TRUE(file_exists(path)) << path;
  const std::string good = read_file(path);
  EXPECT_EQ(good.compare(0, 7, "TCAPKRN"), 0);
  EXPECT_NE(good.find("sizes=[1031]"), std::string::npos);           // the key text
  EXPECT_NE(good.find("define void @" + a1->name), std::string::npos);  // the optimised IR
  expect_correct(*a1, ka, ca);

  // Same kernel again: memory hit, same object. Other kernel and buffer names: same machine code.
  EXPECT_EQ(compile(ka).get(), a1.get());
  KernelBuilder renamed = ka;
  renamed.k.name = "cache_a_renamed";
  for (kir::Buffer& b : renamed.k.buffers) b.name += "_other";
  EXPECT_EQ(compile(renamed).get(), a1.get());
  EXPECT_EQ(codegen::cpu_llvm::cpu_llvm_stats().memory_hits, s0.memory_hits + 2);

  // A fresh process (memory cache cleared) loads the object from disk.
  codegen::cpu_llvm::cpu_llvm_clear_memory_cache_for_testing();
  auto a2 = compile(ka);
  EXPECT_TRUE(a2->from_disk);
  EXPECT_EQ(a2->name, a1->name);
  EXPECT_EQ(codegen::cpu_llvm::cpu_llvm_stats().disk_hits, s0.disk_hits + 1);
  expect_correct(*a2, ka, ca);

  auto b1 = compile(kbb);
  const std::string path_b = cache.dir() + "/kernels/" + b1->key_hash + ".bin";
  ASSERT_TRUE(file_exists(path_b));

  struct Corruption {
    const char* what;
    std::string data;
  };
  std::string flipped_obj = good, flipped_key = good, bad_magic = good;
  flipped_obj[good.size() / 2] = static_cast<char>(flipped_obj[good.size() / 2] ^ 0x5a);
  flipped_key[70] = static_cast<char>(flipped_key[70] ^ 0x01);
  bad_magic[0] = 'X';
  const std::vector<Corruption> corruptions = {
      {"truncated", good.substr(0, good.size() / 3)},
      {"truncated header", good.substr(0, 20)},
      {"empty", ""},
      {"flipped object byte", flipped_obj},
      {"flipped key byte", flipped_key},
      {"bad magic", bad_magic},
      {"extended", good + "junk"},
      {"file of another kernel", read_file(path_b)},
  };
  for (const Corruption& c : corruptions) {
    SCOPED_TRACE(c.what);
    codegen::cpu_llvm::cpu_llvm_clear_memory_cache_for_testing();
    write_file(path, c.data);
    const int corrupt_before = codegen::cpu_llvm::cpu_llvm_stats().corrupt_cache_files;
    auto a = compile(ka);
    EXPECT_FALSE(a->from_disk);
    EXPECT_EQ(codegen::cpu_llvm::cpu_llvm_stats().corrupt_cache_files, corrupt_before + 1);
    expect_correct(*a, ka, ca);
    // Rebuilt: the file is valid again.
    codegen::cpu_llvm::cpu_llvm_clear_memory_cache_for_testing();
    EXPECT_TRUE(compile(ka)->from_disk);
  }
  // A missing file is a plain miss, not corruption.
  codegen::cpu_llvm::cpu_llvm_clear_memory_cache_for_testing();
  ::unlink(path.c_str());
  const int corrupt_before = codegen::cpu_llvm::cpu_llvm_stats().corrupt_cache_files;
  EXPECT_FALSE(compile(ka)->from_disk);
  EXPECT_EQ(codegen::cpu_llvm::cpu_llvm_stats().corrupt_cache_files, corrupt_before);
  // No temporary files are left behind.
  for (const std::string& name : list_dir(cache.dir() + "/kernels")) {
    EXPECT_EQ(name.size() > 4 ? name.substr(name.size() - 4) : name, ".bin") << name;
  }
}

// Cold compiles of typical kernels, then a warm start (memory cache cleared) of all of
// them from disk. The numbers are printed; the asserted bounds are loose because the
// test machines are shared.
TEST(CpuLlvmCache, CompileAndWarmStartTimes) {
  ScopedCacheDir cache;
  // As a fresh process: kernels of these structures that earlier tests compiled at other
  // sizes would be served by code that reads its sizes at launch (Note [Sizes at launch]).
  codegen::cpu_llvm::cpu_llvm_clear_memory_cache_for_testing();
  const auto seed = fresh_seed();
  const double c = 1.0 + static_cast<double>(seed % 100000) * 1e-7;
  std::vector<KernelBuilder> kernels;
  kernels.push_back(unique_kernel("t_exp", 1 << 20, c));
  {
    KernelBuilder kb("t_softmax", {512, 1000}, 1);
    int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
    int32_t lx = kb.bin(OpCode::Mul, kb.load(bx, {1000, 1}), kb.fconst(DType::F32, c));
    int32_t mx = kb.reduce(OpCode::ReduceMax, lx);
    int32_t e = kb.un(OpCode::Exp, kb.bin(OpCode::Sub, lx, mx));
    kb.store(kb.bin(OpCode::Div, e, kb.reduce(OpCode::ReduceSum, e)), bo, {1000, 1});
    kernels.push_back(kb);
  }
  {
    KernelBuilder kb("t_gelu_bf16", {256, 4096});
    int32_t bx = kb.input(DType::BF16), bo = kb.output(DType::BF16);
    int32_t x = kb.cast(kb.load(bx, {4096, 1}), DType::F32);
    int32_t h = kb.bin(OpCode::Mul, x, kb.fconst(DType::F32, 0.5 * c));
    int32_t er = kb.un(OpCode::Erf, kb.bin(OpCode::Mul, x, kb.fconst(DType::F32, 0.7071067811865476)));
    kb.store(kb.cast(kb.bin(OpCode::Mul, h, kb.bin(OpCode::Add, er, kb.fconst(DType::F32, 1))), DType::BF16), bo,
             {4096, 1});
    kernels.push_back(kb);
  }
  {
    KernelBuilder kb("t_colsum", {4096, 256}, 1);  // sum over dim 0 of a [256, 4096] matrix
    int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
    kb.store(kb.reduce(OpCode::ReduceSum, kb.bin(OpCode::Mul, kb.load(bx, {1, 4096}), kb.fconst(DType::F32, c))),
             bo, {1, 0});
    kernels.push_back(kb);
  }
  {
    KernelBuilder kb("t_layernorm", {512, 768}, 1);
    int32_t bx = kb.input(DType::F32), bw = kb.input(DType::F32), bo = kb.output(DType::F32);
    int32_t x = kb.load(bx, {768, 1});
    int32_t nn = kb.fconst(DType::F32, 768);
    int32_t mean = kb.bin(OpCode::Div, kb.reduce(OpCode::ReduceSum, x), nn);
    int32_t d = kb.bin(OpCode::Sub, x, mean);
    int32_t var = kb.bin(OpCode::Div, kb.reduce(OpCode::ReduceSum, kb.bin(OpCode::Mul, d, d)), nn);
    int32_t rs = kb.un(OpCode::Rsqrt, kb.bin(OpCode::Add, var, kb.fconst(DType::F32, 1e-5 * c)));
    kb.store(kb.bin(OpCode::Mul, kb.bin(OpCode::Mul, d, rs), kb.load(bw, {0, 1})), bo, {768, 1});
    kernels.push_back(kb);
  }
  codegen::cpu_llvm::compile_cpu_kernel(kernels[0].k);  // JIT creation is not part of a kernel's time
  auto thread_cpu_ms = [] {
    timespec t{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
  };
  double worst_cold = 0;
  for (size_t i = 1; i < kernels.size(); ++i) {
    const double cpu0 = thread_cpu_ms();
    auto ck = compile(kernels[i]);
    const double cpu = thread_cpu_ms() - cpu0;
    EXPECT_FALSE(ck->from_disk);
    std::cout << "[ compile  ] " << kernels[i].k.name << ": " << ck->compile_ms << " ms cold (" << cpu
              << " ms of CPU)\n";
    worst_cold = std::max(worst_cold, ck->compile_ms);
  }
  EXPECT_LT(worst_cold, 500.0);
  codegen::cpu_llvm::cpu_llvm_clear_memory_cache_for_testing();
  const auto t0 = std::chrono::steady_clock::now();
  for (const KernelBuilder& kb : kernels) EXPECT_TRUE(compile(kb)->from_disk);
  const double warm = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "[ compile  ] warm start of " << kernels.size() << " kernels from disk: " << warm << " ms\n";
  EXPECT_LT(warm, 100.0);
}

#endif  // TCAP_HAVE_LLVM

// Note [Parallel kernel compilation], end to end: a graph's kernels compiled by the llvm
// backend on several threads from a cold cache compute what eager computes.
TEST(CpuLlvmCache, KernelsCompiledInParallelMatchEager) {
  std::string why;
  if (!tcap::codegen::cpu_llvm::cpu_llvm_available(&why)) GTEST_SKIP() << why;
  tcap::codegen::cpu_llvm::cpu_llvm_clear_memory_cache_for_testing();
  const auto before = tcap::codegen::cpu_llvm::cpu_llvm_stats();
  // Constants new to this process and to the disk cache, and six pointwise ops: six kernels
  // of different structures that must compile (Note [Sizes at launch]: kernels of one
  // structure would share code after the second).
  const double salt = std::uniform_real_distribution<double>(0.0, 1.0)(*std::make_unique<std::random_device>());
  auto fn = [salt](const std::vector<at::Tensor>& in) {
    const std::vector<at::Tensor (*)(const at::Tensor&)> ops = {torch::tanh, torch::sigmoid, torch::sin,
                                                               torch::cos,  torch::erf,     torch::exp};
    at::Tensor x = in[0];
    for (int i = 0; i < 6; ++i) x = torch::mm(ops[static_cast<size_t>(i)](x * (1.0 + i + salt)) + 0.5, in[1]).softmax(-1);
    return std::vector<at::Tensor>{x};
  };
  tcap::CompileOptions options;
  options.backend = "llvm";
  auto f = tcap::compile(fn, options);
  for (int call = 0; call < 3; ++call) {
    const std::vector<at::Tensor> in{torch::randn({7, 9}), torch::randn({9, 9})};
    EXPECT_TRUE(at::allclose((*f)(in)[0], fn(in)[0], 1e-4, 1e-5));
  }
  EXPECT_EQ(f->eager_reason(), "");
  const auto after = tcap::codegen::cpu_llvm::cpu_llvm_stats();
  EXPECT_GE(after.compiled - before.compiled, 6);
}

}  // namespace
}  // namespace tcap::test
