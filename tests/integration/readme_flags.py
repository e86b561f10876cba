#!/usr/bin/env python3
"""readme_flags.py DTRUN README.md - every flag a `dtrun ...` line of the README uses
(its code blocks, and inline code that is a dtrun command line) is listed by the
--help of the command it belongs to (launch flags: dtrun --help; after a subcommand:
that subcommand's), and that --help exits 0. Prints "ok: ..." or "BAD: ..." per
command (test_first_use.sh turns them into PASS/FAIL)."""
import re, subprocess, sys
dtrun = sys.argv[1]; readme = sys.argv[2]
SUBS = ['plan','sample','export','tokenize','report','trace','config','debug','store','check']
text = open(readme).read()
blocks = re.findall(r'```\n(.*?)```', text, re.S)
lines = []
for b in blocks:
    # join continuation lines
    b = re.sub(r'\\\n\s*', ' ', b)
    lines += b.split('\n')
# inline code that is a dtrun command line
lines += [m for m in re.findall(r'`((?:\./)?dtrun [^`]*)`', re.sub(r'```.*?```', '', text, flags=re.S))]
BOOL = {'--standalone', '--print-config', '--print_config', '--no-preflight', '--no_preflight', '--no-python',
        '--no_python', '--help', '--version', '-h'}
need = {}  # help command -> set of flags
for ln in lines:
    ln = ln.split('#')[0]
    for m in re.finditer(r'(?:^|[\s;&|(])(?:\./)?dtrun((?:\s+\S+)*)', ln):
        toks = m.group(1).split()
        where = 'main'; i = 0
        while i < len(toks):
            t = toks[i]
            if t in ('&&', '|', ';', '&', '>', '2>&1') or t.startswith('>'): break
            if t == '--exec': 
                need.setdefault('main', set()).add('--exec'); break
            if where == 'main' and not t.startswith('-'):
                if t == 'bench' and i + 1 < len(toks): where = 'bench ' + toks[i+1]; i += 2; continue
                if t in SUBS: where = t; i += 1; continue
                if t == 'check': where = 'check'; i += 1; continue
                # config file: the rest are overrides
                where = 'cfg'
            if t.startswith('--') or (t.startswith('-') and len(t) == 2 and t[1].isalpha()):
                f = t.split('=')[0].strip('[]')
                if where != 'cfg': need.setdefault(where, set()).add(f)
                if where in ('main', 'check') and '=' not in t and f not in BOOL: i += 1
            i += 1
for k, fl in sorted(need.items()):
    cmd = [dtrun] + ([] if k == 'main' else k.split()) + ['--help']
    if k == 'bench comm': cmd = [dtrun, '--nproc_per_node', '1', 'bench', 'comm', '--help']
    p = subprocess.run(cmd, capture_output=True, text=True)
    out = p.stdout
    if k == 'check': out += subprocess.run([dtrun, '--help'], capture_output=True, text=True).stdout
    missing = [f for f in sorted(fl) if not re.search(re.escape(f) + r'(?![\w-])', out) and not re.search(re.escape(f.replace('_','-')) + r'(?![\w-])', out) and not re.search(re.escape(f.replace('-','_')) + r'(?![\w-])', out)]
    status = 'ok' if p.returncode == 0 and not missing else 'BAD'
    print(f"{status}: dtrun {k} --help: exit {p.returncode}" + (f", missing {' '.join(missing)}" if missing else ''))
