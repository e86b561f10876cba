#!/usr/bin/env python3
"""readme_lines.py README.md WORD - the command lines of README.md's code blocks that
start with `dtrun WORD` (after VAR=VALUE settings; continuations joined, comments dropped), one per output line.
An optional flag written `[--sp]` gives two lines, without and with it. Lines with
--measure are left out (they time a real run)."""
import re
import sys

text = open(sys.argv[1]).read()
word = sys.argv[2]
for block in re.findall(r'```\n(.*?)```', text, re.S):
    block = re.sub(r'\\\n\s*', ' ', block)
    for line in block.split('\n'):
        line = re.sub(r'\s+#.*$', '', line).strip()
        if not re.match(r'^(\w+=\S+\s+)*(\./)?dtrun ' + re.escape(word) + r'(\s|$)', line) or '--measure' in line:
            continue
        opt = re.search(r'\s\[(--[\w-]+)\]', line)
        if opt:
            print(line.replace(opt.group(0), ''))
            print(line.replace(opt.group(0), ' ' + opt.group(1)))
        else:
            print(line)
