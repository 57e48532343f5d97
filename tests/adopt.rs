//! Adopting DLPack managed tensors: zero copy, the deleter runs exactly once at free (and never
//! on a failed adoption), and the managed lookup variants borrow without deleting.

mod common;
use common::*;
use dlpark::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor};
use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicUsize, Ordering};

/// What a producer keeps behind `manager_ctx`: the data, shape/strides and a deleter counter.
struct Producer {
    data: Vec<f32>,
    desc: Desc,
    deleted: &'static AtomicUsize,
}

fn producer(mut data: Vec<f32>, shape: &[i64], strides: &[i64], deleted: &'static AtomicUsize) -> Box<Producer> {
    // as_mut_ptr: strata writes through this pointer when the tensor is a lookup's `out`
    let desc = Desc::new(data.as_mut_ptr().cast(), F32, shape, strides, 0);
    Box::new(Producer { data, desc, deleted })
}

/// The deleter of the tensors `legacy` makes: frees the tensor and its producer.
///
/// # Safety
/// `m` must come from `legacy` and not have been deleted yet (strata calls a deleter at most
/// once, and the tests call it only on tensors that strata did not adopt).
unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    // SAFETY: m is the pointer Box::into_raw made in `legacy`, and a deleter runs at most once per
    // tensor (see # Safety), so the box is reclaimed once.
    let m = unsafe { Box::from_raw(m) };
    // SAFETY: manager_ctx is the Box<Producer> that `legacy` leaked for this tensor, reclaimed once
    // with it.
    let p = unsafe { Box::from_raw(m.manager_ctx as *mut Producer) };
    p.deleted.fetch_add(1, Ordering::SeqCst);
}

/// The deleter of the tensors `versioned` makes: frees the tensor and its producer.
///
/// # Safety
/// `m` must come from `versioned` and not have been deleted yet (strata calls a deleter at
/// most once, and the tests call it only on tensors that strata did not adopt).
unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    // SAFETY: m is the pointer Box::into_raw made in `versioned`, and a deleter runs at most once
    // per tensor (see # Safety), so the box is reclaimed once.
    let m = unsafe { Box::from_raw(m) };
    // SAFETY: manager_ctx is the Box<Producer> that `versioned` leaked for this tensor, reclaimed
    // once with it.
    let p = unsafe { Box::from_raw(m.manager_ctx as *mut Producer) };
    p.deleted.fetch_add(1, Ordering::SeqCst);
}

fn legacy(p: Box<Producer>) -> *mut DLManagedTensor {
    let t: DLTensor = p.desc.t;
    Box::into_raw(Box::new(DLManagedTensor { dl_tensor: t, manager_ctx: Box::into_raw(p) as *mut c_void, deleter: Some(delete_legacy) }))
}

fn versioned(p: Box<Producer>, version: DLPackVersion, flags: u64) -> *mut DLManagedTensorVersioned {
    let t: DLTensor = p.desc.t;
    Box::into_raw(Box::new(DLManagedTensorVersioned {
        version,
        manager_ctx: Box::into_raw(p) as *mut c_void,
        deleter: Some(delete_versioned),
        flags: dlpark::DlpackFlags::from_bits_retain(flags),
        dl_tensor: t,
    }))
}

const V1_0: DLPackVersion = DLPackVersion { major: 1, minor: 0 };

/// Looks up `keys` in `t`, which must be a live table (every caller passes one it has not
/// freed), into a fresh [keys, dim] output.
fn lookup_rows(t: *mut Table, keys: &[i64], dim: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; keys.len() * dim];
    let k = Desc::compact(keys.as_ptr().cast(), I64, &[keys.len() as i64]);
    let mut o = Desc::compact(out.as_mut_ptr().cast(), F32, &[keys.len() as i64, dim as i64]);
    // SAFETY: t is a live table (the promise of every caller, above); k and o describe keys and
    // out, which outlive the call.
    ok(unsafe { strata_lookup(t, &k.t, &mut o.t, null(), null_mut()) });
    out
}

#[test]
fn legacy_adoption_is_zero_copy_and_deletes_once() {
    static DELETED: AtomicUsize = AtomicUsize::new(0);
    let data: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let mut p = producer(data, &[4, 3], &[3, 1], &DELETED);
    let raw_data = p.data.as_mut_ptr();
    let m = legacy(p);
    let mut t = null_mut();
    // SAFETY: m is a fresh tensor from `legacy`; its producer keeps the 4x3 floats alive until the
    // deleter runs. t is a reference.
    ok(unsafe { strata_table_adopt_dlpack(m, null(), null(), &mut t) });
    assert_eq!(DELETED.load(Ordering::SeqCst), 0);
    assert_eq!(lookup_rows(t, &[2, 0], 3), vec![6.0, 7.0, 8.0, 0.0, 1.0, 2.0]);
    // zero copy: the producer's memory is the table's
    // SAFETY: raw_data (from as_mut_ptr) points at the producer's 12 floats, which the adopted
    // table keeps alive until it is freed below; element 7 is in bounds and no lookup is running.
    unsafe { *raw_data.add(7) = 70.0 };
    assert_eq!(lookup_rows(t, &[2], 3), vec![6.0, 70.0, 8.0]);
    let mut info = strata_table_info_default_0_3_1();
    // SAFETY: t is the live adopted table; info is a reference.
    ok(unsafe { strata_table_get_info(t, &mut info) });
    assert!(info.adopted && !info.mapped && !info.keyed);
    // SAFETY: t is the adopted table, freed once here and not used after.
    unsafe { strata_table_free(t) };
    assert_eq!(DELETED.load(Ordering::SeqCst), 1);
}

#[test]
fn versioned_adoption_with_keys_and_padded_rows() {
    static DELETED: AtomicUsize = AtomicUsize::new(0);
    // 3 rows of dim 2 with row stride 5
    let data: Vec<f32> = (0..15).map(|i| i as f32).collect();
    let p = producer(data, &[3, 2], &[5, 1], &DELETED);
    let m = versioned(p, V1_0, 1); // READ_ONLY vectors are fine for a table
    let keys = [10u32, 20, 30];
    let k = Desc::compact(keys.as_ptr().cast(), U32, &[3]);
    let mut t = null_mut();
    // SAFETY: m is a fresh tensor from `versioned` (15 floats for 3 rows of stride 5); k describes
    // keys, alive past the call; t is a reference.
    ok(unsafe { strata_table_adopt_dlpack_versioned(m, &k.t, null(), &mut t) });
    assert_eq!(lookup_rows(t, &[30, 10, 11], 2), vec![10.0, 11.0, 0.0, 1.0, 0.0, 0.0]);
    // the table may be freed from another thread; the deleter runs there, once
    let t = t as usize;
    // SAFETY: t is the address of the adopted table, which this thread hands over and never uses
    // again; the spawned thread frees it once (tables may be freed on any thread).
    std::thread::spawn(move || unsafe { strata_table_free(t as *mut Table) }).join().unwrap();
    assert_eq!(DELETED.load(Ordering::SeqCst), 1);
}

#[test]
fn failed_adoption_leaves_ownership_with_the_caller() {
    static DELETED: AtomicUsize = AtomicUsize::new(0);
    let cases: Vec<(Box<Producer>, DLPackVersion, Status, &str)> = vec![
        (producer(vec![0.0; 8], &[8], &[1], &DELETED), V1_0, Status::STRATA_INVALID_ARGUMENT, "vectors: ndim = 1"),
        (producer(vec![0.0; 8], &[4, 2], &[1, 4], &DELETED), V1_0, Status::STRATA_INVALID_LAYOUT, "unit element stride"),
        (
            producer(vec![0.0; 8], &[4, 2], &[1, 1], &DELETED),
            V1_0,
            Status::STRATA_INVALID_LAYOUT,
            "strides[0] = 1 is less than dim = 2; rows overlap",
        ),
        (producer(vec![0.0; 8], &[2, 2], &[-2, 1], &DELETED), V1_0, Status::STRATA_INVALID_LAYOUT, "strides[0] = -2 is negative"),
        (
            producer(vec![0.0; 8], &[4, 2], &[2, 1], &DELETED),
            DLPackVersion { major: 2, minor: 0 },
            Status::STRATA_INVALID_ARGUMENT,
            "DLPack version 2.0; expected major version 1",
        ),
    ];
    for (i, (p, version, want, needle)) in cases.into_iter().enumerate() {
        let m = versioned(p, version, 0);
        let mut t = null_mut();
        // SAFETY: m is a fresh tensor from `versioned`, not deleted; t is a reference.
        let s = unsafe { strata_table_adopt_dlpack_versioned(m, null(), null(), &mut t) };
        fails(s, want, &[needle]);
        assert!(t.is_null());
        assert_eq!(DELETED.load(Ordering::SeqCst), i, "deleter called on a failed adoption");
        // the caller still owns it: release it as a producer would
        // SAFETY: the adoption failed, so m is still the caller's: live, and its deleter has not
        // run; it runs once here.
        unsafe { ((*m).deleter.unwrap())(m) };
    }
    // a versioned 1.2 tensor must carry strides
    let p = producer(vec![0.0; 8], &[4, 2], &[2, 1], &DELETED);
    let m = versioned(p, DLPackVersion { major: 1, minor: 2 }, 0);
    // SAFETY: m is the live Box from `versioned`, which strata has not seen yet.
    unsafe { (*m).dl_tensor.strides = null_mut() };
    let mut t = null_mut();
    // SAFETY: m is live, with NULL strides only (its shape and data are the producer's); t is a
    // reference.
    let s = unsafe { strata_table_adopt_dlpack_versioned(m, null(), null(), &mut t) };
    fails(s, Status::STRATA_INVALID_LAYOUT, &["strides is NULL in a DLPack 1.2 tensor"]);
    // SAFETY: the adoption failed, so m is still the caller's: live, and its deleter has not run;
    // it runs once here.
    unsafe { ((*m).deleter.unwrap())(m) };
    // duplicate keys fail after the vectors were checked: still not deleted
    let p = producer(vec![0.0; 8], &[4, 2], &[2, 1], &DELETED);
    let m = legacy(p);
    let dup = [1i64, 1, 2, 3];
    let k = Desc::compact(dup.as_ptr().cast(), I64, &[4]);
    // SAFETY: m is a fresh tensor from `legacy`; k describes dup, alive past the call; t is a
    // reference.
    let s = unsafe { strata_table_adopt_dlpack(m, &k.t, null(), &mut t) };
    fails(s, Status::STRATA_DUPLICATE_KEY, &["keys: key 1 appears at rows 0 and 1"]);
    assert_eq!(DELETED.load(Ordering::SeqCst), 6);
    // SAFETY: the adoption failed, so m is still the caller's: live, and its deleter has not run;
    // it runs once here.
    unsafe { ((*m).deleter.unwrap())(m) };
    assert_eq!(DELETED.load(Ordering::SeqCst), 7);
}

#[test]
fn managed_lookups_borrow_and_refuse_read_only_out() {
    static DELETED: AtomicUsize = AtomicUsize::new(0);
    let vectors: Vec<f32> = (0..20).map(|i| i as f32 * 0.5).collect();
    let table = Owned::build(&vectors, 5, 4, None, &TableOptions::default());

    // keys as a managed float buffer is wrong; build keys by hand
    let keys = [4i64, 1, 9];
    let kdesc = Desc::compact(keys.as_ptr().cast(), I64, &[3]);
    let kl = DLManagedTensor { dl_tensor: kdesc.t, manager_ctx: null_mut(), deleter: None };
    let out = producer(vec![f32::NAN; 12], &[3, 4], &[4, 1], &DELETED);
    let out_data = out.data.as_ptr();
    let ol = legacy(out);
    let mut s = LookupStats::default();
    // SAFETY: table is live; kl describes keys and ol is a fresh tensor from `legacy`, whose 12
    // floats live until its deleter runs below; s is a reference. strata borrows them and deletes
    // nothing.
    ok(unsafe { strata_lookup_managed(table.0, &kl, ol, null(), &mut s) });
    // SAFETY: out_data points at ol's 12 floats, still alive (its deleter has not run) and not
    // written during this borrow.
    let got = unsafe { std::slice::from_raw_parts(out_data, 12) };
    assert_eq!(got, &[8.0, 8.5, 9.0, 9.5, 2.0, 2.5, 3.0, 3.5, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!((s.hits, s.misses), (2, 1));
    assert_eq!(DELETED.load(Ordering::SeqCst), 0, "lookup must not call deleters");
    // SAFETY: strata borrowed ol and never deleted it, so it is live and its deleter runs once
    // here.
    unsafe { ((*ol).deleter.unwrap())(ol) };

    let kv = DLManagedTensorVersioned {
        version: V1_0,
        manager_ctx: null_mut(),
        deleter: None,
        flags: dlpark::DlpackFlags::READ_ONLY, // read-only keys are fine
        dl_tensor: kdesc.t,
    };
    let out = producer(vec![f32::NAN; 12], &[3, 4], &[4, 1], &DELETED);
    let out_data = out.data.as_ptr();
    let ov = versioned(out, V1_0, 0);
    // SAFETY: table is live; kv describes keys and ov is a fresh tensor from `versioned`, whose 12
    // floats live until its deleter runs below. strata borrows them and deletes nothing.
    ok(unsafe { strata_lookup_managed_versioned(table.0, &kv, ov, null(), null_mut()) });
    // SAFETY: out_data points at ov's 12 floats, still alive (its deleter has not run); element 4
    // is in bounds.
    assert_eq!(unsafe { *out_data.add(4) }, 2.0);
    // SAFETY: strata borrowed ov and never deleted it, so it is live and its deleter runs once
    // here.
    unsafe { ((*ov).deleter.unwrap())(ov) };

    let out = producer(vec![-1.0; 12], &[3, 4], &[4, 1], &DELETED);
    let out_data = out.data.as_ptr();
    let ro = versioned(out, V1_0, 1);
    // SAFETY: table is live; kv describes keys and ro is a fresh tensor from `versioned` (flagged
    // read-only), whose 12 floats live until its deleter runs below.
    let st = unsafe { strata_lookup_managed_versioned(table.0, &kv, ro, null(), null_mut()) };
    fails(st, Status::STRATA_READ_ONLY, &["out: is flagged DLPACK_FLAG_BITMASK_READ_ONLY"]);
    // SAFETY: out_data points at ro's 12 floats, still alive (its deleter has not run) and not
    // written during this borrow.
    assert!(unsafe { std::slice::from_raw_parts(out_data, 12) }.iter().all(|&x| x == -1.0));
    // SAFETY: strata borrowed ro and never deleted it, so it is live and its deleter runs once
    // here.
    unsafe { ((*ro).deleter.unwrap())(ro) };
    let kbad = DLManagedTensorVersioned { version: DLPackVersion { major: 3, minor: 0 }, ..kv };
    let out = producer(vec![-1.0; 12], &[3, 4], &[4, 1], &DELETED);
    let ov = versioned(out, V1_0, 0);
    // SAFETY: table is live; kbad describes keys and ov is a fresh tensor from `versioned`, whose
    // data lives until its deleter runs below.
    let st = unsafe { strata_lookup_managed_versioned(table.0, &kbad, ov, null(), null_mut()) };
    fails(st, Status::STRATA_INVALID_ARGUMENT, &["keys: DLPack version 3.0"]);
    // SAFETY: strata borrowed ov and never deleted it, so it is live and its deleter runs once
    // here.
    unsafe { ((*ov).deleter.unwrap())(ov) };
    assert_eq!(DELETED.load(Ordering::SeqCst), 4);
}

/// NULL strides in the managed lookup variants, by DLPack version: a legacy DLManagedTensor and a
/// versioned tensor before 1.2 may pass them for compact row-major data (accepted); from 1.2 on
/// a producer must give strides for ndim > 0, so NULL is refused with STRATA_INVALID_LAYOUT
/// naming the tensor, and `out` is left untouched. NULL options and stats.
#[test]
fn managed_lookups_and_null_strides_by_dlpack_version() {
    let vectors: Vec<f32> = (0..20).map(|i| i as f32).collect();
    let v = Desc::compact(vectors.as_ptr().cast(), F32, &[5, 4]);
    let mut t = null_mut();
    // SAFETY: v describes vectors, alive past the call (strata copies it); t is a reference.
    ok(unsafe { strata_table_from_dlpack(&v.t, null(), null(), &mut t) });
    let keys = [3i64, 0, 7]; // 7 is missing: default row (0)
    let want = [12.0, 13.0, 14.0, 15.0, 0.0, 1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0];
    let mut out = vec![-1.0f32; 12];
    // the descriptions own the shapes and strides the tensors below point to
    let kd = Desc::compact(keys.as_ptr().cast(), I64, &[3]);
    let od = Desc::compact(out.as_mut_ptr().cast(), F32, &[3, 4]);
    let (k_strided, o_strided) = (kd.t, od.t);
    let k_null = DLTensor { strides: null_mut(), ..k_strided };
    let o_null = DLTensor { strides: null_mut(), ..o_strided };
    let managed = |dl_tensor: DLTensor, minor: u32| DLManagedTensorVersioned {
        version: DLPackVersion { major: 1, minor },
        manager_ctx: null_mut(),
        deleter: None,
        flags: dlpark::DlpackFlags::empty(),
        dl_tensor,
    };
    // SAFETY: t is the live table built above (freed at the end of the test); k and o wrap kd's and
    // od's tensors, which describe keys and out (alive to the end of the test) and own the shapes
    // and strides they point to; NULL strides are given only for these compact tensors.
    let lookup = |k: &DLManagedTensorVersioned, mut o: DLManagedTensorVersioned| unsafe {
        strata_lookup_managed_versioned(t, k, &mut o, null(), null_mut())
    };

    // legacy managed tensors carry no version: NULL strides are row-major
    let kl = DLManagedTensor { dl_tensor: k_null, manager_ctx: null_mut(), deleter: None };
    let mut ol = DLManagedTensor { dl_tensor: o_null, manager_ctx: null_mut(), deleter: None };
    // SAFETY: t is live; kl and ol wrap the tensors of kd and od (see `lookup`) with NULL strides,
    // which mean row-major for these compact tensors.
    ok(unsafe { strata_lookup_managed(t, &kl, &mut ol, null(), null_mut()) });
    assert_eq!(out, want);
    for minor in [0, 1] {
        out.fill(-1.0);
        ok(lookup(&managed(k_null, minor), managed(o_null, minor)));
        assert_eq!(out, want, "DLPack 1.{minor}, NULL strides");
    }
    for minor in [2, 3] {
        out.fill(-1.0);
        let s = lookup(&managed(k_null, minor), managed(o_strided, minor));
        fails(s, Status::STRATA_INVALID_LAYOUT, &[&format!("keys: strides is NULL in a DLPack 1.{minor} tensor")]);
        let s = lookup(&managed(k_strided, minor), managed(o_null, minor));
        fails(s, Status::STRATA_INVALID_LAYOUT, &[&format!("out: strides is NULL in a DLPack 1.{minor} tensor")]);
        assert!(out.iter().all(|&x| x == -1.0), "a refused lookup wrote out");
        // with explicit strides the same versions are served
        ok(lookup(&managed(k_strided, minor), managed(o_strided, minor)));
        assert_eq!(out, want, "DLPack 1.{minor}, explicit strides");
    }
    // SAFETY: t was built above by strata_table_from_dlpack and is not used after this free.
    unsafe { strata_table_free(t) };
}
