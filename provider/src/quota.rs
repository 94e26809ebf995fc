//! The device's object limits: how many PDs, MRs, MWs, CQs, SRQs, QPs and
//! AHs one device holds at once. `ibv_query_device` advertises them
//! ([`Resource::max`]) and creating one more fails with ENOMEM, as the
//! kernel's rxe answers when its pool of that kind is full. Each object
//! holds a [`Slot`] for its life; dropping the slot gives it back.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// A kind of object the device counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// Protection domains (`max_pd`).
    Pd,
    /// Memory regions (`max_mr`).
    Mr,
    /// Memory windows (`max_mw`).
    Mw,
    /// Completion queues (`max_cq`).
    Cq,
    /// Shared receive queues (`max_srq`).
    Srq,
    /// Queue pairs (`max_qp`).
    Qp,
    /// Address handles (`max_ah`).
    Ah,
}

impl Resource {
    const ALL: [Resource; 7] = [
        Resource::Pd,
        Resource::Mr,
        Resource::Mw,
        Resource::Cq,
        Resource::Srq,
        Resource::Qp,
        Resource::Ah,
    ];

    /// The most objects of this kind a device holds at once.
    pub const fn max(self) -> u32 {
        match self {
            Resource::Pd | Resource::Cq | Resource::Srq | Resource::Qp | Resource::Ah => 1 << 16,
            Resource::Mr | Resource::Mw => 1 << 20,
        }
    }

    /// The `ibv_device_attr` field that advertises the limit.
    pub const fn attr(self) -> &'static str {
        match self {
            Resource::Pd => "max_pd",
            Resource::Mr => "max_mr",
            Resource::Mw => "max_mw",
            Resource::Cq => "max_cq",
            Resource::Srq => "max_srq",
            Resource::Qp => "max_qp",
            Resource::Ah => "max_ah",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The device is at its limit for a kind of object (ENOMEM).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the device holds {} objects of this kind already ({})", .0.max(), .0.attr())]
pub struct QuotaFull(pub Resource);

/// Per-kind counts of a device's live objects.
#[derive(Debug)]
pub struct Quota {
    used: [AtomicU32; Resource::ALL.len()],
    max: [u32; Resource::ALL.len()],
}

impl Default for Quota {
    fn default() -> Quota {
        Quota::with_max(|r| r.max())
    }
}

impl Quota {
    /// A quota with other limits than the advertised ones (tests).
    pub fn with_max(max: impl Fn(Resource) -> u32) -> Quota {
        Quota {
            used: Default::default(),
            max: Resource::ALL.map(max),
        }
    }

    /// Takes a slot for one more object of kind `r`, or [`QuotaFull`].
    pub fn take(self: &Arc<Self>, r: Resource) -> Result<Slot, QuotaFull> {
        let (used, max) = (&self.used[r.index()], self.max[r.index()]);
        used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .map_err(|_| QuotaFull(r))?;
        Ok(Slot {
            quota: self.clone(),
            resource: r,
        })
    }

    /// Objects of kind `r` alive now.
    #[cfg(any(test, feature = "testing"))]
    pub fn used(&self, r: Resource) -> u32 {
        self.used[r.index()].load(Ordering::Acquire)
    }
}

/// One object's place in its device's [`Quota`], given back on drop.
#[derive(Debug)]
pub struct Slot {
    quota: Arc<Quota>,
    resource: Resource,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.quota.used[self.resource.index()].fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_past_the_limit_is_refused_until_one_goes() {
        let q = Arc::new(Quota::with_max(|r| if r == Resource::Qp { 3 } else { 1 }));
        let mut qps: Vec<Slot> = (0..3).map(|_| q.take(Resource::Qp).unwrap()).collect();
        assert_eq!(q.take(Resource::Qp).unwrap_err(), QuotaFull(Resource::Qp));
        assert_eq!(q.used(Resource::Qp), 3);
        // Other kinds count on their own.
        let pd = q.take(Resource::Pd).unwrap();
        assert!(q.take(Resource::Pd).is_err());
        qps.pop();
        assert_eq!(q.used(Resource::Qp), 2);
        let _again = q.take(Resource::Qp).unwrap();
        drop(pd);
        assert_eq!(q.used(Resource::Pd), 0);
    }

    #[test]
    fn the_advertised_limits() {
        let q = Quota::default();
        assert_eq!(
            q.max,
            [
                1 << 16,
                1 << 20,
                1 << 20,
                1 << 16,
                1 << 16,
                1 << 16,
                1 << 16
            ]
        );
        assert_eq!(
            QuotaFull(Resource::Mr).to_string(),
            "the device holds 1048576 objects of this kind already (max_mr)"
        );
    }
}
