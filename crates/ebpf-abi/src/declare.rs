//! The `abi!` macro: one declaration per shared constant or struct gives the Rust item and
//! its description ([`Item`](crate::Item)), from which [`header`](crate::header) writes
//! the C text.
//!
//! A struct's fields are fixed-width unsigned integers, arrays of them, or other structs
//! declared here ([`CType`] is implemented for nothing else), so its `#[repr(C)]` layout
//! is C's. The macro refuses (at compile time) a struct the compiler would pad: every byte
//! is a named field both sides see, which is what makes the `aya::Pod` impls sound.

use crate::Type;

/// A type a shared struct's field may have: its C spelling, and its all-zero value.
pub(crate) trait CType: Copy + 'static {
    /// How C spells the type.
    const C: Type;
    /// The value with every byte zero.
    const ZERO: Self;
}

/// A type a shared constant may have: the suffix its C literal takes.
pub(crate) trait CInt {
    /// `u` for `u32`, `ull` for `u64`; none for the types that fit C's `int`.
    const SUFFIX: &'static str;
}

macro_rules! integers {
    ($($t:ty => $c:literal, $suffix:literal;)*) => {$(
        impl CType for $t {
            const C: Type = Type::named($c);
            const ZERO: Self = 0;
        }
        impl CInt for $t {
            const SUFFIX: &'static str = $suffix;
        }
    )*};
}

integers! {
    u8 => "__u8", "";
    u16 => "__u16", "";
    u32 => "__u32", "u";
    u64 => "__u64", "ull";
}

/// Sizes and indexes: constants, never fields (their width is the host's).
impl CInt for usize {
    const SUFFIX: &'static str = "";
}

impl<T: CType, const N: usize> CType for [T; N] {
    const C: Type = T::C.array_of(N);
    const ZERO: Self = [T::ZERO; N];
}

/// Declares the shared items: constants (alone, or grouped in a module), and structs.
///
/// ```text
/// /// Doc comment, copied into the header.
/// pub const RUST_NAME: u32 = 1 << 3 => C_NAME;
/// /// Doc comment.
/// pub mod c { /// Doc. pub const X: usize = 0 => C_X; }
/// /// Doc comment.
/// pub struct RustName => c_name { /// Field doc. pub field: u32, }
/// ```
///
/// Besides the items it defines `ITEMS`, every declaration in order.
macro_rules! abi {
    (@munch [$($items:tt)*]) => {
        /// Every shared constant and struct, in the order the header declares them.
        pub const ITEMS: &[$crate::Item] = &[$($items)*];
    };

    (@munch [$($items:tt)*]
        $(#[doc = $doc:literal])*
        pub const $name:ident: $t:ty = $v:expr => $c:ident;
        $($rest:tt)*
    ) => {
        $(#[doc = $doc])*
        #[doc = ""]
        #[doc = concat!("C: `", stringify!($c), "`.")]
        pub const $name: $t = $v;

        abi!(@munch [$($items)*
            $crate::Item::Const($crate::Const {
                doc: &[$($doc),*],
                name: stringify!($c),
                rust: stringify!($name),
                value: $name as u64,
                suffix: <$t as $crate::declare::CInt>::SUFFIX,
                expr: stringify!($v),
            }),
        ] $($rest)*);
    };

    (@munch [$($items:tt)*]
        $(#[doc = $doc:literal])*
        pub mod $m:ident {
            $(
                $(#[doc = $cdoc:literal])*
                pub const $name:ident: $t:ty = $v:expr => $c:ident;
            )*
        }
        $($rest:tt)*
    ) => {
        $(#[doc = $doc])*
        pub mod $m {
            $(
                $(#[doc = $cdoc])*
                #[doc = ""]
                #[doc = concat!("C: `", stringify!($c), "`.")]
                pub const $name: $t = $v;
            )*
        }

        abi!(@munch [$($items)*
            $crate::Item::Group {
                doc: &[$($doc),*],
                consts: &[$(
                    $crate::Const {
                        doc: &[$($cdoc),*],
                        name: stringify!($c),
                        rust: concat!(stringify!($m), "::", stringify!($name)),
                        value: $m::$name as u64,
                        suffix: <$t as $crate::declare::CInt>::SUFFIX,
                        expr: stringify!($v),
                    }
                ),*],
            },
        ] $($rest)*);
    };

    (@munch [$($items:tt)*]
        $(#[doc = $doc:literal])*
        pub struct $name:ident => $c:ident {
            $(
                $(#[doc = $fdoc:literal])*
                pub $f:ident: $ft:ty
            ),* $(,)?
        }
        $($rest:tt)*
    ) => {
        $(#[doc = $doc])*
        #[doc = ""]
        #[doc = concat!("C: `struct ", stringify!($c), "`.")]
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub struct $name {
            $(
                $(#[doc = $fdoc])*
                pub $f: $ft,
            )*
        }

        impl $crate::declare::CType for $name {
            const C: $crate::Type = $crate::Type::named(concat!("struct ", stringify!($c)));
            const ZERO: Self = Self { $($f: <$ft as $crate::declare::CType>::ZERO),* };
        }

        impl Default for $name {
            fn default() -> Self {
                <Self as $crate::declare::CType>::ZERO
            }
        }

        const _: () = assert!(
            ::core::mem::size_of::<$name>() == 0 $(+ ::core::mem::size_of::<$ft>())*,
            concat!(
                "`", stringify!($name), "` has padding the compiler put in: declare those bytes ",
                "as a field, so that both sides see them"
            ),
        );

        // SAFETY: a `#[repr(C)]` struct of integers, arrays of them and other such structs
        // (the only types with `CType`), with no padding (asserted above): every byte is
        // initialised and every bit pattern is a valid value.
        #[cfg(feature = "aya")]
        unsafe impl ::aya::Pod for $name {}

        abi!(@munch [$($items)*
            $crate::Item::Struct($crate::Struct {
                doc: &[$($doc),*],
                name: stringify!($c),
                rust: stringify!($name),
                size: ::core::mem::size_of::<$name>(),
                fields: &[$(
                    $crate::Field {
                        doc: &[$($fdoc),*],
                        name: stringify!($f),
                        offset: ::core::mem::offset_of!($name, $f),
                        ty: <$ft as $crate::declare::CType>::C,
                    }
                ),*],
            }),
        ] $($rest)*);
    };

    (@munch [$($items:tt)*] $($rest:tt)*) => {
        compile_error!(concat!(
            "sluice-ebpf-abi: not a declaration abi! knows (a documented `pub const`, `pub mod` ",
            "of constants or `pub struct`, with `=> C_NAME`): ",
            stringify!($($rest)*)
        ));
    };

    ($($body:tt)*) => {
        abi!(@munch [] $($body)*);
    };
}
