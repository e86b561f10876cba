/*
 * cmd_sample.c - dtrun sample SOURCE [--prompt TEXT | --prompt-ids 3,17,42]
 * [--tokens N] [--temperature T] [--top_k K] [--seed S] [--ids] [--device
 * auto|cpu|cuda] [--seq-len N]: tokens from a checkpoint's or a Hugging Face
 * directory's parameters (read by runtime/ckpt: checkpoint.h, hf_load.h; sampled by
 * runtime/model/sample.h, with a KV cache when the model and device have one). With a tokenizer
 * (--tokenizer PATH, or SOURCE/tokenizer.json of a Hugging Face directory;
 * runtime/tokenize/tok.h) the prompt and the output are text, the prompt encoded as
 * `dtrun tokenize` encodes a document, the document token first. Without one,
 * byte-level models (vocab up to 256, text data) read and print bytes, and larger
 * vocabularies read and print token ids, said so on stderr. --ids prints ids (comma-separated) for any model; --logits (for checks)
 * prints the logits of every prompt position first, one line each.
 */
#include <cjson/cJSON.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h" /* defines: dt_arg_double */
#include "cli/commands.h"
#include "common/mem.h"
#include "kernels/kernels.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/ckpt/hf_load.h" /* defines: dt_hf_load_params, dt_hf_is_dir */
#include "runtime/model/net.h"
#include "runtime/model/sample.h"
#include "runtime/tokenize/chat.h" /* defines: dt_chat_load, dt_chat_render */
#include "runtime/tokenize/tok.h"

static const char sample_usage[] =
    "usage: dtrun sample SOURCE [--prompt TEXT | --prompt-ids 3,17,42] [--tokens N] [--temperature T]\n"
    "                    [--top_k K] [--seed S] [--ids] [--device auto|cpu|cuda]\n"
    "                    [--seq-len N] [--threads N] [--tokenizer PATH]\n"
    "  SOURCE: a step directory, a checkpoint.dir (its latest), or a Hugging Face directory\n"
    "  (config.json + safetensors: llama, mistral, qwen2, gpt2; its context: n_positions, or\n"
    "  max_position_embeddings up to 2048 unless --seq-len N). Defaults: --tokens 200,\n"
    "  --temperature 0.8 (0 = greedy), --top_k 0 (all), --seed 1, --device auto, --threads: the\n"
    "  CPU's cores (one token at a time is many small ops: on a busy machine 1 can be faster).\n"
    "  --tokenizer: a tokenizer.json (or its folder) to read --prompt and print text with, for\n"
    "  vocabularies over 256 (default: SOURCE/tokenizer.json of a Hugging Face directory); the\n"
    "  prompt is encoded after the document token, as dtrun tokenize writes each document.\n"
    "  --prompt-ids: the prompt as token ids. --ids: print the generated ids, comma-separated,\n"
    "  instead of text. For checks: --logits prints the logits of every prompt position (one\n"
    "  line each, vocab_size numbers) before the output; --no-cache runs a full forward per\n"
    "  token instead of the KV cache.\n"
    "  --chat: --prompt is a user's message (or --messages FILE: a JSON array of messages, or a\n"
    "  jsonl line holding \"messages\"), --system TEXT a system message before it; the\n"
    "  conversation is rendered with the chat template (--template: a tokenizer_config.json, a\n"
    "  folder holding one, or a .jinja file; default: tokenizer_config.json beside the\n"
    "  tokenizer) and its generation prompt, and the assistant's reply is printed, up to the\n"
    "  template's end-of-sequence token.\n";

static int bad(const char *fmt, const char *a) {
    fprintf(stderr, "dtrun sample: ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\n%s", sample_usage);
    return DT_EXIT_USAGE;
}

/* "15496 11 995" or "15496,11,995" -> ids. */
static int parse_ids(const char *s, int32_t **ids, int *n) {
    *n = 0;
    *ids = dt_xcalloc(strlen(s) / 2 + 2, sizeof **ids);
    while (*s) {
        while (*s == ' ' || *s == ',') s++;
        if (!*s) break;
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 1 << 30) return 0;
        (*ids)[(*n)++] = (int32_t)v;
        s = end;
    }
    return 1;
}

/* The conversation of --chat: --messages FILE's array (or a jsonl line's
 * "messages"), else [--system, the user's --prompt]. NULL with a message printed. */
static cJSON *chat_messages(const char *messages_path, const char *system, const char *prompt) {
    if (messages_path) {
        FILE *f = fopen(messages_path, "rb");
        if (!f) {
            fprintf(stderr, "dtrun sample: --messages %s: cannot open it\n", messages_path);
            return NULL;
        }
        char *buf = dt_xmalloc(1 << 20);
        size_t n = fread(buf, 1, (1 << 20) - 1, f);
        int more = fgetc(f) != EOF;
        fclose(f);
        buf[n] = 0;
        cJSON *j = more ? NULL : cJSON_Parse(buf);
        free(buf);
        cJSON *m = cJSON_IsArray(j) ? j : NULL;
        if (!m && cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "messages"))) {
            m = cJSON_DetachItemFromObjectCaseSensitive(j, "messages");
            cJSON_Delete(j);
        } else if (!m) {
            cJSON_Delete(j);
        }
        if (!m) fprintf(stderr, "dtrun sample: --messages %s: %s\n", messages_path,
                        more ? "larger than 1 MiB" : "not a JSON array of messages nor an object with \"messages\"");
        return m;
    }
    cJSON *m = cJSON_CreateArray();
    if (system) {
        cJSON *sm = cJSON_CreateObject();
        cJSON_AddStringToObject(sm, "role", "system");
        cJSON_AddStringToObject(sm, "content", system);
        cJSON_AddItemToArray(m, sm);
    }
    cJSON *um = cJSON_CreateObject();
    cJSON_AddStringToObject(um, "role", "user");
    cJSON_AddStringToObject(um, "content", prompt ? prompt : "");
    cJSON_AddItemToArray(m, um);
    return m;
}

/* --chat: the rendered conversation's ids into *ids, and the stop ids (the
 * template's eos_token) into stop[0..*n_stop). 0 with a message printed. */
static int chat_prompt(const char *template_path, const char *tok_path, const dt_tok_t *tok, cJSON *msgs,
                       int32_t **ids, int *n_ids, int32_t *stop, int *n_stop) {
    char dir[4096];
    const char *tp = template_path;
    struct stat sb;
    if (!tp && stat(tok_path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        tp = tok_path;
    } else if (!tp) { /* the tokenizer.json's folder */
        const char *slash = strrchr(tok_path, '/');
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - tok_path) : 1, slash ? tok_path : ".");
        tp = dir;
    }
    dt_chat_t *c = NULL;
    char *text = NULL;
    size_t len = 0;
    int ok = 0;
    if (dt_chat_load(tp, &c) != DT_STATUS_OK || dt_chat_render(c, msgs, 1, NULL, &text, &len) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun sample: --chat: %s\n", dt_error_detail());
        goto out;
    }
    dt_tok_ids enc = {0};
    dt_tok_enc_t *e = dt_tok_enc_new(tok);
    dt_status_t st = dt_tok_encode(e, text, len, 1, &enc);
    dt_tok_enc_free(e);
    if (st != DT_STATUS_OK || enc.n == 0) {
        fprintf(stderr, "dtrun sample: --chat: %s\n", st != DT_STATUS_OK ? dt_error_detail() : "the rendered prompt is empty");
        free(enc.ids);
        goto out;
    }
    *n_ids = (int)enc.n;
    *ids = dt_xcalloc(enc.n, sizeof **ids);
    for (size_t i = 0; i < enc.n; i++) (*ids)[i] = (int32_t)enc.ids[i];
    free(enc.ids);
    *n_stop = 0;
    const char *eos = dt_chat_token(c, "eos_token");
    int64_t id = eos && *eos ? dt_tok_token_id(tok, eos) : -1;
    if (id >= 0) stop[(*n_stop)++] = (int32_t)id;
    ok = 1;
out:
    free(text);
    dt_chat_free(c);
    return ok;
}

int dt_cmd_sample(int argc, char **argv) {
    const char *path = NULL, *prompt = NULL, *prompt_ids = NULL, *device = "auto", *tok_path = NULL;
    const char *template_path = NULL, *system = NULL, *messages_path = NULL;
    int print_ids = 0, print_logits = 0, seq_len = 0, threads = 0, chat = 0, n_stop = 0;
    int32_t stop[1];
    dt_sample_opts o = {.tokens = 200, .temperature = 0.8, .top_k = 0, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        double v;
        int has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(sample_usage, stdout);
            return DT_EXIT_OK;
        } else if (!strcmp(a, "--prompt") && has) prompt = argv[++i];
        else if ((!strcmp(a, "--prompt-ids") || !strcmp(a, "--prompt_ids")) && has) prompt_ids = argv[++i];
        else if (!strcmp(a, "--ids")) print_ids = 1;
        else if (!strcmp(a, "--tokenizer") && has) tok_path = argv[++i];
        else if (!strcmp(a, "--logits")) print_logits = 1;
        else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--template") && has) template_path = argv[++i];
        else if (!strcmp(a, "--system") && has) system = argv[++i];
        else if (!strcmp(a, "--messages") && has) messages_path = argv[++i];
        else if (!strcmp(a, "--no-cache") || !strcmp(a, "--no_cache")) o.no_cache = 1;
        else if (!strcmp(a, "--device") && has) device = argv[++i];
        else if (!strcmp(a, "--threads") && has) {
            if (dt_arg_double(argv[++i], 1, 4096, &v) || v != (int)v) return bad("--threads wants a count > 0, got '%s'", argv[i]);
            threads = (int)v;
        } else if ((!strcmp(a, "--seq-len") || !strcmp(a, "--seq_len")) && has) {
            if (dt_arg_double(argv[++i], 1, 1 << 24, &v) || v != (int)v) return bad("--seq-len wants a count > 0, got '%s'", argv[i]);
            seq_len = (int)v;
        }
        else if (!strcmp(a, "--tokens") && has) {
            if (dt_arg_double(argv[++i], 0, 1e7, &v) || v != (int)v) return bad("--tokens wants a count, got '%s'", argv[i]);
            o.tokens = (int)v;
        } else if (!strcmp(a, "--temperature") && has) {
            if (dt_arg_double(argv[++i], 0, 100, &v)) return bad("--temperature wants a number in [0, 100], got '%s'", argv[i]);
            o.temperature = v;
        } else if ((!strcmp(a, "--top_k") || !strcmp(a, "--top-k")) && has) {
            if (dt_arg_double(argv[++i], 0, 1e7, &v) || v != (int)v) return bad("--top_k wants a count, got '%s'", argv[i]);
            o.top_k = (int)v;
        } else if (!strcmp(a, "--seed") && has) {
            if (dt_arg_double(argv[++i], 0, 9e15, &v) || v != (double)(uint64_t)v) return bad("--seed wants an integer >= 0, got '%s'", argv[i]);
            o.seed = (uint64_t)v;
        } else if (a[0] == '-') return bad("unknown flag or missing value: %s", a);
        else if (!path) path = a;
        else return bad("unexpected argument %s", a);
    }
    if (!path) return bad("%s", "no SOURCE given");
    if (prompt && prompt_ids) return bad("%s", "--prompt and --prompt-ids both given: pick one");
    if ((template_path || system || messages_path) && !chat) return bad("%s", "--template, --system and --messages go with --chat");
    if (chat && prompt_ids) return bad("%s", "--chat takes --prompt or --messages, not --prompt-ids");
    if (chat && messages_path && (prompt || system)) return bad("%s", "--messages holds the whole conversation: no --prompt or --system beside it");
    dt_device_kind_t kind;
    if (!strcmp(device, "cpu")) kind = DT_DEVICE_CPU;
    else if (!strcmp(device, "cuda")) kind = DT_DEVICE_CUDA;
    else if (!strcmp(device, "auto")) kind = dt_device_count(DT_DEVICE_CUDA) > 0 ? DT_DEVICE_CUDA : DT_DEVICE_CPU;
    else return bad("--device wants auto, cpu or cuda, got '%s'", device);

    dt_ckpt_t *ck = NULL;
    dt_model_layout l;
    float *host = NULL;
    int hf = dt_hf_is_dir(path), seq_len_max = 0;
    if (!hf && seq_len > 0) return bad("%s", "--seq-len is for Hugging Face directories (a checkpoint has its own)");
    if ((hf ? dt_hf_load_params(path, seq_len, &l, &host, &seq_len_max)
            : dt_ckpt_load_params(path, &ck, &l, &host)) != DT_STATUS_OK) {
        if (seq_len_max > 0) fprintf(stderr, "dtrun sample: --seq-len %d: %s\n", seq_len, dt_error_detail());
        else fprintf(stderr, "dtrun sample: %s\n", dt_error_detail());
        return DT_EXIT_USAGE;
    }
    const char *source = hf ? path : dt_ckpt_path(ck);
    int rc = DT_EXIT_FAILED, text = l.spec.vocab_size <= 256;
    int32_t *ids = NULL, *out = NULL;
    float *logits = NULL;
    int n_ids = 0;
    dt_device_t *dev = NULL;
    dt_tok_t *tok = NULL;
    char *textbuf = NULL;
    size_t text_len = 0, text_cap = 0;
    dt_sample_net sn;
    int have_net = 0;
    if (l.spec.ops->logits_slot < 0) {
        fprintf(stderr, "dtrun sample: %s holds a model without logits (%s); sampling needs a token model such as gpt\n",
                source, l.spec.ops->name);
        rc = DT_EXIT_USAGE;
        goto out_free;
    }
    { /* a tokenizer when there is one; else bytes for vocabularies up to 256 */
        char dflt[4096];
        snprintf(dflt, sizeof dflt, "%s/tokenizer.json", path);
        if (!tok_path && hf && access(dflt, F_OK) == 0) tok_path = dflt;
        if (tok_path && dt_tok_load(tok_path, &tok) != DT_STATUS_OK) {
            fprintf(stderr, "dtrun sample: --tokenizer: %s\n", dt_error_detail());
            rc = DT_EXIT_USAGE;
            goto out_free;
        }
        if (tok && dt_tok_vocab_size(tok) > (uint32_t)l.spec.vocab_size) {
            fprintf(stderr, "dtrun sample: the tokenizer %s has %u ids but the model's vocabulary is %d: not the "
                            "model's tokenizer\n", tok_path, dt_tok_vocab_size(tok), l.spec.vocab_size);
            rc = DT_EXIT_USAGE;
            goto out_free;
        }
        if (tok) text = 0;
    }
    if (chat) {
        if (!tok) {
            fprintf(stderr, "dtrun sample: --chat needs a tokenizer (--tokenizer PATH, or a Hugging Face SOURCE with "
                            "tokenizer.json)\n");
            rc = DT_EXIT_USAGE;
            goto out_free;
        }
        cJSON *msgs = chat_messages(messages_path, system, prompt);
        int ok = msgs && chat_prompt(template_path, tok_path, tok, msgs, &ids, &n_ids, stop, &n_stop);
        cJSON_Delete(msgs);
        if (!ok) {
            rc = DT_EXIT_USAGE;
            goto out_free;
        }
        o.stop = stop;
        o.n_stop = n_stop;
    } else if (prompt_ids) {
        if (!parse_ids(prompt_ids, &ids, &n_ids) || n_ids == 0) {
            fprintf(stderr, "dtrun sample: --prompt-ids '%s' is not a list of token ids (3,17,42)\n", prompt_ids);
            rc = DT_EXIT_USAGE;
            goto out_free;
        }
    } else if (text) {
        const char *p = prompt && *prompt ? prompt : "\n";
        n_ids = (int)strlen(p);
        ids = dt_xcalloc((size_t)n_ids, sizeof *ids);
        for (int i = 0; i < n_ids; i++) ids[i] = (unsigned char)p[i];
    } else if (tok) {
        dt_tok_ids enc = {0};
        int64_t doc = dt_tok_doc_token(tok);
        if (doc >= 0) dt_tok_ids_push(&enc, (uint32_t)doc);
        dt_tok_enc_t *e = dt_tok_enc_new(tok);
        dt_status_t st = prompt ? dt_tok_encode(e, prompt, strlen(prompt), 1, &enc) : DT_STATUS_OK;
        dt_tok_enc_free(e);
        if (st != DT_STATUS_OK || enc.n == 0) {
            fprintf(stderr, "dtrun sample: --prompt: %s\n",
                    st != DT_STATUS_OK ? dt_error_detail() : "empty, and the tokenizer has no document token to start from");
            free(enc.ids);
            rc = DT_EXIT_USAGE;
            goto out_free;
        }
        n_ids = (int)enc.n;
        ids = dt_xcalloc(enc.n, sizeof *ids);
        for (size_t i = 0; i < enc.n; i++) ids[i] = (int32_t)enc.ids[i];
        free(enc.ids);
    } else {
        fprintf(stderr, "dtrun sample: vocabulary of %d tokens and no tokenizer here: the prompt is read as token "
                        "ids and the output printed as token ids\n", l.spec.vocab_size);
        if (prompt && *prompt) {
            if (!parse_ids(prompt, &ids, &n_ids) || n_ids == 0) {
                fprintf(stderr, "dtrun sample: --prompt '%s' is not a list of token ids\n", prompt);
                rc = DT_EXIT_USAGE;
                goto out_free;
            }
        } else {
            ids = dt_xcalloc(1, sizeof *ids);
            ids[0] = l.spec.vocab_size > 50256 ? 50256 : 0; /* GPT-2's <|endoftext|> */
            n_ids = 1;
        }
    }
    for (int i = 0; i < n_ids; i++)
        if (ids[i] >= l.spec.vocab_size) {
            fprintf(stderr, "dtrun sample: prompt token %d is outside the vocabulary [0, %d) of %s\n", ids[i],
                    l.spec.vocab_size, source);
            rc = DT_EXIT_USAGE;
            goto out_free;
        }
    if (print_logits) {
        int kept = n_ids < l.seq_len ? n_ids : l.seq_len;
        logits = dt_xcalloc((size_t)kept * (size_t)l.spec.vocab_size, sizeof *logits);
        o.prompt_logits = logits;
    }
    if (dt_device_init(&dev, kind, threads) != DT_STATUS_OK) {
        if (strcmp(device, "auto") != 0 || dt_device_init(&dev, DT_DEVICE_CPU, threads) != DT_STATUS_OK) goto out_error;
    }
    if (dt_sample_net_init(&sn, dev, &l, host, DT_MEM_PARAMS) != DT_STATUS_OK) goto out_error;
    have_net = 1;
    out = dt_xcalloc((size_t)o.tokens + 1, sizeof *out);
    if (dt_sample_run(&sn, ids, n_ids, &o, out) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun sample: %s\n", dt_error_detail());
        rc = DT_EXIT_USAGE;
        goto out_free;
    }
    fprintf(stderr,
            "dtrun sample: %s (%s %lld), %s, %d tokens, temperature %g, top_k %d, seed %llu; %llu positions "
            "computed (%s)\n",
            source, hf ? "seq_len" : "step", hf ? (long long)l.seq_len : (long long)dt_ckpt_step(ck),
            dt_device_kind_name(dev->kind), o.tokens, o.temperature,
            o.top_k, (unsigned long long)o.seed, (unsigned long long)dt_sample_rows_run(&sn),
            sn.have_dec && !o.no_cache ? "KV cache" : "a full forward per token");
    if (print_logits) {
        int kept = n_ids < l.seq_len ? n_ids : l.seq_len;
        for (int p = 0; p < kept; p++) {
            const float *row = logits + (size_t)p * (size_t)l.spec.vocab_size;
            for (int v = 0; v < l.spec.vocab_size; v++) printf("%s%.9g", v ? " " : "", row[v]);
            putchar('\n');
        }
    }
    int got = 0; /* generated, up to a stop id (which a chat reply does not print) */
    while (got < o.tokens && out[got] >= 0) got++;
    if (print_ids) {
        for (int i = 0; i < got; i++) printf("%s%d", i ? "," : "", out[i]);
        putchar('\n');
    } else if (o.tokens == 0) {
        /* nothing generated */
    } else if (tok) {
        if (prompt && !chat) fputs(prompt, stdout);
        if (chat && got > 0 && n_stop && out[got - 1] == stop[0]) got--;
        if (dt_tok_decode(tok, (const uint32_t *)out, (size_t)got, &textbuf, &text_len, &text_cap) !=
            DT_STATUS_OK)
            goto out_error;
        fwrite(textbuf, 1, text_len, stdout);
        putchar('\n');
    } else if (text) {
        if (prompt) fputs(prompt, stdout);
        for (int i = 0; i < o.tokens; i++) {
            putchar(dt_sample_char(out[i], 0));
        }
        putchar('\n');
    } else {
        for (int i = 0; i < o.tokens; i++) printf("%s%d", i ? " " : "", out[i]);
        putchar('\n');
    }
    rc = DT_EXIT_OK;
    goto out_free;
out_error:
    fprintf(stderr, "dtrun sample: %s\n", dt_error_detail());
out_free:
    if (have_net) dt_sample_net_free(&sn);
    dt_tok_free(tok);
    free(textbuf);
    dt_device_free(dev);
    free(ids);
    free(out);
    free(logits);
    dt_mem_free(host);
    dt_model_layout_free(&l);
    if (ck) dt_ckpt_close(ck);
    return rc;
}
