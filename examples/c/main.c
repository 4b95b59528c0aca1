/*
 * keel from C: load a GGUF file into memory, size and allocate the arena, tokenize a
 * prompt, generate greedily and print the text.
 *
 *   usage: keel-c MODEL.gguf PROMPT N_TOKENS [--ids]
 *
 * With --ids it prints the prompt's and the generated token ids (one line each,
 * space-separated) instead of the text, for comparison with `keel run --json`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel.h"
#include "read_file.h"

#define N_CTX 512
#define N_BATCH 64

static int fail(const char *what, int code) {
    fprintf(stderr, "keel-c: %s: %s (code %d)\n", what, keel_error_message(code), code);
    return 1;
}

/* Everything after the model and the arena exist; returns the exit status. */
static int generate(keel_session *s, const char *prompt, long n_predict, int ids) {
    uint32_t toks[N_CTX];
    size_t n_prompt = 0;
    int rc = keel_tokenize(s, prompt, strlen(prompt), 1, toks, N_CTX, &n_prompt);
    if (rc != KEEL_OK) return fail("tokenizing the prompt", rc);
    if (n_prompt == 0) {
        fprintf(stderr, "keel-c: the prompt is empty after tokenization\n");
        return 1;
    }
    if (ids) {
        for (size_t i = 0; i < n_prompt; i++) printf(i ? " %u" : "%u", toks[i]);
        printf("\n");
    }
    if ((rc = keel_eval(s, toks, n_prompt)) != KEEL_OK) return fail("evaluating the prompt", rc);
    char piece[256];
    for (long i = 0; i < n_predict; i++) {
        uint32_t t;
        int eog = 0;
        size_t len = 0;
        if ((rc = keel_sample(s, &t)) != KEEL_OK) return fail("sampling", rc);
        if ((rc = keel_token_is_eog(s, t, &eog)) != KEEL_OK) return fail("checking for end of generation", rc);
        if (eog) break;
        if (ids) {
            printf(i ? " %u" : "%u", t);
        } else if ((rc = keel_token_to_text(s, t, piece, sizeof piece, &len)) == KEEL_OK) {
            fwrite(piece, 1, len, stdout);
        } else {
            return fail("detokenizing", rc);
        }
        if (i + 1 < n_predict && (rc = keel_eval(s, &t, 1)) != KEEL_OK) {
            if (rc == KEEL_ERR_CONTEXT_FULL) break;
            return fail("evaluating a generated token", rc);
        }
    }
    printf("\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5 || (argc == 5 && strcmp(argv[4], "--ids") != 0)) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT N_TOKENS [--ids]\n", argv[0]);
        return 2;
    }
    char *end;
    long n_predict = strtol(argv[3], &end, 10);
    if (*end != '\0' || n_predict < 0) {
        fprintf(stderr, "keel-c: N_TOKENS must be a number >= 0, not %s\n", argv[3]);
        return 2;
    }
    size_t model_len = 0;
    uint8_t *model = read_file(argv[1], &model_len);
    if (!model) {
        perror(argv[1]);
        return 1;
    }
    size_t arena_len = 0;
    int rc = keel_plan_size(model, model_len, N_CTX, N_BATCH, &arena_len);
    if (rc != KEEL_OK) {
        free(model);
        return fail("sizing the arena", rc);
    }
    void *arena = malloc(arena_len);
    if (!arena) {
        fprintf(stderr, "keel-c: cannot allocate the %zu byte arena\n", arena_len);
        free(model);
        return 1;
    }
    keel_session *s = NULL;
    rc = keel_session_init(model, model_len, arena, arena_len, N_CTX, N_BATCH, 0.0f, 0, &s);
    int status = rc == KEEL_OK ? generate(s, argv[2], n_predict, argc == 5) : fail("loading the model", rc);
    /* The session lives in the arena: freeing the arena ends it; then the model may go. */
    free(arena);
    free(model);
    return status;
}
