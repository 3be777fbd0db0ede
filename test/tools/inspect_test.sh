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
  "$tool" "$@" >"$tmp/out" 2>"$tmp/err"
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

if [ $failures -ne 0 ]; then
  echo "inspect_test: $failures failure(s) in $checks checks" >&2
  exit 1
fi
echo "inspect_test: all $checks checks passed (${#graphs[@]} graphs)"
