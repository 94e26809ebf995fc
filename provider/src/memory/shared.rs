//! Copies to and from memory that other threads (and, through the engine,
//! remote peers) access at the same time.
//!
//! Plain `copy_nonoverlapping` racing with another thread's copy of the
//! same bytes is a data race in Rust's memory model, hence undefined
//! behaviour, even when the program does not care which bytes it gets.
//! These copies are instead made of relaxed atomic accesses: bytes up to
//! the first 8-byte boundary of the shared side and after the last one
//! one at a time, the words between them as `AtomicU64`. That is the
//! "byte-wise atomic memcpy" of C++ proposal P1478 (the `atomic-memcpy`
//! crate does the same for values of one fixed type; registered memory
//! needs runtime lengths and offsets, so the loop is here).
//!
//! What a racing reader sees: every byte holds a value some writer stored
//! there (or the old one), and an aligned 8-byte word is never torn; a copy
//! as a whole is not atomic, so a reader racing with a writer can see a
//! mix of old and new words. Relaxed ordering: a completion (a CQ entry,
//! published with release/acquire) is what orders data for the reader, as
//! a NIC's DMA is ordered by its CQE write.
//!
//! Every function here takes a raw pointer to the shared side and a Rust
//! slice for the private side; the private side uses plain accesses.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

const WORD: usize = std::mem::size_of::<u64>();

/// Splits `len` bytes at `shared` into (head bytes, whole words, tail
/// bytes) so that the words are 8-byte aligned on the shared side.
fn split(shared: *const u8, len: usize) -> (usize, usize, usize) {
    let head = shared.align_offset(WORD).min(len);
    let words = (len - head) / WORD;
    (head, words, len - head - words * WORD)
}

/// Copies `dst.len()` bytes from `src` into `dst`.
///
/// # Safety
/// `src` must be valid for reads of `dst.len()` bytes for the whole call,
/// and every concurrent access to those bytes must be atomic (this module's
/// copies or atomics).
pub unsafe fn load(src: *const u8, dst: &mut [u8]) {
    let (head, words, _) = split(src, dst.len());
    let mut i = 0;
    while i < dst.len() {
        // SAFETY: `src + i` is in bounds (the caller's promise); the head
        // and the tail are accessed bytewise (AtomicU8 has alignment 1),
        // the middle as aligned words (`split` puts `src + head` on an
        // 8-byte boundary and `i` advances by whole words there); all
        // concurrent accesses are atomic (the caller's promise).
        unsafe {
            if i >= head && i < head + words * WORD {
                let w = AtomicU64::from_ptr(src.add(i) as *mut u64).load(Relaxed);
                dst[i..i + WORD].copy_from_slice(&w.to_ne_bytes());
                i += WORD;
            } else {
                dst[i] = AtomicU8::from_ptr(src.add(i) as *mut u8).load(Relaxed);
                i += 1;
            }
        }
    }
}

/// Copies `src` to `dst`.
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` bytes for the whole call,
/// and every concurrent access to those bytes must be atomic.
pub unsafe fn store(dst: *mut u8, src: &[u8]) {
    let (head, words, _) = split(dst, src.len());
    let mut i = 0;
    while i < src.len() {
        // SAFETY: as in `load`, with the direction reversed.
        unsafe {
            if i >= head && i < head + words * WORD {
                let mut w = [0u8; WORD];
                w.copy_from_slice(&src[i..i + WORD]);
                AtomicU64::from_ptr(dst.add(i) as *mut u64).store(u64::from_ne_bytes(w), Relaxed);
                i += WORD;
            } else {
                AtomicU8::from_ptr(dst.add(i)).store(src[i], Relaxed);
                i += 1;
            }
        }
    }
}

/// Stores `byte` into `len` bytes at `dst`.
///
/// # Safety
/// As for [`store`], for `len` bytes.
pub unsafe fn fill(dst: *mut u8, len: usize, byte: u8) {
    let (head, words, _) = split(dst, len);
    let word = u64::from_ne_bytes([byte; WORD]);
    let mut i = 0;
    while i < len {
        // SAFETY: as in `store`.
        unsafe {
            if i >= head && i < head + words * WORD {
                AtomicU64::from_ptr(dst.add(i) as *mut u64).store(word, Relaxed);
                i += WORD;
            } else {
                AtomicU8::from_ptr(dst.add(i)).store(byte, Relaxed);
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_at_every_alignment_and_length() {
        let mut shared = vec![0u64; 8]; // 64 bytes, 8-aligned
        let base = shared.as_mut_ptr() as *mut u8;
        for off in 0..9 {
            for len in 0..40 {
                let src: Vec<u8> = (0..len as u8)
                    .map(|b| b.wrapping_mul(7) ^ off as u8)
                    .collect();
                // SAFETY: off + len <= 48 < 64 bytes of `shared`; one thread.
                unsafe {
                    fill(base, 64, 0xee);
                    store(base.add(off), &src);
                    let mut out = vec![0u8; len];
                    load(base.add(off), &mut out);
                    assert_eq!(out, src, "off {off} len {len}");
                    let mut around = [0u8; 64];
                    load(base, &mut around);
                    assert!(around[..off].iter().all(|&b| b == 0xee));
                    assert!(around[off + len..].iter().all(|&b| b == 0xee));
                }
            }
        }
    }
}
