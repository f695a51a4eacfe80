#!/usr/bin/env python3
"""test_doc_commands.py - every `build/flexdiag` command that README.md and models/*/README.md
show runs, from the repository root after the README's build, and so does the shortest form of
each synopsis in README.md's CLI table.

Commands come from the ```sh blocks (a line with `build/flexdiag`, its backslash continuations
joined; in an `a && b` chain the part that runs flexdiag; `mpirun ...` before it dropped: the
one-process run) and from inline `build/flexdiag ...` spans; synopses from the table's first
column, optional [...] parts left out, the first of each (a | b) and a|b alternative taken.
Each runs on the CPU in a temporary folder that has the repository's models/ and build/, with
the flags as written but what CI cannot have rewritten (MODELS, ARCHS, RESOURCES below):
checkpoints that are not in the repository become the golden fixtures or the builtin micro shape
of their family (Lumina-mGPT as a text model: the OPT fixture with a tokenizer, as no Lumina
checkpoint with one is here), full-size shapes their micro shapes, budgets and counts small,
paths to disks and shared file systems temporary folders, the table's placeholders (DIR, FILE,
N, ...) values, and prompt files are made. A flag the line lacks is never added, except --cpu,
fewer steps, images or requests, and micro-janus for bench fidelity's builtin default (its
dense reference and every policy decode 576-token images), so a line that misses a required
flag (as the Lumina text example and the table's text row missed --out) fails here. Every
command must exit 0.
"""
import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(sys.argv[1])
BUILD = os.path.dirname(os.path.abspath(os.environ['FLEXDIAG_BIN']))
JANUS = os.path.join(REPO, 'tests/golden/data/janus')  # a Janus folder: tokenizer, VQ decoder

# What CI cannot have, and what stands for it. Model paths outside the repository:
MODELS = {'/path/to/Janus-Pro-7B-st': ['--model', JANUS],
          '/shared/Janus-Pro-7B-st': ['--model', JANUS],
          '/path/to/Lumina-mGPT-7B-512': ['--arch', 'micro-lumina', '--random-weights']}
TEXT_MODEL = ['--model', 'opt']  # a text model folder: made by make_inputs
ARCHS = {'janus-pro-7b': 'micro-janus', 'janus-pro-1b': 'micro-janus', 'A': 'micro-janus',
         'lumina-mgpt-7b': 'micro-lumina', 'llama-2-7b': 'micro-opt', 'opt-6.7b': 'micro-opt',
         'opt-30b': 'micro-opt', 'opt-175b': 'micro-opt'}
RESOURCES = {'--gpu-mem': '64M', '--cpu-mem': '256M', '--disk-mem': '256M'}
SMALL = {'--images-per-prompt': 2, '--batch': 2, '--micro-batch': 1, '--steps': 2,
         '--requests': 4}
# Placeholders of the table's synopses, by (flag, placeholder), then by flag (the text row's
# --model is TEXT_MODEL).
PLACEHOLDER_AT = {('--out', 'FILE.npy'): 'scores.npy', ('--out', 'FILE.calib'): 'table.calib'}
PLACEHOLDERS = {'--model': JANUS, '--arch': 'micro-janus', '--seed': '1', '--prompt': 'a red apple',
                '--prompts': 'prompts.txt', '--images-per-prompt': '2', '--out': 'out',
                '--max-new-tokens': '4', '--input': os.path.join(JANUS, 'score_input.json'),
                '--tokens': os.path.join(JANUS, 'vq_tokens.npy'), '--policy': 'diagonal',
                '--n-r': '8', '--n-att': '4', '--steps': '16', '--prompt-len': '8',
                '--synthetic': 'grid:4', '--sparsity': '0.5', '--policies': 'dense,window',
                '--sparsities': '0.5', '--batch': '2', '--offload-dir': 'offload',
                '--prompt-ids-file': 'ids.txt', '--logits': 'logits.npy', '--n-cal': '1'}
COMMANDS = ('generate', 'score', 'decode', 'policy-trace', 'bench', 'profile', 'search',
            'requests')
NO_CPU_FLAG = ('policy-trace',)  # commands without --cpu


def doc_files():
    models = os.path.join(REPO, 'models')
    return [os.path.join(REPO, 'README.md')] + sorted(
        os.path.join(models, d, 'README.md') for d in os.listdir(models)
        if os.path.isfile(os.path.join(models, d, 'README.md')))


def sh_lines(text):
    """Logical lines of the ```sh blocks (continuations joined)."""
    out, block, cur = [], False, ''
    for line in text.splitlines():
        if line.startswith('```'):
            block = line.strip() == '```sh' if not block else False
            continue
        if not block:
            continue
        cur += line[:-1] + ' ' if line.endswith('\\') else line
        if not line.endswith('\\'):
            out.append(cur)
            cur = ''
    return out


def flexdiag_part(tokens):
    """The tokens of the flexdiag command in a line's tokens (a segment of an && chain that
    starts with build/flexdiag, or with mpirun and its arguments before it), or None."""
    start = 0
    for i, t in enumerate(tokens + ['&&']):
        if t not in ('&&', ';', '||'):
            continue
        seg, start = tokens[start:i], i + 1
        if seg and seg[0] == 'mpirun':
            seg = seg[next((j for j, x in enumerate(seg) if x.startswith('build/')), 0):]
        if len(seg) > 1 and seg[0] in ('build/flexdiag', 'build/flexdiag-bench') and \
                seg[1] in COMMANDS:
            return seg
    return None


def doc_commands(path):
    text = open(path, encoding='utf-8').read()
    found = []
    for line in sh_lines(text):
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        lex.commenters = '#'
        part = flexdiag_part(list(lex))
        if part:
            found.append((line.strip(), part))
    for span in re.findall(r'`(build/flexdiag[^`]*)`', text):
        part = flexdiag_part(shlex.split(span))
        if part:
            found.append((span, part))
    return found


def drop_optional(s):
    """s without its [...] parts (nested ones too)."""
    out, depth = '', 0
    for ch in s:
        depth += ch == '['
        if depth == 0:
            out += ch
        depth -= ch == ']' and depth > 0
    return out


def synopsis_command(synopsis):
    s = drop_optional(synopsis.replace('\\|', '|'))
    s = re.sub(r'\(([^()|]*)\|[^()]*\)', r'\1', s)  # (a | b): a
    tokens = []
    for t in s.split():
        tokens.append(t.split('|')[0] if '|' in t else t)
    tokens[0] = 'build/' + tokens[0]
    if tokens[1] == 'bench' and len(tokens) > 2 and tokens[2] == 'throughput':
        del tokens[2]
    return tokens


def table_synopses(path):
    out = []
    for line in open(path, encoding='utf-8').read().splitlines():
        m = re.match(r'\| `(flexdiag(?:-bench)? [^`]*)`', line)
        if m:
            out.append((m.group(1), synopsis_command(m.group(1))))
    return out


def is_placeholder(v):
    return v == '…' or re.fullmatch(r'[A-Z][A-Za-z0-9]*(\.[a-z]+)?|Lp|R1,R2', v) is not None


def value_of(flag, v, table, text):
    """What flag v of a documented command becomes (table: a synopsis of the CLI table; text:
    the command continues text)."""
    if flag == '--model' and (v in MODELS or (table and is_placeholder(v))):
        return TEXT_MODEL if text else MODELS.get(v, [flag, JANUS])
    if table and is_placeholder(v):
        return [flag, PLACEHOLDER_AT.get((flag, v), PLACEHOLDERS[flag])]
    if flag == '--arch':
        return [flag, ARCHS.get(v, v)]
    if flag in RESOURCES:
        return [flag, RESOURCES[flag]]
    if flag in SMALL and v.isdigit():
        return [flag, str(min(int(v), SMALL[flag]))]
    if flag == '--offload-dir' or (flag == '--out' and v.startswith('/')):
        return [flag, v.strip('/').replace('/', '_')]  # main() makes the --offload-dir ones
    if flag == '--prompts' and v.startswith('/'):
        return [flag, os.path.basename(v)]
    return [flag, v]


def rewrite(tokens, table=False):
    """The command to run for a documented one (see RESOURCES)."""
    text = '--max-new-tokens' in tokens
    cmd = tokens[:2] if tokens[1] != 'bench' or tokens[2:3] != ['fidelity'] else tokens[:3]
    rest, i = tokens[len(cmd):], 0
    out = []
    while i < len(rest):
        flag = rest[i]
        has_value = i + 1 < len(rest) and not rest[i + 1].startswith('--')
        if has_value:
            out += value_of(flag, rest[i + 1], table, text)
            i += 2
        else:
            out.append(flag)
            i += 1
    sub = cmd[1]
    if sub not in NO_CPU_FLAG and '--cpu' not in out:
        out.append('--cpu')
    if sub == 'bench' and cmd[2:3] != ['fidelity'] and '--steps' not in out:
        out += ['--steps', '2', '--profile-steps', '1']
    if sub == 'requests' and '--requests' not in out:
        out += ['--requests', '4']
    builtin = '--model' not in out and '--arch' not in out
    if cmd[2:3] == ['fidelity'] and builtin and '--synthetic' not in out:
        out += ['--arch', 'micro-janus']
    slow = builtin or 'models/shapes-janus' in out  # 576-token images on the CPU: one each
    if sub == 'generate' and slow and '--images-per-prompt' not in out:
        out += ['--images-per-prompt', '1']
    if sub == 'generate' and slow:
        out[out.index('--images-per-prompt') + 1] = '1'
    return cmd + out


def write_logits(path, heads, steps, prompt_len):
    """A float32 .npy [heads, steps, prompt_len + steps] of policy-trace logits."""
    shape = (heads, steps, prompt_len + steps)
    head = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d, %d), }" % shape
    head += ' ' * (63 - (10 + len(head)) % 64) + '\n'
    n = heads * steps * (prompt_len + steps)
    with open(path, 'wb') as f:
        f.write(b'\x93NUMPY\x01\x00' + len(head).to_bytes(2, 'little') + head.encode())
        f.write(struct.pack('<%df' % n, *[((i * 37) % 11) / 11.0 for i in range(n)]))


def make_inputs(root):
    with open(os.path.join(root, 'prompts.txt'), 'w') as f:  # one prompt each: fewer images
        f.write('a red apple\n')
    with open(os.path.join(root, 'dpg_prompts'), 'w') as f:
        f.write('a1\ta red apple\n')
    with open(os.path.join(root, 'evaluation_metadata.jsonl'), 'w') as f:
        f.write(json.dumps({'tag': 'single_object', 'prompt': 'a red apple'}) + '\n')
    with open(os.path.join(root, 'ids.txt'), 'w') as f:
        f.write('2,5,7\n')
    os.makedirs(os.path.join(root, 'offload'))
    write_logits(os.path.join(root, 'logits.npy'), 1, int(PLACEHOLDERS['--steps']),
                 int(PLACEHOLDERS['--prompt-len']))
    opt = os.path.join(root, 'opt')  # a text model: the golden OPT fixture with a tokenizer
    shutil.copytree(os.path.join(REPO, 'tests/golden/data/opt'), opt)
    shutil.copy(os.path.join(REPO, 'tests/tokenizer/data/mini.json'),
                os.path.join(opt, 'tokenizer.json'))
    os.symlink(os.path.join(REPO, 'models'), os.path.join(root, 'models'))
    os.symlink(BUILD, os.path.join(root, 'build'))


def main():
    runs = []
    for path in doc_files():
        rel = os.path.relpath(path, REPO)
        runs += [(f'{rel}: {line}', rewrite(tokens)) for line, tokens in doc_commands(path)]
    runs += [(f'README.md table: {syn}', rewrite(tokens, table=True))
             for syn, tokens in table_synopses(os.path.join(REPO, 'README.md'))]
    if len(runs) < 20:
        sys.exit(f'FAIL only {len(runs)} commands found in the docs')
    seen, failed = set(), 0
    with tempfile.TemporaryDirectory() as root:
        make_inputs(root)
        env = dict(os.environ, HOME=root, XDG_CACHE_HOME=os.path.join(root, 'cache'))
        for where, cmd in runs:
            if tuple(cmd) in seen:
                continue
            seen.add(tuple(cmd))
            if '--offload-dir' in cmd:
                os.makedirs(os.path.join(root, cmd[cmd.index('--offload-dir') + 1]),
                            exist_ok=True)
            t0 = time.monotonic()
            r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                               timeout=240)
            took = time.monotonic() - t0
            if r.returncode == 0:
                print(f'ok   {took:5.1f} s  {where}')
                continue
            failed += 1
            tail = (r.stderr.strip().splitlines() or [''])[-1]
            print(f'FAIL {took:5.1f} s  {where}\n       ran: {shlex.join(cmd)}\n       '
                  f'exit {r.returncode}: {tail}')
    print(f'{len(seen)} commands, {failed} failed')
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
