// Workloads of whole training programs: the programs of the real-programs tier
// (test/programs/, docs/programs.md), one training step per iteration (zero_grad, forward,
// loss, backward, optimizer step, as the program writes it), in each tcap mode.
//
// Note [What a program workload measures]
// step_us is the wall time of one whole step, µs. Variants:
//   eager                  the program as written;
//   compile, compile_llvm  each model's forward through tcap::compile (backend "eager" /
//                          "llvm"); loss, backward and optimizer step eager around it;
//   step, step_llvm        the whole step through tcap::compile_step;
//   step_fused             the same with CompileOptions::fused_optimizers (one multi-tensor
//                          ATen call per optimizer group, Note [Fused optimizer steps]);
//   step_fused_llvm        both: kernels for the graph, fused optimizer calls;
//   ca, ca_llvm            eager forward, each backward() under a CompiledAutogradGuard.
// Setup builds a fresh program per variant (same seed, same initial weights) and runs
// kWarmupSteps steps untimed (captures, the optimizer's state-creating first step, the
// verification step); then the next step must be served by compiled graphs, or the variant
// is reported as failed with the reason. Timed steps run under error_on_fallback, so a
// fallback to eager while timed fails the variant too. The steps cycle through kBatches
// batches drawn at setup. Any refusal fails the variant. The regression program logs
// clip_grad_norm_'s norm as in the tier (on a replayed step, from CompiledStep::last_call).
// The torch.compile peer (Note [The torch.compile peer]) builds the same programs in Python
// and times them the same way: py_eager, and inductor (each model through torch.compile,
// loss, backward and optimizer step eager around it, as a Python user would write it); the
// C++ rows get x_inductor, the median of the per-round ratios of step_us.
#include "workloads.h"

#include "programs/cnn.h"
#include "programs/gan.h"
#include "programs/gcn.h"
#include "programs/unet.h"
#include "programs/lstm_lm.h"
#include "programs/overhead.h"
#include "programs/regression_mlp.h"
#include "programs/transformer_lm.h"
#include "programs/tutorials.h"

#include <tcap/stance.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace tcap::bench {

namespace {

using programs::Mode;
using programs::ModeRunner;
using programs::Program;
using programs::ProgramFactory;
using Tensors = std::vector<at::Tensor>;

constexpr int kWarmupSteps = 6;
constexpr int kBatches = 8;

struct RunningProgram {
  std::unique_ptr<Program> program;
  std::unique_ptr<ModeRunner> runner;
  std::vector<Tensors> batches;
  int step = 0;

  void run_step() {
    program->before_step(step);
    runner->step(batches[static_cast<size_t>(step % kBatches)]);
    ++step;
  }
};

std::vector<Variant> make_program_variants(const ProgramFactory& make, const Options& opts) {
  struct Spec {
    const char* name;
    Mode mode;
    const char* backend;
    bool fused = false;
  };
  const Spec specs[] = {{"eager", Mode::Eager, "eager"},
                        {"compile", Mode::Compile, "eager"},
                        {"compile_llvm", Mode::Compile, "llvm"},
                        {"step", Mode::CompileStep, "eager"},
                        {"step_llvm", Mode::CompileStep, "llvm"},
                        {"step_fused", Mode::CompileStep, "eager", true},
                        {"step_fused_llvm", Mode::CompileStep, "llvm", true},
                        {"ca", Mode::CompiledAutograd, "eager"},
                        {"ca_llvm", Mode::CompiledAutograd, "llvm"}};
  std::vector<Variant> variants;
  for (const auto& spec : specs) {
    if (!opts.wants(spec.name)) continue;
    auto run = std::make_shared<RunningProgram>();
    try {
      run->program = make();
      run->runner = std::make_unique<ModeRunner>(*run->program, spec.mode, spec.backend, spec.fused);
      for (int b = 0; b < kBatches; ++b) run->batches.push_back(run->program->batch(b));
      for (int k = 0; k < kWarmupSteps; ++k) run->run_step();
      const auto before = run->runner->served();
      {
        tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
        run->run_step();
      }
      const auto after = run->runner->served();
      if (spec.mode != Mode::Eager && after.first - before.first < after.second - before.second) {
        throw std::runtime_error("a step after warm-up was not served by compiled graphs (" +
                                 std::to_string(after.first - before.first) + " of " +
                                 std::to_string(after.second - before.second) + " calls)");
      }
    } catch (const std::exception& e) {
      const std::string what = e.what();
      if (what.find("unknown backend") != std::string::npos) {
        variants.push_back(Variant::skip(spec.name, what.substr(0, what.find('\n')), /*failed=*/false));
      } else {
        variants.push_back(Variant::skip(spec.name, what.substr(0, what.find('\n')), /*failed=*/true));
      }
      continue;
    }
    variants.emplace_back(spec.name, [run](Sample& s) {
      tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
      s.start();
      run->run_step();
      s.stop("step_us");
    });
  }
  return variants;
}

void add_program(Registry& registry, const std::string& name, const std::string& description, ProgramFactory make) {
  Workload w{name, description, [make](const Options& o) { return make_program_variants(make, o); }, nullptr};
  w.has_peer = true;  // inductor_bench.py builds the same program in Python
  registry.add(std::move(w));
}

}  // namespace

void add_program_workloads(Registry& registry) {
  add_program(registry, "program_cnn",
              "MNIST-style CNN (Conv2d, BatchNorm2d, max_pool, Linear), SGD momentum, batch 8 of 1x16x16; "
              "µs per training step",
              [] { return std::make_unique<programs::cnn::Cnn>(); });
  add_program(registry, "cnn_step",
              "the MNIST-style CNN of program_cnn at batch 16 of 1x16x16, SGD momentum; µs per training step",
              [] { return std::make_unique<programs::cnn::Cnn>(16); });
  add_program(registry, "mlp_small_step",
              "mlp_small's seed MLP 10-5-2 + Softmax, batch 1, mse_loss, Adam; µs per training step",
              [] { return programs::overhead::mlp_small_adam(); });
  add_program(registry, "adam100",
              "100 parameters of 1 to 35 elements, loss sum((cat(params) * w)^2), Adam; µs per training step",
              [] { return std::make_unique<programs::overhead::Adam100>(); });
  add_program(registry, "program_dcgan",
              "DCGAN pair (ConvTranspose2d/Conv2d, BatchNorm2d), two Adams, D and G updates in one step, "
              "batch 8 of 1x16x16; µs per training step",
              [] { return std::make_unique<programs::gan::Gan>(); });
  add_program(registry, "program_transformer",
              "transformer LM (2 TransformerEncoderLayer d16, causal mask), AdamW, gradient-norm hooks, "
              "[12, 4] tokens; µs per training step",
              [] { return std::make_unique<programs::transformer::TransformerProgram>(); });
  add_program(registry, "program_lstm", "LSTM LM (Embedding, 2-layer LSTM 16, Linear), Adam, [10, 3] tokens; "
              "µs per training step",
              [] { return std::make_unique<programs::lstm::LstmProgram>(); });
  add_program(registry, "program_regression",
              "regression MLP 7-32-32-1, SGD momentum, warm-up schedule, clip_grad_norm_, batch 24; "
              "µs per training step",
              [] { return std::make_unique<programs::regression::RegressionMlp>(/*log_norm=*/true); });
  add_program(registry, "program_gcn",
              "GCN (2 graph convolutions 12-16-4 over a fixed 67-node graph), cross_entropy over a boolean "
              "train mask (a size from values), Adam, full batch; µs per training step",
              [] { return std::make_unique<programs::gcn::GcnProgram>(); });
  add_program(registry, "program_unet",
              "U-Net denoiser (residual Conv2d/GroupNorm/SiLU blocks 3-16-32, strided conv down, nearest "
              "upsampling and concatenated skip up), mse_loss, AdamW, batch 4 of 3x24x24; µs per training step",
              [] { return std::make_unique<programs::unet::UNetProgram>(); });
  add_program(registry, "program_tutorial_mlp", "tutorial MLP 10-5-2 + Softmax, SGD, batch 9; µs per training step",
              [] { return std::make_unique<programs::tutorials::TutorialMlp>(); });
  add_program(registry, "program_coscos", "cos(cos(a+b+c+d)) on f32[7, 5] parameters, SGD; µs per training step",
              [] { return std::make_unique<programs::tutorials::TutorialCosCos>(); });
}

}  // namespace tcap::bench
