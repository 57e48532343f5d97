//! The key hash every keyed structure of strata shares.

/// Mixes a key into a well-distributed 64-bit hash (the MurmurHash3 finaliser).
#[inline(always)]
pub(crate) fn mix(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}
