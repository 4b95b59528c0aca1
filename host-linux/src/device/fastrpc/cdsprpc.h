/*
 * The part of libcdsprpc's public API keel's `hexagon` device uses (FastRPC remote
 * handles, session and handle control, rpcmem, fastrpc_mmap, dspqueue), written for
 * keel from the documented interface (../shared/reference/hexagon.md). keel never
 * links against the library: it dlopens it and resolves each symbol by name, so each
 * function is declared as a pointer type, `keel_<name>_fn`, and bindgen
 * (tools/bindings-gen) turns this file into host-linux/src/device/fastrpc/sys.rs.
 */
#ifndef KEEL_CDSPRPC_H
#define KEEL_CDSPRPC_H

#include <stddef.h>
#include <stdint.h>

/* Error codes (AEEStdErr) keel names in its messages; the last is what users of v68
   boards report when the unsigned PD or the capability query is refused. */
#define AEE_SUCCESS 0u
#define AEE_EFAILED 0x01u
#define AEE_ENOMEMORY 0x02u
#define AEE_EEXPIRED 0x0Cu
#define AEE_EBADSTATE 0x0Du
#define AEE_EBADPARM 0x0Eu
#define AEE_EUNSUPPORTED 0x14u
#define AEE_ENOTALLOWED 0x2Bu
#define AEE_EINVALIDFD 0x3Au
#define AEE_ENOSUCHMOD 0x3Eu
#define AEE_ENOSUCHMAP 0x48u
#define AEE_ECONNREFUSED 0x72u
#define AEE_ECONNRESET 104u
#define AEE_ERPC 0x200u
#define AEE_EWOULDBLOCK 516u
#define AEE_EUNSIGNEDPD_REFUSED 0x80000600u

/* FastRPC domains. */
#define ADSP_DOMAIN_ID 0u
#define MDSP_DOMAIN_ID 1u
#define SDSP_DOMAIN_ID 2u
#define CDSP_DOMAIN_ID 3u
#define CDSP1_DOMAIN_ID 4u

/* remote_session_control request ids. */
#define FASTRPC_THREAD_PARAMS 1u
#define DSPRPC_CONTROL_UNSIGNED_MODULE 2u
#define FASTRPC_RELATIVE_THREAD_PRIORITY 4u
#define FASTRPC_REMOTE_PROCESS_KILL 6u
#define FASTRPC_SESSION_CLOSE 7u
#define FASTRPC_PD_INITMEM_SIZE 12u
#define FASTRPC_RESERVE_NEW_SESSION 13u
#define FASTRPC_GET_EFFECTIVE_DOMAIN_ID 14u
#define FASTRPC_GET_URI 15u

/* remote_handle_control / remote_handle64_control request ids. */
#define DSPRPC_CONTROL_LATENCY 1u
#define DSPRPC_GET_DSP_INFO 2u
#define DSPRPC_CONTROL_WAKELOCK 3u

/* DSPRPC_GET_DSP_INFO attributes. */
#define DOMAIN_SUPPORT 0u
#define UNSIGNED_PD_SUPPORT 1u
#define HVX_SUPPORT_64B 2u
#define HVX_SUPPORT_128B 3u
#define VTCM_PAGE 4u
#define VTCM_COUNT 5u
#define ARCH_VER 6u
#define HMX_SUPPORT_DEPTH 7u
#define HMX_SUPPORT_SPATIAL 8u

/* DSPRPC_CONTROL_LATENCY `enable` values. */
#define RPC_DISABLE_QOS 0u
#define RPC_PM_QOS 1u
#define RPC_ADAPTIVE_QOS 2u
#define RPC_POLL_QOS 3u

/* fastrpc_mmap flags. */
#define FASTRPC_MAP_STATIC 0u
#define FASTRPC_MAP_FD 2u
#define FASTRPC_MAP_FD_DELAYED 3u
#define FASTRPC_MAP_FD_NOMAP 16u

/* rpcmem heaps and flags. */
#define RPCMEM_HEAP_ID_SYSTEM 25u
#define RPCMEM_DEFAULT_FLAGS 1u

/* dspqueue buffer flags. */
#define DSPQUEUE_BUFFER_FLAG_REF 0x4u
#define DSPQUEUE_BUFFER_FLAG_DEREF 0x8u
#define DSPQUEUE_BUFFER_FLAG_FLUSH_SENDER 0x10u
#define DSPQUEUE_BUFFER_FLAG_INVALIDATE_SENDER 0x20u
#define DSPQUEUE_BUFFER_FLAG_FLUSH_RECIPIENT 0x40u
#define DSPQUEUE_BUFFER_FLAG_INVALIDATE_RECIPIENT 0x80u

/* "Wait forever" for dspqueue timeouts. */
#define DSPQUEUE_TIMEOUT_NONE 0xffffffffu

struct remote_rpc_control_unsigned_module { int domain; int enable; };
struct remote_rpc_control_latency { uint32_t enable; uint32_t latency; };
struct remote_dsp_capability { uint32_t domain; uint32_t attribute_ID; uint32_t capability; };

struct dspqueue_buffer {
    uint32_t fd;
    uint32_t size;
    uint32_t offset;
    uint32_t flags;
    union { void *ptr; uint64_t address; };
};

typedef struct { void *pv; size_t nLen; } remote_buf;
typedef struct { int32_t fd; uint32_t offset; } remote_dma_handle;
typedef union { remote_buf buf; uint32_t h; uint64_t h64; remote_dma_handle dma; } remote_arg;

/* remote_handle64_invoke's `scalars`: method << 24 | in-buffers << 16 | out-buffers << 8. */
#define REMOTE_SCALARS_METHOD_SHIFT 24u
#define REMOTE_SCALARS_INBUFS_SHIFT 16u
#define REMOTE_SCALARS_OUTBUFS_SHIFT 8u

typedef void *dspqueue_t;
typedef uint64_t remote_handle64;
typedef void (*dspqueue_callback_t)(dspqueue_t queue, int error, void *context);

/* Sessions and handles. */
typedef int (*keel_remote_session_control_fn)(uint32_t req, void *data, uint32_t datalen);
typedef int (*keel_remote_handle_control_fn)(uint32_t req, void *data, uint32_t datalen);
typedef int (*keel_remote_handle64_open_fn)(const char *uri, remote_handle64 *h);
typedef int (*keel_remote_handle64_invoke_fn)(remote_handle64 h, uint32_t scalars, remote_arg *args);
typedef int (*keel_remote_handle64_close_fn)(remote_handle64 h);
typedef int (*keel_remote_handle64_control_fn)(remote_handle64 h, uint32_t req, void *data, uint32_t datalen);

/* Shared memory. */
typedef void (*keel_rpcmem_init_fn)(void);
typedef void (*keel_rpcmem_deinit_fn)(void);
typedef void *(*keel_rpcmem_alloc_fn)(int heapid, uint32_t flags, int size);
typedef void *(*keel_rpcmem_alloc2_fn)(int heapid, uint32_t flags, size_t size);
typedef void (*keel_rpcmem_free_fn)(void *po);
typedef int (*keel_rpcmem_to_fd_fn)(void *po);
typedef int (*keel_fastrpc_mmap_fn)(int domain, int fd, void *addr, int offset, size_t length, int flags);
typedef int (*keel_fastrpc_munmap_fn)(int domain, int fd, void *addr, size_t length);

/* Queues. */
typedef int (*keel_dspqueue_create_fn)(int domain, uint32_t flags, uint32_t req_queue_size, uint32_t resp_queue_size,
                                       dspqueue_callback_t packet_callback, dspqueue_callback_t error_callback,
                                       void *callback_context, dspqueue_t *queue);
typedef int (*keel_dspqueue_close_fn)(dspqueue_t queue);
typedef int (*keel_dspqueue_export_fn)(dspqueue_t queue, uint64_t *queue_id);
typedef int (*keel_dspqueue_write_fn)(dspqueue_t queue, uint32_t flags, uint32_t num_buffers, struct dspqueue_buffer *buffers,
                                      uint32_t message_length, const uint8_t *message, uint32_t timeout_us);
typedef int (*keel_dspqueue_read_fn)(dspqueue_t queue, uint32_t *flags, uint32_t max_buffers, uint32_t *num_buffers,
                                     struct dspqueue_buffer *buffers, uint32_t max_message_length, uint32_t *message_length,
                                     uint8_t *message, uint32_t timeout_us);

#endif
