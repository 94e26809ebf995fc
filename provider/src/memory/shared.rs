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
//! On x86-64 (outside Miri) a copy is a short run of inline assembly:
//! bytes up to the first aligned word of the region's side, aligned words
//! up to the vector alignment, then 32-byte (AVX) or 16-byte (SSE2)
//! vector loads and stores aligned on the region's side, then words and
//! bytes again: memcpy's speed (`benches/copy_ratio.rs` measures it
//! against the loop below). Inline assembly is outside the Rust memory
//! model's race rules: the compiler treats the block as an unknown
//! operation on the memory its pointers reach, and what it does there is
//! what relaxed atomic byte accesses do, a sequence of single-copy-atomic
//! byte (and wider) accesses with no ordering, which is all this module
//! promises a racing reader. Every other architecture, and Miri (so that
//! it still checks the module), takes the portable loop below.
//!
//! The portable loop is made of Rust atomics, and racing atomic accesses
//! of *different sizes* to the same byte are not allowed (std's atomic
//! docs; Miri reports them), so there every byte of a region is always
//! accessed with the same size, whatever the copy: a byte that lies in an
//! 8-byte-aligned word entirely inside the region is accessed through that
//! word as an `AtomicU64` (a copy that covers only part of the word loads
//! the whole word, or stores its bytes with a compare-exchange loop that
//! leaves the others as they are); the few bytes at a region's unaligned
//! edges are accessed as `AtomicU8`.
//! [`MrInner::with_atomic_u64`](super::MrInner::with_atomic_u64) hands
//! out exactly such words. (Two registrations of overlapping memory with
//! different unaligned edges could still disagree at those edges.)
//!
//! What a racing reader sees: every byte holds a value some writer stored
//! there (or the old one); a copy as a whole is not atomic, so a reader
//! racing with a writer can see a mix of old and new bytes. The portable
//! loop never tears an aligned 8-byte word written whole; the x86-64 path
//! moves each aligned word inside the copy with one aligned access that
//! covers it (x86-64 makes aligned 8-byte accesses atomic, and aligned
//! 16-byte vector accesses on CPUs with AVX; Intel and AMD document
//! nothing for a 32-byte access as a whole). The ordering is relaxed: a
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
        assert!(off <= self.len && dst.len() <= self.len - off);
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        {
            // SAFETY: `[off, off + dst.len())` is inside the region
            // (asserted), valid for reads (the constructor's promise);
            // `dst` is ours to write and, being a `&mut`, cannot overlap
            // memory other threads access. The region's side is `src`.
            unsafe { x86_64::copy(dst.as_mut_ptr(), self.base.add(off), dst.len(), false) };
        }
        #[cfg(not(all(target_arch = "x86_64", not(miri))))]
        self.load_portable(off, dst);
    }

    /// [`Shared::load`] through the portable loop of Rust atomics (what
    /// Miri and other architectures run; public for tests and benches).
    #[cfg(any(test, feature = "testing"))]
    pub fn load_portable(&self, off: usize, dst: &mut [u8]) {
        assert!(off <= self.len && dst.len() <= self.len - off);
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
        assert!(off <= self.len && src.len() <= self.len - off);
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        {
            // SAFETY: `[off, off + src.len())` is inside the region
            // (asserted), valid for writes (the constructor's promise);
            // `src` is a shared borrow, which no one writes meanwhile, and
            // cannot overlap the region (no reference to registered
            // memory is ever made). The region's side is `dst`.
            unsafe { x86_64::copy(self.base.add(off), src.as_ptr(), src.len(), true) };
        }
        #[cfg(not(all(target_arch = "x86_64", not(miri))))]
        self.store_portable(off, src);
    }

    /// [`Shared::store`] through the portable loop of Rust atomics (what
    /// Miri and other architectures run; public for tests and benches).
    #[cfg(any(test, feature = "testing"))]
    pub fn store_portable(&self, off: usize, src: &[u8]) {
        assert!(off <= self.len && src.len() <= self.len - off);
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

/// The x86-64 copy: inline assembly, outside the Rust memory model's race
/// rules (see the module's documentation).
#[cfg(all(target_arch = "x86_64", not(miri)))]
mod x86_64 {
    use std::arch::asm;

    /// Copies `n` bytes from `src` to `dst`. The side that is registered
    /// memory (`dst` when `region_is_dst`, else `src`) sets the alignment:
    /// bytes up to its first aligned word, words up to its vector
    /// alignment, then vectors aligned there, then words and bytes.
    ///
    /// # Safety
    /// `src` must be valid for reads and `dst` for writes of `n` bytes,
    /// the two ranges must not overlap, and any access racing with the
    /// copy must be atomic or another such copy (the module's contract).
    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, n: usize, region_is_dst: bool) {
        let region = if region_is_dst {
            dst as usize
        } else {
            src as usize
        };
        let avx = std::is_x86_feature_detected!("avx");
        let vec = if avx { 32 } else { 16 };
        let mut i = 0;
        // SAFETY (for every call below): `i` plus the width moved is at
        // most `n`, so each access is inside the ranges the caller
        // vouched for.
        while i < n && (region + i) % 8 != 0 {
            unsafe { byte(dst.add(i), src.add(i)) };
            i += 1;
        }
        while n - i >= 8 && (region + i) % vec != 0 {
            unsafe { word(dst.add(i), src.add(i)) };
            i += 8;
        }
        let blocks = (n - i) / (4 * vec);
        if blocks > 0 {
            if avx {
                // SAFETY: the CPU has AVX (detected just above).
                unsafe { blocks_avx(dst.add(i), src.add(i), blocks) };
            } else {
                unsafe { blocks_sse(dst.add(i), src.add(i), blocks) };
            }
            i += blocks * 4 * vec;
        }
        let rest = (n - i) / vec;
        if rest > 0 {
            if avx {
                // SAFETY: as above.
                unsafe { vectors_avx(dst.add(i), src.add(i), rest) };
            } else {
                unsafe { vectors_sse(dst.add(i), src.add(i), rest) };
            }
            i += rest * vec;
        }
        while n - i >= 8 {
            unsafe { word(dst.add(i), src.add(i)) };
            i += 8;
        }
        while i < n {
            unsafe { byte(dst.add(i), src.add(i)) };
            i += 1;
        }
    }

    /// One load into a scratch register of class `class` and one store,
    /// of `width` (`byte`, `qword`), neither touching the stack or the
    /// flags.
    macro_rules! move_one {
        ($dst:expr, $src:expr, $width:tt, $class:ident) => {
            asm!(
                concat!("mov {t}, ", $width, " ptr [{s}]"),
                concat!("mov ", $width, " ptr [{d}], {t}"),
                s = in(reg) $src,
                d = in(reg) $dst,
                t = out($class) _,
                options(nostack, preserves_flags),
            )
        };
    }

    /// One byte.
    ///
    /// # Safety
    /// As [`copy`], for one byte.
    #[inline(always)]
    unsafe fn byte(dst: *mut u8, src: *const u8) {
        // SAFETY: the caller's promise; one load and one store, neither
        // touching the stack or the flags.
        unsafe { move_one!(dst, src, "byte", reg_byte) }
    }

    /// One 8-byte word, aligned on the region's side.
    ///
    /// # Safety
    /// As [`copy`], for 8 bytes.
    #[inline(always)]
    unsafe fn word(dst: *mut u8, src: *const u8) {
        // SAFETY: the caller's promise; unaligned accesses are allowed on
        // x86-64 (the private side may be unaligned).
        unsafe { move_one!(dst, src, "qword", reg) }
    }

    /// One copy loop in inline assembly: `n` times the `body` lines (loads
    /// from `{s}`, stores to `{d}`), each time both pointers advancing
    /// `step` bytes; then the `tail` lines; the vector registers `regs`
    /// are clobbered. The four loops below differ only in these.
    macro_rules! copy_loop {
        (
            $dst:expr, $src:expr, $n:expr, step $step:tt,
            body [$($body:tt),+ $(,)?],
            tail [$($tail:tt),* $(,)?],
            regs [$($reg:tt),+ $(,)?] $(,)?
        ) => {
            asm!(
                "2:",
                $($body,)+
                concat!("add {s}, ", $step),
                concat!("add {d}, ", $step),
                "dec {n}",
                "jnz 2b",
                $($tail,)*
                s = inout(reg) $src => _,
                d = inout(reg) $dst => _,
                n = inout(reg) $n => _,
                $(out($reg) _,)+
                options(nostack),
            )
        };
    }

    /// The sixteen AVX registers `vzeroupper` clobbers (the upper halves
    /// of all of them), as `copy_loop`'s `regs`.
    macro_rules! avx_loop {
        ($dst:expr, $src:expr, $n:expr, step $step:tt, body [$($body:tt),+ $(,)?] $(,)?) => {
            copy_loop!(
                $dst, $src, $n, step $step,
                body [$($body),+],
                tail ["vzeroupper"],
                regs [
                    "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7",
                    "ymm8", "ymm9", "ymm10", "ymm11", "ymm12", "ymm13", "ymm14", "ymm15",
                ],
            )
        };
    }

    /// `blocks` runs of 64 bytes in 16-byte SSE2 loads and stores (SSE2
    /// is part of x86-64).
    ///
    /// # Safety
    /// As [`copy`], for `64 * blocks` bytes, `blocks > 0`.
    unsafe fn blocks_sse(dst: *mut u8, src: *const u8, blocks: usize) {
        // SAFETY: the caller's promise; `movups` allows any alignment.
        unsafe {
            copy_loop!(
                dst, src, blocks, step "64",
                body [
                    "movups xmm0, [{s}]",
                    "movups xmm1, [{s} + 16]",
                    "movups xmm2, [{s} + 32]",
                    "movups xmm3, [{s} + 48]",
                    "movups [{d}], xmm0",
                    "movups [{d} + 16], xmm1",
                    "movups [{d} + 32], xmm2",
                    "movups [{d} + 48], xmm3",
                ],
                tail [],
                regs ["xmm0", "xmm1", "xmm2", "xmm3"],
            )
        }
    }

    /// `count` single 16-byte SSE2 vectors (what is left after the blocks).
    ///
    /// # Safety
    /// As [`copy`], for `16 * count` bytes, `count > 0`.
    unsafe fn vectors_sse(dst: *mut u8, src: *const u8, count: usize) {
        // SAFETY: the caller's promise; `movups` allows any alignment.
        unsafe {
            copy_loop!(
                dst, src, count, step "16",
                body ["movups xmm0, [{s}]", "movups [{d}], xmm0"],
                tail [],
                regs ["xmm0"],
            )
        }
    }

    /// `count` single 32-byte AVX vectors (what is left after the blocks).
    ///
    /// # Safety
    /// As [`copy`], for `32 * count` bytes, `count > 0`, on a CPU with
    /// AVX.
    #[target_feature(enable = "avx")]
    unsafe fn vectors_avx(dst: *mut u8, src: *const u8, count: usize) {
        // SAFETY: the caller's promise; `vmovdqu` allows any alignment;
        // `vzeroupper` as in `blocks_avx`.
        unsafe {
            avx_loop!(
                dst, src, count, step "32",
                body ["vmovdqu ymm0, [{s}]", "vmovdqu [{d}], ymm0"],
            )
        }
    }

    /// `blocks` runs of 128 bytes in 32-byte AVX loads and stores.
    ///
    /// # Safety
    /// As [`copy`], for `128 * blocks` bytes, `blocks > 0`, on a CPU with
    /// AVX.
    #[target_feature(enable = "avx")]
    unsafe fn blocks_avx(dst: *mut u8, src: *const u8, blocks: usize) {
        // SAFETY: the caller's promise; `vmovdqu` allows any alignment;
        // `vzeroupper` leaves the upper halves clean for SSE code after.
        unsafe {
            avx_loop!(
                dst, src, blocks, step "128",
                body [
                    "vmovdqu ymm0, [{s}]",
                    "vmovdqu ymm1, [{s} + 32]",
                    "vmovdqu ymm2, [{s} + 64]",
                    "vmovdqu ymm3, [{s} + 96]",
                    "vmovdqu [{d}], ymm0",
                    "vmovdqu [{d} + 32], ymm1",
                    "vmovdqu [{d} + 64], ymm2",
                    "vmovdqu [{d} + 96], ymm3",
                ],
            )
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

    /// A region of `len` bytes at byte `start` of a 64-aligned backing of
    /// `cap` bytes, filled with a pattern.
    fn region(backing: &mut [u64], start: usize, len: usize) -> Shared {
        assert!(start + len <= backing.len() * 8);
        for (i, w) in backing.iter_mut().enumerate() {
            *w = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
        // SAFETY: inside `backing`, which outlives the value in every test
        // below; one thread.
        unsafe { Shared::new((backing.as_mut_ptr() as *mut u8).add(start), len) }
    }

    /// The fast copy (the x86-64 assembly, or the loop elsewhere) against
    /// the portable loop: every region alignment mod 32, copy offset and
    /// length 0..=130, both directions, and nothing outside the copy
    /// changes.
    #[test]
    fn fast_copy_matches_the_portable_loop() {
        let (starts, offs, lens) = if cfg!(miri) {
            (4, 3, 20)
        } else {
            (33, 41, 131)
        };
        let mut backing = vec![0u64; 48]; // 384 bytes
        for start in 0..starts {
            for off in 0..offs {
                for n in 0..lens {
                    let len = off + n + 7;
                    let s = region(&mut backing, start, len);
                    let mut fast = vec![0u8; n];
                    let mut slow = vec![1u8; n];
                    s.load(off, &mut fast);
                    s.load_portable(off, &mut slow);
                    assert_eq!(fast, slow, "load: region at {start}, off {off}, n {n}");

                    let mut before = vec![0u8; len];
                    s.load_portable(0, &mut before);
                    let src: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(31) ^ 0x5a).collect();
                    s.store(off, &src);
                    let mut after = vec![0u8; len];
                    s.load_portable(0, &mut after);
                    let mut want = before.clone();
                    want[off..off + n].copy_from_slice(&src);
                    assert_eq!(after, want, "store: region at {start}, off {off}, n {n}");
                    // The portable store gives the same bytes.
                    s.store_portable(0, &before);
                    s.store_portable(off, &src);
                    s.load_portable(0, &mut after);
                    assert_eq!(
                        after, want,
                        "portable store: region at {start}, off {off}, n {n}"
                    );
                }
            }
        }
    }

    /// Large copies (whole vector blocks and more), at odd offsets.
    #[test]
    fn large_copies_match_the_portable_loop() {
        let sizes: &[usize] = if cfg!(miri) {
            &[300]
        } else {
            &[4096, 65536 + 13, 1 << 20]
        };
        for &n in sizes {
            let mut backing = vec![0u64; n / 8 + 16];
            for (start, off) in [(0, 0), (3, 5), (17, 1), (8, 24)] {
                let s = region(&mut backing, start, n + off + 40);
                let src: Vec<u8> = (0..n).map(|i| (i * 7 + i / 251) as u8).collect();
                s.store(off, &src);
                let mut fast = vec![0u8; n];
                let mut slow = vec![0u8; n];
                s.load(off, &mut fast);
                s.load_portable(off, &mut slow);
                assert!(
                    fast == src && slow == src,
                    "n {n} region at {start} off {off}"
                );
                let mut edge = [0u8; 40];
                s.load_portable(off + n, &mut edge);
                let mut want = [0u8; 40];
                let first = start + off + n;
                for (k, b) in want.iter_mut().enumerate() {
                    let a = first + k;
                    let w = (a / 8) as u64;
                    *b = w.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_ne_bytes()[a % 8];
                }
                assert_eq!(edge, want, "bytes after the copy, n {n}");
            }
        }
    }
}
