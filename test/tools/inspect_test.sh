#!/usr/bin/env bash
# Tests of the tcap-inspect command-line tool.
#
#   test/tools/inspect_test.sh path/to/tcap-inspect test/golden
#
# Every *.json in the folder (and one level below) must be a valid graph, except files whose names start
# with "bad_" or contain "invalid" (negative fixtures of the JSON tests), which are
# skipped. Checks, for each valid graph: code, table, dot, summary and svg succeed
# with non-empty output; diff of a file with itself exits 0; diff of two graphs with
# different printouts exits 1. Then the error cases: each exits 2 with exactly one
# line on stderr starting with "tcap-inspect: ".
set -u

if [ $# -ne 2 ]; then
  echo "usage: $0 TCAP_INSPECT GRAPH_JSON_DIR" >&2
  exit 2
fi
tool=$1
dir=$2
failures=0
checks=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# run NAME EXPECTED_RC ARGS...: runs the tool, keeps stdout/stderr in $tmp/out, $tmp/err.
run() {
  local name=$1 want=$2
  shift 2
  checks=$((checks + 1))
  timeout 60 "$tool" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne "$want" ]; then
    fail "$name: exit $rc, expected $want (tcap-inspect $*); stderr: $(head -c 300 "$tmp/err")"
    return 1
  fi
  return 0
}

expect_output() {
  local name=$1
  shift
  run "$name" 0 "$@" || return
  [ -s "$tmp/out" ] || fail "$name: empty output (tcap-inspect $*)"
}

# expect_error NAME ARGS...: exit 2 and one stderr line "tcap-inspect: ...".
expect_error() {
  local name=$1
  shift
  run "$name" 2 "$@" || return
  local lines
  lines=$(wc -l <"$tmp/err")
  [ "$lines" -eq 1 ] || fail "$name: stderr has $lines lines, expected 1: $(cat "$tmp/err")"
  head -n1 "$tmp/err" | grep -q '^tcap-inspect: ' ||
    fail "$name: stderr does not start with 'tcap-inspect: ': $(cat "$tmp/err")"
}

[ -x "$tool" ] || { echo "FAIL: $tool is not executable" >&2; exit 1; }

graphs=()
for f in "$dir"/*.json "$dir"/*/*.json; do  # the demo writes compiled graphs to compile/
  [ -e "$f" ] || continue
  case "$(basename "$f")" in
    bad_* | *invalid*) continue ;;
  esac
  graphs+=("$f")
done
if [ ${#graphs[@]} -eq 0 ]; then
  echo "FAIL: no graph JSON files in $dir" >&2
  exit 1
fi

# --- valid files ------------------------------------------------------------------
have_dot=0
command -v dot >/dev/null 2>&1 && have_dot=1
for f in "${graphs[@]}"; do
  b=$(basename "$f")
  expect_output "code $b" code "$f"
  head -n1 "$tmp/out" | grep -q '^graph(' || fail "code $b: printout does not start with 'graph('"
  expect_output "table $b" table "$f"
  head -n1 "$tmp/out" | grep -q '^opcode' || fail "table $b: no header line"
  expect_output "dot $b" dot "$f"
  head -n1 "$tmp/out" | grep -q '^digraph' || fail "dot $b: does not start with 'digraph'"
  expect_output "summary $b" summary "$f"
  if [ $have_dot = 1 ]; then
    expect_output "svg $b" svg "$f"
    if ! head -c 5 "$tmp/out" | grep -q '<?xml' && ! grep -q '<svg' "$tmp/out"; then
      fail "svg $b: output is not SVG"
    fi
    run "svg -o $b" 0 svg -o "$tmp/out.svg" "$f" && { grep -q '<svg' "$tmp/out.svg" || fail "svg -o $b: no SVG written"; }
  else
    expect_error "svg without graphviz $b" svg "$f"
  fi
  expect_output "diff $b itself" diff "$f" "$f"
done

# Two graphs whose printouts differ: diff exits 1.
if [ ${#graphs[@]} -ge 2 ]; then
  a=${graphs[0]}
  for b in "${graphs[@]:1}"; do
    "$tool" code "$a" >"$tmp/a.txt" 2>/dev/null
    "$tool" code "$b" >"$tmp/b.txt" 2>/dev/null
    if ! cmp -s "$tmp/a.txt" "$tmp/b.txt"; then
      run "diff $(basename "$a") $(basename "$b")" 1 diff "$a" "$b" &&
        { grep -q 'first differing' "$tmp/out" || fail "diff: no differing line reported"; }
      break
    fi
  done
fi

# --- errors -------------------------------------------------------------------------
first=${graphs[0]}
size=$(wc -c <"$first")
head -c $((size / 2)) "$first" >"$tmp/truncated.json"
sed -E 's/"format"[[:space:]]*:[[:space:]]*"tcap\.graph"/"format": "nope"/' "$first" >"$tmp/nope.json"
grep -q '"format": "nope"' "$tmp/nope.json" || fail "could not make a wrong-format copy of $first"
sed -E 's/"version"[[:space:]]*:[[:space:]]*1([,}[:space:]])/"version": 99\1/' "$first" >"$tmp/v99.json"
grep -q '"version": 99' "$tmp/v99.json" || fail "could not make a wrong-version copy of $first"

expect_error "missing file" code "$tmp/does-not-exist.json"
expect_error "truncated JSON" code "$tmp/truncated.json"
expect_error "wrong format" summary "$tmp/nope.json"
expect_error "wrong version" table "$tmp/v99.json"
expect_error "a folder" dot "$dir"
expect_error "unknown command" frobnicate "$first"
expect_error "no args"
expect_error "missing file argument" code
expect_error "too many files" code "$first" "$first"
expect_error "diff with one file" diff "$first"
expect_error "diff with a bad file" diff "$first" "$tmp/truncated.json"
expect_error "unknown option" code --frob "$first"
run "--help" 0 --help && { grep -q 'usage: tcap-inspect' "$tmp/out" || fail "--help: no usage text"; }

# expect_error_with NAME TEXT ARGS...: expect_error, and stderr contains TEXT.
expect_error_with() {
  local name=$1 text=$2
  shift 2
  expect_error "$name" "$@" && { grep -qF -- "$text" "$tmp/err" || fail "$name: stderr lacks '$text': $(cat "$tmp/err")"; }
}

# Special files are refused before anything is read (/dev/zero grew without bound, a
# FIFO blocked).
expect_error_with "a device" "it is a character device, not a regular file" code /dev/zero
mkfifo "$tmp/fifo"
expect_error_with "a FIFO" "it is a FIFO, not a regular file" code "$tmp/fifo"
expect_error_with "a folder says so" "it is a directory, not a regular file" summary "$dir"

# Files over TCAP_MAX_GRAPH_MB are refused, by size, before they are read.
head -c $((2 * 1024 * 1024)) /dev/zero | tr '\0' ' ' >"$tmp/big.json"
export TCAP_MAX_GRAPH_MB=1
expect_error_with "over the size limit" "over the limit of 1048576 (raise it with TCAP_MAX_GRAPH_MB" code "$tmp/big.json"
unset TCAP_MAX_GRAPH_MB

# Control characters in a graph (an escape sequence that clears the terminal) are
# escaped in the output and in error messages.
esc=$(printf '\033')
sed -E 's/"schemas"[[:space:]]*:[[:space:]]*\{/"schemas": {"\\u001b[2J": 1, /' "$first" >"$tmp/esc_key.json"
expect_error_with "escape in a key" 'schemas["\u001b[2J"]: expected a string' code "$tmp/esc_key.json"
grep -q "$esc" "$tmp/err" && fail "escape in a key: raw ESC on stderr"
sed -E '0,/"name"[[:space:]]*:[[:space:]]*"[^"]*"/s//"name": "x\\u001b[2Jy"/' "$first" >"$tmp/esc_name.json"
if grep -q 'u001b' "$tmp/esc_name.json"; then
  for cmd in table dot summary code; do
    run "escape in a name ($cmd)" 0 "$cmd" "$tmp/esc_name.json" || continue
    grep -q "$esc" "$tmp/out" && fail "escape in a name ($cmd): raw ESC in the output"
  done
  grep -qF 'x\x1b[2Jy' "$tmp/out" || fail "escape in a name: no \\x1b in the printout"
else
  fail "could not put an escape into an input name of $first"
fi

if [ $failures -ne 0 ]; then
  echo "inspect_test: $failures failure(s) in $checks checks" >&2
  exit 1
fi
echo "inspect_test: all $checks checks passed (${#graphs[@]} graphs)"
