/*
 * serve_stream.c - the server-sent events of a streamed request (serve.h serve_stream_read),
 * made on the connection's thread each time the request's job wakes it:
 *   images       "event: image_generation.progress" about every 1/16 of the request's tokens
 *                (images done, tokens made of all), and one "image_generation.completed" per
 *                finished image with its PNG in base64 (the bytes of the non-streamed reply);
 *   completions  one chunk per token in OpenAI's completion-chunk shape ("text" the piece of
 *                text the token completes, "tokens" [its id]), then a last chunk per choice
 *                with its finish_reason;
 *   chat         the same in chat-chunk shape, after a first chunk per choice with the role;
 * then "data: [DONE]". A request that fails or runs past the timeout ends with an error event
 * ({"error": ...}) instead; a client that hangs up cancels it (serve_job.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/serve_run.h"

enum { S_RUNNING, S_ENDED, S_GONE, S_BROKEN };

struct serve_stream {
    serve_job *j;
    stream_kind kind;
    int tokens;              /* images: their code grids too */
    int state;
    char id[48];
    json_int_t created;
    uint64_t seen;           /* the job's news mark */
    uint64_t progress;       /* images: tokens in the last progress event */
    int backlog;             /* images: finished ones not sent yet (one event per read) */
    int32_t *made, *lens;    /* (n) the job's counts when last looked at */
    uint8_t *fin;            /* (n) */
    int32_t *sent;           /* (n) text: tokens sent; images: 1 once its event is out */
    uint8_t *closed;         /* (n) text: its last chunk sent */
    serve_text_cursor *cur;  /* (n) */
    char *buf;               /* bytes made and not yet read */
    size_t len, off, cap;
};

/* ---- the output buffer ---- */

static void put(serve_stream *s, const char *p, size_t n) {
    if (s->state == S_BROKEN) return;
    if (s->len + n > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->len + n) cap *= 2;
        char *nb = realloc(s->buf, cap);
        if (!nb) {
            s->state = S_BROKEN;
            return;
        }
        s->buf = nb;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, p, n);
    s->len += n;
}

static void put_str(serve_stream *s, const char *p) { put(s, p, strlen(p)); }

/* One event: "event: <name>" when named, then data (taken; NULL is out of memory). */
static void put_event(serve_stream *s, const char *name, json_t *data) {
    char *text = data ? json_dumps(data, JSON_COMPACT) : NULL;
    json_decref(data);
    if (!text) {
        s->state = S_BROKEN;
        return;
    }
    if (name) {
        put_str(s, "event: ");
        put_str(s, name);
        put_str(s, "\n");
    }
    put_str(s, "data: ");
    put_str(s, text);
    put_str(s, "\n\n");
    free(text);
}

/* ---- images ---- */

static void image_event(serve_stream *s, int32_t i) {
    const serve_engine *e = s->j->e;
    const int32_t *t = s->j->tokens + (size_t)i * (size_t)s->j->per;
    char size[32];
    snprintf(size, sizeof size, "%dx%d", e->img_w, e->img_h);
    json_t *ev = json_pack("{s:s, s:i, s:I, s:s, s:s}", "type", "image_generation.completed",
                           "index", i, "created_at", s->created, "size", size, "output_format",
                           "png");
    if (ev && e->img_h) {
        json_t *png = serve_png_b64(e, t);
        if (!png) {
            json_decref(ev);
            put_event(s, NULL, json_pack("{s:{s:s, s:s, s:n, s:n}}", "error", "message",
                                         "image decoding failed", "type", "server_error",
                                         "param", "code"));
            s->j->why = END_FAILED;
            s->state = S_ENDED;
            return;
        }
        json_object_set_new(ev, "b64_json", png);
    }
    if (ev && (s->tokens || !e->img_h))
        json_object_set_new(ev, "tokens", serve_ids_json(t, s->j->per));
    put_event(s, "image_generation.completed", ev);
}

static void image_events(serve_stream *s) {
    const serve_job *j = s->j;
    uint64_t t = 0;
    int32_t done = 0;
    for (int32_t i = 0; i < j->n; i++) {
        t += (uint64_t)(s->made[i] < j->per ? s->made[i] : j->per);
        done += s->fin[i];
    }
    if (t > s->progress) {
        put_event(s, "image_generation.progress",
                  json_pack("{s:s, s:i, s:i, s:I, s:I}", "type", "image_generation.progress",
                            "images_done", done, "images", j->n, "tokens", (json_int_t)t,
                            "tokens_total", (json_int_t)j->n * j->per));
        s->progress = t;
    }
    s->backlog = 0; /* an image's decoding takes turns with the engine: one at a time, so
                       that a hang-up is seen between them */
    for (int32_t i = 0; i < j->n && s->state == S_RUNNING; i++)
        if (s->fin[i] && !s->sent[i]) {
            if (s->backlog++) continue;
            image_event(s, i);
            s->sent[i] = 1;
        }
    s->backlog -= s->backlog > 0;
}

/* ---- text ---- */

/* A chunk of choice i: its text piece (taken; NULL is out of memory), the token it came from
 * (id < 0: none), the finish reason of a last chunk (NULL: not last). Chat's delta is
 * {"role"} for role, {"content"} for a piece, {} for a last chunk without one. */
static void text_chunk(serve_stream *s, int32_t i, char *piece, int32_t id, const char *reason,
                       int role) {
    const serve_engine *e = s->j->e;
    int chat = s->kind == STREAM_CHAT;
    json_t *c = piece ? json_pack("{s:i, s:n, s:o}", "index", i, "logprobs", "finish_reason",
                                  reason ? json_string(reason) : json_null())
                      : NULL;
    if (c && chat) {
        json_t *d = role ? json_pack("{s:s, s:s}", "role", "assistant", "content", "")
                         : json_object();
        if (d && !role && (!reason || piece[0]))
            json_object_set_new(d, "content", json_string(piece));
        json_object_set_new(c, "delta", d);
    } else if (c) {
        json_object_set_new(c, "text", json_string(piece));
    }
    if (c && id >= 0) json_object_set_new(c, "tokens", serve_ids_json(&id, 1));
    free(piece);
    put_event(s, NULL, c ? json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", s->id, "object",
                                     chat ? "chat.completion.chunk" : "text_completion",
                                     "created", s->created, "model", e->model_id, "choices", c)
                         : NULL);
}

static void text_events(serve_stream *s) {
    const serve_job *j = s->j;
    for (int32_t i = 0; i < j->n; i++) {
        const int32_t *ids = j->tokens + (size_t)i * (size_t)j->per;
        int32_t upto = s->fin[i] ? s->lens[i] : s->made[i];
        for (; s->sent[i] < upto; s->sent[i]++) {
            int32_t k = s->sent[i];
            text_chunk(s, i, serve_text_delta(j->e, ids, k + 1, &s->cur[i], 0), ids[k], NULL, 0);
        }
        if (s->fin[i] && !s->closed[i]) {
            text_chunk(s, i, serve_text_delta(j->e, ids, s->lens[i], &s->cur[i], 1), -1,
                       serve_finish_reason(j->e, ids, s->lens[i]), 0);
            s->closed[i] = 1;
        }
    }
}

/* ---- the stream ---- */

/* The job's counts into s; whether it ended (and its status). */
static int look(serve_stream *s, flexdiag_status *st) {
    serve_job *j = s->j;
    pthread_mutex_lock(&j->mu);
    memcpy(s->made, j->made, (size_t)j->n * sizeof *s->made);
    memcpy(s->lens, j->lens, (size_t)j->n * sizeof *s->lens);
    memcpy(s->fin, j->finished, (size_t)j->n);
    int ended = j->ended;
    *st = j->st;
    pthread_mutex_unlock(&j->mu);
    return ended;
}

/* The end: [DONE] when the request finished, else its error. */
static void end_events(serve_stream *s, flexdiag_status st) {
    serve_job *j = s->j;
    flexdiag_handle_wait(j->h, -1); /* its callbacks have returned */
    if (st == FLEXDIAG_OK) {
        j->why = END_FINISHED; /* the timeout may have raced with its end */
        put_str(s, "data: [DONE]\n\n");
    } else {
        serve_reply r = {0};
        serve_job_error(j, &r);
        put_str(s, "data: ");
        put_str(s, r.body ? r.body : "{}");
        put_str(s, "\n\n");
        free(r.body);
    }
    if (s->state == S_RUNNING) s->state = S_ENDED;
}

/* Wait for the job's news (unless images wait to be sent) and make their events. */
static void stream_step(serve_stream *s) {
    serve_job *j = s->j;
    if (s->backlog) serve_job_check(j);
    else s->seen = serve_job_wait(j, s->seen);
    if (j->why == END_CANCELLED_GONE) {
        s->state = S_GONE;
        return;
    }
    flexdiag_status st;
    int ended = look(s, &st);
    if (s->kind == STREAM_IMAGES) image_events(s);
    else text_events(s);
    if (ended && !s->backlog && s->state == S_RUNNING) end_events(s, st);
}

ssize_t serve_stream_read(serve_stream *s, char *buf, size_t cap) {
    while (s->off == s->len) {
        if (s->state == S_GONE || s->state == S_BROKEN) return -1;
        if (s->state == S_ENDED) return 0;
        s->off = s->len = 0;
        stream_step(s);
    }
    size_t k = s->len - s->off < cap ? s->len - s->off : cap;
    memcpy(buf, s->buf + s->off, k);
    s->off += k;
    return (ssize_t)k;
}

void serve_stream_free(serve_stream *s) {
    if (!s) return;
    if (s->state != S_ENDED && s->j->why == END_FINISHED) /* not read to its end */
        s->j->why = s->state == S_BROKEN ? END_FAILED : END_CANCELLED_GONE;
    serve_job_free(s->j);
    free(s->made);
    free(s->lens);
    free(s->fin);
    free(s->sent);
    free(s->closed);
    free(s->cur);
    free(s->buf);
    free(s);
}

serve_stream *serve_stream_new(serve_job *j, stream_kind kind, int tokens) {
    serve_stream *s = calloc(1, sizeof *s);
    size_t n = (size_t)j->n;
    if (s) {
        *s = (serve_stream){.j = j, .kind = kind, .tokens = tokens,
                            .created = (json_int_t)time(NULL)};
        s->made = calloc(n, sizeof *s->made);
        s->lens = calloc(n, sizeof *s->lens);
        s->fin = calloc(n, 1);
        s->sent = calloc(n, sizeof *s->sent);
        s->closed = calloc(n, 1);
        s->cur = calloc(n, sizeof *s->cur);
    }
    if (!s || !s->made || !s->lens || !s->fin || !s->sent || !s->closed || !s->cur) {
        if (s) s->state = S_BROKEN;
        else serve_job_free(j);
        serve_stream_free(s);
        return NULL;
    }
    serve_reply_id(s->id, sizeof s->id, kind == STREAM_CHAT ? "chatcmpl" : "cmpl");
    for (int32_t i = 0; kind == STREAM_CHAT && i < j->n; i++)
        text_chunk(s, i, strdup(""), -1, NULL, 1);
    return s;
}
