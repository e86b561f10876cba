/*
 * chat.h - a model's chat template, rendered as transformers'
 * tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)
 * renders it: the same template variables (messages with None-valued keys
 * dropped and reasoning fields aliased, add_generation_prompt, tools and
 * documents as None unless given, the tokenizer's special tokens as strings,
 * any further keyword arguments) through the Jinja renderer of jinja.h.
 *
 * Threads: a dt_chat_t is read-only after load; renders may run at once.
 */
#ifndef DT_RUNTIME_TOKENIZE_CHAT_H
#define DT_RUNTIME_TOKENIZE_CHAT_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "common/status.h"
#include "runtime/tokenize/jinja.h"

typedef struct dt_chat dt_chat_t;

/* path: a folder holding tokenizer_config.json (chat_template.jinja beside it, when
 * present, is the template, as transformers prefers it), or that file itself, or a
 * .jinja file holding the template alone (then no special tokens). Reads
 * chat_template (a string, or a list of {name, template}: the one named "default")
 * and the special tokens transformers passes to the template: bos_token, eos_token,
 * unk_token, sep_token, pad_token, cls_token, mask_token and any other "*_token" key,
 * each a string or an AddedToken object {"content": ...}; special_tokens_map.json
 * beside it fills those tokenizer_config.json does not set. A template construct the
 * renderer does not support is DT_STATUS_UNSUPPORTED naming it and its line; no
 * chat_template is DT_STATUS_NOT_FOUND naming the file. */
dt_status_t dt_chat_load(const char *path, dt_chat_t **out);
void dt_chat_free(dt_chat_t *c);

/* Renders messages (a cJSON array of message objects as Hugging Face datasets hold
 * them: role, content and any other keys) as apply_chat_template(messages,
 * tokenize=False, add_generation_prompt=...) does. extra (may be NULL): further
 * template variables as a JSON object (tools, documents, enable_thinking, ...; they
 * override special tokens of the same name). *out is malloc'ed, NUL-terminated, *len
 * its length. An empty conversation or a message that is not an object is
 * DT_STATUS_INVALID (transformers raises too); so is a raise_exception() of the
 * template, with its message. */
dt_status_t dt_chat_render(const dt_chat_t *c, const cJSON *messages, int add_generation_prompt,
                           const cJSON *extra, char **out, size_t *len);

/* The same, also returning the byte spans of the output that {% generation %}
 * blocks wrote (what transformers' return_assistant_tokens_mask marks; transformers
 * counts characters, these are bytes of the UTF-8 text). *spans is malloc'ed (NULL
 * when none). */
dt_status_t dt_chat_render_spans(const dt_chat_t *c, const cJSON *messages, int add_generation_prompt,
                                 const cJSON *extra, char **out, size_t *len, dt_jinja_span **spans,
                                 size_t *nspans);

/* The template's source name for messages ("tests/fixtures/chat/qwen2.5/tokenizer_config.json"). */
const char *dt_chat_source(const dt_chat_t *c);
/* 1 when the template marks the assistant's text with {% generation %} blocks. */
int dt_chat_has_generation(const dt_chat_t *c);
/* The special token named key ("eos_token"), or NULL. */
const char *dt_chat_token(const dt_chat_t *c, const char *key);

#endif /* DT_RUNTIME_TOKENIZE_CHAT_H */
