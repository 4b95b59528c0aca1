/*
 * The C ABI's refusals: null pointers, a too-small arena, corrupt model bytes, bad
 * lengths, tokens and handles each return their status code (and nothing crashes; run
 * under valgrind by tests/c_abi.sh).
 *
 *   usage: bad-args MODEL.gguf
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel.h"
#include "read_file.h"

static int failures = 0;

static void expect(const char *what, int got, int want) {
    if (got != want) {
        fprintf(stderr, "FAIL %s: got %d (%s), want %d (%s)\n", what, got, keel_error_message(got), want, keel_error_message(want));
        failures++;
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    size_t len = 0;
    uint8_t *model = read_file(argv[1], &len);
    if (!model) {
        perror(argv[1]);
        return 1;
    }
    size_t need = 0, n = 0;
    keel_session *s = NULL;
    uint32_t tok = 0, toks[64];
    char buf[64];
    int eog = 0;

    /* keel_plan_size */
    expect("plan: null model", keel_plan_size(NULL, len, 64, 16, &need), KEEL_ERR_NULL_POINTER);
    expect("plan: null out_size", keel_plan_size(model, len, 64, 16, NULL), KEEL_ERR_NULL_POINTER);
    expect("plan: n_ctx 0", keel_plan_size(model, len, 0, 16, &need), KEEL_ERR_BAD_ARGUMENT);
    expect("plan: n_batch 0", keel_plan_size(model, len, 64, 0, &need), KEEL_ERR_BAD_ARGUMENT);
    expect("plan: truncated model", keel_plan_size(model, len / 2, 64, 16, &need), KEEL_ERR_BAD_MODEL);
    expect("plan: empty model", keel_plan_size(model, 0, 64, 16, &need), KEEL_ERR_BAD_MODEL);
    expect("plan", keel_plan_size(model, len, 64, 16, &need), KEEL_OK);
    if (need == 0) {
        fprintf(stderr, "FAIL plan: zero bytes\n");
        return 1;
    }

    /* Corrupt model bytes: a broken magic, then garbage in the header. */
    uint8_t *bad = malloc(len);
    memcpy(bad, model, len);
    bad[0] ^= 0xff;
    expect("plan: bad magic", keel_plan_size(bad, len, 64, 16, &n), KEEL_ERR_BAD_MODEL);
    memcpy(bad, model, len);
    memset(bad + 8, 0xff, 16); /* tensor and key counts */
    expect("plan: absurd counts", keel_plan_size(bad, len, 64, 16, &n), KEEL_ERR_BAD_MODEL);

    /* keel_session_init */
    uint8_t *arena = malloc(need + 1);
    expect("init: null out_handle", keel_session_init(model, len, arena, need, 64, 16, 0, 0, NULL), KEEL_ERR_NULL_POINTER);
    expect("init: null arena", keel_session_init(model, len, NULL, need, 64, 16, 0, 0, &s), KEEL_ERR_NULL_POINTER);
    expect("init: null model", keel_session_init(NULL, len, arena, need, 64, 16, 0, 0, &s), KEEL_ERR_NULL_POINTER);
    /* keel_plan_size allows for any alignment of the arena, so only a shortfall larger
     * than that slack is certain to be refused whatever address malloc gave. */
    expect("init: arena half the plan", keel_session_init(model, len, arena, need / 2, 64, 16, 0, 0, &s), KEEL_ERR_ARENA_TOO_SMALL);
    expect("init: empty arena", keel_session_init(model, len, arena, 0, 64, 16, 0, 0, &s), KEEL_ERR_ARENA_TOO_SMALL);
    if (s != NULL) fprintf(stderr, "FAIL init: a failed init left a handle\n"), failures++;
    expect("init: corrupt model", keel_session_init(bad, len, arena, need, 64, 16, 0, 0, &s), KEEL_ERR_BAD_MODEL);
    expect("init: n_ctx 0", keel_session_init(model, len, arena, need, 0, 16, 0, 0, &s), KEEL_ERR_BAD_ARGUMENT);
    /* The plan holds for any start address: an odd one too. */
    expect("init: odd arena address", keel_session_init(model, len, arena + 1, need, 64, 16, 0, 0, &s), KEEL_OK);

    /* A live session's refusals. */
    expect("sample before eval", keel_sample(s, &tok), KEEL_ERR_NO_LOGITS);
    expect("eval: null tokens", keel_eval(s, NULL, 1), KEEL_ERR_NULL_POINTER);
    expect("eval: zero tokens", keel_eval(s, toks, 0), KEEL_ERR_BAD_ARGUMENT);
    toks[0] = 0xffffffffu;
    expect("eval: token outside the vocabulary", keel_eval(s, toks, 1), KEEL_ERR_BAD_TOKEN);
    expect("eval: null handle", keel_eval(NULL, toks, 1), KEEL_ERR_NULL_POINTER);
    expect("tokenize: null text", keel_tokenize(s, NULL, 3, 1, toks, 64, &n), KEEL_ERR_NULL_POINTER);
    expect("tokenize: null out", keel_tokenize(s, "abc", 3, 1, NULL, 64, &n), KEEL_ERR_NULL_POINTER);
    expect("tokenize: null out_n", keel_tokenize(s, "abc", 3, 1, toks, 64, NULL), KEEL_ERR_NULL_POINTER);
    expect("tokenize: invalid UTF-8", keel_tokenize(s, "a\xff", 2, 1, toks, 64, &n), KEEL_ERR_INVALID_UTF8);
    char *long_text = malloc(64 * KEEL_TEXT_BYTES_PER_CTX + 1);
    memset(long_text, 'a', 64 * KEEL_TEXT_BYTES_PER_CTX + 1);
    expect("tokenize: text too long", keel_tokenize(s, long_text, 64 * KEEL_TEXT_BYTES_PER_CTX + 1, 1, toks, 64, &n), KEEL_ERR_TEXT_TOO_LONG);
    free(long_text);
    n = 0;
    expect("tokenize: one-id buffer", keel_tokenize(s, "hello world again", 17, 1, toks, 1, &n), KEEL_ERR_BUFFER_TOO_SMALL);
    if (n < 2) fprintf(stderr, "FAIL tokenize: needed count %zu\n", n), failures++;
    expect("tokenize", keel_tokenize(s, "hello world", 11, 1, toks, 64, &n), KEEL_OK);
    expect("to_text: null buf", keel_token_to_text(s, toks[0], NULL, 8, &n), KEEL_ERR_NULL_POINTER);
    expect("to_text: bad token", keel_token_to_text(s, 0xffffffffu, buf, sizeof buf, &n), KEEL_ERR_BAD_TOKEN);
    expect("to_text: zero-byte buffer", keel_token_to_text(s, toks[n - 1], buf, 0, &n), KEEL_ERR_BUFFER_TOO_SMALL);
    expect("is_eog: null out", keel_token_is_eog(s, 0, NULL), KEEL_ERR_NULL_POINTER);
    expect("is_eog: bad token", keel_token_is_eog(s, 0xffffffffu, &eog), KEEL_ERR_BAD_TOKEN);
    expect("sample: null out", keel_sample(s, NULL), KEEL_ERR_NULL_POINTER);
    expect("reset: null handle", keel_reset(NULL), KEEL_ERR_NULL_POINTER);

    /* Filling the context: 64 positions, then one more is refused. */
    memset(toks, 0, sizeof toks);
    expect("eval: a full context", keel_eval(s, toks, 64), KEEL_OK);
    expect("eval: past the context", keel_eval(s, toks, 1), KEEL_ERR_CONTEXT_FULL);
    expect("sample", keel_sample(s, &tok), KEEL_OK);
    expect("reset", keel_reset(s), KEEL_OK);
    expect("sample after reset", keel_sample(s, &tok), KEEL_ERR_NO_LOGITS);

    /* Handles that are not sessions. */
    uint64_t junk[64] = {0};
    expect("a zeroed buffer as handle", keel_reset((keel_session *)junk), KEEL_ERR_BAD_HANDLE);
    expect("a misaligned handle", keel_reset((keel_session *)((char *)junk + 1)), KEEL_ERR_BAD_HANDLE);
    memset(arena, 0, need + 1); /* reusing the arena ends the session */
    expect("a handle whose arena was reused", keel_reset(s), KEEL_ERR_BAD_HANDLE);

    if (strcmp(keel_error_message(-1), "unknown keel error code") != 0) fprintf(stderr, "FAIL message of an unknown code\n"), failures++;

    free(arena);
    free(bad);
    free(model);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("bad-args: all checks passed\n");
    return 0;
}
