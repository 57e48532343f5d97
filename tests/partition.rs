//! The `__partitioned__` protocol through the C ABI, single process: every validation rule,
//! tables from Heat-shaped descriptions (split 0 uneven, split None replicated), zero copy
//! checked both ways, and round trips produce -> consume.

mod common;
use common::*;
use dlpark::ffi::DLTensor;
use std::mem::size_of;
use std::ptr::{null, null_mut};

/// A description under construction: owns every array its C structs point into.
struct Desc2 {
    shape: Vec<i64>,
    tiling: Vec<i64>,
    starts: Vec<Vec<i64>>,
    shapes: Vec<Vec<i64>>,
    data: Vec<Option<Desc>>,
    locations: Vec<Vec<PartitionLocation>>,
    locals: Option<Vec<i64>>,
    parts: Vec<Partition>,
    c: Option<Partitioned>,
}

fn loc(rank: i32) -> PartitionLocation {
    PartitionLocation { rank, ..strata_partition_location_default() }
}

impl Desc2 {
    /// Rows split as `rows_per_part` over tiling (P, 1) of a [sum, dim] f32 array `global`.
    fn split_rows(global: &[f32], dim: usize, rows_per_part: &[i64]) -> Desc2 {
        let total: i64 = rows_per_part.iter().sum();
        let mut d = Desc2 {
            shape: vec![total, dim as i64],
            tiling: vec![rows_per_part.len() as i64, 1],
            starts: vec![],
            shapes: vec![],
            data: vec![],
            locations: vec![],
            locals: None,
            parts: vec![],
            c: None,
        };
        let mut start = 0;
        for (p, &n) in rows_per_part.iter().enumerate() {
            d.starts.push(vec![start, 0]);
            d.shapes.push(vec![n, dim as i64]);
            let ptr = global[(start as usize * dim).min(global.len())..].as_ptr();
            d.data.push(Some(Desc::compact(ptr.cast(), F32, &[n, dim as i64])));
            d.locations.push(vec![loc(p as i32)]);
            start += n;
        }
        d
    }

    /// The C description of `self`: every pointer in it points into arrays `self` owns, and the
    /// partitions' data at the caller's buffers, so it is valid while `self` lives unmodified
    /// (and those buffers do).
    fn c(&mut self) -> *const Partitioned {
        self.parts = (0..self.starts.len())
            .map(|i| Partition {
                start: self.starts[i].as_ptr(),
                shape: self.shapes[i].as_ptr(),
                data: self.data[i].as_ref().map_or(null(), |d| &d.t as *const DLTensor),
                handle: null_mut(),
                locations: self.locations[i].as_ptr(),
                num_locations: self.locations[i].len() as i32,
                ..strata_partition_default()
            })
            .collect();
        self.c = Some(Partitioned {
            ndim: self.shape.len() as i32,
            shape: self.shape.as_ptr(),
            partition_tiling: self.tiling.as_ptr(),
            partitions: self.parts.as_ptr(),
            locals: self.locals.as_ref().map_or(null(), |l| l.as_ptr()),
            num_locals: self.locals.as_ref().map_or(0, |l| (l.len() / self.shape.len()) as i32),
            ..strata_partitioned_default()
        });
        self.c.as_ref().unwrap()
    }
}

/// A single-process table from `d`, which must be a valid description (every caller passes
/// `Desc2::c` of a live `Desc2`, or one strata produced and has not freed).
fn build(d: *const Partitioned) -> Owned {
    let mut t = null_mut();
    // SAFETY: d is a valid description for the call (the promise of every caller, above); t is a
    // reference.
    ok(unsafe { strata_table_from_partitioned(d, null(), null(), &mut t) });
    Owned(t)
}

/// Looks up `keys` in `t`, which must be a live table (every caller passes one it has not
/// freed), into a fresh [keys, dim] output.
fn rows(t: *mut Table, keys: &[i64], dim: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; keys.len() * dim];
    let k = Desc::compact(keys.as_ptr().cast(), I64, &[keys.len() as i64]);
    let mut o = Desc::compact(out.as_mut_ptr().cast(), F32, &[keys.len() as i64, dim as i64]);
    // SAFETY: t is a live table (the promise of every caller, above); k and o describe keys and
    // out, which outlive the call.
    ok(unsafe { strata_lookup(t, &k.t, &mut o.t, null(), null_mut()) });
    out
}

fn expect(global: &[f32], dim: usize, keys: &[i64]) -> Vec<f32> {
    let n = (global.len() / dim) as i64;
    keys.iter()
        .flat_map(|&k| if (0..n).contains(&k) { global[k as usize * dim..(k as usize + 1) * dim].to_vec() } else { vec![0.0; dim] })
        .collect()
}

#[test]
fn heat_split0_uneven_rows_copy_and_match() {
    let mut rng = Rng(41);
    let dim = 8;
    let global: Vec<f32> = (0..27 * dim).map(|_| rng.f32()).collect();
    let mut d = Desc2::split_rows(&global, dim, &[7, 7, 7, 6]);
    // SAFETY: d.c() points at a description whose pointers all point into arrays d owns (see
    // Desc2::c), and its data at global; both outlive the call.
    ok(unsafe { strata_partitioned_validate(d.c()) });
    let t = build(d.c());
    let keys: Vec<i64> = (0..100).map(|_| rng.below(32) as i64 - 2).collect();
    assert_eq!(rows(t.0, &keys, dim), expect(&global, dim, &keys));
    // SAFETY: t is the table built above (Owned).
    assert_eq!(unsafe { strata_table_len(t.0) }, 27);
}

#[test]
fn single_and_replicated_partitions_are_zero_copy_both_ways() {
    for replicated in [false, true] {
        let dim = 4;
        let mut global: Vec<f32> = (0..10 * dim).map(|i| i as f32).collect();
        let mut d = Desc2::split_rows(&global, dim, &[10]);
        if replicated {
            d.locations[0] = (0..4).map(loc).collect(); // Heat split=None: every rank holds it
        }
        let t = build(d.c());
        let mut info = strata_table_info_default_0_3_1();
        // SAFETY: t is the table built above (Owned); info is a reference.
        ok(unsafe { strata_table_get_info(t.0, &mut info) });
        // source -> table: a write into the source is seen by lookups
        global[3 * dim + 1] = 777.0;
        assert_eq!(rows(t.0, &[3], dim), vec![12.0, 777.0, 14.0, 15.0]);
        // table -> producer view: the produced description's data is the same memory
        let mut p = null_mut();
        // SAFETY: t is a live dense table; p is a reference.
        ok(unsafe { strata_table_partitioned(t.0, &mut p) });
        // SAFETY: strata_table_partitioned succeeded, so p points at a description strata keeps
        // until the free below; a dense table's has exactly one partition.
        let part = unsafe { &*(*p).partitions };
        // SAFETY: a single-process table's partition is local: its data points at a DLTensor inside
        // the description.
        let data = unsafe { &*part.data };
        assert_eq!(data.data as *const f32, global.as_ptr());
        // SAFETY: p is the live description strata produced above.
        let get = unsafe { (*p).get.unwrap() };
        // SAFETY: get is strata's callback for this description, called with its own get_user and a
        // handle from its partition while the description is alive.
        assert_eq!(unsafe { get((*p).get_user, part.handle) }, part.data);
        // SAFETY: p came from strata_table_partitioned and is freed once here, not used after.
        unsafe { strata_partitioned_free(p) };
    }
}

#[test]
fn produce_then_consume_round_trip() {
    let mut rng = Rng(42);
    let dim = 5;
    let vectors: Vec<f32> = (0..12 * dim).map(|_| rng.f32()).collect();
    let t = Owned::build(&vectors, 12, dim, None, &TableOptions::default());
    let mut p = null_mut();
    // SAFETY: t is a live dense table; p is a reference.
    ok(unsafe { strata_table_partitioned(t.0, &mut p) });
    // SAFETY: strata_table_partitioned succeeded, so p points at a description strata keeps until
    // the free below.
    let desc = unsafe { &*p };
    assert_eq!(desc.ndim, 2);
    // SAFETY: desc.shape has desc.ndim = 2 elements.
    assert_eq!(unsafe { std::slice::from_raw_parts(desc.shape, 2) }, &[12, dim as i64]);
    // SAFETY: desc.partition_tiling has desc.ndim = 2 elements.
    assert_eq!(unsafe { std::slice::from_raw_parts(desc.partition_tiling, 2) }, &[1, 1]);
    // SAFETY: a [1, 1] tiling has exactly one partition, at desc.partitions.
    let part = unsafe { &*desc.partitions };
    assert_eq!(part.num_locations, 1);
    // SAFETY: part.locations holds part.num_locations = 1 location.
    assert_eq!(unsafe { (*part.locations).rank }, 0);
    // SAFETY: p is the live description strata produced above.
    ok(unsafe { strata_partitioned_validate(p) });
    let t2 = build(p);
    let keys: Vec<i64> = (0..30).map(|_| rng.below(14) as i64).collect();
    assert_eq!(rows(t2.0, &keys, dim), rows(t.0, &keys, dim));
    drop(t2);
    // SAFETY: p came from strata_table_partitioned and is freed once here; t2, which borrowed its
    // data, was dropped above.
    unsafe { strata_partitioned_free(p) };
    // SAFETY: freeing NULL is a documented no-op.
    unsafe { strata_partitioned_free(null_mut()) };
    // keyed tables have no array view
    let keyed = Owned::build(&vectors, 12, dim, Some(&(0..12).map(|i| i * 10).collect::<Vec<_>>()), &TableOptions::default());
    let mut p = null_mut();
    // SAFETY: keyed is a live table (Owned); p is a reference.
    fails(unsafe { strata_table_partitioned(keyed.0, &mut p) }, Status::STRATA_INVALID_ARGUMENT, &["table: is keyed"]);
    assert!(p.is_null());
}

#[test]
fn every_validation_rule() {
    let dim = 4;
    let global: Vec<f32> = vec![0.0; 40 * dim];
    let check = |d: &mut Desc2, needles: &[&str]| {
        // SAFETY: d.c() points at a description whose pointers all point into arrays d owns (see
        // Desc2::c), its data at global, which has 40 rows, more than any broken partition reaches;
        // only values are wrong, which strata refuses.
        let s = unsafe { strata_partitioned_validate(d.c()) };
        fails(s, Status::STRATA_INVALID_ARGUMENT, needles);
        let mut t = null_mut();
        // SAFETY: the same description as above; t is a reference.
        let s = unsafe { strata_table_from_partitioned(d.c(), null(), null(), &mut t) };
        assert_eq!(s, Status::STRATA_INVALID_ARGUMENT);
        assert!(t.is_null());
    };
    let base = || Desc2::split_rows(&global, dim, &[7, 7, 7, 6]);

    let mut d = base();
    d.starts[3][0] = 21;
    d.shapes[3][0] = 10;
    check(&mut d, &["partition (3,0): start[0]+shape[0] = 31 exceeds shape[0] = 27"]);
    let mut d = base();
    d.starts[2][0] = 15;
    d.shapes[2][0] = 6;
    check(&mut d, &["partition (2,0): start[0] = 15; expected 14: it leaves a gap"]);
    let mut d = base();
    d.starts[1][0] = 6;
    check(&mut d, &["partition (1,0): start[0] = 6; expected 7: it overlaps the previous partition"]);
    let mut d = base();
    d.shape[0] = 30;
    check(&mut d, &["the partitions end at 27 along dimension 0; expected shape[0] = 30"]);
    let mut d = base();
    d.tiling[1] = 0;
    check(&mut d, &["partition_tiling[1] = 0"]);
    let mut d = base();
    d.locations[2].clear();
    check(&mut d, &["partition (2,0): location is empty"]);
    let mut d = base();
    d.shapes[1][1] = 3;
    check(&mut d, &["partition (1,0): start[1] = 0, shape[1] = 3; expected 0 and 4 like partition (0,0)"]);
    let mut d = base();
    d.starts[0][0] = -1;
    check(&mut d, &["partition (0,0): start[0] = -1"]);
    let mut d = base();
    d.locals = Some(vec![5, 0]);
    check(&mut d, &["locals[0] = [5, 0] is outside partition_tiling [4, 1]"]);
    let mut d = base();
    d.data[2] = None;
    d.locals = Some(vec![2, 0]);
    check(&mut d, &["partition (2,0) is listed in locals but has no data"]);
    let mut d = base();
    d.data[1] = Some(Desc::compact(global.as_ptr().cast(), F32, &[6, dim as i64]));
    check(&mut d, &["partition (1,0): data has shape [6, 4]; expected the partition's shape [7, 4]"]);
    let mut d = base();
    let half = vec![0u16; 7 * dim];
    d.data[1] = Some(Desc::compact(half.as_ptr().cast(), F16, &[7, dim as i64]));
    check(&mut d, &["partition (1,0): data has dtype float16; expected float32 like partition (0,0)"]);

    let mut d = base();
    d.c();
    let mut c = *d.c.as_ref().unwrap();
    c.num_locals = -1;
    // SAFETY: c is d's description with NULL locals and num_locals = -1; its other pointers point
    // into arrays d owns, alive past the call.
    fails(unsafe { strata_partitioned_validate(&c) }, Status::STRATA_INVALID_ARGUMENT, &["locals is NULL with num_locals = -1"]);
    let locals = [0i64, 0];
    c.locals = locals.as_ptr();
    c.num_locals = 0;
    // SAFETY: c's locals points at the two i64 of `locals`; its other pointers point into arrays d
    // owns, all alive past the call.
    fails(unsafe { strata_partitioned_validate(&c) }, Status::STRATA_INVALID_ARGUMENT, &["locals is given with num_locals = 0"]);

    // from_partitioned specifics
    let mut d = base();
    d.data[3] = None;
    let mut t = null_mut();
    // SAFETY: d.c() points into arrays d owns and its data at global; partition 3's data is NULL,
    // which strata refuses. t is a reference.
    let s = unsafe { strata_table_from_partitioned(d.c(), null(), null(), &mut t) };
    fails(s, Status::STRATA_INVALID_ARGUMENT, &["partition (3,0) has no local data; without a communicator every partition must be local"]);
    let mut d = Desc2::split_rows(&global, dim, &[40]);
    d.tiling = vec![1, 2];
    d.starts = vec![vec![0, 0], vec![0, 2]];
    d.shapes = vec![vec![40, 2], vec![40, 2]];
    let a = Desc::new(global.as_ptr().cast(), F32, &[40, 2], &[4, 1], 0);
    let b = Desc::new(global.as_ptr().cast(), F32, &[40, 2], &[4, 1], 8);
    d.data = vec![Some(a), Some(b)];
    d.locations = vec![vec![loc(0)], vec![loc(1)]];
    // SAFETY: d.c() points into arrays d owns; a and b describe columns 0-1 and 2-3 of global's 40
    // rows of 4 floats, alive past the call.
    ok(unsafe { strata_partitioned_validate(d.c()) });
    // SAFETY: the same description as above; t is a reference.
    let s = unsafe { strata_table_from_partitioned(d.c(), null(), null(), &mut t) };
    fails(s, Status::STRATA_INVALID_ARGUMENT, &["partition_tiling [1, 2] splits the columns; expected (1, 1)"]);
    let comm = 0i32;
    let mut d = base();
    // SAFETY: d.c() points into arrays d owns and its data at global; comm is an i32 alive past the
    // call; t is a reference.
    let s = unsafe { strata_table_from_partitioned(d.c(), &comm, null(), &mut t) };
    if !cfg!(feature = "mpi") {
        // with MPI, a non-NULL comm outside mpirun is tested by tests/mpi_build.rs
        fails(s, Status::STRATA_UNSUPPORTED_DEVICE, &["comm: distributed tables need a build with MPI support"]);
    }
    // SAFETY: strata refuses the NULL description.
    fails(unsafe { strata_partitioned_validate(null()) }, Status::STRATA_NULL_ARGUMENT, &["desc"]);
}

/// A `strata_partition` / `strata_partition_location` of a newer strata: 8 more bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct Newer<T> {
    old: T,
    extra: u64,
}

#[test]
fn initialisers_set_struct_size() {
    let d = strata_partitioned_default();
    assert_eq!((d.struct_size, d.ndim, d.num_locals), (size_of::<Partitioned>(), 0, 0));
    assert!(d.shape.is_null() && d.partitions.is_null() && d.locals.is_null() && d.get.is_none());
    let p = strata_partition_default();
    assert_eq!((p.struct_size, p.num_locations), (size_of::<Partition>(), 0));
    assert!(p.start.is_null() && p.data.is_null() && p.handle.is_null() && p.locations.is_null());
    let l = strata_partition_location_default();
    assert_eq!((l.struct_size, l.rank, l.device_id, l.pid), (size_of::<PartitionLocation>(), -1, -1, 0));
    assert!(l.host.is_null());
}

#[test]
fn struct_sizes_of_a_description() {
    let dim = 4;
    let mut rng = Rng(43);
    let global: Vec<f32> = (0..27 * dim).map(|_| rng.f32()).collect();
    let base = || Desc2::split_rows(&global, dim, &[7, 7, 7, 6]);
    let refused = |c: &Partitioned, needles: &[&str]| {
        // SAFETY: c's pointers point into the arrays of a Desc2 (or the wider copies of its
        // elements below), and its data at global, all alive past the call; only a struct_size or a
        // tail is wrong, and every element is read at the stride its struct_size gives, inside its
        // array.
        fails(unsafe { strata_partitioned_validate(c) }, Status::STRATA_INVALID_ARGUMENT, needles);
        let mut t = null_mut();
        // SAFETY: the same description as above; t is a reference.
        let s = unsafe { strata_table_from_partitioned(c, null(), null(), &mut t) };
        fails(s, Status::STRATA_INVALID_ARGUMENT, needles);
        assert!(t.is_null());
    };

    // The description itself: sizes that were never initialised.
    let mut d = base();
    d.c();
    let mut c = d.c.unwrap();
    c.struct_size = 0;
    refused(&c, &["desc: struct_size is 0; initialise it with strata_partitioned_default()"]);
    c.struct_size = 40;
    refused(&c, &["desc: struct_size = 40 is below the first published size of strata_partitioned (72 bytes)"]);

    // The partitions: every element carries the same size, the array's stride.
    let mut d = base();
    d.c();
    d.parts[3].struct_size = 48;
    let c = d.c.unwrap();
    refused(&c, &["desc: partitions[3].struct_size = 48, but partitions[0].struct_size = 56", "strata_partition_default()"]);
    let mut d = base();
    d.c();
    d.parts[0].struct_size = 0;
    let c = d.c.unwrap();
    refused(&c, &["desc: partitions[0].struct_size is 0; initialise it with strata_partition_default()"]);
    let mut d = base();
    d.c();
    d.locations[2][0].struct_size = 8;
    let c = d.c.unwrap();
    refused(&c, &["desc: partitions[2].locations[0].struct_size = 8 is below the first published size of strata_partition_location"]);

    // A newer caller's larger elements: read `struct_size` bytes apart, accepted with zero tails.
    let mut d = base();
    d.c();
    let mut newer: Vec<Newer<Partition>> =
        d.parts.iter().map(|p| Newer { old: Partition { struct_size: size_of::<Newer<Partition>>(), ..*p }, extra: 0 }).collect();
    let wide_locations: Vec<Vec<Newer<PartitionLocation>>> = d
        .locations
        .iter()
        .map(|ls| ls.iter().map(|l| Newer { old: PartitionLocation { struct_size: 40, ..*l }, extra: 0 }).collect())
        .collect();
    for (p, ls) in newer.iter_mut().zip(&wide_locations) {
        p.old.locations = ls.as_ptr().cast();
    }
    #[repr(C)]
    struct NewerDesc {
        old: Partitioned,
        extra: u64,
    }
    let mut c = NewerDesc { old: Partitioned { struct_size: 80, partitions: newer.as_ptr().cast(), ..d.c.unwrap() }, extra: 0 };
    // SAFETY: c.old's partitions point at `newer` (64-byte elements, as their struct_size says),
    // whose locations point at wide_locations (40-byte elements, as theirs say), and c.old is
    // followed by the 8 bytes of c.extra, so the 80 bytes it claims are all inside c.
    ok(unsafe { strata_partitioned_validate(&c.old) });
    let t = build(&c.old);
    let keys: Vec<i64> = (0..60).map(|_| rng.below(30) as i64 - 1).collect();
    assert_eq!(rows(t.0, &keys, dim), expect(&global, dim, &keys));
    // ... and refused when a tail is not zero: the caller asks for something this strata lacks.
    newer[1].extra = 1;
    refused(&c.old, &["desc: partitions[1].struct_size = 64, and byte 56 is not zero"]);
    newer[1].extra = 0;
    c.extra = 7;
    refused(&c.old, &["desc: struct_size = 80, and byte 72 is not zero"]);
}

#[test]
fn produced_descriptions_carry_struct_sizes() {
    let vectors = vec![1.0f32; 6 * 3];
    let t = Owned::build(&vectors, 6, 3, None, &TableOptions::default());
    let mut p = null_mut();
    // SAFETY: t is a live dense table; p is a reference.
    ok(unsafe { strata_table_partitioned(t.0, &mut p) });
    // SAFETY: strata_table_partitioned succeeded, so p points at a description strata keeps until
    // the free below.
    let d = unsafe { &*p };
    assert_eq!(d.struct_size, size_of::<Partitioned>());
    // SAFETY: a dense table's description has exactly one partition, at d.partitions.
    let part = unsafe { &*d.partitions };
    assert_eq!(part.struct_size, size_of::<Partition>());
    // SAFETY: that partition has one location, at part.locations.
    let l = unsafe { &*part.locations };
    assert_eq!((l.struct_size, l.rank, l.device_id), (size_of::<PartitionLocation>(), 0, -1));
    // SAFETY: p came from strata_table_partitioned and is freed once here, not used after.
    unsafe { strata_partitioned_free(p) };
}

/// `strata_lookup_pooled` of `offsets`-bagged `keys` (weighted) from `t`, a live table, into a
/// fresh float32 [B, dim] output poisoned with NaN; returns the output's bits and the stats.
fn pooled_bits(t: *mut Table, keys: &[i64], offsets: &[i64], weights: &[f32], pooling: i32, dim: usize) -> (Vec<u32>, u64, u64) {
    let b = offsets.len() - 1;
    let mut out = vec![f32::NAN; b * dim];
    let k = Desc::compact(keys.as_ptr().cast(), I64, &[keys.len() as i64]);
    let o = Desc::compact(offsets.as_ptr().cast(), I64, &[offsets.len() as i64]);
    let w = Desc::compact(weights.as_ptr().cast(), F32, &[weights.len() as i64]);
    let mut out_d = Desc::compact(out.as_mut_ptr().cast(), F32, &[b as i64, dim as i64]);
    let mut st = LookupStats::default();
    // SAFETY: t is a live table (the promise of every caller); the descriptions cover keys,
    // offsets, weights and out, which outlive the call; st is a reference.
    ok(unsafe { strata_lookup_pooled(t, &k.t, &o.t, &w.t, pooling, &mut out_d.t, null(), &mut st) });
    (out.iter().map(|v| v.to_bits()).collect(), st.hits, st.misses)
}

/// Tables from descriptions with `opts->storage` set: each row quantized (or converted) where it
/// lies, so every plain and pooled lookup equals, bit for bit, a table built by
/// `strata_table_from_dlpack` with the same storage from the same rows, whether the description
/// has one partition (which is then copied, not borrowed) or several. Rows that cannot be stored
/// fail naming their partition and row; a quantized table has no `__partitioned__` view.
#[test]
fn quantized_storage_matches_a_table_built_from_the_same_rows() {
    let mut rng = Rng(77);
    let dim = 6;
    for (storage, name, row_bytes) in [
        (strata_storage::STRATA_STORAGE_INT8, "int8", dim + 8),
        (strata_storage::STRATA_STORAGE_INT4, "int4", dim / 2 + 4),
        (strata_storage::STRATA_STORAGE_FP8, "fp8", dim + 4),
        (strata_storage::STRATA_STORAGE_FLOAT16, "float16", dim * 2),
    ] {
        let opts = TableOptions { storage: storage as i32, default_value: -0.5, ..TableOptions::default() };
        let mut global: Vec<f32> = (0..27 * dim).map(|_| rng.f32() * 8.0 - 4.0).collect();
        global[5 * dim..6 * dim].fill(1.25); // a constant row: its scale is 0
        let reference = Owned::build(&global, 27, dim, None, &opts);
        for split in [&[27i64][..], &[7, 7, 7, 6]] {
            let mut d = Desc2::split_rows(&global, dim, split);
            let mut t = null_mut();
            // SAFETY: d.c() points at a description whose pointers point into arrays d owns, and its
            // data at global; both outlive the call; opts and t are references.
            ok(unsafe { strata_table_from_partitioned(d.c(), null(), &opts, &mut t) });
            let t = Owned(t);
            let mut info = strata_table_info_default_0_3_1();
            // SAFETY: t is the table built above (Owned); info is a reference.
            ok(unsafe { strata_table_get_info(t.0, &mut info) });
            assert_eq!(info.vector_bytes, 27 * row_bytes as u64, "{name} {split:?}");
            assert!(!info.adopted, "{name}: quantized rows are a copy");
            let keys: Vec<i64> = (0..200).map(|_| rng.below(31) as i64 - 2).collect();
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            assert_eq!(bits(rows(t.0, &keys, dim)), bits(rows(reference.0, &keys, dim)), "{name} {split:?}");
            let mut offsets = vec![0i64];
            while *offsets.last().unwrap() < keys.len() as i64 {
                offsets.push((offsets.last().unwrap() + rng.below(9) as i64).min(keys.len() as i64));
            }
            let weights: Vec<f32> = (0..keys.len()).map(|_| rng.f32() + 0.25).collect();
            for pooling in [1, 2, 3] {
                let got = pooled_bits(t.0, &keys, &offsets, &weights, pooling, dim);
                assert_eq!(got, pooled_bits(reference.0, &keys, &offsets, &weights, pooling, dim), "{name} {split:?} pooling {pooling}");
            }
            if storage != strata_storage::STRATA_STORAGE_FLOAT16 {
                let mut p = null_mut();
                // SAFETY: t is the table built above (Owned); p is a reference.
                let s = unsafe { strata_table_partitioned(t.0, &mut p) };
                fails(s, Status::STRATA_INVALID_ARGUMENT, &[&format!("table: stores {name} rows, which has no __partitioned__ view")]);
                assert!(p.is_null());
            }
        }
    }
    // A NaN in partition (1,0), row 2; an odd dim for int4
    let dim = 4;
    let mut global: Vec<f32> = (0..20 * dim).map(|_| rng.f32()).collect();
    global[(7 + 2) * dim + 3] = f32::NAN;
    let int8 = TableOptions { storage: strata_storage::STRATA_STORAGE_INT8 as i32, ..TableOptions::default() };
    for (split, want) in
        [(&[7i64, 13][..], "desc: partition (1,0): row 2: value NaN at column 3"), (&[20], "desc: row 9: value NaN at column 3")]
    {
        let mut d = Desc2::split_rows(&global, dim, split);
        let mut t = null_mut();
        // SAFETY: as above.
        let s = unsafe { strata_table_from_partitioned(d.c(), null(), &int8, &mut t) };
        fails(s, Status::STRATA_INVALID_ARGUMENT, &[want]);
        assert!(t.is_null());
    }
    let odd: Vec<f32> = (0..4 * 5).map(|_| rng.f32()).collect();
    let mut d = Desc2::split_rows(&odd, 5, &[2, 2]);
    let int4 = TableOptions { storage: strata_storage::STRATA_STORAGE_INT4 as i32, ..TableOptions::default() };
    let mut t = null_mut();
    // SAFETY: as above.
    let s = unsafe { strata_table_from_partitioned(d.c(), null(), &int4, &mut t) };
    fails(s, Status::STRATA_INVALID_ARGUMENT, &["desc: dim = 5; int4 rows hold two values a byte"]);
    assert!(t.is_null());
}
