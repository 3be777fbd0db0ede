// The on-disk kernel cache shared by the code generators (cpu_llvm, cuda).
//
// Note [Kernel cache files]
// One file per kernel: <cache_dir>/kernels/<key hash>.bin, where the key is the full
// text of the cache key, chosen by the backend: for cpu_llvm the codegen version, libtcap
// build id, LLVM version, target triple, CPU, features, vector width and the kernel IR's
// canonical text without its name; for cuda the codegen version, build id, NVRTC version,
// architecture and the CUDA source. Layout, integers
// little-endian:
//   0  char[8] magic "TCAPKRN\0"
//   8  u32     format version (kFormatVersion)
//  12  u32     header size (64)
//  16  u64     key length      24  u64 object length      32  u64 IR text length
//  40  u64     FNV-1a 64 checksum of bytes [0, 40) and of everything after the header
//  48  u8[16]  zero
//  64  key text, then the ELF object, then the optimised LLVM IR text
// A reader checks the magic, version, header size, that the lengths add up to the file
// size, the checksum and that the stored key equals the wanted key (a hash collision or
// a file copied from another machine); any mismatch makes the file "corrupt": the caller
// logs it, counts it and recompiles, overwriting the file. Files are written to a
// temporary name in the same folder and renamed, so readers never see half a file.
#pragma once

#include "kir/kir.h"

#include <array>
#include <cstdint>
#include <mutex>
#include <string>

namespace tcap::codegen {

// Note [Parallel kernel compilation] (fuse/fusion.h): a backend compiles one cache key at
// a time (a second caller then finds the first one's kernel in its memory cache) and
// different keys in parallel. The lock of a key is one of a few, chosen by its hash.
class KeyLocks {
 public:
  std::mutex& of(const std::string& key) { return locks_[kir::fnv1a(key) % locks_.size()]; }

 private:
  std::array<std::mutex, 16> locks_;
};

struct CacheEntry {
  std::string object;  // machine code: an ELF object (cpu_llvm), a cubin or PTX (cuda)
  std::string ir;      // its source text: optimised LLVM IR (cpu_llvm), CUDA C++ (cuda)
};

enum class CacheRead { Missing, Hit, Corrupt };

// The GNU build id (hex) of the shared object holding tcap's code, "" if it has none.
// Part of the cache key: a rebuilt libtcap.so never loads kernels rendered by an older
// renderer, even if nobody bumped the codegen version.
std::string library_build_id();
std::string cache_file_path(const std::string& cache_dir, const std::string& key_hash);
// Reads and validates a cache file; on Corrupt, *why says what did not match.
CacheRead read_cache_file(const std::string& path, const std::string& key, CacheEntry* out, std::string* why);
// Writes atomically (temporary file + rename); returns false with *why on I/O failure.
bool write_cache_file(const std::string& path, const std::string& key, const CacheEntry& e, std::string* why);

}  // namespace tcap::codegen
