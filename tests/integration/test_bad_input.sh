#!/usr/bin/env bash
# test_bad_input.sh - a careless user's input costs seconds: each case below is
# exit 2 (bad usage or config) or 3 (network) before any worker starts (no
# "[rank" line), with a message naming what is wrong, never a hang or a crash.
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
T=$DT_TMP

make_text "$T/t.txt" 1 400
cat >"$T/c.json" <<JSON
{"model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$T/t.txt", "val_fraction": 0.1},
 "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "train_steps": 2,
 "device": "cpu", "threads": 1, "steps_per_print": 1, "eval": {"every_steps": 0},
 "checkpoint": {"dir": "$T/ck", "every_steps": 0, "resume": "never"}, "log": {"dir": "$T/log"}}
JSON

# want NAME RC TEXT CMD... (lib.sh): a refusal before start

# ---- the config's files, checked by the agent with the loader's own checks ----
want "data.train missing: exit 2" 2 "data.train: no file matches" "$DTRUN" "$T/c.json" "data.train=$T/nope.txt"
want "data.train a directory: exit 2" 2 "data.train: $T: not a regular file (a directory)" "$DTRUN" "$T/c.json" "data.train=$T"
mkfifo "$T/fifo"
want "data.train a FIFO: exit 2, no hang" 2 "data.train: $T/fifo: not a regular file (a FIFO)" "$DTRUN" "$T/c.json" "data.train=$T/fifo"
want "data.val a FIFO: exit 2, no hang" 2 "data.val: $T/fifo: not a regular file (a FIFO)" "$DTRUN" "$T/c.json" "data.val=$T/fifo"
make_text "$T/t2.txt" 2 400
want "one bad file of a glob: exit 2 naming it" 2 "$T/t3.txt: not a regular file (a directory)" \
  sh -c "mkdir '$T/t3.txt' && exec '$DTRUN' '$T/c.json' 'data.train=$T/t*.txt'"
want "vocab_size the text cannot have: exit 2" 2 "data.train: $T/t.txt: byte" "$DTRUN" "$T/c.json" model.vocab_size=100
want "log.dir under a regular file: exit 2" 2 "log.dir: $T/t.txt/sub" "$DTRUN" "$T/c.json" "log.dir=$T/t.txt/sub"
want "log.dir where nothing can be created: exit 2" 2 "log.dir: /proc/dtrun-nope cannot be written" "$DTRUN" "$T/c.json" log.dir=/proc/dtrun-nope
want "checkpoint.resume missing: exit 2" 2 "checkpoint.resume: checkpoint not found: $T/nockpt" "$DTRUN" "$T/c.json" "checkpoint.resume=$T/nockpt"
mkdir -p "$T/notckpt"
want "checkpoint.resume not a checkpoint: exit 2" 2 "checkpoint.resume:" "$DTRUN" "$T/c.json" "checkpoint.resume=$T/notckpt"
[ ! -e "$T/log" ] && pass "nothing was written by the failed checks" || fail "nothing was written by the failed checks" "$(ls "$T/log")"

# control characters in a path are printed escaped, not sent to the terminal
esc=$(printf 'a\033[2Jb')
want "control characters escaped (data.train)" 2 'a\x1b[2Jb' "$DTRUN" "$T/c.json" "data.train=$T/$esc"
want "control characters escaped (config path)" 2 'c\x1b[2Jb.json' "$DTRUN" "$T/c$(printf '\033[2J')b.json"
if grep -q "$(printf '\033')" "$T"/control*.err; then fail "no raw escape byte on stderr"; else pass "no raw escape byte on stderr"; fi

# ---- launch flags ---------------------------------------------------------------
want "--rdzv_endpoint 127.0.0.1:29500:1: exit 2" 2 "bad endpoint '127.0.0.1:29500:1'" \
  "$DTRUN" --rdzv_endpoint 127.0.0.1:29500:1 "$T/c.json"
want "--rdzv_endpoint [::1]:PORT still accepted" 0 "" "$DTRUN" --rdzv_endpoint "[::1]:0" --exec true
long=$(python3 -c "print(','.join(['0'] * 2100))")
want "--local_ranks_filter over 4095 characters: exit 2" 2 "--local_ranks_filter is 4199 characters long" \
  "$DTRUN" --local_ranks_filter "$long" --exec true
long=$(python3 -c "print(','.join(['0:1'] * 200))")
want "--tee over 511 characters: exit 2" 2 "--tee is 799 characters long" "$DTRUN" --tee "$long" --exec true
want "--redirects over 511 characters: exit 2" 2 "--redirects is 799 characters long" "$DTRUN" --redirects "$long" --exec true

# --node_rank >= nnodes with no store to tell: exit 2 within seconds (was 600 s, then 3)
port=$(free_port)
want "--node_rank 2 of --nnodes 2 alone: exit 2" 2 "--node_rank 2 is out of range for --nnodes 2" \
  "$DTRUN" --nnodes 2 --node_rank 2 --rdzv_endpoint 127.0.0.1:$port --exec true

# an unresolvable store host: exit 3 at once with the resolver's words
if python3 -c 'import socket,sys
try: socket.getaddrinfo("dtrun-nowhere.invalid", None)
except socket.gaierror as e: sys.exit(0 if e.errno == socket.EAI_NONAME else 1)
sys.exit(1)'; then
  # A name that does not resolve (yet: a Kubernetes service appears once its pod
  # runs) is waited for until join_timeout, saying so, then exit 3 naming it.
  for nr in 0 1; do
    s=$(date +%s)
    DTRUN_WAIT_REPORT_S=1 want "unresolvable host (node_rank $nr): exit 3 after join_timeout" 3 \
      "cannot resolve the rendezvous host 'dtrun-nowhere.invalid' within 3 s (join_timeout)" \
      "$DTRUN" --nnodes 2 --node_rank $nr --rdzv_endpoint dtrun-nowhere.invalid:29500 --rdzv_conf join_timeout=3 --exec true
    n=$(grep -c "rendezvous host 'dtrun-nowhere.invalid' does not resolve yet" "$DT_TMP/want.err")
    [ $(( $(date +%s) - s )) -le 20 ] && [ "$n" -ge 2 ] && pass "unresolvable host (node_rank $nr): $n 'does not resolve yet' lines, then the error" ||
      fail "unresolvable host (node_rank $nr): waiting said so" "$n lines, $(( $(date +%s) - s )) s"
  done
else
  skip "unresolvable host" "this resolver does not answer 'no such name' for .invalid"
fi
# ---- numbers: out of range is said, not truncated or accepted --------------------
want "1e309 is 'out of range', not null" 2 "train_steps: expected an integer >= 1, found a number out of range" \
  "$DTRUN" config "$T/c.json" train_steps=1e309
want "gradient_accumulation_steps 2^31-1 refused" 2 "gradient_accumulation_steps: expected an integer in [1, 65536], found 2147483647" \
  "$DTRUN" config "$T/c.json" gradient_accumulation_steps=2147483647
want "plan --nodes 99999999x99999999: exit 2, no overflow" 2 "--nodes: expected MxG" \
  "$DTRUN" plan "$T/c.json" --nodes 99999999x99999999
want "sample --temperature nan: exit 2" 2 "--temperature wants a number in [0, 100], got 'nan'" \
  "$DTRUN" sample "$T/nothing" --temperature nan
# ---- a data file truncated during the run: an error naming it, not SIGBUS -------
make_text "$T/big.txt" 3 100000
( timeout -s KILL 120 "$DTRUN" "$T/c.json" "data.train=$T/big.txt" train_steps=1000000 steps_per_print=1 \
    >"$T/trunc.out" 2>&1; echo $? >"$T/trunc.rc" ) &
for _ in $(seq 600); do grep -q 'step 2/' "$T/trunc.out" 2>/dev/null && break; sleep 0.1; done
truncate -s 0 "$T/big.txt"
wait
if [ "$(cat "$T/trunc.rc")" = 1 ] && grep -q "$T/big.txt: reading token .* failed (SIGBUS): the file is shorter than when it was opened" "$T/trunc.out" \
   && ! grep -q 'exitcode *: -7' "$T/trunc.out"; then
  pass "data file truncated mid-run: exit 1 naming the file"
else
  fail "data file truncated mid-run: exit 1 naming the file" "rc $(cat "$T/trunc.rc"): $(grep -E 'failed|exitcode' "$T/trunc.out" | head -3)"
fi
finish
