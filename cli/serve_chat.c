/*
 * serve_chat.c - chat messages to a prompt for POST /v1/chat/completions (serve.h), through the
 * model folder's chat template. There is no Jinja engine here: a template is recognised when
 * its text is one of the templates below (compared in a canonical form: whitespace inside
 * {{ }} and {% %} collapsed, string literals unescaped and requoted, which changes nothing a
 * template renders), and rendered by C code that does what that text does under transformers'
 * settings (trim_blocks, lstrip_blocks, add_generation_prompt true):
 *   chatml   ChatML as transformers' documentation gives it (with or without its
 *            "add_generation_prompt is defined" preamble)
 *   zephyr   HuggingFaceH4/zephyr-7b-beta, TinyLlama-1.1B-Chat-v1.0
 *   llama-2  meta-llama/Llama-2-*-chat-hf (system prompt in <<SYS>>, roles must alternate)
 *   llama-3  meta-llama/Meta-Llama-3-*-Instruct
 * Any other template is refused, never guessed at (tests/cli/test_serve_chat.c holds each
 * template's renderings as Jinja2 made them).
 */
#include <ctype.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/serve.h"

/* ---- a growing string ---- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void putn(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void put(sbuf *b, const char *s) { putn(b, s, strlen(s)); }

static void putc_(sbuf *b, char c) { putn(b, &c, 1); }

/* The string made, or NULL (out of memory); "" for nothing. */
static char *take(sbuf *b) {
    if (!b->oom && !b->p) put(b, "");
    if (b->oom) {
        free(b->p);
        return NULL;
    }
    return b->p;
}

/* ---- recognising a template ---- */

/* Copy the string literal at t + i (quote t[i]) into b with its escapes decoded (\n \t \r \\
 * \' \"; any other escape kept as written) and requoted with ' (escaping \ and '): the index
 * past it, or 0 when it does not end. */
static size_t literal(const char *t, size_t i, sbuf *b) {
    char q = t[i++];
    putc_(b, '\'');
    while (t[i] && t[i] != q) {
        char c = t[i++];
        if (c == '\\' && t[i]) {
            char x = t[i++];
            if (x == 'n') c = '\n';
            else if (x == 't') c = '\t';
            else if (x == 'r') c = '\r';
            else if (x == '\\' || x == '\'' || x == '"') c = x;
            else {
                putc_(b, '\\');
                putc_(b, x);
                continue;
            }
        }
        if (c == '\\' || c == '\'') putc_(b, '\\');
        putc_(b, c);
    }
    if (!t[i]) return 0;
    putc_(b, '\'');
    return i + 1;
}

/* The tag at t + i ({{ or {%) in canonical form into b: the index past it, 0 when it does not
 * end. */
static size_t tag(const char *t, size_t i, sbuf *b) {
    char close = t[i + 1] == '{' ? '}' : '%';
    putn(b, t + i, 2);
    i += 2;
    int space = 0, first = 1;
    while (t[i] && !(t[i] == close && t[i + 1] == '}')) {
        if (isspace((unsigned char)t[i])) {
            space = 1;
            i++;
            continue;
        }
        if (space && !first) putc_(b, ' ');
        space = first = 0;
        if (t[i] == '\'' || t[i] == '"') {
            if (!(i = literal(t, i, b))) return 0;
        } else {
            putc_(b, t[i++]);
        }
    }
    if (!t[i]) return 0;
    putc_(b, close);
    putc_(b, '}');
    return i + 2;
}

/* Template text t in canonical form (malloc'ed), NULL when a tag or comment does not end (or
 * out of memory). Text outside tags and comments is kept as it is. */
static char *canonical(const char *t) {
    sbuf b = {0};
    size_t i = 0;
    while (t[i] && !b.oom) {
        if (t[i] == '{' && t[i + 1] == '#') {
            const char *end = strstr(t + i + 2, "#}");
            if (!end) break;
            putn(&b, t + i, (size_t)(end + 2 - (t + i)));
            i = (size_t)(end + 2 - t);
        } else if (t[i] == '{' && (t[i + 1] == '{' || t[i + 1] == '%')) {
            size_t next = tag(t, i, &b);
            if (!next) break;
            i = next;
        } else {
            putc_(&b, t[i++]);
        }
    }
    if (t[i]) b.oom = 1; /* stopped early: not a template this recognises */
    return take(&b);
}

static const struct known {
    serve_chat_kind kind;
    const char *text;
} known[] = {
    {CHAT_CHATML,
     "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
     "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
     "{{ '<|im_start|>assistant\n' }}{% endif %}"},
    {CHAT_CHATML,
     "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}"
     "{% endif %}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
     "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
     "{{ '<|im_start|>assistant\n' }}{% endif %}"},
    {CHAT_ZEPHYR,
     "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
     "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n"
     "{{ '<|system|>\n' + message['content'] + eos_token }}\n"
     "{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + "
     "eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n"
     "{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"},
    {CHAT_LLAMA2,
     "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
     "{% set system_message = messages[0]['content'] %}{% else %}"
     "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
     "{% for message in loop_messages %}{% if (message['role'] == 'user') != "
     "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
     "user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and "
     "system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
     "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}"
     "{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
     "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
     "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
     "{% endif %}{% endfor %}"},
    {CHAT_LLAMA3,
     "{% set loop_messages = messages %}{% for message in loop_messages %}"
     "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ "
     "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
     "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
     "{% endif %}"},
};

serve_chat_kind serve_chat_recognise(const char *t) {
    char *c = canonical(t);
    serve_chat_kind k = CHAT_UNKNOWN;
    for (size_t i = 0; c && k == CHAT_UNKNOWN && i < sizeof known / sizeof known[0]; i++) {
        char *kc = canonical(known[i].text);
        if (kc && !strcmp(c, kc)) k = known[i].kind;
        free(kc);
    }
    free(c);
    return k;
}

const char *serve_chat_name(serve_chat_kind k) {
    static const char *const names[] = {"none", "unknown", "chatml", "zephyr", "llama-2",
                                        "llama-3"};
    return k >= CHAT_NONE && k <= CHAT_LLAMA3 ? names[k] : "unknown";
}

/* ---- loading it ---- */

/* A special token of tokenizer_config.json: a string or {"content": string}; "" otherwise. */
static char *special(const json_t *cfg, const char *key) {
    const json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return strdup(json_is_string(v) ? json_string_value(v) : "");
}

/* The template text of a chat_template value: a string, or the list entry named "default". */
static const char *template_of(const json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e) {
        const json_t *name = json_object_get(e, "name"), *t = json_object_get(e, "template");
        if (json_is_string(name) && !strcmp(json_string_value(name), "default") &&
            json_is_string(t))
            return json_string_value(t);
    }
    return NULL;
}

static void set_note(serve_chat *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_note(serve_chat *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->note, sizeof c->note, fmt, ap);
    va_end(ap);
}

/* The text of file path (malloc'ed), NULL when it cannot be read. */
static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    sbuf b = {0};
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) putn(&b, chunk, n);
    int bad = ferror(f);
    fclose(f);
    if (bad) b.oom = 1;
    return take(&b);
}

/* The template of chat_template.jinja in dir, when there is one. */
static void load_jinja(const char *dir, serve_chat *c) {
    char path[4096];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    char *t = read_text(path);
    if (!t) return;
    c->kind = serve_chat_recognise(t);
    set_note(c, "chat_template.jinja");
    free(t);
}

/* The template of model folder dir into c (its note says where it came from or why not). */
static void load_dir(const char *dir, serve_chat *c) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_error_t err;
    json_t *cfg = json_load_file(path, JSON_DECODE_ANY, &err);
    if (cfg) {
        c->bos = special(cfg, "bos_token");
        c->eos = special(cfg, "eos_token");
    } else {
        set_note(c, "tokenizer_config.json: %s", err.text);
    }
    const json_t *v = json_object_get(cfg, "chat_template");
    const char *t = template_of(v);
    if (t) {
        c->kind = serve_chat_recognise(t);
        set_note(c, "tokenizer_config.json");
    } else if (v) {
        c->kind = CHAT_UNKNOWN;
        set_note(c, "tokenizer_config.json: chat_template is neither a string nor a list with "
                    "a \"default\" entry");
    } else {
        if (cfg) set_note(c, "tokenizer_config.json has no chat_template");
        load_jinja(dir, c);
    }
    json_decref(cfg);
}

void serve_chat_load(const char *dir, serve_chat *out) {
    *out = (serve_chat){.kind = CHAT_NONE};
    set_note(out, "the builtin models have none");
    if (dir) load_dir(dir, out);
    if (!out->bos) out->bos = strdup("");
    if (!out->eos) out->eos = strdup("");
    if (!out->bos || !out->eos) { /* out of memory: nothing to render with */
        serve_chat_free(out);
        out->kind = CHAT_UNKNOWN;
        set_note(out, "out of memory");
    }
}

void serve_chat_free(serve_chat *c) {
    free(c->bos);
    free(c->eos);
    c->bos = c->eos = NULL;
}

/* ---- rendering ---- */

/* Whether code point u is whitespace to Python's str.strip (Jinja's trim, .strip()). */
static int py_space(uint32_t u) {
    return (u >= 0x09 && u <= 0x0D) || (u >= 0x1C && u <= 0x20) || u == 0x85 || u == 0xA0 ||
           u == 0x1680 || (u >= 0x2000 && u <= 0x200A) || u == 0x2028 || u == 0x2029 ||
           u == 0x202F || u == 0x205F || u == 0x3000;
}

/* The code point of the UTF-8 sequence at s (*len its bytes; 1 for a stray byte). */
static uint32_t utf8_at(const unsigned char *s, size_t left, size_t *len) {
    size_t n = s[0] < 0x80 ? 1 : s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC0 ? 2 : 1;
    if (n > left) n = 1;
    uint32_t u = n == 1 ? s[0] : (uint32_t)(s[0] & (0x7F >> n));
    for (size_t k = 1; k < n; k++) u = u << 6 | (s[k] & 0x3F);
    *len = n;
    return u;
}

/* s with Python's whitespace stripped from both ends, appended to b. */
static void put_stripped(sbuf *b, const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, e = strlen(s), k;
    while (a < e && py_space(utf8_at(u + a, e - a, &k))) a += k;
    while (e > a) {
        size_t start = e - 1;
        while (start > a && (u[start] & 0xC0) == 0x80) start--;
        if (!py_space(utf8_at(u + start, e - start, &k))) break;
        e = start;
    }
    putn(b, s + a, e - a);
}

static void render_chatml(sbuf *o, const serve_chat_msg *m, int n) {
    for (int i = 0; i < n; i++) {
        put(o, "<|im_start|>");
        put(o, m[i].role);
        put(o, "\n");
        put(o, m[i].content);
        put(o, "<|im_end|>\n");
    }
    put(o, "<|im_start|>assistant\n");
}

static void render_zephyr(sbuf *o, const serve_chat *c, const serve_chat_msg *m, int n) {
    for (int i = 0; i < n; i++) {
        const char *head = !strcmp(m[i].role, "user")        ? "<|user|>\n"
                           : !strcmp(m[i].role, "system")    ? "<|system|>\n"
                           : !strcmp(m[i].role, "assistant") ? "<|assistant|>\n"
                                                             : NULL;
        if (head) {
            put(o, head);
            put(o, m[i].content);
            put(o, c->eos);
            put(o, "\n");
        }
        if (i == n - 1) put(o, "<|assistant|>\n");
    }
}

static int render_llama2(sbuf *o, const serve_chat *c, const serve_chat_msg *m, int n,
                         char *err, size_t cap) {
    int first = n > 0 && !strcmp(m[0].role, "system");
    for (int i = first; i < n; i++) {
        int user = !strcmp(m[i].role, "user"), k = i - first;
        if (user != (k % 2 == 0)) {
            snprintf(err, cap, "Conversation roles must alternate "
                               "user/assistant/user/assistant/... (the model's llama-2 chat "
                               "template; a system message may come first)");
            return -1;
        }
        sbuf content = {0};
        if (k == 0 && first) {
            put(&content, "<<SYS>>\n");
            put(&content, m[0].content);
            put(&content, "\n<</SYS>>\n\n");
        }
        put(&content, m[i].content);
        char *text = take(&content);
        if (!text) o->oom = 1;
        else if (user) {
            put(o, c->bos);
            put(o, "[INST] ");
            put_stripped(o, text);
            put(o, " [/INST]");
        } else if (!strcmp(m[i].role, "assistant")) {
            put(o, " ");
            put_stripped(o, text);
            put(o, " ");
            put(o, c->eos);
        }
        free(text);
    }
    return 0;
}

static void render_llama3(sbuf *o, const serve_chat *c, const serve_chat_msg *m, int n) {
    for (int i = 0; i < n; i++) {
        if (i == 0) put(o, c->bos);
        put(o, "<|start_header_id|>");
        put(o, m[i].role);
        put(o, "<|end_header_id|>\n\n");
        put_stripped(o, m[i].content);
        put(o, "<|eot_id|>");
    }
    put(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

int serve_chat_render(const serve_chat *c, const serve_chat_msg *m, int n, char **text,
                      char *err, size_t cap) {
    sbuf o = {0};
    int rc = 0;
    *text = NULL;
    switch (c->kind) {
    case CHAT_CHATML: render_chatml(&o, m, n); break;
    case CHAT_ZEPHYR: render_zephyr(&o, c, m, n); break;
    case CHAT_LLAMA2: rc = render_llama2(&o, c, m, n, err, cap); break;
    case CHAT_LLAMA3: render_llama3(&o, c, m, n); break;
    default:
        snprintf(err, cap, "the model has no chat template this server renders");
        rc = -1;
    }
    char *t = take(&o);
    if (rc == 0 && !t) {
        snprintf(err, cap, "out of memory");
        rc = -1;
    }
    if (rc == 0) *text = t;
    else free(t);
    return rc;
}
