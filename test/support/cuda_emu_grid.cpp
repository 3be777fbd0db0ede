// The CUDA emulator's grid (Note [CUDA host emulation] in cuda_emu.h): a launch's blocks
// run one at a time, each thread a fiber, barriers and warp shuffles by switching fibers;
// the launch's buffers guarded against writes out of bounds.
#include "support/cuda_emu_grid.h"

#include "codegen/cuda/cuda.h"
#include "codegen/cuda/render.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <ucontext.h>

namespace tcap::testing::cuda_emu::grid {

namespace {

namespace cg = tcap::codegen::cuda;

// Guarded copies of a launch's buffers: each kernel buffer is moved into scratch memory
// with kGuard poisoned elements (0xff bytes: NaN, -1) on either side, at the same
// alignment modulo 64 as the original (so the vector path decides alike). After the run,
// a write outside a buffer or into an input is an error, and the outputs are copied back.
// A read outside a buffer reads poison, which the tests' comparisons then catch.
class GuardedBuffers {
 public:
  static constexpr int64_t kGuard = 64;

  GuardedBuffers(const EmuKernel& k, void* const* args) : k_(k), orig_(args, args + k.extents.size()) {
    for (size_t b = 0; b < k.extents.size(); ++b) {
      const Extent& e = k.extents[b];
      const int64_t n = e.hi - e.lo + 1 + 2 * kGuard;
      std::vector<unsigned char> raw(static_cast<size_t>(n * e.elem_size + 128), 0xff);
      const auto start = (reinterpret_cast<uintptr_t>(raw.data()) + 63) & ~uintptr_t{63};
      uintptr_t dp = start + static_cast<uintptr_t>((kGuard - e.lo) * e.elem_size);
      dp += (reinterpret_cast<uintptr_t>(orig_[b]) - dp) & 63;  // same address modulo 64
      if (e.hi >= e.lo && !e.is_output) {
        std::memcpy(reinterpret_cast<char*>(dp) + e.lo * e.elem_size, static_cast<const char*>(orig_[b]) + e.lo * e.elem_size,
                    static_cast<size_t>((e.hi - e.lo + 1) * e.elem_size));
      }
      raw_.push_back(std::move(raw));
      ptrs_.push_back(reinterpret_cast<void*>(dp));
    }
  }

  void* const* args() const { return ptrs_.data(); }

  // Throws on a write out of bounds or into an input; copies the outputs back.
  void finish() {
    for (size_t b = 0; b < ptrs_.size(); ++b) {
      const Extent& e = k_.extents[b];
      if (e.hi < e.lo) continue;
      const char* p = static_cast<const char*>(ptrs_[b]);
      auto poisoned = [&](int64_t from, int64_t count) {
        for (int64_t i = 0; i < count * e.elem_size; ++i) {
          if (static_cast<unsigned char>(p[from * e.elem_size + i]) != 0xff) return false;
        }
        return true;
      };
      if (!poisoned(e.lo - kGuard, kGuard) || !poisoned(e.hi + 1, kGuard)) {
        throw std::runtime_error("kernel " + k_.name + " (" + k_.entry + ") wrote outside buffer " + std::to_string(b) +
                                 " (elements " + std::to_string(e.lo) + ".." + std::to_string(e.hi) + ")");
      }
      const size_t bytes = static_cast<size_t>((e.hi - e.lo + 1) * e.elem_size);
      if (!e.is_output) {
        if (std::memcmp(p + e.lo * e.elem_size, static_cast<const char*>(orig_[b]) + e.lo * e.elem_size, bytes) != 0) {
          throw std::runtime_error("kernel " + k_.name + " (" + k_.entry + ") wrote into input buffer " +
                                   std::to_string(b));
        }
      } else {
        std::memcpy(static_cast<char*>(orig_[b]) + e.lo * e.elem_size, p + e.lo * e.elem_size, bytes);
      }
    }
  }

 private:
  const EmuKernel& k_;
  std::vector<void*> orig_;
  std::vector<std::vector<unsigned char>> raw_;
  std::vector<void*> ptrs_;
};

// --- the scheduler ----------------------------------------------------------------------

constexpr size_t kStackBytes = 256 * 1024;
constexpr int kMaxThreads = 1024;

enum class State { Ready, AtBarrier, AtShuffle, Done };

// Switching fibers. On x86-64 a dozen instructions that save the callee-saved registers
// on the stack being left (swapcontext also saves the signal mask with a system call per
// switch, which made switching most of the emulator's time); ucontext elsewhere.
#if defined(__x86_64__)
extern "C" void tcap_emu_switch(void** save_sp, void* load_sp);
asm(R"(
.text
.p2align 4
.type tcap_emu_switch,@function
tcap_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size tcap_emu_switch, .-tcap_emu_switch
)");

struct Context {
  void* sp = nullptr;
};
// A context that starts `entry` (which never returns) on the stack [base, base + size).
void make_context(Context* c, char* base, size_t size, void (*entry)()) {
  auto* sp = reinterpret_cast<uintptr_t*>((reinterpret_cast<uintptr_t>(base + size)) & ~uintptr_t{15});
  *--sp = 0;                                       // entry's "return address": keeps the ABI alignment
  *--sp = reinterpret_cast<uintptr_t>(entry);      // where the first switch's ret goes
  for (int r = 0; r < 6; ++r) *--sp = 0;           // rbp rbx r12-r15
  c->sp = sp;
}
void switch_context(Context* from, Context* to) { tcap_emu_switch(&from->sp, to->sp); }
#else
struct Context {
  ucontext_t uc;
};
void make_context(Context* c, char* base, size_t size, void (*entry)()) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = base;
  c->uc.uc_stack.ss_size = size;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, entry, 0);
}
void switch_context(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
#endif

struct Fiber {
  Context ctx;
  tcap_emu_thread coords;
  State state = State::Ready;
};

struct Warp {
  int arrived = 0;
  unsigned char slots[32][8];
};

// The block being run (one at a time, under g_launch_mu).
struct Block {
  const EmuKernel* kernel = nullptr;
  void (*call)(void* const*, int) = nullptr;
  void* const* args = nullptr;
  int vec_ok = 0;
  int threads = 0;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  int at_barrier = 0;
  int done = 0;
  Context scheduler;
  Fiber* running = nullptr;
  std::string error;  // set by a fiber; the scheduler throws it
  int64_t switches = 0;
};

std::mutex g_launch_mu;
Block g_block;
tcap_emu_thread* g_current = nullptr;
char* g_stacks = nullptr;

std::atomic<int64_t> g_launches{0}, g_vector_launches{0}, g_column_launches{0}, g_split_launches{0}, g_switches{0};

std::string where(const Fiber& f) {
  std::ostringstream os;
  os << "kernel " << g_block.kernel->name << " (" << g_block.kernel->entry << "), block " << f.coords.block_idx.x
     << ", thread " << f.coords.thread_idx.x;
  return os.str();
}

// Back to the scheduler until it resumes this fiber.
void park(Fiber& f) {
  ++g_block.switches;
  switch_context(&f.ctx, &g_block.scheduler);
}

[[noreturn]] void fail_in_fiber(Fiber& f, const std::string& what) {
  g_block.error = where(f) + ": " + what;
  for (;;) park(f);  // never resumed
}

void emu_syncthreads() {
  Fiber& f = *g_block.running;
  if (++g_block.at_barrier == g_block.threads - g_block.done) {
    if (g_block.done > 0) {
      fail_in_fiber(f, std::to_string(g_block.done) + " threads of the block exited before __syncthreads");
    }
    g_block.at_barrier = 0;
    for (Fiber& o : g_block.fibers) {
      if (o.state == State::AtBarrier) o.state = State::Ready;
    }
    return;
  }
  f.state = State::AtBarrier;
  park(f);
}

void warp_wait(Fiber& f, Warp& w) {
  if (++w.arrived == 32) {
    w.arrived = 0;
    const int first = static_cast<int>(f.coords.thread_idx.x) & ~31;
    for (int t = first; t < first + 32; ++t) {
      Fiber& o = g_block.fibers[static_cast<size_t>(t)];
      if (o.state == State::AtShuffle) o.state = State::Ready;
    }
    return;
  }
  f.state = State::AtShuffle;
  park(f);
}

void emu_shfl_xor(void* value, int bytes, int lane_mask, unsigned int mask) {
  Fiber& f = *g_block.running;
  if (mask != 0xffffffffu) fail_in_fiber(f, "__shfl_xor_sync with a partial mask (the renderer only uses full warps)");
  if (bytes > 8 || lane_mask < 0 || lane_mask > 31) fail_in_fiber(f, "unsupported __shfl_xor_sync operands");
  const int t = static_cast<int>(f.coords.thread_idx.x);
  Warp& w = g_block.warps[static_cast<size_t>(t / 32)];
  const int lane = t % 32;
  std::memcpy(w.slots[lane], value, static_cast<size_t>(bytes));
  warp_wait(f, w);  // every lane has written
  std::memcpy(value, w.slots[lane ^ lane_mask], static_cast<size_t>(bytes));
  warp_wait(f, w);  // every lane has read, so the slots may be written again
}

void fiber_main() {
  Fiber& f = *g_block.running;
  g_block.call(g_block.args, g_block.vec_ok);
  f.state = State::Done;
  ++g_block.done;
  if (g_block.at_barrier > 0) {
    fail_in_fiber(f, "the thread exited while " + std::to_string(g_block.at_barrier) +
                         " threads of its block wait at __syncthreads");
  }
  if (g_block.warps[f.coords.thread_idx.x / 32].arrived > 0) {
    fail_in_fiber(f, "the thread exited while lanes of its warp wait in __shfl_xor_sync");
  }
  for (;;) park(f);  // a finished fiber is never resumed
}

std::string describe_deadlock() {
  int barrier = 0, shuffle = 0;
  for (const Fiber& f : g_block.fibers) {
    barrier += f.state == State::AtBarrier;
    shuffle += f.state == State::AtShuffle;
  }
  std::ostringstream os;
  os << "kernel " << g_block.kernel->name << " (" << g_block.kernel->entry << ") deadlocks in block "
     << g_block.fibers[0].coords.block_idx.x << ": " << barrier << " threads wait at __syncthreads, " << shuffle
     << " in __shfl_xor_sync, " << g_block.done << " exited";
  return os.str();
}

void run_block(unsigned int b, unsigned int grid) {
  Block& B = g_block;
  B.at_barrier = 0;
  B.done = 0;
  for (Warp& w : B.warps) w.arrived = 0;
  for (int t = 0; t < B.threads; ++t) {
    Fiber& f = B.fibers[static_cast<size_t>(t)];
    f.state = State::Ready;
    f.coords = {{static_cast<unsigned>(t), 0, 0}, {b, 0, 0}, {static_cast<unsigned>(B.threads), 1, 1}, {grid, 1, 1}};
    make_context(&f.ctx, g_stacks + static_cast<size_t>(t) * kStackBytes, kStackBytes, fiber_main);
  }
  // Even blocks run their ready threads in index order, odd blocks in reverse: shared
  // memory read by one thread and written by another with no barrier between them then
  // gives a stale value in one of the two orders, whichever thread is the writer.
  const bool reverse = (b & 1u) != 0;
  for (;;) {
    bool ran = false;
    for (int i = 0; i < B.threads; ++i) {
      Fiber& f = B.fibers[static_cast<size_t>(reverse ? B.threads - 1 - i : i)];
      if (f.state != State::Ready) continue;
      ran = true;
      B.running = &f;
      g_current = &f.coords;
      ++B.switches;
      switch_context(&B.scheduler, &f.ctx);
      if (!B.error.empty()) throw std::runtime_error(B.error);
    }
    if (B.done == B.threads) return;
    if (!ran) throw std::runtime_error(describe_deadlock());
  }
}

void emu_launch(void* slot, void (*call)(void* const*, int), void* const* args, const int64_t* numbers) {
  const EmuKernel& k = *static_cast<const EmuKernel*>(slot);
  const cg::LaunchPlan& p = k.plan;
  if (p.work_items == 0) return;  // as cuda::launch
  std::lock_guard<std::mutex> lock(g_launch_mu);
  if (p.block % 32 != 0 || p.block <= 0 || p.block > kMaxThreads) {
    throw std::runtime_error("kernel " + k.name + ": block of " + std::to_string(p.block) +
                             " threads (CUDA blocks here are 32..1024 threads, a multiple of 32)");
  }
  if (!g_stacks) {
    void* m = mmap(nullptr, kStackBytes * kMaxThreads, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) throw std::runtime_error("cuda_emu: no memory for fiber stacks");
    g_stacks = static_cast<char*>(m);
  }
  std::optional<GuardedBuffers> guarded;
  if (!k.extents.empty()) guarded.emplace(k, args);
  // A split kernel's scratch (Note [Split column reductions]): semaphores zeroed
  // as the host zeroes them, the workspace poisoned so that reading a partial result no
  // block wrote gives NaN (or -1).
  std::vector<unsigned char> scratch;
  std::vector<void*> with_scratch;
  void* const* run_args = guarded ? guarded->args() : args;
  if (p.scratch_bytes > 0) {
    if (k.extents.empty()) {
      throw std::runtime_error("kernel " + k.name + " takes scratch memory: emulate it with bounds (build, not build_source)");
    }
    scratch.assign(static_cast<size_t>(p.scratch_bytes), 0xff);
    std::memset(scratch.data(), 0, static_cast<size_t>(p.semaphore_bytes));
    with_scratch.assign(run_args, run_args + k.extents.size());
    with_scratch.push_back(scratch.data());
    run_args = with_scratch.data();
  }
  // The numbers read at launch follow the scratch pointer, as cuda::launch passes them.
  std::vector<void*> with_numbers;
  if (numbers) {
    with_numbers.assign(run_args, run_args + k.extents.size() + (p.scratch_bytes > 0 ? 1 : 0));
    with_numbers.push_back(const_cast<int64_t*>(numbers));
    run_args = with_numbers.data();
  }
  Block& B = g_block;
  B.kernel = &k;
  B.call = call;
  B.args = run_args;
  B.vec_ok = cg::vector_path_ok(p, args);
  B.threads = p.block;
  B.fibers.resize(static_cast<size_t>(p.block));
  B.warps.resize(static_cast<size_t>(p.block / 32));
  B.error.clear();
  B.switches = 0;
  const int64_t grid = std::min<int64_t>(cg::launch_grid(p, 1), std::max(1, k.options.max_blocks));
  for (int64_t b = 0; b < grid; ++b) run_block(static_cast<unsigned>(b), static_cast<unsigned>(grid));
  if (p.scratch_bytes > 0) {  // every split of every column tile (Column) or row (BlockRow) counted exactly once
    const int64_t semaphores = p.work_items / p.splits;
    for (int64_t t = 0; t < semaphores; ++t) {
      unsigned int count = 0;
      std::memcpy(&count, scratch.data() + t * 4, sizeof count);
      if (count != static_cast<unsigned int>(p.splits)) {
        throw std::runtime_error("kernel " + k.name + " (" + k.entry + "): semaphore " + std::to_string(t) + " counted " +
                                 std::to_string(count) + " of its " + std::to_string(p.splits) + " splits");
      }
    }
  }
  if (guarded) guarded->finish();
  g_launches.fetch_add(1);
  if (B.vec_ok) g_vector_launches.fetch_add(1);
  if (p.strategy == cg::Strategy::Column) g_column_launches.fetch_add(1);
  if (p.splits > 1) g_split_launches.fetch_add(1);
  g_switches.fetch_add(B.switches);
}



const tcap_emu_api kApi{&g_current, emu_syncthreads, emu_shfl_xor, emu_launch};

}  // namespace

const tcap_emu_api& api() { return kApi; }

LaunchCounts launch_counts() {
  LaunchCounts c;
  c.launches = g_launches.load();
  c.vector_launches = g_vector_launches.load();
  c.column_launches = g_column_launches.load();
  c.split_launches = g_split_launches.load();
  c.fiber_switches = g_switches.load();
  return c;
}

}  // namespace tcap::testing::cuda_emu::grid
