//! The fault model shared by the simulated network and the UDP engine:
//! loss, duplication, corruption, delay, jitter and reordering, decided
//! per packet by a seeded RNG.
//!
//! Users of the UDP engine turn it on with the environment variable
//! `UROCE_FAULTS` (or `Context::set_faults`), e.g.
//! `UROCE_FAULTS=loss=0.05,reorder=0.1,dup=0.01,corrupt=0.001,delay=1ms,seed=7`,
//! to test how their application copes with a bad network. Faults apply
//! to the packets a device sends.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The environment variable read by the engine.
pub const FAULTS_ENV: &str = "UROCE_FAULTS";

/// Random faults applied to every packet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// Probability a packet is lost.
    pub loss: f64,
    /// Probability a packet is delivered twice.
    pub duplicate: f64,
    /// Probability one bit of a packet is flipped.
    pub corrupt: f64,
    /// Probability a packet is held back by `reorder_ns` (so that later
    /// packets overtake it).
    pub reorder: f64,
    /// How long a reordered packet is held back.
    pub reorder_ns: u64,
    /// Fixed one-way delay.
    pub delay_ns: u64,
    /// Uniform extra delay in 0..jitter.
    pub jitter_ns: u64,
    /// RNG seed.
    pub seed: u64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            loss: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            reorder: 0.0,
            reorder_ns: 100_000,
            delay_ns: 0,
            jitter_ns: 0,
            seed: 0,
        }
    }
}

/// What happens to one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Copies delivered (0: lost, 2: duplicated).
    pub copies: u8,
    /// Bit to flip in each copy, if corrupted.
    pub flip_bit: Option<usize>,
    /// Delay of each copy.
    pub delay_ns: [u64; 2],
}

/// A bad `UROCE_FAULTS` specification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("UROCE_FAULTS: {0}")]
pub struct FaultsError(String);

fn duration_ns(v: &str) -> Option<u64> {
    let (num, mult) = if let Some(n) = v.strip_suffix("ns") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix("us") {
        (n, 1e3)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1e6)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1e9)
    } else {
        (v, 1.0)
    };
    let x: f64 = num.parse().ok()?;
    (x >= 0.0).then_some((x * mult) as u64)
}

impl Faults {
    /// No faults at all.
    pub fn is_none(&self) -> bool {
        self.loss == 0.0
            && self.duplicate == 0.0
            && self.corrupt == 0.0
            && self.reorder == 0.0
            && self.delay_ns == 0
            && self.jitter_ns == 0
    }

    /// Parses `key=value,...`: loss, dup (or duplicate), corrupt, reorder
    /// (probabilities 0..=1), delay, jitter, reorder_delay (durations with
    /// ns/us/ms/s), seed.
    pub fn parse(spec: &str) -> Result<Faults, FaultsError> {
        let mut f = Faults::default();
        for kv in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| FaultsError(format!("{kv:?} is not key=value")))?;
            let prob = || -> Result<f64, FaultsError> {
                let p: f64 = v
                    .parse()
                    .map_err(|_| FaultsError(format!("{k}: {v:?} is not a number")))?;
                if (0.0..=1.0).contains(&p) {
                    Ok(p)
                } else {
                    Err(FaultsError(format!("{k}: {p} is not a probability")))
                }
            };
            let dur = || {
                duration_ns(v).ok_or_else(|| FaultsError(format!("{k}: {v:?} is not a duration")))
            };
            match k {
                "loss" => f.loss = prob()?,
                "dup" | "duplicate" => f.duplicate = prob()?,
                "corrupt" => f.corrupt = prob()?,
                "reorder" => f.reorder = prob()?,
                "delay" => f.delay_ns = dur()?,
                "jitter" => f.jitter_ns = dur()?,
                "reorder_delay" => f.reorder_ns = dur()?,
                "seed" => f.seed = v.parse().map_err(|_| FaultsError(format!("seed: {v:?}")))?,
                _ => return Err(FaultsError(format!("unknown key {k:?}"))),
            }
        }
        Ok(f)
    }

    /// The faults `UROCE_FAULTS` asks for, if set.
    pub fn from_env() -> Result<Option<Faults>, FaultsError> {
        match std::env::var(FAULTS_ENV) {
            Ok(s) if !s.trim().is_empty() => Faults::parse(&s).map(Some),
            _ => Ok(None),
        }
    }
}

/// Decides each packet's fate.
#[derive(Debug)]
pub struct FaultInjector {
    faults: Faults,
    rng: SmallRng,
}

impl FaultInjector {
    /// An injector seeded from `faults.seed`.
    pub fn new(faults: Faults) -> FaultInjector {
        FaultInjector {
            faults,
            rng: SmallRng::seed_from_u64(faults.seed),
        }
    }
    /// The configuration.
    #[cfg(any(test, feature = "testing"))]
    pub fn faults(&self) -> &Faults {
        &self.faults
    }
    /// Applies the faults to one packet: its copies as they reach the
    /// wire, each with how long it is held back and its bytes (with the
    /// flipped bit when corrupted); none when lost, two when duplicated.
    /// `copies` is what a scripted decision left of the packet (0
    /// dropped, 1, or 2 duplicated) before the random faults. The RNG is
    /// drawn once per packet, in [`FaultInjector::plan`]'s order, so a
    /// seeded run is the same under either driver.
    pub fn inject<'a>(&mut self, bytes: &'a [u8], copies: u8) -> Copies<'a> {
        Copies {
            plan: self.plan(bytes.len(), copies),
            bytes,
            next: 0,
        }
    }

    /// The plan for a packet of `len` bytes; `copies` is what a scripted
    /// decision left of it (0, 1 or 2), before random loss/duplication.
    pub fn plan(&mut self, len: usize, mut copies: u8) -> Plan {
        let f = self.faults;
        if copies > 0 && f.loss > 0.0 && self.rng.random_bool(f.loss) {
            copies = 0;
        }
        if copies == 1 && f.duplicate > 0.0 && self.rng.random_bool(f.duplicate) {
            copies = 2;
        }
        let flip_bit = (len > 0 && f.corrupt > 0.0 && self.rng.random_bool(f.corrupt))
            .then(|| self.rng.random_range(0..len * 8));
        let mut delay_ns = [f.delay_ns; 2];
        for d in &mut delay_ns {
            if f.jitter_ns > 0 {
                *d += self.rng.random_range(0..f.jitter_ns);
            }
            if f.reorder > 0.0 && self.rng.random_bool(f.reorder) {
                *d += f.reorder_ns;
            }
        }
        Plan {
            copies,
            flip_bit,
            delay_ns,
        }
    }
}

/// The copies of one packet [`FaultInjector::inject`] lets through:
/// `(delay in ns, bytes)`, in order.
#[derive(Debug)]
pub struct Copies<'a> {
    plan: Plan,
    bytes: &'a [u8],
    next: u8,
}

impl Iterator for Copies<'_> {
    type Item = (u64, Vec<u8>);
    fn next(&mut self) -> Option<(u64, Vec<u8>)> {
        if self.next >= self.plan.copies {
            return None;
        }
        let i = self.next as usize;
        self.next += 1;
        let mut b = self.bytes.to_vec();
        if let Some(bit) = self.plan.flip_bit {
            b[bit / 8] ^= 1 << (bit % 8);
        }
        Some((self.plan.delay_ns[i.min(1)], b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_form() {
        let f = Faults::parse(
            "loss=0.05,reorder=0.1,dup=0.01,corrupt=0.001,delay=1ms,jitter=20us,seed=7",
        )
        .unwrap();
        assert_eq!(f.loss, 0.05);
        assert_eq!(f.reorder, 0.1);
        assert_eq!(f.duplicate, 0.01);
        assert_eq!(f.corrupt, 0.001);
        assert_eq!(f.delay_ns, 1_000_000);
        assert_eq!(f.jitter_ns, 20_000);
        assert_eq!(f.seed, 7);
        assert!(Faults::parse("loss=2").is_err());
        assert!(Faults::parse("speed=1").is_err());
        assert!(Faults::parse("delay=fast").is_err());
        assert!(Faults::parse("").unwrap().is_none());
    }

    #[test]
    fn inject_applies_the_plan() {
        let f = Faults {
            duplicate: 1.0,
            corrupt: 1.0,
            delay_ns: 10,
            seed: 3,
            ..Faults::default()
        };
        let pkt = [0u8; 16];
        let plan = FaultInjector::new(f).plan(pkt.len(), 1);
        let copies: Vec<_> = FaultInjector::new(f).inject(&pkt, 1).collect();
        assert_eq!(copies.len(), 2);
        let bit = plan.flip_bit.unwrap();
        for (i, (delay, b)) in copies.iter().enumerate() {
            assert_eq!(*delay, plan.delay_ns[i]);
            assert_eq!(b[bit / 8], 1 << (bit % 8));
            assert_eq!(b.iter().filter(|&&x| x != 0).count(), 1);
        }
        assert_eq!(FaultInjector::new(f).inject(&pkt, 0).count(), 0);
    }

    #[test]
    fn rates_are_roughly_honoured_and_seeded() {
        let f = Faults {
            loss: 0.1,
            duplicate: 0.05,
            corrupt: 0.02,
            ..Faults::default()
        };
        let mut a = FaultInjector::new(f);
        let mut b = FaultInjector::new(f);
        let (mut lost, mut dup, mut bad) = (0, 0, 0);
        for _ in 0..20_000 {
            let p = a.plan(100, 1);
            assert_eq!(p, b.plan(100, 1), "same seed, same plan");
            lost += (p.copies == 0) as u32;
            dup += (p.copies == 2) as u32;
            bad += p.flip_bit.is_some() as u32;
        }
        assert!((1700..2300).contains(&lost), "{lost}");
        assert!((700..1100).contains(&dup), "{dup}");
        assert!((300..500).contains(&bad), "{bad}");
    }
}
