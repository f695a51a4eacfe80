/*
 * cmd_serve.c - `flexdiag serve`: the model of generate's flags behind an OpenAI-shaped HTTP
 * API (serve.h) until SIGTERM or SIGINT.
 *
 * One runtime, model and context, made from the same model, policy, budget and offload flags
 * as `flexdiag generate`; every HTTP request is a flexdiag_submit on the context, so concurrent
 * requests share its --batch slots (continuous batching) and --max-queue bounds what waits
 * (a 429 past it). A model folder's chat template (tokenizer_config.json) serves
 * /v1/chat/completions when it is one serve_chat.c renders; the server's counters serve
 * /metrics. Prints "listening on http://HOST:PORT" once requests are taken. A signal drains:
 * /health says "draining", new API requests get 503, the ones in flight finish, and the
 * command exits 0.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/serve.h"

#define CMD "serve"

#define fail(rc, ...) cli_errorf(CMD, (rc), __VA_ARGS__)

typedef struct serve_opts {
    cli_model_opts mo;
    cli_policy_opts po;
    serve_http_params hp;
    int64_t port, batch, max_queue, max_prompt_len, max_new_tokens, micro_batch, max_n;
    uint64_t max_body;
    double timeout;
} serve_opts;

static volatile sig_atomic_t g_signal;

static void on_signal(int sig) { g_signal = sig; }

static void signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* Whether host is a loopback address (127.0.0.0/8). */
static int loopback(const char *host) { return !strncmp(host, "127.", 4); }

static int check_opts(const serve_opts *o) {
    if (!loopback(o->hp.host) && !o->hp.api_key)
        return fail(2, "--host %s is not a loopback address: give --api-key KEY (clients send "
                       "Authorization: Bearer KEY)", o->hp.host);
    if (o->max_body < 2) return fail(2, "--max-body %llu: at least 2 bytes ({})",
                                     (unsigned long long)o->max_body);
    return cli_check_model(CMD, &o->mo);
}

/* The context's params from the flags. */
static void context_params(const serve_opts *o, const flexdiag_policy_params *pp,
                           flexdiag_context_params *cp) {
    flexdiag_context_params_init(cp);
    cp->policy = *pp;
    cli_policy_calib(&o->po, cp);
    cp->max_images = (int32_t)o->batch;
    cp->micro_batch = (int32_t)o->micro_batch;
    cp->max_prompt_len = (int32_t)o->max_prompt_len;
    if (o->max_new_tokens > 0) cp->max_new_tokens = (int32_t)o->max_new_tokens;
    cp->text = o->max_new_tokens > 0;
    cp->queue_images = (int32_t)o->max_queue;
    cli_kv_homes(CMD, &o->mo, cp);
}

/* What the API needs to know of the model: text or images, tokens per result, image size,
 * end id; *rows the sequences of one result (2: an image with CFG). 0, or an exit code after a
 * message. */
static int describe(serve_engine *e, int32_t *rows) {
    const char *empty[1] = {""};
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    rq.n_prompts = 1;
    rq.prompts = empty;
    flexdiag_output q = {0}; /* a size query */
    flexdiag_status st = flexdiag_generate(e->c, &rq, &q);
    flexdiag_score_request sq;
    flexdiag_score_request_init(&sq);
    flexdiag_score_output so = {.struct_size = sizeof so}; /* a size query: rows per image */
    if (st == FLEXDIAG_OK) st = flexdiag_score(e->c, &sq, &so);
    if (st == FLEXDIAG_OK) st = flexdiag_model_image_size(e->m, &e->img_h, &e->img_w);
    if (st == FLEXDIAG_OK) st = flexdiag_model_eos(e->m, &e->eos);
    if (st != FLEXDIAG_OK) return cli_fail(CMD, st);
    e->per_image = q.tokens_per_image;
    e->text = so.rows == 1;
    *rows = so.rows;
    return 0;
}

/* The model's name: --model's folder name, --arch, or the default builtin. */
static const char *model_id(const cli_model_opts *mo) {
    if (mo->model) {
        const char *s = strrchr(mo->model, '/');
        return s && s[1] ? s + 1 : mo->model;
    }
    return mo->arch ? mo->arch : flexdiag_builtin_arch(0);
}

/* The server's counters and, for a text model, its chat template (said on stderr); 0, or an
 * exit code after a message. */
static int serve_extras(serve_engine *e, const serve_opts *o, int32_t rows, serve_chat *chat,
                        serve_metrics **m) {
    int32_t cap = o->max_queue > 0 ? (int32_t)o->max_queue
                  : 4 * o->batch > 64 ? (int32_t)(4 * o->batch) : 64; /* the library's default */
    flexdiag_offload_info oi = {.struct_size = sizeof oi};
    flexdiag_status st = flexdiag_context_offload(e->c, &oi);
    if (st != FLEXDIAG_OK) return cli_fail(CMD, st);
    if (!(*m = serve_metrics_new((int32_t)o->batch, rows, cap, oi.kv_bytes)))
        return fail(1, "out of memory");
    e->metrics = *m;
    serve_chat_load(o->mo.model, chat);
    e->chat = chat;
    if (e->text && chat->kind == CHAT_UNKNOWN)
        fprintf(stderr, "flexdiag " CMD ": the model's chat template (%s) is not one this "
                        "server renders (chatml, zephyr, llama-2, llama-3): "
                        "/v1/chat/completions answers 400\n", chat->note);
    else if (e->text && chat->kind != CHAT_NONE)
        fprintf(stderr, "flexdiag " CMD ": chat template %s (%s)\n",
                serve_chat_name(chat->kind), chat->note);
    return 0;
}

/* Serve e until a signal, then drain. */
static int serve_until_signal(serve_engine *e, const serve_opts *o) {
    serve_http *s = NULL;
    int port = 0, rc = serve_http_start(e, &o->hp, &s, &port);
    if (rc) return rc;
    printf("listening on http://%s:%d\n", o->hp.host, port);
    fflush(stdout);
    struct timespec ts = {0, 50 * 1000 * 1000};
    while (!g_signal) nanosleep(&ts, NULL);
    fprintf(stderr, "flexdiag " CMD ": signal %d: draining (finishing the requests in "
                    "flight)\n", (int)g_signal);
    serve_http_drain(s);
    serve_http_stop(s);
    fprintf(stderr, "flexdiag " CMD ": stopped\n");
    return 0;
}

int flexdiag_cmd_serve(int argc, char **argv) {
    serve_opts o = {.mo.seed = 1, .po = CLI_POLICY_OPTS_INIT, .hp.host = "127.0.0.1",
                    .port = 8000, .batch = 8, .max_prompt_len = 128, .max_n = 16,
                    .max_body = 1 << 20, .timeout = 600};
    const cli_opt opts[] = {
        CLI_MODEL_FLAGS(&o.mo),
        CLI_POLICY_FLAGS(&o.po),
        {.name = "--host", CLI_STR, &o.hp.host,
         "IPv4 address to listen on (default 127.0.0.1; another than loopback needs --api-key)"},
        {.name = "--port", CLI_INT, &o.port, "TCP port (default 8000; 0: a free one, printed)",
         CLI_INTS(0, 65535, "0 = any free port")},
        {.name = "--api-key", CLI_STR, &o.hp.api_key,
         "KEY: /v1/ requests must send Authorization: Bearer KEY"},
        {.name = "--batch", CLI_INT, &o.batch,
         "images (text: sequences) generated together: the context's slots (default 8)",
         CLI_INTS(1, 1 << 16, NULL)},
        {.name = "--max-queue", CLI_INT, &o.max_queue,
         "images (sequences) waiting for a slot; a request past it gets 429 (default 0: 4 x "
         "--batch, at least 64)", CLI_INTS(0, INT32_MAX, "0 = the library's default")},
        {.name = "--max-n", CLI_INT, &o.max_n,
         "most images (sequences) one request may ask for with n (default 16)",
         CLI_INTS(1, 1 << 16, NULL)},
        {.name = "--max-body", CLI_SIZE, &o.max_body,
         "largest request body, e.g. 64K (default 1M); larger: 413"},
        {.name = "--timeout", CLI_F64, &o.timeout,
         "seconds a request may take; past it, it is cancelled and answered 504 (default 600)",
         CLI_NUMS(0, 1e9, 0, "0 = no limit")},
        {.name = "--micro-batch", CLI_INT, &o.micro_batch,
         "images per micro-batch (default: --batch)", CLI_INTS(0, INT32_MAX, "0 = --batch")},
        {.name = "--max-prompt-len", CLI_INT, &o.max_prompt_len,
         "prompt capacity in tokens (default 128)", CLI_INTS(2, 1 << 20, NULL)},
        {.name = "--max-new-tokens", CLI_INT, &o.max_new_tokens,
         "text models: most tokens a completion makes, max_tokens' bound (default 128)",
         CLI_INTS(0, 1 << 20, "0 = 128")},
    };
    int rc = cli_parse(CMD, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (rc) return rc == 1 ? 0 : rc;
    if ((rc = check_opts(&o))) return rc;
    flexdiag_policy_params pp;
    if (cli_policy_params(CMD, &o.po, &pp)) return 2;
    o.hp.port = (int)o.port;
    o.hp.max_body = o.max_body;
    serve_engine e = {.model_id = model_id(&o.mo), .max_n = (int32_t)o.max_n,
                      .timeout_s = o.timeout};
    flexdiag_runtime *rt = NULL;
    serve_chat chat = {0};
    serve_metrics *metrics = NULL;
    int32_t rows = 0;
    rc = cli_open_model(CMD, &o.mo, &rt, &e.m);
    flexdiag_context_params cp;
    if (!rc) context_params(&o, &pp, &cp);
    flexdiag_status st = rc ? FLEXDIAG_OK : flexdiag_context_create(e.m, &cp, &e.c);
    if (!rc && st != FLEXDIAG_OK) rc = cli_fail(CMD, st);
    if (!rc) rc = describe(&e, &rows);
    if (!rc) rc = serve_extras(&e, &o, rows, &chat, &metrics);
    if (!rc) {
        signals_install();
        rc = serve_until_signal(&e, &o);
    }
    flexdiag_context_destroy(e.c);
    flexdiag_model_destroy(e.m);
    flexdiag_runtime_destroy(rt);
    serve_chat_free(&chat);
    serve_metrics_free(metrics);
    return rc;
}
