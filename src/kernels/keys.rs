//! Scans over a lookup's keys that run once per key before any row is touched.
//! Threading: plain functions on the caller's thread.

use super::Isa;

/// How many of `keys` are `bound` or more (the keys past a dense store of `bound` rows: its
/// misses), with the widest compare the chosen instruction set ([`super::isa`]) has; the
/// baseline's SSE2 has no unsigned 64-bit compare and took about 3 instructions a key.
pub fn count_at_least(keys: &[u64], bound: u64) -> usize {
    count_at_least_on(super::isa(), keys, bound)
}

/// [`count_at_least`] on instruction set `isa` (the tests run each).
pub fn count_at_least_on(isa: Isa, keys: &[u64], bound: u64) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f")]
        fn avx512(keys: &[u64], bound: u64) -> usize {
            plain(keys, bound)
        }
        #[target_feature(enable = "avx2")]
        fn avx2(keys: &[u64], bound: u64) -> usize {
            plain(keys, bound)
        }
        match isa {
            // SAFETY: `isa` is at most what the CPU has (Isa::detected and Isa::available never
            // name a set the CPU lacks), so the target features are present.
            Isa::Avx512 => return unsafe { avx512(keys, bound) },
            // SAFETY: as above.
            Isa::Avx2 => return unsafe { avx2(keys, bound) },
            Isa::Portable => {}
        }
    }
    plain(keys, bound)
}

/// The loop each instruction set's copy compiles (a sum of compares, which LLVM vectorises).
#[inline(always)]
fn plain(keys: &[u64], bound: u64) -> usize {
    keys.iter().map(|&k| (k >= bound) as usize).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_keys_at_or_past_the_bound_on_every_isa() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for n in [0usize, 1, 3, 7, 8, 15, 16, 17, 31, 64, 1000, 4099] {
            let keys: Vec<u64> = (0..n)
                .map(|i| match i % 5 {
                    0 => next(),            // mostly far past any bound, top bit set or not
                    1 => next() % 2000,     // around the bound
                    2 => 1999 + next() % 3, // at the bound's edge
                    3 => u64::MAX - next() % 2,
                    _ => next() % 1000,
                })
                .collect();
            for bound in [0u64, 1, 1000, 2000, 1 << 63, u64::MAX] {
                let want = keys.iter().filter(|&&k| k >= bound).count();
                for isa in Isa::available() {
                    assert_eq!(count_at_least_on(isa, &keys, bound), want, "{isa:?} n {n} bound {bound}");
                }
            }
        }
    }
}
