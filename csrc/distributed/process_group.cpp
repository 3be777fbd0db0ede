// tcap::distributed::init / init_from_env: a Gloo process group over a TCPStore.
//
// Note [Gloo headers from Debian]
// ProcessGroupGloo.hpp includes Gloo's headers, which the LibTorch wheel does not ship;
// the build takes them from Debian's libgloo-dev (cmake/TcapDistributed.cmake). The Gloo
// *code* that runs is the wheel's, inside libtorch_cpu.so: nothing links libgloo.so. That
// is sound as long as tcap calls only what the wheel exports and touches no Gloo type's
// layout inline: ProcessGroupGloo::Options::create (its members are a vector of
// shared_ptrs and an int), createDeviceForHostname, the constructor, and Backend's
// virtual collectives (ProcessGroupGloo's vtable is emitted in libtorch_cpu.so, next to
// its out-of-line destructor). Inline members that reach into Gloo objects (setTimeout,
// GlooStore) are never called from here.
#include <tcap/distributed.h>

#include "distributed/reducer.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <string>

namespace tcap::distributed {

c10::intrusive_ptr<c10d::Backend> init(int rank, int world_size, const std::string& addr, int port,
                                       InitOptions options) {
  TORCH_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "tcap::distributed::init: rank ", rank,
              " is not in [0, ", world_size, ")");
  TORCH_CHECK(port > 0 && port < 65536, "tcap::distributed::init: bad port ", port);
  const auto seconds = static_cast<double>(options.timeout.count()) / 1000.0;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(port);
    so.isServer = rank == 0;
    so.numWorkers = world_size;
    so.waitWorkers = true;
    so.timeout = options.timeout;
    store = c10::make_intrusive<c10d::TCPStore>(addr, so);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "tcap::distributed::init: rank ", rank, " of ", world_size, " could not ",
                rank == 0 ? "serve the rendezvous at " : "reach the rendezvous of rank 0 at ", addr, ":", port,
                " within ", seconds, " s (a rank that never started, or a port in use). Cause: ", message_of(e));
  }
  try {
    auto gloo = c10d::ProcessGroupGloo::Options::create(options.timeout);
    gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(addr));
    gloo->threads = options.threads;
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, gloo);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "tcap::distributed::init: rank ", rank, " of ", world_size,
                " could not connect to every other rank within ", seconds, " s. Cause: ", message_of(e));
  }
}

namespace {
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    TORCH_CHECK(fallback >= 0, "tcap::distributed::init_from_env: ", name,
                " is not set (start the program with tools/launch.sh or torchrun)");
    return fallback;
  }
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  TORCH_CHECK(end != v && *end == '\0', "tcap::distributed::init_from_env: ", name, "=", v, " is not an integer");
  return static_cast<int>(x);
}
}  // namespace

c10::intrusive_ptr<c10d::Backend> init_from_env(InitOptions options) {
  const int rank = env_int("RANK", -1);
  const int world = env_int("WORLD_SIZE", -1);
  const char* addr = std::getenv("MASTER_ADDR");
  const int port = env_int("MASTER_PORT", 29500);
  if (const char* t = std::getenv("TCAP_DIST_TIMEOUT_S"); t != nullptr && *t != '\0') {
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::atof(t) * 1000.0));
  }
  return init(rank, world, addr != nullptr && *addr != '\0' ? addr : "127.0.0.1", port, options);
}

}  // namespace tcap::distributed
