/*
 * serve_http.c - the HTTP side of `flexdiag serve` (serve.h) on libmicrohttpd: a thread per
 * connection (a request blocks its thread while it waits for its images), bodies gathered up
 * to --max-body (413 past it, from Content-Length or the bytes themselves), the bearer key of
 * /v1/ (401), GET /health, and draining (new API requests 503 while in-flight ones finish).
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/serve.h"

struct serve_http {
    struct MHD_Daemon *d;
    const serve_engine *e;
    serve_http_params p;
    atomic_int draining;
    atomic_int in_flight; /* API requests being answered or sent */
};

/* A connection's request body as it arrives. */
typedef struct body {
    char *buf;
    size_t len, cap;
    int too_big;   /* past --max-body: dropped, answered 413 */
    int in_flight; /* counted in the server's in_flight until the connection is done with it */
} body;

/* Append n bytes to b within max; past it the body is dropped and marked too big. */
static void body_add(body *b, const char *data, size_t n, uint64_t max) {
    if (b->too_big || b->len + n > max) {
        b->too_big = 1;
        free(b->buf);
        b->buf = NULL;
        return;
    }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        char *nb = realloc(b->buf, cap);
        if (!nb) {
            b->too_big = 1;
            return;
        }
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, data, n);
    b->len += n;
}

/* Queue r (its body taken) on the connection. */
static enum MHD_Result send_reply(struct MHD_Connection *c, serve_reply *r) {
    const char *text = r->body ? r->body : "{}";
    struct MHD_Response *res =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    free(r->body);
    r->body = NULL;
    if (!res) return MHD_NO;
    MHD_add_response_header(res, "Content-Type", "application/json");
    if (r->retry_after) {
        char s[16];
        snprintf(s, sizeof s, "%d", r->retry_after);
        MHD_add_response_header(res, "Retry-After", s);
    }
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)r->status, res);
    MHD_destroy_response(res);
    return ok;
}

/* Whether the request carries "Authorization: Bearer <key>" (always, without a key). */
static int authorized(const serve_http *s, struct MHD_Connection *c) {
    if (!s->p.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    return h && !strncmp(h, "Bearer ", 7) && !strcmp(h + 7, s->p.api_key);
}

/* The answer to a whole request. */
static void answer(serve_http *s, struct MHD_Connection *c, const char *url, const char *method,
                   body *b, serve_reply *r) {
    if (!strcmp(url, "/health")) {
        r->status = 200;
        r->body = strdup(atomic_load(&s->draining) ? "{\"status\":\"draining\"}"
                                                   : "{\"status\":\"ready\"}");
        return;
    }
    if (!authorized(s, c)) {
        serve_api_error(r, 401, "invalid_request_error", NULL, "missing or wrong API key "
                        "(Authorization: Bearer <key>)");
        return;
    }
    if (b->too_big) {
        serve_api_error(r, 413, "invalid_request_error", NULL, "the body is larger than the "
                        "server's --max-body of %llu bytes", (unsigned long long)s->p.max_body);
        return;
    }
    atomic_fetch_add(&s->in_flight, 1); /* until on_completed: the reply is sent too */
    b->in_flight = 1;
    if (atomic_load(&s->draining))
        serve_api_error(r, 503, "server_error", NULL, "the server is shutting down");
    else
        serve_api_handle(s->e, method, url, b->buf, b->len, r);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **state) {
    serve_http *s = cls;
    (void)version;
    body *b = *state;
    if (!b) {
        if (!(b = calloc(1, sizeof *b))) return MHD_NO;
        *state = b;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->p.max_body) b->too_big = 1;
        return MHD_YES;
    }
    if (*upload_size) {
        body_add(b, upload, *upload_size, s->p.max_body);
        *upload_size = 0;
        return MHD_YES;
    }
    serve_reply r = {0};
    answer(s, c, url, method, b, &r);
    return send_reply(c, &r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **state,
                         enum MHD_RequestTerminationCode why) {
    serve_http *s = cls;
    (void)c, (void)why;
    body *b = *state;
    if (b && b->in_flight) atomic_fetch_sub(&s->in_flight, 1);
    if (b) free(b->buf);
    free(b);
    *state = NULL;
}

int serve_http_start(const serve_engine *e, const serve_http_params *p, serve_http **out,
                     int *port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p->port)};
    if (inet_pton(AF_INET, p->host, &a.sin_addr) != 1) {
        fprintf(stderr, "flexdiag serve: --host %s: expected an IPv4 address such as "
                        "127.0.0.1\n", p->host);
        return 2;
    }
    serve_http *s = calloc(1, sizeof *s);
    if (!s) return 1;
    s->e = e;
    s->p = *p;
    s->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                                MHD_USE_ERROR_LOG,
                            0, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &a,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_CONNECTION_TIMEOUT, 0u, MHD_OPTION_END);
    if (!s->d) {
        fprintf(stderr, "flexdiag serve: cannot listen on %s:%d (in use, or not an address of "
                        "this host)\n", p->host, p->port);
        free(s);
        return 1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    *port = di ? di->port : p->port;
    *out = s;
    return 0;
}

void serve_http_drain(serve_http *s) {
    atomic_store(&s->draining, 1);
    struct timespec ts = {0, 10 * 1000 * 1000};
    while (atomic_load(&s->in_flight)) nanosleep(&ts, NULL);
}

void serve_http_stop(serve_http *s) {
    if (!s) return;
    MHD_stop_daemon(s->d);
    free(s);
}
