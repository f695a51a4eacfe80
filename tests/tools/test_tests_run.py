#!/usr/bin/env python3
"""test_tests_run.py - tests/run says what it is doing: a line before each stage (configure,
build, test) naming the build folder, and one when it ends, in the order the stages run.

tests/run is copied into a temporary tree and run with stub meson and ninja on the PATH (they
record their arguments and make build.ninja), so only the script's own logic runs; the first
pass configures both folders, the second finds them configured and only builds and tests.
"""
import os
import shutil
import subprocess
import sys
import tempfile

STUB = '''#!/bin/sh
echo "{name} $*" >> "{log}"
if [ "$1" = setup ]; then mkdir -p "$2" && touch "$2/build.ninja"; fi
'''

FIRST = ['configure build/', 'configured build/', 'build build/', 'built build/', 'test build/',
         'tested build/', 'configure build-asan/', 'configured build-asan/',
         'build build-asan/', 'built build-asan/', 'test build-asan/', 'tested build-asan/']


def stub(folder, name, log):
    path = os.path.join(folder, name)
    with open(path, 'w') as f:
        f.write(STUB.format(name=name, log=log))
    os.chmod(path, 0o755)


def run_once(root, env):
    r = subprocess.run(['bash', os.path.join(root, 'tests', 'run')], cwd=root, env=env,
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        sys.exit(f'FAIL tests/run exited {r.returncode}: {r.stdout} {r.stderr}')
    return [l[len('tests/run: '):] for l in r.stdout.splitlines() if l.startswith('tests/run: ')]


def check_order(lines, want, label):
    at = 0
    for w in want:
        while at < len(lines) and not lines[at].startswith(w):
            at += 1
        if at == len(lines):
            sys.exit(f'FAIL {label}: no line "tests/run: {w}..." in order; got {lines}')
        at += 1
    print(f'ok   {label}: {len(lines)} stage lines')


def main():
    script = sys.argv[1]
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, 'tests'))
        shutil.copy(script, os.path.join(root, 'tests', 'run'))
        bin_dir, log = os.path.join(root, 'bin'), os.path.join(root, 'calls.log')
        os.makedirs(bin_dir)
        for name in ('meson', 'ninja'):
            stub(bin_dir, name, log)
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get('PATH', ''))
        first = run_once(root, env)
        check_order(first, FIRST, 'first run')
        if not any('build.build.log' in l for l in first):
            sys.exit(f'FAIL the build line names no log: {first}')
        again = run_once(root, env)
        check_order(again, [w for w in FIRST if 'configure' not in w], 'second run')
        if any(l.startswith('configure') for l in again):
            sys.exit(f'FAIL configured folders were configured again: {again}')
        calls = open(log).read()
        if 'ninja -C build-asan' not in calls or 'meson test -C build ' not in calls:
            sys.exit(f'FAIL unexpected calls: {calls}')


if __name__ == '__main__':
    main()
