/*
 * serve_job.c - one request of `flexdiag serve` on the engine (serve_run.h): flexdiag_submit
 * with callbacks that record its tokens, finished results and end as they come (engine
 * thread), and the connection thread's wait for them: poll on an eventfd the callbacks write,
 * the client's socket (a hang-up, POLLRDHUP, cancels the request) and the server's timeout
 * (which cancels it too). A cancelled request is waited for until the engine has dropped it,
 * so its slots are free when the connection is done. Counts into the server's metrics.
 */
#include <math.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/serve_run.h"

/* ---- the engine's callbacks (engine thread, one at a time) ---- */

/* Wake the waiting thread (j->mu held, so that it sees the news once it looks). */
static void wake(serve_job *j) {
    uint64_t one = 1;
    j->news++;
    ssize_t r = write(j->wake, &one, sizeof one);
    (void)r; /* the counter cannot overflow: the waiter reads it back to 0 */
}

static void on_token(flexdiag_handle *h, int32_t i, int32_t step, int32_t id, void *user) {
    serve_job *j = user;
    (void)h;
    serve_metrics_token(j->e->metrics, step == 0);
    pthread_mutex_lock(&j->mu);
    if (j->e->text && step < j->per) j->tokens[(size_t)i * (size_t)j->per + (size_t)step] = id;
    j->made[i] = step + 1;
    j->started += step == 0;
    j->total++;
    if (j->stream && (j->e->text || j->total >= j->next_wake)) {
        j->next_wake = j->total + j->step;
        wake(j);
    }
    pthread_mutex_unlock(&j->mu);
}

static void on_image(flexdiag_handle *h, int32_t i, const int32_t *tokens, int32_t n,
                     void *user) {
    serve_job *j = user;
    (void)h;
    serve_metrics_result(j->e->metrics, !j->e->text);
    pthread_mutex_lock(&j->mu);
    if (!j->e->text) /* text ids came token by token */
        memcpy(j->tokens + (size_t)i * (size_t)j->per, tokens, (size_t)n * sizeof *tokens);
    j->lens[i] = n;
    j->finished[i] = 1;
    j->results++;
    if (j->stream) wake(j);
    pthread_mutex_unlock(&j->mu);
}

static void on_done(flexdiag_handle *h, flexdiag_status st, void *user) {
    serve_job *j = user;
    flexdiag_status running;
    flexdiag_handle_stats hs = {.struct_size = sizeof hs};
    int timed = flexdiag_handle_status(h, &running, &hs) == FLEXDIAG_OK;
    pthread_mutex_lock(&j->mu);
    serve_metrics_ended(j->e->metrics, j->n - j->started, j->started - j->results,
                        timed ? &hs : NULL);
    j->ended = 1;
    j->st = st;
    wake(j);
    pthread_mutex_unlock(&j->mu);
}

/* ---- the connection thread's side ---- */

static void job_free_bare(serve_job *j) {
    if (j->wake >= 0) close(j->wake);
    pthread_mutex_destroy(&j->mu);
    free(j->tokens);
    free(j->made);
    free(j->lens);
    free(j->finished);
    free(j);
}

/* A job for n results of per tokens, not submitted; NULL when out of memory. */
static serve_job *job_new(const serve_engine *e, serve_route route, int32_t n, int client,
                          int stream) {
    serve_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    *j = (serve_job){.e = e, .route = route, .stream = stream, .client = client,
                     .t0 = cli_now(), .n = n, .per = e->per_image, .wake = -1};
    pthread_mutex_init(&j->mu, NULL);
    j->deadline = e->timeout_s > 0 ? j->t0 + e->timeout_s : 0;
    uint64_t all = (uint64_t)n * (uint64_t)j->per;
    j->step = j->next_wake = all / 16 ? all / 16 : 1; /* about 16 progress events a request */
    j->tokens = calloc(all ? all : 1, sizeof *j->tokens);
    j->made = calloc((size_t)n, sizeof *j->made);
    j->lens = calloc((size_t)n, sizeof *j->lens);
    j->finished = calloc((size_t)n, 1);
    j->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (j->tokens && j->made && j->lens && j->finished && j->wake >= 0) return j;
    job_free_bare(j);
    return NULL;
}

/* The error of a refused submit or a failed request: 400 for what the request asked, 500 for
 * the server's own failures. */
static void status_error(serve_reply *err, flexdiag_status st, const char *param,
                         const char *msg) {
    int client = st == FLEXDIAG_ERR_INVALID_ARG || st == FLEXDIAG_ERR_NOT_FOUND;
    serve_api_error(err, client ? 400 : 500, client ? TYPE_REQ : "server_error",
                    client ? param : NULL, "%s", msg);
}

int serve_job_start(const serve_engine *e, serve_route route, const flexdiag_request *rq,
                    flexdiag_submit_params *sp, int client, int stream, serve_job **out,
                    serve_reply *err) {
    serve_job *j = job_new(e, route, rq->n_prompts * rq->images_per_prompt, client, stream);
    if (!j) {
        serve_api_error(err, 500, "server_error", NULL, "out of memory");
        return -1;
    }
    sp->on_image = on_image;
    sp->on_token = on_token;
    sp->on_done = on_done;
    sp->user = j;
    flexdiag_status st = flexdiag_submit(e->c, rq, sp, &j->h);
    if (st == FLEXDIAG_ERR_BUSY) {
        serve_metrics_rejected(e->metrics, 0);
        serve_api_error(err, 429, "rate_limit_error", NULL, "the request queue is full; retry "
                        "later");
        err->retry_after = 1;
    } else if (st != FLEXDIAG_OK) {
        status_error(err, st, "prompt", flexdiag_last_error(NULL));
    }
    if (st != FLEXDIAG_OK) {
        job_free_bare(j);
        return -1;
    }
    serve_metrics_submitted(e->metrics, j->n);
    *out = j;
    return 0;
}

/* Stop j for why: cancel its request, watch nothing more. */
static void job_cancel(serve_job *j, serve_end why) {
    j->why = why;
    j->client = -1;
    j->deadline = 0;
    flexdiag_handle_cancel(j->h);
}

/* Whether the poll result p of j's client socket says it hung up; if so, cancel j. */
static void check_client(serve_job *j, const struct pollfd *p) {
    if (p->revents & (POLLRDHUP | POLLHUP | POLLERR)) job_cancel(j, END_CANCELLED_GONE);
}

/* Block until a callback wakes j, its client hangs up or its deadline passes (a signal may end
 * the wait early: the caller looks again). */
static void job_block(serve_job *j) {
    struct pollfd p[2] = {{.fd = j->wake, .events = POLLIN},
                          {.fd = j->client, .events = POLLRDHUP}};
    int np = j->client >= 0 ? 2 : 1, ms = -1;
    if (j->deadline > 0) {
        double left = j->deadline - cli_now();
        if (left <= 0) {
            job_cancel(j, END_CANCELLED_TIMEOUT);
            return;
        }
        ms = left > 3600 ? 3600 * 1000 : (int)ceil(left * 1000);
    }
    if (poll(p, (nfds_t)np, ms) <= 0) return;
    uint64_t v;
    if ((p[0].revents & POLLIN) && read(j->wake, &v, sizeof v) < 0) return;
    if (np == 2) check_client(j, &p[1]);
}

uint64_t serve_job_wait(serve_job *j, uint64_t seen) {
    for (;;) {
        pthread_mutex_lock(&j->mu);
        uint64_t news = j->news;
        int ended = j->ended;
        pthread_mutex_unlock(&j->mu);
        if (news == seen && !ended) {
            job_block(j);
            continue;
        }
        serve_job_check(j); /* a busy stream has news at every look */
        return news;
    }
}

void serve_job_check(serve_job *j) {
    struct pollfd p = {.fd = j->client, .events = POLLRDHUP};
    if (j->client >= 0 && poll(&p, 1, 0) > 0) check_client(j, &p);
}

void serve_job_error(const serve_job *j, serve_reply *err) {
    if (j->why == END_CANCELLED_GONE)
        serve_api_error(err, SERVE_CLIENT_GONE, "client_gone", NULL, "the client hung up; "
                        "the request was cancelled");
    else if (j->why == END_CANCELLED_TIMEOUT)
        serve_api_error(err, 504, "timeout_error", NULL, "the request ran past the server's "
                        "--timeout of %g s and was cancelled", j->e->timeout_s);
    else
        status_error(err, j->st, NULL, flexdiag_handle_error(j->h));
}

/* Whether j finished: a request the timeout raced with may have; one whose client hung up
 * has no one to tell. */
static int finished(const serve_job *j) {
    return j->st == FLEXDIAG_OK && j->why != END_CANCELLED_GONE;
}

int serve_job_end(serve_job *j, serve_reply *err) {
    uint64_t seen = 0;
    for (;;) {
        seen = serve_job_wait(j, seen);
        pthread_mutex_lock(&j->mu);
        int ended = j->ended;
        pthread_mutex_unlock(&j->mu);
        if (ended) break;
    }
    flexdiag_handle_wait(j->h, -1); /* its callbacks have returned */
    if (finished(j)) {
        j->why = END_FINISHED;
        return 0;
    }
    serve_job_error(j, err);
    return -1;
}

void serve_job_free(serve_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int ended = j->ended;
    pthread_mutex_unlock(&j->mu);
    if (!ended) flexdiag_handle_cancel(j->h);
    flexdiag_handle_wait(j->h, -1);
    serve_end end = j->why != END_FINISHED ? j->why : j->st == FLEXDIAG_OK ? END_FINISHED
                                                                           : END_FAILED;
    serve_metrics_outcome(j->e->metrics, j->route, end, cli_now() - j->t0);
    flexdiag_handle_release(j->h);
    job_free_bare(j);
}
