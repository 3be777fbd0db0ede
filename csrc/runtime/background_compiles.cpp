// Note [Kernels compiled in the background] (runtime/background_compiles.h).
#include "runtime/background_compiles.h"

#include <tcap/compile.h>

#include "support/logging.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace tcap::runtime {

namespace {

struct Job {
  std::string what;
  std::function<void()> run;
};

// The calling thread yields its core to the program's threads: SCHED_IDLE where Linux has
// it, else the lowest nice value. A compile then takes the cycles the program leaves (its
// intra-op threads' waits, its host code) instead of preempting an intra-op thread, which
// would stall every thread of that parallel region at its barrier.
void lower_priority() {
#if defined(__linux__)
  sched_param p{};
  p.sched_priority = 0;
  if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &p) == 0) return;
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
#endif
}

// One thread, started by the first job; leaked, and stopped at exit (see stop()).
class Worker {
 public:
  static Worker& get() {
    static Worker* w = new Worker();
    return *w;
  }

  void submit(Job job) {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) return;  // exiting: nothing runs any more
    if (!thread_.joinable()) {
      thread_ = std::thread([this] { loop(); });
      std::atexit(&stop_at_exit);
    }
    queue_.push_back(std::move(job));
    ++submitted_;
    jobs_.fetch_add(1, std::memory_order_relaxed);
    wake_.notify_all();
  }

  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t target = submitted_;
    done_cv_.wait(lock, [&] { return finished_ >= target || stopping_; });
  }

  void pause(bool on) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      paused_ = on;
    }
    wake_.notify_all();
  }

  int64_t jobs() const { return jobs_.load(std::memory_order_relaxed); }
  int64_t finished() const { return finished_atomic_.load(std::memory_order_relaxed); }

 private:
  void loop() {
    lower_priority();
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || (!queue_.empty() && !paused_); });
      if (stopping_) break;
      Job job = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      try {
        job.run();
      } catch (const std::exception& e) {
        TCAP_LOG(GraphBreaks, job.what << ": the background compile failed (its kernels run their ATen ops): "
                                       << e.what());
      }
      lock.lock();
      // See stop(): this handler runs before the destructors of what the job constructed.
      if (!stopping_) std::atexit(&stop_at_exit);
      ++finished_;
      finished_atomic_.fetch_add(1, std::memory_order_relaxed);
      done_cv_.notify_all();
    }
  }

  static void stop_at_exit() { Worker::get().stop(); }

  // At exit: the job being run is finished, the rest dropped. The job must finish before
  // the destructors of the statics it uses run. Exit runs handlers and static destructors
  // in the reverse order of their registration, and LLVM constructs function-local statics
  // on first use (code generation's value type set, for one), so stop_at_exit is registered
  // again after every job: it then runs before the destructors of everything constructed
  // by the jobs that finished. (Only a static first constructed by the job running at exit
  // can still be destroyed under it.) Later calls find the thread joined.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      finished_ += static_cast<int64_t>(queue_.size());
      queue_.clear();
    }
    wake_.notify_all();
    done_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_cv_;
  std::deque<Job> queue_;
  std::thread thread_;
  bool stopping_ = false;
  bool paused_ = false;
  int64_t submitted_ = 0;
  int64_t finished_ = 0;
  std::atomic<int64_t> jobs_{0};
  std::atomic<int64_t> finished_atomic_{0};
};

std::atomic<int64_t> g_kernels{0};
std::atomic<int64_t> g_failed{0};
std::atomic<int64_t> g_unfused_runs{0};

}  // namespace

bool background_compiles_on(const CompileOptions& o) {
  return o.compile_in_background || Config::get().compile_in_background;
}

void submit_background_compile(std::string what, std::function<void()> job) {
  Worker::get().submit(Job{std::move(what), std::move(job)});
}

void submit_specialization(std::string what, std::function<void()> job) {
  submit_background_compile("specialization of " + std::move(what), std::move(job));
}

void wait_for_background_compiles() { Worker::get().wait(); }

void pause_background_compiles_for_testing(bool paused) { Worker::get().pause(paused); }

BackgroundCompileStats background_compile_stats() {
  BackgroundCompileStats s;
  s.jobs = Worker::get().jobs();
  s.finished = Worker::get().finished();
  s.kernels = g_kernels.load(std::memory_order_relaxed);
  s.failed = g_failed.load(std::memory_order_relaxed);
  s.unfused_runs = g_unfused_runs.load(std::memory_order_relaxed);
  return s;
}

void count_background_kernels(int64_t ready, int64_t failed) {
  g_kernels.fetch_add(ready, std::memory_order_relaxed);
  g_failed.fetch_add(failed, std::memory_order_relaxed);
}

void count_unfused_run() { g_unfused_runs.fetch_add(1, std::memory_order_relaxed); }

}  // namespace tcap::runtime

namespace tcap {

void wait_for_background_compiles() { runtime::wait_for_background_compiles(); }

}  // namespace tcap
