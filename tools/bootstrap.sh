#!/usr/bin/env bash
# tcap bootstrap: installs what a fresh Debian 12 machine lacks, then prints the
# LibTorch CMake prefix on its last line of stdout (everything else goes to stderr).
#
# LibTorch is taken, in order, from: $Torch_DIR, a torch entry in $CMAKE_PREFIX_PATH,
# an importable `torch` of python3 (GPU boxes ship one), or the pinned PyPI wheel
# installed into a cached virtualenv at ${TCAP_CACHE_DIR:-~/.cache/tcap}/venv.
set -euo pipefail
TORCH_VERSION=2.11.0
CACHE="${TCAP_CACHE_DIR:-$HOME/.cache/tcap}"
log() { echo "[bootstrap] $*" >&2; }

# --- Debian packages --------------------------------------------------------
need_pkgs=()
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
if command -v apt-get >/dev/null 2>&1 && [ "${TCAP_SKIP_APT:-0}" != 1 ]; then
  for p in llvm-19-dev libgloo-dev nlohmann-json3-dev googletest libgtest-dev ninja-build graphviz cmake g++ python3-venv ccache; do
    have "$p" || need_pkgs+=("$p")
  done
  if [ ${#need_pkgs[@]} -gt 0 ]; then
    log "installing Debian packages: ${need_pkgs[*]}"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    mkdir -p "$CACHE"
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}"; } \
      >"$CACHE/apt.log" 2>&1 || {
        # Offline machines (GPU boxes) may still have what the build needs; CMake says
        # clearly what is missing if they do not.
        tail -n 5 "$CACHE/apt.log" >&2
        log "warning: apt-get could not install ${need_pkgs[*]} (log: $CACHE/apt.log); continuing"
      }
  fi
fi

# --- LibTorch ---------------------------------------------------------------
torch_prefix=""
if [ -n "${Torch_DIR:-}" ] && [ -f "$Torch_DIR/TorchConfig.cmake" ]; then
  torch_prefix="$Torch_DIR"
fi
if [ -z "$torch_prefix" ] && [ -n "${CMAKE_PREFIX_PATH:-}" ]; then
  IFS=: read -ra parts <<<"$CMAKE_PREFIX_PATH"
  for p in "${parts[@]}"; do
    for c in "$p" "$p/share/cmake/Torch" "$p/Torch"; do
      [ -f "$c/TorchConfig.cmake" ] && { torch_prefix="$c"; break 2; }
    done
  done
fi
py_torch_dir() { "$1" -c 'import torch,os; print(os.path.join(os.path.dirname(torch.__file__),"share","cmake","Torch"))' 2>/dev/null; }
if [ -z "$torch_prefix" ] && [ "${TCAP_USE_SYSTEM_TORCH:-1}" = 1 ]; then
  for py in "${TCAP_PYTHON:-}" /opt/torch/.venv/bin/python3 python3; do
    [ -n "$py" ] && command -v "$py" >/dev/null 2>&1 || continue
    d=$(py_torch_dir "$py" || true)
    if [ -n "$d" ] && [ -f "$d/TorchConfig.cmake" ]; then torch_prefix="$d"; break; fi
  done
fi
if [ -z "$torch_prefix" ]; then
  venv="$CACHE/venv"
  if [ ! -x "$venv/bin/python3" ] || ! "$venv/bin/python3" -c "import torch,sys; sys.exit(torch.__version__.split('+')[0]!='$TORCH_VERSION')" 2>/dev/null; then
    log "installing torch==$TORCH_VERSION into $venv (first time only; several GB)"
    mkdir -p "$CACHE"
    python3 -m venv "$venv" >&2
    "$venv/bin/python3" -m pip install -q --upgrade pip >&2
    "$venv/bin/python3" -m pip install -q --cache-dir "$CACHE/pip" "torch==$TORCH_VERSION" numpy >&2
  fi
  torch_prefix=$(py_torch_dir "$venv/bin/python3")
fi
[ -f "$torch_prefix/TorchConfig.cmake" ] || { log "no LibTorch found"; exit 1; }
log "LibTorch: $torch_prefix"
echo "$torch_prefix"
