use super::map::KeyMap;
use super::*;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;

fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn random_rows(n: usize, dim: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n * dim).map(|_| (splitmix(&mut s) >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect()
}

fn random_keys(n: usize, seed: u64) -> Vec<u64> {
    let mut s = seed;
    let mut seen = HashSet::new();
    let mut keys = Vec::with_capacity(n);
    while keys.len() < n {
        let k = splitmix(&mut s);
        if seen.insert(k) {
            keys.push(k);
        }
    }
    keys
}

fn row(t: &VolatileTier, key: u64) -> Option<Vec<f32>> {
    let mut v = vec![0.0; t.dim()];
    t.get(key, &mut v).then_some(v)
}

fn shard_lens(t: &VolatileTier) -> Vec<usize> {
    t.shards.iter().map(|s| s.len.load(Relaxed)).collect()
}

#[test]
fn new_rejects_bad_parameters() {
    let p = OverflowPolicy::EvictRandom;
    let cases: [(Result<VolatileTier>, &str); 8] = [
        (VolatileTier::new(0, 1, 1, p, 0.5), "dim"),
        (VolatileTier::new(8, 0, 1, p, 0.5), "num_partitions"),
        (VolatileTier::new(8, MAX_PARTITIONS + 1, 1, p, 0.5), "num_partitions"),
        (VolatileTier::new(8, 1, 0, p, 0.5), "overflow_margin"),
        (VolatileTier::new(8, 1, 1, p, 0.0), "overflow_resolution_target"),
        (VolatileTier::new(8, 1, 1, p, -0.1), "overflow_resolution_target"),
        (VolatileTier::new(8, 1, 1, p, 1.5), "overflow_resolution_target"),
        (VolatileTier::new(8, 1, 1, p, f64::NAN), "overflow_resolution_target"),
    ];
    for (r, arg) in cases {
        let e = r.err().expect("bad parameter accepted");
        assert_eq!(e.kind(), crate::error::ErrorKind::InvalidArgument);
        assert!(e.to_string().starts_with(&format!("{arg}: ")), "{e}");
    }
    assert!(VolatileTier::new(8, 1, 1, p, 1.0).is_ok());
    assert!(VolatileTier::new(8, 1, usize::MAX, p, 0.8).is_ok());
    assert_eq!(OverflowPolicy::EvictLeastUsed.to_string(), "evict_least_used");
}

#[test]
fn get_after_insert_returns_exact_row() {
    let dim = 37;
    let t = VolatileTier::new(dim, 7, 100_000, OverflowPolicy::EvictOldest, 0.8).unwrap();
    let n = 20_000;
    let keys = random_keys(n, 1);
    let rows = random_rows(n, dim, 2);
    assert_eq!(t.insert_many(&keys, &rows), 0);
    assert_eq!(t.len(), n);
    for (i, &k) in keys.iter().enumerate() {
        assert_eq!(row(&t, k).unwrap(), &rows[i * dim..(i + 1) * dim]);
        assert!(t.contains(k));
    }
    let mut out = vec![f32::NAN; n * dim];
    let mut found = vec![false; n];
    assert_eq!(t.get_many(&keys, &mut out, &mut found), (n as u64, 0));
    assert!(found.iter().all(|&f| f));
    assert_eq!(out, rows);
    // Keys that share low or high bits, and the extremes.
    let special: Vec<u64> = (1..2000u64).map(|i| i << 40).chain([0, u64::MAX, 1, u64::MAX - 1]).collect();
    let srows = random_rows(special.len(), dim, 3);
    t.insert_many(&special, &srows);
    for (i, &k) in special.iter().enumerate() {
        assert_eq!(row(&t, k).unwrap(), &srows[i * dim..(i + 1) * dim]);
    }
}

#[test]
fn overwrite_replaces_row_and_last_duplicate_wins() {
    let dim = 16;
    let t = VolatileTier::new(dim, 4, 1000, OverflowPolicy::EvictRandom, 0.5).unwrap();
    let keys = random_keys(500, 4);
    let a = random_rows(500, dim, 5);
    let b = random_rows(500, dim, 6);
    t.insert_many(&keys, &a);
    t.insert_many(&keys[..250], &b[..250 * dim]);
    assert_eq!(t.len(), 500);
    for (i, &k) in keys.iter().enumerate() {
        let want = if i < 250 { &b[i * dim..(i + 1) * dim] } else { &a[i * dim..(i + 1) * dim] };
        assert_eq!(row(&t, k).unwrap(), want);
    }
    // One batch naming a key three times keeps the last row.
    let k = keys[400];
    let dup_keys = [k, keys[0], k, k];
    let dup_rows = random_rows(4, dim, 7);
    t.insert_many(&dup_keys, &dup_rows);
    assert_eq!(row(&t, k).unwrap(), &dup_rows[3 * dim..]);
    assert_eq!(row(&t, keys[0]).unwrap(), &dup_rows[dim..2 * dim]);
    let st = t.stats();
    assert_eq!((st.insertions, st.overwrites, st.rows), (500, 254, 500));
}

#[test]
fn erase_removes_rows_and_reuses_their_memory() {
    let dim = 8;
    let t = VolatileTier::new(dim, 3, 10_000, OverflowPolicy::EvictOldest, 0.8).unwrap();
    let keys = random_keys(3000, 8);
    let rows = random_rows(3000, dim, 9);
    t.insert_many(&keys, &rows);
    let slab = |t: &VolatileTier| t.shards.iter().map(|s| s.read().allocated).sum::<usize>();
    let slab_full = slab(&t);
    let mut gone: Vec<u64> = keys.iter().copied().step_by(2).collect();
    gone.push(12345); // absent
    gone.push(keys[0]); // named twice
    assert_eq!(t.erase_many(&gone), 1500);
    assert_eq!(t.len(), 1500);
    for (i, &k) in keys.iter().enumerate() {
        assert_eq!(t.contains(k), i % 2 == 1);
        if i % 2 == 1 {
            assert_eq!(row(&t, k).unwrap(), &rows[i * dim..(i + 1) * dim]);
        }
    }
    // Reinserting into freed slots needs no new row memory.
    let new_keys = random_keys(1500, 10).into_iter().map(|k| k | 1 << 63).collect::<Vec<_>>();
    let new_rows = random_rows(1500, dim, 11);
    t.insert_many(&new_keys, &new_rows);
    assert_eq!(slab(&t), slab_full);
    for (i, &k) in new_keys.iter().enumerate() {
        assert_eq!(row(&t, k).unwrap(), &new_rows[i * dim..(i + 1) * dim]);
    }
    assert_eq!(t.erase_many(&keys), 1500);
    assert_eq!(t.erase_many(&new_keys), 1500);
    assert!(t.is_empty());
    assert_eq!(t.stats().erasures, 4500);
}

#[test]
fn misses_are_counted() {
    let dim = 4;
    let t = VolatileTier::new(dim, 2, 100, OverflowPolicy::EvictLeastUsed, 0.5).unwrap();
    let mut v = [7.0f32; 4];
    assert!(!t.get(42, &mut v));
    assert_eq!(v, [7.0; 4], "a miss leaves dst alone");
    t.insert_many(&[1, 2, 3], &[1.0; 12]);
    let keys = [1, 5, 2, 6, 7, 3, 1];
    let mut out = vec![-1.0; keys.len() * dim];
    let mut found = vec![true; keys.len()];
    assert_eq!(t.get_many(&keys, &mut out, &mut found), (4, 3));
    assert_eq!(found, [true, false, true, false, false, true, true]);
    assert_eq!(&out[dim..2 * dim], &[-1.0; 4]);
    assert!(!t.contains(5));
    let st = t.stats();
    assert_eq!((st.hits, st.misses), (4, 4));
}

#[test]
fn least_used_evicts_the_unused() {
    let dim = 8;
    let t = VolatileTier::new(dim, 1, 100, OverflowPolicy::EvictLeastUsed, 0.5).unwrap();
    let keys = random_keys(101, 12);
    let rows = random_rows(101, dim, 13);
    assert_eq!(t.insert_many(&keys[..100], &rows[..100 * dim]), 0);
    // Look up a random half of the keys, each a different number of times.
    let mut s = 14u64;
    let mut used: Vec<usize> = (0..100).collect();
    for i in 0..100 {
        let j = i + (splitmix(&mut s) % (100 - i) as u64) as usize;
        used.swap(i, j);
    }
    used.truncate(50);
    let mut buf = vec![0.0; dim];
    for (n, &i) in used.iter().enumerate() {
        for _ in 0..=n % 5 {
            assert!(t.get(keys[i], &mut buf));
        }
    }
    assert_eq!(t.insert_many(&keys[100..], &rows[100 * dim..]), 50);
    assert_eq!(t.len(), 51);
    let used: HashSet<usize> = used.into_iter().collect();
    for i in 0..101 {
        let survives = used.contains(&i) || i == 100;
        assert_eq!(t.contains(keys[i]), survives, "key {i}");
        if survives {
            assert_eq!(row(&t, keys[i]).unwrap(), &rows[i * dim..(i + 1) * dim]);
        }
    }

    // Graded counts: key i looked up i times; resolving to 70 evicts keys 0..30.
    let t = VolatileTier::new(dim, 1, 100, OverflowPolicy::EvictLeastUsed, 0.7).unwrap();
    t.insert_many(&keys[..100], &rows[..100 * dim]);
    for (i, &k) in keys[..100].iter().enumerate() {
        let batch = vec![k; i];
        t.visit_many(&batch, |_, r| assert!(r.is_some()));
    }
    // An overwrite keeps the count: key 99 stays the most used.
    t.insert_many(&keys[99..100], &rows[..dim]);
    assert_eq!(t.insert_many(&keys[100..], &rows[100 * dim..]), 30);
    for (i, &k) in keys[..101].iter().enumerate() {
        assert_eq!(t.contains(k), i >= 30, "key {i}");
    }
}

#[test]
fn oldest_evicts_in_insertion_order() {
    let dim = 4;
    let t = VolatileTier::new(dim, 1, 100, OverflowPolicy::EvictOldest, 0.75).unwrap();
    let keys = random_keys(140, 15);
    let rows = random_rows(140, dim, 16);
    // Insert in four batches, then overwrite keys 0..10 (making them the newest) and
    // look the oldest up a lot (which Oldest must ignore).
    for c in 0..4 {
        t.insert_many(&keys[c * 25..(c + 1) * 25], &rows[c * 25 * dim..(c + 1) * 25 * dim]);
    }
    t.insert_many(&keys[..10], &rows[..10 * dim]);
    let mut buf = vec![0.0; dim];
    for _ in 0..10 {
        for &k in &keys[10..20] {
            assert!(t.get(k, &mut buf));
        }
    }
    // Full: the next new key evicts the 25 oldest (keys 10..35), then is inserted.
    assert_eq!(t.insert_many(&keys[100..101], &rows[100 * dim..101 * dim]), 25);
    for (i, &k) in keys[..101].iter().enumerate() {
        assert_eq!(t.contains(k), !(10..35).contains(&i), "key {i}");
    }
    assert_eq!(t.len(), 76);
    // 24 more fill it again; the 25th evicts keys 35..60.
    assert_eq!(t.insert_many(&keys[101..125], &rows[101 * dim..125 * dim]), 0);
    assert_eq!(t.insert_many(&keys[125..126], &rows[125 * dim..126 * dim]), 25);
    for (i, &k) in keys[..126].iter().enumerate() {
        assert_eq!(t.contains(k), !(10..60).contains(&i), "key {i}");
    }
}

#[test]
fn random_evicts_the_right_count_and_keeps_survivors_intact() {
    let dim = 12;
    let n = 1000;
    let t = VolatileTier::new(dim, 1, n, OverflowPolicy::EvictRandom, 0.6).unwrap();
    let keys = random_keys(n + 1, 17);
    let rows = random_rows(n + 1, dim, 18);
    assert_eq!(t.insert_many(&keys[..n], &rows[..n * dim]), 0);
    assert_eq!(t.insert_many(&keys[n..], &rows[n * dim..]), 400);
    assert_eq!(t.len(), 601);
    assert!(t.contains(keys[n]), "the row being inserted survives");
    let mut evicted_early = 0;
    let mut evicted_late = 0;
    for i in 0..=n {
        match row(&t, keys[i]) {
            Some(r) => assert_eq!(r, &rows[i * dim..(i + 1) * dim]),
            None if i < n / 2 => evicted_early += 1,
            None => evicted_late += 1,
        }
    }
    assert_eq!(evicted_early + evicted_late, 400);
    // Uniform over insertion order: both halves lose about 200 (far from 0 or 400).
    assert!((120..=280).contains(&evicted_early), "{evicted_early} of the first half evicted");
    assert_eq!(t.stats().evictions, 400);
}

#[test]
fn eviction_resolves_down_to_the_target() {
    for (np, margin, target, policy) in [
        (4, 50, 0.6, OverflowPolicy::EvictRandom),
        (3, 10, 1.0, OverflowPolicy::EvictOldest),
        (2, 10, 0.3, OverflowPolicy::EvictLeastUsed),
        (1, 1, 0.5, OverflowPolicy::EvictOldest),
        (5, 7, 0.99, OverflowPolicy::EvictRandom),
    ] {
        let dim = 3;
        let t = VolatileTier::new(dim, np, margin, policy, target).unwrap();
        let resolve_to = ((target * margin as f64).floor() as usize).min(margin - 1);
        let keys = random_keys(500, 19);
        let rows = random_rows(500, dim, 20);
        let mut total = 0;
        for i in 0..500 {
            let before = shard_lens(&t);
            let ev = t.insert_many(&keys[i..i + 1], &rows[i * dim..(i + 1) * dim]);
            let after = shard_lens(&t);
            let s = t.shard_of(keys[i]);
            if before[s] == margin {
                assert_eq!(ev as usize, margin - resolve_to);
                assert_eq!(after[s], resolve_to + 1);
            } else {
                assert_eq!(ev, 0);
                assert_eq!(after[s], before[s] + 1);
            }
            assert!(after.iter().all(|&l| l <= margin));
            assert!(t.contains(keys[i]));
            total += ev;
        }
        let st = t.stats();
        assert_eq!(st.evictions, total);
        assert_eq!(st.insertions - st.evictions, t.len() as u64);
        // A batch larger than the whole tier also stays within bounds.
        let big = random_keys(2000, 21);
        t.insert_many(&big, &random_rows(2000, dim, 22));
        assert!(shard_lens(&t).iter().all(|&l| l <= margin));
        let st = t.stats();
        assert_eq!(st.insertions - st.evictions, t.len() as u64);
    }
}

#[test]
fn stats_are_exact() {
    let dim = 5;
    let t = VolatileTier::new(dim, 4, 1000, OverflowPolicy::EvictOldest, 0.8).unwrap();
    assert_eq!(t.stats(), VolatileStats { bytes: t.bytes() as u64, ..Default::default() });
    let keys: Vec<u64> = (0..200).collect();
    let rows = random_rows(200, dim, 23);
    t.insert_many(&keys[..100], &rows[..100 * dim]);
    t.insert_many(&keys[50..150], &rows[50 * dim..150 * dim]);
    let mut out = vec![0.0; 200 * dim];
    let mut found = vec![false; 200];
    assert_eq!(t.get_many(&keys, &mut out, &mut found), (150, 50));
    let mut buf = vec![0.0; dim];
    assert!(!t.get(999, &mut buf));
    assert!(t.get(0, &mut buf));
    assert_eq!(t.erase_many(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 500]), 10);
    assert!(t.contains(10));
    let st = t.stats();
    assert_eq!(
        st,
        VolatileStats {
            hits: 151,
            misses: 51,
            insertions: 150,
            overwrites: 50,
            erasures: 10,
            evictions: 0,
            rows: 140,
            bytes: t.bytes() as u64,
        }
    );
}

/// Fills 4 shards x 10,000 rows of 128 floats and checks the memory held against the
/// raw vectors (rows * 512 bytes), at full capacity, half full, and after heavy churn.
#[test]
fn bytes_within_1_25x_raw_at_capacity_dim128() {
    let dim = 128;
    let (np, margin) = (4, 10_000);
    let raw = |rows: usize| (rows * dim * 4) as f64;
    let t = VolatileTier::new(dim, np, margin, OverflowPolicy::EvictOldest, 1.0).unwrap();
    let mut s = 24u64;
    let batch = 4096;
    let mut keys = vec![0u64; batch];
    let mut rows = vec![0f32; batch * dim];
    let mut half_ratio = None;
    while t.len() < np * margin {
        for k in keys.iter_mut() {
            *k = splitmix(&mut s);
        }
        for (i, r) in rows.chunks_mut(dim).enumerate() {
            r.fill(i as f32);
        }
        t.insert_many(&keys, &rows);
        if half_ratio.is_none() && t.len() >= np * margin / 2 {
            half_ratio = Some(t.bytes() as f64 / raw(t.len()));
        }
    }
    let full = t.bytes() as f64 / raw(t.len());
    let half = half_ratio.unwrap();
    eprintln!("volatile tier, dim 128: bytes/raw {full:.4} full, {half:.4} half full");
    assert!(full <= 1.25, "{full}");
    assert!(half <= 1.25, "{half}");

    // Churn with a resolution target below 1: memory stays bounded by the capacity.
    let t = VolatileTier::new(dim, np, margin, OverflowPolicy::EvictLeastUsed, 0.8).unwrap();
    for _ in 0..30 {
        for k in keys.iter_mut() {
            *k = splitmix(&mut s);
        }
        t.insert_many(&keys, &rows);
    }
    let churn = t.bytes() as f64 / raw(np * margin);
    eprintln!("after churn: bytes/raw-at-capacity {churn:.4}, {} rows", t.len());
    assert!(churn <= 1.25, "{churn}");
}

#[test]
fn key_map_matches_a_model_under_random_inserts_and_removes() {
    // Maps bounded by the universe (table sizes 16, 63 and 1250: probe runs wrap at sizes that
    // are not powers of two) and an unbounded one.
    for (universe, max_rows) in [(8u64, 8), (50, 50), (1000, 1000), (1000, usize::MAX)] {
        let mut table = KeyMap::new(max_rows);
        let mut model: HashMap<u64, u32> = HashMap::new();
        let mut s = universe;
        let mut next_slot = 0u32;
        for _ in 0..20_000 {
            // Keys sharing their low bits so probe runs wrap and interleave.
            let key = (splitmix(&mut s) % universe) << 48 | 7;
            let h = mix(key);
            if splitmix(&mut s).is_multiple_of(3) {
                assert_eq!(table.remove(key, h), model.remove(&key));
            } else if let std::collections::hash_map::Entry::Vacant(e) = model.entry(key) {
                assert!(table.reserve_one());
                table.insert_new(key, h, next_slot);
                e.insert(next_slot);
                next_slot += 1;
            }
            assert_eq!(table.len(), model.len());
            assert!(table.len() <= table.capacity());
            let probe = (splitmix(&mut s) % (universe + 2)) << 48 | 7;
            assert_eq!(table.find(probe, mix(probe)), model.get(&probe).copied());
        }
        for (&k, &v) in &model {
            assert_eq!(table.find(k, mix(k)), Some(v));
        }
        let mut listed: Vec<(u64, u32)> = table.iter().collect();
        let mut want: Vec<(u64, u32)> = model.iter().map(|(&k, &v)| (k, v)).collect();
        listed.sort_unstable();
        want.sort_unstable();
        assert_eq!(listed, want, "iter lists exactly the keys held");
        if max_rows != usize::MAX {
            assert!(table.bytes() <= (max_rows * 5).div_ceil(4).max(16) * 12, "the map outgrew its shard");
        }
    }
}

/// A map that removes and inserts keys at a steady size keeps its size (a table that leaves
/// tombstones behind could fill up with them and double).
#[test]
fn key_map_keeps_its_size_under_churn() {
    let mut table = KeyMap::new(usize::MAX);
    let mut live = std::collections::VecDeque::new();
    let mut s = 26u64;
    let mut slot = 0u32;
    let mut insert = |table: &mut KeyMap, live: &mut std::collections::VecDeque<u64>| {
        let key = splitmix(&mut s);
        assert!(table.reserve_one());
        table.insert_new(key, mix(key), slot);
        live.push_back(key);
        slot += 1;
    };
    for _ in 0..100_000 {
        insert(&mut table, &mut live);
    }
    let full = table.bytes();
    for _ in 0..1_000_000 {
        let key = live.pop_front().unwrap();
        assert!(table.remove(key, mix(key)).is_some());
        insert(&mut table, &mut live);
    }
    assert_eq!(table.len(), 100_000);
    assert_eq!(table.bytes(), full);
    for (i, &k) in live.iter().enumerate() {
        assert_eq!(table.find(k, mix(k)), Some(1_000_000 + i as u32));
    }
}

#[test]
fn tier_matches_a_model_under_random_operations() {
    let dim = 6;
    let t = VolatileTier::new(dim, 3, 1 << 20, OverflowPolicy::EvictRandom, 0.5).unwrap();
    let mut model: HashMap<u64, Vec<f32>> = HashMap::new();
    let mut s = 25u64;
    for round in 0..400 {
        let n = (splitmix(&mut s) % 64) as usize;
        let keys: Vec<u64> = (0..n).map(|_| splitmix(&mut s) % 3000).collect();
        if splitmix(&mut s).is_multiple_of(3) {
            let expect = keys.iter().collect::<HashSet<_>>().iter().filter(|k| model.contains_key(k)).count();
            assert_eq!(t.erase_many(&keys) as usize, expect);
            for k in &keys {
                model.remove(k);
            }
        } else {
            let rows = random_rows(n, dim, round);
            assert_eq!(t.insert_many(&keys, &rows), 0);
            for (i, &k) in keys.iter().enumerate() {
                model.insert(k, rows[i * dim..(i + 1) * dim].to_vec());
            }
        }
        assert_eq!(t.len(), model.len());
    }
    for k in 0..3000u64 {
        assert_eq!(row(&t, k).as_ref(), model.get(&k));
    }
}

/// 4 readers and 2 writers on a small, constantly evicting tier. Every element of a row
/// encodes (key, version, position) in its bits; a reader must never see a row mixing
/// versions or keys.
#[test]
fn concurrent_reads_never_see_torn_rows() {
    const DIM: usize = 64;
    const KEYS: u64 = 256;
    let (np, margin) = (4, 40);
    let t = VolatileTier::new(DIM, np, margin, OverflowPolicy::EvictRandom, 0.75).unwrap();
    // Bits 22..30: key (< 256, so never an inf or NaN pattern); 6..22: version; 0..6: j.
    let encode = |key: u64, v: u32, j: usize| f32::from_bits((key as u32) << 22 | (v & 0xffff) << 6 | j as u32);
    let check = |key: u64, r: &[f32]| {
        let v0 = (r[0].to_bits() >> 6) & 0xffff;
        for (j, x) in r.iter().enumerate() {
            let b = x.to_bits();
            assert_eq!(b >> 22, key as u32, "row of key {key} holds another key's element at {j}");
            assert_eq!((b >> 6) & 0xffff, v0, "torn row for key {key}: element {j}");
            assert_eq!(b & 63, j as u32);
        }
    };
    let stop = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let found = AtomicU64::new(0);
    std::thread::scope(|sc| {
        for r in 0..4u64 {
            let (t, stop, reads, found) = (&t, &stop, &reads, &found);
            sc.spawn(move || {
                let mut s = 100 + r;
                let mut buf = vec![0.0; DIM];
                let mut out = vec![0.0; 8 * DIM];
                let mut hit = vec![false; 8];
                while !stop.load(Relaxed) {
                    let key = splitmix(&mut s) % KEYS;
                    if t.get(key, &mut buf) {
                        check(key, &buf);
                        found.fetch_add(1, Relaxed);
                    }
                    let keys: Vec<u64> = (0..8).map(|_| splitmix(&mut s) % KEYS).collect();
                    t.get_many(&keys, &mut out, &mut hit);
                    for (i, &k) in keys.iter().enumerate() {
                        if hit[i] {
                            check(k, &out[i * DIM..(i + 1) * DIM]);
                        }
                    }
                    assert!(t.len() <= np * margin);
                    reads.fetch_add(9, Relaxed);
                }
            });
        }
        let writers: Vec<_> = (0..2u32)
            .map(|w| {
                let t = &t;
                sc.spawn(move || {
                    let mut s = 200 + w as u64;
                    for it in 0..3000u32 {
                        let v = it * 2 + w;
                        let keys: Vec<u64> = (0..16).map(|_| splitmix(&mut s) % KEYS).collect();
                        if it % 10 == 9 {
                            t.erase_many(&keys[..4]);
                            continue;
                        }
                        let rows: Vec<f32> = keys.iter().flat_map(|&k| (0..DIM).map(move |j| encode(k, v, j))).collect();
                        t.insert_many(&keys, &rows);
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, Relaxed);
    });
    assert!(reads.load(Relaxed) > 0 && found.load(Relaxed) > 0);
    let held = (0..KEYS).filter(|&k| t.contains(k)).count();
    assert_eq!(t.len(), held);
    assert!(held <= np * margin);
    let st = t.stats();
    assert_eq!(st.insertions - st.evictions - st.erasures, held as u64);
    for k in 0..KEYS {
        if let Some(r) = row(&t, k) {
            check(k, &r);
        }
    }
}

#[test]
fn clear_empties_every_shard_and_the_tier_keeps_working() {
    let t = VolatileTier::new(4, 4, 1000, OverflowPolicy::EvictOldest, 0.8).unwrap();
    let keys = random_keys(300, 7);
    let rows = random_rows(300, 4, 8);
    t.insert_many(&keys, &rows);
    let held = t.bytes();
    assert_eq!(t.clear(), 300);
    assert!(t.is_empty());
    assert!(t.bytes() < held, "clear gives the row memory back");
    assert!(keys.iter().all(|&k| !t.contains(k)));
    assert_eq!(t.stats().erasures, 300);
    t.insert_many(&keys[..10], &rows[..40]);
    assert_eq!(row(&t, keys[3]).unwrap(), rows[12..16].to_vec());
    assert_eq!(t.len(), 10);
    assert_eq!(t.clear(), 10);
}

/// The benchmark's shape at a smaller size: 32-float rows, 4 shards, evict_least_used down to
/// 0.9. Memory against the raw vectors at capacity, at 94% of it (where the tiered benchmark
/// reads it, between evictions) and after churn.
#[test]
fn bytes_within_1_25x_raw_at_dim32() {
    let dim = 32;
    let (np, margin) = (4, 50_000);
    let raw = |rows: usize| (rows * dim * 4) as f64;
    let t = VolatileTier::new(dim, np, margin, OverflowPolicy::EvictLeastUsed, 0.9).unwrap();
    let mut s = 27u64;
    let batch = 1000;
    let mut keys = vec![0u64; batch];
    let rows = random_rows(batch, dim, 28);
    let mut at_94 = None;
    while t.len() < np * margin * 99 / 100 {
        for k in keys.iter_mut() {
            *k = splitmix(&mut s);
        }
        t.insert_many(&keys, &rows);
        if at_94.is_none() && t.len() >= np * margin * 94 / 100 {
            at_94 = Some(t.bytes() as f64 / raw(t.len()));
        }
    }
    let full = t.bytes() as f64 / raw(np * margin);
    let at_94 = at_94.unwrap();
    eprintln!("volatile tier, dim 32: bytes/raw {full:.4} at capacity, {at_94:.4} at 94%");
    assert!(full <= 1.25, "{full}");
    assert!(at_94 <= 1.25, "{at_94}");
    for _ in 0..100 {
        for k in keys.iter_mut() {
            *k = splitmix(&mut s);
        }
        t.insert_many(&keys, &rows);
    }
    assert!(t.stats().evictions > 0);
    let churn = t.bytes() as f64 / raw(np * margin);
    eprintln!("after churn: bytes/raw-at-capacity {churn:.4}, {} rows", t.len());
    assert!(churn <= 1.25, "{churn}");
}

/// The insertion stamps are 32-bit: when they run out they are renumbered in order, and
/// evict_oldest keeps evicting in insertion order across that.
#[test]
fn oldest_order_survives_stamp_renumbering() {
    let dim = 2;
    let t = VolatileTier::new(dim, 1, 20, OverflowPolicy::EvictOldest, 0.5).unwrap();
    t.shards[0].write().set_next_stamp(u32::MAX - 7);
    let keys = random_keys(30, 29);
    let rows = random_rows(30, dim, 30);
    for i in 0..20 {
        // One key at a time, so the stamps run out in the middle (after key 6).
        t.insert_many(&keys[i..i + 1], &rows[i * dim..(i + 1) * dim]);
    }
    // Overwriting key 0 makes it the newest.
    t.insert_many(&keys[..1], &rows[..dim]);
    assert_eq!(t.insert_many(&keys[20..21], &rows[20 * dim..21 * dim]), 10);
    for (i, &k) in keys[..21].iter().enumerate() {
        assert_eq!(t.contains(k), i == 0 || i >= 11, "key {i}");
    }
}

/// A row's lookup count saturates instead of wrapping: a row looked up 70,000 times stays the
/// most used.
#[test]
fn use_counts_saturate() {
    let dim = 2;
    let t = VolatileTier::new(dim, 1, 10, OverflowPolicy::EvictLeastUsed, 0.5).unwrap();
    let keys = random_keys(11, 31);
    let rows = random_rows(11, dim, 32);
    t.insert_many(&keys[..10], &rows[..10 * dim]);
    t.visit_many(&vec![keys[3]; 70_000], |_, r| assert!(r.is_some()));
    for &k in &keys[..10] {
        if k != keys[3] {
            t.visit_many(&[k, k], |_, r| assert!(r.is_some()));
        }
    }
    assert_eq!(t.insert_many(&keys[10..], &rows[10 * dim..]), 5);
    assert!(t.contains(keys[3]), "the most used row was evicted (its count wrapped)");
}

/// A tier stored as int8, int4 or float16: rows come back as the format holds them (the
/// reference: quantize, then the scalar value), through `get` and `get_many`, after inserts and
/// overwrites; a row the format cannot hold is not cached and takes its key's older row with
/// it; the slab holds each row in its format's bytes (int8 at dim 64: 72 of float32's 256).
#[test]
fn a_quantized_tier_holds_its_format_and_serves_the_reference() {
    use crate::kernels::{format::value, quantize_row};
    let dim = 64;
    let n = 2000;
    let keys = random_keys(n, 11);
    let rows = random_rows(n, dim, 12);
    let f32_tier = VolatileTier::new(dim, 1, n, OverflowPolicy::EvictRandom, 0.8).unwrap();
    f32_tier.insert_many(&keys, &rows);
    for format in [RowFormat::Int8, RowFormat::Int4, RowFormat::Float(FloatDtype::F16)] {
        let t = VolatileTier::stored_as(format, dim, 1, n, OverflowPolicy::EvictRandom, 0.8).unwrap();
        assert_eq!(t.format(), format);
        t.insert_many(&keys, &rows);
        let reference = |row: &[f32]| {
            let mut q = vec![0u8; format.row_bytes(dim)];
            quantize_row(format, row, &mut q).unwrap();
            // SAFETY: q holds one row of `format`, read unaligned; c < dim.
            (0..dim).map(|c| unsafe { value(format, q.as_ptr(), dim, c) }.to_bits()).collect::<Vec<u32>>()
        };
        let mut out = vec![f32::NAN; n * dim];
        let mut found = vec![false; n];
        assert_eq!(t.get_many(&keys, &mut out, &mut found), (n as u64, 0));
        for i in (0..n).step_by(37) {
            let want = reference(&rows[i * dim..(i + 1) * dim]);
            assert_eq!(out[i * dim..(i + 1) * dim].iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want, "{format:?} row {i}");
            let one = row(&t, keys[i]).unwrap();
            assert_eq!(one.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
        }
        // Overwrites, and a row the format cannot hold.
        let new: Vec<f32> = (0..dim).map(|c| c as f32 - 7.5).collect();
        t.insert_many(&keys[..1], &new);
        assert_eq!(row(&t, keys[0]).unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>(), reference(&new));
        if format.is_quantized() {
            let mut bad = new.clone();
            bad[3] = f32::INFINITY;
            t.insert_many(&keys[..1], &bad);
            assert!(row(&t, keys[0]).is_none(), "{format:?}: the older row went with the refused one");
        }
        let (q, f) = (t.bytes() as f64, f32_tier.bytes() as f64);
        let slab = format.row_bytes(dim).div_ceil(4) as f64 * 4.0 / (dim * 4) as f64;
        assert!(q < f * (slab + 0.12), "{format:?}: {q} bytes against float32's {f}");
    }
    assert!(VolatileTier::stored_as(RowFormat::Int4, 5, 1, 10, OverflowPolicy::EvictRandom, 0.8).is_err());
}
