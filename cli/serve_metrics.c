/*
 * serve_metrics.c - what `flexdiag serve` counts and GET /metrics shows (serve.h), in
 * Prometheus' text exposition format 0.0.4. The library's API exposes no queue depth or slot
 * use, so the server counts its own requests through their callbacks: an image (sequence)
 * waits from its submit to its first token, holds a slot from then until it finishes (or its
 * request ends), and the server is the context's only user, so these are the context's
 * counts. Writers are the engine thread (tokens, results, ends) and the connection threads
 * (submits, outcomes, replies); one mutex guards everything.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/serve.h"

/* Upper bounds of the latency buckets, seconds (+Inf follows). */
static const double bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                2.5,   5,    10,    30,   60,  120, 300, 600};
#define N_BOUNDS ((int)(sizeof bounds / sizeof bounds[0]))

typedef struct hist {
    uint64_t in[N_BOUNDS + 1]; /* observations per bucket (not cumulative; the last: +Inf) */
    double sum;
    uint64_t count;
} hist;

#define RING 16   /* seconds of token and image counts kept for the rates */
#define WINDOW 10 /* seconds the rates average over */

struct serve_metrics {
    pthread_mutex_t mu;
    double t0;
    int32_t slots, rows, queue_cap;
    uint64_t kv_bytes[3];
    uint64_t submitted, started, results, dropped_waiting, dropped_live; /* images */
    uint64_t admitted, ends[4], rejected[2], images, tokens;             /* requests, results */
    uint64_t responses[600];                                             /* by HTTP status */
    struct {
        int64_t sec;
        uint64_t tokens, images;
    } ring[RING];
    hist latency[N_ROUTES], queue_wait, first_token;
};

serve_metrics *serve_metrics_new(int32_t slots, int32_t rows, int32_t queue_cap,
                                 const uint64_t kv_bytes[3]) {
    serve_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    m->t0 = cli_now();
    m->slots = slots;
    m->rows = rows;
    m->queue_cap = queue_cap;
    memcpy(m->kv_bytes, kv_bytes, sizeof m->kv_bytes);
    return m;
}

void serve_metrics_free(serve_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

/* ---- counting ---- */

static void observe(hist *h, double x) {
    int b = 0;
    while (b < N_BOUNDS && x > bounds[b]) b++;
    h->in[b]++;
    h->sum += x;
    h->count++;
}

/* The rate ring's bucket of this second, cleared when it held an older one. */
static void ring_add(serve_metrics *m, uint64_t tokens, uint64_t images) {
    int64_t sec = (int64_t)cli_now();
    int k = (int)(sec % RING);
    if (m->ring[k].sec != sec) {
        m->ring[k].sec = sec;
        m->ring[k].tokens = m->ring[k].images = 0;
    }
    m->ring[k].tokens += tokens;
    m->ring[k].images += images;
}

void serve_metrics_response(serve_metrics *m, int status) {
    if (!m || status < 0 || status >= 600) return;
    pthread_mutex_lock(&m->mu);
    m->responses[status]++;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_rejected(serve_metrics *m, int draining) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->rejected[draining != 0]++;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_submitted(serve_metrics *m, int32_t n) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->admitted++;
    m->submitted += (uint64_t)n;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_token(serve_metrics *m, int first) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->tokens++;
    m->started += first != 0;
    ring_add(m, 1, 0);
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_result(serve_metrics *m, int image) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->results++;
    m->images += image != 0;
    ring_add(m, 0, image != 0);
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_ended(serve_metrics *m, int32_t waiting, int32_t live,
                         const flexdiag_handle_stats *st) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->dropped_waiting += (uint64_t)waiting;
    m->dropped_live += (uint64_t)live;
    if (st && st->queue_s >= 0) observe(&m->queue_wait, st->queue_s);
    if (st && st->first_token_s >= 0) observe(&m->first_token, st->first_token_s);
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_outcome(serve_metrics *m, serve_route r, serve_end end, double seconds) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->ends[end]++;
    if (end == END_FINISHED) observe(&m->latency[r], seconds);
    pthread_mutex_unlock(&m->mu);
}

/* ---- the exposition ---- */

static void family(FILE *f, const char *name, const char *type, const char *help) {
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample(FILE *f, const char *name, const char *labels, double v) {
    fprintf(f, "%s%s%s%s %.17g\n", name, labels ? "{" : "", labels ? labels : "",
            labels ? "}" : "", v);
}

/* A gauge never below 0 (a first token may be counted before its request's submit). */
static double gauge(uint64_t in, uint64_t out) { return in > out ? (double)(in - out) : 0; }

static void hist_print(FILE *f, const char *name, const char *label, const hist *h) {
    uint64_t acc = 0;
    const char *sep = label ? "," : "";
    for (int b = 0; b <= N_BOUNDS; b++) {
        acc += h->in[b];
        char le[32];
        if (b < N_BOUNDS) snprintf(le, sizeof le, "%g", bounds[b]);
        else snprintf(le, sizeof le, "+Inf");
        fprintf(f, "%s_bucket{%s%sle=\"%s\"} %llu\n", name, label ? label : "", sep, le,
                (unsigned long long)acc);
    }
    fprintf(f, "%s_sum%s%s%s %.17g\n", name, label ? "{" : "", label ? label : "",
            label ? "}" : "", h->sum);
    fprintf(f, "%s_count%s%s%s %llu\n", name, label ? "{" : "", label ? label : "",
            label ? "}" : "", (unsigned long long)h->count);
}

/* Tokens and images per second over the last WINDOW seconds (less right after the start). */
static void rates(const serve_metrics *m, double *tokens, double *images) {
    double now = cli_now(), span = WINDOW - 1 + (now - (double)(int64_t)now);
    if (span > now - m->t0) span = now - m->t0;
    int64_t sec = (int64_t)now;
    uint64_t t = 0, i = 0;
    for (int k = 0; k < RING; k++)
        if (m->ring[k].sec > sec - WINDOW && m->ring[k].sec <= sec) {
            t += m->ring[k].tokens;
            i += m->ring[k].images;
        }
    *tokens = span > 0 ? (double)t / span : 0;
    *images = span > 0 ? (double)i / span : 0;
}

static void print_load(FILE *f, const serve_metrics *m) {
    double waiting = gauge(m->submitted, m->started + m->dropped_waiting);
    double live = gauge(m->started, m->results + m->dropped_live);
    family(f, "flexdiag_queue_depth", "gauge", "Images (text: sequences) waiting for a slot.");
    sample(f, "flexdiag_queue_depth", NULL, waiting);
    family(f, "flexdiag_queue_capacity", "gauge",
           "Images (sequences) the queue holds (--max-queue).");
    sample(f, "flexdiag_queue_capacity", NULL, m->queue_cap);
    family(f, "flexdiag_kv_slots", "gauge",
           "Slots of the context (--batch): one image's CFG rows or one text sequence each.");
    sample(f, "flexdiag_kv_slots", NULL, m->slots);
    family(f, "flexdiag_kv_slots_in_use", "gauge",
           "Slots holding an image or sequence being made (from its first token).");
    sample(f, "flexdiag_kv_slots_in_use", NULL, live);
    family(f, "flexdiag_live_sequences", "gauge",
           "KV sequences of the slots in use (2 per image with CFG, 1 per text sequence).");
    sample(f, "flexdiag_live_sequences", NULL, live * m->rows);
    family(f, "flexdiag_kv_cache_bytes", "gauge",
           "KV cache of the context's slots by home (--kv): the device (the CPU engine: its "
           "memory), pinned host memory, disk.");
    sample(f, "flexdiag_kv_cache_bytes", "home=\"device\"", (double)m->kv_bytes[0]);
    sample(f, "flexdiag_kv_cache_bytes", "home=\"host\"", (double)m->kv_bytes[1]);
    sample(f, "flexdiag_kv_cache_bytes", "home=\"disk\"", (double)m->kv_bytes[2]);
    double tps, ips;
    rates(m, &tps, &ips);
    family(f, "flexdiag_tokens_per_second", "gauge", "Tokens made per second over the last 10 s.");
    sample(f, "flexdiag_tokens_per_second", NULL, tps);
    family(f, "flexdiag_images_per_second", "gauge",
           "Images finished per second over the last 10 s.");
    sample(f, "flexdiag_images_per_second", NULL, ips);
}

static void print_counts(FILE *f, const serve_metrics *m) {
    family(f, "flexdiag_requests_admitted_total", "counter", "Requests the queue took.");
    sample(f, "flexdiag_requests_admitted_total", NULL, (double)m->admitted);
    family(f, "flexdiag_requests_finished_total", "counter", "Requests answered in full.");
    sample(f, "flexdiag_requests_finished_total", NULL, (double)m->ends[END_FINISHED]);
    family(f, "flexdiag_requests_failed_total", "counter", "Requests the engine failed.");
    sample(f, "flexdiag_requests_failed_total", NULL, (double)m->ends[END_FAILED]);
    family(f, "flexdiag_requests_cancelled_total", "counter",
           "Requests cancelled: the client hung up, or past --timeout.");
    sample(f, "flexdiag_requests_cancelled_total", "reason=\"client_gone\"",
           (double)m->ends[END_CANCELLED_GONE]);
    sample(f, "flexdiag_requests_cancelled_total", "reason=\"timeout\"",
           (double)m->ends[END_CANCELLED_TIMEOUT]);
    family(f, "flexdiag_requests_rejected_total", "counter",
           "Requests refused before the queue: 429 full queue, 503 draining.");
    sample(f, "flexdiag_requests_rejected_total", "reason=\"queue_full\"", (double)m->rejected[0]);
    sample(f, "flexdiag_requests_rejected_total", "reason=\"draining\"", (double)m->rejected[1]);
    family(f, "flexdiag_sequences_admitted_total", "counter",
           "Images (sequences) that took a slot.");
    sample(f, "flexdiag_sequences_admitted_total", NULL, (double)m->started);
    family(f, "flexdiag_sequences_finished_total", "counter", "Images (sequences) finished.");
    sample(f, "flexdiag_sequences_finished_total", NULL, (double)m->results);
    family(f, "flexdiag_images_total", "counter", "Images finished.");
    sample(f, "flexdiag_images_total", NULL, (double)m->images);
    family(f, "flexdiag_tokens_total", "counter",
           "Tokens made (an image's codes, a sequence's ids).");
    sample(f, "flexdiag_tokens_total", NULL, (double)m->tokens);
    family(f, "flexdiag_http_responses_total", "counter", "HTTP replies by status.");
    for (int s = 0; s < 600; s++)
        if (m->responses[s]) {
            char l[32];
            snprintf(l, sizeof l, "code=\"%d\"", s);
            sample(f, "flexdiag_http_responses_total", l, (double)m->responses[s]);
        }
}

static void print_latency(FILE *f, const serve_metrics *m) {
    static const char *const route[N_ROUTES] = {"route=\"images\"", "route=\"completions\"",
                                                "route=\"chat\""};
    family(f, "flexdiag_request_duration_seconds", "histogram",
           "Seconds from a finished request's arrival to its last byte ready.");
    for (int r = 0; r < N_ROUTES; r++)
        hist_print(f, "flexdiag_request_duration_seconds", route[r], &m->latency[r]);
    family(f, "flexdiag_queue_wait_seconds", "histogram",
           "Seconds from a request's submit until its first image took a slot.");
    hist_print(f, "flexdiag_queue_wait_seconds", NULL, &m->queue_wait);
    family(f, "flexdiag_time_to_first_token_seconds", "histogram",
           "Seconds from a request's submit to its first token.");
    hist_print(f, "flexdiag_time_to_first_token_seconds", NULL, &m->first_token);
}

char *serve_metrics_text(serve_metrics *m) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    if (m) {
        pthread_mutex_lock(&m->mu);
        print_load(f, m);
        print_counts(f, m);
        print_latency(f, m);
        pthread_mutex_unlock(&m->mu);
    }
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}
