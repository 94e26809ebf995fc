//! Copies to and from memory that other threads (and, through the engine,
//! remote peers) access at the same time.
//!
//! Plain `copy_nonoverlapping` racing with another thread's copy of the
//! same bytes is a data race in Rust's memory model, hence undefined
//! behaviour, even when the program does not care which bytes it gets.
//! These copies are made of relaxed atomic accesses instead: the
//! "byte-wise atomic memcpy" of C++ proposal P1478. (The `atomic-memcpy`
//! crate does this for values of one fixed type; registered memory needs
//! runtime lengths and offsets, and the fixed access size per byte below,
//! so the loop is here.)
//!
//! Racing atomic accesses of *different sizes* to the same byte are not
//! allowed either (std's atomic docs; Miri reports them), so every byte of
//! a region is always accessed with the same size, whatever the copy:
//! a byte that lies in an 8-byte-aligned word entirely inside the region
//! is accessed through that word as an `AtomicU64` (a copy that covers
//! only part of the word loads the whole word, or stores its bytes with a
//! compare-exchange loop that leaves the others as they are); the few
//! bytes at a region's unaligned edges are accessed as `AtomicU8`.
//! [`MrInner::with_atomic_u64`](super::MrInner::with_atomic_u64) hands
//! out exactly such words. (Two registrations of overlapping memory with
//! different unaligned edges could still disagree at those edges.)
//!
//! What a racing reader sees: every byte holds a value some writer stored
//! there (or the old one), and an aligned 8-byte word written whole is
//! never torn; a copy as a whole is not atomic, so a reader racing with a
//! writer can see a mix of old and new words. The ordering is relaxed: a
//! completion (a CQ entry, published with release/acquire) is what orders
//! data for the reader, as a NIC's CQE write orders its DMA.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

const WORD: usize = std::mem::size_of::<u64>();

/// A region's bytes: `len` bytes at `base`.
#[derive(Debug, Clone, Copy)]
pub struct Shared {
    base: *mut u8,
    len: usize,
}

/// How some bytes of a copy are accessed: through the aligned word at
/// region offset `word` (bytes `lo..hi` of it), or as the single byte at
/// region offset `.0`.
enum Piece {
    Word { word: usize, lo: usize, hi: usize },
    Byte(usize),
}

impl Shared {
    /// The region of `len` bytes at `base`.
    ///
    /// # Safety
    /// `base` must be valid for reads and writes of `len` bytes for as
    /// long as the value is used, and every concurrent access to those
    /// bytes must go through this module (or be an `AtomicU64` on a word
    /// this module accesses as a word).
    pub unsafe fn new(base: *mut u8, len: usize) -> Shared {
        Shared { base, len }
    }

    /// Calls `f` for the pieces that cover region offsets `[off, off+n)`
    /// (in bounds: checked by the caller), in order, with the offset in
    /// the copy where each piece starts.
    fn pieces(&self, off: usize, n: usize, mut f: impl FnMut(usize, Piece)) {
        // Region offsets of the words entirely inside the region:
        // [first, words_end), `first` the first 8-aligned address.
        let first = self.base.align_offset(WORD).min(self.len);
        let words_end = first + (self.len - first) / WORD * WORD;
        let (mut a, stop) = (off, off + n);
        while a < stop {
            if a >= first && a < words_end {
                let w = a - (a - first) % WORD;
                let hi = (w + WORD).min(stop);
                f(
                    a - off,
                    Piece::Word {
                        word: w,
                        lo: a - w,
                        hi: hi - w,
                    },
                );
                a = hi;
            } else {
                f(a - off, Piece::Byte(a));
                a += 1;
            }
        }
    }

    /// The aligned word at region offset `w` (a word of `pieces`).
    fn word(&self, w: usize) -> &AtomicU64 {
        // SAFETY: `w` is the offset of an 8-aligned word entirely inside
        // the region (`pieces`), valid for the value's life (the
        // constructor's promise); every access to it is a word-sized
        // atomic.
        unsafe { AtomicU64::from_ptr(self.base.add(w) as *mut u64) }
    }

    /// The byte at region offset `a` (a byte of `pieces`).
    fn byte(&self, a: usize) -> &AtomicU8 {
        // SAFETY: inside the region, valid (the constructor's promise);
        // every access to it is a byte-sized atomic.
        unsafe { AtomicU8::from_ptr(self.base.add(a)) }
    }

    /// The run of whole aligned words inside `[off, stop)`: region
    /// offsets `[w0, w1)`, both multiples of 8 from the first aligned
    /// byte; what lies before `w0` or after `w1` goes through `pieces`.
    fn whole_words(&self, off: usize, stop: usize) -> (usize, usize) {
        let first = self.base.align_offset(WORD).min(self.len);
        let words_end = first + (self.len - first) / WORD * WORD;
        let w0 = off.max(first);
        let w0 = first + (w0 - first).div_ceil(WORD) * WORD;
        let w1 = first + (stop.min(words_end).max(first) - first) / WORD * WORD;
        if w0 >= w1 {
            (stop, stop)
        } else {
            (w0, w1)
        }
    }

    /// Copies `dst.len()` bytes from region offset `off` into `dst`.
    /// The range must be inside the region.
    pub fn load(&self, off: usize, dst: &mut [u8]) {
        debug_assert!(off <= self.len && dst.len() <= self.len - off);
        let stop = off + dst.len();
        let (w0, w1) = self.whole_words(off, stop);
        let edge = |from: usize, to: usize, dst: &mut [u8]| {
            self.pieces(from, to - from, |at, piece| {
                let at = at + from - off;
                match piece {
                    Piece::Word { word, lo, hi } => {
                        let v = self.word(word).load(Relaxed);
                        dst[at..at + hi - lo].copy_from_slice(&v.to_ne_bytes()[lo..hi]);
                    }
                    Piece::Byte(a) => dst[at] = self.byte(a).load(Relaxed),
                }
            })
        };
        edge(off, w0.min(stop), dst);
        let out = dst[w0 - off..w1 - off].as_mut_ptr();
        let mut w = w0;
        while w < w1 {
            let v = self.word(w).load(Relaxed);
            // SAFETY: `w - w0 + 8 <= w1 - w0`, inside the slice `out`
            // points into; unaligned writes are allowed.
            unsafe { out.add(w - w0).cast::<u64>().write_unaligned(v) };
            w += WORD;
        }
        if w1 < stop {
            edge(w1.max(off), stop, dst);
        }
    }

    /// Copies `src` to region offset `off`. The range must be inside the
    /// region.
    pub fn store(&self, off: usize, src: &[u8]) {
        debug_assert!(off <= self.len && src.len() <= self.len - off);
        let stop = off + src.len();
        let (w0, w1) = self.whole_words(off, stop);
        let edge = |from: usize, to: usize| {
            self.pieces(from, to - from, |at, piece| {
                let at = at + from - off;
                match piece {
                    Piece::Word { word, lo, hi } => {
                        // Part of a word: the other bytes keep whatever
                        // value they have, even if another thread stores
                        // them meanwhile.
                        let part = &src[at..at + hi - lo];
                        let _ = self.word(word).fetch_update(Relaxed, Relaxed, |old| {
                            let mut b = old.to_ne_bytes();
                            b[lo..hi].copy_from_slice(part);
                            Some(u64::from_ne_bytes(b))
                        });
                    }
                    Piece::Byte(a) => self.byte(a).store(src[at], Relaxed),
                }
            })
        };
        edge(off, w0.min(stop));
        let inp = src[w0 - off..w1 - off].as_ptr();
        let mut w = w0;
        while w < w1 {
            // SAFETY: inside the slice `inp` points into; unaligned reads
            // are allowed.
            let v = unsafe { inp.add(w - w0).cast::<u64>().read_unaligned() };
            self.word(w).store(v, Relaxed);
            w += WORD;
        }
        if w1 < stop {
            edge(w1.max(off), stop);
        }
    }

    /// Stores `byte` into `n` bytes at region offset `off`.
    pub fn fill(&self, off: usize, n: usize, byte: u8) {
        debug_assert!(off <= self.len && n <= self.len - off);
        let stop = off + n;
        let (w0, w1) = self.whole_words(off, stop);
        let run = [byte; WORD];
        let edge = |from: usize, to: usize| {
            self.pieces(from, to - from, |_, piece| match piece {
                Piece::Word { word, lo, hi } => {
                    let _ = self.word(word).fetch_update(Relaxed, Relaxed, |old| {
                        let mut b = old.to_ne_bytes();
                        b[lo..hi].copy_from_slice(&run[lo..hi]);
                        Some(u64::from_ne_bytes(b))
                    });
                }
                Piece::Byte(a) => self.byte(a).store(byte, Relaxed),
            })
        };
        edge(off, w0.min(stop));
        let mut w = w0;
        while w < w1 {
            self.word(w).store(u64::from_ne_bytes(run), Relaxed);
            w += WORD;
        }
        if w1 < stop {
            edge(w1.max(off), stop);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_at_every_alignment_and_length() {
        // Regions with unaligned edges too, each over memory of its own
        // (one byte is always accessed with one size per region).
        for (start, len) in [(0usize, 80usize), (3, 70), (5, 13)] {
            let mut backing = vec![0u64; 10]; // 80 bytes, 8-aligned
            let base = backing.as_mut_ptr() as *mut u8;
            // SAFETY: inside `backing`, which outlives `s`; one thread.
            let s = unsafe { Shared::new(base.add(start), len) };
            for off in 0..len.min(11) {
                for n in 0..(len - off).min(if cfg!(miri) { 20 } else { 40 }) {
                    let src: Vec<u8> = (0..n as u8)
                        .map(|b| b.wrapping_mul(7) ^ off as u8)
                        .collect();
                    s.fill(0, len, 0xee);
                    s.store(off, &src);
                    let mut out = vec![0u8; n];
                    s.load(off, &mut out);
                    assert_eq!(out, src, "region {start}+{len} off {off} n {n}");
                    let mut all = vec![0u8; len];
                    s.load(0, &mut all);
                    assert!(all[..off].iter().all(|&b| b == 0xee));
                    assert!(all[off + n..].iter().all(|&b| b == 0xee));
                }
            }
        }
    }
}
