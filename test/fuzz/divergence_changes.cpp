// The changes the divergence fuzzer draws between a program's calls (divergence_programs.h):
// what ordinary programs do between calls, applied to both sides.
#include "divergence_programs.h"

#include <string>
#include <vector>

namespace divergence {

Call ChangeDraw::draw(int call) {
  Call c;
  c.batch = batch;
  c.length = length;
  if (call < 3) return c;  // the first calls capture and compile
  const int n = pick(3);
  for (int k = 0; k < n; ++k) {
    const int kind = pick(spec.input == Input::Text ? 30 : 28);
    const size_t which = rng();
    switch (kind) {
      case 0:
        c.transposed = true;
        c.what.push_back("non-contiguous input");
        break;
      case 1: {
        const bool train = pick(2) == 0;
        c.what.push_back(train ? "model.train()" : "model.eval()");
        c.edits.push_back([train](Side& s) { s.model->train(train); });
        break;
      }
      case 2: {
        c.what.push_back("one module's train flag flipped");
        c.edits.push_back([which](Side& s) {
          auto mods = s.model->modules(false);
          auto& m = mods[which % mods.size()];
          m->train(!m->is_training());
        });
        break;
      }
      case 3: {
        if ((which >> 8) % 4 == 0) {
          // An in-place Dropout writes the tensor it is given (in training mode).
          const bool in_place = (which >> 10) % 2 == 0;
          c.what.push_back(std::string("Dropout inplace = ") + (in_place ? "true" : "false"));
          c.edits.push_back([in_place](Side& s) {
            for (auto& d : modules_of<nn::DropoutImpl>(s.model)) d->options.inplace(in_place);
          });
          break;
        }
        const double p = std::vector<double>{0.0, 0.1, 0.5}[which % 3];
        c.what.push_back("Dropout p = " + std::to_string(p));
        c.edits.push_back([p](Side& s) {
          for (auto& d : modules_of<nn::DropoutImpl>(s.model)) d->options.p(p);
        });
        break;
      }
      case 4: {
        // (This kind's variants, and those of kinds 3, 5 and 24, come from `which`'s bits,
        // not from another draw: a seed draws the same random numbers, programs and change
        // kinds as before the variants existed.)
        if ((which >> 8) % 4 == 0) {
          // A cumulative average: the factor is 1 / num_batches_tracked, read on the host.
          c.what.push_back("BatchNorm momentum = none (cumulative average)");
          c.edits.push_back([](Side& s) {
            for (auto& b : modules_of<nn::BatchNorm1dImpl>(s.model)) b->options.momentum(c10::nullopt);
          });
          break;
        }
        if ((which >> 8) % 4 == 1) {
          // Without running statistics an eval-mode BatchNorm normalizes by the batch's.
          const bool track = (which >> 10) % 2 == 0;
          c.what.push_back(std::string("BatchNorm track_running_stats = ") + (track ? "true" : "false"));
          c.edits.push_back([track](Side& s) {
            for (auto& b : modules_of<nn::BatchNorm1dImpl>(s.model)) b->options.track_running_stats(track);
          });
          break;
        }
        const double m = std::vector<double>{0.05, 0.3, 0.9}[which % 3];
        c.what.push_back("BatchNorm momentum = " + std::to_string(m));
        c.edits.push_back([m](Side& s) {
          for (auto& b : modules_of<nn::BatchNorm1dImpl>(s.model)) b->options.momentum(m);
        });
        break;
      }
      case 5: {
        if ((which >> 8) % 4 == 0) {
          // One group: a GroupNorm that normalizes over all its channels.
          c.what.push_back("GroupNorm num_groups = 1");
          c.edits.push_back([](Side& s) {
            for (auto& g : modules_of<nn::GroupNormImpl>(s.model)) g->options.num_groups(1);
          });
          break;
        }
        const double eps = std::vector<double>{1e-5, 1e-2, 0.5}[which % 3];
        c.what.push_back("LayerNorm, BatchNorm and GroupNorm eps = " + std::to_string(eps));
        c.edits.push_back([eps](Side& s) {
          for (auto& l : modules_of<nn::LayerNormImpl>(s.model)) l->options.eps(eps);
          for (auto& b : modules_of<nn::BatchNorm1dImpl>(s.model)) b->options.eps(eps);
          for (auto& g : modules_of<nn::GroupNormImpl>(s.model)) g->options.eps(eps);
        });
        break;
      }
      case 6:
        c.what.push_back("a parameter scaled in place");
        c.edits.push_back([which](Side& s) {
          auto ps = s.model->parameters();
          torch::NoGradGuard no_grad;
          ps[which % ps.size()].mul_(0.9);
        });
        break;
      case 7:
        c.what.push_back("a parameter written through .data()");
        c.edits.push_back([which](Side& s) {
          auto ps = s.model->parameters();
          ps[which % ps.size()].data().add_(0.05);
        });
        break;
      case 8:
        c.what.push_back("a Linear's weight given other data (set_data)");
        c.edits.push_back([which](Side& s) {
          auto lins = modules_of<nn::LinearImpl>(s.model);
          auto& l = lins[which % lins.size()];
          torch::NoGradGuard no_grad;
          l->weight.set_data(l->weight.detach().clone().mul_(1.1));
        });
        break;
      case 9: {
        const double lr = std::vector<double>{0.01, 0.1, 0.002}[which % 3];
        c.what.push_back("learning rate = " + std::to_string(lr));
        c.edits.push_back([lr](Side& s) { s.opt->param_groups()[0].options().set_lr(lr); });
        break;
      }
      case 10:
        c.what.push_back("deterministic algorithms toggled");
        toggle_deterministic = !toggle_deterministic;
        break;
      case 11:
        c.no_grad = true;
        c.what.push_back("a call under NoGradGuard");
        break;
      case 12:
        c.what.push_back("a gradient hook on a parameter");
        c.edits.push_back([which](Side& s) {
          if (s.hooks >= 2) return;
          ++s.hooks;
          auto ps = s.model->parameters();
          auto& p = ps[which % ps.size()];
          if (p.requires_grad()) p.register_hook([](const at::Tensor& g) { return g * 2; });
        });
        break;
      case 13:
        if (spec.door != Door::Compile || spec.input == Input::Tokens) break;
        c.edit_input_before_backward = true;
        c.what.push_back("the input changed in place between forward and backward");
        break;
      case 14:
        if (spec.door != Door::Compile) break;
        c.step_before_backward = true;
        c.what.push_back("an optimizer step between forward and backward");
        break;
      case 16:
        c.what.push_back("a parameter frozen or unfrozen (requires_grad_)");
        c.edits.push_back([which](Side& s) {
          auto ps = s.model->parameters();
          auto& p = ps[which % ps.size()];
          p.requires_grad_(!p.requires_grad());
        });
        break;
      case 17: {
        const double wd = std::vector<double>{0.0, 0.01, 0.1}[which % 3];
        c.what.push_back("weight decay (and SGD momentum) = " + std::to_string(wd));
        c.edits.push_back([wd](Side& s) {
          auto& o = s.opt->param_groups()[0].options();
          if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&o)) sgd->weight_decay(wd).momentum(wd * 5);
          if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&o)) adam->weight_decay(wd);
        });
        break;
      }
      case 18:
        if (spec.door == Door::Step) break;  // the step's own body zeroes the gradients
        c.accumulate = true;
        c.what.push_back("gradients accumulated over two calls (no zero_grad)");
        break;
      case 19:
        c.inference = true;
        c.what.push_back("a call under InferenceMode");
        break;
      case 20:
        c.double_default = true;
        c.what.push_back("a call with the default dtype double");
        break;
      case 21:
        c.what.push_back("a residual block's Linear replaced by a new module");
        c.edits.push_back([which](Side& s) {
          auto rs = modules_of<ResidualImpl>(s.model);
          if (rs.empty()) return;
          auto& r = rs[which % rs.size()];
          const int64_t w = r->lin->options.in_features();
          torch::manual_seed(static_cast<int64_t>(which % 100000));  // the same new weights on both sides
          r->lin = r->replace_module("lin", nn::Linear(w, w));
        });
        break;
      case 22:
        c.what.push_back("the optimizer's parameter list reordered");
        c.edits.push_back([](Side& s) {
          auto& ps = s.opt->param_groups()[0].params();
          std::reverse(ps.begin(), ps.end());
        });
        break;
      case 23:
        c.what.push_back("the tensor a Held layer reads edited in place");
        c.edits.push_back([](Side& s) {
          torch::NoGradGuard no_grad;
          for (auto& t : s.held) t.mul_(0.9).add_(0.05);
        });
        break;
      case 24: {
        if ((which >> 8) % 4 == 0) {
          // Changes only the backward: gradients scaled by the inverse of each id's count.
          const bool scale = (which >> 10) % 2 == 0;
          c.what.push_back(std::string("Embedding scale_grad_by_freq = ") + (scale ? "true" : "false"));
          c.edits.push_back([scale](Side& s) {
            for (auto& e : modules_of<nn::EmbeddingImpl>(s.model)) e->options.scale_grad_by_freq(scale);
          });
          break;
        }
        const std::optional<int64_t> idx = std::vector<std::optional<int64_t>>{std::nullopt, 0, 3}[which % 3];
        c.what.push_back("Embedding padding_idx = " + (idx ? std::to_string(*idx) : std::string("none")));
        c.edits.push_back([idx](Side& s) {
          for (auto& e : modules_of<nn::EmbeddingImpl>(s.model)) e->options.padding_idx(idx);
        });
        break;
      }
      case 25: {
        const std::optional<double> norm = std::vector<std::optional<double>>{std::nullopt, 1.0, 0.5}[which % 3];
        c.what.push_back("Embedding max_norm = " + (norm ? std::to_string(*norm) : std::string("none")));
        c.edits.push_back([norm](Side& s) {
          for (auto& e : modules_of<nn::EmbeddingImpl>(s.model)) e->options.max_norm(norm);
        });
        break;
      }
      case 26: {
        const int mode = static_cast<int>(which % 4);
        static const char* modes[] = {"zeros", "reflect", "replicate", "circular"};
        c.what.push_back(std::string("Conv1d padding mode = ") + modes[mode]);
        c.edits.push_back([mode](Side& s) {
          for (auto& conv : modules_of<nn::Conv1dImpl>(s.model)) {
            switch (mode) {
              case 0: conv->options.padding_mode(torch::kZeros); break;
              case 1: conv->options.padding_mode(torch::kReflect); break;
              case 2: conv->options.padding_mode(torch::kReplicate); break;
              default: conv->options.padding_mode(torch::kCircular); break;
            }
          }
        });
        break;
      }
      case 27:
        if (spec.door != Door::Step || spec.input != Input::Features || spec.cross_entropy ||
            spec.in < spec.layers.back().second) {
          break;
        }
        c.target_view = true;
        c.what.push_back("the step's target a view of its input");
        break;
      case 28:
      case 29:
        if (spec.input != Input::Text) break;
        c.what.push_back("another sequence length");
        length = text_lengths()[which % text_lengths().size()];
        c.length = length;
        break;
      default:
        c.what.push_back("another batch size");
        batch = std::vector<int>{1, 2, 3, 5, 6, 8, 9}[which % 7];
        c.batch = batch;
        break;
    }
  }
  return c;
}

}  // namespace divergence
