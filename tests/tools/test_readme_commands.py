#!/usr/bin/env python3
"""test_readme_commands.py - README.md's set-up command (1) works as root without sudo and as a
user with sudo.

The command is read from the README (the line after "# (1)") and run by /bin/sh and by bash in a
temporary folder whose PATH holds only stubs: apt-get, meson and ninja record their arguments,
build/flexdiag records its own, and in the second case a sudo stub records and runs its
arguments. So the test checks the shell logic of the command (what is called, in which order,
with or without sudo) without installing anything; CI runs the real command as written (.ci/run).
"""
import os
import subprocess
import sys
import tempfile

STUB = '#!/bin/sh\necho "{name} $*" >> "{log}"\n{tail}\n'


def readme_command(readme):
    lines = open(readme, encoding='utf-8').read().splitlines()
    for i, line in enumerate(lines):
        if line.startswith('# (1)'):
            return lines[i + 1]
    sys.exit(f'{readme}: no line after "# (1)"')


def stub(folder, name, log, tail=''):
    path = os.path.join(folder, name)
    with open(path, 'w') as f:
        f.write(STUB.format(name=name, log=log, tail=tail))
    os.chmod(path, 0o755)


def run(cmd, shell, with_sudo):
    with tempfile.TemporaryDirectory() as tmp:
        bin_dir, log = os.path.join(tmp, 'bin'), os.path.join(tmp, 'calls.log')
        os.makedirs(bin_dir)
        os.makedirs(os.path.join(tmp, 'build'))
        for name in ('apt-get', 'meson', 'ninja'):
            stub(bin_dir, name, log)
        stub(os.path.join(tmp, 'build'), 'flexdiag', log)
        if with_sudo:
            stub(bin_dir, 'sudo', log, 'exec "$@"')
        r = subprocess.run([shell, '-c', cmd], cwd=tmp, env={'PATH': bin_dir},
                           capture_output=True, text=True)
        calls = open(log).read().splitlines() if os.path.exists(log) else []
        return r, calls


def check(cmd, shell, with_sudo):
    label = f'{shell}, {"user with sudo" if with_sudo else "root without sudo"}'
    r, calls = run(cmd, shell, with_sudo)
    if r.returncode != 0:
        sys.exit(f'FAIL {label}: exit {r.returncode}: {r.stderr.strip()}')
    apt = [c for c in calls if c.startswith('apt-get ')]
    sudo = [c for c in calls if c.startswith('sudo ')]
    want_sudo = ['sudo ' + c for c in apt] if with_sudo else []
    ok = (len(apt) == 2 and apt[0] == 'apt-get update' and apt[1].startswith('apt-get install -y ')
          and sudo == want_sudo and calls[-1] == 'flexdiag generate --out out'
          and any(c.startswith('meson setup build') for c in calls)
          and any(c.startswith('ninja -C build') for c in calls))
    if not ok:
        sys.exit(f'FAIL {label}: unexpected calls {calls}')
    print(f'ok   {label}: {len(calls)} calls')


def main():
    cmd = readme_command(sys.argv[1])
    for shell in ('/bin/sh', '/bin/bash'):
        for with_sudo in (False, True):
            check(cmd, shell, with_sudo)


if __name__ == '__main__':
    main()
