/*
 * serve.h - `flexdiag serve`: the OpenAI-shaped HTTP API on one context's request queue.
 *
 * serve_api.c turns a request (method, path, body) into a reply (status, JSON, or a stream of
 * server-sent events) and knows nothing of HTTP transport, so the request parser can be tested
 * and fuzzed alone; serve_job.c runs a checked request on the engine (its callbacks, the
 * wait that a client's hang-up or the timeout cancels); serve_stream.c formats a running
 * request's events; serve_chat.c renders chat messages through the model's chat template;
 * serve_metrics.c counts for GET /metrics; serve_http.c is the libmicrohttpd server (a thread
 * per connection, bodies bounded, bearer key, draining); cmd_serve.c reads the flags, opens
 * the model and context as generate does and runs until SIGTERM. Every request goes through
 * flexdiag_submit, so concurrent requests share the context's continuous batch.
 */
#ifndef FLEXDIAG_SERVE_H
#define FLEXDIAG_SERVE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "flexdiag.h"

/* ---- chat templates (serve_chat.c) ---- */

/* The chat templates this server renders (docs: README "HTTP server"); a model folder's
 * template is recognised by its text, never guessed. */
typedef enum serve_chat_kind {
    CHAT_NONE = 0,    /* the folder has no chat template */
    CHAT_UNKNOWN,     /* it has one this server does not render */
    CHAT_CHATML,
    CHAT_ZEPHYR,
    CHAT_LLAMA2,
    CHAT_LLAMA3,
} serve_chat_kind;

typedef struct serve_chat {
    serve_chat_kind kind;
    char *bos, *eos;  /* tokenizer_config.json's bos_token and eos_token ("" when none) */
    char note[256];   /* where the template came from, or why it is not rendered */
} serve_chat;

/* The chat template of model folder dir (NULL: a builtin, none): tokenizer_config.json's
 * "chat_template" (a string, or the list entry named "default"), else chat_template.jinja.
 * Never fails: an unreadable file or an unknown template is a kind with its note. */
void serve_chat_load(const char *dir, serve_chat *out);
/* The kind of template text t (its canonical form against the ones this server renders). */
serve_chat_kind serve_chat_recognise(const char *t);
/* Name of a kind ("chatml", "llama-3"); "none" / "unknown" for the other two. */
const char *serve_chat_name(serve_chat_kind k);
void serve_chat_free(serve_chat *c);

/* One chat message (role "system", "user" or "assistant"; UTF-8 content). */
typedef struct serve_chat_msg {
    const char *role, *content;
} serve_chat_msg;

/* The n messages through c's template with the generation prompt, as its Jinja text renders
 * them (bos_token and eos_token included where it puts them) into *text (malloc'ed): 0, or -1
 * with the reason in err (cap bytes): the template refuses the conversation (llama-2's
 * alternation), it is not one this server renders, or out of memory. */
int serve_chat_render(const serve_chat *c, const serve_chat_msg *m, int n, char **text,
                      char *err, size_t cap);

/* ---- metrics (serve_metrics.c) ---- */

typedef struct serve_metrics serve_metrics;

/* The routes that run requests (labels of the request latency histogram). */
typedef enum serve_route { ROUTE_IMAGES, ROUTE_COMPLETIONS, ROUTE_CHAT, N_ROUTES } serve_route;

/* Why a request did not finish: the outcomes /metrics counts. */
typedef enum serve_end {
    END_FINISHED,
    END_FAILED,
    END_CANCELLED_GONE,    /* the client hung up */
    END_CANCELLED_TIMEOUT, /* past --timeout */
} serve_end;

/* Counters of a server whose context has `slots` slots of `rows` sequences each (2 for an
 * image with CFG), a queue of queue_cap images and kv_bytes of KV cache on the GPU, in host
 * memory and on disk (flexdiag_context_offload); NULL when out of memory. */
serve_metrics *serve_metrics_new(int32_t slots, int32_t rows, int32_t queue_cap,
                                 const uint64_t kv_bytes[3]);
void serve_metrics_free(serve_metrics *m);
/* The calls below take NULL (nothing counted: the fuzz target). */
void serve_metrics_response(serve_metrics *m, int status);  /* an HTTP reply was sent */
void serve_metrics_rejected(serve_metrics *m, int draining); /* 429 (queue full) or 503 */
void serve_metrics_submitted(serve_metrics *m, int32_t n);  /* a request of n was queued */
void serve_metrics_token(serve_metrics *m, int first);      /* one token made (first: its
                                                               image's, which took a slot) */
void serve_metrics_result(serve_metrics *m, int image);     /* an image (sequence) finished */
/* A request ended on the engine: waiting of its images never took a slot, live ones held one
 * until now; st its timings (queue wait, first token). */
void serve_metrics_ended(serve_metrics *m, int32_t waiting, int32_t live,
                         const flexdiag_handle_stats *st);
/* The request's outcome as its client saw it, and for a finished one its latency (seconds
 * from its arrival to its last byte ready). */
void serve_metrics_outcome(serve_metrics *m, serve_route r, serve_end end, double seconds);
/* The Prometheus text exposition (version 0.0.4) of everything counted; malloc'ed, NULL when
 * out of memory. */
char *serve_metrics_text(serve_metrics *m);

/* ---- the API ---- */

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
    const serve_chat *chat;   /* the chat template (NULL: none) */
    serve_metrics *metrics;   /* NULL: nothing counted */
} serve_engine;

typedef struct serve_stream serve_stream;

/* Status of a reply to a client that hung up (nginx's "client closed request"): nothing is
 * sent, the connection is closed. */
#define SERVE_CLIENT_GONE 499

/* One HTTP answer: a status with a body (malloc'ed, caller frees; JSON unless content_type
 * says otherwise) and, for 429, Retry-After; or a 200 whose body is a stream of server-sent
 * events (body NULL, stream set: the caller reads it with serve_stream_read and frees it). */
typedef struct serve_reply {
    int status;
    char *body;
    int retry_after;          /* seconds; 0 = no header */
    const char *content_type; /* static; NULL = application/json */
    serve_stream *stream;
} serve_reply;

/* Answer method path with body (len bytes, not NUL-terminated) on e. client is the socket of
 * the request's connection (-1: none): a hang-up seen there while the request runs cancels it
 * (status SERVE_CLIENT_GONE). Never fails (an internal failure is a 500 reply). */
void serve_api_handle(const serve_engine *e, const char *method, const char *path,
                      const char *body, size_t len, int client, serve_reply *out);

/* An OpenAI error reply: {"error": {"message", "type", "param", "code": null}}; param may be
 * NULL. */
void serve_api_error(serve_reply *out, int status, const char *type, const char *param,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Up to cap bytes of s's next events into buf, waiting for them: the count (> 0), 0 once the
 * stream has ended (after "data: [DONE]", or an error event), -1 when the client hung up (the
 * request is cancelled). */
ssize_t serve_stream_read(serve_stream *s, char *buf, size_t cap);
/* Free s, cancelling its request if it still runs (and waiting for its end); NULL is a no-op. */
void serve_stream_free(serve_stream *s);

/* ---- the HTTP server (serve_http.c) ---- */

typedef struct serve_http serve_http;

typedef struct serve_http_params {
    const char *host;      /* IPv4 address to bind */
    int port;              /* 0: a free one */
    const char *api_key;   /* bearer key of /v1/ and /metrics (NULL: none) */
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
