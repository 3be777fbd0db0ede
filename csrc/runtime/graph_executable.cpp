// Compiled graphs run by interpreters: one instance per call running at once, each with
// its memory plan, under the CPU buffer pool (graph_executable.h).
#include "runtime/graph_executable.h"

#include "interp/direct_calls.h"
#include "interp/hook_runner.h"
#include "runtime/buffer_pool.h"

#include <tcap/interpreter.h>

#include <ATen/record_function.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tcap::runtime {

namespace {

// Note [Profiler names]
// Each run of a compiled graph shows in LibTorch's profiler (and any RecordFunction
// observer) as a user scope named "tcap::<graph>" ("tcap::fn.0.forward",
// "tcap::train.step1"), with its ATen ops and generated kernels ("fused_3_add_cos_cos",
// runtime/fused_kernel.cpp) inside. The names are built at compile time; with no
// observer installed a scope costs one check of the callback lists, no string.
std::string profiler_name(const std::string& what) { return "tcap::" + what; }

// Note [One executable on several threads]
// An Interpreter runs one call at a time: its value slots, prepared stacks and host values
// belong to the call, as a memory plan's arena does. An executable called from several
// threads at once (one compiled model served by a thread pool, compiled backwards on
// several threads) used to run its calls one after the other behind a mutex, so N threads
// went no faster than one. Each call now takes an idle instance (an interpreter and its
// memory plan) from the executable's pool, or copies the prototype when every instance is
// busy: the pool grows to the number of calls that ever ran at once, and no call waits for
// another (the pool's lock is held for a pop or a push, never for a run). Copies share the
// generated kernels and unboxed calls, which keep nothing of a call.
class InterpreterPool {
 public:
  struct Instance {
    Instance(const Interpreter& prototype, const std::string& what) : interp(prototype), plan(what) {}
    Interpreter interp;
    runtime::MemoryPlan plan;
  };
  InterpreterPool(Interpreter prototype, std::string what) : prototype_(std::move(prototype)), what_(std::move(what)) {}

  // An instance for one call, back in the pool when the handle dies.
  struct Handle {
    InterpreterPool* pool;
    std::unique_ptr<Instance> instance;
    ~Handle() {
      if (instance) pool->put(std::move(instance));
    }
    Instance* operator->() const { return instance.get(); }
  };
  Handle take() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!idle_.empty()) {
        std::unique_ptr<Instance> i = std::move(idle_.back());
        idle_.pop_back();
        return Handle{this, std::move(i)};
      }
    }
    return Handle{this, std::make_unique<Instance>(prototype_, what_)};
  }

 private:
  void put(std::unique_ptr<Instance> i) {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.push_back(std::move(i));
  }
  const Interpreter prototype_;
  const std::string what_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Instance>> idle_;
};

std::shared_ptr<InterpreterPool> interpreter_pool(const ir::Graph& g, const std::string& what, bool check_host_values,
                                                  std::shared_ptr<const interp::DirectCalls> kernels) {
  Interpreter interp(g, /*differentiable=*/false, std::move(kernels));
  interp.keep_values(false);
  interp.check_host_values(check_host_values);
  return std::make_shared<InterpreterPool>(std::move(interp), what);
}

}  // namespace

Executable interpreter_executable(const ir::Graph& g, const std::string& what, bool check_host_values,
                                  std::shared_ptr<const interp::DirectCalls> kernels) {
  auto pool = interpreter_pool(g, what, check_host_values, std::move(kernels));
  return [pool, name = profiler_name(what)](std::vector<at::Tensor> in) {
    RECORD_USER_SCOPE(std::string_view(name));  // Note [Profiler names]
    auto instance = pool->take();               // Note [One executable on several threads]
    runtime::PoolScope scope(&instance->plan);  // Note [CPU buffer pool], Note [Memory plans]
    auto outs = instance->interp.run(std::move(in));
    if (auto* sink = interp::host_values_sink()) *sink = instance->interp.host_values();
    return outs;
  };
}

}  // namespace tcap::runtime
