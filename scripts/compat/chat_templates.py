#!/usr/bin/env python3
"""chat_templates.py - dtrun's chat template renderer (runtime/tokenize/chat.h)
against transformers' tokenizer.apply_chat_template(messages, tokenize=False, ...),
on the real templates of tests/fixtures/chat/<name>/tokenizer_config.json.

For each template it builds 50 conversations (seeded, so the same on every run):
with and without a system message, one to seven turns, unicode, leading and
trailing whitespace, newlines, empty and long content, add_generation_prompt true
and false, tool calls and tools where the template takes them, content lists
where it reads them. Conversations the template rejects with raise_exception()
(alternation rules, a system role it does not take) are replaced by others, but a
few are kept as rejected cases ("error": true) which dtrun must reject too.

The reference is apply_chat_template on a PreTrainedTokenizerFast built from the
fixture's special tokens and template (a tiny word-level vocabulary: only the
template is exercised); every case is also rendered with
transformers.utils.chat_template_utils.render_jinja_template and the two must
agree (the script checks that it reproduces apply_chat_template).

Run with the installed transformers 5.x + jinja2 (not part of `make test`):
  scripts/compat/chat_templates.py --write   # write tests/fixtures/chat/<name>/expected.jsonl
  scripts/compat/chat_templates.py --check   # render every case with dtrun (the helper
                                             # build/tests/helpers/chat_render), compare;
                                             # exit 1 on any difference
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIX = os.path.join(ROOT, "tests", "fixtures", "chat")
HELPER = os.path.join(ROOT, "build", "tests", "helpers", "chat_render")
N_CASES = 50
N_REJECTED = 4  # rejected conversations kept per template that rejects any

TEXTS = [
    "Hello, how are you?",
    "I'm doing great. How can I help you today?",
    "What is 2+2?",
    "4.",
    "  leading and trailing spaces  ",
    "\n\nnewlines around\n\n",
    "line one\nline two\n\nline four",
    "tabs\tand\r\nwindows line ends\r\n",
    "",
    " ",
    "Привет, мир! Как дела?",
    "我能吞下玻璃而不伤身体。",
    "مرحبا بالعالم",
    "Emoji 😀👨‍👩‍👧‍👦🏳️‍🌈 and combining e\u0301",
    "\u00a0non-breaking\u00a0spaces\u3000ideographic\u2028line",
    "Quotes: 'single' \"double\" `back` and a backslash \\ and braces {{ }} {% %}",
    "Code:\n```python\ndef f(x):\n    return x ** 2\n```\n",
    "<|im_start|> and [INST] and <start_of_turn> inside user text",
    "ends with a newline\n",
    "None",
    "True",
]
SYSTEMS = [
    "You are a helpful assistant.",
    "You are a pirate. Answer in pirate speak.\nAlways.",
    "  system with spaces  ",
    "",
    "Системное сообщение 系统",
]
TOOLS = [
    {"type": "function", "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Adds two numbers: ünïcödé 数字",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number"}, "b": {"type": "integer", "minimum": -3, "maximum": 2.5}},
            "required": ["a", "b"]}}},
]

# What each template reads beyond role/content strings.
FEATURES = {
    "llama3.1": {"tools", "tool_calls_single", "tool_role"},
    "qwen2.5": {"tools", "tool_calls", "tool_role", "null_content"},
    "mistral-v0.3": {"tools", "tool_calls", "tool_role", "ids9"},
    "gemma3": {"content_list"},
    "gemma2": set(),
    "phi3": set(),
    "chatml": set(),
}


def long_text(rng):
    words = ["alpha", "beta", "γάμμα", "δέλτα", "epsilon", "ζ", "eta\n", "θ", "iota,", "kappa."]
    return " ".join(rng.choice(words) for _ in range(rng.randint(40, 90)))


def text(rng):
    r = rng.random()
    if r < 0.04:
        return long_text(rng)
    if r < 0.2:
        return rng.choice(TEXTS) + " " + rng.choice(TEXTS)
    return rng.choice(TEXTS)


def call_id(rng):
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(9))


def conversation(rng, feats, strict):
    """A conversation; strict: roles alternate user/assistant after an optional system."""
    msgs = []
    if rng.random() < 0.45:
        msgs.append({"role": "system", "content": rng.choice(SYSTEMS)})
    turns = rng.randint(1, 7)
    tooly = ("tool_calls" in feats or "tool_calls_single" in feats) and rng.random() < 0.35
    for t in range(turns):
        msgs.append({"role": "user", "content": text(rng)})
        if t == turns - 1 and rng.random() < 0.5:
            break  # ends on a user turn
        if tooly and rng.random() < 0.5:
            n = 1 if "tool_calls_single" in feats else rng.randint(1, 2)
            calls = []
            for _ in range(n):
                args = rng.choice([{"location": "Paris, France"}, {"a": 3, "b": -2.5}, {"a": 10, "b": 7},
                                   {"location": "東京", "unit": "celsius"}])
                call = {"type": "function", "function": {"name": rng.choice(["get_current_weather", "add"]),
                                                         "arguments": args}}
                if "ids9" in feats or rng.random() < 0.5:
                    call["id"] = call_id(rng)
                calls.append(call)
            m = {"role": "assistant", "tool_calls": calls}
            if "null_content" in feats and rng.random() < 0.5:
                m["content"] = None  # dropped by transformers' normalization
            elif "ids9" not in feats:
                m["content"] = "" if rng.random() < 0.5 else "Let me check."
            msgs.append(m)
            for c in calls:
                res = {"role": "tool", "content": rng.choice(["22 degrees", '{"temperature": 22}', "0.5", "Ошибка"])}
                if "ids9" in feats:
                    res["tool_call_id"] = c["id"]
                msgs.append(res)
            msgs.append({"role": "assistant", "content": text(rng)})
        else:
            msgs.append({"role": "assistant", "content": text(rng)})
    if "content_list" in feats and rng.random() < 0.4:
        for m in msgs:
            if m["role"] != "system" and rng.random() < 0.5:
                parts = [{"type": "text", "text": m["content"]}]
                if rng.random() < 0.5:
                    parts.insert(rng.randint(0, 1), {"type": "image"})
                m["content"] = parts
        if msgs[0]["role"] == "system" and rng.random() < 0.5:
            msgs[0]["content"] = [{"type": "text", "text": msgs[0]["content"]}]
    if not strict:
        # Break the alternation: two users in a row, an assistant first, or an unknown role.
        k = rng.randint(0, 2)
        if k == 0:
            msgs.insert(len(msgs) - 1 if len(msgs) > 1 else 0, {"role": "user", "content": "again"})
        elif k == 1:
            msgs.insert(1 if msgs[0]["role"] == "system" else 0, {"role": "assistant", "content": "first"})
        else:
            msgs.append({"role": "narrator", "content": "unknown role"})
        if "tool_calls_single" in feats:
            call = {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
            msgs.append({"role": "assistant", "tool_calls": [call, call]})  # one call at a time only
    return msgs


def extra_for(rng, feats):
    if "tools" in feats and rng.random() < 0.3:
        return {"tools": TOOLS[: rng.randint(1, 2)]}
    return None


def make_tokenizer(cfg):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    specials = {k: v for k, v in cfg.items() if k.endswith("_token") and v is not None}
    vocab = {"[UNK]": 0}
    for v in specials.values():
        vocab.setdefault(v if isinstance(v, str) else v["content"], len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    kw = {k: (v if isinstance(v, str) else v["content"]) for k, v in specials.items()}
    return PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=cfg["chat_template"], **kw)


def render(tokenizer, cfg, case):
    """(text, None) or (None, error message), by apply_chat_template; checked against
    render_jinja_template."""
    from transformers.utils.chat_template_utils import render_jinja_template

    extra = case.get("extra") or {}
    try:
        a = tokenizer.apply_chat_template(case["messages"], tokenize=False,
                                          add_generation_prompt=case["add_generation_prompt"], **extra)
    except Exception as e:  # noqa: BLE001 - any failure of the template is a rejection
        a, err = None, f"{type(e).__name__}: {e}"
    else:
        err = None
    # The same through the lower-level function (the messages as apply_chat_template
    # normalizes them: keys whose value is None dropped).
    msgs = [{k: v for k, v in m.items() if v is not None} for m in case["messages"]]
    kw = dict(tokenizer.special_tokens_map)
    extra2 = dict(extra)
    tools = extra2.pop("tools", None)
    documents = extra2.pop("documents", None)
    kw.update(extra2)
    try:
        b = render_jinja_template([msgs], tools=tools, documents=documents, chat_template=cfg["chat_template"],
                                  add_generation_prompt=case["add_generation_prompt"], **kw)[0][0]
    except Exception:  # noqa: BLE001
        b = None
    if a != b:
        raise SystemExit(f"render_jinja_template differs from apply_chat_template on {case!r}")
    return a, err


def build_cases(name, cfg):
    rng = random.Random(f"chat-{name}")
    tokenizer = make_tokenizer(cfg)
    feats = FEATURES.get(name, set())
    cases, rejected, tries = [], [], 0
    while len(cases) < N_CASES:
        tries += 1
        if tries > 5000:
            raise SystemExit(f"{name}: could not build {N_CASES} accepted conversations")
        strict = rng.random() < 0.9
        case = {"messages": conversation(rng, feats, strict),
                "add_generation_prompt": rng.random() < 0.5}
        extra = extra_for(rng, feats)
        if extra:
            case["extra"] = extra
        out, err = render(tokenizer, cfg, case)
        if err is None:
            case["text"] = out
            cases.append(case)
        elif len(rejected) < N_REJECTED:
            case["error"] = True
            case["reason"] = err
            rejected.append(case)
    return cases + rejected


def templates():
    return sorted(d for d in os.listdir(FIX) if os.path.isfile(os.path.join(FIX, d, "tokenizer_config.json")))


def load_cfg(name):
    with open(os.path.join(FIX, name, "tokenizer_config.json"), encoding="utf-8") as f:
        return json.load(f)


def write(names):
    for name in names:
        cases = build_cases(name, load_cfg(name))
        path = os.path.join(FIX, name, "expected.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for c in cases:
                f.write(json.dumps(c, ensure_ascii=False) + "\n")
        n_err = sum(1 for c in cases if c.get("error"))
        print(f"{name}: {len(cases) - n_err} rendered, {n_err} rejected -> {os.path.relpath(path, ROOT)}")


def check(names, regenerate):
    if not os.access(HELPER, os.X_OK):
        raise SystemExit(f"{HELPER} not found: build it with `make {os.path.relpath(HELPER, ROOT)}`")
    bad = 0
    for name in names:
        cfg = load_cfg(name)
        path = os.path.join(FIX, name, "expected.jsonl")
        if regenerate or not os.path.exists(path):
            cases = build_cases(name, cfg)
        else:
            with open(path, encoding="utf-8") as f:
                cases = [json.loads(line) for line in f if line.strip()]
            # The fixture must still be what transformers renders.
            tokenizer = make_tokenizer(cfg)
            for c in cases:
                out, err = render(tokenizer, cfg, c)
                if (err is not None) != bool(c.get("error")) or (err is None and out != c["text"]):
                    print(f"{name}: expected.jsonl is stale (transformers renders differently): rerun --write")
                    bad += 1
                    break
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as tmp:
            for c in cases:
                tmp.write(json.dumps(c, ensure_ascii=False) + "\n")
        try:
            res = subprocess.run([HELPER, os.path.join(FIX, name), tmp.name], capture_output=True, text=True,
                                 encoding="utf-8", timeout=120)
        finally:
            os.unlink(tmp.name)
        if res.returncode not in (0, 1):
            print(f"{name}: helper failed ({res.returncode}): {res.stderr.strip()}")
            bad += 1
            continue
        got = [json.loads(line) for line in res.stdout.split("\n") if line.strip()]
        if len(got) != len(cases):
            print(f"{name}: helper answered {len(got)} cases for {len(cases)}")
            bad += 1
            continue
        equal = 0
        n_ok = sum(1 for c in cases if not c.get("error"))
        n_err = len(cases) - n_ok
        rej = 0
        for i, (c, g) in enumerate(zip(cases, got)):
            if c.get("error"):
                if "error" in g:
                    rej += 1
                else:
                    print(f"{name} case {i}: transformers rejects ({c['reason']}), dtrun renders")
                    bad += 1
            elif g.get("text") == c["text"]:
                equal += 1
            else:
                bad += 1
                print(f"{name} case {i}: differs")
                print(f"  want {c['text']!r}"[:2000])
                print(f"  got  {g.get('text', g.get('error'))!r}"[:2000])
        print(f"{name}: {equal}/{n_ok} renders equal, {rej}/{n_err} rejections rejected")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="write tests/fixtures/chat/<name>/expected.jsonl")
    ap.add_argument("--check", action="store_true", help="compare dtrun's renders with the fixtures")
    ap.add_argument("--fresh", action="store_true", help="with --check: new conversations, not the fixture's")
    ap.add_argument("names", nargs="*", help="templates (default: every fixture)")
    a = ap.parse_args()
    names = a.names or templates()
    if not a.write and not a.check:
        ap.error("give --write and/or --check")
    if a.write:
        write(names)
    if a.check:
        bad = check(names, a.fresh)
        print("chat_templates: OK" if not bad else f"chat_templates: {bad} difference(s)")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
