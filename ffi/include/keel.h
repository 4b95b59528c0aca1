/*
 * keel.h: the C ABI of keel (the keel-ffi crate, linked as libkeel_ffi.a).
 *
 * Memory: keel allocates nothing and keeps no global state. The caller owns two buffers:
 *
 *   - the MODEL: the bytes of a GGUF file (read into memory, mapped, or in flash). keel
 *     reads the weights and the vocabulary in place; it never writes or copies them.
 *   - the ARENA: keel_plan_size() bytes of writable memory, any alignment. The session
 *     (the handle), the tokenizer's scratch, the KV cache, the activations and the logits
 *     all live inside it.
 *
 * Lifetimes: the model buffer and the arena must stay valid, and unmodified by the
 * caller, for as long as the handle is used. There is no destroy function: the session
 * holds nothing outside the two buffers, so freeing (or reusing) the arena ends it, and
 * the model may be freed after that. A handle is invalid once its arena is freed,
 * reused or passed to keel_session_init again; using it then is undefined behaviour
 * (keel recognises some stale handles and returns KEEL_ERR_BAD_HANDLE, but cannot
 * recognise all).
 *
 * Threads: a session is used by one thread at a time. Distinct sessions (distinct
 * arenas, possibly over the same model buffer) are independent.
 *
 * Errors: every function returns KEEL_OK (0) or a keel_status code; a null pointer, a
 * bad length, a corrupt model or a too-small arena is a code, never a crash. On an
 * error, out-parameters are left unchanged unless stated otherwise.
 *
 * Kernels: keel-core's portable scalar reference kernels (any CPU; the tokens are those
 * of `keel run --reference`).
 */
#ifndef KEEL_H
#define KEEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes: the return value of every function but keel_error_message. */
typedef enum keel_status {
    KEEL_OK = 0,
    KEEL_ERR_NULL_POINTER = 1,     /* a required pointer argument is null */
    KEEL_ERR_BAD_ARGUMENT = 2,     /* n_ctx or n_batch 0, no tokens, a misaligned buffer */
    KEEL_ERR_BAD_MODEL = 3,        /* not a GGUF file keel can run (corrupt, truncated, unsupported) */
    KEEL_ERR_ARENA_TOO_SMALL = 4,  /* arena_len < keel_plan_size() */
    KEEL_ERR_BAD_HANDLE = 5,       /* not a live session */
    KEEL_ERR_CONTEXT_FULL = 6,     /* the tokens do not fit in the context left */
    KEEL_ERR_BAD_TOKEN = 7,        /* a token id outside the vocabulary */
    KEEL_ERR_BUFFER_TOO_SMALL = 8, /* the output buffer is too small; the size needed is returned */
    KEEL_ERR_TEXT_TOO_LONG = 9,    /* text longer than KEEL_TEXT_BYTES_PER_CTX * n_ctx bytes */
    KEEL_ERR_INVALID_UTF8 = 10,    /* the text is not valid UTF-8 */
    KEEL_ERR_NO_LOGITS = 11,       /* keel_sample before any keel_eval since init or reset */
    KEEL_ERR_INTERNAL = 12         /* a bug in keel (caught; the session should be reset) */
} keel_status;

/* keel_tokenize accepts texts of up to KEEL_TEXT_BYTES_PER_CTX * n_ctx bytes. */
#define KEEL_TEXT_BYTES_PER_CTX 8

/* A session. Opaque; lives inside the caller's arena (see above). */
typedef struct keel_session keel_session;

/*
 * The arena bytes a session over this model needs for a context of n_ctx tokens,
 * evaluating at most n_batch tokens per forward pass (n_batch > n_ctx counts as n_ctx),
 * written to *out_size. The size holds for an arena at any address.
 * model: model_len bytes of a GGUF file, read during the call only.
 */
int keel_plan_size(const uint8_t *model, size_t model_len, uint32_t n_ctx, uint32_t n_batch, size_t *out_size);

/*
 * Builds a session in arena (arena_len bytes, at least keel_plan_size() for the same
 * model, n_ctx and n_batch) and writes its handle, a pointer into the arena, to
 * *out_handle (NULL on failure). temperature <= 0 samples greedily (the most likely
 * token, lowest id on ties); otherwise keel's default top-k/top-p/min-p with this seed.
 * model and arena must outlive the handle (see the top of this file).
 */
int keel_session_init(const uint8_t *model, size_t model_len, void *arena, size_t arena_len, uint32_t n_ctx, uint32_t n_batch, float temperature, uint64_t seed, keel_session **out_handle);

/*
 * Evaluates n >= 1 token ids, appending them to the context, and keeps the logits of
 * the last one for keel_sample. tokens is read during the call only.
 */
int keel_eval(keel_session *handle, const uint32_t *tokens, size_t n);

/* Chooses the next token from the last evaluation's logits; writes it to *out_token. */
int keel_sample(keel_session *handle, uint32_t *out_token);

/* Writes 1 to *out_is_eog if token ends generation (end of sequence/turn), else 0. */
int keel_token_is_eog(keel_session *handle, uint32_t token, int *out_is_eog);

/*
 * Tokenizes len bytes of UTF-8 text (no NUL needed) into out_tokens (cap ids), adding
 * BOS/EOS as the model says when add_bos is nonzero, and reading special-token texts
 * (such as "<|im_start|>") as their ids. *out_n gets the number of ids; on
 * KEEL_ERR_BUFFER_TOO_SMALL it gets the number needed.
 */
int keel_tokenize(keel_session *handle, const char *text, size_t len, int add_bos, uint32_t *out_tokens, size_t cap, size_t *out_n);

/*
 * Writes the bytes token stands for to buf (cap bytes; no NUL is added) and their count
 * to *out_len; on KEEL_ERR_BUFFER_TOO_SMALL *out_len gets the count needed. A piece can
 * be part of a UTF-8 character: concatenate pieces before treating them as text.
 */
int keel_token_to_text(keel_session *handle, uint32_t token, char *buf, size_t cap, size_t *out_len);

/* Starts a new sequence: empties the context and the sampler's history. */
int keel_reset(keel_session *handle);

/* A static NUL-terminated message for a status code (never NULL; never free it). */
const char *keel_error_message(int code);

#ifdef __cplusplus
}
#endif

#endif /* KEEL_H */
