//! Which rows a full shard gives up: the [`OverflowPolicy`] and the choice of its victims.

/// Which rows a full shard evicts: HPS's `volatile_db.overflow_policy`, also the parsed
/// configuration's value (`config::VolatileDbConfig::overflow_policy`). Deserialises from HPS's
/// names and its parser's aliases (`random`, `least_used`, `oldest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverflowPolicy {
    /// `"evict_random"` (HPS's default): uniformly random rows.
    #[serde(alias = "random")]
    EvictRandom,
    /// `"evict_least_used"`: the rows looked up the fewest times since they were inserted (an
    /// overwrite keeps the count); ties go to the oldest row.
    #[serde(alias = "least_used")]
    EvictLeastUsed,
    /// `"evict_oldest"`: the rows inserted or last overwritten earliest.
    #[serde(alias = "oldest")]
    EvictOldest,
}

impl OverflowPolicy {
    /// HPS's name for the policy.
    pub fn as_str(self) -> &'static str {
        match self {
            OverflowPolicy::EvictRandom => "evict_random",
            OverflowPolicy::EvictLeastUsed => "evict_least_used",
            OverflowPolicy::EvictOldest => "evict_oldest",
        }
    }
}

impl std::fmt::Display for OverflowPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl OverflowPolicy {
    /// The eviction rank of a row with insertion stamp `stamp` and lookup count `uses`: the
    /// policy evicts the lowest ranks first (0 for every row under
    /// [`OverflowPolicy::EvictRandom`]).
    #[inline]
    pub(super) fn rank(self, stamp: u32, uses: u16) -> u64 {
        match self {
            OverflowPolicy::EvictRandom => 0,
            OverflowPolicy::EvictOldest => stamp as u64,
            OverflowPolicy::EvictLeastUsed => ((uses as u64) << 32) | stamp as u64,
        }
    }

    /// Moves the `k` rows this policy evicts to the front of `cand`, the shard's live rows as
    /// (rank, key) pairs (`0 < k <= cand.len()`, ranks from [`OverflowPolicy::rank`]); the order
    /// of the rest is unspecified. `rng` draws for [`OverflowPolicy::EvictRandom`]. The ranks
    /// are computed once, before, so the selection compares plain integers.
    pub(super) fn choose_victims(self, cand: &mut [(u64, u64)], k: usize, rng: &mut SplitMix64) {
        match self {
            OverflowPolicy::EvictRandom => {
                // Partial Fisher-Yates: the first k candidates become a uniform sample.
                for i in 0..k {
                    let n = (cand.len() - i) as u64;
                    let j = i + ((rng.next() as u128 * n as u128) >> 64) as usize;
                    cand.swap(i, j);
                }
            }
            OverflowPolicy::EvictOldest | OverflowPolicy::EvictLeastUsed => {
                if k < cand.len() {
                    cand.select_nth_unstable_by_key(k - 1, |&(rank, _)| rank);
                }
            }
        }
    }
}

/// splitmix64: the per-shard generator behind [`OverflowPolicy::EvictRandom`] (small, fast, and
/// seeded per shard so a run is reproducible).
pub(super) struct SplitMix64(u64);

impl SplitMix64 {
    pub(super) fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}
