/*
 * serve_api.c - the routes of `flexdiag serve` (serve.h): GET /v1/models and /metrics,
 * POST /v1/images/generations, /v1/completions and /v1/chat/completions, as OpenAI shapes them.
 *
 * A POST body is a JSON object checked field by field against the route's table: an unknown
 * field, a wrong type or a value out of range is a 400 whose error names the field (param).
 * The checked request runs as a job (serve_job.c: flexdiag_submit without waiting for room, so
 * a full queue is a 429; past the server's timeout it is cancelled: 504; a client that hangs
 * up cancels it). With "stream": true the reply is a stream of server-sent events
 * (serve_stream.c). Images are decoded and encoded as the PNG bytes `flexdiag generate` writes,
 * base64 in b64_json; image i of a request is image index i of its seed, as generate's image i
 * of one prompt. Chat messages become a completion's text prompt through the model's chat
 * template (serve_chat.c).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/serve_run.h"

/* Bytes of the valid UTF-8 sequence at s (RFC 3629: no overlong forms, surrogates or code
 * points past U+10FFFF), 0 when it is not one. */
static int utf8_len(const unsigned char *s) {
    unsigned char c = s[0];
    int n = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
            : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    unsigned char hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    for (int k = 1; k < n; k++)
        if (s[k] < (k == 1 ? lo : 0x80) || s[k] > (k == 1 ? hi : 0xBF)) return 0;
    return n;
}

/* A message quotes the client's field names and values, and the JSON parser's excerpts of the
 * body, which may be cut inside a character (by snprintf, or by the parser): every byte of a
 * sequence that is not UTF-8 becomes '?', so the message can be a JSON string. */
static void utf8_clean(char *msg) {
    for (unsigned char *s = (unsigned char *)msg; *s;) {
        int n = utf8_len(s);
        if (n) s += n;
        else *s++ = '?';
    }
}

void serve_api_error(serve_reply *out, int status, const char *type, const char *param,
                     const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    utf8_clean(msg);
    json_t *e = json_pack("{s:{s:s, s:s, s:o, s:n}}", "error", "message", msg, "type", type,
                          "param", param ? json_string(param) : json_null(), "code");
    serve_reply_json(out, status, e);
}

/* ---- request fields ---- */

typedef enum field_type { F_STR, F_INT, F_NUM, F_BOOL, F_PROMPT, F_JSON } field_type;

/* A field of a POST body: its type, where it goes, and for numbers the accepted range. */
typedef struct field {
    const char *name;
    field_type type;
    void *dst;       /* const char *, int64_t, double, int, a prompt, or (F_JSON) json_t * */
    double lo, hi;   /* numbers: inclusive bounds (lo excluded when lo_open) */
    int lo_open;
} field;

/* A prompt: text, or token ids (completions). */
typedef struct prompt {
    const char *text;
    int32_t *ids;
    int32_t n_ids;
} prompt;

/* The range of f as text: "(0, 100]". */
static void range_text(const field *f, char *buf, size_t cap) {
    snprintf(buf, cap, "%c%.17g, %.17g]", f->lo_open ? '(' : '[', f->lo, f->hi);
}

/* A token-id array into p; 0, or -1 after a 400 in out. */
static int take_ids(const field *f, json_t *v, prompt *p, serve_reply *out) {
    size_t n = json_array_size(v);
    if (n == 0 || n > (1u << 20)) {
        serve_api_error(out, 400, TYPE_REQ, f->name, "%s: expected a string or 1 to %u token ids",
                        f->name, 1u << 20);
        return -1;
    }
    p->ids = malloc(n * sizeof *p->ids);
    if (!p->ids) {
        serve_api_error(out, 500, "server_error", NULL, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(v, i);
        json_int_t id = json_is_integer(x) ? json_integer_value(x) : -1;
        if (id < 0 || id > INT32_MAX) {
            serve_api_error(out, 400, TYPE_REQ, f->name, "%s[%zu]: expected a token id (an "
                            "integer >= 0)", f->name, i);
            return -1;
        }
        p->ids[i] = (int32_t)id;
    }
    p->n_ids = (int32_t)n;
    return 0;
}

/* A number field's value: type and range; 0, or -1 after a 400. */
static int take_number(const field *f, json_t *v, serve_reply *out) {
    int integer = f->type == F_INT;
    if (integer ? !json_is_integer(v) : !json_is_number(v)) {
        serve_api_error(out, 400, TYPE_REQ, f->name, "%s: expected %s", f->name,
                        integer ? "an integer" : "a number");
        return -1;
    }
    double x = json_number_value(v);
    if (x < f->lo || x > f->hi || (f->lo_open && x == f->lo) || !isfinite(x)) {
        char r[96];
        range_text(f, r, sizeof r);
        serve_api_error(out, 400, TYPE_REQ, f->name, "%s: %.17g is out of range: expected %s "
                        "in %s", f->name, x, integer ? "an integer" : "a number", r);
        return -1;
    }
    if (integer) *(int64_t *)f->dst = (int64_t)json_integer_value(v);
    else *(double *)f->dst = x;
    return 0;
}

/* Value v of field f into its destination; 0, or -1 after a 400. */
static int take_field(const field *f, json_t *v, serve_reply *out) {
    switch (f->type) {
    case F_INT:
    case F_NUM: return take_number(f, v, out);
    case F_JSON: *(json_t **)f->dst = v; return 0;
    case F_BOOL:
        if (!json_is_boolean(v)) break;
        *(int *)f->dst = json_is_true(v);
        return 0;
    case F_STR:
        if (!json_is_string(v)) break;
        *(const char **)f->dst = json_string_value(v);
        return 0;
    case F_PROMPT:
        if (json_is_string(v)) {
            ((prompt *)f->dst)->text = json_string_value(v);
            return 0;
        }
        if (json_is_array(v)) return take_ids(f, v, f->dst, out);
        serve_api_error(out, 400, TYPE_REQ, f->name, "%s: expected a string or an array of "
                        "token ids", f->name);
        return -1;
    }
    serve_api_error(out, 400, TYPE_REQ, f->name, "%s: expected %s", f->name,
                    f->type == F_BOOL ? "true or false" : "a string");
    return -1;
}

/* Parse body as a JSON object into the fields; *root keeps the strings alive (caller
 * decrefs). 0, or -1 after a 400. */
static int parse_body(const char *body, size_t len, const field *fs, int n, json_t **root,
                      serve_reply *out) {
    json_error_t err;
    *root = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &err);
    if (!*root || !json_is_object(*root)) {
        if (*root) serve_api_error(out, 400, TYPE_REQ, NULL, "the body must be a JSON object");
        else serve_api_error(out, 400, TYPE_REQ, NULL, "the body is not valid JSON: %s (line "
                             "%d, column %d)", err.text, err.line, err.column);
        return -1;
    }
    const char *key;
    json_t *v;
    json_object_foreach(*root, key, v) {
        int k = 0;
        while (k < n && strcmp(fs[k].name, key)) k++;
        if (k == n) {
            serve_api_error(out, 400, TYPE_REQ, key, "%s: unknown field", key);
            return -1;
        }
        if (take_field(&fs[k], v, out)) return -1;
    }
    return 0;
}

/* 400 naming "model" when the body names another model than the one served; 0 otherwise. */
static int check_model(const serve_engine *e, const char *model, serve_reply *out) {
    if (!model || !strcmp(model, e->model_id)) return 0;
    serve_api_error(out, 400, TYPE_REQ, "model", "model: '%s' is not served here (this server "
                    "runs '%s')", model, e->model_id);
    return -1;
}

/* ---- running a request ---- */

/* The request's prompt on rq (one prompt). */
static void set_prompt(flexdiag_request *rq, const prompt *p, const char **text,
                       const int32_t **ids) {
    rq->n_prompts = 1;
    *text = p->text;
    *ids = p->ids;
    rq->prompts = p->text ? text : NULL;
    rq->prompt_ids = p->text ? NULL : ids;
    rq->prompt_lens = p->text ? NULL : &p->n_ids;
}

/* The request's count and sampling settings on rq (every endpoint takes the same ones). */
static void set_sampling(flexdiag_request *rq, int64_t n, int64_t seed, int64_t top_k,
                         double temperature, double top_p) {
    rq->images_per_prompt = (int32_t)n;
    rq->temperature = (float)temperature;
    rq->top_k = (int32_t)top_k;
    rq->top_p = (float)top_p;
    rq->seed = (uint64_t)seed;
}

/* Out becomes the 200 of stream s (a 500 when it could not be made). */
static void stream_reply(serve_reply *out, serve_stream *s) {
    if (!s) {
        serve_api_error(out, 500, "server_error", NULL, "out of memory");
        return;
    }
    out->status = 200;
    out->body = NULL;
    out->stream = s;
}

/* ---- images ---- */

/* The "data" items of j's images: b64_json (PNG) when the model decodes images, tokens when
 * asked (or when it does not). NULL on failure. */
static json_t *images_data(const serve_engine *e, const serve_job *j, int tokens) {
    json_t *data = json_array();
    for (int32_t i = 0; data && i < j->n; i++) {
        const int32_t *t = j->tokens + (size_t)i * (size_t)j->per;
        json_t *item = json_object(), *png = e->img_h ? serve_png_b64(e, t) : NULL;
        if (!item || (e->img_h && !png)) {
            json_decref(item), json_decref(png), json_decref(data);
            return NULL;
        }
        if (png) json_object_set_new(item, "b64_json", png);
        if (tokens || !e->img_h) json_object_set_new(item, "tokens", serve_ids_json(t, j->per));
        json_array_append_new(data, item);
    }
    return data;
}

typedef struct image_req {
    prompt p;
    const char *model, *format, *size;
    int64_t n, seed, top_k;
    double cfg, temperature, top_p;
    int tokens, stream;
} image_req;

/* Checks across fields and against the model; 0, or -1 after a 400. */
static int check_image_req(const serve_engine *e, const image_req *r, serve_reply *out) {
    char size[32];
    snprintf(size, sizeof size, "%dx%d", e->img_w, e->img_h);
    if (!r->p.text && !r->p.ids)
        serve_api_error(out, 400, TYPE_REQ, "prompt", "prompt: required");
    else if (check_model(e, r->model, out))
        return -1;
    else if (strcmp(r->format, "b64_json"))
        serve_api_error(out, 400, TYPE_REQ, "response_format", "response_format: '%s' is not "
                        "supported (b64_json only)", r->format);
    else if (r->size && strcmp(r->size, size))
        serve_api_error(out, 400, TYPE_REQ, "size", "size: '%s' is not the model's image size "
                        "%s", r->size, size);
    else return 0;
    return -1;
}

/* Run the checked request r and answer it. */
static void images_run(const serve_engine *e, const image_req *r, int client, serve_reply *out) {
    if (!e->c) { /* parse only (serve.h): the request passed every check */
        serve_reply_json(out, 200, json_object());
        return;
    }
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    const char *text;
    const int32_t *ids;
    set_prompt(&rq, &r->p, &text, &ids);
    set_sampling(&rq, r->n, r->seed, r->top_k, r->temperature, r->top_p);
    rq.cfg_weight = (float)r->cfg;
    flexdiag_submit_params sp;
    flexdiag_submit_params_init(&sp);
    serve_job *j;
    if (serve_job_start(e, ROUTE_IMAGES, &rq, &sp, client, r->stream, &j, out)) return;
    if (r->stream) {
        stream_reply(out, serve_stream_new(j, STREAM_IMAGES, r->tokens));
        return;
    }
    if (!serve_job_end(j, out)) {
        json_t *data = images_data(e, j, r->tokens);
        if (data) {
            serve_reply_json(out, 200, json_pack("{s:I, s:o}", "created",
                                                 (json_int_t)time(NULL), "data", data));
        } else {
            serve_api_error(out, 500, "server_error", NULL, "image decoding failed");
            j->why = END_FAILED;
        }
    }
    serve_job_free(j);
}

static void images_route(const serve_engine *e, const char *body, size_t len, int client,
                         serve_reply *out) {
    image_req r = {.format = "b64_json", .n = 1, .cfg = 5.0, .temperature = 1.0, .top_p = 1.0};
    const field fs[] = {
        {"prompt", F_PROMPT, &r.p, 0, 0, 0},
        {"model", F_STR, &r.model, 0, 0, 0},
        {"n", F_INT, &r.n, 1, e->max_n, 0},
        {"response_format", F_STR, &r.format, 0, 0, 0},
        {"size", F_STR, &r.size, 0, 0, 0},
        {"seed", F_INT, &r.seed, 0, 9.2e18, 0},
        {"cfg", F_NUM, &r.cfg, 0, 100, 0},
        {"temperature", F_NUM, &r.temperature, 0, 100, 1},
        {"top_k", F_INT, &r.top_k, 0, INT32_MAX, 0},
        {"top_p", F_NUM, &r.top_p, 0, 1, 1},
        {"tokens", F_BOOL, &r.tokens, 0, 0, 0},
        {"stream", F_BOOL, &r.stream, 0, 0, 0},
    };
    json_t *root = NULL;
    if (e->text)
        serve_api_error(out, 400, TYPE_REQ, "model", "model '%s' generates text: use "
                        "/v1/completions or /v1/chat/completions", e->model_id);
    else if (!parse_body(body, len, fs, (int)(sizeof fs / sizeof fs[0]), &root, out) &&
             !check_image_req(e, &r, out))
        images_run(e, &r, client, out);
    free(r.p.ids);
    json_decref(root);
}

/* ---- completions and chat ---- */

typedef struct text_req {
    prompt p;
    const char *model;
    json_t *messages;
    int64_t n, max_tokens, max_completion_tokens, seed, top_k;
    double temperature, top_p;
    int stream;
} text_req;

/* One choice: its text, token ids and finish reason; a chat choice's text is its message. */
static json_t *choice_json(const serve_engine *e, const int32_t *ids, int32_t n, int32_t index,
                           int chat) {
    char *text = serve_text(e, ids, n);
    json_t *c = json_pack("{s:i, s:n, s:s, s:o}", "index", index, "logprobs", "finish_reason",
                          serve_finish_reason(e, ids, n), "tokens", serve_ids_json(ids, n));
    if (c && chat)
        json_object_set_new(c, "message", json_pack("{s:s, s:s}", "role", "assistant",
                                                    "content", text ? text : ""));
    else if (c)
        json_object_set_new(c, "text", json_string(text ? text : ""));
    free(text);
    return c;
}

static void text_reply(const serve_engine *e, const text_req *r, const serve_job *j, int chat,
                       serve_reply *out) {
    json_t *choices = json_array();
    json_int_t made = 0;
    for (int32_t i = 0; choices && i < j->n; i++) {
        json_array_append_new(choices, choice_json(e, j->tokens + (size_t)i * (size_t)j->per,
                                                   j->lens[i], i, chat));
        made += j->lens[i];
    }
    json_t *usage = json_pack("{s:I}", "completion_tokens", made);
    if (usage && r->p.ids) {
        json_object_set_new(usage, "prompt_tokens", json_integer(r->p.n_ids));
        json_object_set_new(usage, "total_tokens", json_integer(r->p.n_ids + made));
    }
    char id[64];
    serve_reply_id(id, sizeof id, chat ? "chatcmpl" : "cmpl");
    serve_reply_json(out, 200, json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", id, "object",
                                         chat ? "chat.completion" : "text_completion", "created",
                                         (json_int_t)time(NULL), "model", e->model_id,
                                         "choices", choices, "usage", usage));
}

/* Run the checked request r (its prompt set) of route and answer it. */
static void text_run(const serve_engine *e, serve_route route, const text_req *r, int client,
                     serve_reply *out) {
    if (!e->c) { /* parse only (serve.h): the request passed every check */
        serve_reply_json(out, 200, json_object());
        return;
    }
    int chat = route == ROUTE_CHAT;
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    const char *text;
    const int32_t *ids;
    set_prompt(&rq, &r->p, &text, &ids);
    set_sampling(&rq, r->n, r->seed, r->top_k, r->temperature, r->top_p);
    flexdiag_submit_params sp;
    flexdiag_submit_params_init(&sp);
    sp.max_new_tokens = (int32_t)r->max_tokens;
    sp.stop_at_eos = true;
    serve_job *j;
    if (serve_job_start(e, route, &rq, &sp, client, r->stream, &j, out)) return;
    if (r->stream) {
        stream_reply(out, serve_stream_new(j, chat ? STREAM_CHAT : STREAM_COMPLETION, 0));
        return;
    }
    if (!serve_job_end(j, out)) text_reply(e, r, j, chat, out);
    serve_job_free(j);
}

/* The rows both text routes (completions, chat) read: choices and length, then sampling. */
#define TEXT_COUNT_FIELDS(r, e)                                                                    \
    {"n", F_INT, &(r).n, 1, (e)->max_n, 0},                                                       \
    {"max_tokens", F_INT, &(r).max_tokens, 1, (e)->per_image, 0}
#define TEXT_SAMPLING_FIELDS(r)                                                                    \
    {"seed", F_INT, &(r).seed, 0, 9.2e18, 0},                                                     \
    {"temperature", F_NUM, &(r).temperature, 0, 100, 1},                                          \
    {"top_k", F_INT, &(r).top_k, 0, INT32_MAX, 0},                                                \
    {"top_p", F_NUM, &(r).top_p, 0, 1, 1},                                                        \
    {"stream", F_BOOL, &(r).stream, 0, 0, 0}

/* Whether e continues text; else the 400 that points an image model's caller elsewhere. */
static int text_model(const serve_engine *e, serve_reply *out) {
    if (e->text) return 1;
    serve_api_error(out, 400, TYPE_REQ, "model", "model '%s' generates images: use "
                    "/v1/images/generations", e->model_id);
    return 0;
}

static void completions_route(const serve_engine *e, const char *body, size_t len, int client,
                              serve_reply *out) {
    text_req r = {.n = 1, .max_tokens = 16, .temperature = 1.0, .top_p = 1.0};
    if (r.max_tokens > e->per_image) r.max_tokens = e->per_image;
    const field fs[] = {
        {"prompt", F_PROMPT, &r.p, 0, 0, 0},
        {"model", F_STR, &r.model, 0, 0, 0},
        TEXT_COUNT_FIELDS(r, e),
        TEXT_SAMPLING_FIELDS(r),
    };
    json_t *root = NULL;
    if (text_model(e, out) &&
        !parse_body(body, len, fs, (int)(sizeof fs / sizeof fs[0]), &root, out) &&
        !check_model(e, r.model, out)) {
        if (!r.p.text && !r.p.ids)
            serve_api_error(out, 400, TYPE_REQ, "prompt", "prompt: required");
        else
            text_run(e, ROUTE_COMPLETIONS, &r, client, out);
    }
    free(r.p.ids);
    json_decref(root);
}

/* Message i of the chat body into m; 0, or -1 after a 400 naming "messages". */
static int take_message(json_t *v, size_t i, serve_chat_msg *m, serve_reply *out) {
    const char *key;
    json_t *x;
    if (!json_is_object(v)) {
        serve_api_error(out, 400, TYPE_REQ, "messages", "messages[%zu]: expected an object "
                        "with role and content", i);
        return -1;
    }
    json_object_foreach(v, key, x) {
        if (strcmp(key, "role") && strcmp(key, "content")) {
            serve_api_error(out, 400, TYPE_REQ, "messages", "messages[%zu].%s: unknown field "
                            "(a message has role and content)", i, key);
            return -1;
        }
    }
    x = json_object_get(v, "role");
    m->role = json_string_value(x);
    if (!m->role || (strcmp(m->role, "system") && strcmp(m->role, "user") &&
                     strcmp(m->role, "assistant"))) {
        serve_api_error(out, 400, TYPE_REQ, "messages", "messages[%zu].role: expected "
                        "\"system\", \"user\" or \"assistant\"", i);
        return -1;
    }
    m->content = json_string_value(json_object_get(v, "content"));
    if (!m->content) {
        serve_api_error(out, 400, TYPE_REQ, "messages", "messages[%zu].content: expected a "
                        "string (content parts and null content are not supported)", i);
        return -1;
    }
    return 0;
}

/* The chat body's messages through the model's template as r's text prompt (*text, caller
 * frees; a leading bos_token dropped: the prompt's tokenization puts the model's BOS first, as
 * for /v1/completions); 0, or -1 after a 400 naming "messages". */
static int chat_prompt(const serve_engine *e, text_req *r, char **text, serve_reply *out) {
    const serve_chat *c = e->chat;
    size_t n = json_array_size(r->messages);
    if (!c || c->kind == CHAT_NONE || c->kind == CHAT_UNKNOWN) {
        serve_api_error(out, 400, TYPE_REQ, "messages", "messages: model '%s' has %s (%s): use "
                        "/v1/completions with the prompt as the model expects it (this server "
                        "renders the chatml, zephyr, llama-2 and llama-3 templates)", e->model_id,
                        c && c->kind == CHAT_UNKNOWN ? "a chat template this server does not "
                        "render" : "no chat template", c ? c->note : "none loaded");
        return -1;
    }
    if (!json_is_array(r->messages) || n == 0) {
        serve_api_error(out, 400, TYPE_REQ, "messages", "messages: %s", r->messages ?
                        "expected a non-empty array of {\"role\", \"content\"}" : "required");
        return -1;
    }
    serve_chat_msg *m = calloc(n, sizeof *m);
    int rc = m ? 0 : -1;
    if (!m) serve_api_error(out, 500, "server_error", NULL, "out of memory");
    for (size_t i = 0; !rc && i < n; i++)
        rc = take_message(json_array_get(r->messages, i), i, &m[i], out);
    char err[512];
    if (!rc && serve_chat_render(c, m, (int)n, text, err, sizeof err)) {
        serve_api_error(out, 400, TYPE_REQ, "messages", "messages: %s", err);
        rc = -1;
    }
    free(m);
    if (!rc && !(*text)[0]) {
        serve_api_error(out, 400, TYPE_REQ, "messages", "messages: the model's %s chat template "
                        "renders nothing for them", serve_chat_name(c->kind));
        rc = -1;
    }
    size_t bl = strlen(c->bos);
    if (!rc) r->p.text = *text + (bl && !strncmp(*text, c->bos, bl) ? bl : 0);
    return rc;
}

static void chat_route(const serve_engine *e, const char *body, size_t len, int client,
                       serve_reply *out) {
    text_req r = {.n = 1, .max_tokens = -1, .max_completion_tokens = -1, .temperature = 1.0,
                  .top_p = 1.0};
    const field fs[] = {
        {"messages", F_JSON, &r.messages, 0, 0, 0},
        {"model", F_STR, &r.model, 0, 0, 0},
        TEXT_COUNT_FIELDS(r, e),
        {"max_completion_tokens", F_INT, &r.max_completion_tokens, 1, e->per_image, 0},
        TEXT_SAMPLING_FIELDS(r),
    };
    json_t *root = NULL;
    char *text = NULL;
    if (text_model(e, out) &&
        !parse_body(body, len, fs, (int)(sizeof fs / sizeof fs[0]), &root, out) &&
        !check_model(e, r.model, out)) {
        if (r.max_tokens > 0 && r.max_completion_tokens > 0)
            serve_api_error(out, 400, TYPE_REQ, "max_tokens", "max_tokens: give it or "
                            "max_completion_tokens, not both");
        else if (!chat_prompt(e, &r, &text, out)) {
            if (r.max_completion_tokens > 0) r.max_tokens = r.max_completion_tokens;
            if (r.max_tokens < 0) r.max_tokens = e->per_image; /* until the end id or the cap */
            text_run(e, ROUTE_CHAT, &r, client, out);
        }
    }
    free(text);
    json_decref(root);
}

/* ---- routing ---- */

static void models_route(const serve_engine *e, serve_reply *out) {
    serve_reply_json(out, 200, json_pack("{s:s, s:[{s:s, s:s, s:i, s:s}]}", "object", "list",
                                         "data", "id", e->model_id, "object", "model",
                                         "created", 0, "owned_by", "flexdiag"));
}

static void metrics_route(const serve_engine *e, serve_reply *out) {
    char *text = serve_metrics_text(e->metrics);
    if (!text) {
        serve_api_error(out, 500, "server_error", NULL, "out of memory");
        return;
    }
    out->status = 200;
    out->body = text;
    out->content_type = "text/plain; version=0.0.4; charset=utf-8";
}

void serve_api_handle(const serve_engine *e, const char *method, const char *path,
                      const char *body, size_t len, int client, serve_reply *out) {
    static const struct {
        const char *path, *method;
    } routes[] = {{"/v1/models", "GET"}, {"/metrics", "GET"}, {"/v1/images/generations", "POST"},
                  {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}};
    *out = (serve_reply){0};
    int k = 0, n = (int)(sizeof routes / sizeof routes[0]);
    while (k < n && strcmp(path, routes[k].path)) k++;
    if (k == n)
        serve_api_error(out, 404, TYPE_REQ, NULL, "no route %s (the API has /health, /metrics, "
                        "/v1/models, /v1/images/generations, /v1/completions, "
                        "/v1/chat/completions)", path);
    else if (strcmp(method, routes[k].method))
        serve_api_error(out, 405, TYPE_REQ, NULL, "%s takes %s, not %s", path, routes[k].method,
                        method);
    else if (k == 0) models_route(e, out);
    else if (k == 1) metrics_route(e, out);
    else if (k == 2) images_route(e, body, len, client, out);
    else if (k == 3) completions_route(e, body, len, client, out);
    else chat_route(e, body, len, client, out);
}
