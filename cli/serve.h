/*
 * serve.h - `flexdiag serve`: the OpenAI-shaped HTTP API on one context's request queue.
 *
 * Three parts: serve_api.c turns a request (method, path, body) into a reply (status, JSON)
 * and knows nothing of HTTP transport, so the request parser can be tested and fuzzed alone;
 * serve_http.c is the libmicrohttpd server (a thread per connection, bodies bounded, bearer
 * key, draining); cmd_serve.c reads the flags, opens the model and context as generate does and
 * runs until SIGTERM. Every request goes through flexdiag_submit, so concurrent requests share
 * the context's continuous batch.
 */
#ifndef FLEXDIAG_SERVE_H
#define FLEXDIAG_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "flexdiag.h"

/* What the API serves: one model and its context, fixed after start. */
typedef struct serve_engine {
    flexdiag_model *m;
    flexdiag_context *c;      /* NULL: parse only (the fuzz target): a request that passes
                                 every check is answered 200 with {} */
    const char *model_id;     /* name in /v1/models and the "model" field */
    int text;                 /* the model continues text (/v1/completions) */
    int32_t per_image;        /* tokens of an image (text: max_new_tokens) */
    int32_t img_h, img_w;     /* decoded image size; 0 without a decoder */
    int32_t eos;              /* text models' end id (-1: none) */
    int32_t max_n;            /* most images or sequences one request may ask for */
    double timeout_s;         /* a request's limit (0: none) */
} serve_engine;

/* One HTTP answer: status, JSON body (malloc'ed, caller frees) and, for 429, Retry-After. */
typedef struct serve_reply {
    int status;
    char *body;
    int retry_after; /* seconds; 0 = no header */
} serve_reply;

/* Answer method path with body (len bytes, not NUL-terminated) on e; never fails (an internal
 * failure is a 500 reply). */
void serve_api_handle(const serve_engine *e, const char *method, const char *path,
                      const char *body, size_t len, serve_reply *out);

/* An OpenAI error reply: {"error": {"message", "type", "param", "code": null}}; param may be
 * NULL. */
void serve_api_error(serve_reply *out, int status, const char *type, const char *param,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* The HTTP server. */
typedef struct serve_http serve_http;

typedef struct serve_http_params {
    const char *host;      /* IPv4 address to bind */
    int port;              /* 0: a free one */
    const char *api_key;   /* bearer key of /v1/ (NULL: none) */
    uint64_t max_body;     /* bytes of a request body; more: 413 */
} serve_http_params;

/* Start serving e (borrowed; must outlive the server) on p; *port gets the bound port. 0, or
 * 1 after a message on stderr. */
int serve_http_start(const serve_engine *e, const serve_http_params *p, serve_http **out,
                     int *port);
/* Draining: /health says so, new API requests get 503; returns once no request is in flight. */
void serve_http_drain(serve_http *s);
/* Stop and free; NULL is a no-op. */
void serve_http_stop(serve_http *s);

#endif /* FLEXDIAG_SERVE_H */
