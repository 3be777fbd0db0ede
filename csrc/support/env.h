// Settings read from the environment where they are used, rather than once into Config
// (support/logging.h): a switch a benchmark turns off around one variant's compiles, so
// that two variants of one run differ by one pass.
#pragma once

namespace tcap {

// An on/off setting: "0", "false" or "off" is off, any other value on, unset (or empty)
// `by_default`. Read at each call.
bool env_switch(const char* name, bool by_default);

}  // namespace tcap
