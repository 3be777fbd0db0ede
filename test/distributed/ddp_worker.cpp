// What each rank of a DistributedDataParallel test runs (ddp_scenario.h): the scenario's
// training with tcap::DistributedDataParallel in the mode it names, its results written for
// the parent (ddp_test.cpp) to compare.
#include "ddp_scenario.h"

namespace ddp_test {

// --- the worker --------------------------------------------------------------------------

int run_worker(const std::string& spec, const std::string& out) {
  const Scenario s = parse(spec);
  at::set_num_threads(1);
  std::ofstream report(out + ".txt");
  try {
    auto pg = tcap::distributed::init_from_env();
    const int rank = pg->getRank(), world = pg->getSize();
    Net net = make_net(s, rank);
    tcap::DDPOptions dopts;
    if (s.bucket > 0) dopts.bucket_cap_bytes = dopts.first_bucket_cap_bytes = s.bucket;
    dopts.find_unused_parameters = s.find_unused;
    auto ddp = tcap::DistributedDataParallel(net, pg, dopts);
    torch::optim::SGD opt(ddp->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    tcap::CompileOptions co;
    co.backend = s.backend;
    std::shared_ptr<tcap::CompiledFunction> compiled;
    std::shared_ptr<tcap::CompiledStep> step_fn;
    if (s.mode == "compile_inner") {
      compiled = tcap::compile(net, co);
      ddp->set_forward([compiled](const at::Tensor& x) { return compiled->forward(x); });
    } else if (s.mode == "compile_wrapper") {
      compiled = tcap::compile(ddp, co);
    }
    std::optional<tcap::CompiledAutogradGuard> ca_stats_holder;
    auto loss_of = [&](const at::Tensor& x, const at::Tensor& y) {
      auto out = compiled && s.mode == "compile_wrapper" ? compiled->forward(x) : ddp->forward(x);
      auto loss = torch::nn::functional::cross_entropy(out, y);
      return s.outside ? loss + net->unused->weight.sum() * 1e-3 : loss;
    };
    if (s.mode == "compile_step") {
      // The whole step, micro-batches under no_sync() included: in = (x, y) per micro-batch.
      step_fn = tcap::compile_step(ddp, opt, [&](const std::vector<at::Tensor>& in) {
        opt.zero_grad();
        at::Tensor loss;
        for (size_t m = 0; m + 1 < in.size(); m += 2) {
          std::optional<tcap::DistributedDataParallelImpl::NoSync> no_sync;
          if (m + 2 < in.size()) no_sync.emplace(ddp->no_sync());
          loss = loss_of(in[m], in[m + 1]);
          loss.backward();
        }
        opt.step();
        return std::vector<at::Tensor>{loss};
      }, co);
    }
    std::optional<tcap::StanceGuard> strict;
    if (s.strict) strict.emplace(tcap::Stance::Default, /*error_on_fallback=*/true);
    tcap::CompiledAutogradStats ca_stats;
    int ca_accumulate_nodes = 0;
    for (int step = 0; step < s.steps; ++step) {
      std::vector<std::pair<at::Tensor, at::Tensor>> micro;
      for (int m = 0; m < s.micro; ++m) {
        auto [x, y] = batch(step, m, world);
        micro.emplace_back(x.narrow(0, rank * kBatch, kBatch).contiguous(), y.narrow(0, rank * kBatch, kBatch));
      }
      if (step_fn) {
        std::vector<at::Tensor> in;
        for (const auto& [x, y] : micro) {
          in.push_back(x);
          in.push_back(y);
        }
        // A rank that runs one step eagerly while the others replay issues the same
        // collectives (Note [Collectives in a compiled step]).
        std::optional<tcap::StanceGuard> eager;
        if (rank == s.eager_rank && step == s.eager_step) eager.emplace(tcap::Stance::ForceEager);
        (*step_fn)(in);
        continue;
      }
      opt.zero_grad();
      for (int m = 0; m < s.micro; ++m) {
        std::optional<tcap::DistributedDataParallelImpl::NoSync> no_sync;
        if (m + 1 < s.micro) no_sync.emplace(ddp->no_sync());
        auto loss = loss_of(micro[m].first, micro[m].second);
        if (step == 1 && rank == s.exit_rank) std::_Exit(3);
        if (step == 1 && rank == s.stall_rank) {
          std::this_thread::sleep_for(std::chrono::seconds(s.stall_s));
          std::_Exit(3);
        }
        if (s.mode == "compiled_autograd") {
          tcap::CompiledAutogradGuard ca(co);
          loss.backward();
          ca_stats = ca.stats();
          // Parameters accumulated inside the compiled backward, where the engine would
          // (their bucket all-reduces start while the rest of the graph runs).
          ca_accumulate_nodes = 0;
          for (const auto& g : ca.graphs()) {
            for (const auto& n : g.nodes()) {
              ca_accumulate_nodes += n.kind == tcap::ir::NodeKind::CallHook &&
                                     g.hooks().at(static_cast<size_t>(n.hook)).kind == tcap::ir::HookKind::AccumulateGrad;
            }
          }
        } else {
          loss.backward();
        }
      }
      opt.step();
    }
    ddp->pre_forward();  // buffers: rank 0's everywhere (as before the next forward)
    torch::save(state_of(*net), out + ".pt");
    report << "ok\n";
    if (compiled) report << "replays " << compiled->stats().replays << "\neager_reason " << compiled->eager_reason() << "\n";
    if (step_fn) report << "replays " << step_fn->stats().replays << "\neager_reason " << step_fn->eager_reason() << "\n";
    if (s.mode == "compiled_autograd") {
      report << "replays " << ca_stats.replays << "\nca_accumulate_nodes " << ca_accumulate_nodes << "\n";
    }
    report << "allreduces " << ddp->stats().allreduces << "\nbuckets " << ddp->stats().buckets << "\n";
    report << "unused_marked " << ddp->stats().unused_marked << "\n";
    report << "graph_syncs " << ddp->stats().graph_syncs << "\nbackwards_synced " << ddp->stats().backwards_synced
           << "\n";
    if (net->unused) report << "unused_grad_defined " << net->unused->weight.grad().defined() << "\n";
  } catch (const std::exception& e) {
    std::string what = e.what();
    for (auto& c : what) if (c == '\n') c = ' ';
    report << "error " << what << "\n";
    report << "error_at_ms "
           << std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::system_clock::now().time_since_epoch()).count()
           << "\n";
  }
  return 0;
}

}  // namespace ddp_test
