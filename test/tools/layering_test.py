#!/usr/bin/env python3
"""The layering check (docs/architecture.md, "Layering"): each stage of csrc/ can include
from its own folder and from the folders of the stages it depends on, and from no other.

Usage: layering_test.py SOURCE_DIR BUILD_DIR

Reads the stages from BUILD_DIR/csrc/views/stages.txt (written by cmake/TcapStages.cmake)
and each stage's compile command from BUILD_DIR/compile_commands.json, so the probes see
exactly the include path the stage's own sources are compiled with. Two checks:

1. For every stage and every stage folder, a probe asks __has_include("<folder>/<a
   header of it>"): it must be true exactly when the stage may include from the folder.
2. A real upward include: the fuse stage compiling `#include "<its header>"` followed by
   a header of a stage above it must fail with "No such file or directory", and the
   same file without the upward include must compile.
3. Rules of the architecture, beyond "no upward include": compiled autograd cannot reach
   compile_step (`step/`), and tcap::compile (`aot/`) cannot either; the compile pipeline
   (`compiler/`) sees no front door. Checked the same way as 2, on those stages' real
   compile commands.
"""
import json
import os
import shlex
import subprocess
import sys
import tempfile


def stage_command(commands, source):
    """The compile command of `source` as an argument list, producing nothing."""
    for entry in commands:
        if os.path.realpath(entry["file"]) == os.path.realpath(source):
            args = entry.get("arguments") or shlex.split(entry["command"])
            break
    else:
        raise SystemExit(f"layering_test: {source} is not in compile_commands.json")
    if os.path.basename(args[0]) == "ccache":
        args = args[1:]
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-o", "-MT", "-MF", "-MQ"):
            skip = True
        elif a in ("-c", "-MD", "-MMD") or os.path.realpath(a) == os.path.realpath(source):
            continue
        else:
            out.append(a)
    return out + ["-fsyntax-only"], entry["directory"]


def compiles(command, cwd, text, scratch):
    probe = os.path.join(scratch, "probe.cpp")
    with open(probe, "w") as f:
        f.write(text)
    r = subprocess.run(command + [probe], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return r.returncode == 0, r.stdout


def main():
    csrc, build = os.path.join(sys.argv[1], "csrc"), sys.argv[2]
    csrc_views = os.path.join(build, "csrc", "views")
    stages = []
    with open(os.path.join(csrc_views, "stages.txt")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, folder, allowed, source = line.rstrip("\n").split("|")
            stages.append((name, folder, allowed.split(","), source))
    with open(os.path.join(build, "compile_commands.json")) as f:
        commands = json.load(f)
    header = {}
    for _, folder, _, _ in stages:
        names = sorted(n for n in os.listdir(os.path.join(csrc, folder)) if n.endswith(".h"))
        if names:
            header[folder] = f"{folder}/{names[0]}"

    failures = []
    checked = 0
    with tempfile.TemporaryDirectory() as scratch:
        # 1. Visibility of every stage folder from every stage.
        for name, folder, allowed, source in stages:
            command, cwd = stage_command(commands, source)
            for other, h in header.items():
                text = f'#if !__has_include("{h}")\n#error "{h} is not visible"\n#endif\n'
                visible, _ = compiles(command, cwd, text, scratch)
                checked += 1
                if visible != (other in allowed):
                    failures.append(f"{name}: {h} is {'visible' if visible else 'hidden'}, but {other}/ is "
                                    f"{'not ' if other not in allowed else ''}a folder it may include from")
        def expect_missing(stage, other_header, what):
            """stage's own header, then other_header: must fail with "No such file or directory"."""
            name, folder, _, source = stage
            command, cwd = stage_command(commands, source)
            ok, log = compiles(command, cwd, f'#include "{header[folder]}"\n#include "{other_header}"\n', scratch)
            if ok or f"{other_header}: No such file or directory" not in log:
                failures.append(f"{name}: {what} {other_header} {'compiled' if ok else 'failed for another reason'}:\n{log}")
            else:
                print(f"{name}: #include \"{other_header}\" fails: No such file or directory ({what})")

        # 2. A real upward include fails to compile; the same file without it compiles.
        fuse = next((s for s in stages if s[0] == "tcap_fuse"), None)
        if fuse:
            name, folder, allowed, source = fuse
            command, cwd = stage_command(commands, source)
            ok, log = compiles(command, cwd, f'#include "{header[folder]}"\n', scratch)
            if not ok:
                failures.append(f"{name}: {header[folder]} alone does not compile:\n{log}")
            for upper in (s for s in stages if s[1] not in allowed and s[1] in header):
                expect_missing(fuse, header[upper[1]], "an upward include of")
                checked += 1
        # 3. Named rules: (stage, folder it must not see).
        by_name = {s[0]: s for s in stages}
        for stage, forbidden in (("tcap_autograd", "step"), ("tcap_aot", "step"), ("tcap_compiler", "aot"),
                                 ("tcap_compiler", "step"), ("tcap_compiler", "autograd")):
            if stage not in by_name or forbidden not in header:
                failures.append(f"rule {stage} -/-> {forbidden}/: the stage or the folder does not exist")
                continue
            expect_missing(by_name[stage], header[forbidden], "the rule's include of")
            checked += 1
    for f in failures:
        print("FAIL", f)
    print(f"layering_test: {len(stages)} stages, {checked} probes, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
