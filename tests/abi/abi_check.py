#!/usr/bin/env python3
"""abi_check.py - the built libflexdiag.so against the ABI baseline in abi/ (docs/abi.md).

    abi_check.py HEADER BASELINE LIBRARY            check (exit 0 ok, 1 broken, 77 no abidiff)
    abi_check.py --update HEADER BASELINE LIBRARY   write LIBRARY's ABI as the new BASELINE
    abi_check.py --versions HEADER DOCS VERSION     the versions agree with docs/abi.md §2

The library carries CTF type information (-gctf, meson.build), which abidw and abidiff read
with --ctf. What may change is read from include/flexdiag.h:
  - opaque handles (`typedef struct flexdiag_x flexdiag_x;`): defined inside the library and
    reached by callers only through pointers, so their insides (and every internal type below
    them) may change at will;
  - structs whose first member is `uint32_t struct_size`: they may grow by members appended at
    their end, the struct_size rule of docs/abi.md;
  - functions may be added (--no-added-syms), enumerators appended (abidiff calls that harmless).
Everything else abidiff reports fails the check: a removed function, a changed signature or
return type, a changed enumerator value, any change of a struct without struct_size
(flexdiag_output, flexdiag_stats), a member of a struct_size struct changed, moved or removed.

Two passes, because libabigail's has_data_member_inserted_at suppression also hides a changed
member type (or a member appended to an embedded struct) in the struct it names: (1) abidiff's
whole report, with the opaque handles and the end-appends of the struct_size structs
suppressed, must be empty; (2) every member of a struct_size struct in the baseline is still
there, under its name, at its offset, with its type, and every new member lies past the
baseline's last one (abidw's XML of both, compared here).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ABIDW = ['abidw', '--ctf', '--no-corpus-path', '--no-comp-dir-path', '--no-elf-needed']
ABIDIFF = ['abidiff', '--ctf', '--no-added-syms']


def public_types(header):
    """(opaque handle names, struct_size struct names) declared by the public header."""
    text = open(header, encoding='utf-8').read()
    opaque = re.findall(r'typedef struct (flexdiag_\w+) \1;', text)
    sized = re.findall(r'typedef struct (flexdiag_\w+) \{\s*uint32_t struct_size;', text)
    if not opaque or not sized:
        sys.exit(f'FAIL {header}: found no opaque handles or struct_size structs')
    return opaque, sized


def suppressions(opaque, sized):
    names = '|'.join(opaque)
    rules = [f'[suppress_type]\n  label = opaque handles\n  type_kind = struct\n'
             f'  name_regexp = ^({names})$\n']
    for s in sized:
        rules.append(f'[suppress_type]\n  label = {s} grows at its end\n  type_kind = struct\n'
                     f'  name = {s}\n  has_data_member_inserted_at = end\n')
    return '\n'.join(rules)


def abidiff(args):
    r = subprocess.run(ABIDIFF + args, capture_output=True, text=True)
    if r.returncode & 3:  # bit 0: tool error, bit 1: usage error
        sys.exit(f'FAIL abidiff {" ".join(args)} exited {r.returncode}:\n{r.stdout}{r.stderr}')
    return r.returncode, r.stdout


class Corpus:
    """The types of an abidw XML corpus, each spelled as C would (typedefs by name)."""

    def __init__(self, path):
        self.by_id = {e.get('id'): e for e in ET.parse(path).iter() if e.get('id')}

    def spell(self, tid):
        e = self.by_id.get(tid)
        if e is None:
            return f'<{tid}>'
        tag, ref = e.tag, e.get('type-id')
        if tag in ('type-decl', 'typedef-decl', 'enum-decl'):
            return e.get('name')
        if tag in ('class-decl', 'union-decl'):
            return ('struct ' if tag == 'class-decl' else 'union ') + e.get('name', '')
        if tag == 'pointer-type-def':
            return self.spell(ref) + ' *'
        if tag == 'qualified-type-def':
            return ('const ' if e.get('const') == 'yes' else 'volatile ') + self.spell(ref)
        if tag == 'array-type-def':
            return self.spell(ref) + ''.join(f"[{r.get('length')}]" for r in e.iter('subrange'))
        if tag == 'function-type':
            args = ', '.join(self.spell(a.get('type-id')) for a in e.iter('parameter'))
            return f"{self.spell(e.find('return').get('type-id'))} (*)({args})"
        return f'<{tag}>'

    def members(self, name):
        """[(offset in bits, member name, type)] of struct name, or None when it has none."""
        for e in self.by_id.values():
            if e.tag == 'class-decl' and e.get('name') == name and e.find('data-member') is not None:
                return [(int(m.get('layout-offset-in-bits')), m.find('var-decl').get('name'),
                         self.spell(m.find('var-decl').get('type-id')))
                        for m in e.findall('data-member')]
        return None


def grown_only(name, old, new):
    """None when struct name kept its baseline members (old) and added members past them only;
    else what changed."""
    if new is None:
        return f'{name}: no longer in the library'
    if new[:len(old)] != old:
        diff = next(f'{o} -> {n}' for o, n in zip(old + [None] * len(new), new + [None] * len(old))
                    if o != n)
        return f'{name}: member (offset, name, type) {diff}'
    return None


def check_members(sized, baseline, library):
    with tempfile.NamedTemporaryFile(suffix='.abi', delete=False) as f:
        current = f.name
    try:
        r = subprocess.run(ABIDW + ['--out-file', current, library], capture_output=True, text=True)
        if r.returncode:
            sys.exit(f'FAIL abidw {library}: {r.stderr}')
        old, new = Corpus(baseline), Corpus(current)
    finally:
        os.unlink(current)
    grown, bad = [], []
    for name in sized:
        before, after = old.members(name), new.members(name)
        if before is None:  # a struct newer than the baseline
            continue
        msg = grown_only(name, before, after)
        if msg:
            bad.append(msg)
        elif len(after) > len(before):
            grown.append(f'{name} +{len(after) - len(before)}')
    if bad:
        sys.exit('FAIL a struct_size struct changed other than at its end (docs/abi.md):\n  ' +
                 '\n  '.join(bad))
    return grown


def check(header, baseline, library):
    opaque, sized = public_types(header)
    with tempfile.NamedTemporaryFile('w', suffix='.suppr', delete=False) as f:
        f.write(suppressions(opaque, sized))
    try:
        rc, report = abidiff(['--suppressions', f.name, baseline, library])
    finally:
        os.unlink(f.name)
    if rc:
        print(report)
        sys.exit(f'FAIL {library} breaks the ABI of {baseline} (abidiff exit {rc}; docs/abi.md)')
    grown = check_members(sized, baseline, library)
    print(f'ok: {library} keeps the ABI of {baseline}: {len(opaque)} opaque handles, '
          f'{len(sized)} struct_size structs (grown: {", ".join(grown) or "none"})')


def update(baseline, library):
    r = subprocess.run(ABIDW + ['--out-file', baseline, library], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f'FAIL abidw {library}: {r.stderr}')
    print(f'wrote {baseline} from {library}')


def versions(header, docs, version):
    """The header's API version is in its change list and in the row of docs/abi.md's version
    table for the library version, which names the soname of its major version."""
    text = open(header, encoding='utf-8').read()
    m = re.search(r'#define FLEXDIAG_API_VERSION (\d+)u', text)
    if not m:
        sys.exit(f'FAIL {header}: no FLEXDIAG_API_VERSION')
    api = int(m.group(1))
    if not re.search(rf'\b{api}: ', text[:m.start()]):
        sys.exit(f'FAIL {header}: the change list above FLEXDIAG_API_VERSION does not name '
                 f'API version {api} ("{api}: what it added")')
    rows = re.findall(r'^\| (\d+\.\d+\.\d+) \| (\d+)(?: … (\d+))? \| (\S+) \|$',
                      open(docs, encoding='utf-8').read(), re.M)
    row = next((r for r in rows if r[0] == version), None)
    soname = f'libflexdiag.so.{version.split(".")[0]}'
    if not row:
        sys.exit(f'FAIL {docs}: §2\'s table has no row for version {version} (API version {api}): '
                 f'a new API version raises the minor version in meson.build and adds its row')
    low, high = int(row[1]), int(row[2] or row[1])
    if not low <= api <= high or row[3] != soname:
        sys.exit(f'FAIL {docs}: version {version} is API version {row[1]}{" … " + row[2] if row[2] else ""}'
                 f' and {row[3]} there, but the header is API version {api} and the soname '
                 f'{soname}: raise the minor version with the API version (docs/abi.md §2)')
    print(f'ok: version {version}, API version {api}, {soname} agree with {docs}')


def main():
    args = sys.argv[1:]
    mode = args.pop(0) if args[:1] in (['--update'], ['--versions']) else None
    if len(args) != 3:
        sys.exit(__doc__)
    if mode == '--versions':
        versions(*args)
        return
    if not shutil.which('abidiff') or not shutil.which('abidw'):
        print('abidiff/abidw not installed (Debian: abigail-tools): skipped', file=sys.stderr)
        sys.exit(77)
    header, baseline, library = args
    if mode == '--update':
        update(baseline, library)
    else:
        check(header, baseline, library)


if __name__ == '__main__':
    main()
