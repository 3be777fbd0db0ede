// ir_passes_20k: graph passes over a captured graph of about 20,000 nodes (Note [What
// ir_passes_20k measures]).
//
// Note [What ir_passes_20k measures]
// The graph: 3,400 rounds of y = relu(y * w + b), then y.t().t() and .detach(), on a
// [7, 5] tensor, captured once (about 20,400 nodes). Each variant runs one pass over it
// per iteration; `pass_us` is µs per pass. Variants:
//   users            Graph::users(v) for every value (what fusion and the passes ask);
//   fuse             fusion's grouping and group boundaries (fuse::fuse with a compile
//                    callback that refuses every group, so no kernel is built);
//   drop_detaches    passes::drop_detaches (3,400 detaches dropped);
//   fold_transposes  passes::fold_transposes (3,400 pairs of t() folded).
// The passes use tcap's internal headers (csrc/): they time the very functions the
// pipeline calls. A pass that scans the graph per node is quadratic here and shows it.
#include "workloads.h"

#include "fuse/fusion.h"
#include "passes/drop_detaches.h"
#include "passes/fold_transposes.h"

#include <tcap/capture.h>
#include <tcap/graph.h>

#include <torch/torch.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace tcap::bench {

namespace {

constexpr int kRounds = 3400;

ir::Graph big_graph() {
  torch::NoGradGuard no_grad;
  at::Tensor x = torch::randn({7, 5});
  at::Tensor w = torch::randn({7, 5});
  at::Tensor b = torch::randn({5});
  CaptureGuard guard;
  guard.input(x, "x");
  guard.input(w, "w");
  guard.input(b, "b");
  at::Tensor y = x;
  for (int r = 0; r < kRounds; ++r) {
    y = torch::relu(y * w + b);
    y = y.t().t();
    y = y.detach();
  }
  guard.output(y, "y");
  guard.stop();
  return guard.graph();
}

std::vector<Variant> make_ir_passes(const Options& opts) {
  auto g = std::make_shared<ir::Graph>(big_graph());
  std::vector<Variant> variants;
  auto pass = [g](const char* name, std::function<size_t(const ir::Graph&)> run) {
    return Variant(name, [g, run = std::move(run), name](Sample& s) {
      s.start();
      const size_t result = run(*g);
      s.stop("pass_us");
      if (result == 0) throw std::runtime_error(std::string(name) + " did nothing");
    });
  };
  if (opts.wants("users")) {
    variants.push_back(pass("users", [](const ir::Graph& h) {
      size_t n = 0;
      for (const auto& v : h.values()) n += h.users(v.id).size();
      return n;
    }));
  }
  if (opts.wants("fuse")) {
    variants.push_back(pass("fuse", [](const ir::Graph& h) {
      fuse::FusionOptions o;
      o.compile_threads = 1;
      o.compile = [](const fuse::FusedGroup&, std::string* why) -> int64_t {
        *why = "not compiled (benchmark)";
        return -1;
      };
      return fuse::fuse(h, o).decisions.size();
    }));
  }
  if (opts.wants("drop_detaches")) {
    variants.push_back(pass("drop_detaches", [](const ir::Graph& h) {
      int dropped = 0;
      passes::drop_detaches(h, &dropped);
      return static_cast<size_t>(dropped);
    }));
  }
  if (opts.wants("fold_transposes")) {
    variants.push_back(pass("fold_transposes", [](const ir::Graph& h) {
      int folded = 0;
      passes::fold_transposes(h, &folded);
      return static_cast<size_t>(folded);
    }));
  }
  return variants;
}

}  // namespace

void add_ir_workloads(Registry& registry) {
  registry.add(Workload{"ir_passes_20k",
                        "graph passes over a captured graph of ~20,400 nodes (users of every value, fusion's "
                        "grouping, drop_detaches, fold_transposes); µs per pass",
                        make_ir_passes, nullptr});
}

}  // namespace tcap::bench
