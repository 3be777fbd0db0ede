// The byte writer of compiled autograd's backward key (Note [The backward key],
// walk.cpp), shared by the walk and the generated nodes' field visitor (node_fields.h).
// Internal to autograd/.
#pragma once

#include <c10/macros/Macros.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace tcap::ca {

// Appends to the key without a library call per field (the walk writes a few dozen
// fields per node; see the lookup_us benchmark). The buffer only grows, so a walk that
// reuses a BackwardWalk neither allocates nor clears it.
class KeyWriter {
 public:
  explicit KeyWriter(std::string& buf) : buf_(buf), data_(buf.data()), cap_(buf.size()) {}
  // Inlined into each put (GCC stops inlining it once the file is large): a call per field
  // costs more than the write.
  C10_ALWAYS_INLINE void write(const void* p, size_t n) {
    if (C10_UNLIKELY(len + n > cap_)) grow(len + n);
    std::memcpy(data_ + len, p, n);
    len += n;
  }
  const char* data() const { return data_; }
  size_t len = 0;

 private:
  C10_NOINLINE void grow(size_t need) {
    buf_.resize(std::max(buf_.size() * 2, need + 4096));
    data_ = buf_.data();
    cap_ = buf_.size();
  }
  std::string& buf_;
  char* data_;
  size_t cap_;
};
template <class T>
C10_ALWAYS_INLINE void put(KeyWriter& key, const T& v) {
  key.write(&v, sizeof(T));
}

}  // namespace tcap::ca
