//! Element types a sparse gradient can carry on the wire: `f32`, `half::f16`, `half::bf16`.

use bytemuck::Pod;
use half::{bf16, f16};

/// A scalar type for sparse values: plain old data that converts to and from `f32`.
pub trait Value: Pod + Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    /// Short name used in wire headers and reports (`"f32"`, `"f16"`, `"bf16"`).
    const NAME: &'static str;
    /// Wire code of the type (stored in the encoded header).
    const CODE: u8;
    /// Rounds an `f32` to this type (round to nearest even).
    fn from_f32(x: f32) -> Self;
    /// Widens to `f32` (exact for every supported type).
    fn to_f32(self) -> f32;
}

impl Value for f32 {
    const NAME: &'static str = "f32";
    const CODE: u8 = 1;
    #[inline]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
}

impl Value for f16 {
    const NAME: &'static str = "f16";
    const CODE: u8 = 2;
    #[inline]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    #[inline]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

impl Value for bf16 {
    const NAME: &'static str = "bf16";
    const CODE: u8 = 3;
    #[inline]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    #[inline]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}
