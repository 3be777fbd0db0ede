// Note [Settings of at::Context] (csrc/cache/context_settings.h): every setting of
// at::globalContext() is part of the global state a compiled entry is guarded on. The list
// is compared with the pinned LibTorch's ATen/Context.h, so that a LibTorch with a new
// switch fails here instead of being replayed under the old setting; and settings changed
// between calls recapture, name the setting in the log, and give eager's answer.
#include <tcap/compile.h>

#include "cache/context_settings.h"
#include "support/compare.h"
#include "support/log_capture.h"

#include <ATen/Context.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

using Tensors = std::vector<at::Tensor>;

std::set<std::string> setters_read() {
  std::set<std::string> out;
  for (const auto& s : tcap::cache::context_settings()) {
    std::istringstream words(s.setters);
    for (std::string w; words >> w;) out.insert(w);
  }
  return out;
}

size_t index_of(const std::string& name) {
  const auto& all = tcap::cache::context_settings();
  for (size_t k = 0; k < all.size(); ++k) {
    if (all[k].name == name) return k;
  }
  ADD_FAILURE() << "no setting named " << name;
  return 0;
}

#ifdef TCAP_TORCH_NN_DIR
// The setters declared in class at::Context.
std::set<std::string> setters_in_header() {
  // TCAP_TORCH_NN_DIR is .../include/torch/csrc/api/include/torch/nn: ATen/ is under an
  // ancestor of it.
  std::filesystem::path path;
  for (auto dir = std::filesystem::path(TCAP_TORCH_NN_DIR); !dir.empty() && dir != dir.parent_path();
       dir = dir.parent_path()) {
    if (std::filesystem::exists(dir / "ATen" / "Context.h")) {
      path = dir / "ATen" / "Context.h";
      break;
    }
  }
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  const std::string text = s.str();
  const size_t begin = text.find("class TORCH_API Context");
  const size_t end = text.find("\n};", begin);
  if (begin == std::string::npos || end == std::string::npos) return {};
  std::string body = text.substr(begin, end - begin);
  body = std::regex_replace(body, std::regex(R"(//[^\n]*)"), "");  // comments name setters too
  std::set<std::string> out;
  const std::regex setter(R"(\b((?:_|un)?set[A-Z]\w*)\s*\()");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), setter); it != std::sregex_iterator(); ++it) {
    out.insert((*it)[1]);
  }
  return out;
}

TEST(ContextSettings, EverySetterOfContextIsGuardedOrExplained) {
  const auto in_header = setters_in_header();
  ASSERT_GT(in_header.size(), 30u) << "ATen/Context.h was not found or not parsed";
  const auto read = setters_read();
  std::set<std::string> explained;
  for (const auto& [setter, why] : tcap::cache::context_setters_not_guarded()) {
    explained.insert(setter);
    EXPECT_FALSE(why.empty()) << setter;
    EXPECT_TRUE(in_header.count(setter)) << setter << " is explained but is not in the pinned LibTorch's Context.h";
  }
  for (const auto& s : in_header) {
    EXPECT_TRUE(read.count(s) || explained.count(s))
        << "at::Context::" << s << " changes a setting that tcap's guards do not read: add it to kSettings in "
        << "csrc/cache/context_settings.cpp, or to context_setters_not_guarded() with why it cannot change a result";
  }
  for (const auto& s : read) {
    EXPECT_TRUE(in_header.count(s)) << s << " is read by the guards but is not in the pinned LibTorch's Context.h";
  }
}
#endif

TEST(ContextSettings, ReadingThemChangesNothingAndIsStable) {
  const auto a = tcap::cache::read_context();
  const auto b = tcap::cache::read_context();
  EXPECT_EQ(a, b);
  EXPECT_TRUE(tcap::cache::context_matches(a));
  EXPECT_EQ(tcap::cache::context_mismatch(a, b), "");
}

// Restores one setting when a test ends, however it ends.
struct Restore {
  std::function<void()> undo;
  ~Restore() { undo(); }
};

struct Toggle {
  const char* name;  // as the log names it
  std::function<void()> set;
  std::function<void()> reset;
};

// A matmul, a reduction and pointwise ops: each call compared with eager run under the
// same settings; a changed setting recaptures (and says which), the old setting restored
// is served by the first entry again.
TEST(ContextSettings, ChangedSettingsRecaptureAndMatchEager) {
  auto& ctx = at::globalContext();
  const std::vector<Toggle> toggles = {
      {"cuDNN benchmark", [&] { ctx.setBenchmarkCuDNN(!ctx.benchmarkCuDNN()); },
       [&] { ctx.setBenchmarkCuDNN(!ctx.benchmarkCuDNN()); }},
      {"deterministic fill of uninitialized memory",
       [&] { ctx.setDeterministicFillUninitializedMemory(!ctx.deterministicFillUninitializedMemory()); },
       [&] { ctx.setDeterministicFillUninitializedMemory(!ctx.deterministicFillUninitializedMemory()); }},
      {"fp16 reduction on the CPU", [&] { ctx.setAllowFP16ReductionCPU(!ctx.allowFP16ReductionCPU()); },
       [&] { ctx.setAllowFP16ReductionCPU(!ctx.allowFP16ReductionCPU()); }},
      {"float32 precision (oneDNN matmul)",
       [&] { ctx.setFloat32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL, at::Float32Precision::BF16); },
       [&] { ctx.setFloat32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL, at::Float32Precision::NONE); }},
      {"oneDNN enabled", [&] { ctx.setUserEnabledMkldnn(!ctx.userEnabledMkldnn()); },
       [&] { ctx.setUserEnabledMkldnn(!ctx.userEnabledMkldnn()); }},
      {"NNPACK enabled", [&] { ctx.setUserEnabledNNPACK(!ctx.userEnabledNNPACK()); },
       [&] { ctx.setUserEnabledNNPACK(!ctx.userEnabledNNPACK()); }},
      {"math attention", [&] { ctx.setSDPUseMath(!ctx.userEnabledMathSDP()); },
       [&] { ctx.setSDPUseMath(!ctx.userEnabledMathSDP()); }},
      {"quantized engine",
       [&] {
         for (at::QEngine e : ctx.supportedQEngines()) {
           if (e != ctx.qEngine()) return ctx.setQEngine(e);
         }
       },
       {}},
      {"sparse tensor invariant checks", [&] { ctx.setCheckSparseTensorInvariants(true); },
       [&] { ctx.setCheckSparseTensorInvariants(std::nullopt); }},
  };
  auto body = [](const Tensors& in) {
    auto h = torch::matmul(in[0], in[1]);
    return Tensors{(torch::tanh(h) * 2 + h.sum(1, true)).relu()};
  };
  for (const auto& backend : {std::string("eager"), std::string("llvm")}) {
    for (const auto& t : toggles) {
      SCOPED_TRACE(std::string(t.name) + " / " + backend);
      const auto before = tcap::cache::read_context();
      tcap::CompileOptions o;
      o.backend = backend;
      auto f = tcap::compile(body, o);
      torch::manual_seed(4);
      auto call = [&](int i) {
        auto a = torch::randn({7, 9}), b = torch::randn({9, 5});
        auto got = f({a, b});
        auto want = body({a, b});
        ASSERT_TRUE(tcap::testing::close(got[0], want[0], 1e-5, 1e-5)) << "call " << i;
      };
      for (int i = 0; i < 3; ++i) call(i);
      const int captures = f->stats().captures;
      tcap::testing::LogCapture log("recompiles");
      try {
        t.set();
      } catch (const c10::Error&) {
        continue;  // a setting this CPU or build refuses (fp16 reductions without fp16 support)
      }
      Restore restore{[&] {
        if (t.reset) t.reset();
        else if (tcap::cache::read_context() != before) {
          // The quantized engine: put back the one there was.
          ctx.setQEngine(static_cast<at::QEngine>(before[index_of("quantized engine")]));
        }
      }};
      if (tcap::cache::read_context() == before) {
        continue;  // a setting this build cannot change (a backend it was built without)
      }
      for (int i = 3; i < 6; ++i) call(i);
      EXPECT_GT(f->stats().captures, captures) << t.name << " was not a guard";
      EXPECT_NE(log.text().find(t.name), std::string::npos) << log.text();
    }
  }
}

}  // namespace
