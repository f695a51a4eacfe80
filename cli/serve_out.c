/*
 * serve_out.c - the pieces of `flexdiag serve`'s replies and events (serve_run.h): a JSON body,
 * an image's PNG in base64 (the bytes `flexdiag generate` writes), token arrays, a sequence's
 * text and finish reason, and a streamed sequence's text piece by piece.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/image_out.h"
#include "cli/serve_run.h"

void serve_reply_json(serve_reply *out, int status, json_t *j) {
    out->status = status;
    out->body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!out->body) {
        out->status = 500;
        out->body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                           "\"param\":null,\"code\":null}}");
    }
}

void serve_reply_id(char *buf, size_t cap, const char *prefix) {
    static atomic_uint count;
    snprintf(buf, cap, "%s-%lld-%u", prefix, (long long)time(NULL), atomic_fetch_add(&count, 1));
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Base64 of n bytes as a new JSON string (NULL: out of memory). */
static json_t *base64_json(const uint8_t *s, size_t n) {
    char *o = malloc((n + 2) / 3 * 4 + 1), *p = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) |
                     (i + 2 < n ? s[i + 2] : 0);
        *p++ = b64[v >> 18 & 63];
        *p++ = b64[v >> 12 & 63];
        *p++ = i + 1 < n ? b64[v >> 6 & 63] : '=';
        *p++ = i + 2 < n ? b64[v & 63] : '=';
    }
    json_t *j = json_stringn(o, (size_t)(p - o));
    free(o);
    return j;
}

json_t *serve_png_b64(const serve_engine *e, const int32_t *tokens) {
    size_t n = (size_t)e->img_h * (size_t)e->img_w * 3;
    float *px = malloc(n * sizeof *px);
    uint8_t *rgb = malloc(n), *png = NULL;
    size_t len = 0;
    json_t *j = NULL;
    if (px && rgb && flexdiag_decode_images(e->m, tokens, 1, px) == FLEXDIAG_OK) {
        flexdiag__pixels_to_u8(px, (int64_t)n, rgb);
        if (flexdiag__png_encode(rgb, e->img_w, e->img_h, &png, &len) == FLEXDIAG_OK)
            j = base64_json(png, len);
    }
    free(png);
    free(rgb);
    free(px);
    return j;
}

json_t *serve_ids_json(const int32_t *ids, int32_t n) {
    json_t *a = json_array();
    for (int32_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

char *serve_text(const serve_engine *e, const int32_t *ids, int32_t n) {
    size_t len = 0;
    if (flexdiag_detokenize(e->m, ids, n, true, NULL, 0, &len) != FLEXDIAG_OK) return strdup("");
    char *t = malloc(len + 1);
    if (t && flexdiag_detokenize(e->m, ids, n, true, t, len + 1, &len) != FLEXDIAG_OK) t[0] = 0;
    return t;
}

const char *serve_finish_reason(const serve_engine *e, const int32_t *ids, int32_t n) {
    return n > 0 && e->eos >= 0 && ids[n - 1] == e->eos ? "stop" : "length";
}

/* Whether text ends in U+FFFD (EF BF BD): the decoder's mark of a character cut short. */
static int ends_cut(const char *t, size_t n) {
    return n >= 3 && !memcmp(t + n - 3, "\xEF\xBF\xBD", 3);
}

char *serve_text_delta(const serve_engine *e, const int32_t *ids, int32_t n,
                       serve_text_cursor *c, int final) {
    char *before = serve_text(e, ids + c->prefix, c->read - c->prefix);
    char *now = serve_text(e, ids + c->prefix, n - c->prefix);
    char *d = NULL;
    if (before && now) {
        size_t lb = strlen(before), ln = strlen(now);
        if (ln > lb && (final || !ends_cut(now, ln))) {
            d = strdup(now + lb);
            c->prefix = c->read;
            c->read = n;
        } else {
            d = strdup("");
        }
    }
    free(before);
    free(now);
    return d;
}
