#!/usr/bin/env python3
"""tokenizer_check.py - dtrun's tokenizer (runtime/tokenize) against Hugging Face
`tokenizers`, on small BPE tokenizers trained here, offline, on the demo corpus
plus a multilingual sample (Cyrillic, CJK, Arabic, emoji with ZWJ sequences,
combining accents, whitespace runs, tabs, \\r\\n, long numbers, contractions,
special tokens inside the text).

Tokenizers: gpt2 (ByteLevel pre-tokenizer), llama3 (Llama 3's Split regex +
ByteLevel without regex, ignore_merges), qwen2 (Qwen2's regex + NFC), mistral
(Prepend/Replace "\u2581" normalizer, no pre-tokenizer, byte fallback with
<0x00>..<0xFF>); gpt2-prefix (ByteLevel add_prefix_space), metaspace (Metaspace,
split false) and spm (Llama 2 / Mistral as they ship: a vocabulary trained on
words, applied with the mistral normalizer and no pre-tokenizer). For EVERY
document, the ids of build/tests/helpers/tok_encode must equal `Tokenizer.encode(text, add_special_tokens=False).ids`, and its decode must
equal tokenizers' decode.

Run with a python3 that has tokenizers installed (not part of `make test`):
  scripts/compat/tokenizer_check.py                   # check; exit 1 on any mismatch
  scripts/compat/tokenizer_check.py --write-fixtures  # also write tests/fixtures/tok/
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")

MULTI = [
    "Привет, мир! Как дела? Съешь же ещё этих мягких французских булок.",
    "我能吞下玻璃而不伤身体。日本語のテキストも少し：東京は大きい都市です。",
    "مرحبا بالعالم، هذه جملة عربية قصيرة مع أرقام ١٢٣٤٥.",
    "Family: 👨‍👩‍👧‍👦 and flags 🏳️‍🌈 🇫🇷, hands 👋🏽 — done.",
    "Combining: e\u0301 a\u0300 o\u0308 n\u0303 A\u030a; precomposed: é à ö ñ Å; Hangul 한국어 \u1112\u1161\u11ab.",
    "Whitespace   runs\t\ttabs \t mixed\r\nwindows\r\n\r\nlines  \n  \n\n   trailing   ",
    "Numbers 1234567890123 and 3.14159, 1,000,000 and 007 and ٣٤٥ and ½ ⅔.",
    "Contractions: it's, don't, they're, we've, I'm, you'll, he'd; IT'S DON'T THEY'RE WE'VE I'M YOU'LL HE'D 'S 'T.",
    "Long s: 'ſ and 'Ll, 'RE. Quotes 'quoted' and ''double'' and '' alone.",
    "Mixed: naïve café coöperate Ångström straße ΕΛΛΗΝΙΚΆ ελληνικά Ωmega",
    "\u00a0non-breaking\u00a0spaces\u2003em\u3000ideographic\u2028line\u2029para\u0085nel",
    "Code: def f(x):\n    return x**2  # squares\n\tif x>=0: print(\"ok\")\n",
    "   leading spaces and a trailing newline\n",
    "\n\nstarts with newlines and ends with spaces   ",
    "symbols !!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&& (((  ))) [[[ ]]] {{{ }}} <<< >>>",
    "Zero width: a\u200bb\u200cc\u200dd\ufeffe; variation ✌\ufe0f ❤\ufe0e",
    "Emoji run 😀😃😄😁😆😅🤣😂🙂🙃 and 🧑🏿‍🚀 astronaut",
    "Devanagari हिन्दी, Thai ภาษาไทย, Hebrew עברית, Georgian ქართული, Armenian Հայերեն",
]


def corpus_docs(path, n, seed):
    text = open(path, encoding="utf-8", errors="replace").read()
    docs = [d.strip("\n") for d in text.split("\n\n") if d.strip()]
    rng = random.Random(seed)
    rng.shuffle(docs)
    return docs[:n]


def documents(corpus, specials, seed):
    """The check's documents: fortunes, the multilingual sample, and mixtures with
    special tokens inside the text."""
    rng = random.Random(seed)
    docs = corpus_docs(corpus, 160, seed) + MULTI
    mixed = []
    for i in range(24):
        parts = rng.sample(docs, 3)
        sp = rng.choice(specials)
        glue = rng.choice(["", " ", "\n", "  ", "\t"])
        mixed.append(parts[0] + glue + sp + rng.choice(["", " ", "\n"]) + parts[1] + sp + parts[2])
    return docs + mixed


# Pieces random documents are made of: each pattern's edge cases (whitespace runs
# before letters, \r\n, apostrophes, digit runs, Unicode spaces, marks, emoji).
PALETTE = ([" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\u00a0", "\u3000", "\u2028", "\u0085", "\x0b",
            "\x0c", "'", "'s", "'S", "'ll", "'LL", "'re", "'ve", "'d", "'m", "'t", "'ſ", "\u2019s"]
           + list("abcXYZéßΩжЖ我の한ععः") + ["\u0301", "\u0308", "\u200d", "\ufe0f", "👍", "👨‍👩‍👧", "🏽"]
           + list("0123456789٣½²") + ["1234567", "3.14", "1,000"] + list(".,;:!?-_()[]{}<>@#$%^&*+=/\\|~`\"")
           + ["...", "--", "!!", "word", "Word", "WORD", "hello", " the", " of"])


def fuzz_docs(n, seed, specials):
    """n random documents drawn from PALETTE (and now and then a special token)."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        parts = [rng.choice(PALETTE) for _ in range(rng.randint(1, 40))]
        if rng.random() < 0.1:
            parts.insert(rng.randint(0, len(parts)), rng.choice(specials))
        docs.append("".join(parts))
    return docs


def train(kind, corpus_lines, vocab):
    specials = {
        "gpt2": ["<|endoftext|>"],
        "llama3": ["<|begin_of_text|>", "<|end_of_text|>"],
        "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "mistral": ["<unk>", "<s>", "</s>"],
        "gpt2-prefix": ["<|endoftext|>"],
        "metaspace": ["<unk>", "<s>", "</s>"],
        "spm": ["<unk>", "<s>", "</s>"],
    }[kind]
    if kind == "spm":  # Llama 2 / Mistral: trained on words, applied with no pre-tokenizer
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
        tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials + ["<0x%02X>" % b for b in range(256)],
                                 limit_alphabet=200, show_progress=False)
        tok.train_from_iterator(corpus_lines, trainer=tr)
        tok.pre_tokenizer = None
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        return tok, specials
    if kind == "metaspace":  # Llama 2 / Mistral as `tokenizers` converts them now
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials + ["<0x%02X>" % b for b in range(256)],
                                 limit_alphabet=200, show_progress=False)
    elif kind == "mistral":
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials + ["<0x%02X>" % b for b in range(256)],
                                 limit_alphabet=200, show_progress=False)
    else:
        tok = Tokenizer(models.BPE(ignore_merges=(kind == "llama3")))
        if kind in ("gpt2", "gpt2-prefix"):
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=(kind == "gpt2-prefix"))
        else:
            if kind == "qwen2":
                tok.normalizer = normalizers.NFC()
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(LLAMA3 if kind == "llama3" else QWEN2), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_lines, trainer=tr)
    return tok, specials


def run_helper(helper, tok_path, docs_path, mode=None):
    cmd = [helper, tok_path, docs_path] + ([mode] if mode else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("tokenizer_check: %s failed: %s" % (" ".join(cmd), r.stderr.strip()))
    out = r.stdout.split("\n")  # not splitlines(): U+2028 and U+0085 are no line ends here
    return out[:-1] if out and out[-1] == "" else out


def joined_check(dtrun, tok, tp, docs, tmp):
    """All documents joined by "\n" as ONE text file through `dtrun tokenize` in small
    pieces on 2 jobs: the pieces are cut at dt_tok_split_point, so the ids after the
    document token must equal tokenizers' ids of the whole text. Returns (ok, cuts)."""
    text = "\n".join(docs)
    src = os.path.join(tmp, "joined.txt")
    with open(src, "w", encoding="utf-8") as f:
        f.write(text)
    prefix = os.path.join(tmp, "joined")
    r = subprocess.run([dtrun, "tokenize", "--tokenizer", tp, src, "-o", prefix, "--jobs", "2", "--piece-bytes",
                        "2048", "--stats"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("tokenizer_check: dtrun tokenize failed: %s" % r.stderr.strip())
    import struct
    b = open(prefix + "_train_000000.bin", "rb").read()
    magic, _, n = struct.unpack("<3i", b[:12])
    ids = list(struct.unpack("<%d%s" % (n, "H" if magic == 20240520 else "I"), b[1024:]))
    import re
    m = re.search(r"(\d+) pieces", r.stdout + r.stderr)
    pieces = int(m.group(1)) if m else 0
    return ids[1:] == tok.encode(text, add_special_tokens=False).ids, pieces


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=os.path.join(ROOT, "runs/data/fortunes.txt"))
    ap.add_argument("--helper", default=os.path.join(ROOT, "build/tests/helpers/tok_encode"))
    ap.add_argument("--dtrun", default=os.path.join(ROOT, "dtrun"),
                    help="checks dtrun tokenize's cut points on the joined documents too (when it exists)")
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--only", default="gpt2,llama3,qwen2,mistral,gpt2-prefix,metaspace,spm",
                    help="tokenizers to check (fixtures are written for gpt2, llama3, qwen2, mistral, spm)")
    ap.add_argument("--write-fixtures", action="store_true")
    ap.add_argument("--fuzz", type=int, default=2000, metavar="N",
                    help="also check N random documents per tokenizer (not written to fixtures)")
    args = ap.parse_args()
    if not os.path.exists(args.corpus):
        subprocess.run([os.path.join(ROOT, "scripts/prepare_demo_data.sh")], check=True)
    if not os.path.exists(args.helper):
        subprocess.run(["make", "-C", ROOT, "-j2", "build/tests/helpers/tok_encode"], check=True)
    lines = [l for l in open(args.corpus, encoding="utf-8", errors="replace").read().split("\n") if l.strip()]
    lines = lines[:20000] + MULTI * 3
    bad = 0
    for kind in args.only.split(","):
        tok, specials = train(kind, lines, args.vocab)
        docs = documents(args.corpus, specials, seed=len(kind))
        fixture_docs = len(docs)
        docs += fuzz_docs(args.fuzz, len(kind) + 7, specials)
        with tempfile.TemporaryDirectory() as tmp:
            tp = os.path.join(tmp, "tokenizer.json")
            dp = os.path.join(tmp, "docs.jsonl")
            tok.save(tp)
            with open(dp, "w", encoding="utf-8") as f:
                for d in docs:
                    f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
            want = [tok.encode(d, add_special_tokens=False).ids for d in docs]
            got = run_helper(args.helper, tp, dp)
            dec = run_helper(args.helper, tp, dp, "--decode")
            nbad = 0
            for i, (d, w) in enumerate(zip(docs, want)):
                g = [int(x) for x in got[i].split()] if i < len(got) and got[i] else []
                hd = tok.decode(w, skip_special_tokens=False)
                gd = json.loads(dec[i]) if i < len(dec) else None
                if g != w or gd != hd:
                    nbad += 1
                    if nbad <= 3:
                        k = next((j for j in range(min(len(g), len(w))) if g[j] != w[j]), min(len(g), len(w)))
                        print("  %s doc %d: %s" % (kind, i, "ids differ at %d" % k if g != w else "decode differs"))
                        print("    text: %r" % d[:200])
                        if g != w:
                            print("    want: %s" % [tok.id_to_token(x) for x in w[max(0, k - 3):k + 5]])
                            print("    got:  %s" % [tok.id_to_token(x) for x in g[max(0, k - 3):k + 5]])
                        else:
                            print("    want: %r\n    got:  %r" % (hd[:200], (gd or "")[:200]))
            ntok = sum(len(w) for w in want)
            print("%-8s %s: %d documents, %d tokens, %d mismatched" % (kind, "ok" if nbad == 0 else "FAIL", len(docs),
                                                                      ntok, nbad))
            if os.path.exists(args.dtrun):
                ok, pieces = joined_check(args.dtrun, tok, tp, docs, tmp)
                print("%-8s %s: the documents joined into one text, dtrun tokenize in %d pieces: ids %s" %
                      (kind, "ok" if ok else "FAIL", pieces, "equal" if ok else "DIFFER"))
                nbad += 0 if ok else 1
            bad += nbad
            if args.write_fixtures and kind in ("gpt2", "llama3", "qwen2", "mistral", "spm"):
                out = os.path.join(ROOT, "tests/fixtures/tok", kind)
                os.makedirs(out, exist_ok=True)
                tok.save(os.path.join(out, "tokenizer.json"), pretty=False)
                with open(os.path.join(out, "docs.jsonl"), "w", encoding="utf-8") as f:
                    for d in docs[:fixture_docs]:
                        f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
                with open(os.path.join(out, "ids.txt"), "w") as f:
                    for w in want[:fixture_docs]:
                        f.write(" ".join(map(str, w)) + "\n")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
