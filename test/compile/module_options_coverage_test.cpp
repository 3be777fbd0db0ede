// Note [Module state guards] (csrc/cache/module_state.h): the options of every LibTorch
// module type are guarded. The list of types and of the fields read where a struct is read
// by fields is compared with the headers of the LibTorch this build uses, so that a
// LibTorch with a module type or an option the guards do not cover fails here instead of
// replaying an old option silently. And the options the list once missed (Embedding's)
// recapture when they change.
#include <tcap/compile.h>

#include "cache/module_state.h"
#include "support/compare.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;
namespace fs = std::filesystem;

#ifdef TCAP_TORCH_NN_DIR
std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<fs::path> headers(const std::string& sub) {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(TCAP_TORCH_NN_DIR) / sub)) {
    if (e.path().extension() == ".h") out.push_back(e.path());
  }
  return out;
}

// Module types: `class TORCH_API XImpl` (or struct) that is no template, in modules/.
std::set<std::string> module_types_in_headers() {
  std::set<std::string> out;
  const std::regex impl(R"((?:class|struct)\s+TORCH_API\s+(\w+)Impl\b)");
  for (const auto& h : headers("modules")) {
    const std::string text = read_file(h);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), impl); it != std::sregex_iterator(); ++it) {
      const size_t at = static_cast<size_t>(it->position(0));
      const size_t line = text.rfind('\n', at == 0 ? 0 : at - 1);
      const size_t prev = line == std::string::npos || line == 0 ? 0 : text.rfind('\n', line - 1);
      const std::string before = text.substr(prev == std::string::npos ? 0 : prev, at - (prev == std::string::npos ? 0 : prev));
      if (before.find("template") != std::string::npos) continue;
      out.insert((*it)[1]);
    }
  }
  return out;
}

// Options structs (and aliases) in options/, by module type name, with the text of each.
std::map<std::string, std::string> options_in_headers() {
  std::map<std::string, std::string> out;
  std::string all;
  for (const auto& h : headers("options")) all += read_file(h);
  const std::regex decl(R"(struct\s+(?:TORCH_API\s+)?(\w+)Options\s*(?:\{|:)|using\s+(\w+)Options\s*=\s*(\w+)Options\b)");
  std::map<std::string, std::string> body;
  for (auto it = std::sregex_iterator(all.begin(), all.end(), decl); it != std::sregex_iterator(); ++it) {
    if ((*it)[1].matched) {
      const size_t at = static_cast<size_t>(it->position(0));
      body[(*it)[1]] = all.substr(at, all.find("\n};", at) - at);
    }
  }
  for (auto it = std::sregex_iterator(all.begin(), all.end(), decl); it != std::sregex_iterator(); ++it) {
    if ((*it)[1].matched) out[(*it)[1]] = body[(*it)[1]];
    else out[(*it)[2]] = body.count((*it)[3]) ? body[(*it)[3]] : "";
  }
  return out;
}

TEST(ModuleOptionsCoverage, EveryModuleTypeWithOptionsIsRead) {
  const auto types = module_types_in_headers();
  const auto options = options_in_headers();
  const auto read = tcap::cache::module_types_read();
  const std::set<std::string> covered(read.begin(), read.end());
  ASSERT_GT(types.size(), 80u) << "the module headers were not found or not parsed";
  int with_options = 0;
  for (const auto& t : types) {
    if (!options.count(t)) continue;
    ++with_options;
    EXPECT_TRUE(covered.count(t)) << "LibTorch's nn::" << t << "Impl has options (" << t
                                  << "Options) that tcap's module guards do not read: add it to TCAP_MODULE_TYPES "
                                     "in csrc/cache/module_state.cpp";
  }
  EXPECT_GT(with_options, 80);
}

TEST(ModuleOptionsCoverage, EveryFieldOfAStructReadByFieldsIsRead) {
  const auto options = options_in_headers();
  const std::regex arg(R"(TORCH_ARG\(\s*[^;]*?,\s*(\w+)\s*\))");
  int checked = 0;
  for (const auto& [type, fields] : tcap::cache::option_fields_read()) {
    if (fields.empty()) continue;  // read whole by a put() of its own
    auto it = options.find(type);
    ASSERT_NE(it, options.end()) << type << "Options is not in LibTorch's options headers";
    const std::set<std::string> read(fields.begin(), fields.end());
    const std::string& text = it->second;
    int n = 0;
    for (auto m = std::sregex_iterator(text.begin(), text.end(), arg); m != std::sregex_iterator(); ++m, ++n) {
      EXPECT_TRUE(read.count((*m)[1])) << type << "Options::" << (*m)[1]
                                       << " is not read by tcap's module guards (TCAP_OPTION_FIELDS in "
                                          "csrc/cache/module_state.cpp)";
    }
    EXPECT_GT(n, 0) << "no TORCH_ARG found in " << type << "Options";
    ++checked;
  }
  EXPECT_GE(checked, 15);
}
#endif

// Embedding's max_norm changes its forward (rows are renormalized): changed after the
// model was compiled, the call misses and gives eager's answer; so does padding_idx, which
// changes the gradient.
struct Bag : torch::nn::Module {
  Bag() : emb(register_module("emb", torch::nn::Embedding(20, 6))) {}
  at::Tensor forward(const at::Tensor& t) { return emb->forward(t).sum(1); }
  torch::nn::Embedding emb;
};

TEST(ModuleOptionsCoverage, EmbeddingOptionsChangedAfterCompileRecapture) {
  torch::manual_seed(2);
  auto m = std::make_shared<Bag>(), twin = std::make_shared<Bag>();
  auto f = tcap::compile(m, [m](const Tensors& in) { return Tensors{m->forward(in[0])}; });
  for (int i = 0; i < 8; ++i) {
    if (i == 3) {
      m->emb->options.max_norm(0.5);
      twin->emb->options.max_norm(0.5);
    }
    if (i == 5) {
      m->emb->options.padding_idx(4);
      twin->emb->options.padding_idx(4);
    }
    {
      torch::NoGradGuard ng;
      twin->emb->weight.copy_(m->emb->weight);
    }
    auto t = torch::randint(0, 20, {3, 5});
    t.index_put_({0, 0}, 4);
    auto out = (*f)({t})[0];
    auto ref = twin->forward(t);
    EXPECT_TRUE(close(out, ref)) << "call " << i;
    out.pow(2).sum().backward();
    ref.pow(2).sum().backward();
    EXPECT_TRUE(close(m->emb->weight.grad(), twin->emb->weight.grad())) << "call " << i;
    m->zero_grad();
    twin->zero_grad();
  }
  // max_norm renormalizes the weight in place inside the forward, which a replay refuses to
  // do to a parameter that requires grad: the change is seen (a recompile), and the function
  // then runs eagerly with that reason.
  EXPECT_GE(f->stats().recompiles, 1);
}

}  // namespace
