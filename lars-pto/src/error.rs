//! The crate's one error type, and its fixed-size wire form.
//!
//! Every error a rank can find in its own inputs (a bad hyper-parameter, tensors of the
//! wrong shape, a non-finite norm) travels to the other ranks inside the parallel tensor
//! operator's all-gather as a [`Status`], so that all ranks return the same typed error
//! instead of some of them waiting for a part that never comes.

use std::fmt;

/// A field-less enum whose every variant is listed once with its wire code (what a
/// [`Status`] carries, from 1) and its name in messages: defines the enum, `code`, its
/// inverse `from_code`, and `Display`.
macro_rules! wire_named {
    (
        $(#[$meta:meta])*
        pub enum $ty:ident {
            $($(#[$vmeta:meta])* $v:ident = $code:literal => $name:literal,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum $ty {
            $($(#[$vmeta])* $v,)*
        }

        impl $ty {
            fn code(self) -> u32 {
                match self {
                    $($ty::$v => $code,)*
                }
            }

            fn from_code(c: u32) -> Option<$ty> {
                match c {
                    $($code => Some($ty::$v),)*
                    _ => None,
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(match self {
                    $($ty::$v => $name,)*
                })
            }
        }
    };
}

wire_named! {
    /// A hyper-parameter, named in [`Error::InvalidHyperParameter`].
    pub enum Param {
        /// The global learning rate of a step (finite, ≥ 0).
        LearningRate = 1 => "learning rate",
        /// LARS trust coefficient η (finite, ≥ 0).
        TrustCoefficient = 2 => "trust coefficient",
        /// Weight decay (finite, ≥ 0).
        WeightDecay = 3 => "weight decay",
        /// ε in a denominator (finite, ≥ 0).
        Epsilon = 4 => "epsilon",
        /// SGD momentum (finite, in `[0, 1)`).
        Momentum = 5 => "momentum",
        /// Adam/LAMB β1 (finite, in `[0, 1)`).
        Beta1 = 6 => "beta1",
        /// Adam/LAMB β2 (finite, in `[0, 1)`).
        Beta2 = 7 => "beta2",
        /// Largest gradient norm of global clipping (finite, > 0).
        MaxNorm = 8 => "max norm",
        /// Upper clamp of the LAMB weight norm φ (finite, > 0).
        MaxWeightNorm = 9 => "max weight norm",
    }
}

impl Param {
    /// The rule the value broke, for the error message.
    fn rule(self) -> &'static str {
        match self {
            Param::LearningRate | Param::TrustCoefficient | Param::WeightDecay | Param::Epsilon => {
                "must be finite and >= 0"
            }
            Param::Momentum | Param::Beta1 | Param::Beta2 => "must be finite and in [0, 1)",
            Param::MaxNorm | Param::MaxWeightNorm => "must be finite and > 0",
        }
    }
}

wire_named! {
    /// A per-layer tensor, named in shape errors.
    pub enum Tensor {
        /// The weights.
        Weight = 1 => "weight",
        /// The (aggregated) gradient.
        Grad = 2 => "gradient",
        /// The LARS momentum buffer.
        Momentum = 3 => "momentum buffer",
        /// The LAMB first moment.
        ExpAvg = 4 => "first moment",
        /// The LAMB second moment.
        ExpAvgSq = 5 => "second moment",
    }
}

wire_named! {
    /// A per-layer scalar that must be finite, named in [`Error::NonFinite`].
    pub enum Quantity {
        /// ‖w‖.
        WeightNorm = 1 => "weight norm",
        /// ‖g‖.
        GradNorm = 2 => "gradient norm",
        /// ‖u‖ of the LAMB update direction.
        UpdateNorm = 3 => "update norm",
        /// The trust ratio (finite norms can still give an infinite ratio).
        TrustRatio = 4 => "trust ratio",
        /// The global gradient norm of clipping.
        GlobalNorm = 5 => "global gradient norm",
    }
}

/// Everything that can go wrong in this crate. Input errors found on one rank are reported
/// on every rank (see the module docs).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A hyper-parameter outside its domain.
    #[error("invalid {param} {value}: {}", param.rule())]
    InvalidHyperParameter {
        /// Which one.
        param: Param,
        /// The value given.
        value: f64,
    },
    /// A layer's weight and gradient have different lengths.
    #[error("layer {layer}: weight has {weight} elements but gradient has {grad}")]
    ShapeMismatch {
        /// The layer index.
        layer: usize,
        /// Weight length.
        weight: usize,
        /// Gradient length.
        grad: usize,
    },
    /// A tensor whose length differs from the layer list the optimizer was built with.
    #[error("layer {layer}: {tensor} has {got} elements, the layer list says {expected}")]
    LayoutMismatch {
        /// The layer index.
        layer: usize,
        /// Which tensor.
        tensor: Tensor,
        /// Length in the layer list.
        expected: usize,
        /// Length given.
        got: usize,
    },
    /// A list of per-layer tensors of the wrong length.
    #[error("got {got} {tensor} tensors for {expected} layers")]
    LayerCount {
        /// Which tensors.
        tensor: Tensor,
        /// Number of layers.
        expected: usize,
        /// Number of tensors given.
        got: usize,
    },
    /// A norm or ratio that is NaN or infinite.
    #[error("layer {layer}: {quantity} is not finite ({value})")]
    NonFinite {
        /// The layer index (`usize::MAX` for a global quantity).
        layer: usize,
        /// Which quantity.
        quantity: Quantity,
        /// Its value.
        value: f64,
    },
    /// Ranks disagree on something that must be the same everywhere (the layer list, the
    /// hyper-parameters, the step's scalars), found by comparing fingerprints.
    #[error("ranks disagree on {what}: {detail}")]
    Mismatch {
        /// What differs.
        what: &'static str,
        /// The fingerprints seen, by rank.
        detail: String,
    },
    /// Another rank failed with an error that has no wire form (see [`Status`]).
    #[error("rank {rank} failed")]
    PeerFailed {
        /// The rank that failed.
        rank: usize,
    },
    /// A message of the parallel tensor operator that does not have the agreed length.
    #[error("malformed message from rank {src}: {detail}")]
    Protocol {
        /// The sender.
        src: usize,
        /// What was wrong.
        detail: String,
    },
    /// The transport failed.
    #[error(transparent)]
    Comm(#[from] collectives::Error),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The fixed-size wire form of an error (or of success, `code == 0`), sent in the trailer
/// of every part of the parallel tensor operator.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Status {
    /// 0 for success, otherwise which [`Error`] variant.
    pub code: u32,
    /// A sub-code (the parameter, tensor or quantity).
    pub sub: u32,
    /// Layer index.
    pub layer: u64,
    /// First count (expected or weight length).
    pub a: u64,
    /// Second count (got or gradient length).
    pub b: u64,
    /// The offending value.
    pub value: f64,
}

const OK: u32 = 0;
const HYPER: u32 = 1;
const SHAPE: u32 = 2;
const LAYOUT: u32 = 3;
const COUNT: u32 = 4;
const NONFINITE: u32 = 5;
const OPAQUE: u32 = 0xFFFF;

fn layer_to_wire(layer: usize) -> u64 {
    layer as u64
}

fn layer_from_wire(layer: u64) -> usize {
    usize::try_from(layer).unwrap_or(usize::MAX)
}

fn count_from_wire(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

impl Status {
    /// Success.
    pub const OK: Status = Status {
        code: OK,
        sub: 0,
        layer: 0,
        a: 0,
        b: 0,
        value: 0.0,
    };

    /// The wire form of a result: success, an encodable error, or "opaque failure".
    pub fn of(result: &Result<()>) -> Status {
        match result {
            Ok(()) => Status::OK,
            Err(e) => Status::from_error(e),
        }
    }

    /// The wire form of an error. Transport and cross-rank errors have none and are sent as
    /// an opaque failure, which peers report as [`Error::PeerFailed`].
    pub fn from_error(e: &Error) -> Status {
        let mut s = Status::OK;
        match *e {
            Error::InvalidHyperParameter { param, value } => {
                s.code = HYPER;
                s.sub = param.code();
                s.value = value;
            }
            Error::ShapeMismatch {
                layer,
                weight,
                grad,
            } => {
                s.code = SHAPE;
                s.layer = layer_to_wire(layer);
                s.a = weight as u64;
                s.b = grad as u64;
            }
            Error::LayoutMismatch {
                layer,
                tensor,
                expected,
                got,
            } => {
                s.code = LAYOUT;
                s.sub = tensor.code();
                s.layer = layer_to_wire(layer);
                s.a = expected as u64;
                s.b = got as u64;
            }
            Error::LayerCount {
                tensor,
                expected,
                got,
            } => {
                s.code = COUNT;
                s.sub = tensor.code();
                s.a = expected as u64;
                s.b = got as u64;
            }
            Error::NonFinite {
                layer,
                quantity,
                value,
            } => {
                s.code = NONFINITE;
                s.sub = quantity.code();
                s.layer = layer_to_wire(layer);
                s.value = value;
            }
            _ => s.code = OPAQUE,
        }
        s
    }

    /// Whether this is success.
    pub fn is_ok(&self) -> bool {
        self.code == OK
    }

    /// The error this status stands for, as sent by rank `src`; `None` for success.
    pub fn to_error(&self, src: usize) -> Option<Error> {
        let layer = layer_from_wire(self.layer);
        let bad = || Error::Protocol {
            src,
            detail: format!("unknown status {}/{}", self.code, self.sub),
        };
        Some(match self.code {
            OK => return None,
            HYPER => match Param::from_code(self.sub) {
                Some(param) => Error::InvalidHyperParameter {
                    param,
                    value: self.value,
                },
                None => bad(),
            },
            SHAPE => Error::ShapeMismatch {
                layer,
                weight: count_from_wire(self.a),
                grad: count_from_wire(self.b),
            },
            LAYOUT => match Tensor::from_code(self.sub) {
                Some(tensor) => Error::LayoutMismatch {
                    layer,
                    tensor,
                    expected: count_from_wire(self.a),
                    got: count_from_wire(self.b),
                },
                None => bad(),
            },
            COUNT => match Tensor::from_code(self.sub) {
                Some(tensor) => Error::LayerCount {
                    tensor,
                    expected: count_from_wire(self.a),
                    got: count_from_wire(self.b),
                },
                None => bad(),
            },
            NONFINITE => match Quantity::from_code(self.sub) {
                Some(quantity) => Error::NonFinite {
                    layer,
                    quantity,
                    value: self.value,
                },
                None => bad(),
            },
            OPAQUE => Error::PeerFailed { rank: src },
            _ => bad(),
        })
    }
}

/// Checks `value` is finite and ≥ 0.
pub(crate) fn non_negative(param: Param, value: f64) -> Result<()> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(Error::InvalidHyperParameter { param, value })
    }
}

/// Checks `value` is finite and in `[0, 1)`.
pub(crate) fn unit_interval(param: Param, value: f64) -> Result<()> {
    if value.is_finite() && (0.0..1.0).contains(&value) {
        Ok(())
    } else {
        Err(Error::InvalidHyperParameter { param, value })
    }
}

/// Checks `value` is finite and > 0.
pub(crate) fn positive(param: Param, value: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(Error::InvalidHyperParameter { param, value })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodable_errors_round_trip() {
        let errs = [
            Error::InvalidHyperParameter {
                param: Param::Beta2,
                value: -1.5,
            },
            Error::ShapeMismatch {
                layer: 3,
                weight: 10,
                grad: 11,
            },
            Error::LayoutMismatch {
                layer: 7,
                tensor: Tensor::ExpAvgSq,
                expected: 4,
                got: 5,
            },
            Error::LayerCount {
                tensor: Tensor::Grad,
                expected: 161,
                got: 160,
            },
            Error::NonFinite {
                layer: 2,
                quantity: Quantity::UpdateNorm,
                value: f64::INFINITY,
            },
        ];
        for e in errs {
            assert_eq!(Status::from_error(&e).to_error(0), Some(e));
        }
        assert_eq!(Status::OK.to_error(0), None);
        let opaque = Status::from_error(&Error::Protocol {
            src: 1,
            detail: "x".into(),
        });
        assert_eq!(opaque.to_error(4), Some(Error::PeerFailed { rank: 4 }));
        let junk = Status {
            code: 99,
            ..Status::OK
        };
        assert!(matches!(
            junk.to_error(2),
            Some(Error::Protocol { src: 2, .. })
        ));
    }
}
