//! Memory as the model knows it: the exposed region byte by byte, and
//! the R_Key check (IBA 10.6: a key names a region or window of one
//! protection domain, with access rights and a range).

use crate::target::{access, Conn, ExposedKey, KeyKind, KeyState, PATTERN};

/// `ibv_access_flags` bits.
pub const REMOTE_WRITE: u32 = 2;
/// Remote read.
pub const REMOTE_READ: u32 = 4;
/// Remote atomic.
pub const REMOTE_ATOMIC: u32 = 8;

/// The exposed region: each byte known, or any value (where the spec
/// leaves it open, or the model cannot see what was written).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region(pub Vec<Option<u8>>);

impl Region {
    /// The region as set up: the pattern everywhere.
    pub fn new(len: usize) -> Region {
        Region(vec![Some(PATTERN); len])
    }

    /// Writes `bytes` at `off` (clipped to the region).
    pub fn write(&mut self, off: usize, bytes: &[u8]) {
        for (i, b) in bytes.iter().enumerate() {
            if let Some(c) = self.0.get_mut(off + i) {
                *c = Some(*b);
            }
        }
    }

    /// Makes `len` bytes at `off` any value.
    pub fn forget(&mut self, off: usize, len: usize) {
        let end = off.saturating_add(len).min(self.0.len());
        for c in self.0.iter_mut().take(end).skip(off) {
            *c = None;
        }
    }

    /// `len` bytes at `off`.
    pub fn read(&self, off: usize, len: usize) -> Vec<Option<u8>> {
        (off..off + len)
            .map(|i| self.0.get(i).copied().flatten())
            .collect()
    }

    /// The 8 bytes at `off` as the target's CPU reads them (little-endian),
    /// if all are known.
    pub fn read_u64(&self, off: usize) -> Option<u64> {
        let b: Option<Vec<u8>> = self.read(off, 8).into_iter().collect();
        Some(u64::from_le_bytes(b?.try_into().ok()?))
    }
}

/// Where an access that passed the R_Key check lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Nowhere: a zero-length access (no key is checked).
    Nothing,
    /// The exposed region, at this offset.
    Exposed(usize),
    /// Memory of another key the target exposes: the model does not see
    /// it (and, not knowing whether it aliases the exposed region, takes
    /// the region's bytes as unknown after a write there).
    Elsewhere,
}

/// The R_Key check (IBA 10.6; 9.7.5.1): `len` bytes at `va` through
/// `rkey`, needing `need`. A zero-length access checks nothing.
pub fn check_rkey(
    conn: &Conn,
    keys: &[ExposedKey],
    rkey: u32,
    va: u64,
    len: u64,
    need: u32,
) -> Option<Place> {
    if len == 0 {
        return Some(Place::Nothing);
    }
    let within = |start, size| inside(va, len, start, size);
    if rkey == conn.rkey {
        return (need & !exposed_rights(conn) == 0 && within(conn.va, u64::from(conn.len)))
            .then(|| Place::Exposed((va - conn.va) as usize));
    }
    if rkey == conn.private_rkey {
        // A region without remote rights.
        return None;
    }
    let k = keys.iter().find(|k| k.key == rkey)?;
    grants(k, need, within).then_some(Place::Elsewhere)
}

/// Whether `len` bytes at `va` lie inside `[start, start + size)`.
fn inside(va: u64, len: u64, start: u64, size: u64) -> bool {
    va >= start && va.checked_add(len).is_some_and(|end| end <= start + size)
}

/// Whether key `k` (not the exposed region's) lets the QP reach a range
/// `within` accepts of it with the rights `need`: valid, of the QP's PD,
/// a type 2 window bound through the QP, the rights granted.
fn grants(k: &ExposedKey, need: u32, within: impl Fn(u64, u64) -> bool) -> bool {
    k.state == KeyState::Valid
        && k.same_pd
        && (k.kind != KeyKind::Window2 || k.bound_to_qp)
        && k.access & need == need
        && within(k.va, u64::from(k.len))
}

/// The exposed region's rights: as the target registered it, or (not
/// said) the three remote ones.
fn exposed_rights(conn: &Conn) -> u32 {
    conn.access.unwrap_or(access::REMOTE)
}

/// The R_Key check of an RDMA FLUSH (IBA 1.5 memory placement
/// extensions; kernel rxe's `check_rkey`, uroce's responder): the key
/// names a valid region or window of the QP's PD with the FLUSH rights
/// `need`, checked even for an empty range; the range `[va, va + len)`
/// lies inside it unless the FLUSH is of the whole region (`whole`,
/// selectivity level MR). None: the model cannot tell (a key it knows
/// nothing of the range of, with no rights needed).
pub fn flush_key_ok(
    conn: &Conn,
    keys: &[ExposedKey],
    rkey: u32,
    va: u64,
    len: u64,
    need: u32,
    whole: bool,
) -> Option<bool> {
    let within = |start, size| whole || inside(va, len, start, size);
    if rkey == conn.rkey {
        return Some(need & !exposed_rights(conn) == 0 && within(conn.va, u64::from(conn.len)));
    }
    if rkey == conn.private_rkey {
        // A region without remote rights; where it lies is not said.
        return (need != 0).then_some(false);
    }
    let Some(k) = keys.iter().find(|k| k.key == rkey) else {
        return Some(false);
    };
    Some(grants(k, need, within))
}

/// Whether a SEND with Invalidate may invalidate `rkey` (IBA 10.6.7: a
/// type 2 window bound through this QP; the targets register no region
/// for remote invalidation).
pub fn invalidatable(keys: &[ExposedKey], rkey: u32) -> bool {
    keys.iter().any(|k| {
        k.key == rkey
            && k.kind == KeyKind::Window2
            && k.state == KeyState::Valid
            && k.same_pd
            && k.bound_to_qp
    })
}
