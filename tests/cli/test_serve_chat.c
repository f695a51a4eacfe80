/*
 * test_serve_chat.c - the chat templates of `flexdiag serve` (cli/serve_chat.c): each of the
 * four recognised templates (chatml in its two texts, zephyr, llama-2, llama-3) renders five
 * conversations exactly as Jinja2 3.1 renders its text under transformers' settings
 * (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, add_generation_prompt true,
 * bos_token "<s>", eos_token "</s>"; the expected strings were made that way), llama-2 refuses
 * roles that do not alternate; templates written with other whitespace inside their tags,
 * other quotes or escapes are recognised, other templates are not; tokenizer_config.json's
 * forms (a string, a list with "default", special tokens as strings or objects) and
 * chat_template.jinja load, and a folder without a template or with a broken file says so.
 */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include <cmocka.h>

#include "cli/serve.h"
#include "util.h"

static const char *const CHATML =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";
static const char *const CHATML_DEFINED =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}"
    "{% endif %}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";
static const char *const ZEPHYR =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
    "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ "
    "'<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == "
    "'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
    "{% endfor %}";
static const char *const LLAMA2 =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
    "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if "
    "(message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation "
    "roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 "
    "== 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] "
    "%}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + "
    "content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + "
    "content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";
static const char *const LLAMA3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

static void test_recognise(void **state) {
    (void)state;
    assert_int_equal(serve_chat_recognise(CHATML), CHAT_CHATML);
    assert_int_equal(serve_chat_recognise(CHATML_DEFINED), CHAT_CHATML);
    assert_int_equal(serve_chat_recognise(ZEPHYR), CHAT_ZEPHYR);
    assert_int_equal(serve_chat_recognise(LLAMA2), CHAT_LLAMA2);
    assert_int_equal(serve_chat_recognise(LLAMA3), CHAT_LLAMA3);
    /* the same templates written otherwise: spaces in tags, double quotes, \n escapes */
    assert_int_equal(serve_chat_recognise(
                         "{%for message in messages%}{{ \"<|im_start|>\" + message[\"role\"] + "
                         "\"\\n\" + message['content']   + '<|im_end|>' + '\\n' }}{%endfor%}{% "
                         "if add_generation_prompt %}{{'<|im_start|>assistant\\n'}}{% endif %}"),
                     CHAT_CHATML);
    assert_string_equal(serve_chat_name(CHAT_LLAMA3), "llama-3");
    assert_string_equal(serve_chat_name(CHAT_UNKNOWN), "unknown");
}

static void test_refuse(void **state) {
    (void)state;
    /* Qwen's ChatML with a default system prompt: another template */
    assert_int_equal(serve_chat_recognise(
                         "{% for message in messages %}{% if loop.first and messages[0]['role'] "
                         "!= 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant."
                         "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' "
                         "+ message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if "
                         "add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
                     CHAT_UNKNOWN);
    /* zephyr without the newlines between its tags renders differently: not recognised */
    assert_int_equal(serve_chat_recognise(
                         "{% for message in messages %}{% if message['role'] == 'user' %}{{ "
                         "'<|user|>\n' + message['content'] + eos_token }}{% elif "
                         "message['role'] == 'system' %}{{ '<|system|>\n' + message['content'] "
                         "+ eos_token }}{% elif message['role'] == 'assistant' %}{{ "
                         "'<|assistant|>\n'  + message['content'] + eos_token }}{% endif %}{% "
                         "if loop.last and add_generation_prompt %}{{ '<|assistant|>' }}{% "
                         "endif %}{% endfor %}"),
                     CHAT_UNKNOWN);
    /* an escape the canonical form does not decode (\x0a: a newline to Jinja) is kept as
     * written, so the template is refused rather than guessed the same */
    assert_int_equal(serve_chat_recognise(
                         "{% for message in messages %}{{'<|im_start|>' + message['role'] + "
                         "'\\x0a' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if "
                         "add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
                     CHAT_UNKNOWN);
    assert_int_equal(serve_chat_recognise("{% for message in messages"), CHAT_UNKNOWN);
    assert_int_equal(serve_chat_recognise("{{ 'unterminated }}"), CHAT_UNKNOWN);
    assert_int_equal(serve_chat_recognise(""), CHAT_UNKNOWN);
}

/* ---- rendering ---- */

static const serve_chat_msg M[] = {
    {"system", "  Be brief. "},
    {"user", "Hi there \n"},
    {"assistant", " Hello! "},
    {"user", "\u00e9t\u00e9\u3000"}, /* U+3000 is whitespace to Python's strip */
};

static const serve_chat_msg TWO_USERS[] = {{"user", "Hi there \n"}, {"user", "Hi there \n"}};

/* all four, without the system message, one turn, two user turns, the system message alone */
static const struct conversation {
    const serve_chat_msg *m;
    int n;
} conv[] = {{M, 4}, {M + 1, 3}, {M, 2}, {TWO_USERS, 2}, {M, 1}};

/* What Jinja2 rendered for each conversation of conv (NULL: the template raised). */
static const struct rendering {
    serve_chat_kind kind;
    const char *want[5];
} renderings[] = {
    {CHAT_CHATML,
     {"<|im_start|>system\n  Be brief. <|im_end|>\n<|im_start|>user\nHi there \n<|im_end|>\n"
      "<|im_start|>assistant\n Hello! <|im_end|>\n<|im_start|>user\n\u00e9t\u00e9\u3000"
      "<|im_end|>\n<|im_start|>assistant\n",
      "<|im_start|>user\nHi there \n<|im_end|>\n<|im_start|>assistant\n Hello! <|im_end|>\n"
      "<|im_start|>user\n\u00e9t\u00e9\u3000<|im_end|>\n<|im_start|>assistant\n",
      "<|im_start|>system\n  Be brief. <|im_end|>\n<|im_start|>user\nHi there \n<|im_end|>\n"
      "<|im_start|>assistant\n",
      "<|im_start|>user\nHi there \n<|im_end|>\n<|im_start|>user\nHi there \n<|im_end|>\n"
      "<|im_start|>assistant\n",
      "<|im_start|>system\n  Be brief. <|im_end|>\n<|im_start|>assistant\n"}},
    {CHAT_ZEPHYR,
     {"<|system|>\n  Be brief. </s>\n<|user|>\nHi there \n</s>\n<|assistant|>\n Hello! </s>\n"
      "<|user|>\n\u00e9t\u00e9\u3000</s>\n<|assistant|>\n",
      "<|user|>\nHi there \n</s>\n<|assistant|>\n Hello! </s>\n<|user|>\n\u00e9t\u00e9\u3000"
      "</s>\n<|assistant|>\n",
      "<|system|>\n  Be brief. </s>\n<|user|>\nHi there \n</s>\n<|assistant|>\n",
      "<|user|>\nHi there \n</s>\n<|user|>\nHi there \n</s>\n<|assistant|>\n",
      "<|system|>\n  Be brief. </s>\n<|assistant|>\n"}},
    {CHAT_LLAMA2,
     {"<s>[INST] <<SYS>>\n  Be brief. \n<</SYS>>\n\nHi there [/INST] Hello! </s><s>[INST] "
      "\u00e9t\u00e9 [/INST]",
      "<s>[INST] Hi there [/INST] Hello! </s><s>[INST] \u00e9t\u00e9 [/INST]",
      "<s>[INST] <<SYS>>\n  Be brief. \n<</SYS>>\n\nHi there [/INST]", NULL, ""}},
    {CHAT_LLAMA3,
     {"<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>"
      "user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
      "\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n\u00e9t\u00e9<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n",
      "<s><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>"
      "assistant<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id|>"
      "\n\n\u00e9t\u00e9<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
      "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>"
      "user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
      "\n\n",
      "<s><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>"
      "user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
      "\n\n",
      "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>"
      "assistant<|end_header_id|>\n\n"}},
};

static void test_render(void **state) {
    (void)state;
    for (size_t r = 0; r < sizeof renderings / sizeof renderings[0]; r++) {
        serve_chat c = {.kind = renderings[r].kind, .bos = "<s>", .eos = "</s>"};
        for (size_t k = 0; k < sizeof conv / sizeof conv[0]; k++) {
            char *text = NULL, err[256] = "";
            int rc = serve_chat_render(&c, conv[k].m, conv[k].n, &text, err, sizeof err);
            const char *want = renderings[r].want[k];
            if (!want) {
                assert_int_equal(rc, -1);
                assert_non_null(strstr(err, "Conversation roles must alternate"));
                assert_null(text);
                continue;
            }
            assert_int_equal(rc, 0);
            assert_string_equal(text, want);
            free(text);
        }
    }
}

static void test_render_unknown(void **state) {
    (void)state;
    serve_chat c = {.kind = CHAT_UNKNOWN, .bos = "", .eos = ""};
    char *text = NULL, err[256] = "";
    assert_int_equal(serve_chat_render(&c, M, 2, &text, err, sizeof err), -1);
    assert_null(text);
    assert_non_null(strstr(err, "no chat template"));
}

/* ---- loading ---- */

/* A model folder under tmp with tokenizer_config.json cfg (NULL: none) and chat_template.jinja
 * jinja (NULL: none); the folder's path (static). */
static const char *folder(const char *tmp, const char *name, json_t *cfg, const char *jinja) {
    static char dir[4096];
    char path[4200];
    snprintf(dir, sizeof dir, "%s/%s", tmp, name);
    assert_int_equal(mkdir(dir, 0755), 0);
    if (cfg) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        assert_int_equal(json_dump_file(cfg, path, 0), 0);
        json_decref(cfg);
    }
    if (jinja) {
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
        assert_int_equal(tu_write_file(path, jinja, strlen(jinja)), 0);
    }
    return dir;
}

static void expect(const char *dir, serve_chat_kind kind, const char *bos, const char *eos,
                   const char *note) {
    serve_chat c;
    serve_chat_load(dir, &c);
    assert_int_equal(c.kind, kind);
    assert_string_equal(c.bos, bos);
    assert_string_equal(c.eos, eos);
    assert_non_null(strstr(c.note, note));
    serve_chat_free(&c);
}

static void test_load(void **state) {
    (void)state;
    char *tmp = tu_tempdir("serve_chat");
    assert_non_null(tmp);
    expect(folder(tmp, "str", json_pack("{s:s, s:s, s:s}", "chat_template", LLAMA3, "bos_token",
                                        "<|begin_of_text|>", "eos_token", "<|eot_id|>"),
                  NULL),
           CHAT_LLAMA3, "<|begin_of_text|>", "<|eot_id|>", "tokenizer_config.json");
    expect(folder(tmp, "list",
                  json_pack("{s:[{s:s, s:s}, {s:s, s:s}], s:{s:s, s:b}, s:n}", "chat_template",
                            "name", "tool_use", "template", "{{ tools }}", "name", "default",
                            "template", ZEPHYR, "bos_token", "content", "<s>", "lstrip", 0,
                            "eos_token"),
                  NULL),
           CHAT_ZEPHYR, "<s>", "", "tokenizer_config.json");
    expect(folder(tmp, "jinja", json_pack("{s:s}", "eos_token", "</s>"), CHATML), CHAT_CHATML, "",
           "</s>", "chat_template.jinja");
    expect(folder(tmp, "other", json_pack("{s:s}", "chat_template", "{{ messages }}"), NULL),
           CHAT_UNKNOWN, "", "", "tokenizer_config.json");
    expect(folder(tmp, "odd", json_pack("{s:i}", "chat_template", 3), NULL), CHAT_UNKNOWN, "", "",
           "neither a string");
    expect(folder(tmp, "none", json_pack("{s:s}", "bos_token", "<s>"), NULL), CHAT_NONE, "<s>", "",
           "has no chat_template");
    expect(folder(tmp, "empty", NULL, NULL), CHAT_NONE, "", "", "tokenizer_config.json: ");
    const char *broken = folder(tmp, "broken", NULL, NULL), *text = "{\"chat_template\": ";
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", broken);
    assert_int_equal(tu_write_file(path, text, strlen(text)), 0);
    expect(broken, CHAT_NONE, "", "", "tokenizer_config.json: ");
    expect(NULL, CHAT_NONE, "", "", "builtin");
    tu_rmtree(tmp);
    free(tmp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recognise), cmocka_unit_test(test_refuse),
        cmocka_unit_test(test_render),    cmocka_unit_test(test_render_unknown),
        cmocka_unit_test(test_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
