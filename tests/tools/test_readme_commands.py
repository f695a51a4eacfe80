#!/usr/bin/env python3
"""test_readme_commands.py - README.md's set-up command (1) works as root without sudo and as a
user with sudo, with and without an npm already on the PATH.

The command is read from the README (the line after "# (1)") and run by /bin/sh and by bash in a
temporary folder whose PATH holds only stubs: apt-get, meson, ninja and npm record their
arguments, build/flexdiag records its own, and in the sudo cases a sudo stub records and runs its
arguments. Without npm at the start (Debian's nodejs), the apt-get stub puts the npm stub on the
PATH when it installs npm; with one (a Node.js that bundles npm) apt-get must not install
Debian's, which conflicts. So the test checks the shell logic of the command (what is called, in
which order, with or without sudo: npm ci as the user) without installing anything; CI runs the
real command as written (.ci/run).
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


def run(cmd, shell, with_sudo, with_npm):
    with tempfile.TemporaryDirectory() as tmp:
        bin_dir, log = os.path.join(tmp, 'bin'), os.path.join(tmp, 'calls.log')
        pkg_dir = os.path.join(tmp, 'pkg')  # what the apt-get stub installs
        for d in (bin_dir, pkg_dir, os.path.join(tmp, 'build')):
            os.makedirs(d)
        for name in ('meson', 'ninja'):
            stub(bin_dir, name, log)
        stub(bin_dir, 'apt-get', log,
             f'case " $* " in *" npm "*) /bin/cp "{pkg_dir}/npm" "{bin_dir}";; esac')
        stub(bin_dir if with_npm else pkg_dir, 'npm', log)
        stub(os.path.join(tmp, 'build'), 'flexdiag', log)
        if with_sudo:
            stub(bin_dir, 'sudo', log, 'exec "$@"')
        r = subprocess.run([shell, '-c', cmd], cwd=tmp, env={'PATH': bin_dir},
                           capture_output=True, text=True)
        calls = open(log).read().splitlines() if os.path.exists(log) else []
        return r, calls


def check(cmd, shell, with_sudo, with_npm):
    label = (f'{shell}, {"user with sudo" if with_sudo else "root without sudo"}, '
             f'{"npm on the PATH" if with_npm else "no npm"}')
    r, calls = run(cmd, shell, with_sudo, with_npm)
    if r.returncode != 0:
        sys.exit(f'FAIL {label}: exit {r.returncode}: {r.stderr.strip()}')
    apt = [c for c in calls if c.startswith('apt-get ')]
    sudo = [c for c in calls if c.startswith('sudo ')]
    want_sudo = ['sudo ' + c for c in apt] if with_sudo else []
    npm = [i for i, c in enumerate(calls) if c.startswith('npm ')]
    meson = [i for i, c in enumerate(calls) if c.startswith('meson setup build')]
    ok = (len(apt) == (2 if with_npm else 3) and apt[0] == 'apt-get update'
          and apt[1].startswith('apt-get install -y ') and 'nodejs' in apt[1].split()
          and 'npm' not in apt[1].split()
          and apt[2:] in ([], ['apt-get install -y --no-install-recommends npm'])
          and sudo == want_sudo and calls[-1] == 'flexdiag generate --out out'
          and len(npm) == 1 and calls[npm[0]].startswith('npm ci --prefix tests/cli/openai_client')
          and meson and calls.index(apt[-1]) < npm[0] < meson[0]
          and any(c.startswith('ninja -C build') for c in calls))
    if not ok:
        sys.exit(f'FAIL {label}: unexpected calls {calls}')
    print(f'ok   {label}: {len(calls)} calls')


def main():
    cmd = readme_command(sys.argv[1])
    for shell in ('/bin/sh', '/bin/bash'):
        for with_sudo in (False, True):
            for with_npm in (False, True):
                check(cmd, shell, with_sudo, with_npm)


if __name__ == '__main__':
    main()
