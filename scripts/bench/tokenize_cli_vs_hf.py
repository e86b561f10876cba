"""tokenize_cli_vs_hf.py - the whole `dtrun tokenize` run (files to shards) against
Hugging Face tokenizers (Rust, encode_batch) on the same tokenizer.json and text, at
the same thread counts. (tokenize_vs_hf.py measures the tokenizer library alone at
one thread.)

  python3 scripts/bench/tokenize_cli_vs_hf.py TEXT [--tokenizer tokenizer.json]
      [--jobs 1,2] [--repeat 3] [--dtrun ./dtrun]

Without --tokenizer, a byte-level BPE (GPT-2's split, vocab 8192) is trained on TEXT
offline first (runs/bench/tok_<vocab>.json, reused). TEXT is cut into documents at
blank lines: tokenizers encodes that list with encode_batch (RAYON_NUM_THREADS=J,
set before import, one fresh process per J); dtrun tokenizes the one file (one
document, cut into pieces internally) with --jobs J. Tokens/s is tokens over the
wall time of the encoding itself (HF) or of the whole dtrun run (reading the
tokenizer, mapping, writing shards included). Best of --repeat runs.
"""
import argparse, json, os, subprocess, sys, tempfile, time

HF_CHILD = r"""
import sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
text = open(sys.argv[2], encoding="utf-8", errors="surrogateescape").read()
docs = [d for d in text.split("\n\n") if d]
t0 = time.perf_counter()
enc = tok.encode_batch(docs, add_special_tokens=False)
dt = time.perf_counter() - t0
print(sum(len(e.ids) for e in enc), dt)
"""


def train(text_path, vocab, out):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([text_path], tr)
    tok.save(out)


def hf_run(tok, text, jobs):
    env = dict(os.environ, RAYON_NUM_THREADS=str(jobs), TOKENIZERS_PARALLELISM="true")
    out = subprocess.run([sys.executable, "-c", HF_CHILD, tok, text], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    return int(out[0]), float(out[1])


def dtrun_run(dtrun, tok, text, jobs, tmp):
    prefix = os.path.join(tmp, "b%d" % jobs)
    t0 = time.perf_counter()
    out = subprocess.run([dtrun, "tokenize", "--tokenizer", tok, text, "-o", prefix, "--jobs", str(jobs), "--force"],
                         capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit("dtrun tokenize failed: " + out.stderr)
    tokens = int(out.stdout.split(" tokens (")[0].split(", ")[-1])
    return tokens, dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("text")
    ap.add_argument("--tokenizer")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--jobs", default="1,2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dtrun", default="./dtrun")
    a = ap.parse_args()
    tok = a.tokenizer
    if not tok:
        os.makedirs("runs/bench", exist_ok=True)
        tok = "runs/bench/tok_%d.json" % a.vocab
        if not os.path.exists(tok):
            train(a.text, a.vocab, tok)
    size = os.path.getsize(a.text)
    print("text %s (%.1f MB), tokenizer %s" % (a.text, size / 1e6, tok))
    rows = {}
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(a.text))) as tmp:
        for j in [int(x) for x in a.jobs.split(",")]:
            hf = min((hf_run(tok, a.text, j) for _ in range(a.repeat)), key=lambda r: r[1])
            dt = min((dtrun_run(a.dtrun, tok, a.text, j, tmp) for _ in range(a.repeat)), key=lambda r: r[1])
            rows[j] = (hf, dt)
            print("jobs %d: tokenizers %.2fM tokens/s (%d tokens, %.2f s)  dtrun %.2fM tokens/s (%d tokens, %.2f s)"
                  "  dtrun/tokenizers %.2fx" % (j, hf[0] / hf[1] / 1e6, hf[0], hf[1], dt[0] / dt[1] / 1e6, dt[0],
                                               dt[1], (dt[0] / dt[1]) / (hf[0] / hf[1])))
    if 1 in rows and 2 in rows:
        for name, k in (("tokenizers", 0), ("dtrun", 1)):
            r1, r2 = rows[1][k], rows[2][k]
            print("%s scaling 1 -> 2 jobs: %.2fx (linear 2.00x)" % (name, (r2[0] / r2[1]) / (r1[0] / r1[1])))
    print(json.dumps({str(j): {"hf_tok_s": r[0][0] / r[0][1], "dtrun_tok_s": r[1][0] / r[1][1]}
                      for j, r in rows.items()}))


if __name__ == "__main__":
    main()
