//! Property tests of the C ABI: random DLTensor descriptions for `keys` and `out`, fed to
//! `strata_lookup` / `strata_lookup_managed` / `strata_lookup_managed_versioned` exactly as a
//! C host would (through the library's `extern "C"` functions and `#[repr(C)]` types, the
//! definitions include/strata.h is generated from).
//!
//! Every description gets a buffer exactly as large as what it reaches (in both directions,
//! for negative strides), plus poisoned guard bytes before and after, so a description that
//! strata may legally serve is always in bounds. A model of the contract classifies each case:
//!
//! - *must fail* (bad dtype or device, wrong `out` shape, negative shape, strides or offset
//!   that overflow the address space, NULL data with elements, overlapping `out` elements,
//!   read-only or wrong-version managed tensors, negative `num_threads`): the call returns a
//!   listed non-OK status with a non-empty `strata_last_error`, and no byte of `out` changes;
//! - *may fail* (negative strides, misaligned elements, kDLCUDA in a host-only build, layout
//!   oddities of empty tensors, distinct-but-interleaved `out` strides that strata may refuse
//!   conservatively): either as above, or success with correct results;
//! - otherwise it must succeed: every element of `out` equals a reference gather (table value
//!   or default, converted to the out dtype with round-to-nearest-even), stats are exact, and
//!   every other byte of the buffer (guards, stride gaps) is still poison. With a
//!   `STRATA_MISSING_ERROR` table and a missing key, `STRATA_KEY_NOT_FOUND` naming the first
//!   missing key, with only `out`'s elements possibly written.
//!
//! `PROPTEST_CASES` sets the number of cases (default 256; the large-lookup property runs an
//! eighth as many).

mod common;
#[path = "common/dlfuzz.rs"]
mod dlfuzz;
use dlfuzz::*;

use dlpark::DlpackFlags;
use dlpark::ffi::{DLDeviceType, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion};
use proptest::prelude::*;
use strata::ffi::{
    strata_lookup, strata_lookup_managed, strata_lookup_managed_versioned, strata_lookup_options, strata_lookup_options_default,
    strata_lookup_stats,
};
type LookupOptions = strata_lookup_options;
type LookupStats = strata_lookup_stats;

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum OutShape {
    /// [*keys.shape, dim]
    Full,
    /// [numel(keys), dim]
    Flat,
    /// A perturbation of Full (may still happen to be valid; the model decides).
    Wrong(u8),
}

#[derive(Debug, Clone, Copy)]
enum Call {
    Plain,
    Managed,
    Versioned { keys_major: u32, out_major: u32, minor: u32, out_read_only: bool, keys_read_only: bool },
}

#[derive(Debug, Clone)]
struct Case {
    table: TableSpec,
    key_shape: Vec<i64>,
    key_layout: Layout,
    key_dtype: (u8, u8, u16),
    key_device: u32,
    key_seed: u64,
    out_shape: OutShape,
    out_layout: Layout,
    out_dtype: (u8, u8, u16),
    out_device: u32,
    call: Call,
    num_threads: Option<i32>,
    want_stats: bool,
}

fn out_shape_for(kshape: &[i64], dim: usize, how: OutShape) -> Vec<i64> {
    let dim = dim as i64;
    let numel: i64 = kshape.iter().map(|&s| s.max(0)).product();
    let mut full = kshape.to_vec();
    full.push(dim);
    match how {
        OutShape::Full => full,
        OutShape::Flat => vec![numel, dim],
        OutShape::Wrong(v) => match v % 8 {
            0 => {
                *full.last_mut().unwrap() += 1;
                full
            }
            1 => {
                *full.last_mut().unwrap() -= 1;
                full
            }
            2 => {
                full.pop();
                full
            }
            3 => {
                full.push(1);
                full
            }
            4 => vec![numel + 1, dim],
            5 => vec![dim, numel],
            6 => {
                full.insert(0, 1);
                full
            }
            _ => {
                if full.len() > 1 {
                    full[0] += 1;
                } else {
                    full.insert(0, 2);
                }
                full
            }
        },
    }
}

fn run_case(case: &Case) -> Result<(), TestCaseError> {
    let table = Table::build(&case.table);
    let dim = table.dim;
    let kdt = dt(case.key_dtype);
    let odt = dt(case.out_dtype);
    let kd = Kd::of(kdt);
    let od = Fl::of(odt);

    // Buffers.
    let mut kb = match Buffer::new(&case.key_shape, &case.key_layout, elem_of(kdt)) {
        Ok(b) => b,
        Err(()) => return Err(TestCaseError::reject("keys buffer too large")),
    };
    let oshape = out_shape_for(&case.key_shape, dim, case.out_shape);
    let mut ob = match Buffer::new(&oshape, &case.out_layout, elem_of(odt)) {
        Ok(b) => b,
        Err(()) => return Err(TestCaseError::reject("out buffer too large")),
    };

    if let Some(kd) = kd {
        fill_keys(&table, kd, &mut kb, case.key_seed);
    }
    let keys_before = kb.bytes().to_vec();

    // The model.
    let mut v = Verdict::default();
    let (kminor12, ominor12) = match case.call {
        Call::Versioned { minor, .. } if minor >= 2 => (kb.null_strides && !kb.shape.is_empty(), ob.null_strides && !ob.shape.is_empty()),
        _ => (false, false),
    };
    judge_tensor(&mut v, "keys", &kb, kd.is_some(), case.key_device, kminor12);
    judge_tensor(&mut v, "out", &ob, od.is_some(), case.out_device, ominor12);
    let n = kb.numel;
    if !kb.negative_shape && !ob.negative_shape {
        let mut full = case.key_shape.clone();
        full.push(dim as i64);
        if oshape != full && oshape != vec![n as i64, dim as i64] {
            v.must(INVALID_ARGUMENT, format!("out shape {oshape:?} for keys {:?}, dim {dim}", case.key_shape));
        }
    }
    if let Some(offs) = &ob.offsets {
        let mut sorted = offs.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            if n > 0 {
                v.must(INVALID_LAYOUT, "out elements overlap");
            }
        } else if ob.fails_sorted_rule {
            v.may(INVALID_LAYOUT, "out strides interleave (distinct, but beyond the conservative check)");
        }
    }
    if let Call::Versioned { keys_major, out_major, out_read_only, .. } = case.call {
        if keys_major != 1 {
            v.must(INVALID_ARGUMENT, "keys: DLPack major version");
        }
        if out_major != 1 {
            v.must(INVALID_ARGUMENT, "out: DLPack major version");
        }
        if out_read_only {
            v.must(READ_ONLY, "out flagged read-only");
        }
    }
    if matches!(case.num_threads, Some(t) if t < 0) {
        v.must(INVALID_ARGUMENT, "num_threads < 0");
    }

    // The reference gather, when the call may succeed.
    let expected = if v.must.is_empty() {
        let (kd, od) = (kd.expect("valid keys dtype"), od.expect("valid out dtype"));
        prop_assert_eq!(kb.offsets.as_ref().map_or(0, Vec::len), n);
        Some((plain_expected(&table, kd, &kb, od, &ob), od))
    } else {
        None
    };

    // The call.
    let kt = kb.tensor(kdt, device(case.key_device));
    let mut ot = ob.tensor(odt, device(case.out_device));
    let opts = case.num_threads.map(|t| {
        let mut o = strata_lookup_options_default();
        o.num_threads = t;
        o
    });
    let opts_p = opts.as_ref().map_or(std::ptr::null(), |o| o as *const LookupOptions);
    let mut stats = LookupStats { hits: 0xdead, misses: 0xbeef, volatile_hits: 0xdead, persistent_hits: 0xbeef, ..LookupStats::default() };
    let stats_p = if case.want_stats { &mut stats as *mut LookupStats } else { std::ptr::null_mut() };
    // SAFETY: table.ptr is a live table (Table). kt and ot describe kb's and ob's words through
    // their own shape and strides arrays, and the managed wrappers are locals; all outlive the
    // call. A description that reaches memory outside its buffer is one strata must refuse before
    // it touches an element (unaddressable, NULL data, a wrapping byte_offset, a bad dtype, shape
    // or device: `judge_tensor` lists them); every other reaches only elements that Buffer::new
    // placed inside its buffer. Host memory is labelled kDLCUDA only where no CUDA driver is
    // present. opts_p and stats_p are NULL or point at locals.
    let status = unsafe {
        match case.call {
            Call::Plain => strata_lookup(table.ptr, &kt, &mut ot, opts_p, stats_p) as i32,
            Call::Managed => {
                let km = DLManagedTensor { dl_tensor: kt, manager_ctx: std::ptr::null_mut(), deleter: None };
                let mut om = DLManagedTensor { dl_tensor: ot, manager_ctx: std::ptr::null_mut(), deleter: None };
                strata_lookup_managed(table.ptr, &km, &mut om, opts_p, stats_p) as i32
            }
            Call::Versioned { keys_major, out_major, minor, out_read_only, keys_read_only } => {
                let flags = |ro: bool| if ro { DlpackFlags::READ_ONLY } else { DlpackFlags::empty() };
                let km = DLManagedTensorVersioned {
                    version: DLPackVersion { major: keys_major, minor },
                    manager_ctx: std::ptr::null_mut(),
                    deleter: None,
                    flags: flags(keys_read_only),
                    dl_tensor: kt,
                };
                let mut om = DLManagedTensorVersioned {
                    version: DLPackVersion { major: out_major, minor },
                    manager_ctx: std::ptr::null_mut(),
                    deleter: None,
                    flags: flags(out_read_only),
                    dl_tensor: ot,
                };
                strata_lookup_managed_versioned(table.ptr, &km, &mut om, opts_p, stats_p) as i32
            }
        }
    };
    let msg = last_error();
    let ctx = || {
        format!(
            "status {} ({status}), message {msg:?}\nverdict: {:?}\nkeys: data {:?} + {} shape {:?} strides {:?} (null {})\n\
             out: data {:?} + {} shape {:?} strides {:?} (null {})",
            status_name(status),
            v.reasons,
            kb.data,
            kb.byte_offset,
            kb.shape,
            kb.strides,
            kb.null_strides,
            ob.data,
            ob.byte_offset,
            ob.shape,
            ob.strides,
            ob.null_strides
        )
    };

    prop_assert_eq!(kb.bytes(), &keys_before[..], "keys were written\n{}", ctx());

    if !v.must.is_empty() {
        prop_assert!(status != OK, "must fail\n{}", ctx());
        prop_assert!(v.must.contains(&status) || v.may.contains(&status), "unexpected status\n{}", ctx());
        prop_assert!(!msg.is_empty(), "no message\n{}", ctx());
        prop_assert!(untouched(&ob), "out written by a failing call\n{}", ctx());
        return Ok(());
    }
    let (e, od) = expected.expect("computed above");
    let key_error = table.missing_error && e.misses > 0;
    if status == OK || (status == KEY_NOT_FOUND && key_error) {
        // Elements in place (for OK), everything else poison (always).
        if let Err(what) = check_out(&ob, od, &e, status == OK) {
            prop_assert!(false, "{what}\n{}", ctx());
        }
        if status == OK {
            prop_assert!(!key_error, "missing key with STRATA_MISSING_ERROR but OK\n{}", ctx());
            if case.want_stats {
                prop_assert_eq!(stats, LookupStats { hits: e.hits, misses: e.misses, ..LookupStats::default() }, "stats\n{}", ctx());
            }
        } else {
            let first = e.first_miss.clone().unwrap().1;
            let named = msg.split(|c: char| !(c.is_ascii_digit() || c == '-')).any(|w| w == first);
            prop_assert!(named, "KEY_NOT_FOUND must name key {}\n{}", first, ctx());
        }
        return Ok(());
    }
    prop_assert!(v.may.contains(&status), "must succeed (or fail with STRATA_KEY_NOT_FOUND)\n{}", ctx());
    prop_assert!(!msg.is_empty(), "no message\n{}", ctx());
    prop_assert!(untouched(&ob), "out written by a failing call\n{}", ctx());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

fn call(odd: f64) -> impl Strategy<Value = Call> {
    let ro = move |p: f64| chance(p * odd);
    let major = move || prop_oneof![50 => Just(1u32), (if odd > 0.0 { 1 } else { 0 }) => Just(2u32)];
    prop_oneof![
        3 => Just(Call::Plain),
        1 => Just(Call::Managed),
        2 => (major(), major(), 0u32..4, ro(0.05), prop::bool::weighted(0.3)).prop_map(
            |(keys_major, out_major, minor, out_read_only, keys_read_only)| Call::Versioned {
                keys_major,
                out_major,
                minor,
                out_read_only,
                keys_read_only,
            }
        ),
    ]
}

fn num_threads(odd: f64) -> impl Strategy<Value = Option<i32>> {
    prop_oneof![
        3 => Just(None),
        6 => prop::sample::select(vec![0, 1, 2, 3, 8]).prop_map(Some),
        (if odd > 0.0 { 1 } else { 0 }) => Just(Some(-1)),
    ]
}

/// Small cases with every kind of oddity.
fn small_case() -> impl Strategy<Value = Case> {
    let key_shape = (prop::collection::vec(prop_oneof![1 => Just(0i64), 9 => 1i64..=5], 0..=4), prop::option::weighted(0.02, any::<u8>()))
        .prop_map(|(mut s, neg)| {
            if let (Some(i), false) = (neg, s.is_empty()) {
                let n = s.len();
                s[i as usize % n] = -1;
            }
            s
        });
    let out_shape = prop_oneof![
        12 => Just(OutShape::Full),
        6 => Just(OutShape::Flat),
        1 => any::<u8>().prop_map(OutShape::Wrong),
    ];
    (
        (table_spec(0..=50, 1..=40), key_shape, layout(0.6), key_dtype(0.6), device_code(1.0), any::<u64>()),
        (out_shape, layout(0.6), out_dtype(0.6), device_code(1.0)),
        (call(1.0), num_threads(1.0), any::<bool>()),
    )
        .prop_map(|(k, o, c)| Case {
            table: k.0,
            key_shape: k.1,
            key_layout: k.2,
            key_dtype: k.3,
            key_device: k.4,
            key_seed: k.5,
            out_shape: o.0,
            out_layout: o.1,
            out_dtype: o.2,
            out_device: o.3,
            call: c.0,
            num_threads: c.1,
            want_stats: c.2,
        })
}

/// Lookups big enough to be split over threads (> 2048 keys, > 256 KiB of output) and often to
/// take the streaming-store path (>= 4 MiB of output), on valid but varied layouts.
fn large_case() -> impl Strategy<Value = Case> {
    let key_shape = prop_oneof![(2049i64..30000).prop_map(|n| vec![n]), (40i64..170, 52i64..170).prop_map(|(a, b)| vec![a, b]),];
    let calm = |l: Layout| Layout { null_data: false, huge_byte_offset: false, ..l };
    (
        (table_spec(200..=3000, 16..=96), key_shape, layout(0.0).prop_map(calm), key_dtype(0.0), any::<u64>()),
        (prop_oneof![Just(OutShape::Full), Just(OutShape::Flat)], layout(0.0).prop_map(calm), out_dtype(0.0)),
        (prop_oneof![Just(None), prop::sample::select(vec![0, 2, 3, 4]).prop_map(Some)], any::<bool>()),
    )
        .prop_map(|(k, o, c)| Case {
            table: TableSpec { missing_error: false, ..k.0 },
            key_shape: k.1,
            key_layout: Layout { zero_stride: None, negative_stride: None, huge_stride: None, ..k.2 },
            key_dtype: k.3,
            key_device: DLDeviceType::CPU.0,
            key_seed: k.4,
            out_shape: o.0,
            out_layout: Layout { zero_stride: None, negative_stride: None, huge_stride: None, ..o.1 },
            out_dtype: o.2,
            out_device: DLDeviceType::CPU.0,
            call: Call::Plain,
            num_threads: c.0,
            want_stats: c.1,
        })
}

proptest! {
    #![proptest_config(config(cases_from_env()))]

    #[test]
    fn lookup_matches_reference_or_fails_cleanly(case in small_case()) {
        run_case(&case)?;
    }
}

proptest! {
    #![proptest_config(config((cases_from_env() / 8).max(8)))]

    #[test]
    fn large_lookups_match_reference_on_any_thread_count(case in large_case()) {
        run_case(&case)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Checks of the test's own reference
// ---------------------------------------------------------------------------------------------

#[test]
fn reference_conversions_agree_with_ieee() {
    // Exhaustive over float16: f16 -> f32 -> f16 is the identity for non-NaN values.
    for h in 0..=u16::MAX {
        if !Fl::F16.is_nan_bits(h as u32) {
            assert_eq!(f32_to_f16(f16_to_f32(h)), h, "{h:#x}");
        }
    }
    // Against the half crate on a sweep of f32 bit patterns (a second opinion on rounding).
    let mut r = Rng(7);
    for _ in 0..2_000_000 {
        let x = f32::from_bits(r.next() as u32);
        if x.is_nan() {
            continue;
        }
        assert_eq!(f32_to_f16(x), half::f16::from_f32(x).to_bits(), "{x:e}");
        assert_eq!(f32_to_bf16(x), half::bf16::from_f32(x).to_bits(), "{x:e}");
    }
    for x in [65519.0f32, 65520.0, 2f32.powi(-25), 1.5 * 2f32.powi(-25), 2f32.powi(-24) * 0.75, 1.0 + 2f32.powi(-11)] {
        assert_eq!(f32_to_f16(x), half::f16::from_f32(x).to_bits(), "{x:e}");
    }
    assert_eq!(f32_to_f16(65520.0), 0x7c00);
    assert_eq!(f32_to_f16(65519.0), 0x7bff);
    assert_eq!(f32_to_f16(2f32.powi(-25)), 0);
    assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
    assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
    assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
}

#[test]
fn buffers_reach_exactly_their_elements() {
    // A padded, permuted 3-D layout: offsets are distinct, in bounds, and the guards are clear.
    let l = Layout {
        null_strides: false,
        permute: Some(3),
        pads: vec![1, 2, 0, 3],
        zero_stride: None,
        negative_stride: None,
        huge_stride: None,
        offset_elems: 2,
        misalign: 0,
        split: 2,
        huge_byte_offset: false,
        null_data: false,
    };
    let b = Buffer::new(&[2, 3, 4], &l, 4).unwrap();
    let offs = b.offsets.clone().unwrap();
    let mut s = offs.clone();
    s.sort_unstable();
    s.dedup();
    assert_eq!(s.len(), 24);
    assert!(offs.iter().all(|&o| o >= GUARD && o + 4 + GUARD <= b.bytes().len()));
    assert_eq!(b.data as usize + b.byte_offset as usize, b.words.as_ptr() as usize + GUARD + 8);
    // Negative strides reach below element 0 and stay inside the buffer.
    let b = Buffer::new(&[3, 5], &Layout { negative_stride: Some(1), ..l.clone() }, 8).unwrap();
    assert!(b.negative_stride);
    let offs = b.offsets.unwrap();
    assert!(offs.iter().all(|&o| o >= GUARD && o + 8 + GUARD <= b.words.len() * 8));
    // Huge strides overflow; on a size-1 dimension they are harmless.
    let b = Buffer::new(&[3, 5], &Layout { huge_stride: Some((0, 0)), ..l.clone() }, 4).unwrap();
    assert!(b.unaddressable && b.offsets.is_none());
    let b = Buffer::new(&[1, 5], &Layout { huge_stride: Some((0, 0)), ..l }, 4).unwrap();
    assert!(!b.unaddressable && b.offsets.is_some());
}
