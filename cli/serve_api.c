/*
 * serve_api.c - the routes of `flexdiag serve` (serve.h): GET /health and /v1/models,
 * POST /v1/images/generations and /v1/completions, as OpenAI shapes them.
 *
 * A POST body is a JSON object checked field by field against the route's table: an unknown
 * field, a wrong type or a value out of range is a 400 whose error names the field (param).
 * The checked request goes through flexdiag_submit (no waiting for room: a full queue is a 429)
 * and flexdiag_handle_wait up to the server's timeout (then it is cancelled: 504). Images are
 * decoded and encoded as the PNG bytes `flexdiag generate` writes, base64 in b64_json; image i
 * of a request is image index i of its seed, as generate's image i of one prompt.
 */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/image_out.h"
#include "cli/serve.h"

#define TYPE_REQ "invalid_request_error"

/* ---- replies ---- */

/* Take j (a new reference) as the body of a status reply. */
static void reply_json(serve_reply *out, int status, json_t *j) {
    out->status = status;
    out->body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!out->body) {
        out->status = 500;
        out->body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                           "\"param\":null,\"code\":null}}");
    }
}

/* A message cut by snprintf ends inside a UTF-8 sequence maybe (the client's field names and
 * values are quoted): drop its last character, whole or not, so that it stays UTF-8. */
static void utf8_cut(char *msg) {
    size_t n = strlen(msg);
    while (n && ((unsigned char)msg[n - 1] & 0xC0) == 0x80) n--;
    if (n && ((unsigned char)msg[n - 1] & 0x80)) n--;
    msg[n] = 0;
}

void serve_api_error(serve_reply *out, int status, const char *type, const char *param,
                     const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    size_t n = (size_t)vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n >= sizeof msg) utf8_cut(msg);
    json_t *e = json_pack("{s:{s:s, s:s, s:o, s:n}}", "error", "message", msg, "type", type,
                          "param", param ? json_string(param) : json_null(), "code");
    reply_json(out, status, e);
}

/* ---- request fields ---- */

typedef enum field_type { F_STR, F_INT, F_NUM, F_BOOL, F_PROMPT } field_type;

/* A field of a POST body: its type, where it goes, and for numbers the accepted range. */
typedef struct field {
    const char *name;
    field_type type;
    void *dst;       /* const char *, int64_t, double, int, or (F_PROMPT) a prompt */
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

/* ---- running a request ---- */

/* The tokens of a request's images or sequences as they finish (engine thread). */
typedef struct job {
    int32_t *tokens; /* (n, per) */
    int32_t *lens;   /* (n) tokens made */
    int32_t per;
} job;

static void on_image(flexdiag_handle *h, int32_t i, const int32_t *tokens, int32_t n,
                     void *user) {
    job *j = user;
    (void)h;
    memcpy(j->tokens + (size_t)i * (size_t)j->per, tokens, (size_t)n * sizeof *tokens);
    j->lens[i] = n;
}

/* Submit rq (with sp's text fields) and wait for it, up to the timeout; 0 with j filled, or -1
 * after an error reply (429 full queue, 504 timeout, 400 refused, 500 failed). */
static int run_job(const serve_engine *e, const flexdiag_request *rq,
                   flexdiag_submit_params *sp, job *j, serve_reply *out) {
    if (!e->c) { /* parse only (serve.h): the request passed every check */
        reply_json(out, 200, json_object());
        return -1;
    }
    sp->on_image = on_image;
    sp->user = j;
    flexdiag_handle *h = NULL;
    flexdiag_status st = flexdiag_submit(e->c, rq, sp, &h);
    if (st == FLEXDIAG_ERR_BUSY) {
        serve_api_error(out, 429, "rate_limit_error", NULL, "the request queue is full; retry "
                        "later");
        out->retry_after = 1;
        return -1;
    }
    if (st != FLEXDIAG_OK) {
        serve_api_error(out, st == FLEXDIAG_ERR_INVALID_ARG ? 400 : 500,
                        st == FLEXDIAG_ERR_INVALID_ARG ? TYPE_REQ : "server_error", "prompt",
                        "%s", flexdiag_last_error(NULL));
        return -1;
    }
    int timed_out = flexdiag_handle_wait(h, e->timeout_s > 0 ? e->timeout_s : -1) != FLEXDIAG_OK;
    if (timed_out) {
        flexdiag_handle_cancel(h);
        flexdiag_handle_wait(h, -1);
    }
    flexdiag_handle_status(h, &st, NULL);
    if (timed_out)
        serve_api_error(out, 504, "timeout_error", NULL, "the request ran past the server's "
                        "--timeout of %g s and was cancelled", e->timeout_s);
    else if (st != FLEXDIAG_OK)
        serve_api_error(out, st == FLEXDIAG_ERR_INVALID_ARG ? 400 : 500,
                        st == FLEXDIAG_ERR_INVALID_ARG ? TYPE_REQ : "server_error", NULL, "%s",
                        flexdiag_handle_error(h));
    flexdiag_handle_release(h);
    return timed_out || st != FLEXDIAG_OK ? -1 : 0;
}

/* A request's buffers for n results of per tokens; 0, or -1 after a 500. */
static int job_alloc(job *j, int32_t n, int32_t per, serve_reply *out) {
    j->per = per;
    j->tokens = calloc((size_t)n * (size_t)per, sizeof *j->tokens);
    j->lens = calloc((size_t)n, sizeof *j->lens);
    if (j->tokens && j->lens) return 0;
    serve_api_error(out, 500, "server_error", NULL, "out of memory");
    return -1;
}

static void job_free(job *j) {
    free(j->tokens);
    free(j->lens);
}

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

/* The request's count and sampling settings on rq (both endpoints take the same ones). */
static void set_sampling(flexdiag_request *rq, int64_t n, int64_t seed, int64_t top_k,
                         double temperature, double top_p) {
    rq->images_per_prompt = (int32_t)n;
    rq->temperature = (float)temperature;
    rq->top_k = (int32_t)top_k;
    rq->top_p = (float)top_p;
    rq->seed = (uint64_t)seed;
}

/* ---- images ---- */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Base64 of n bytes as a new JSON string (NULL: out of memory). */
static json_t *base64_json(const uint8_t *s, size_t n) {
    char *o = malloc((n + 2) / 3 * 4 + 1), *p = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) |
                     (i + 2 < n ? s[i + 2] : 0);
        *p++ = b64[v >> 18 & 63];
        *p++ = b64[v >> 12 & 63];
        *p++ = i + 1 < n ? b64[v >> 6 & 63] : '=';
        *p++ = i + 2 < n ? b64[v & 63] : '=';
    }
    json_t *j = json_stringn(o, (size_t)(p - o));
    free(o);
    return j;
}

/* Image i's PNG (as generate writes it) in base64; NULL on failure. */
static json_t *image_png(const serve_engine *e, const int32_t *tokens, float *px, uint8_t *rgb) {
    int64_t n = (int64_t)e->img_h * e->img_w * 3;
    if (flexdiag_decode_images(e->m, tokens, 1, px) != FLEXDIAG_OK) return NULL;
    flexdiag__pixels_to_u8(px, n, rgb);
    uint8_t *png = NULL;
    size_t len = 0;
    if (flexdiag__png_encode(rgb, e->img_w, e->img_h, &png, &len) != FLEXDIAG_OK) return NULL;
    json_t *j = base64_json(png, len);
    free(png);
    return j;
}

/* The array of a request's tokens. */
static json_t *ids_json(const int32_t *ids, int32_t n) {
    json_t *a = json_array();
    for (int32_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* The "data" items of n images: b64_json (PNG) when the model decodes images, tokens when
 * asked (or when it does not). NULL on failure. */
static json_t *images_data(const serve_engine *e, const job *j, int32_t n, int tokens) {
    size_t px = (size_t)e->img_h * (size_t)e->img_w * 3;
    float *f = malloc(px ? px * sizeof *f : 1);
    uint8_t *rgb = malloc(px ? px : 1);
    json_t *data = f && rgb ? json_array() : NULL;
    for (int32_t i = 0; data && i < n; i++) {
        const int32_t *t = j->tokens + (size_t)i * (size_t)j->per;
        json_t *item = json_object(), *png = px ? image_png(e, t, f, rgb) : NULL;
        if (!item || (px && !png)) {
            json_decref(item), json_decref(png), json_decref(data);
            data = NULL;
            break;
        }
        if (png) json_object_set_new(item, "b64_json", png);
        if (tokens || !px) json_object_set_new(item, "tokens", ids_json(t, j->per));
        json_array_append_new(data, item);
    }
    free(f);
    free(rgb);
    return data;
}

typedef struct image_req {
    prompt p;
    const char *model, *format, *size;
    int64_t n, seed, top_k;
    double cfg, temperature, top_p;
    int tokens;
} image_req;

/* Checks across fields and against the model; 0, or -1 after a 400. */
static int check_image_req(const serve_engine *e, const image_req *r, serve_reply *out) {
    char size[32];
    snprintf(size, sizeof size, "%dx%d", e->img_w, e->img_h);
    if (!r->p.text && !r->p.ids)
        serve_api_error(out, 400, TYPE_REQ, "prompt", "prompt: required");
    else if (r->model && strcmp(r->model, e->model_id))
        serve_api_error(out, 400, TYPE_REQ, "model", "model: '%s' is not served here (this "
                        "server runs '%s')", r->model, e->model_id);
    else if (strcmp(r->format, "b64_json"))
        serve_api_error(out, 400, TYPE_REQ, "response_format", "response_format: '%s' is not "
                        "supported (b64_json only)", r->format);
    else if (r->size && strcmp(r->size, size))
        serve_api_error(out, 400, TYPE_REQ, "size", "size: '%s' is not the model's image size "
                        "%s", r->size, size);
    else return 0;
    return -1;
}

static void images_route(const serve_engine *e, const char *body, size_t len,
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
    };
    json_t *root = NULL;
    job j = {0};
    if (e->text) {
        serve_api_error(out, 400, TYPE_REQ, "model", "model '%s' generates text: use "
                        "/v1/completions", e->model_id);
    } else if (!parse_body(body, len, fs, (int)(sizeof fs / sizeof fs[0]), &root, out) &&
               !check_image_req(e, &r, out) && !job_alloc(&j, (int32_t)r.n, e->per_image, out)) {
        flexdiag_request rq;
        flexdiag_request_init(&rq);
        const char *text;
        const int32_t *ids;
        set_prompt(&rq, &r.p, &text, &ids);
        set_sampling(&rq, r.n, r.seed, r.top_k, r.temperature, r.top_p);
        rq.cfg_weight = (float)r.cfg;
        flexdiag_submit_params sp;
        flexdiag_submit_params_init(&sp);
        if (!run_job(e, &rq, &sp, &j, out)) {
            json_t *data = images_data(e, &j, (int32_t)r.n, r.tokens);
            if (data) reply_json(out, 200, json_pack("{s:I, s:o}", "created",
                                                      (json_int_t)time(NULL), "data", data));
            else serve_api_error(out, 500, "server_error", NULL, "image decoding failed");
        }
    }
    job_free(&j);
    free(r.p.ids);
    json_decref(root);
}

/* ---- completions ---- */

typedef struct text_req {
    prompt p;
    const char *model;
    int64_t n, max_tokens, seed, top_k;
    double temperature, top_p;
} text_req;

/* One choice: its text (when the model has a tokenizer), ids and finish reason. */
static json_t *choice_json(const serve_engine *e, const int32_t *ids, int32_t n, int32_t index) {
    size_t tl = 0;
    char *text = NULL;
    if (flexdiag_detokenize(e->m, ids, n, true, NULL, 0, &tl) == FLEXDIAG_OK &&
        (text = malloc(tl + 1)) && flexdiag_detokenize(e->m, ids, n, true, text, tl + 1, &tl) !=
        FLEXDIAG_OK)
        text[0] = 0;
    int stop = n > 0 && e->eos >= 0 && ids[n - 1] == e->eos;
    json_t *c = json_pack("{s:s, s:i, s:n, s:s, s:o}", "text", text ? text : "", "index", index,
                          "logprobs", "finish_reason", stop ? "stop" : "length", "tokens",
                          ids_json(ids, n));
    free(text);
    return c;
}

static void completions_reply(const serve_engine *e, const text_req *r, const job *j,
                              serve_reply *out) {
    json_t *choices = json_array();
    json_int_t made = 0;
    for (int32_t i = 0; choices && i < (int32_t)r->n; i++) {
        json_array_append_new(choices, choice_json(e, j->tokens + (size_t)i * (size_t)j->per,
                                                   j->lens[i], i));
        made += j->lens[i];
    }
    json_t *usage = json_pack("{s:I}", "completion_tokens", made);
    if (usage && r->p.ids) {
        json_object_set_new(usage, "prompt_tokens", json_integer(r->p.n_ids));
        json_object_set_new(usage, "total_tokens", json_integer(r->p.n_ids + made));
    }
    char id[48];
    snprintf(id, sizeof id, "cmpl-%lld", (long long)time(NULL));
    reply_json(out, 200, json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", id, "object",
                                   "text_completion", "created", (json_int_t)time(NULL),
                                   "model", e->model_id, "choices", choices, "usage", usage));
}

static void completions_route(const serve_engine *e, const char *body, size_t len,
                              serve_reply *out) {
    text_req r = {.n = 1, .max_tokens = 16, .temperature = 1.0, .top_p = 1.0};
    if (r.max_tokens > e->per_image) r.max_tokens = e->per_image;
    const field fs[] = {
        {"prompt", F_PROMPT, &r.p, 0, 0, 0},
        {"model", F_STR, &r.model, 0, 0, 0},
        {"n", F_INT, &r.n, 1, e->max_n, 0},
        {"max_tokens", F_INT, &r.max_tokens, 1, e->per_image, 0},
        {"seed", F_INT, &r.seed, 0, 9.2e18, 0},
        {"temperature", F_NUM, &r.temperature, 0, 100, 1},
        {"top_k", F_INT, &r.top_k, 0, INT32_MAX, 0},
        {"top_p", F_NUM, &r.top_p, 0, 1, 1},
    };
    json_t *root = NULL;
    job j = {0};
    if (!e->text) {
        serve_api_error(out, 400, TYPE_REQ, "model", "model '%s' generates images: use "
                        "/v1/images/generations", e->model_id);
    } else if (!parse_body(body, len, fs, (int)(sizeof fs / sizeof fs[0]), &root, out)) {
        if (!r.p.text && !r.p.ids)
            serve_api_error(out, 400, TYPE_REQ, "prompt", "prompt: required");
        else if (r.model && strcmp(r.model, e->model_id))
            serve_api_error(out, 400, TYPE_REQ, "model", "model: '%s' is not served here (this "
                            "server runs '%s')", r.model, e->model_id);
        else if (!job_alloc(&j, (int32_t)r.n, e->per_image, out)) {
            flexdiag_request rq;
            flexdiag_request_init(&rq);
            const char *text;
            const int32_t *ids;
            set_prompt(&rq, &r.p, &text, &ids);
            set_sampling(&rq, r.n, r.seed, r.top_k, r.temperature, r.top_p);
            flexdiag_submit_params sp;
            flexdiag_submit_params_init(&sp);
            sp.max_new_tokens = (int32_t)r.max_tokens;
            sp.stop_at_eos = true;
            if (!run_job(e, &rq, &sp, &j, out)) completions_reply(e, &r, &j, out);
        }
    }
    job_free(&j);
    free(r.p.ids);
    json_decref(root);
}

/* ---- routing ---- */

static void models_route(const serve_engine *e, serve_reply *out) {
    reply_json(out, 200, json_pack("{s:s, s:[{s:s, s:s, s:i, s:s}]}", "object", "list", "data",
                                   "id", e->model_id, "object", "model", "created", 0,
                                   "owned_by", "flexdiag"));
}

void serve_api_handle(const serve_engine *e, const char *method, const char *path,
                      const char *body, size_t len, serve_reply *out) {
    static const struct {
        const char *path, *method;
    } routes[] = {{"/v1/models", "GET"}, {"/v1/images/generations", "POST"},
                  {"/v1/completions", "POST"}};
    out->retry_after = 0;
    int k = 0, n = (int)(sizeof routes / sizeof routes[0]);
    while (k < n && strcmp(path, routes[k].path)) k++;
    if (k == n)
        serve_api_error(out, 404, TYPE_REQ, NULL, "no route %s (the API has /health, "
                        "/v1/models, /v1/images/generations, /v1/completions)", path);
    else if (strcmp(method, routes[k].method))
        serve_api_error(out, 405, TYPE_REQ, NULL, "%s takes %s, not %s", path, routes[k].method,
                        method);
    else if (k == 0) models_route(e, out);
    else if (k == 1) images_route(e, body, len, out);
    else completions_route(e, body, len, out);
}
