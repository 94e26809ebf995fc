//! Scatter/gather lists resolved against the key table once per work
//! request, then copied to and from packet payloads at any message offset.

use crate::memory::{KeyTable, MemError, MrInner, PdId};
use crate::observe::cause::LkeyFault;
use crate::observe::{self, Event, Topic};
use crate::types::{Access, Sge};
use smallvec::SmallVec;
use std::sync::Arc;

/// One SGE with its region and offset checked.
#[derive(Debug, Clone)]
pub struct Segment {
    /// The region.
    pub mr: Arc<MrInner>,
    /// Offset of the segment in the region.
    pub offset: usize,
    /// Length.
    pub len: u32,
}

/// A resolved scatter/gather list.
#[derive(Debug, Clone, Default)]
pub struct Resolved {
    segs: SmallVec<[Segment; 4]>,
    total: u64,
}

impl Resolved {
    /// Checks every SGE (lkey, PD, access `need`, bounds; IBA ch. 10.6:
    /// a failure is a local protection error, with the facts of the first
    /// SGE that failed).
    pub fn resolve(
        keys: &KeyTable,
        pd: PdId,
        sgl: &[Sge],
        need: Access,
    ) -> Result<Resolved, LkeyFault> {
        let mut r = Resolved::default();
        for (i, s) in sgl.iter().enumerate() {
            if s.length == 0 {
                continue;
            }
            let (mr, offset) = keys
                .check_lkey(s.lkey, pd, s.addr, s.length as u64, need)
                .map_err(|e| LkeyFault::found(keys, pd, i, *s, need, e))?;
            r.total += s.length as u64;
            r.segs.push(Segment {
                mr,
                offset,
                len: s.length,
            });
        }
        Ok(r)
    }
    /// Total bytes.
    pub fn total(&self) -> u64 {
        self.total
    }
    /// Copies `out.len()` bytes starting at message offset `at` out of the
    /// list.
    pub fn gather(&self, at: u64, out: &mut [u8]) -> Result<(), MemError> {
        self.walk(at, out.len(), |seg, off, range| {
            seg.mr.read(off, &mut out[range])
        })
    }
    /// Copies `data` into the list at message offset `at`.
    pub fn scatter(&self, at: u64, data: &[u8]) -> Result<(), MemError> {
        self.walk(at, data.len(), |seg, off, range| {
            let (mr, len) = (&*seg.mr, range.len());
            observe::tell(Topic::CHECK_BUFFER, || Event::NicWrote {
                mr,
                offset: off,
                len,
            });
            seg.mr.write(off, &data[range])
        })
    }

    fn walk(
        &self,
        mut at: u64,
        len: usize,
        mut f: impl FnMut(&Segment, usize, std::ops::Range<usize>) -> Result<(), MemError>,
    ) -> Result<(), MemError> {
        if at
            .checked_add(len as u64)
            .is_none_or(|end| end > self.total)
        {
            return Err(MemError::OutOfBounds {
                addr: at,
                len: len as u64,
            });
        }
        let mut done = 0usize;
        for seg in &self.segs {
            if done == len {
                break;
            }
            let seg_len = seg.len as u64;
            if at >= seg_len {
                at -= seg_len;
                continue;
            }
            let n = ((seg_len - at) as usize).min(len - done);
            f(seg, seg.offset + at as usize, done..done + n)?;
            done += n;
            at = 0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_scatter_across_segments() {
        let keys = KeyTable::new();
        let a = keys.register_zeroed(1, 16, Access::LOCAL_WRITE).unwrap();
        let b = keys.register_zeroed(1, 16, Access::LOCAL_WRITE).unwrap();
        let sgl = [
            Sge {
                addr: a.iova() + 10,
                length: 6,
                lkey: a.lkey(),
            },
            Sge {
                addr: b.iova(),
                length: 0,
                lkey: 0xdead,
            },
            Sge {
                addr: b.iova() + 2,
                length: 8,
                lkey: b.lkey(),
            },
        ];
        let r = Resolved::resolve(&keys, 1, &sgl, Access::LOCAL_WRITE).unwrap();
        assert_eq!(r.total(), 14);
        r.scatter(0, b"0123456789abcd").unwrap();
        let mut out = [0u8; 5];
        r.gather(4, &mut out).unwrap();
        assert_eq!(&out, b"45678");
        let mut bb = [0u8; 8];
        b.read(2, &mut bb).unwrap();
        assert_eq!(&bb, b"6789abcd");
        assert!(r.gather(10, &mut [0u8; 5]).is_err());
        assert!(Resolved::resolve(&keys, 2, &sgl, Access::empty()).is_err());
    }
}
