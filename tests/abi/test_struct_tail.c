/*
 * test_struct_tail.c - the struct_size rule of docs/abi.md for every public params struct, as an
 * embedding program sees it (<flexdiag.h>, the shared library): a struct 16 bytes longer than
 * this library's (a program built against a newer flexdiag.h) is taken when the 16 bytes are
 * zero and does what the same struct at its own size does; a non-zero byte there is refused
 * naming the struct and the byte's offset; struct_size 3 (below every first version) is
 * refused with the _init() hint. flexdiag_policy_params is not here: it lives inside
 * flexdiag_context_params by value, so its size is fixed (docs/abi.md).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "flexdiag.h"

#define TAIL 16  /* bytes a newer header appended */
#define SET_AT 5 /* the tail byte a newer program set */

/* What every call below runs on: a CPU runtime with a budget (so context_max_images has one
 * to fill), the micro-janus builtin, a context of 2 images, one prompt's request. */
typedef struct env {
    flexdiag_runtime *rt;
    flexdiag_model *m;
    flexdiag_context *c;
    flexdiag_request rq;
    int32_t want[64]; /* the request's image at the request's own size */
} env;

/* One entry point taking the params struct p; returns its status and undoes what it made. */
typedef flexdiag_status (*call_fn)(env *e, const void *p);

static void runtime_params(flexdiag_runtime_params *rp) {
    flexdiag_runtime_params_init(rp);
    rp->device = -1;
    rp->threads = 1;
    rp->gpu_mem = 64ull << 20;
}

static void model_params(flexdiag_model_params *mp) {
    flexdiag_model_params_init(mp);
    mp->arch = "micro-janus";
}

static void context_params(flexdiag_context_params *cp) {
    flexdiag_context_params_init(cp);
    cp->max_images = 2;
    cp->max_prompt_len = 32;
}

static flexdiag_status generate(env *e, const flexdiag_request *rq, int32_t *tokens) {
    flexdiag_output out = {.tokens = tokens};
    return flexdiag_generate(e->c, rq, &out);
}

static int setup(void **state) {
    static env e;
    *state = &e;
    flexdiag_runtime_params rp;
    runtime_params(&rp);
    flexdiag_model_params mp;
    model_params(&mp);
    flexdiag_context_params cp;
    context_params(&cp);
    if (flexdiag_runtime_create(&rp, &e.rt) || flexdiag_model_load(e.rt, NULL, &mp, &e.m) ||
        flexdiag_context_create(e.m, &cp, &e.c))
        return -1;
    flexdiag_request_init(&e.rq);
    e.rq.n_prompts = 1;
    static const char *const prompts[] = {"a red apple"};
    e.rq.prompts = prompts;
    e.rq.seed = 7;
    return generate(&e, &e.rq, e.want) == FLEXDIAG_OK ? 0 : -1;
}

static int teardown(void **state) {
    env *e = *state;
    flexdiag_context_destroy(e->c);
    flexdiag_model_destroy(e->m);
    flexdiag_runtime_destroy(e->rt);
    return 0;
}

/* The three cases for a struct of `size` bytes whose filled-in value is `init`. */
static void check_tail(env *e, const void *init, size_t size, const char *name, call_fn call) {
    _Alignas(16) unsigned char buf[512 + TAIL] = {0};
    assert_true(size + TAIL <= sizeof buf);
    memcpy(buf, init, size);
    uint32_t n = (uint32_t)(size + TAIL);
    memcpy(buf, &n, sizeof n);
    assert_int_equal(call(e, buf), FLEXDIAG_OK); /* a zero tail: taken */

    buf[size + SET_AT] = 0x40;
    assert_int_equal(call(e, buf), FLEXDIAG_ERR_INVALID_ARG);
    char at[64];
    snprintf(at, sizeof at, "byte %zu is not zero", size + SET_AT);
    const char *msg = flexdiag_last_error(NULL);
    assert_non_null(strstr(msg, name));
    assert_non_null(strstr(msg, at));
    assert_non_null(strstr(msg, "newer flexdiag.h"));

    n = 3;
    memcpy(buf, &n, sizeof n);
    assert_int_equal(call(e, buf), FLEXDIAG_ERR_INVALID_ARG);
    char hint[96];
    snprintf(hint, sizeof hint, "%s_init() first", name);
    assert_non_null(strstr(flexdiag_last_error(NULL), hint));
}

/* ---- the entry points ---- */

static flexdiag_status runtime_create(env *e, const void *p) {
    (void)e;
    flexdiag_runtime *rt = NULL;
    flexdiag_status st = flexdiag_runtime_create(p, &rt);
    flexdiag_runtime_destroy(rt);
    return st;
}

static flexdiag_status model_load(env *e, const void *p) {
    flexdiag_model *m = NULL;
    flexdiag_status st = flexdiag_model_load(e->rt, NULL, p, &m);
    flexdiag_model_destroy(m);
    return st;
}

static flexdiag_status context_create(env *e, const void *p) {
    flexdiag_context *c = NULL;
    flexdiag_status st = flexdiag_context_create(e->m, p, &c);
    flexdiag_context_destroy(c);
    return st;
}

static flexdiag_status context_max_images(env *e, const void *p) {
    int32_t n = 0;
    flexdiag_status st = flexdiag_context_max_images(e->m, p, &n);
    if (st == FLEXDIAG_OK) assert_true(n >= 1);
    return st;
}

/* The longer request draws the same image as the request at its own size. */
static flexdiag_status generate_longer(env *e, const void *p) {
    int32_t got[64] = {0};
    flexdiag_status st = generate(e, p, got);
    if (st == FLEXDIAG_OK) assert_memory_equal(got, e->want, sizeof got);
    return st;
}

static flexdiag_status submit_request(env *e, const void *p) {
    flexdiag_handle *h = NULL;
    flexdiag_status st = flexdiag_submit(e->c, p, NULL, &h);
    if (st != FLEXDIAG_OK) return st;
    assert_int_equal(flexdiag_handle_wait(h, -1), FLEXDIAG_OK);
    flexdiag_status done = FLEXDIAG_ERR_INTERNAL;
    assert_int_equal(flexdiag_handle_status(h, &done, NULL), FLEXDIAG_OK);
    flexdiag_handle_release(h);
    return done;
}

static flexdiag_status submit_params(env *e, const void *p) {
    flexdiag_handle *h = NULL;
    flexdiag_status st = flexdiag_submit(e->c, &e->rq, p, &h);
    if (st != FLEXDIAG_OK) return st;
    assert_int_equal(flexdiag_handle_wait(h, -1), FLEXDIAG_OK);
    int32_t got[64] = {0};
    flexdiag_output out = {.tokens = got};
    assert_int_equal(flexdiag_handle_tokens(h, &out), FLEXDIAG_OK);
    assert_memory_equal(got, e->want, sizeof got);
    flexdiag_handle_release(h);
    return FLEXDIAG_OK;
}

static flexdiag_status score(env *e, const void *p) {
    flexdiag_score_output so = {.struct_size = sizeof so}; /* no buffers: the size query */
    flexdiag_status st = flexdiag_score(e->c, p, &so);
    if (st == FLEXDIAG_OK) assert_int_equal(so.rows, 2);
    return st;
}

/* ---- one test per struct ---- */

static void test_runtime_params(void **state) {
    flexdiag_runtime_params rp;
    runtime_params(&rp);
    check_tail(*state, &rp, sizeof rp, "flexdiag_runtime_params", runtime_create);
}

static void test_model_params(void **state) {
    flexdiag_model_params mp;
    model_params(&mp);
    check_tail(*state, &mp, sizeof mp, "flexdiag_model_params", model_load);
}

static void test_context_params(void **state) {
    flexdiag_context_params cp;
    context_params(&cp);
    check_tail(*state, &cp, sizeof cp, "flexdiag_context_params", context_create);
    check_tail(*state, &cp, sizeof cp, "flexdiag_context_params", context_max_images);
}

static void test_request(void **state) {
    env *e = *state;
    check_tail(e, &e->rq, sizeof e->rq, "flexdiag_request", generate_longer);
    check_tail(e, &e->rq, sizeof e->rq, "flexdiag_request", submit_request);
}

static void test_submit_params(void **state) {
    flexdiag_submit_params sp;
    flexdiag_submit_params_init(&sp);
    check_tail(*state, &sp, sizeof sp, "flexdiag_submit_params", submit_params);
}

static void test_score_request(void **state) {
    env *e = *state;
    static const int32_t prompt[] = {256, 97, 261}, ids[] = {1, 2, 3};
    flexdiag_score_request sr;
    flexdiag_score_request_init(&sr);
    sr.prompt_ids = prompt;
    sr.prompt_len = 3;
    sr.ids = ids;
    sr.n = 3;
    check_tail(e, &sr, sizeof sr, "flexdiag_score_request", score);
}

/* _init() writes exactly the caller's size: its first version's (an old program) leaves the
 * bytes after it alone; 16 bytes past ours come back zero and are taken by `call`. */
#define CHECK_INIT_SIZE(type, init, first)                                                          \
    do {                                                                                           \
        _Alignas(16) unsigned char buf_[sizeof(type) + TAIL];                                      \
        memset(buf_, 0xa5, sizeof buf_);                                                           \
        init((type *)buf_, first);                                                                 \
        uint32_t n_;                                                                               \
        memcpy(&n_, buf_, sizeof n_);                                                              \
        assert_int_equal(n_, first);                                                               \
        for (size_t i_ = first; i_ < sizeof buf_; i_++) assert_int_equal(buf_[i_], 0xa5);         \
        init((type *)buf_, sizeof buf_);                                                           \
        for (size_t i_ = sizeof(type); i_ < sizeof buf_; i_++) assert_int_equal(buf_[i_], 0);     \
        assert_int_equal(call(*state, buf_), FLEXDIAG_OK);                                         \
    } while (0)

/* A request _init() filled at 16 bytes past ours, given the setup's prompt and seed: it draws
 * the setup's image. */
static flexdiag_status request_filled(env *e, const void *p) {
    _Alignas(16) unsigned char b[sizeof(flexdiag_request) + TAIL];
    memcpy(b, p, sizeof b);
    flexdiag_request *r = (flexdiag_request *)b;
    r->n_prompts = 1;
    r->prompts = e->rq.prompts;
    r->seed = e->rq.seed;
    return generate_longer(e, b);
}

static void test_init_size(void **state) {
    call_fn call = runtime_create;
    CHECK_INIT_SIZE(flexdiag_runtime_params, flexdiag_runtime_params_init_size, 20);
    call = model_load;
    CHECK_INIT_SIZE(flexdiag_model_params, flexdiag_model_params_init_size, 32);
    call = context_create;
    CHECK_INIT_SIZE(flexdiag_context_params, flexdiag_context_params_init_size, 64);
    call = request_filled;
    CHECK_INIT_SIZE(flexdiag_request, flexdiag_request_init_size, 72);
    call = submit_params;
    CHECK_INIT_SIZE(flexdiag_submit_params, flexdiag_submit_params_init_size, 56);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_init_size),
                                       cmocka_unit_test(test_runtime_params),
                                       cmocka_unit_test(test_model_params),
                                       cmocka_unit_test(test_context_params),
                                       cmocka_unit_test(test_request),
                                       cmocka_unit_test(test_submit_params),
                                       cmocka_unit_test(test_score_request)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
