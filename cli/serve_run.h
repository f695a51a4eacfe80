/*
 * serve_run.h - what the API's parts share (serve.h): a request running on the engine
 * (serve_job.c), the streams made of one (serve_stream.c) and the pieces replies and events are
 * made of (serve_out.c). Not seen by serve_http.c or cmd_serve.c.
 */
#ifndef FLEXDIAG_SERVE_RUN_H
#define FLEXDIAG_SERVE_RUN_H

#include <jansson.h>
#include <pthread.h>

#include "cli/serve.h"

#define TYPE_REQ "invalid_request_error"

/* ---- a request on the engine (serve_job.c) ----
 *
 * The engine's callbacks (its thread) record results into the job as they come and wake the
 * connection's thread through an eventfd; that thread waits on it with poll, watching the
 * client's socket for a hang-up and the server's timeout, either of which cancels the request
 * (flexdiag_handle_cancel). Tokens and grids are written once, before the counters that
 * publish them (under mu), so a reader that saw a count reads them without the lock. */
typedef struct serve_job {
    const serve_engine *e;
    serve_route route;
    flexdiag_handle *h;
    int stream;           /* wake on results and progress, not only at the end */
    int wake;             /* eventfd the callbacks write */
    /* the waiting thread's own: */
    int client;           /* socket watched for a hang-up (-1: none, or cancelled already) */
    double t0, deadline;  /* arrival; cli_now() past which it is cancelled (0: none) */
    serve_end why;        /* END_FINISHED, or why it did not finish */
    int32_t n, per;       /* results, tokens room per result */
    uint64_t step;        /* a stream of images is woken every this many tokens */
    pthread_mutex_t mu;   /* guards what follows */
    int32_t *tokens;      /* (n, per): text ids as made; an image's grid once finished */
    int32_t *made;        /* (n) tokens made so far */
    int32_t *lens;        /* (n) tokens of a finished result */
    uint8_t *finished;    /* (n) */
    int32_t started;      /* results that took a slot */
    int32_t results;      /* results finished */
    uint64_t total;       /* tokens made, all results */
    uint64_t next_wake;   /* total at which a stream of images is woken next */
    uint64_t news;        /* wake-ups so far */
    int ended;            /* the request ended (no callback follows) */
    flexdiag_status st;   /* its status once ended */
} serve_job;

/* Submit rq on e (sp's callbacks and user are set here), watching client for a hang-up; 0 with
 * *out, or -1 after an error reply (429 queue full, 400 refused, 500). */
int serve_job_start(const serve_engine *e, serve_route route, const flexdiag_request *rq,
                    flexdiag_submit_params *sp, int client, int stream, serve_job **out,
                    serve_reply *err);
/* Wait until j has news past mark seen (a result, progress, its end), the client hangs up or
 * the timeout passes (both cancel it: j->why); returns the new mark. */
uint64_t serve_job_wait(serve_job *j, uint64_t seen);
/* Whether j's client hung up, without waiting (a hang-up cancels j: j->why). */
void serve_job_check(serve_job *j);
/* Wait for j's end: 0 when it finished, or -1 after the error reply (SERVE_CLIENT_GONE, 504,
 * 400, 500). */
int serve_job_end(serve_job *j, serve_reply *err);
/* The error reply of a job that ended without finishing. */
void serve_job_error(const serve_job *j, serve_reply *err);
/* Cancel j if it runs, wait for its end, count its outcome, free it; NULL is a no-op. */
void serve_job_free(serve_job *j);

/* ---- streams (serve_stream.c) ---- */

typedef enum stream_kind { STREAM_IMAGES, STREAM_COMPLETION, STREAM_CHAT } stream_kind;

/* A stream of j's events (taking j): images (with their code grids when tokens), completion
 * chunks or chat chunks; NULL when out of memory (j is then freed). */
serve_stream *serve_stream_new(serve_job *j, stream_kind kind, int tokens);

/* ---- reply pieces (serve_out.c) ---- */

/* Take j (a new reference) as the body of a status reply (500 when j is NULL). */
void serve_reply_json(serve_reply *out, int status, json_t *j);
/* A reply's id: prefix, the time and a count of the process ("cmpl-1700000000-7"). */
void serve_reply_id(char *buf, size_t cap, const char *prefix);
/* Image tokens' PNG (the bytes `flexdiag generate` writes) in base64 as a new JSON string;
 * NULL on failure. */
json_t *serve_png_b64(const serve_engine *e, const int32_t *tokens);
/* A JSON array of n ids. */
json_t *serve_ids_json(const int32_t *ids, int32_t n);
/* The text of n ids (special tokens dropped; "" without a tokenizer); malloc'ed, NULL when out
 * of memory. */
char *serve_text(const serve_engine *e, const int32_t *ids, int32_t n);
/* "stop" when a sequence ended at the model's end id, else "length". */
const char *serve_finish_reason(const serve_engine *e, const int32_t *ids, int32_t n);

/* Where a streamed sequence's text stands: the ids from prefix were decoded, those before read
 * sent. */
typedef struct serve_text_cursor {
    int32_t prefix, read;
} serve_text_cursor;
/* The text ids[0..n) adds to what c has sent (malloc'ed; "" while the text ends in a character
 * cut between tokens, U+FFFD, unless final), c moved on; NULL when out of memory. Sent deltas
 * concatenate to serve_text of all the ids. */
char *serve_text_delta(const serve_engine *e, const int32_t *ids, int32_t n,
                       serve_text_cursor *c, int final);

#endif /* FLEXDIAG_SERVE_RUN_H */
