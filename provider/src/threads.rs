//! Threads the library starts on its own (the engine thread, rdma_cm's
//! release thread) take none of the process's signals.
//!
//! A process-directed signal goes to any thread that does not block it.
//! A program that blocks a signal in its own threads and reads it from a
//! `signalfd` or `sigwait` (tgt's iSER target does so with SIGUSR2), or
//! whose handler must run on one of its own threads (qperf's SIGALRM),
//! would otherwise lose it to a thread it never made. Kernel devices and
//! rdma-core start no such threads; uroce's block every signal, as
//! libraries that start threads do.

use std::io;
use std::thread::{Builder, JoinHandle};

/// Spawns a thread named `name` that starts with every signal blocked.
/// The calling thread's own mask is unchanged when this returns.
pub fn spawn<F, T>(name: String, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    // A new thread inherits its creator's mask: block everything here for
    // the moment of the spawn, then put the caller's mask back.
    let old = block_all()?;
    let r = Builder::new().name(name).spawn(f);
    restore(&old);
    r
}

/// Blocks every signal in the calling thread; returns the mask it had.
fn block_all() -> io::Result<libc::sigset_t> {
    // SAFETY: sigset_t is a plain bit set, for which all-zero bytes are a
    // valid (empty) value; sigfillset then fills it.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live, writable sigset_t values owned by
    // this frame; pthread_sigmask only reads `all` and writes `old`.
    let rc = unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old)
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(old)
}

/// Sets the calling thread's mask back to `old`.
fn restore(old: &libc::sigset_t) {
    // SAFETY: `old` is a valid mask read by block_all on this thread; a
    // null pointer for the old mask is allowed (not written).
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `SigBlk` mask of thread `tid` of this process, from /proc.
    fn blocked(tid: i64) -> u64 {
        let s =
            std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap_or_default();
        let Some(line) = s.lines().find(|l| l.starts_with("SigBlk:")) else {
            return u64::MAX; // the thread has gone
        };
        u64::from_str_radix(line["SigBlk:".len()..].trim(), 16).unwrap()
    }

    fn gettid() -> i64 {
        // SAFETY: gettid takes no arguments and cannot fail.
        unsafe { libc::syscall(libc::SYS_gettid) }
    }

    /// A signal's bit in a /proc `SigBlk` mask.
    fn bit(sig: i32) -> u64 {
        1 << (sig - 1)
    }

    /// The masks of this process's engine threads (by name).
    fn engine_masks() -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            // Other tests' engines come and go: a thread gone since the
            // listing is skipped.
            let Ok(comm) = std::fs::read_to_string(e.path().join("comm")) else {
                continue;
            };
            let Some(tid) = e.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            if comm.starts_with("uroce-engine") {
                out.push((comm, blocked(tid)));
            }
        }
        out
    }

    #[test]
    fn the_engine_thread_takes_no_signal() {
        let dev = crate::device::Device::open("127.77.9.1".parse().unwrap()).unwrap();
        // A new thread names itself once it runs: wait for the name.
        let mut masks = engine_masks();
        for _ in 0..500 {
            if !masks.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            masks = engine_masks();
        }
        assert!(!masks.is_empty(), "no engine thread found");
        for (comm, mask) in masks {
            assert!(mask & bit(libc::SIGUSR2) != 0, "{comm}: {mask:#x}");
            assert!(mask & bit(libc::SIGALRM) != 0, "{comm}: {mask:#x}");
        }
        drop(dev);
    }

    #[test]
    fn a_spawned_thread_blocks_every_signal_and_the_caller_keeps_its_mask() {
        let before = blocked(gettid());
        let h = spawn("quiet".into(), || blocked(gettid())).unwrap();
        let theirs = h.join().unwrap();
        // Every signal the kernel lets a thread block (SIGKILL and
        // SIGSTOP never are; glibc keeps its two internal ones out).
        for sig in [
            libc::SIGUSR2,
            libc::SIGALRM,
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGCHLD,
        ] {
            assert!(
                theirs & bit(sig) != 0,
                "signal {sig} not blocked: {theirs:#x}"
            );
        }
        assert_eq!(blocked(gettid()), before, "the caller's mask changed");
    }
}
