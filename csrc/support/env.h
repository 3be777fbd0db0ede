// On/off settings read from the environment: by Config once (support/logging.h), and where
// a switch is read at each use instead (a pass a benchmark turns off around one variant's
// compiles, so that two variants of one run differ by that pass).
#pragma once

namespace tcap {

// An on/off setting: "0", "false" or "off" is off, any other value on, unset (or empty)
// `by_default`. Read at each call.
bool env_switch(const char* name, bool by_default);

}  // namespace tcap
