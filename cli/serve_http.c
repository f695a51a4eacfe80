/*
 * serve_http.c - the HTTP side of `flexdiag serve` (serve.h) on libmicrohttpd: a thread per
 * connection (a request blocks its thread while it waits for its images, watching its socket
 * for a hang-up), bodies gathered up to --max-body (413 past it, from Content-Length or the
 * bytes themselves), the bearer key of /v1/ and /metrics (401), GET /health, streamed replies
 * as server-sent events (a content reader that blocks until the request's next events), and
 * draining (new API requests 503 while in-flight ones finish; /health and /metrics still
 * answer).
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/serve.h"

struct serve_http {
    struct MHD_Daemon *d;
    const serve_engine *e;
    serve_http_params p;
    pthread_mutex_t mu;
    pthread_cond_t idle; /* in_flight fell to 0 */
    int draining;
    int in_flight;       /* API requests being answered or sent */
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

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    ssize_t n = serve_stream_read(cls, buf, max);
    return n > 0 ? n : n == 0 ? MHD_CONTENT_READER_END_OF_STREAM
                              : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free(void *cls) { serve_stream_free(cls); }

/* The response of r (its body or stream taken); NULL when out of memory. */
static struct MHD_Response *response(serve_reply *r) {
    struct MHD_Response *res;
    if (r->stream) {
        res = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read,
                                                r->stream, stream_free);
        if (!res) serve_stream_free(r->stream);
        r->stream = NULL;
        if (res) {
            MHD_add_response_header(res, "Content-Type", "text/event-stream");
            MHD_add_response_header(res, "Cache-Control", "no-cache");
        }
        return res;
    }
    const char *text = r->body ? r->body : "{}";
    res = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    free(r->body);
    r->body = NULL;
    if (res)
        MHD_add_response_header(res, "Content-Type",
                                r->content_type ? r->content_type : "application/json");
    return res;
}

/* Queue r on the connection (nothing for a client that hung up: the connection closes). */
static enum MHD_Result send_reply(serve_http *s, struct MHD_Connection *c, serve_reply *r) {
    serve_metrics_response(s->e->metrics, r->status);
    if (r->status == SERVE_CLIENT_GONE) {
        free(r->body);
        r->body = NULL;
        return MHD_NO;
    }
    struct MHD_Response *res = response(r);
    if (!res) return MHD_NO;
    if (r->retry_after) {
        char v[16];
        snprintf(v, sizeof v, "%d", r->retry_after);
        MHD_add_response_header(res, "Retry-After", v);
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

/* The socket of connection c (-1: unknown). */
static int client_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? (int)ci->connect_fd : -1;
}

/* The answer to a whole request. */
static void answer(serve_http *s, struct MHD_Connection *c, const char *url, const char *method,
                   body *b, serve_reply *r) {
    if (!strcmp(url, "/health")) {
        pthread_mutex_lock(&s->mu);
        int draining = s->draining;
        pthread_mutex_unlock(&s->mu);
        r->status = 200;
        r->body = strdup(draining ? "{\"status\":\"draining\"}" : "{\"status\":\"ready\"}");
        return;
    }
    if (!authorized(s, c)) {
        serve_api_error(r, 401, "invalid_request_error", NULL, "missing or wrong API key "
                        "(Authorization: Bearer <key>)");
        return;
    }
    if (!strcmp(url, "/metrics")) { /* also while draining, and not in flight */
        serve_api_handle(s->e, method, url, NULL, 0, -1, r);
        return;
    }
    if (b->too_big) {
        serve_api_error(r, 413, "invalid_request_error", NULL, "the body is larger than the "
                        "server's --max-body of %llu bytes", (unsigned long long)s->p.max_body);
        return;
    }
    pthread_mutex_lock(&s->mu);
    int draining = s->draining;
    s->in_flight++; /* until on_completed: the reply is sent too */
    pthread_mutex_unlock(&s->mu);
    b->in_flight = 1;
    if (draining) {
        serve_metrics_rejected(s->e->metrics, 1);
        serve_api_error(r, 503, "server_error", NULL, "the server is shutting down");
    } else {
        serve_api_handle(s->e, method, url, b->buf, b->len, client_fd(c), r);
    }
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
    return send_reply(s, c, &r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **state,
                         enum MHD_RequestTerminationCode why) {
    serve_http *s = cls;
    (void)c, (void)why;
    body *b = *state;
    if (b && b->in_flight) {
        pthread_mutex_lock(&s->mu);
        if (--s->in_flight == 0) pthread_cond_broadcast(&s->idle);
        pthread_mutex_unlock(&s->mu);
    }
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
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->idle, NULL);
    s->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                                MHD_USE_ERROR_LOG,
                            0, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &a,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_CONNECTION_TIMEOUT, 0u, MHD_OPTION_END);
    if (!s->d) {
        fprintf(stderr, "flexdiag serve: cannot listen on %s:%d (in use, or not an address of "
                        "this host)\n", p->host, p->port);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->idle);
        free(s);
        return 1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    *port = di ? di->port : p->port;
    *out = s;
    return 0;
}

void serve_http_drain(serve_http *s) {
    pthread_mutex_lock(&s->mu);
    s->draining = 1;
    while (s->in_flight) pthread_cond_wait(&s->idle, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

void serve_http_stop(serve_http *s) {
    if (!s) return;
    MHD_stop_daemon(s->d);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->idle);
    free(s);
}
