#include "support/env.h"

#include <cstdlib>
#include <string>

namespace tcap {

bool env_switch(const char* name, bool by_default) {
  const char* v = std::getenv(name);
  if (!v || !*v) return by_default;
  const std::string s(v);
  return s != "0" && s != "false" && s != "off";
}

}  // namespace tcap
