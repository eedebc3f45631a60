//! [`SelectorKind`]: the typed choice of a selector. Benches, the command line and the
//! collectives name selectors by this enum; strings are parsed only at those edges
//! ([`std::str::FromStr`] and [`std::fmt::Display`] use the report names).

use std::fmt;
use std::str::FromStr;

use crate::{DgcSampling, Error, ExDyna, ExactTopK, GaussianK, HardThreshold, MsTopK, Selector};

/// A selector with its default settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SelectorKind {
    /// [`ExactTopK`].
    Exact,
    /// [`MsTopK`] (MSTopK/HiTopKComm (Shi et al., MLSys 2021), Algorithm 1).
    MsTopK,
    /// [`DgcSampling`].
    Dgc,
    /// [`HardThreshold`], calibrated from a sample on the first call.
    Threshold,
    /// [`ExDyna`]'s scaled threshold over the whole vector.
    ExDyna,
    /// [`GaussianK`].
    GaussianK,
}

impl SelectorKind {
    /// Every kind, in report order.
    pub const ALL: [SelectorKind; 6] = [
        SelectorKind::Exact,
        SelectorKind::MsTopK,
        SelectorKind::Dgc,
        SelectorKind::Threshold,
        SelectorKind::ExDyna,
        SelectorKind::GaussianK,
    ];

    /// The report name (`exact`, `mstopk`, `dgc`, `threshold`, `exdyna`, `gaussiank`).
    pub fn name(self) -> &'static str {
        match self {
            SelectorKind::Exact => "exact",
            SelectorKind::MsTopK => "mstopk",
            SelectorKind::Dgc => "dgc",
            SelectorKind::Threshold => "threshold",
            SelectorKind::ExDyna => "exdyna",
            SelectorKind::GaussianK => "gaussiank",
        }
    }

    /// True for the selectors that return exactly `min(k, d)` entries.
    pub fn exact_count(self) -> bool {
        matches!(self, SelectorKind::Exact | SelectorKind::MsTopK)
    }

    /// A fresh selector of this kind; `seed` drives the random parts (MSTopK's
    /// tie-filling offset, DGC's sample offset).
    pub fn build(self, seed: u64) -> Box<dyn Selector> {
        match self {
            SelectorKind::Exact => Box::new(ExactTopK::new()),
            SelectorKind::MsTopK => Box::new(MsTopK::with_seed(seed)),
            SelectorKind::Dgc => Box::new(DgcSampling::new(seed)),
            SelectorKind::Threshold => Box::new(HardThreshold::auto()),
            SelectorKind::ExDyna => Box::new(ExDyna::new()),
            SelectorKind::GaussianK => Box::new(GaussianK::new()),
        }
    }
}

impl fmt::Display for SelectorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SelectorKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        let known = SelectorKind::ALL.map(|k| k.name());
        let unknown = || format!("unknown selector {s:?}; known: {}", known.join(", "));
        let i = known.iter().position(|n| *n == s);
        i.map(|i| SelectorKind::ALL[i])
            .ok_or_else(|| Error::InvalidArgument(unknown()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for k in SelectorKind::ALL {
            assert_eq!(k.name().parse::<SelectorKind>().unwrap(), k);
            assert_eq!(k.to_string(), k.name());
            assert_eq!(k.build(1).exact_count(), k.exact_count(), "{k}");
        }
        assert!("nope".parse::<SelectorKind>().is_err());
    }
}
