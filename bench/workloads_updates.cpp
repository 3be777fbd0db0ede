// Optimizer updates alone: one Adam step over the parameters of mlp_big and of
// transformer_block, their gradients set once, against the bandwidth floor of the bytes an
// update must move.
//
// Note [What an update workload measures]
// fwd_us is the wall time of one optimizer.step() (the "forward" column, so that the
// bandwidth floor of Note [Bandwidth floors] applies to it). Adam reads each parameter, its
// gradient and both moments and writes the parameter and the moments: 7 x 4 bytes per
// float32 element, the floor. Variants:
//   eager            opt.step() as LibTorch runs it (eight ATen ops per parameter);
//   step             the step through tcap::compile_step, backend eager: the recorded ops;
//   step_llvm        backend llvm: one kernel per parameter updating it and its moments in
//                    place (Note [In-place updates as kernels], fuse/functionalize.cpp),
//                    the kernels of the step one launch (Note [Horizontal kernels]);
//   step_llvm_apart  the same kernels each launched on its own (compiled with
//                    TCAP_HORIZONTAL_KERNELS=0): what the one launch saves, in one run;
//   step_fused       CompileOptions::fused_optimizers: ATen's multi-tensor _fused_adam_;
//   py_eager, inductor  the torch.compile peer: the same step in Python, and
//                    torch.compile(opt.step) (Inductor's compiled optimizer).
// The gradients are fixed, so every step moves the parameters the same way (Adam's step is
// bounded by the learning rate: nothing blows up over the rounds).
#include "workloads.h"

#include <tcap/train_step.h>

#include <torch/torch.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace tcap::bench {

namespace {

namespace nn = torch::nn;
using Tensors = std::vector<at::Tensor>;

struct Update {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<torch::optim::Adam> opt;
  std::shared_ptr<CompiledStep> step;
};

std::vector<Variant> make_update_variants(const std::function<std::shared_ptr<nn::Module>()>& make, const Options& opts) {
  struct Spec {
    const char* name;
    const char* backend;
    bool compiled;
    bool fused;
    bool apart;  // TCAP_HORIZONTAL_KERNELS=0 while it compiles
  };
  const Spec specs[] = {{"eager", "eager", false, false, false},
                        {"step", "eager", true, false, false},
                        {"step_llvm", "llvm", true, false, false},
                        {"step_llvm_apart", "llvm", true, false, true},
                        {"step_fused", "eager", true, true, false}};
  std::vector<Variant> variants;
  for (const Spec& spec : specs) {
    // step_llvm_apart runs only when named (--variants): it is an A/B of a pass.
    if (!opts.wants(spec.name) || (spec.apart && opts.variants.empty())) continue;
    auto u = std::make_shared<Update>();
    try {
      torch::manual_seed(0);
      u->model = make();
      for (auto& p : u->model->parameters()) p.mutable_grad() = torch::randn_like(p);
      u->opt = std::make_unique<torch::optim::Adam>(u->model->parameters(), torch::optim::AdamOptions(1e-3));
      if (spec.compiled) {
        CompileOptions o;
        o.backend = Backend(spec.backend);
        o.fused_optimizers = spec.fused;
        o.name = std::string("update_") + spec.name;
        u->step = compile_step(u->model, *u->opt, [u](const Tensors&) {
          u->opt->step();
          return Tensors{};
        }, o);
      }
      // The step compiles in these calls: the switch is read at each compile.
      if (spec.apart) ::setenv("TCAP_HORIZONTAL_KERNELS", "0", 1);
      for (int k = 0; k < 4; ++k) {
        if (u->step) {
          (*u->step)({});
        } else {
          u->opt->step();
        }
      }
      if (spec.apart) ::unsetenv("TCAP_HORIZONTAL_KERNELS");
      if (u->step && u->step->stats().replays == 0) {
        throw std::runtime_error("no step was replayed after warm-up: " + u->step->eager_reason());
      }
    } catch (const std::exception& e) {
      const std::string what = e.what();
      variants.push_back(Variant::skip(spec.name, what.substr(0, what.find('\n')), /*failed=*/true));
      continue;
    }
    variants.emplace_back(spec.name, [u](Sample& s) {
      s.start();
      if (u->step) {
        (*u->step)({});
      } else {
        u->opt->step();
      }
      s.stop("fwd_us");
    });
  }
  return variants;
}

double numel(const std::shared_ptr<nn::Module>& m) {
  double n = 0;
  for (const auto& p : m->parameters()) n += static_cast<double>(p.numel());
  return n;
}

void add_update(Registry& registry, const std::string& name, const std::string& description,
                std::function<std::shared_ptr<nn::Module>()> make, bool has_peer = true) {
  Workload w{name, description, [make](const Options& o) { return make_update_variants(make, o); }, nullptr};
  // Note [What an update workload measures]: read p, g, m, v; write p, m, v (float32).
  w.floor_bytes = [make](const Options&) { return FloorBytes{28 * numel(make()), 0}; };
  w.has_peer = has_peer;  // inductor_bench.py: the same step in Python, and torch.compile(opt.step)
  registry.add(std::move(w));
}

// Parameters of one size, as many tensors as a deep narrow model has.
struct ManyParams : nn::Module {
  ManyParams(int count, int64_t size) {
    for (int i = 0; i < count; ++i) register_parameter("p" + std::to_string(i), torch::randn({size}));
  }
};

}  // namespace

void add_update_workloads(Registry& registry) {
  add_update(registry, "adam_mlp_big",
             "one Adam step over mlp_big's parameters (Linear(1024,4096), Linear(4096,1024), LayerNorm(1024): "
             "8.4M floats), gradients set once; fwd_us is the step",
             [] {
               auto m = std::make_shared<nn::SequentialImpl>(nn::Linear(1024, 4096), nn::GELU(), nn::Linear(4096, 1024),
                                                             nn::LayerNorm(nn::LayerNormOptions({1024})));
               return std::static_pointer_cast<nn::Module>(m);
             });
  add_update(registry, "adam_transformer_block",
             "one Adam step over transformer_block's parameters (TransformerEncoderLayer(256, 4 heads, ff 2048): "
             "1.3M floats in 12 tensors), gradients set once; fwd_us is the step",
             [] {
               nn::TransformerEncoderLayer layer(nn::TransformerEncoderLayerOptions(256, 4).dropout(0.0));
               return std::static_pointer_cast<nn::Module>(layer.ptr());
             });
  add_update(registry, "adam_many",
             "one Adam step over 64 parameters of 4096 floats (262k floats, a deep narrow model's count of "
             "tensors), gradients set once; fwd_us is the step",
             [] { return std::static_pointer_cast<nn::Module>(std::make_shared<ManyParams>(64, 4096)); },
             /*has_peer=*/false);
}

}  // namespace tcap::bench
