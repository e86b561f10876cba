/*
 * cmd_tokenize.c - dtrun tokenize: text and jsonl to llm.c token shards with a
 * Hugging Face tokenizer.json (runtime/tokenize/tokenize_run.h), and --decode to
 * print a shard's text back. This file holds the flags, the progress line, the
 * signal handling and the exit codes; the pipeline is in runtime/tokenize.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/args.h" /* defines: dt_arg_u64 */
#include "cli/commands.h"
#include "common/fs_safe.h" /* defines: dt_fs_open_regular */
#include "common/mem.h"
#include "runtime/tokenize/chat.h"         /* defines: dt_chat_load */
#include "runtime/tokenize/shard.h"        /* defines: dt_shard_parse */
#include "runtime/tokenize/tok.h"          /* defines: dt_tok_load, dt_tok_decode */
#include "runtime/tokenize/tokenize_run.h" /* defines: dt_tokenize_run */

static const char tokenize_usage[] =
    "usage: dtrun tokenize --tokenizer PATH INPUT... -o PREFIX [--shard-tokens N] [--val-tokens N]\n"
    "                      [--jobs J] [--doc-token ID|STRING] [--field NAME] [--format F] [--force]\n"
    "       dtrun tokenize --chat --tokenizer PATH INPUT.jsonl... -o PREFIX [--template PATH]\n"
    "                      [--mask assistant|last|all] [other flags as above]\n"
    "       dtrun tokenize --decode SHARD --tokenizer PATH [--count N]\n"
    "  PATH: a Hugging Face tokenizer.json, or a folder holding one (byte-level BPE as GPT-2,\n"
    "  Llama 3 and Qwen2 use, or byte-fallback BPE as Mistral-style tokenizers use).\n"
    "  INPUT: a text file (one document), a .jsonl file (one document per line: the string of\n"
    "  its --field, default \"text\"), or - for stdin (streamed: a pipe of any size). --format\n"
    "  text|jsonl reads every INPUT, stdin too, as that format (default auto: *.jsonl are jsonl,\n"
    "  the rest text): zstdcat corpus.jsonl.zst | dtrun tokenize --format jsonl - -o PREFIX ...\n"
    "  Each document is preceded by the document token: --doc-token (an id or a token string),\n"
    "  else <|endoftext|> when the vocabulary has it, else the tokenizer's BOS token.\n"
    "  Output: llm.c token shards (a 1024-byte header, then uint16 tokens when every id fits\n"
    "  16 bits, else uint32): PREFIX_val_000000.bin with the first --val-tokens tokens\n"
    "  (default 0: none), then PREFIX_train_000000.bin, _000001.bin, ... of --shard-tokens\n"
    "  tokens each (default 100M; the last is shorter). Shards appear only when the whole run\n"
    "  succeeded; existing shards of PREFIX are replaced only with --force.\n"
    "  --jobs: encoding threads (default: the online cores); the shards are the same bytes for\n"
    "  every job count. Numbers take K, M, G suffixes (1000s).\n"
    "  --chat: fine-tuning data. Each jsonl line is a conversation {\"messages\": [{\"role\", \"content\"},\n"
    "  ...]} rendered with the chat template (--template: a tokenizer_config.json, a folder\n"
    "  holding one, or a .jinja file; default: tokenizer_config.json beside the tokenizer), or\n"
    "  {\"prompt\", \"completion\"} strings, or a --field text. Beside each shard SHARD.mask says\n"
    "  which tokens are trained on: --mask assistant (default: every assistant turn, its\n"
    "  end-of-turn token included), last (the last assistant turn), all (every token); the\n"
    "  completion of a prompt/completion line; all of a text. Shards hold whole documents.\n"
    "  --decode SHARD: print the text of its first --count tokens (default: all).\n"
    "  Exit codes: 0 ok, 1 failed while writing, 2 bad usage or input (nothing written),\n"
    "  128+N ended by signal N (nothing written).\n";

static int bad(const char *fmt, const char *a) {
    fprintf(stderr, "dtrun tokenize: ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\n(dtrun tokenize --help for usage)\n");
    return DT_EXIT_USAGE;
}

static volatile sig_atomic_t g_signal;
static void on_signal(int sig) { g_signal = sig; }

/* SIGINT and SIGTERM set g_signal (the pipeline polls it), without SA_RESTART so a
 * blocked read of stdin returns. */
static void catch_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

static void human(double v, char *buf, size_t len) {
    if (v >= 1e9) snprintf(buf, len, "%.2fG", v / 1e9);
    else if (v >= 1e6) snprintf(buf, len, "%.2fM", v / 1e6);
    else if (v >= 1e3) snprintf(buf, len, "%.1fK", v / 1e3);
    else snprintf(buf, len, "%.0f", v);
}

/* The live line on a terminal: bytes done/total, tokens/s, ETA ('\r', no newline). */
static void draw_progress(void *ctx, const dt_tokenize_progress *p) {
    char done[32], total[32], rate[32];
    human((double)p->bytes_done, done, sizeof done);
    human((double)p->bytes_total, total, sizeof total);
    human(p->seconds > 0 ? (double)p->tokens / p->seconds : 0, rate, sizeof rate);
    char eta[32] = "?";
    if (p->bytes_total > 0 && p->bytes_done > 0) {
        double left = p->seconds * (double)(p->bytes_total - p->bytes_done) / (double)p->bytes_done;
        snprintf(eta, sizeof eta, "%.0f s", left);
    }
    double pct = p->bytes_total ? 100.0 * (double)p->bytes_done / (double)p->bytes_total : 0;
    fprintf(stderr, "\rtokenize: %sB / %sB (%.0f%%)  %llu tokens  %s tokens/s  ETA %s\033[K", done, total, pct,
            (unsigned long long)p->tokens, rate, eta);
    fflush(stderr);
}

/* --doc-token: an id, or a token string of the vocabulary; else the default. */
static int resolve_doc_token(const dt_tok_t *tok, const char *arg, uint32_t *out) {
    if (arg) {
        uint64_t id;
        if (!dt_arg_u64(arg, 0, UINT32_MAX, &id) && strspn(arg, "0123456789") == strlen(arg)) {
            if (!dt_tok_token_str(tok, (uint32_t)id)) {
                fprintf(stderr, "dtrun tokenize: --doc-token %s: no token has that id (the vocabulary has %u ids)\n",
                        arg, dt_tok_vocab_size(tok));
                return 0;
            }
            *out = (uint32_t)id;
            return 1;
        }
        int64_t t = dt_tok_token_id(tok, arg);
        if (t < 0) {
            fprintf(stderr, "dtrun tokenize: --doc-token '%s' is not a token of the vocabulary (give its exact "
                            "string or an id)\n", arg);
            return 0;
        }
        *out = (uint32_t)t;
        return 1;
    }
    int64_t t = dt_tok_doc_token(tok);
    if (t < 0) {
        fprintf(stderr, "dtrun tokenize: the tokenizer has neither <|endoftext|> nor a BOS token to separate "
                        "documents: give --doc-token ID|STRING\n");
        return 0;
    }
    *out = (uint32_t)t;
    return 1;
}

/* --decode: the text of a shard's first count tokens (all when count is 0) on stdout. */
static int decode_shard(const char *path, const dt_tok_t *tok, uint64_t count) {
    int fd;
    struct stat sb;
    if (dt_fs_open_regular(path, O_RDONLY, 0, &fd, &sb) != DT_STATUS_OK) { /* not a FIFO, device, directory */
        fprintf(stderr, "dtrun tokenize: --decode %s\n", dt_error_detail());
        return DT_EXIT_USAGE;
    }
    void *map = MAP_FAILED;
    size_t len = 0;
    if (sb.st_size > 0) {
        len = (size_t)sb.st_size;
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    }
    close(fd);
    int width, rc = DT_EXIT_USAGE;
    uint64_t ntok;
    uint32_t *ids = NULL;
    char *text = NULL;
    size_t tlen = 0, tcap = 0;
    if (dt_shard_parse(path, map == MAP_FAILED ? "" : map, map == MAP_FAILED ? 0 : len, &width, &ntok) !=
        DT_STATUS_OK) {
        fprintf(stderr, "dtrun tokenize: --decode: %s\n", dt_error_detail());
        goto out_unmap;
    }
    if (count == 0 || count > ntok) count = ntok;
    ids = dt_xmalloc((count ? count : 1) * sizeof *ids);
    const unsigned char *body = (const unsigned char *)map + DT_SHARD_HEADER_BYTES;
    for (uint64_t i = 0; i < count; i++) {
        if (width == 2) {
            uint16_t v;
            memcpy(&v, body + 2 * i, 2);
            ids[i] = v;
        } else {
            memcpy(&ids[i], body + 4 * i, 4);
        }
    }
    if (dt_tok_decode(tok, ids, (size_t)count, &text, &tlen, &tcap) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun tokenize: --decode %s: %s\n", path, dt_error_detail());
        goto out_unmap;
    }
    rc = fwrite(text, 1, tlen, stdout) == tlen && fflush(stdout) == 0 ? DT_EXIT_OK : DT_EXIT_FAILED;
out_unmap:
    free(text);
    free(ids);
    if (map != MAP_FAILED) munmap(map, len);
    return rc;
}

/* What to do about existing shards (dt_tokenize_check says they exist). */
#define FORCE_HINT ": give --force to replace them"

int dt_cmd_tokenize(int argc, char **argv) {
    const char *tok_path = NULL, *out = NULL, *doc_arg = NULL, *field = "text", *decode = NULL;
    dt_tokenize_format format = DT_TOKENIZE_AUTO;
    uint64_t shard_tokens = 100000000, val_tokens = 0, count = 0, jobs = 0, piece = 0;
    int force = 0, n_inputs = 0, stats = 0, chat = 0;
    const char *template_path = NULL;
    dt_tokenize_mask_mode mask_mode = DT_TOKENIZE_MASK_ASSISTANT;
    dt_chat_t *chat_t = NULL;
    const char **inputs = dt_xcalloc((size_t)argc, sizeof *inputs);
    int rc = DT_EXIT_USAGE;
#define BAD(...)                     \
    do {                             \
        rc = bad(__VA_ARGS__);       \
        goto out_free_inputs;        \
    } while (0)
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(tokenize_usage, stdout);
            rc = DT_EXIT_OK;
            goto out_free_inputs;
        } else if (!strcmp(a, "--tokenizer") && has) tok_path = argv[++i];
        else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && has) out = argv[++i];
        else if ((!strcmp(a, "--doc-token") || !strcmp(a, "--doc_token")) && has) doc_arg = argv[++i];
        else if (!strcmp(a, "--field") && has) field = argv[++i];
        else if (!strcmp(a, "--format") && has) {
            const char *f = argv[++i];
            if (!strcmp(f, "text")) format = DT_TOKENIZE_TEXT;
            else if (!strcmp(f, "jsonl")) format = DT_TOKENIZE_JSONL;
            else if (!strcmp(f, "auto")) format = DT_TOKENIZE_AUTO;
            else BAD("--format wants text, jsonl or auto, got '%s'", f);
        }
        else if (!strcmp(a, "--decode") && has) decode = argv[++i];
        else if (!strcmp(a, "--force")) force = 1;
        else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--template") && has) template_path = argv[++i];
        else if (!strcmp(a, "--mask") && has) {
            const char *m = argv[++i];
            if (!strcmp(m, "assistant")) mask_mode = DT_TOKENIZE_MASK_ASSISTANT;
            else if (!strcmp(m, "last")) mask_mode = DT_TOKENIZE_MASK_LAST;
            else if (!strcmp(m, "all")) mask_mode = DT_TOKENIZE_MASK_ALL;
            else BAD("--mask wants assistant, last or all, got '%s'", m);
            chat |= 2;
        }
        else if (!strcmp(a, "--stats")) stats = 1; /* for benchmarks: the serial part's time */
        else if ((!strcmp(a, "--shard-tokens") || !strcmp(a, "--shard_tokens")) && has) {
            if (dt_arg_u64(argv[++i], 1, INT32_MAX, &shard_tokens))
                BAD("--shard-tokens wants a count in [1, 2147483647] (K, M, G allowed), got '%s'", argv[i]);
        } else if ((!strcmp(a, "--val-tokens") || !strcmp(a, "--val_tokens")) && has) {
            if (dt_arg_u64(argv[++i], 0, INT32_MAX, &val_tokens))
                BAD("--val-tokens wants a count in [0, 2147483647] (K, M, G allowed), got '%s'", argv[i]);
        } else if (!strcmp(a, "--jobs") && has) {
            if (dt_arg_u64(argv[++i], 1, 1024, &jobs)) BAD("--jobs wants a count in [1, 1024], got '%s'", argv[i]);
        } else if (!strcmp(a, "--count") && has) {
            if (dt_arg_u64(argv[++i], 1, UINT64_MAX, &count)) BAD("--count wants a count > 0, got '%s'", argv[i]);
        } else if (!strcmp(a, "--piece-bytes") && has) { /* for tests: the size pieces are cut at */
            if (dt_arg_u64(argv[++i], 1, 1ull << 30, &piece)) BAD("--piece-bytes wants a count > 0, got '%s'", argv[i]);
        } else if (a[0] == '-' && a[1]) BAD("unknown flag or missing value: %s", a);
        else inputs[n_inputs++] = a;
    }
    if (!tok_path) BAD("%s", "--tokenizer PATH is required (a tokenizer.json or a folder holding one)");
    if (decode && (n_inputs || out)) BAD("%s", "--decode SHARD takes no INPUT or -o");
    if (!decode && !out) BAD("%s", "-o PREFIX is required (shards are PREFIX_train_000000.bin, ...)");
    if (!decode && n_inputs == 0) BAD("%s", "no INPUT given (text files, .jsonl files, or - for stdin)");
    if (!decode && count) BAD("%s", "--count goes with --decode");
    if (decode && (val_tokens || jobs || doc_arg || force)) BAD("%s", "--decode takes only --tokenizer and --count");
    if ((template_path || chat & 2) && !(chat & 1)) BAD("%s", "--template and --mask go with --chat");
    if (chat && format == DT_TOKENIZE_TEXT) BAD("%s", "--chat reads jsonl (--format text does not go with it)");
    if (chat && decode) BAD("%s", "--chat does not go with --decode");

    dt_tok_t *tok = NULL;
    if (dt_tok_load(tok_path, &tok) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun tokenize: --tokenizer %s: %s\n", tok_path, dt_error_detail());
        goto out_free_inputs;
    }
    if (decode) {
        rc = decode_shard(decode, tok, count);
        goto out_free_tok;
    }
    dt_tokenize_opts o = {
        .tok = tok,
        .inputs = inputs,
        .n_inputs = n_inputs,
        .field = field,
        .field_hint = "; --field NAME picks another",
        .format = format,
        .out_prefix = out,
        .shard_tokens = shard_tokens,
        .val_tokens = val_tokens,
        .force = force,
        .piece_bytes = (size_t)piece,
        .cancel = &g_signal,
    };
    if (jobs == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        jobs = n > 0 ? (uint64_t)n : 1;
    }
    o.jobs = (int)jobs;
    if (!resolve_doc_token(tok, doc_arg, &o.doc_token)) goto out_free_tok;
    if (chat) {
        o.chat_mode = 1;
        o.mask_mode = mask_mode;
        o.eos_token = -1;
        const char *tp = template_path ? template_path : tok_path;
        /* the tokenizer's own folder: tokenizer_config.json beside tokenizer.json */
        char dir[4096];
        struct stat sb;
        if (!template_path && stat(tok_path, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
            const char *slash = strrchr(tok_path, '/');
            snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - tok_path) : 1, slash ? tok_path : ".");
            tp = dir;
        }
        dt_status_t cs = dt_chat_load(tp, &chat_t);
        if (cs != DT_STATUS_OK && (template_path || cs != DT_STATUS_NOT_FOUND)) {
            fprintf(stderr, "dtrun tokenize: --template %s: %s\n", tp, dt_error_detail());
            goto out_free_tok;
        }
        o.chat = chat_t; /* NULL: no template; conversations are refused line by line */
        const char *eos = chat_t ? dt_chat_token(chat_t, "eos_token") : NULL;
        if (eos && *eos) o.eos_token = dt_tok_token_id(tok, eos);
    }
    int existing = 0;
    if (dt_tokenize_check(&o, &existing) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun tokenize: %s%s\n", dt_error_detail(), existing ? FORCE_HINT : "");
        goto out_free_tok;
    }
    const char *tty = getenv("DTRUN_PROGRESS_TTY");
    int live = tty ? !strcmp(tty, "1") : isatty(STDERR_FILENO);
    if (live) o.progress = draw_progress;
    /* DTRUN_PROGRESS_MS: the redraw interval (default 100 ms); 0 redraws at every
     * pass of the writer, which tests use so that the line does not depend on the
     * machine's speed. */
    const char *every = getenv("DTRUN_PROGRESS_MS");
    uint64_t every_ms;
    if (every && *every) {
        if (dt_arg_u64(every, 0, 60000, &every_ms)) {
            fprintf(stderr, "dtrun tokenize: DTRUN_PROGRESS_MS=%s: expected milliseconds from 0 to 60000\n", every);
            goto out_free_tok;
        }
        o.progress_ms = every_ms == 0 ? -1 : (int)every_ms;
    }
    catch_signals();
    dt_tokenize_progress sum;
    dt_status_t st = dt_tokenize_run(&o, &sum);
    if (live) fputs("\r\033[K", stderr);
    if (st == DT_STATUS_CANCELED && g_signal) {
        fprintf(stderr, "dtrun tokenize: stopped by signal %d: no shard written\n", (int)g_signal);
        rc = 128 + g_signal;
        goto out_free_tok;
    }
    if (st != DT_STATUS_OK) {
        if (sum.no_train)
            fprintf(stderr, "dtrun tokenize: the input gave %llu tokens, not more than --val-tokens %llu: no tokens left "
                            "for training (no shard written)\n", (unsigned long long)sum.tokens,
                    (unsigned long long)val_tokens);
        else
            fprintf(stderr, "dtrun tokenize: %s%s (no shard written)\n", dt_error_detail(),
                    sum.existing ? FORCE_HINT : "");
        rc = st == DT_STATUS_IO || st == DT_STATUS_SYS || st == DT_STATUS_NOMEM || st == DT_STATUS_LIMIT
                 ? DT_EXIT_FAILED
                 : DT_EXIT_USAGE;
        goto out_free_tok;
    }
    if (sum.stale_removed)
        fprintf(stderr, "dtrun tokenize: removed %d temporary file(s) of %s_* left by a killed run\n",
                sum.stale_removed, out);
    if (sum.invalid_utf8)
        fprintf(stderr,
                "dtrun tokenize: warning: %llu byte(s) of invalid UTF-8, the first at %s; encoded byte by byte "
                "as the tokenizer does\n",
                (unsigned long long)sum.invalid_utf8, sum.first_invalid);
    char rate[32];
    human(sum.seconds > 0 ? (double)sum.tokens / sum.seconds : 0, rate, sizeof rate);
    printf("tokenize: %llu documents%s, %llu bytes, %llu tokens (val %llu, train %llu) in %d %s shard(s) (vocab %u) %s_*.bin, "
           "%s tokens/s, %.2f s, %d jobs\n",
           (unsigned long long)sum.documents, sum.empty_documents ? " (and empty ones skipped)" : "",
           (unsigned long long)sum.bytes_done, (unsigned long long)sum.tokens, (unsigned long long)sum.val_tokens,
           (unsigned long long)sum.train_tokens, sum.shards,
           dt_shard_token_bytes(dt_tok_vocab_size(tok)) == 2 ? "uint16" : "uint32", dt_tok_vocab_size(tok), out, rate,
           sum.seconds,
           sum.jobs);
    if (chat) printf("tokenize: each shard's loss mask beside it (SHARD%s: --mask %s)\n", DT_MASK_SUFFIX,
                     mask_mode == DT_TOKENIZE_MASK_LAST ? "last" : mask_mode == DT_TOKENIZE_MASK_ALL ? "all" : "assistant");
    if (stats)
        printf("tokenize: %llu pieces; serial part (cutting pieces, writing and renaming shards) %.3f s of %.3f s\n",
               (unsigned long long)sum.pieces, sum.serial_s, sum.seconds);
    rc = DT_EXIT_OK;
out_free_tok:
    dt_chat_free(chat_t);
    dt_tok_free(tok);
out_free_inputs:
    free(inputs);
    return rc;
#undef BAD
}
