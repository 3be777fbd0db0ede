#include "codegen/cpu_llvm/jit.h"

#include "codegen/cpu_llvm/llvm_compat.h"
#include "codegen/cpu_llvm/render.h"
#include "support/logging.h"

#include <c10/util/Exception.h>

#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <sstream>

namespace tcap::codegen::cpu_llvm {

namespace {

std::atomic<int> g_vector_bits_override{0};

std::string error_text(llvm::Error e) { return llvm::toString(std::move(e)); }

bool has_feature(const std::vector<std::string>& fs, const std::string& name) {
  return std::find(fs.begin(), fs.end(), "+" + name) != fs.end();
}

}  // namespace

void set_vector_bits_override(int bits) { g_vector_bits_override = bits; }

struct CpuJit::Impl {
  TargetInfo host;
  std::optional<llvm::orc::JITTargetMachineBuilder> jtmb;  // makes each thread's TargetMachine
  std::unique_ptr<llvm::orc::LLJIT> jit;
  std::mutex load_mu;  // load(): JITDylib names and linking
  int64_t next_dylib = 0;
};

namespace {

// The calling thread's TargetMachine: compile() runs on several threads at once (Note
// [Parallel kernel compilation]) and a TargetMachine is not shared between threads that
// compile. The process has one CpuJit, so one per thread suffices.
llvm::TargetMachine& thread_target_machine(const llvm::orc::JITTargetMachineBuilder& jtmb) {
  thread_local std::unique_ptr<llvm::TargetMachine> tm;
  if (!tm) {
    llvm::orc::JITTargetMachineBuilder builder = jtmb;  // createTargetMachine is not const
    auto made = builder.createTargetMachine();
    TORCH_CHECK(static_cast<bool>(made), "tcap cpu_llvm: cannot create a target machine: ", error_text(made.takeError()));
    tm = std::move(*made);
  }
  return *tm;
}

}  // namespace

CpuJit::CpuJit(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CpuJit* CpuJit::get(std::string* why) {
  static std::string failure;
  static CpuJit* instance = [] () -> CpuJit* {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::InitializeNativeTargetAsmParser();
    auto jtmb = llvm::orc::JITTargetMachineBuilder::detectHost();
    if (!jtmb) {
      failure = "LLVM cannot target this host: " + error_text(jtmb.takeError());
      return nullptr;
    }
    // PIC + small code model: what JITLink (LLJIT's default linker on x86-64 ELF) expects.
    jtmb->setCodeGenOptLevel(llvm_compat::kCodeGenO3);
    jtmb->setRelocationModel(llvm::Reloc::PIC_);
    jtmb->setCodeModel(llvm::CodeModel::Small);
    auto impl = std::make_unique<Impl>();
    std::vector<std::string> features = jtmb->getFeatures().getFeatures();
    std::sort(features.begin(), features.end());
    TargetInfo& t = impl->host;
    t.triple = jtmb->getTargetTriple().str();
    t.cpu = jtmb->getCPU();
    for (size_t i = 0; i < features.size(); ++i) t.features += (i ? "," : "") + features[i];
    t.x86 = jtmb->getTargetTriple().getArch() == llvm::Triple::x86_64;
    t.has_avx2 = t.x86 && has_feature(features, "avx2");
    t.has_avx512f = t.x86 && has_feature(features, "avx512f");
    t.has_fma = t.x86 ? has_feature(features, "fma") : jtmb->getTargetTriple().getArch() == llvm::Triple::aarch64;
    t.vector_bits = t.has_avx512f ? 512 : t.has_avx2 ? 256 : 128;
    jtmb->setFeatures(t.features);
    if (auto tm = jtmb->createTargetMachine(); !tm) {
      failure = "LLVM cannot create a target machine for " + t.triple + " " + t.cpu + ": " + error_text(tm.takeError());
      return nullptr;
    }
    impl->jtmb = *jtmb;
    auto jit = llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(*jtmb).create();
    if (!jit) {
      failure = "LLVM ORC LLJIT could not be created: " + error_text(jit.takeError());
      return nullptr;
    }
    impl->jit = std::move(*jit);
    // libm and the rest of the process come through the ProcessSymbols JITDylib that
    // every JITDylib links against; add libmvec there too. See Note [CPU math library].
    llvm::orc::JITDylibSP process = impl->jit->getProcessSymbolsJITDylib();
    if (!process) {
      failure = "LLVM ORC LLJIT has no process-symbols JITDylib";
      return nullptr;
    }
    const char prefix = impl->jit->getDataLayout().getGlobalPrefix();
    if (t.x86 && t.triple.find("linux") != std::string::npos) {
      auto gen = llvm::orc::DynamicLibrarySearchGenerator::Load("libmvec.so.1", prefix);
      if (gen) {
        process->addGenerator(std::move(*gen));
        t.libmvec = true;
      } else {
        TCAP_LOG(Perf, "cpu_llvm: libmvec.so.1 not loadable (" << error_text(gen.takeError())
                                                               << "); vector math calls scalar libm per lane");
      }
    }
    return new CpuJit(std::move(impl));  // lives for the process: kernels point into it
  }();
  if (!instance && why) *why = failure;
  return instance;
}

TargetInfo CpuJit::target() const {
  TargetInfo t = impl_->host;
  if (const int bits = g_vector_bits_override.load()) t.vector_bits = bits;
  return t;
}

bool CpuJit::target_runnable() const { return target().vector_bits <= impl_->host.vector_bits; }

std::string CpuJit::target_key() const {
  const TargetInfo t = target();
  std::ostringstream os;
  os << "llvm " << llvm_compat::version_string() << "\ntriple " << t.triple << "\ncpu " << t.cpu << "\nfeatures "
     << t.features << "\nvector_bits " << t.vector_bits << " libmvec " << t.libmvec;
  return os.str();
}

namespace {

// The new pass manager's O3 pipeline for the host. Loop and SLP vectorisation are off:
// the renderer vectorises explicitly (Note [CPU loop nests]) and the vectorisers would
// only add compile time and versioned copies of the scalar tails.
void optimise(llvm::Module& m, llvm::TargetMachine& tm) {
  llvm::PipelineTuningOptions pto;
  pto.LoopVectorization = false;
  pto.SLPVectorization = false;
  pto.LoopInterleaving = false;
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PassBuilder pb(&tm, pto);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
  mpm.run(m, mam);
}

}  // namespace

CompiledKernel CpuJit::compile(const kir::Kernel& k, const KernelPlan& plan, const std::string& symbol,
                               bool want_object) {
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  const auto t0 = clock::now();
  llvm::TargetMachine& tm = thread_target_machine(*impl_->jtmb);
  llvm::LLVMContext ctx;  // one per compile: contexts are not shared between threads
  llvm::Module m(symbol, ctx);
  m.setDataLayout(tm.createDataLayout());
  llvm_compat::set_target_triple(m, tm.getTargetTriple());
  render_kernel(k, plan, target(), m, symbol);
  const auto t1 = clock::now();
  optimise(m, tm);
  const auto t2 = clock::now();
  CompiledKernel out;
  {
    llvm::raw_string_ostream os(out.ir);
    m.print(os, nullptr);
  }
  const auto t3 = clock::now();
  if (want_object) {
    llvm::SmallVector<char, 0> buf;
    llvm::raw_svector_ostream os(buf);
    llvm::legacy::PassManager pm;
    TORCH_INTERNAL_ASSERT(!tm.addPassesToEmitFile(pm, os, nullptr, llvm_compat::kObjectFile),
                          "cpu_llvm: the host target machine cannot emit object files");
    pm.run(m);
    out.object.assign(buf.begin(), buf.end());
  }
  const auto t4 = clock::now();
  TCAP_LOG(Perf, "cpu_llvm: " << k.name << ": render " << ms(t0, t1) << " ms, O3 " << ms(t1, t2) << " ms, print "
                              << ms(t2, t3) << " ms, codegen " << ms(t3, t4) << " ms, " << out.object.size()
                              << " bytes of object");
  return out;
}

CpuKernel::Fn CpuJit::load(const std::string& symbol, const std::string& object) {
  std::lock_guard<std::mutex> lock(impl_->load_mu);
  llvm::orc::LLJIT& jit = *impl_->jit;
  // A fresh JITDylib per object: the same kernel may be loaded again after
  // cpu_llvm_clear_memory_cache_for_testing(), and symbols must be unique per dylib.
  auto jd = jit.createJITDylib(symbol + "." + std::to_string(impl_->next_dylib++));
  TORCH_CHECK(static_cast<bool>(jd), "tcap cpu_llvm: cannot create a JITDylib: ", error_text(jd.takeError()));
  auto buffer = llvm::MemoryBuffer::getMemBufferCopy(object, symbol);
  if (llvm::Error e = jit.addObjectFile(*jd, std::move(buffer))) {
    TORCH_CHECK(false, "tcap cpu_llvm: cannot add the object of ", symbol, " to the JIT: ", error_text(std::move(e)));
  }
  auto addr = jit.lookup(*jd, symbol);
  TORCH_CHECK(static_cast<bool>(addr), "tcap cpu_llvm: cannot link ", symbol, ": ", error_text(addr.takeError()));
  return addr->toPtr<CpuKernel::Fn>();
}

}  // namespace tcap::codegen::cpu_llvm
