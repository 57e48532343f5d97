//! Where a table's rows live in a Redis cluster: HPS's layout (HugeCTR 23.x-24.x,
//! `RedisClusterBackend`), so a cluster that HPS filled is read as it is.
//!
//! - A table is named by its HPS tag, `hps_et.<model>.<table>` (HPS's `make_tag_name`).
//! - Its rows are split into `num_partitions` partitions by HPS's key hash
//!   ([`partition_of`]: `rrxmrrxmsx_0(key) % num_partitions`).
//! - Partition `p` is one Redis hash, `hps_et{<tag>/p<p>}v`, whose fields are the keys as raw
//!   little-endian integers (8 bytes with `supportlonglong`, else 4) and whose values are the
//!   rows as raw little-endian float32 (`dim * 4` bytes).
//! - The overflow policy's metadata is a second hash, `hps_et{<tag>/p<p>}t`, with the same
//!   fields: the insertion or last-lookup time (8-byte `time_t`) for `evict_oldest`, a decimal
//!   use count (HINCRBY) for `evict_least_used`; none for `evict_random`.
//! - strata adds one key HPS does not have, `hps_et{<tag>/p<p>}g`: a counter every strata
//!   write increments before it touches the partition, so that a promotion that read the
//!   persistent tier before a write cannot put the older row back afterwards (see the tier's
//!   module docs). HPS ignores it.
//!
//! The braces make Redis hash only `<tag>/p<p>`, so a partition's three keys share one hash
//! slot, hence one node, and one `HMGET` per partition reads all its keys of a batch.

/// Redis Cluster's hash slots.
pub(crate) const SLOTS: usize = 16384;

/// HPS's key mixer (`rrxmrrxmsx_0`, Pelle Evensen's): spreads keys over partitions.
pub fn mix(mut x: u64) -> u64 {
    x ^= x.rotate_right(25) ^ x.rotate_right(50);
    x = x.wrapping_mul(0xA24B_AED4_963E_E407);
    x ^= x.rotate_right(24) ^ x.rotate_right(49);
    x = x.wrapping_mul(0x9FB2_1C65_1E98_DF25);
    x ^ (x >> 28)
}

/// The partition of `key` (a canonical 64-bit key pattern; 32-bit keys zero- or sign-extended
/// the same way HPS widened them to `uint64_t`).
pub fn partition_of(key: u64, num_partitions: usize) -> usize {
    (mix(key) % num_partitions as u64) as usize
}

/// HPS's tag of a table: `hps_et.<model>.<table>`.
pub fn tag(model: &str, table: &str) -> String {
    format!("hps_et.{model}.{table}")
}

/// The Redis key of partition `part` of the table tagged `tag`, with `suffix` `v` (rows), `t`
/// (overflow metadata) or `g` (strata's write counter).
pub fn hash_key(tag: &str, part: usize, suffix: char) -> String {
    format!("hps_et{{{tag}/p{part}}}{suffix}")
}

/// A key's bytes as a hash field: little-endian, `width` (8 or 4) bytes.
pub fn field(key: u64, width: usize) -> [u8; 8] {
    let b = key.to_le_bytes();
    let mut f = [0u8; 8];
    f[..width].copy_from_slice(&b[..width]);
    f
}

/// The key a hash field holds (`width` bytes, little-endian; 4-byte keys are zero-extended).
pub fn key_of(field: &[u8]) -> Option<u64> {
    match field.len() {
        8 => Some(u64::from_le_bytes(field.try_into().ok()?)),
        4 => Some(u64::from(u32::from_le_bytes(field.try_into().ok()?))),
        _ => None,
    }
}

/// The hash slot of a Redis key: CRC16 (XMODEM) of its hash tag (the text between the first
/// `{` and the next `}`, when not empty) or of the whole key, modulo [`SLOTS`].
pub fn slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&c| c == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&c| c == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16(hashed) % SLOTS as u16
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as Redis Cluster uses it.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_and_slots_agree_with_redis() {
        // The check value of CRC16/XMODEM, and slots Redis's CLUSTER KEYSLOT gives.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        // (tests/redis_cluster.rs checks more against a live server's CLUSTER KEYSLOT.)
    }

    #[test]
    fn a_partition_keys_share_a_slot() {
        let t = tag("wdl", "sparse_embedding0");
        assert_eq!(t, "hps_et.wdl.sparse_embedding0");
        assert_eq!(hash_key(&t, 3, 'v'), "hps_et{hps_et.wdl.sparse_embedding0/p3}v");
        for p in 0..64 {
            let s = slot(hash_key(&t, p, 'v').as_bytes());
            assert_eq!(s, slot(hash_key(&t, p, 't').as_bytes()));
            assert_eq!(s, slot(hash_key(&t, p, 'g').as_bytes()));
        }
    }

    #[test]
    fn fields_round_trip() {
        for k in [0u64, 1, u64::MAX, (-5i64) as u64] {
            assert_eq!(key_of(&field(k, 8)), Some(k));
        }
        assert_eq!(key_of(&field(7, 4)[..4]), Some(7));
        assert_eq!(key_of(&[1, 2, 3]), None);
    }

    #[test]
    fn partitions_match_hps() {
        // rrxmrrxmsx_0(0) == 0, and every key lands in range.
        assert_eq!(mix(0), 0);
        for k in 0..1000u64 {
            assert!(partition_of(k, 7) < 7);
        }
        // Keys spread over partitions.
        let mut counts = [0usize; 8];
        for k in 0..8000u64 {
            counts[partition_of(k, 8)] += 1;
        }
        assert!(counts.iter().all(|&c| c > 800), "{counts:?}");
    }
}
