//! The cases every rank runs under mpirun. Each compares a distributed table with a
//! single-process table of the same data, or checks that an error on one rank (or a mismatch
//! between ranks) fails the call on every rank with the status and message expected.

use crate::common::*;
use crate::desc::{Split, at};
use crate::pooled;
use crate::quantized;
use dlpark::ffi::DLDataType;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};
use std::ffi::CString;
use std::ptr::{null, null_mut};

pub struct Ctx {
    pub rank: i32,
    pub size: i32,
    /// MPI_COMM_WORLD as an MPI_Fint, what a C or mpi4py host passes.
    pub fint: i32,
    pub(crate) world: SimpleCommunicator,
}

impl Ctx {
    pub(crate) fn last(&self) -> i32 {
        self.size - 1
    }

    /// Every rank's `v`, in rank order (an all-gather over the world).
    pub(crate) fn gather(&self, v: i32) -> Vec<i32> {
        use mpi::traits::*;
        let mut all = vec![0i32; self.size as usize];
        self.world.all_gather_into(&v, &mut all[..]);
        all
    }
}

type Case = (&'static str, fn(&Ctx));

pub fn run() {
    let universe = mpi::initialize().expect("MPI_Init");
    let world = universe.world();
    // SAFETY: MPI is initialised.
    let fint = unsafe { mpi::ffi::MPI_Comm_c2f(mpi::ffi::RSMPI_COMM_WORLD) };
    let cx = Ctx { rank: world.rank(), size: world.size(), fint, world };
    assert_eq!(strata_mpi_available(), 1);
    let cases: &[Case] = &[
        ("dense split 7/7/7/6, every key and out dtype, misses and stats", dense_uneven_rows),
        ("large (streamed) and column-strided outputs, repeated calls of varying sizes", large_and_strided),
        ("replicated partitions: tiling (1, 1) on every rank, (2, 1) on two ranks each", replicated),
        ("zero copy both ways, produce -> consume; strided columns are copied", zero_copy),
        ("STRATA_MISSING_ERROR on one rank fails every rank", missing_error),
        ("a bad lookup input on one rank fails every rank", bad_lookup_input),
        ("an invalid description on one rank fails every rank", invalid_description),
        ("descriptions that differ between ranks fail every rank", mismatches),
        ("a handle that is not a communicator", bad_comm),
        ("HugeCTR folder shared over ranks by key hash", hugectr_shares),
        ("HugeCTR errors on one rank fail every rank", hugectr_errors),
        ("Heat's replicated form: owners are the union of what the ranks say", heat_replicated),
        ("owners named by one rank but holding no data fail every rank", union_errors),
        (
            "pooled lookups equal a plain loop: every pooling, weights, ragged and fixed bags, dtypes, strided out",
            pooled::pooled_matches_a_loop,
        ),
        ("pooled: STRATA_MISSING_ERROR on one rank fails every rank, nothing written", pooled::pooled_missing_error),
        ("pooled: bad offsets, weights, pooling or out on one rank fail every rank", pooled::pooled_bad_input),
        ("batch of distributed and local tables, plain and pooled, equals separate calls", pooled::batch_mixed),
        ("batch: an invalid request or a missing key on one rank fails every rank, naming it", pooled::batch_errors),
        ("batch: a rank that cannot read its requests or the distributed request's table fails every rank", pooled::batch_unreadable),
        ("one field of one rank's arguments corrupted at random: every rank fails, naming the rank", pooled::one_rank_one_field),
        ("quantized rows (int8, int4, fp8): plain and pooled lookups equal a single-process table", quantized::dense_quantized),
        ("quantized rows: a batch equals the single-process tables", quantized::batch_quantized),
        ("quantized rows travel quantized: fewer bytes sent", quantized::fewer_bytes_on_the_wire),
        ("quantized rows from a HugeCTR folder, keys hashed over ranks", quantized::hugectr_quantized),
        ("quantized rows: missing keys, storages that differ or cannot be held fail every rank", quantized::quantized_errors),
    ];
    for (name, case) in cases {
        case(&cx);
        cx.world.barrier();
        if cx.rank == 0 {
            println!("  [{} ranks] {name}: ok", cx.size);
        }
    }
    // A table freed after the host finalised MPI leaves the released communicator alone.
    let global = random_values(F32, 8, 18);
    let mut d = Split::new(&global, F32, 2, &[4], &[(0..cx.size).collect()], cx.rank);
    let late = dist(d.c(), &cx, &TableOptions::default());
    drop(universe); // MPI_Finalize
    drop(late);
    let mut t = null_mut();
    // SAFETY: d.c() points at a description whose pointers point into arrays d owns and at global,
    // both alive past the call; strata finds MPI finalised before it reads them. cx.fint is an i32
    // and t a reference.
    let s = unsafe { strata_table_from_partitioned(d.c(), &cx.fint, null(), &mut t) };
    fails(s, Status::STRATA_INVALID_ARGUMENT, &["comm: MPI is already finalised"]);
    if cx.rank == 0 {
        println!("  [{} ranks] a table freed after MPI_Finalize: ok", cx.size);
    }
}

/// Random values of `dtype` (`n` of them, the same on every rank for one seed).
pub(crate) fn random_values(dtype: DLDataType, n: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    let e = elem_size(dtype);
    let mut b = vec![0u8; n * e];
    for i in 0..n {
        write_float(dtype, &mut b[i * e..], rng.f32());
    }
    b
}

/// A distributed table over `cx`'s world from `d`, which must be a valid description (every
/// caller passes `Split::c` of a live `Split`, or one strata produced and has not freed).
pub(crate) fn dist(d: *const Partitioned, cx: &Ctx, opts: &TableOptions) -> Owned {
    let mut t = null_mut();
    // SAFETY: d is a valid description for the call (the promise of every caller, above); cx.fint
    // is the world communicator's Fortran handle; opts and t are references.
    ok(unsafe { strata_table_from_partitioned(d, &cx.fint, opts, &mut t) });
    Owned(t)
}

/// A single-process dense table over a copy of `global` ([rows, dim] of `dtype`).
pub(crate) fn reference(global: &[u8], dtype: DLDataType, rows: usize, dim: usize, opts: &TableOptions) -> Owned {
    let v = Desc::compact(global.as_ptr(), dtype, &[rows as i64, dim as i64]);
    let mut t = null_mut();
    // SAFETY: v describes global ([rows, dim] of dtype, compact), alive past the call, which copies
    // it; opts and t are references.
    ok(unsafe { strata_table_from_dlpack(&v.t, null(), opts, &mut t) });
    Owned(t)
}

/// Looks up `keys` (as `kdt`, shaped `shape`) into an `odt` output poisoned with NaN; returns
/// the status, the output read as f32, and the stats.
pub(crate) fn look(
    t: &Owned,
    keys: &[i64],
    kdt: DLDataType,
    shape: &[i64],
    odt: DLDataType,
    dim: usize,
) -> (Status, Vec<f32>, LookupStats) {
    let (ke, oe) = (elem_size(kdt), elem_size(odt));
    let mut kb = vec![0u8; keys.len() * ke];
    for (i, &k) in keys.iter().enumerate() {
        write_key(kdt, &mut kb[i * ke..], k);
    }
    let mut ob = vec![0u8; keys.len() * dim * oe];
    for i in 0..keys.len() * dim {
        write_float(odt, &mut ob[i * oe..], f32::NAN);
    }
    let k = Desc::compact(kb.as_ptr(), kdt, shape);
    let mut oshape = shape.to_vec();
    oshape.push(dim as i64);
    let mut o = Desc::compact(ob.as_mut_ptr(), odt, &oshape);
    let mut st = LookupStats::default();
    // SAFETY: t.0 is a live table (Owned); k and o describe kb and ob (keys.len() keys, and as many
    // rows of dim elements of odt), alive past the call; st is a reference.
    let s = unsafe { strata_lookup(t.0, &k.t, &mut o.t, null(), &mut st) };
    (s, (0..keys.len() * dim).map(|i| read_float(odt, &ob[i * oe..])).collect(), st)
}

/// Asserts the distributed and the reference table give bit-identical rows and equal stats.
#[track_caller]
pub(crate) fn same_as_reference(t: &Owned, r: &Owned, keys: &[i64], kdt: DLDataType, shape: &[i64], odt: DLDataType, dim: usize) {
    let (s1, v1, st1) = look(t, keys, kdt, shape, odt, dim);
    ok(s1);
    let (s2, v2, st2) = look(r, keys, kdt, shape, odt, dim);
    ok(s2);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&v1), bits(&v2), "keys {keys:?} as {kdt:?} into {odt:?}");
    assert_eq!((st1.hits, st1.misses), (st2.hits, st2.misses));
}

/// Asserts a collective call failed on this rank with `want`: the culprit rank (if one) with
/// its own message, the others with `rank R failed the collective call: ` and that message.
#[track_caller]
pub(crate) fn all_fail(cx: &Ctx, s: Status, want: Status, culprit: Option<i32>, needles: &[&str]) {
    let msg = fails(s, want, needles);
    match culprit {
        Some(r) if r != cx.rank => {
            assert!(msg.starts_with(&format!("rank {r} failed the collective call: ")), "rank {}: {msg}", cx.rank)
        }
        _ => assert!(!msg.contains("failed the collective call"), "rank {}: {msg}", cx.rank),
    }
}

/// Plain lookups of random keys of a [27, dim] table (some missing), every key and out dtype,
/// 1-D and 2-D keys, then a large call: `t` and the reference `r` give the same rows and stats.
pub(crate) fn plain_as_reference(cx: &Ctx, t: &Owned, r: &Owned, dim: usize, rng: &mut Rng) {
    for (i, kdt) in [I32, I64, U32, U64].into_iter().enumerate() {
        for odt in [F32, F16, BF16] {
            // rank 1 sometimes has no keys: it still takes part in the exchanges
            let m = if cx.rank == 1 && i == 2 { 0 } else { 1 + rng.below(150) as usize };
            let keys: Vec<i64> = (0..2 * m).map(|_| rng.below(34) as i64 - 3).collect();
            let shape = if i % 2 == 0 { vec![2 * m as i64] } else { vec![2, m as i64] };
            same_as_reference(t, r, &keys, kdt, &shape, odt, dim);
        }
    }
    // enough keys for the writers to run on several threads
    let keys: Vec<i64> = (0..20_000).map(|_| rng.below(30) as i64).collect();
    same_as_reference(t, r, &keys, I64, &[100, 200], F32, dim);
}

pub(crate) fn split_owners(parts: usize, size: i32) -> Vec<Vec<i32>> {
    (0..parts).map(|p| vec![p as i32 % size]).collect()
}

fn dense_uneven_rows(cx: &Ctx) {
    let dim = 5;
    let opts = TableOptions { default_value: 0.5, ..TableOptions::default() };
    for (dtype, seed) in [(F32, 1), (F16, 2), (BF16, 3)] {
        let global = random_values(dtype, 27 * dim, seed);
        let mut d = Split::new(&global, dtype, dim, &[7, 7, 7, 6], &split_owners(4, cx.size), cx.rank);
        let t = dist(d.c(), cx, &opts);
        let r = reference(&global, dtype, 27, dim, &opts);
        // SAFETY: t.0 is the table built above (Owned).
        assert_eq!(unsafe { strata_table_len(t.0) }, 27);
        // SAFETY: t.0 is the table built above (Owned).
        assert_eq!(unsafe { strata_table_dim(t.0) }, dim as i64);
        let mut rng = Rng(100 + cx.rank as u64 * 7 + seed);
        plain_as_reference(cx, &t, &r, dim, &mut rng);
    }
    // Heat's SPMD form: `locals` lists this rank's grid positions
    let global = random_values(F32, 27 * dim, 4);
    let mut d = Split::new(&global, F32, dim, &[7, 7, 7, 6], &split_owners(4, cx.size), cx.rank);
    d.locals = Some((0..4).filter(|p| p % cx.size == cx.rank).flat_map(|p| [p as i64, 0]).collect());
    let t = dist(d.c(), cx, &opts);
    let r = reference(&global, F32, 27, dim, &opts);
    let keys: Vec<i64> = (0..27).collect();
    same_as_reference(&t, &r, &keys, U32, &[27], F32, dim);
}

/// Outputs of 4 MiB and more are written with non-temporal stores; a column stride of 2 takes
/// the strided kernels; calls of varying sizes reuse (and grow) the exchange buffers, whose
/// contents are never zeroed between calls. Each output is poisoned first and compared with a
/// single-process table, bit for bit.
fn large_and_strided(cx: &Ctx) {
    let (rows, dim) = (3001usize, 64usize);
    let opts = TableOptions { default_value: -2.0, ..TableOptions::default() };
    let global = random_values(F32, rows * dim, 21);
    let counts: Vec<i64> =
        (0..cx.size as i64).map(|p| rows as i64 / cx.size as i64 + i64::from(p < rows as i64 % cx.size as i64)).collect();
    let mut d = Split::new(&global, F32, dim, &counts, &split_owners(cx.size as usize, cx.size), cx.rank);
    let t = dist(d.c(), cx, &opts);
    let r = reference(&global, F32, rows, dim, &opts);
    let mut rng = Rng(500 + cx.rank as u64);
    for m in [20_000usize, 3, 9_000, 25_000, 0, 1] {
        // About 1% of keys out of range (misses), the rest spread over every rank's rows.
        let keys: Vec<i64> = (0..m).map(|_| rng.below(rows as u64 + 30) as i64).collect();
        same_as_reference(&t, &r, &keys, I64, &[m as i64], F32, dim);
        same_as_reference(&t, &r, &keys, U32, &[m as i64], BF16, dim);
        // out [m, dim] with a column stride of 2 inside a [m, 2 * dim] buffer.
        let strided = |tb: &Owned| {
            let mut ob = vec![f32::NAN; m * 2 * dim];
            let k = Desc::compact(keys.as_ptr().cast(), I64, &[m as i64]);
            let mut o = Desc::new(ob.as_mut_ptr().cast(), F32, &[m as i64, dim as i64], &[2 * dim as i64, 2], 0);
            let mut st = LookupStats::default();
            // SAFETY: tb.0 is a live table; k describes keys (m int64) and o m rows of dim
            // float32 two apart inside ob, both alive past the call; st is a reference.
            ok(unsafe { strata_lookup(tb.0, &k.t, &mut o.t, null(), &mut st) });
            (ob.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), st.hits, st.misses)
        };
        assert_eq!(strided(&t), strided(&r), "{m} keys into a column-strided out");
    }
}

fn replicated(cx: &Ctx) {
    let dim = 3;
    let opts = TableOptions::default();
    let global = random_values(F32, 10 * dim, 9);
    let everyone: Vec<i32> = (0..cx.size).collect();
    let pair = |a: i32, b: i32| if a == b { vec![a] } else { vec![a, b] };
    for (rows, owners) in
        [(vec![10i64], vec![everyone.clone()]), (vec![6, 4], vec![pair(0, 1 % cx.size), pair(cx.last(), (cx.size - 2).max(0))])]
    {
        let mut d = Split::new(&global, F32, dim, &rows, &owners, cx.rank);
        let t = dist(d.c(), cx, &opts);
        let r = reference(&global, F32, 10, dim, &opts);
        let mut rng = Rng(7 + cx.rank as u64);
        let keys: Vec<i64> = (0..200).map(|_| rng.below(12) as i64).collect();
        same_as_reference(&t, &r, &keys, I64, &[200], F32, dim);
    }
}

fn zero_copy(cx: &Ctx) {
    let dim = 4;
    let opts = TableOptions::default();
    let keys: Vec<i64> = (0..27).rev().collect();
    // Compact partitions are borrowed: a write into the source after the build is seen.
    let mut global = random_values(F32, 27 * dim, 11);
    let mut d = Split::new(&global, F32, dim, &[7, 7, 7, 6], &split_owners(4, cx.size), cx.rank);
    let t = dist(d.c(), cx, &opts);
    for row in 0..27 {
        write_float(F32, &mut global[(row * dim + 1) * 4..], 1000.0 + row as f32);
    }
    let r = reference(&global, F32, 27, dim, &opts);
    same_as_reference(&t, &r, &keys, I64, &[27], F32, dim);
    let (_, v, _) = look(&t, &[26], I64, &[1], F32, dim);
    assert_eq!(v[1], 1026.0);
    // table -> producer view: this rank's partitions are the source memory, the others NULL
    let mut p = null_mut();
    // SAFETY: t.0 is the distributed table built above (Owned); p is a reference.
    ok(unsafe { strata_table_partitioned(t.0, &mut p) });
    // SAFETY: strata_table_partitioned succeeded, so p points at a description strata keeps until
    // the free below.
    let desc = unsafe { &*p };
    // SAFETY: desc.shape has desc.ndim = 2 elements.
    assert_eq!(unsafe { std::slice::from_raw_parts(desc.shape, 2) }, &[27, dim as i64]);
    // SAFETY: desc.partition_tiling has desc.ndim = 2 elements.
    assert_eq!(unsafe { std::slice::from_raw_parts(desc.partition_tiling, 2) }, &[4, 1]);
    let get = desc.get.unwrap();
    // strata's own arrays are strided by this library's sizes, which its structs carry.
    assert_eq!(desc.struct_size, std::mem::size_of::<Partitioned>());
    // SAFETY: a (4, 1) tiling has 4 partitions, and strata lays them out with its own struct_size,
    // which is size_of::<Partition>() (strata::ffi defines both; checked just above for the
    // description).
    for (i, part) in unsafe { std::slice::from_raw_parts(desc.partitions, 4) }.iter().enumerate() {
        let owner = i as i32 % cx.size;
        assert_eq!(part.struct_size, std::mem::size_of::<Partition>());
        assert_eq!(part.num_locations, 1);
        // SAFETY: part.num_locations is 1 (checked above), so part.locations points at one
        // location.
        assert_eq!(unsafe { (*part.locations).struct_size }, std::mem::size_of::<PartitionLocation>());
        // SAFETY: part.num_locations is 1 (checked above), so part.locations points at one
        // location.
        assert_eq!(unsafe { (*part.locations).rank }, owner);
        // SAFETY: part.start has desc.ndim = 2 elements.
        assert_eq!(unsafe { *part.start }, d.starts[i][0]);
        // SAFETY: get is strata's callback for this description, called with its own get_user and a
        // handle from one of its partitions while the description is alive.
        assert_eq!(unsafe { get(desc.get_user, part.handle) }, part.data);
        if owner == cx.rank {
            // SAFETY: this rank owns the partition, so part.data points at its DLTensor inside the
            // description.
            assert_eq!(unsafe { (*part.data).data } as *const u8, global[d.starts[i][0] as usize * dim * 4..].as_ptr());
        } else {
            assert!(part.data.is_null() && part.handle.is_null());
        }
    }
    // ... and back: a second distributed table over the same memory
    // SAFETY: p is the live description strata produced above.
    ok(unsafe { strata_partitioned_validate(p) });
    let t2 = dist(p, cx, &opts);
    same_as_reference(&t2, &r, &keys, U64, &[27], F16, dim);
    // SAFETY: p came from strata_table_partitioned and is freed once here; t2 does not borrow it
    // (its data is the source memory, global, which outlives t2).
    unsafe { strata_partitioned_free(p) };
    drop((t, t2));
    // Partitions whose columns are 2 elements apart are copied: later writes are not seen.
    let before = random_values(F32, 27 * dim, 12);
    let mut wide = vec![0u8; 27 * dim * 2 * 4];
    for i in 0..27 * dim {
        wide[i * 8..i * 8 + 4].copy_from_slice(&before[i * 4..i * 4 + 4]);
    }
    let mut d = Split::new(&global, F32, dim, &[7, 7, 7, 6], &split_owners(4, cx.size), cx.rank);
    for (p, data) in d.data.iter_mut().enumerate() {
        if let Some(x) = data {
            let off = (d.starts[p][0] as usize * dim * 2 * 4).min(wide.len());
            *x = Desc::new(wide[off..].as_ptr(), F32, &d.sizes[p], &[2 * dim as i64, 2], 0);
        }
    }
    let t = dist(d.c(), cx, &opts);
    wide.iter_mut().for_each(|b| *b = 0xff);
    let r = reference(&before, F32, 27, dim, &opts);
    same_as_reference(&t, &r, &keys, I64, &[27], F32, dim);
}

fn missing_error(cx: &Ctx) {
    let dim = 2;
    let opts = TableOptions { missing_key: 1, ..TableOptions::default() };
    let global = random_values(F32, 27 * dim, 13);
    let mut d = Split::new(&global, F32, dim, &[7, 7, 7, 6], &split_owners(4, cx.size), cx.rank);
    let t = dist(d.c(), cx, &opts);
    let r = reference(&global, F32, 27, dim, &opts);
    let mut keys: Vec<i64> = (0..8).map(|i| (i * 3 + cx.rank as i64) % 27).collect();
    if cx.rank == cx.last() {
        keys[3] = 99;
    }
    let (s, _, _) = look(&t, &keys, I32, &[8], F32, dim);
    all_fail(cx, s, Status::STRATA_KEY_NOT_FOUND, Some(cx.last()), &["keys: key 99 (element 3) is not in the table"]);
    // the table still serves the next collective lookup
    keys[3] = 4;
    same_as_reference(&t, &r, &keys, I32, &[8], F32, dim);
}

fn bad_lookup_input(cx: &Ctx) {
    let dim = 3;
    let opts = TableOptions::default();
    let global = random_values(F32, 27 * dim, 14);
    let mut d = Split::new(&global, F32, dim, &[7, 7, 7, 6], &split_owners(4, cx.size), cx.rank);
    let t = dist(d.c(), cx, &opts);
    let r = reference(&global, F32, 27, dim, &opts);
    let keys: Vec<i64> = (0..10).collect();
    let k = Desc::compact(keys.as_ptr().cast(), I64, &[10]);
    let mut out = vec![0f32; 10 * dim];
    // out with an integer dtype on the last rank only
    let odt = if cx.rank == cx.last() { I32 } else { F32 };
    let mut o = Desc::compact(out.as_mut_ptr().cast(), odt, &[10, dim as i64]);
    // SAFETY: t.0 is a live table (Owned); k describes keys (10 i64) and o describes out (10 x dim
    // elements, with an int32 dtype on the last rank, which strata refuses), alive past the call.
    let s = unsafe { strata_lookup(t.0, &k.t, &mut o.t, null(), null_mut()) };
    all_fail(cx, s, Status::STRATA_UNSUPPORTED_DTYPE, Some(cx.last()), &["out: dtype int32; expected float32"]);
    // a wrong out shape on rank 0 only
    let rows = if cx.rank == 0 { 9 } else { 10 };
    let mut o = Desc::compact(out.as_mut_ptr().cast(), F32, &[rows, dim as i64]);
    // SAFETY: t.0 is a live table (Owned); k describes keys (10 i64) and o describes out (9 or 10
    // rows of dim floats, within its 10), alive past the call.
    let s = unsafe { strata_lookup(t.0, &k.t, &mut o.t, null(), null_mut()) };
    all_fail(cx, s, Status::STRATA_INVALID_ARGUMENT, Some(0), &["out: shape [9, 3]; expected"]);
    // Arguments refused at the C boundary, before the lookup proper, on one rank: the others
    // must fail with it, not wait for that rank. NULL keys on rank 0:
    let mut o = Desc::compact(out.as_mut_ptr().cast(), F32, &[10, dim as i64]);
    let kp: *const dlpark::ffi::DLTensor = if cx.rank == 0 { null() } else { &k.t };
    // SAFETY: t.0 is a live table; kp is NULL (rank 0) or describes keys; o describes out (10 x
    // dim floats), alive past the call.
    let s = unsafe { strata_lookup(t.0, kp, &mut o.t, null(), null_mut()) };
    all_fail(cx, s, Status::STRATA_NULL_ARGUMENT, Some(0), &["keys"]);
    // NULL out on the last rank:
    let op: *mut dlpark::ffi::DLTensor = if cx.rank == cx.last() { null_mut() } else { &mut o.t };
    // SAFETY: as above, with out NULL on the last rank.
    let s = unsafe { strata_lookup(t.0, &k.t, op, null(), null_mut()) };
    all_fail(cx, s, Status::STRATA_NULL_ARGUMENT, Some(cx.last()), &["out"]);
    // options whose struct_size is 0 on the last rank:
    let bad = LookupOptions { struct_size: 0, ..strata_lookup_options_default() };
    let op: *const LookupOptions = if cx.rank == cx.last() { &bad } else { null() };
    // SAFETY: as above; op is NULL or a live options struct.
    let s = unsafe { strata_lookup(t.0, &k.t, &mut o.t, op, null_mut()) };
    all_fail(cx, s, Status::STRATA_INVALID_ARGUMENT, Some(cx.last()), &["opts"]);
    same_as_reference(&t, &r, &keys, I64, &[10], F32, dim);
}

/// Builds from `d` and expects every rank to fail with `want` (see [`all_fail`]).
#[track_caller]
fn build_fails(cx: &Ctx, d: &mut Split, opts: &TableOptions, want: Status, culprit: Option<i32>, needles: &[&str]) {
    let mut t = null_mut();
    // SAFETY: d.c() points at a description whose pointers point into arrays d owns and the data at
    // the caller's buffers, alive past the call; cx.fint is the world communicator's Fortran
    // handle; opts and t are references.
    let s = unsafe { strata_table_from_partitioned(d.c(), &cx.fint, opts, &mut t) };
    all_fail(cx, s, want, culprit, needles);
    assert!(t.is_null());
}

fn invalid_description(cx: &Ctx) {
    let dim = 2;
    let opts = TableOptions::default();
    let global = random_values(F32, 28 * dim, 15);
    let base = || Split::new(&global, F32, dim, &[7, 7, 7, 6], &split_owners(4, cx.size), cx.rank);
    let l = cx.last();
    let mut d = base();
    if cx.rank == l {
        d.sizes[3][0] = 10;
    }
    build_fails(
        cx,
        &mut d,
        &opts,
        Status::STRATA_INVALID_ARGUMENT,
        Some(l),
        &["desc: partition (3,0): start[0]+shape[0] = 31 exceeds shape[0] = 27"],
    );
    // a struct that was never initialised, on one rank: an error reading the description fails
    // the collective call on every rank too
    let mut d = base();
    if cx.rank == l {
        d.owners[0][0].struct_size = 0;
    }
    build_fails(
        cx,
        &mut d,
        &opts,
        Status::STRATA_INVALID_ARGUMENT,
        Some(l),
        &["desc: partitions[0].locations[0].struct_size is 0; initialise it with strata_partition_location_default()"],
    );
    // owners must be ranks of the communicator (every rank sees it)
    let mut d = base();
    d.owners[2][0].rank = cx.size;
    let want = format!("partition (2,0): location[0].rank = {}; expected a rank of comm (0..{})", cx.size, cx.size);
    build_fails(cx, &mut d, &opts, Status::STRATA_INVALID_ARGUMENT, None, &[&want]);
    // a rank listed twice
    let mut d = base();
    let twice = d.owners[1][0];
    d.owners[1].push(twice);
    let want = format!("partition (1,0): rank {} appears twice in its locations", 1 % cx.size);
    build_fails(cx, &mut d, &opts, Status::STRATA_INVALID_ARGUMENT, None, &[&want]);
    // integer data on one rank
    let ints = vec![0i32; 28 * dim];
    let mut d = base();
    for p in 0..4 {
        if cx.rank == l && d.data[p].is_some() {
            d.data[p] = Some(Desc::compact(ints.as_ptr().cast(), I32, &d.sizes[p]));
        }
    }
    build_fails(cx, &mut d, &opts, Status::STRATA_UNSUPPORTED_DTYPE, Some(l), &["desc: dtype int32", "expected float32"]);
    // an owner without its data
    let mut d = base();
    if cx.rank == l {
        d.data[3 % cx.size as usize] = None;
    }
    let want = format!("partition ({},0) lists this rank ({l}) among its locations but has no data here", 3 % cx.size);
    build_fails(cx, &mut d, &opts, Status::STRATA_INVALID_ARGUMENT, Some(l), &[&want]);
    // a bad option on one rank
    let bad = TableOptions { missing_key: if cx.rank == l { 7 } else { 0 }, ..opts };
    let mut d = base();
    build_fails(cx, &mut d, &bad, Status::STRATA_INVALID_ARGUMENT, Some(l), &["opts->missing_key: 7; expected"]);
    if cx.size > 1 {
        // data for a partition this rank does not own
        let mut d = base();
        if cx.rank == 0 {
            d.data[1] = Some(Desc::compact(global[7 * dim * 4..].as_ptr(), F32, &[7, dim as i64]));
        }
        build_fails(
            cx,
            &mut d,
            &opts,
            Status::STRATA_INVALID_ARGUMENT,
            Some(0),
            &["desc: partition (1,0) has data on rank 0 but its locations [1] do not list this rank"],
        );
    }
}

fn mismatches(cx: &Ctx) {
    if cx.size == 1 {
        return;
    }
    let dim = 2;
    let l = cx.last();
    let opts = TableOptions::default();
    let global = random_values(F32, 28 * dim, 16);
    let global16 = random_values(F16, 28 * dim, 16);
    let owners = split_owners(4, cx.size);
    let mine = |rows: &[i64]| Split::new(&global, F32, dim, rows, &owners, cx.rank);
    let same = "; expected the same description on every rank";
    let cases: Vec<(Split, TableOptions, String)> = vec![
        (
            if cx.rank == l { mine(&[7, 7, 7, 7]) } else { mine(&[7, 7, 7, 6]) },
            opts,
            format!("desc: shape [27, 2] on rank 0 but [28, 2] on rank {l}{same}"),
        ),
        (
            if cx.rank == l { Split::new(&global, F32, dim, &[14, 13], &split_owners(2, cx.size), cx.rank) } else { mine(&[7, 7, 7, 6]) },
            opts,
            format!("desc: partition_tiling (4, 1) on rank 0 but (2, 1) on rank {l}{same}"),
        ),
        (
            if cx.rank == l { mine(&[7, 7, 6, 7]) } else { mine(&[7, 7, 7, 6]) },
            opts,
            format!("desc: partition (2,0): start[0] = 14, shape[0] = 7 on rank 0 but start[0] = 14, shape[0] = 6 on rank {l}{same}"),
        ),
        (
            if cx.rank == l { Split::new(&global16, F16, dim, &[7, 7, 7, 6], &owners, cx.rank) } else { mine(&[7, 7, 7, 6]) },
            opts,
            format!("desc: local data has dtype float32 on rank 0 but float16 on rank {l}"),
        ),
        (
            mine(&[7, 7, 7, 6]),
            TableOptions { default_value: if cx.rank == l { 1.0 } else { 0.0 }, ..opts },
            format!("opts: default_value 0 on rank 0 but 1 on rank {l}; expected the same options on every rank"),
        ),
    ];
    for (mut d, o, want) in cases {
        build_fails(cx, &mut d, &o, Status::STRATA_INVALID_ARGUMENT, None, &[&want]);
    }
}

fn bad_comm(cx: &Ctx) {
    let global = random_values(F32, 8, 17);
    let mut d = Split::new(&global, F32, 2, &[4], &[(0..cx.size).collect()], cx.rank);
    // SAFETY: MPI is initialised.
    let null_comm = unsafe { mpi::ffi::MPI_Comm_c2f(mpi::ffi::RSMPI_COMM_NULL) };
    for fint in [null_comm, 987_654] {
        let mut t = null_mut();
        // SAFETY: d.c() points at a description whose pointers point into arrays d owns and at
        // global, alive past the call; fint is an i32 that strata asks MPI about before using; t is
        // a reference.
        let s = unsafe { strata_table_from_partitioned(d.c(), &fint, null(), &mut t) };
        let want = format!("comm: *comm = {fint} is not a communicator");
        fails(s, Status::STRATA_INVALID_ARGUMENT, &[&want]);
        assert!(t.is_null());
    }
    let mut t = null_mut();
    fails(
        // SAFETY: the path is a static NUL-terminated string; strata refuses the NULL comm; t is a
        // reference.
        unsafe { strata_table_open_distributed(c"/tmp".as_ptr(), 4, null(), null(), &mut t) },
        Status::STRATA_NULL_ARGUMENT,
        &["comm: is NULL"],
    );
}

/// A folder name every rank agrees on (rank 0's pid, broadcast).
pub(crate) fn shared_dir(cx: &Ctx, what: &str) -> std::path::PathBuf {
    let mut pid = std::process::id() as u64;
    cx.world.process_at_rank(0).broadcast_into(&mut pid);
    std::env::temp_dir().join(format!("strata-mpi-{what}-{pid}"))
}

pub(crate) fn write_folder(dir: &std::path::Path, keys: &[i64], vectors: &[f32]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("key"), keys.iter().flat_map(|k| k.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    std::fs::write(dir.join("emb_vector"), vectors.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
}

pub(crate) fn open_dist(cx: &Ctx, dir: &std::path::Path, dim: i64, opts: &TableOptions) -> (Status, *mut Table) {
    let c = CString::new(dir.to_str().unwrap()).unwrap();
    let mut t = null_mut();
    // SAFETY: c is a NUL-terminated path alive past the call; cx.fint is the world communicator's
    // Fortran handle; opts and t are references.
    (unsafe { strata_table_open_distributed(c.as_ptr(), dim, &cx.fint, opts, &mut t) }, t)
}

/// The folder `dir` opened over the ranks and, as the reference, in this process alone.
pub(crate) fn open_both(cx: &Ctx, dir: &std::path::Path, dim: i64, opts: &TableOptions) -> (Owned, Owned) {
    let (s, t) = open_dist(cx, dir, dim, opts);
    ok(s);
    let t = Owned(t);
    let c = CString::new(dir.to_str().unwrap()).unwrap();
    let mut r = null_mut();
    // SAFETY: c is a NUL-terminated path alive past the call; opts and r are references.
    ok(unsafe { strata_table_open(c.as_ptr(), dim, opts, &mut r) });
    (t, Owned(r))
}

fn hugectr_shares(cx: &Ctx) {
    let (rows, dim) = (1000, 8);
    let dir = shared_dir(cx, "share");
    let mut rng = Rng(21);
    let (mut keys, vectors) = random_table(&mut rng, rows, dim);
    keys[..300].iter_mut().enumerate().for_each(|(i, k)| *k = i as i64 * 7); // small keys for 32-bit lookups
    if cx.rank == 0 {
        write_folder(&dir, &keys, &vectors);
    }
    cx.world.barrier();
    let opts = TableOptions { default_value: -2.0, ..TableOptions::default() };
    let (t, r) = open_both(cx, &dir, dim as i64, &opts);
    // SAFETY: t.0 is the table opened above (Owned).
    assert_eq!(unsafe { strata_table_len(t.0) }, rows as i64);
    let mut info = strata_table_info_default_0_3_1();
    // SAFETY: t.0 is the table opened above (Owned); info is a reference.
    ok(unsafe { strata_table_get_info(t.0, &mut info) });
    assert!(info.keyed && info.rows == rows as i64);
    let mut p = null_mut();
    // SAFETY: t.0 is the table opened above (Owned); p is a reference.
    fails(unsafe { strata_table_partitioned(t.0, &mut p) }, Status::STRATA_INVALID_ARGUMENT, &["table: is keyed"]);
    assert!(p.is_null());
    let mut rng = Rng(30 + cx.rank as u64);
    for kdt in [I64, U64, I32, U32] {
        let small = kdt == I32 || kdt == U32;
        let q: Vec<i64> = (0..400)
            .map(|_| match rng.below(4) {
                0 => rng.below(2500) as i64, // small: some present (multiples of 7 below 2100)
                1 if !small => rng.next() as i64,
                _ if small => keys[rng.below(300) as usize],
                _ => keys[rng.below(rows as u64) as usize],
            })
            .collect();
        same_as_reference(&t, &r, &q, kdt, &[20, 20], F32, dim);
    }
    drop((t, r));
    // STRATA_MISSING_ERROR on a keyed table: an absent key on one rank fails every rank
    let strict = TableOptions { missing_key: 1, ..opts };
    let (s, t) = open_dist(cx, &dir, dim as i64, &strict);
    ok(s);
    let t = Owned(t);
    let absent = (0..).map(|i| 1_000_003 + i * 7).find(|k| !keys.contains(k)).unwrap();
    let mut q: Vec<i64> = keys[..6].to_vec();
    if cx.rank == 0 {
        q[2] = absent;
    }
    let (s, _, _) = look(&t, &q, I64, &[6], F32, dim);
    let want = format!("keys: key {absent} (element 2) is not in the table");
    all_fail(cx, s, Status::STRATA_KEY_NOT_FOUND, Some(0), &[&want]);
    q[2] = keys[2];
    let (s, v, st) = look(&t, &q, I64, &[6], F32, dim);
    ok(s);
    assert_eq!((st.hits, st.misses), (6, 0));
    assert_eq!(&v[..dim], &vectors[..dim]);
    drop(t);
    cx.world.barrier();
    if cx.rank == 0 {
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

fn hugectr_errors(cx: &Ctx) {
    let dim = 8;
    let dir = shared_dir(cx, "errors");
    let mut rng = Rng(22);
    let (mut keys, vectors) = random_table(&mut rng, 200, dim);
    if cx.rank == 0 {
        write_folder(&dir, &keys, &vectors);
    }
    cx.world.barrier();
    let opts = TableOptions::default();
    let l = cx.last();
    // a folder that is missing on one rank
    let mine = if cx.rank == l { dir.join("nowhere") } else { dir.clone() };
    let (s, t) = open_dist(cx, &mine, dim as i64, &opts);
    all_fail(cx, s, Status::STRATA_IO_ERROR, Some(l), &["dir: ", "nowhere/key"]);
    assert!(t.is_null());
    // a dim that is not one
    let (s, t) = open_dist(cx, &dir, -1, &opts);
    fails(s, Status::STRATA_INVALID_ARGUMENT, &["dim: -1; expected 1 <= dim"]);
    assert!(t.is_null());
    // options that differ between ranks
    let other = TableOptions { default_value: cx.rank as f32, ..opts };
    let (s, t) = open_dist(cx, &dir, dim as i64, &other);
    if cx.size > 1 {
        let want = "dir: default_value 0 on rank 0 but 1 on rank 1; expected the same folder, dim and options on every rank";
        all_fail(cx, s, Status::STRATA_INVALID_ARGUMENT, None, &[want]);
        assert!(t.is_null());
    } else {
        ok(s);
        drop(Owned(t));
    }
    // another dim on one rank: its files do not fit it
    let (s, t) = open_dist(cx, &dir, if cx.rank == l { 4 } else { 8 }, &opts);
    all_fail(cx, s, Status::STRATA_INVALID_FILE, Some(l), &["key holds 200 keys but", "emb_vector holds 400 rows of dim 4"]);
    assert!(t.is_null());
    if cx.size > 1 {
        // folders that differ between ranks, each valid on its own
        let (narrow, short) = (dir.join("narrow"), dir.join("short"));
        if cx.rank == 0 {
            write_folder(&narrow, &keys, &vectors[..200 * 4]);
            write_folder(&short, &keys[..100], &vectors[..100 * dim]);
        }
        cx.world.barrier();
        let tail = "; expected the same folder, dim and options on every rank";
        for (other, other_dim, want) in [
            (&narrow, 4, format!("dir: dim 8 on rank 0 but 4 on rank {l}{tail}")),
            (&short, 8, format!("dir: the folder holds 200 rows on rank 0 but 100 on rank {l}{tail}")),
        ] {
            let (path, d) = if cx.rank == l { (other, other_dim) } else { (&dir, dim as i64) };
            let (s, t) = open_dist(cx, path, d, &opts);
            all_fail(cx, s, Status::STRATA_INVALID_ARGUMENT, None, &[&want]);
            assert!(t.is_null());
        }
    }
    cx.world.barrier();
    // a duplicate key: the rank that owns it reports it, the others follow with its status
    if cx.rank == 0 {
        keys[150] = keys[20];
        write_folder(&dir, &keys, &vectors);
    }
    cx.world.barrier();
    let (s, t) = open_dist(cx, &dir, dim as i64, &opts);
    let want = format!("dir/key: key {} appears at rows 20 and 150; expected unique keys", keys[20]);
    fails(s, Status::STRATA_DUPLICATE_KEY, &[&want]);
    assert!(t.is_null());
    cx.world.barrier();
    if cx.rank == 0 {
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// The owners of each partition of `t`'s own description (`strata_table_partitioned`), and
/// whether this rank has its data.
fn described_owners(t: &Owned) -> Vec<(Vec<i32>, bool)> {
    let mut p = null_mut();
    // SAFETY: t.0 is a live distributed table (Owned); p is a reference.
    ok(unsafe { strata_table_partitioned(t.0, &mut p) });
    // SAFETY: strata_table_partitioned succeeded: p points at a description strata keeps until the
    // free below, with partition_tiling[0] partitions laid out with strata's own struct_size.
    let desc = unsafe { &*p };
    // SAFETY: as above; partition_tiling has ndim = 2 values.
    let n = unsafe { *desc.partition_tiling } as usize;
    // SAFETY: as above: n partitions of size_of::<Partition>() bytes each.
    let parts = unsafe { std::slice::from_raw_parts(desc.partitions, n) };
    let out = parts
        .iter()
        .map(|part| {
            // SAFETY: strata lays out num_locations locations of its own struct_size per partition.
            let locs = unsafe { std::slice::from_raw_parts(part.locations, part.num_locations as usize) };
            (locs.iter().map(|l| l.rank).collect(), !part.data.is_null())
        })
        .collect();
    // SAFETY: p came from strata_table_partitioned and is freed once.
    unsafe { strata_partitioned_free(p) };
    out
}

/// Heat describes a `split=None` array on every rank as one partition whose location is a single
/// rank (its last, from Heat 1.8's loop), with the data and `locals` [(0, 0)] on every rank. The
/// owners are the union of what the ranks say: every rank holding data. A rank may also hold no
/// data and claim nothing while the others hold it: its lookups go to them.
fn heat_replicated(cx: &Ctx) {
    let dim = 3;
    let opts = TableOptions::default();
    let global = random_values(F32, 10 * dim, 31);
    let r = reference(&global, F32, 10, dim, &opts);
    let everyone: Vec<i32> = (0..cx.size).collect();
    let mut rng = Rng(40 + cx.rank as u64);
    let keys: Vec<i64> = (0..200).map(|_| rng.below(13) as i64 - 1).collect();
    // Heat 1.8 (the last rank named everywhere), and each rank naming itself
    for named in [cx.last(), cx.rank] {
        let mut d = Split::new(&global, F32, dim, &[10], std::slice::from_ref(&everyone), cx.rank);
        d.owners[0] = vec![at(named)];
        d.locals = Some(vec![0, 0]);
        let t = dist(d.c(), cx, &opts);
        same_as_reference(&t, &r, &keys, I64, &[200], F32, dim);
        assert_eq!(described_owners(&t), vec![(everyone.clone(), true)]);
    }
    // every rank but the last holds it; the last gives no data and claims nothing
    if cx.size > 1 {
        let l = cx.last();
        let mut d = Split::new(&global, F32, dim, &[10], &[(0..l).collect()], cx.rank);
        d.owners[0] = vec![at(0)];
        if cx.rank != l {
            d.locals = Some(vec![0, 0]);
        }
        let t = dist(d.c(), cx, &opts);
        same_as_reference(&t, &r, &keys, I64, &[200], F32, dim);
        assert_eq!(described_owners(&t), vec![((0..l).collect(), cx.rank != l)]);
    }
    // two partitions, the second replicated Heat's way, the first plain
    let mut d = Split::new(&global, F32, dim, &[4, 6], &[vec![0], everyone.clone()], cx.rank);
    d.owners[1] = vec![at(cx.last())];
    d.locals = Some(if cx.rank == 0 { vec![0, 0, 1, 0] } else { vec![1, 0] });
    let t = dist(d.c(), cx, &opts);
    same_as_reference(&t, &r, &keys, I64, &[200], F32, dim);
    assert_eq!(described_owners(&t), vec![(vec![0], cx.rank == 0), (everyone.clone(), true)]);
}

fn union_errors(cx: &Ctx) {
    if cx.size == 1 {
        return;
    }
    let (dim, l) = (2, cx.last());
    let opts = TableOptions::default();
    let global = random_values(F32, 10 * dim, 32);
    // rank 0 names the last rank among the owners; the last rank neither names itself nor holds data
    let mut d = Split::new(&global, F32, dim, &[10], &[(0..l).collect()], cx.rank);
    d.owners[0] = if cx.rank == 0 { vec![at(0), at(l)] } else { vec![at(0)] };
    if cx.rank != l {
        d.locals = Some(vec![0, 0]);
    }
    let held: Vec<String> = (0..l).map(|r| r.to_string()).collect();
    let want = format!(
        "desc: partition (0,0): locations [0, {l}] on rank 0 name rank {l}, which has no data for it \
         (it is held on rank(s) {}); expected data on every rank a partition's locations name",
        held.join(", ")
    );
    build_fails(cx, &mut d, &opts, Status::STRATA_INVALID_ARGUMENT, None, &[&want]);
    // data the rank's own locations and locals do not claim is still refused on that rank
    let mut d = Split::new(&global, F32, dim, &[10], &[(0..cx.size).collect()], cx.rank);
    d.owners[0] = vec![at(0)];
    if cx.rank != 1 {
        d.locals = Some(vec![0, 0]);
    }
    build_fails(
        cx,
        &mut d,
        &opts,
        Status::STRATA_INVALID_ARGUMENT,
        Some(1),
        &["desc: partition (0,0) has data on rank 1 but its locations [0] do not list this rank"],
    );
}
