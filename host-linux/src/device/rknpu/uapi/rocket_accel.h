/* SPDX-License-Identifier: MIT */
/*
 * The Linux "rocket" accel driver's user-space interface (RK3588 NPU), as keel uses it.
 *
 * This is keel's own transcription of the layout of Linux 6.18's
 * include/uapi/drm/rocket_accel.h (struct and field names, sizes, ioctl numbers), written
 * from the documented interface because no Debian release reachable through this
 * project's configured apt sources ships it yet (bookworm's linux-libc-dev is 6.1,
 * bookworm-backports' 6.12; the header arrives with 6.18). When a configured release
 * carries it, point tools/bindings-gen's "rocket" entry at that header: the generated
 * layout tests then prove the two agree. Nothing here has been checked on hardware.
 *
 * Plain typedefs instead of <linux/types.h> so the generator needs no kernel headers.
 */
#ifndef KEEL_ROCKET_ACCEL_H
#define KEEL_ROCKET_ACCEL_H

typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef long long __s64;

/* ioctl numbers, relative to DRM_COMMAND_BASE (0x40), type 'd'. */
#define DRM_ROCKET_CREATE_BO 0x00 /* _IOWR, struct drm_rocket_create_bo */
#define DRM_ROCKET_SUBMIT 0x01    /* _IOW,  struct drm_rocket_submit */
#define DRM_ROCKET_PREP_BO 0x02   /* _IOW,  struct drm_rocket_prep_bo */
#define DRM_ROCKET_FINI_BO 0x03   /* _IOW,  struct drm_rocket_fini_bo */

/* Creates a buffer object: the kernel fills handle, its NPU address and the mmap offset. */
struct drm_rocket_create_bo {
	__u32 size;        /* in: bytes */
	__u32 handle;      /* out */
	__u64 dma_address; /* out: the BO's address for the NPU (private to this fd) */
	__u64 offset;      /* out: pass to mmap() on the same fd */
};

/* Waits (until an absolute CLOCK_MONOTONIC timeout) for the device to finish writing the
 * BO and makes it coherent for the CPU. */
struct drm_rocket_prep_bo {
	__u32 handle;
	__u32 reserved; /* must be 0 */
	__s64 timeout_ns;
};

/* Hands the BO back to the device (ends the CPU's access). */
struct drm_rocket_fini_bo {
	__u32 handle;
	__u32 reserved; /* must be 0 */
};

/* One task: a register command stream. */
struct drm_rocket_task {
	__u32 regcmd;       /* NPU address of the stream */
	__u32 regcmd_count; /* 64-bit entries, tail included */
};

/* One job: tasks run in order on one core. */
struct drm_rocket_job {
	__u64 tasks;          /* pointer to struct drm_rocket_task[task_count] */
	__u64 in_bo_handles;  /* pointer to __u32[in_bo_handle_count] */
	__u64 out_bo_handles; /* pointer to __u32[out_bo_handle_count] */
	__u32 task_count;
	__u32 task_struct_size; /* sizeof(struct drm_rocket_task) */
	__u32 in_bo_handle_count;
	__u32 out_bo_handle_count;
};

struct drm_rocket_submit {
	__u64 jobs; /* pointer to struct drm_rocket_job[job_count] */
	__u32 job_count;
	__u32 job_struct_size; /* sizeof(struct drm_rocket_job) */
	__u64 reserved;        /* must be 0 */
};

#endif
