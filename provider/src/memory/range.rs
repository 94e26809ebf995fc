//! Whether a user range may be registered: the checks the kernel makes
//! before and while it pins the pages of a memory region (`ib_umem_get`).
//! uroce pins nothing, so without them a bad range would only fault in
//! the engine thread at the first remote WRITE.
//!
//! The memory is never touched to find this out (a touch could fault, or
//! allocate a page). The mappings and their permissions come from the
//! kernel's own view, asked per mapping with the `PROCMAP_QUERY` ioctl on
//! `/proc/self/maps` (Linux 6.11+): one call per mapping the range
//! crosses, whatever the number of mappings the process has. A kernel
//! without it is asked the old way, by reading the whole of
//! `/proc/self/maps` (which costs about half a millisecond a registration
//! in a process with many mappings). Both are asked afresh every time: a
//! cache could miss an `munmap` or `mprotect` made since. `mincore` would
//! be cheaper still but tells mapped from unmapped only, not the
//! permissions, so a PROT_NONE or read-only page the kernel refuses to pin
//! would pass it. Where /proc is not mounted the range is taken on trust.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Mutex;

/// Why a range may not be registered (the kernel's errno in brackets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// Zero length, or a range that wraps around the address space or
    /// whose end wraps when rounded up to a page (EINVAL).
    #[error("the range is empty or wraps around the address space")]
    Invalid,
    /// A page of the range is not mapped, not readable, or (for a
    /// writable region) not writable (EFAULT).
    #[error("the range has a page that is unmapped or lacks the access asked for")]
    Fault,
}

impl RangeError {
    /// The errno `ibv_reg_mr` returns.
    pub fn errno(self) -> i32 {
        match self {
            RangeError::Invalid => libc::EINVAL,
            RangeError::Fault => libc::EFAULT,
        }
    }
}

/// One mapping: its bounds and whether it is readable and writable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Vma {
    start: usize,
    end: usize,
    read: bool,
    write: bool,
}

/// Checks that `len` bytes at `addr` may be registered (`writable`: for a
/// region the device or peers write), with pages of `page` bytes.
pub fn check_user_range(
    addr: usize,
    len: usize,
    writable: bool,
    page: usize,
) -> Result<(), RangeError> {
    let end = bounds(addr, len, page)?;
    match query_vmas(addr, end, writable) {
        Some(r) => r,
        None => check_with_maps_file(addr, end, writable),
    }
}

/// The range's end, after the checks that need no mapping (EINVAL).
fn bounds(addr: usize, len: usize, page: usize) -> Result<usize, RangeError> {
    let end = addr.checked_add(len).ok_or(RangeError::Invalid)?;
    if end.checked_next_multiple_of(page).is_none() || len == 0 {
        return Err(RangeError::Invalid);
    }
    Ok(end)
}

/// Walks `addr..end` over the mappings `vma_at` finds (the mapping that
/// covers an address, or `None` for a hole): each must be readable, and
/// writable when asked.
fn walk(
    addr: usize,
    end: usize,
    writable: bool,
    mut vma_at: impl FnMut(usize) -> Option<Vma>,
) -> Result<(), RangeError> {
    let mut cur = addr;
    while cur < end {
        let v = vma_at(cur).ok_or(RangeError::Fault)?;
        if v.start > cur || v.end <= cur || !v.read || (writable && !v.write) {
            return Err(RangeError::Fault);
        }
        cur = v.end;
    }
    Ok(())
}

// ---------------------------------------------------------------- PROCMAP_QUERY

/// `struct procmap_query` of `<linux/fs.h>` (Linux 6.11).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `PROCMAP_QUERY`: `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: libc::c_ulong = (3 << 30)
    | ((std::mem::size_of::<ProcmapQuery>() as libc::c_ulong) << 16)
    | ((b'f' as libc::c_ulong) << 8)
    | 17;
const VMA_READABLE: u64 = 0x01;
const VMA_WRITABLE: u64 = 0x02;

/// This process's `/proc/self/maps`, opened once per process (a child
/// after `fork` opens its own: the descriptor names the process that
/// opened it); `None` once the kernel turned out not to have the ioctl.
static MAPS: Mutex<Option<(u32, Option<File>)>> = Mutex::new(None);

/// The range checked with `PROCMAP_QUERY`, or `None` where the kernel
/// (or a missing /proc) cannot answer that way.
fn query_vmas(addr: usize, end: usize, writable: bool) -> Option<Result<(), RangeError>> {
    let pid = std::process::id();
    let mut maps = MAPS.lock().unwrap_or_else(|e| e.into_inner());
    if maps.as_ref().is_none_or(|(p, _)| *p != pid) {
        *maps = Some((pid, File::open("/proc/self/maps").ok()));
    }
    let fd = maps.as_ref()?.1.as_ref()?.as_raw_fd();
    let mut unsupported = false;
    let r = walk(addr, end, writable, |at| {
        let mut q = ProcmapQuery {
            size: std::mem::size_of::<ProcmapQuery>() as u64,
            query_addr: at as u64,
            ..Default::default()
        };
        // SAFETY: PROCMAP_QUERY reads and writes the `size` bytes of the
        // query struct passed (no name or build id buffers: sizes 0).
        let rc = unsafe { libc::ioctl(fd, PROCMAP_QUERY as _, &mut q) };
        if rc != 0 {
            let e = std::io::Error::last_os_error().raw_os_error();
            // ENOENT: no mapping covers the address (a hole).
            unsupported = e != Some(libc::ENOENT);
            return None;
        }
        Some(Vma {
            start: usize::try_from(q.vma_start).ok()?,
            end: usize::try_from(q.vma_end).ok()?,
            read: q.vma_flags & VMA_READABLE != 0,
            write: q.vma_flags & VMA_WRITABLE != 0,
        })
    });
    if unsupported {
        // ENOTTY/EINVAL: a kernel before 6.11; ask the old way from now on.
        if let Some((_, f)) = maps.as_mut() {
            *f = None;
        }
        return None;
    }
    Some(r)
}

// ---------------------------------------------------------------- the maps file

/// The range checked against the whole of `/proc/self/maps` (taken on
/// trust where it cannot be read).
fn check_with_maps_file(addr: usize, end: usize, writable: bool) -> Result<(), RangeError> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Ok(());
    };
    let vmas: Vec<Vma> = maps.lines().filter_map(parse_maps_line).collect();
    walk(addr, end, writable, |at| {
        // Lines are sorted by address: the first mapping ending past `at`.
        vmas.iter().find(|v| v.end > at).copied()
    })
}

/// One line of `/proc/<pid>/maps`: `start-end perms ...`.
fn parse_maps_line(line: &str) -> Option<Vma> {
    let mut f = line.split_whitespace();
    let (range, perms) = (f.next()?, f.next()?.as_bytes());
    let (lo, hi) = range.split_once('-')?;
    Some(Vma {
        start: usize::from_str_radix(lo, 16).ok()?,
        end: usize::from_str_radix(hi, 16).ok()?,
        read: perms.first() == Some(&b'r'),
        write: perms.get(1) == Some(&b'w'),
    })
}

/// The maps-file check, for a benchmark's yardstick (what every
/// registration cost before `PROCMAP_QUERY`).
#[cfg(any(test, feature = "testing"))]
pub fn check_user_range_by_maps_file(
    addr: usize,
    len: usize,
    writable: bool,
    page: usize,
) -> Result<(), RangeError> {
    let end = bounds(addr, len, page)?;
    check_with_maps_file(addr, end, writable)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;

    /// Three pages: read-write, PROT_NONE, read-only.
    fn mapping() -> (*mut u8, usize) {
        // SAFETY: a fresh anonymous mapping, unmapped by the caller.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: pages of the mapping just made.
        unsafe {
            assert_eq!(
                libc::mprotect(p.cast::<u8>().add(PAGE).cast(), PAGE, libc::PROT_NONE),
                0
            );
            assert_eq!(
                libc::mprotect(p.cast::<u8>().add(2 * PAGE).cast(), PAGE, libc::PROT_READ),
                0
            );
        }
        (p.cast(), 3 * PAGE)
    }

    #[test]
    #[cfg_attr(miri, ignore = "mmap, mprotect, ioctl and /proc are foreign to Miri")]
    fn both_ways_answer_alike() {
        let (p, len) = mapping();
        let a = p as usize;
        for check in [check_user_range, check_user_range_by_maps_file] {
            assert_eq!(check(a, PAGE, true, PAGE), Ok(()));
            assert_eq!(check(a + 8, 100, false, PAGE), Ok(()));
            // The PROT_NONE page, alone or crossed into.
            assert_eq!(check(a + PAGE, 1, false, PAGE), Err(RangeError::Fault));
            assert_eq!(check(a, PAGE + 1, false, PAGE), Err(RangeError::Fault));
            // The read-only page: readable, not writable.
            assert_eq!(check(a + 2 * PAGE, PAGE, false, PAGE), Ok(()));
            assert_eq!(
                check(a + 2 * PAGE, PAGE, true, PAGE),
                Err(RangeError::Fault)
            );
            assert_eq!(check(a, 0, false, PAGE), Err(RangeError::Invalid));
            assert_eq!(
                check(usize::MAX - 10, 5, false, PAGE),
                Err(RangeError::Invalid)
            );
            assert_eq!(
                check(usize::MAX - 10, 20, false, PAGE),
                Err(RangeError::Invalid)
            );
        }
        // SAFETY: the mapping made above.
        assert_eq!(unsafe { libc::munmap(p.cast(), len) }, 0);
        // Unmapped now: a hole.
        assert_eq!(
            check_user_range(a, PAGE, false, PAGE),
            Err(RangeError::Fault)
        );
        assert_eq!(
            check_user_range_by_maps_file(a, PAGE, false, PAGE),
            Err(RangeError::Fault)
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "mmap, mprotect, ioctl and /proc are foreign to Miri")]
    fn a_range_across_adjacent_mappings() {
        let (p, len) = mapping();
        let a = p as usize;
        // SAFETY: the PROT_NONE page of the mapping made above.
        unsafe { libc::mprotect(p.add(PAGE).cast(), PAGE, libc::PROT_READ) };
        assert_eq!(check_user_range(a, 3 * PAGE, false, PAGE), Ok(()));
        assert_eq!(
            check_user_range(a, 3 * PAGE, true, PAGE),
            Err(RangeError::Fault)
        );
        // SAFETY: as above.
        assert_eq!(unsafe { libc::munmap(p.cast(), len) }, 0);
    }

    #[test]
    #[cfg_attr(miri, ignore = "mmap, mprotect, ioctl and /proc are foreign to Miri")]
    fn the_kernel_answers_procmap_query() {
        // This machine's kernel (6.18) has the ioctl: the fast path is the
        // one taken, not the fallback.
        let v = [0u8; 100];
        let a = v.as_ptr() as usize;
        match query_vmas(a, a + 100, true) {
            Some(r) => assert_eq!(r, Ok(())),
            None => eprintln!("skipped: a kernel without PROCMAP_QUERY (before 6.11)"),
        }
    }
}
