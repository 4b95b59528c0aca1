//! The memory functions the compiler calls (`memcpy`, `memmove`, `memset`, `memcmp`,
//! `bcmp`), which libc would otherwise provide. The crate is `#![no_builtins]`, so these
//! loops are not themselves turned back into calls to these functions.

/// Copies `n` bytes from `src` to `dst` (the regions do not overlap).
///
/// # Safety
/// `dst` and `src` are valid for `n` bytes and do not overlap.
#[no_mangle]
pub unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller's contract; the regions do not overlap, so forward is correct.
    unsafe { copy_forward(dst, src, n) };
    dst
}

/// Copies `n` bytes from `src` to `dst` (the regions may overlap).
///
/// # Safety
/// `dst` and `src` are valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize) <= (src as usize) || (dst as usize) >= (src as usize).wrapping_add(n) {
        // SAFETY: the caller's contract; dst starts before src or past its end, so a
        // forward copy reads every byte before overwriting it.
        unsafe { copy_forward(dst, src, n) };
    } else {
        let mut i = n;
        while i > 0 {
            i -= 1;
            // SAFETY: i < n; dst is after src, so a backward copy reads each byte first.
            unsafe { *dst.add(i) = *src.add(i) };
        }
    }
    dst
}

/// # Safety
/// `dst` and `src` are valid for `n` bytes; `dst` does not overlap `src` after it.
unsafe fn copy_forward(dst: *mut u8, src: *const u8, n: usize) {
    let mut i = 0;
    while i < n {
        // SAFETY: i < n (the caller's contract).
        unsafe { *dst.add(i) = *src.add(i) };
        i += 1;
    }
}

/// Sets `n` bytes at `dst` to `c`.
///
/// # Safety
/// `dst` is valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    let mut i = 0;
    while i < n {
        // SAFETY: i < n (the caller's contract).
        unsafe { *dst.add(i) = c as u8 };
        i += 1;
    }
    dst
}

/// Compares `n` bytes: negative, zero or positive as `a` sorts before, equal to or after `b`.
///
/// # Safety
/// `a` and `b` are valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i < n {
        // SAFETY: i < n (the caller's contract).
        let (x, y) = unsafe { (*a.add(i), *b.add(i)) };
        if x != y {
            return x as i32 - y as i32;
        }
        i += 1;
    }
    0
}

/// Zero if the `n` bytes at `a` and `b` are equal.
///
/// # Safety
/// `a` and `b` are valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the caller's contract, passed on.
    unsafe { memcmp(a, b, n) }
}
