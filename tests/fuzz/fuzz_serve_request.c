/*
 * fuzz_serve_request.c - libFuzzer target for the request parser of `flexdiag serve`
 * (cli/serve_api.c serve_api_handle, with the chat templates of cli/serve_chat.c and the
 * metrics of cli/serve_metrics.c compiled in) on an engine without a context (parse only: a
 * request that passes every check, its chat messages rendered, is answered 200 with {}). The
 * first byte picks the model (bit 0: an image model, 32x32 images of 64 tokens; a text model
 * of 16 new tokens), the route (bits 1-3: images, completions, models, an unknown path, chat,
 * metrics, chat, completions), the method (bit 4: GET instead of POST) and the text model's
 * chat template (bits 5-7: none, one not rendered, chatml, zephyr, llama-2, llama-3, llama-3,
 * llama-3); the rest is the body.
 *
 * Properties checked beyond "no crash, no sanitizer report":
 *   - the status is 200, 400, 404 or 405 (never 500);
 *   - the reply body is a JSON object, except GET /metrics: Prometheus text whose lines are
 *     "# HELP", "# TYPE" or "name{labels} value";
 *   - a 400 names its field: param is null (the body is not a JSON object) or a string that is
 *     a key of the body's object, or "prompt" / "model" / "messages" (a missing prompt or
 *     messages, the other route);
 *   - a 200 on a POST route came from a body that jansson reads as an object, with no
 *     duplicate keys; its reply is {}.
 *
 * The same entry point is replayed over tests/fuzz/corpus/serve_request by replay.c in the
 * 'format' suite.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/serve.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const paths[] = {"/v1/images/generations", "/v1/completions", "/v1/models",
                                    "/v2/nothing", "/v1/chat/completions", "/metrics",
                                    "/v1/chat/completions", "/v1/completions"};

static const serve_chat_kind kinds[] = {CHAT_NONE,   CHAT_UNKNOWN, CHAT_CHATML, CHAT_ZEPHYR,
                                        CHAT_LLAMA2, CHAT_LLAMA3,  CHAT_LLAMA3, CHAT_LLAMA3};

/* Whether a 400's param is a field the request named, or one it must have named. */
static int param_named(const json_t *req, const json_t *param) {
    if (json_is_null(param)) return 1;
    if (!json_is_string(param)) return 0;
    const char *p = json_string_value(param);
    return !strcmp(p, "prompt") || !strcmp(p, "model") || !strcmp(p, "messages") ||
           (json_is_object(req) && json_object_get(req, p) != NULL);
}

/* Every line of a metrics reply: a comment of its two kinds or "name[{labels}] value". */
static void check_metrics(const serve_reply *r) {
    FUZZ_CHECK(r->status == 200 && r->content_type && r->body, "");
    for (const char *l = r->body; *l;) {
        const char *end = strchr(l, '\n');
        FUZZ_CHECK(end, l);
        if (*l == '#') {
            FUZZ_CHECK(!strncmp(l, "# HELP ", 7) || !strncmp(l, "# TYPE ", 7), l);
        } else {
            const char *sp = memchr(l, ' ', (size_t)(end - l));
            FUZZ_CHECK(sp && sp > l && *l >= 'a' && *l <= 'z', l);
            char *num_end;
            strtod(sp + 1, &num_end);
            FUZZ_CHECK(num_end == end, l);
        }
        l = end + 1;
    }
}

static void check_reply(const serve_reply *r, const char *body, size_t len, int post) {
    FUZZ_CHECK(r->status == 200 || r->status == 400 || r->status == 404 || r->status == 405,
               r->body ? r->body : "");
    FUZZ_CHECK(!r->stream, "a stream from an engine without a context");
    json_t *reply = json_loads(r->body ? r->body : "", 0, NULL);
    FUZZ_CHECK(json_is_object(reply), r->body ? r->body : "");
    json_t *req = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
    if (r->status == 400) {
        json_t *param = json_object_get(json_object_get(reply, "error"), "param");
        FUZZ_CHECK(param && param_named(req, param), r->body);
    }
    if (r->status == 200 && post) {
        FUZZ_CHECK(json_is_object(req), "accepted a body that is not a JSON object");
        FUZZ_CHECK(json_object_size(reply) == 0, r->body);
    }
    json_decref(req);
    json_decref(reply);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static serve_metrics *metrics;
    static const uint64_t kv[3] = {1 << 20, 0, 0};
    if (!metrics) metrics = serve_metrics_new(8, 2, 64, kv);
    if (size < 1) return 0;
    int image = data[0] & 1, route = data[0] >> 1 & 7, get = data[0] >> 4 & 1;
    serve_chat chat = {.kind = kinds[data[0] >> 5], .bos = "<s>", .eos = "</s>",
                       .note = "fuzz"};
    serve_engine e = {.model_id = image ? "micro-janus" : "micro-opt", .text = !image,
                      .per_image = image ? 64 : 16, .img_h = image ? 32 : 0,
                      .img_w = image ? 32 : 0, .eos = image ? -1 : 2, .max_n = 16,
                      .chat = &chat, .metrics = metrics};
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    serve_reply r = {0};
    const char *path = paths[route];
    serve_api_handle(&e, get ? "GET" : "POST", path, body, len, -1, &r);
    if (get && !strcmp(path, "/metrics")) check_metrics(&r);
    else check_reply(&r, body, len, !get && strcmp(path, "/v1/models") && strcmp(path, "/metrics"));
    free(r.body);
    return 0;
}
