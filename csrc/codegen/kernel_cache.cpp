#include "codegen/kernel_cache.h"

#include "kir/kir.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include <elf.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

namespace tcap::codegen {

namespace {

constexpr char kMagic[8] = {'T', 'C', 'A', 'P', 'K', 'R', 'N', '\0'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderSize = 64;
constexpr size_t kChecksummedHeader = 40;

template <typename T>
void put(std::string& s, size_t at, T v) {
  std::memcpy(&s[at], &v, sizeof v);
}

template <typename T>
T get(const std::string& s, size_t at) {
  T v{};
  std::memcpy(&v, &s[at], sizeof v);
  return v;
}

// mkdir -p. POSIX rather than std::filesystem: LibTorch exports its own (partly broken)
// copies of the std::filesystem symbols, which win the dynamic symbol lookup.
bool make_dirs(const std::string& dir, std::string* why) {
  for (size_t at = 1; at <= dir.size(); ++at) {
    if (at < dir.size() && dir[at] != '/') continue;
    const std::string prefix = dir.substr(0, at);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      *why = "cannot create " + prefix + ": " + std::strerror(errno);
      return false;
    }
  }
  return true;
}

// FNV-1a of the file without header bytes [kChecksummedHeader, kHeaderSize) (the checksum
// field itself and what follows it in the header).
uint64_t checksum(const std::string& file) {
  const uint64_t head = kir::fnv1a(file.data(), std::min(file.size(), kChecksummedHeader));
  if (file.size() <= kHeaderSize) return head;
  return kir::fnv1a(file.data() + kHeaderSize, file.size() - kHeaderSize, head);
}


struct BuildIdSearch {
  uintptr_t addr = 0;
  std::string id;
};

// dl_iterate_phdr callback: for the object whose PT_LOAD segments contain search->addr,
// hex-encodes the NT_GNU_BUILD_ID note and stops.
int find_build_id(dl_phdr_info* info, size_t, void* data) {
  auto* search = static_cast<BuildIdSearch*>(data);
  bool contains = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    contains = contains || (ph.p_type == PT_LOAD && search->addr >= lo && search->addr < lo + ph.p_memsz);
  }
  if (!contains) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const size_t align = ph.p_align == 8 ? 8 : 4;
    auto pad = [align](size_t n) { return (n + align - 1) & ~(align - 1); };
    const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
    const char* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const auto* note = reinterpret_cast<const ElfW(Nhdr)*>(p);
      const char* name = p + sizeof(ElfW(Nhdr));
      const unsigned char* desc = reinterpret_cast<const unsigned char*>(name + pad(note->n_namesz));
      if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
        static const char* hex = "0123456789abcdef";
        for (size_t b = 0; b < note->n_descsz; ++b) {
          search->id += hex[desc[b] >> 4];
          search->id += hex[desc[b] & 15];
        }
        return 1;
      }
      p = reinterpret_cast<const char*>(desc) + pad(note->n_descsz);
    }
  }
  return 1;
}

}  // namespace

std::string library_build_id() {
  static const std::string id = [] {
    BuildIdSearch search;
    search.addr = reinterpret_cast<uintptr_t>(&find_build_id);
    dl_iterate_phdr(&find_build_id, &search);
    return search.id;
  }();
  return id;
}

std::string cache_file_path(const std::string& cache_dir, const std::string& key_hash) {
  return cache_dir + "/kernels/" + key_hash + ".bin";
}

CacheRead read_cache_file(const std::string& path, const std::string& key, CacheEntry* out, std::string* why) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return CacheRead::Missing;
  std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto corrupt = [&](const char* what) {
    *why = what;
    return CacheRead::Corrupt;
  };
  if (file.size() < kHeaderSize) return corrupt("shorter than the header (truncated)");
  if (std::memcmp(file.data(), kMagic, sizeof kMagic) != 0) return corrupt("bad magic");
  if (get<uint32_t>(file, 8) != kFormatVersion) return corrupt("other format version");
  if (get<uint32_t>(file, 12) != kHeaderSize) return corrupt("bad header size");
  const uint64_t key_len = get<uint64_t>(file, 16);
  const uint64_t obj_len = get<uint64_t>(file, 24);
  const uint64_t ir_len = get<uint64_t>(file, 32);
  const uint64_t payload = file.size() - kHeaderSize;
  if (key_len > payload || obj_len > payload || ir_len > payload || key_len + obj_len + ir_len != payload) {
    return corrupt("lengths do not match the file size (truncated or extended)");
  }
  if (get<uint64_t>(file, 40) != checksum(file)) return corrupt("checksum mismatch");
  if (file.compare(kHeaderSize, key_len, key) != 0 || key_len != key.size()) return corrupt("written for another key");
  if (obj_len == 0) return corrupt("empty object");
  out->object = file.substr(kHeaderSize + key_len, obj_len);
  out->ir = file.substr(kHeaderSize + key_len + obj_len, ir_len);
  return CacheRead::Hit;
}

bool write_cache_file(const std::string& path, const std::string& key, const CacheEntry& e, std::string* why) {
  std::string file(kHeaderSize, '\0');
  std::memcpy(&file[0], kMagic, sizeof kMagic);
  put<uint32_t>(file, 8, kFormatVersion);
  put<uint32_t>(file, 12, static_cast<uint32_t>(kHeaderSize));
  put<uint64_t>(file, 16, key.size());
  put<uint64_t>(file, 24, e.object.size());
  put<uint64_t>(file, 32, e.ir.size());
  file += key;
  file += e.object;
  file += e.ir;
  put<uint64_t>(file, 40, checksum(file));

  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0 && !make_dirs(path.substr(0, slash), why)) return false;
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(file.data(), static_cast<std::streamsize>(file.size()));
    out.close();
    if (!out) {
      *why = "cannot write " + tmp;
      ::unlink(tmp.c_str());
      return false;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    *why = "cannot rename " + tmp + " to " + path + ": " + std::strerror(errno);
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace tcap::codegen
