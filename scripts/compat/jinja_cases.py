#!/usr/bin/env python3
"""jinja_cases.py - the Jinja features dtrun's renderer (runtime/tokenize/jinja*.c)
implements, each as a small template rendered by the environment transformers'
apply_chat_template uses (transformers.utils.chat_template_utils: jinja2's
ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, the
generation block, tojson, raise_exception, strftime_now): whitespace control,
printing values as Python does, operators, loops, scoping, macros, filters,
tests, tojson, str and dict methods, globals, syntax errors. UNSUPPORTED lists
what jinja2 renders and dtrun refuses (DT_STATUS_UNSUPPORTED, never another text).

  scripts/compat/jinja_cases.py --write   # tests/fixtures/chat/jinja_cases.jsonl, read by tests/test_chat.c
  scripts/compat/jinja_cases.py --check   # the renderer (build/tests/helpers/chat_render) against jinja2

Each line: {"template", "vars", "text"} (jinja2's output), {"template", "vars",
"error"} (jinja2 raises: dtrun must fail too) or {..., "unsupported": true}.
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "chat", "jinja_cases.jsonl")
HELPER = os.path.join(ROOT, "build", "tests", "helpers", "chat_render")

VARS = {"xs": [1, 2, 3], "d": {"a": 1, "b": [1, 2], "c": None}, "s": "héllo wörld", "e": "", "n": None, "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": " x "}], "f": 2.5, "t": True, "big": 1000000000000000, "neg": -7, "u": "日本語テキスト", "sp": "  a  b\tc\n ", "i": 7, "a": 5}

CASES = [
    'a\n  {% if true %}\n  b\n  {% endif %}\nc',
    'a {%- if true -%} b {%- endif -%} c',
    '{% for x in xs %}\n{{ x }}\n{% endfor %}',
    '  {{ 1 }}  \n  {% if 1 %}x{% endif %}\n',
    'x\n{#- c -#}\ny',
    'x\n  {# c #}\ny',
    '{% raw %}{{ x }}{% endraw %}',
    'a\n  {%+ if true %}b{% endif %}',
    '{% if true +%}\nx{% endif %}',
    'line\n\n',
    "{{ 'a' }}\n{{ 'b' }}\n",
    '  {%- if true %} x{% endif %}',
    "a  {{- 'b' -}}  c",
    '{% for m in msgs %}{{ m.role }}: {{ m.content }}\n{% endfor %}',
    "{%- for m in msgs -%}\n  {{- m['role'] -}}\n{%- endfor -%}",
    '\t{% if true %}\tx\n\t{% endif %}',
    'x {% if true %}\ny{% endif %}',
    '{# a\nb #}\nz',
    '{% raw -%}  x  {%- endraw %}',
    '{{ xs }}|{{ d }}|{{ n }}|{{ t }}|{{ f }}|{{ big }}|{{ 1e100 }}|{{ 0.1 }}|{{ 1/3 }}|{{ -0.0 }}|{{ 2e-5 }}|{{ 123456789012345678.0 }}',
    '{{ (1, 2) }}{{ (1,) }}{{ () }}{{ [] }}{{ {} }}{{ [\'a\', "b\'c", \'d"e\', \'f\\\'g"\'] }}',
    "{{ ['\\n\\t\\x01\\x7f\\u00e9\\u00a0\\u200b\\\\'] }}",
    '{{ d.items() }}{{ d.keys() }}{{ d.values() }}',
    '{{ undefined_thing }}|{{ d.zzz }}|{{ none }}',
    "{{ 'a' ~ 1 ~ none ~ xs }}",
    '{{ 1 if false }}',
    "{{ [1, 2.0, true, none, 'x', [3]] }}",
    "{{ {'a': {'b': (1, 'c')}} }}",
    '{{ 10**18 }}',
    '{{ 3.0 }}{{ 1e16 }}{{ 1e15 }}{{ 0.0001 }}{{ 0.00001 }}',
    '{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}',
    "{{ 1 + 2 * 3 - 4 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ 3 * 'x' }}",
    "{{ 'a' + 'b' }}{{ [1] + [2] }}",
    "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }}",
    "{{ 2 in xs }} {{ 5 not in xs }} {{ 'a' in d }} {{ 'ell' in s }} {{ 'x' in 'xyz' }}",
    "{{ not 1 }} {{ not none }} {{ 1 and 2 }} {{ 0 or 'x' }} {{ none or [] }} {{ '' and 3 }}",
    "{{ 'a' if t else 'b' }} {{ 'a' if n else 'b' }} {{ 1 if 0 else 2 if 0 else 3 }}",
    '{{ -f }} {{ +f }} {{ -neg }}',
    "{{ 1 + 'a' }}",
    "{{ 'a' + 1 }}",
    '{{ 1 / 0 }}',
    '{{ [1] + (2,) }}',
    "{{ 'a' < 1 }}",
    '{{ n.x }}',
    '{{ zz.x }}',
    '{{ zz[0] }}',
    '{{ zz + 1 }}',
    '{{ -zz }}',
    '{{ zz() }}',
    '{{ xs() }}',
    '{{ xs[0] }}{{ xs[-1] }}{{ xs[5] }}|{{ xs[1:] }}{{ xs[:-1] }}{{ xs[::-1] }}{{ xs[::2] }}{{ xs[-2:] }}{{ xs[5:] }}{{ xs[1:1] }}',
    '{{ s[0] }}{{ s[-1] }}{{ s[1:4] }}{{ s[::-1] }}{{ u[2:] }}{{ u[::2] }}{{ s[:-3] }}',
    "{{ d['a'] }}{{ d.a }}{{ d['zz'] }}{{ d.b[1] }}{{ d.b.0 }}",
    "{{ msgs[0].content }}{{ msgs[-1]['content'] }}",
    "{{ d['items'] }}",
    '{{ xs[0:2:0] }}',
    "{{ xs['a'] }}|",
    '{{ xs[1.5] }}|',
    "{{ s['upper']() }}",
    '{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }},{% endfor %}',
    '{% for x in xs %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}',
    '{% for x in [] %}a{% else %}empty{% endfor %}',
    '{% for x in xs if x > 1 %}{{ x }}{{ loop.index }}/{{ loop.length }} {% else %}no{% endfor %}',
    '{% for x in xs if x > 5 %}{{ x }}{% else %}no{% endfor %}',
    '{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}',
    '{% for k in d %}{{ k }}{% endfor %}',
    "{% for c in 'abc' %}{{ c }}.{% endfor %}",
    '{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}',
    '{% for x in xs %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}',
    '{% for x in xs %}{% for y in xs %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %}',
    '{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}',
    "{% for x in xs %}{{ loop.cycle('a', 'b') }}{% endfor %}",
    '{% for x in n %}{% endfor %}',
    '{% for x in zz %}x{% else %}e{% endfor %}',
    '{% for a, b in xs %}{% endfor %}',
    '{% for x in 5 %}{% endfor %}',
    '{% set x = 1 %}{% for y in xs %}{% set x = y %}{% endfor %}{{ x }}',
    '{% set ns = namespace(x=0) %}{% for y in xs %}{% set ns.x = ns.x + y %}{% endfor %}{{ ns.x }}',
    "{% set ns = namespace() %}{% set ns.a = 'v' %}{{ ns.a }}{{ ns.b }}",
    '{% set a, b = 1, 2 %}{{ a }}{{ b }}',
    '{% set x %}in {{ 1 }}{% endset %}[{{ x }}]',
    '{% set x | upper %}abc{% endset %}{{ x }}',
    '{% if true %}{% set q = 5 %}{% endif %}{{ q }}',
    '{% set y = 0 %}{% for x in xs %}[{{ y }}]{% set y = x %}[{{ y }}]{% endfor %}{{ y }}',
    '{% set x = 1 %}{% set ns = namespace(v=x) %}{{ ns.v }}{{ ns }}',
    "{% set d2 = {'a': 1} %}{{ d2 }}",
    '{% set n2 = 3 %}{% set n2.x = 1 %}',
    '{% set ns = namespace(_x=1) %}',
    '{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}',
    "{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(b=3, a=4) }}{{ m() }}",
    '{% macro r(n) %}{% if n > 0 %}{{ n }}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(3) }}',
    '{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, k=3) }}',
    '{% macro m(a) %}x{% endmacro %}{{ m(1, 2) }}',
    '{% macro m(a) %}x{% endmacro %}{{ m(z=1) }}',
    '{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}inner{% endcall %}',
    '{% macro w() %}<{{ caller(5) }}>{% endmacro %}{% call(v) w() %}v={{ v }}{% endcall %}',
    '{% macro m() %}  a\n  {% if true %}b{% endif %}\n{% endmacro %}[{{ m() }}]',
    "{% filter upper %}abc{{ 'd' }}{% endfilter %}",
    '{{ n is none }}{{ zz is defined }}{{ zz is undefined }}{{ s is string }}{{ d is mapping }}{{ xs is iterable }}{{ xs is sequence }}{{ d is sequence }}',
    '{{ 1 is number }}{{ t is number }}{{ 1 is integer }}{{ t is integer }}{{ f is float }}{{ t is boolean }}{{ t is true }}{{ 1 is true }}{{ false is false }}',
    "{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}{{ 'a' is in 'abc' }}{{ 2 is in xs }}{{ 1 is eq 1 }}{{ 1 is equalto 2 }}{{ 2 is gt 1 }}{{ 2 is lt 1 }}",
    "{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ 'aB' is lower }}{{ '1' is lower }}{{ n is sameas none }}{{ t is sameas true }}{{ 'upper' is filter }}{{ 'odd' is test }}{{ 'zz' is filter }}",
    '{{ xs is not none }}{{ not xs is none }}{{ zz is not defined }}{{ m is callable }}{{ s.upper is callable }}{{ s is escaped }}{{ (s|safe) is escaped }}',
    "{{ 's' is zz }}",
    "{{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ sp | trim }}|{{ n | trim }}|{{ zz | trim }}|",
    '{{ xs | length }}{{ s | length }}{{ d | count }}{{ zz | length }}{{ u | length }}',
    "{{ 'aBc dEf-ghi(jkl' | title }}|{{ 'hello WORLD' | capitalize }}|{{ s | upper }}|{{ 'ABC' | lower }}",
    "{{ xs | join(',') }}{{ xs | join }}{{ msgs | join('|', attribute='role') }}",
    "{{ zz | default('dflt') }}{{ '' | default('e') }}{{ '' | default('e', true) }}{{ n | d('x') }}{{ 0 | default(5, boolean=true) }}",
    '{{ xs | first }}{{ xs | last }}{{ [] | first }}{{ s | first }}{{ d | first }}{{ d | last }}',
    "{{ 'aaa' | replace('a', 'b') }}{{ 'aaa' | replace('a', 'b', 2) }}{{ 'abc' | replace('', '-') }}{{ 5 | replace(5, 6) }}",
    '{{ d | items | list }}{{ zz | items | list }}',
    "{{ xs | list }}{{ 'ab' | list }}{{ d | list }}{{ (1, 2) | list }}",
    '{{ 42 | string }}{{ none | string }}{{ xs | string }}',
    "{{ '42' | int }}{{ '4.7' | int }}{{ 'x' | int }}{{ 'x' | int(7) }}{{ 3.9 | int }}{{ ' 0x1f ' | int(0, 16) }}{{ '1_000' | int }}",
    "{{ '4.5' | float }}{{ 'x' | float }}{{ 3 | float }}{{ ' 1e3 ' | float }}{{ 'inf' | float }}{{ 'nan' | float }}",
    "{{ msgs | selectattr('role', 'equalto', 'user') | list }}",
    "{{ msgs | rejectattr('role', 'eq', 'user') | map(attribute='content') | list }}",
    "{{ msgs | map(attribute='role') | join(',') }}{{ msgs | map(attribute='zz', default='D') | list }}",
    "{{ xs | select('odd') | list }}{{ xs | reject('odd') | list }}{{ [0, 1, '', 'a'] | select | list }}{{ xs | map('string') | list }}",
    "{{ ['b', 'A', 'c'] | sort }}{{ ['b', 'A', 'c'] | sort(case_sensitive=true) }}{{ xs | sort(reverse=true) }}",
    "{{ msgs | sort(attribute='content') | map(attribute='content') | list }}",
    "{{ [1, 2, 1, 3] | unique | list }}{{ ['a', 'A'] | unique | list }}",
    '{{ xs | reverse | list }}{{ s | reverse }}{{ xs | reverse }}',
    "{{ xs | sum }}{{ [1.5, 2] | sum }}{{ msgs | map(attribute='content') | list | length }}",
    "{{ xs | max }}{{ xs | min }}{{ ['b', 'A'] | max }}{{ [] | max }}",
    '{{ -3 | abs }}{{ -2.5 | abs }}',
    "{{ 2.5 | round }}{{ 3.5 | round }}{{ 2.675 | round(2) }}{{ 2.1 | round(0, 'ceil') }}{{ 2.9 | round(method='floor') }}{{ 3 | round }}",
    "{{ d | dictsort }}{{ {'b': 1, 'A': 2} | dictsort }}{{ {'b': 1, 'a': 2} | dictsort(by='value', reverse=true) }}",
    "{{ 'a\nb\n\nc' | indent }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent('> ', blank=true) }}",
    '{{ \'<a href="x">&\\\'\' | escape }}{{ \'<b>\' | safe }}{{ (\'<b>\' | safe) + \'<i>\' }}{{ \'<i>\' + (\'<b>\' | safe) }}',
    "{{ 'one two  three' | wordcount }}{{ 'x' | center(5) }}|{{ '%s-%d' | format('a', 3) }}|{{ '%(a)s' | format(a=1) }}",
    "{{ d | attr('a') }}|{{ d | attr('items') is defined }}|",
    '{{ xs | batch(2) | list }}',
    '{{ xs | random }}',
    "{{ xs | map('zz') | list }}",
    '{{ d | tojson }}{{ xs | tojson }}{{ s | tojson }}{{ u | tojson }}{{ n | tojson }}{{ t | tojson }}{{ f | tojson }}',
    '{{ msgs | tojson(indent=2) }}',
    '{{ d | tojson(indent=4) }}',
    "{{ {'z': 1, 'a': [1, {}], 'b': []} | tojson(sort_keys=true) }}",
    "{{ s | tojson(ensure_ascii=true) }}{{ '😀' | tojson(ensure_ascii=true) }}",
    "{{ d | tojson(separators=(',', ':')) }}",
    '{{ \'\\u0001\\n"\\\\\\u2028\\u007f\' | tojson }}',
    '{{ zz | tojson }}',
    '{{ (1, 2) | tojson }}',
    '{{ {1: 2, none: 3, true: 4, 1.5: 5} | tojson }}',
    '{{ xs | tojson(2) }}',
    "{{ d | tojson(indent='\\t') }}",
    '{{ {} | tojson(indent=2) }}{{ [] | tojson(indent=2) }}',
    "{{ '  x  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  x'.lstrip() }}|{{ 'x  '.rstrip() }}|{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a b c'.split(None, 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ ' a b c '.rsplit(None, 1) }}",
    '{{ \'abc\'.startswith(\'a\') }}{{ \'abc\'.endswith((\'x\', \'c\')) }}{{ \'aBc\'.upper() }}{{ \'aBc\'.lower() }}{{ "they\'re bill\'s".title() }}{{ \'hELLO\'.capitalize() }}{{ \'aaa\'.replace(\'a\', \'b\', 1) }}',
    "{{ s.find('l') }}{{ s.rfind('l') }}{{ s.find('zz') }}{{ s.count('l') }}{{ s.index('w') }}{{ ','.join(['a', 'b']) }}{{ '{} and {}'.format(1, 'x') }}{{ '{a}{0}'.format(5, a=6) }}{{ '{{}}{}'.format(1) }}",
    "{{ '123'.isdigit() }}{{ 'abc'.isalpha() }}{{ 'a1'.isalnum() }}{{ '  '.isspace() }}{{ 'abc'.islower() }}{{ 'ABC'.isupper() }}{{ 'x'.center(5, '*') }}{{ 'x'.ljust(3) }}|{{ 'x'.rjust(3) }}{{ '-5'.zfill(4) }}",
    "{{ 'a\\nb\\r\\nc'.splitlines() }}{{ 'abc'.removeprefix('a') }}{{ 'abc'.removesuffix('c') }}",
    "{{ s.index('zz') }}",
    "{{ ','.join([1]) }}",
    "{{ ''.split('') }}",
    "{{ 'x'.encode() }}",
    "{{ '%s and %r' % ('a', 'b') }}{{ '%d%%' % 5 }}{{ '%5.2f|%-4s|%03d|%x' % (3.14159, 'ab', 7, 255) }}{{ '%s' % xs }}",
    "{{ '%s %s' % 1 }}",
    "{{ 'x' % 1 }}",
    "{{ d.get('a') }}{{ d.get('zz') }}{{ d.get('zz', 5) }}{{ d.keys() | list }}{{ d.values() | list }}{{ d.items() | list }}{{ d.copy() }}",
    '{{ d.update({}) }}',
    '{{ xs.append(4) }}',
    '{{ xs.index(2) }}{{ xs.count(1) }}',
    '{{ range(3) | list }}{{ range(1, 7, 2) | list }}{% for i in range(3) %}{{ i }}{% endfor %}{{ range(5, 0, -2) | list }}',
    '{{ range(1000000) | length }}',
    "{{ raise_exception('boom') }}",
    "{{ dict(a=1, b=2) }}{{ dict({'x': 1}) }}",
    '{{ strftime_now is defined }}{{ namespace is defined }}{{ lipsum is defined }}',
    '{% if %}',
    '{% for x in xs %}',
    '{{ x ',
    '{% endfor %}',
    "{% include 'a' %}",
    "{% extends 'a' %}",
    '{% do x %}',
    "{{ 'unterminated }}",
    '{% for x in xs recursive %}{% endfor %}',
    '{{ x | nofilter }}',
    '{% if false %}{{ x | nofilter }}{% endif %}ok',
    '{{ x is notest }}',
    '{# unclosed',
    '{% raw %}abc',
    '{{ (1, 2 }}',
    '{{ 1 }}}',
    '{% break %}',
    '{% set 1 = 2 %}',
    '{{ f(*xs) }}',
    '{% for m in msgs %}{{ m.role }}:{% generation %}{{ m.content }}{% endgeneration %}\n{% endfor %}',
    'a{%- generation -%}  b  {%- endgeneration -%}c',
    '{% for i in [1] %}[{{ a }}]{% endfor %}{% set a = 1 %}{{ a }}',
    '{{ a }}{% set a = 1 %}{{ a }}',
    '{% if true %}{{ a }}{% endif %}{% set a = 1 %}',
    '{% with q = 1 %}{{ a }}{% endwith %}{% set a = 1 %}',
    '{% macro m() %}{{ a }}{% endmacro %}{{ m() }}{% set a = 1 %}{{ m() }}',
    '{% for i in [1] %}{{ a }}{% set a = 2 %}{{ a }}{% endfor %}{{ a }}',
    '{% if false %}{% set a = 1 %}{% endif %}{% for i in [1] %}{{ a }}{% endfor %}',
    '{% set c %}{% set b = 1 %}{% endset %}[{{ b }}]',
    '{% for x in xs %}{{ x }}{% break %}{% else %}E{% endfor %}',
    '{% for x in xs %}{{ x }}{% continue %}{% else %}E{% endfor %}',
    '{% for x in xs %}{{ x }}{% if loop.last %}{% break %}{% endif %}{% else %}E{% endfor %}',
    '{% set ns = namespace(v=1) %}{% set ns.me = ns %}{{ ns }}',
    '{% macro m(a) %}{% endmacro %}{{ m }}|{% call m(1) %}x{% endcall %}|{% macro k() %}{{ kwargs }}{% endmacro %}{% call k() %}{% endcall %}',
    '{{ range(5) }}{{ range(1, 9, 3) }}{{ range(10)[2:8:2] }}{{ range(4) | list }}',
    "{{ ('<b>' | safe).split('b') }}{{ ('<b>' | safe)[1] }}{{ ('<b>' | safe) | last }}",
    "{{ '%s' % zz }}{{ 'x' % [1] }}{{ '' % zz }}",
    "{{ xs | select('odd') }}",
    "{{ false | select | list }}{{ none | map('upper') | list }}{{ 0 | selectattr('x') | list }}",
    '{{ i[:2] }}',
    '{{ d[1:] }}',
    "{{ s[1:'a'] }}",
    '{{ [] not in d }}',
    '{{ msgs | unique | list }}',
    '{% macro m(p, q=m(1)) %}{% endmacro %}{{ m(1) }}',
    '{% for x in xs %}{% filter upper %}a{% break %}{% endfilter %}{% endfor %}',
    '{% generation %}{% set g = 1 %}{% endgeneration %}[{{ g }}]',
    "{{ ('%s' | safe) % '<' }}",
    "{{ 'é'.upper() }}{{ 'ß'.upper() }}{{ 'ΟΔΟΣ ΣΑΣ'.lower() }}{{ 'ǆemal ǉ'.title() }}{{ 'ﬁne' | capitalize }}{{ 'İ' | lower | length }}",
    "{{ ['é', 'E', 'Z', 'a'] | sort }}{{ ['É', 'é'] | unique | list }}{{ ['b', 'É'] | max }}",
    "{{ ['\\u0378\\u00ad\\u2028\\U000e0020\\ue000é'] }}",
    "{{ 'É'.islower() }}",
]


# jinja2 renders these; dtrun refuses them (generator and method objects print their
# address, islower/isupper of non-ASCII cased letters, filters and tags not implemented).
UNSUPPORTED = {
    "{{ 'É'.islower() }}",
    "{{ d['items'] }}",
    '{{ xs | reverse | list }}{{ s | reverse }}{{ xs | reverse }}',
    '{{ xs | batch(2) | list }}',
    '{{ xs | random }}',
    "{{ 'x'.encode() }}",
    '{% for x in xs recursive %}{% endfor %}',
    "{{ xs | select('odd') }}",
    "{{ ('%s' | safe) % '<' }}",
}


def reference(template, variables):
    from transformers.utils.chat_template_utils import _cached_compile_jinja_template

    try:
        text = _cached_compile_jinja_template(template).render(**copy.deepcopy(variables))
    except Exception as e:  # noqa: BLE001 - any failure of jinja2 is an expected failure
        return {"error": f"{type(e).__name__}: {e}"}
    return {"text": text}


def build():
    rows = []
    for t in CASES:
        row = {"template": t, "vars": VARS}
        row.update(reference(t, VARS))
        if t in UNSUPPORTED:
            if "error" in row:
                raise SystemExit(f"{t!r} is listed as unsupported but jinja2 fails on it: {row['error']}")
            row["unsupported"] = True
        rows.append(row)
    return rows


def check(rows):
    if not os.access(HELPER, os.X_OK):
        raise SystemExit(f"{HELPER} not found: build it with `make {os.path.relpath(HELPER, ROOT)}`")
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    try:
        out = subprocess.run([HELPER, "--jinja-cases", f.name], capture_output=True, text=True, encoding="utf-8",
                             timeout=120).stdout
    finally:
        os.unlink(f.name)
    got = [json.loads(line) for line in out.split("\n") if line.strip()]
    bad = 0
    for r, g in zip(rows, got):
        if r.get("unsupported"):
            ok = g.get("status") == "UNSUPPORTED"
        elif "error" in r:
            ok = "error" in g
        else:
            ok = g.get("text") == r["text"]
        if not ok:
            bad += 1
            print(f"differs: {r['template']!r}\n  jinja2 {r.get('text', r.get('error'))!r}\n  dtrun  {g!r}")
    if len(got) != len(rows):
        bad += 1
        print(f"the helper answered {len(got)} cases for {len(rows)}")
    print(f"jinja cases: {len(rows) - bad}/{len(rows)} as jinja2 ({sum(1 for r in rows if r.get('unsupported'))} "
          f"refused as unsupported, {sum(1 for r in rows if 'error' in r)} failing in both)")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help=f"write {os.path.relpath(OUT, ROOT)}")
    ap.add_argument("--check", action="store_true", help="compare dtrun's renders with jinja2's")
    a = ap.parse_args()
    if not a.write and not a.check:
        ap.error("give --write and/or --check")
    rows = build()
    if a.write:
        with open(OUT, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        print(f"{len(rows)} cases -> {os.path.relpath(OUT, ROOT)}")
    if a.check:
        sys.exit(1 if check(rows) else 0)


if __name__ == "__main__":
    main()
