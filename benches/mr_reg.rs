//! Registering many memory regions: `ibv_reg_mr`'s range check (is every
//! page mapped, readable, writable?) plus the registration, as the C
//! drop-in does it, for 100,000 regions over one 4 KiB page, against the
//! same with the check made the way it was before (reading and parsing
//! the whole of `/proc/self/maps` per registration) measured in the same
//! run over fewer registrations. No timed assertion: the ratio is
//! printed. The maps read costs more the more mappings a process has
//! (about 40 us here, with few; 2^20 registrations in a conformance suite
//! took 525 s, 500 us each), the query per mapping does not.
//!
//! The last line, as measured on the 2-core build machine:
//! `mr_reg: 100000 registrations 1.6 us each; with a maps read each 41.3 us
//! each; ratio 26x`.
//!
//! Environment: UROCE_MR_REG_N (default 100000) registrations,
//! UROCE_MR_REG_YARD (default 2000) for the yardstick.
//!
//! Run: `cargo bench -p uroce-benches --bench mr_reg`.

use std::time::Instant;
use uroce_provider::sans_io::memory::range::{
    check_user_range, check_user_range_by_maps_file, RangeError,
};
use uroce_verbs::*;

const PAGE: usize = 4096;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Seconds per registration of `n` regions over `buf`, each checked with
/// `check` first; the regions are deregistered after the clock stops.
fn run(
    pd: &ProtectionDomain,
    buf: *mut u8,
    n: usize,
    check: fn(usize, usize, bool, usize) -> std::result::Result<(), RangeError>,
) -> f64 {
    let mut mrs = Vec::with_capacity(n);
    let t = Instant::now();
    for _ in 0..n {
        check(buf as usize, PAGE, true, PAGE).expect("a mapped page");
        // SAFETY: the page outlives the regions (dropped below, before it).
        mrs.push(unsafe { pd.reg_mr_raw(buf, PAGE, Access::LOCAL_WRITE) }.unwrap());
    }
    let secs = t.elapsed().as_secs_f64();
    drop(mrs);
    secs / n as f64
}

fn main() {
    let ctx = Device::new("mrreg0", "127.101.200.1".parse().unwrap())
        .open()
        .expect("open device");
    let pd = ctx.alloc_pd().unwrap();
    let mut page = vec![0u8; 2 * PAGE];
    let off = page.as_ptr().align_offset(PAGE);
    let buf = page[off..].as_mut_ptr();
    let n = env("UROCE_MR_REG_N", 100_000);
    let yard_n = env("UROCE_MR_REG_YARD", 2000);
    let now = run(&pd, buf, n, check_user_range);
    let before = run(&pd, buf, yard_n, check_user_range_by_maps_file);
    println!(
        "mr_reg: {n} registrations {:.1} us each; with a maps read each {:.1} us each; ratio {:.0}x",
        now * 1e6,
        before * 1e6,
        before / now
    );
}
