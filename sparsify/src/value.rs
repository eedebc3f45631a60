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

/// The 16-bit types of `half`: the conversions are theirs.
macro_rules! half_value {
    ($($t:ident = $code:literal),*) => {$(
        impl Value for $t {
            const NAME: &'static str = stringify!($t);
            const CODE: u8 = $code;
            #[inline]
            fn from_f32(x: f32) -> Self {
                $t::from_f32(x)
            }
            #[inline]
            fn to_f32(self) -> f32 {
                $t::to_f32(self)
            }
        }
    )*};
}
half_value!(f16 = 2, bf16 = 3);
