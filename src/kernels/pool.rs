//! Pooling kernels: `acc (+)= Σᵢ wᵢ · rowᵢ` over a run of rows, in index order, in float32, a
//! multiply then an add per element (no fused multiply-add, so every instruction set rounds as
//! the contract's reference loop does). Without weights the multiply by 1 is left out (exact).
//!
//! How the speed comes (what FBGEMM's `EmbeddingSpMDM` does too): the accumulator lives in
//! vector registers for the whole run of rows, a pass of up to 16 vectors (AVX-512; AVX2 16 for float32 rows without weights, else 8)
//! at a time, so a row costs its loads and adds and nothing else; rows are prefetched, every
//! cache line of the row 16 rows further (fewer for rows over 8 lines), across bag boundaries; half-precision
//! rows are widened in registers (F16C's `vcvtph2ps`; bfloat16 by a 16-bit shift, or, where one
//! pass covers a row, a shift and an AND of one load: even and odd columns, put back in order
//! once a bag). Rows wider
//! than one pass take several passes over the same rows, the later ones from L1.
//!
//! The accumulator travels by value (`[S::V; R]` in and out of every loop): handed by `&mut`,
//! LLVM kept it in memory and stored it back after every row.

use super::Isa;
use super::format::{RowFormat, fp8_scale, int4_params, int8_params};
use crate::dlpack::FloatDtype;

/// Cache lines of rows kept in flight ahead of the row being added: 16 rows (what FBGEMM's
/// kernels prefetch ahead) of up to 8 lines, fewer rows when rows are wider, never fewer than 4.
const LINES_AHEAD: usize = 128;

/// Where a run's rows are.
trait Source {
    /// Row `i`'s address (NULL: the default row).
    ///
    /// # Safety
    /// `i` below the source's length.
    unsafe fn row(&self, i: usize) -> *const u8;
    /// Row `i`'s address, which the caller knows is there (not missing); for a dense store, a
    /// key past it gives the store's last row, never an address outside it.
    ///
    /// # Safety
    /// As for [`Source::row`].
    unsafe fn present(&self, i: usize) -> *const u8;
    /// An address to prefetch for row `i` (any address: a prefetch is a hint).
    ///
    /// # Safety
    /// As for [`Source::row`].
    unsafe fn hint(&self, i: usize) -> *const u8;
}

/// Rows by address.
struct Ptrs(*const *const u8);

impl Source for Ptrs {
    #[inline(always)]
    unsafe fn row(&self, i: usize) -> *const u8 {
        // SAFETY: the caller keeps i below the slice's length.
        unsafe { *self.0.add(i) }
    }
    #[inline(always)]
    unsafe fn present(&self, i: usize) -> *const u8 {
        // SAFETY: as for row.
        unsafe { *self.0.add(i) }
    }
    #[inline(always)]
    unsafe fn hint(&self, i: usize) -> *const u8 {
        // SAFETY: as for row.
        unsafe { *self.0.add(i) }
    }
}

/// Rows of a dense store by row number: key `k` is row `k` below `rows` (else missing);
/// `rows` is at least 1.
struct Indexed {
    keys: *const u64,
    base: *const u8,
    stride: usize,
    rows: u64,
}

impl Source for Indexed {
    #[inline(always)]
    unsafe fn row(&self, i: usize) -> *const u8 {
        // SAFETY: the caller keeps i below the keys' length; the address is only formed here.
        let k = unsafe { *self.keys.add(i) };
        if k < self.rows { self.base.wrapping_add(k as usize * self.stride) } else { std::ptr::null() }
    }
    #[inline(always)]
    unsafe fn present(&self, i: usize) -> *const u8 {
        // SAFETY: as for row. A key past the store is clamped to its last row (rows >= 1), so a
        // caller that pools before it counts the misses reads nothing outside the store.
        let k = unsafe { *self.keys.add(i) }.min(self.rows - 1);
        self.base.wrapping_add(k as usize * self.stride)
    }
    #[inline(always)]
    unsafe fn hint(&self, i: usize) -> *const u8 {
        // SAFETY: as for row; the address is only prefetched (any key: the product wraps).
        self.base.wrapping_add((unsafe { *self.keys.add(i) } as usize).wrapping_mul(self.stride))
    }
}

/// What one kernel call works on (raw, checked by [`Pooler::add`] and [`Pooler::pool_bags`]).
struct Args<Src> {
    acc: *mut f32,
    zero: bool,
    src: Src,
    len: usize,
    lo: usize,
    hi: usize,
    weights: *const f32,
    default: *const f32,
    dim: usize,
    ahead: usize,
    row_bytes: usize,
    /// Whether every row starts on a cache line (a dense store whose base and row stride are
    /// multiples of 64 bytes).
    lines_aligned: bool,
    /// Whole-bag calls ([`Pooler::pool_bags`]): `nbags + 1` bag starts into the rows, how each
    /// bag is divided, and where bag `j`'s row goes (`out + j * out_stride` elements of
    /// `out_dtype`).
    starts: *const usize,
    /// Subtracted from every bag start (a group's first key, where the starts are the caller's
    /// offsets).
    first: usize,
    nbags: usize,
    divide: Divide,
    out: *mut u8,
    out_stride: usize,
    out_dtype: FloatDtype,
}

impl<Src> Args<Src> {
    /// Bag `j`'s rows (`j < nbags`).
    ///
    /// # Safety
    /// A whole-bag call's `Args` ([`Pooler::pool_bags`] checked the starts).
    #[inline(always)]
    unsafe fn bag(&self, j: usize) -> (usize, usize) {
        // SAFETY: starts holds nbags + 1 entries, each at least `first`.
        unsafe { (*self.starts.add(j) - self.first, *self.starts.add(j + 1) - self.first) }
    }

    /// Whether rows may not start on cache lines, so that a row's last byte can sit one line
    /// past those its length covers (prefetched with one more hint).
    fn last_line(&self) -> bool {
        !(self.lines_aligned && self.row_bytes.is_multiple_of(64))
    }
}

/// What a bag's sum is divided by before it is written (the contract's pooling modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Divide {
    /// Nothing: the sum.
    Nothing,
    /// Σ wⱼ (the bag's length without weights): mean.
    WeightSum,
    /// √(Σ wⱼ²) (√length without weights): sqrtn.
    RootSquareSum,
}

/// Where the rows of a [`Pooler::pool_bags`] call are.
pub enum RowsOf<'a> {
    /// Addresses, NULL for the default row.
    Ptrs(&'a [*const u8]),
    /// Row numbers of a dense store: `keys[i]` below `rows` is the row at `base + keys[i] *
    /// stride`; other keys are missing (the default row).
    Dense { base: *const u8, stride: usize, rows: usize, keys: &'a [u64] },
}

type PoolFn = unsafe fn(&Args<Ptrs>);
type IndexedFn = unsafe fn(&Args<Indexed>);

/// The kernels of one (element type, instruction set): runs (from addresses) and whole bags
/// (from addresses or a dense store), indexed by [weighted][rows may be missing].
#[derive(Clone, Copy)]
struct Family {
    run: [PoolFn; 2],
    bags: [[PoolFn; 2]; 2],
    bags_indexed: [[IndexedFn; 2]; 2],
}

/// The pooling kernel of one stored dtype and row width, for the chosen instruction set. Cheap
/// to copy; pick one per call ([`Pooler::new`]) and use it from any thread.
#[derive(Clone, Copy)]
pub struct Pooler {
    f: Family,
    dim: usize,
    row_bytes: usize,
    ahead: usize,
}

impl Pooler {
    /// The kernel for rows of `dim` values stored as `format` (a float dtype or a quantized
    /// layout), on the library's instruction set.
    pub fn new(format: impl Into<RowFormat>, dim: usize) -> Pooler {
        Pooler::with_isa(super::isa(), format, dim)
    }

    /// The kernel on instruction set `isa`, which must not be above [`Isa::detected`] (a higher
    /// one is lowered to it).
    pub fn with_isa(isa: Isa, format: impl Into<RowFormat>, dim: usize) -> Pooler {
        let isa = isa.min(Isa::detected());
        let format = format.into();
        let f = match format {
            RowFormat::Float(FloatDtype::F32) => family::<F32>(isa),
            RowFormat::Float(FloatDtype::F16) => family::<F16>(isa),
            RowFormat::Float(FloatDtype::BF16) => family::<BF16>(isa),
            RowFormat::Int8 => family::<Int8>(isa),
            RowFormat::Int4 => family::<Int4>(isa),
            RowFormat::Fp8 => family::<Fp8>(isa),
        };
        let row_bytes = format.row_bytes(dim);
        let ahead = (LINES_AHEAD / row_bytes.div_ceil(64).max(1)).clamp(4, 16);
        Pooler { f, dim, row_bytes, ahead }
    }

    /// Adds rows `ptrs[lo..hi]` (each `dim` values of the dtype, at any alignment of its element;
    /// NULL stands for `default`, `dim` float32 values), each times `weights[i]` when weights are
    /// given, into `acc` (`dim` float32), which starts from zero when `zero` is set. Rows
    /// `ptrs[hi..]` (any, up to 16 further) are prefetched.
    ///
    /// # Safety
    /// Every non-NULL `ptrs[i]` for `lo <= i < hi` must be readable for a whole row. Pointers
    /// past `hi` are only prefetched (a hint: any value is fine).
    ///
    /// # Panics
    /// When `acc` or `default` is not `dim` long, `lo > hi`, or `ptrs` or `weights` is shorter
    /// than `hi`.
    #[inline]
    #[allow(clippy::too_many_arguments)] // one run: the accumulator, the rows, the range, the weights
    pub unsafe fn add(
        &self,
        acc: &mut [f32],
        zero: bool,
        ptrs: &[*const u8],
        lo: usize,
        hi: usize,
        weights: Option<&[f32]>,
        default: &[f32],
    ) {
        assert!(acc.len() == self.dim && default.len() == self.dim && lo <= hi && hi <= ptrs.len(), "pooling kernel arguments");
        if let Some(w) = weights {
            assert!(w.len() >= hi, "pooling kernel weights");
        }
        let a = Args {
            acc: acc.as_mut_ptr(),
            zero,
            src: Ptrs(ptrs.as_ptr()),
            len: ptrs.len(),
            lo,
            hi,
            weights: weights.map_or(std::ptr::null(), |w| w.as_ptr()),
            default: default.as_ptr(),
            dim: self.dim,
            ahead: self.ahead,
            row_bytes: self.row_bytes,
            lines_aligned: false,
            starts: std::ptr::null(),
            first: 0,
            nbags: 0,
            divide: Divide::Nothing,
            out: std::ptr::null_mut(),
            out_stride: 0,
            out_dtype: FloatDtype::F32,
        };
        let f = self.f.run[weights.is_some() as usize];
        // SAFETY: the lengths were checked above; the rows are readable by this function's
        // contract; `f` was picked for an instruction set this CPU has (with_isa lowers to
        // Isa::detected).
        unsafe { f(&a) }
    }

    /// Pools whole bags: bag `j` is rows `starts[j] - first .. starts[j + 1] - first` of `rows`
    /// (so a caller's offsets serve as they are, `first` their group's first key), each times
    /// its weight when weights are given, added in order from zero, divided as `divide` says (a
    /// zero divisor gives zeros, as an empty bag does), and written as `dim` values of
    /// `out_dtype` (rounded to nearest even) at `out + j * out_stride` elements. The accumulator
    /// never leaves the registers for rows of up to 256 (AVX-512) or 64 values; wider rows take
    /// several passes over each bag.
    /// `missing` false promises that no row is missing (no NULL address, no key past a dense
    /// store's rows): the kernel then checks none. A dense store's key past it is then no
    /// memory error: the kernel pools the store's last row in its place (the default row for
    /// elements past the row's last whole vector), so a caller may pool
    /// first, count the misses while the keys are in cache, and pool again with `missing` true
    /// where there were any.
    ///
    /// # Safety
    /// Every row `rows` names for a key of a bag must be readable (as [`Pooler::add`] and
    /// [`RowsOf`] say), and with `missing` false every address in `RowsOf::Ptrs` must name one;
    /// `out + j * out_stride` must be writable for `dim` values of `out_dtype` for every bag
    /// `j`, and not overlap the rows; `starts` must be non-decreasing (the offsets a plan
    /// validated: checked again only in debug builds, as it was measured together with
    /// rebuilding the starts, at 13-20% of a one-key bag's time).
    ///
    /// # Panics
    /// When `default` is not `dim` long, `starts` is empty, starts below `first` or ends past
    /// the rows, or `weights` is shorter than the rows.
    #[allow(clippy::too_many_arguments)] // the rows, the bags, the pooling, the output
    pub unsafe fn pool_bags(
        &self,
        rows: RowsOf,
        missing: bool,
        starts: &[usize],
        first: usize,
        weights: Option<&[f32]>,
        default: &[f32],
        divide: Divide,
        out: *mut u8,
        out_dtype: FloatDtype,
        out_stride: usize,
    ) {
        let len = match &rows {
            RowsOf::Ptrs(p) => p.len(),
            RowsOf::Dense { keys, .. } => keys.len(),
        };
        assert!(
            default.len() == self.dim && !starts.is_empty() && starts[0] >= first && starts[starts.len() - 1] - first <= len,
            "pooling kernel arguments"
        );
        debug_assert!(starts.windows(2).all(|w| w[0] <= w[1]), "pooling kernel bag starts");
        if let Some(w) = weights {
            assert!(w.len() >= len, "pooling kernel weights");
        }
        // An empty dense store has no row to stand in for a missing one.
        let missing = missing || matches!(rows, RowsOf::Dense { rows: 0, .. });
        let (w, m) = (weights.is_some() as usize, missing as usize);
        let nbags = starts.len() - 1;
        macro_rules! args {
            ($src:expr, $aligned:expr) => {
                Args {
                    acc: std::ptr::null_mut(),
                    zero: true,
                    src: $src,
                    len,
                    lo: 0,
                    hi: 0,
                    weights: weights.map_or(std::ptr::null(), |w| w.as_ptr()),
                    default: default.as_ptr(),
                    dim: self.dim,
                    ahead: self.ahead,
                    row_bytes: self.row_bytes,
                    lines_aligned: $aligned,
                    starts: starts.as_ptr(),
                    first,
                    nbags,
                    divide,
                    out,
                    out_stride,
                    out_dtype,
                }
            };
        }
        // SAFETY: the lengths and bag starts were checked above; the rows and the output rows
        // are valid by this function's contract; the kernels were picked for an instruction set
        // this CPU has.
        unsafe {
            match rows {
                RowsOf::Ptrs(p) => (self.f.bags[w][m])(&args!(Ptrs(p.as_ptr()), false)),
                RowsOf::Dense { base, stride, rows, keys } => {
                    let aligned = (base as usize).is_multiple_of(64) && stride.is_multiple_of(64);
                    (self.f.bags_indexed[w][m])(&args!(Indexed { keys: keys.as_ptr(), base, stride, rows: rows as u64 }, aligned))
                }
            }
        }
    }
}

/// Every kernel of element type `E` on `isa`.
fn family<E: Elem>(isa: Isa) -> Family {
    macro_rules! of {
        ($($isa:ident)::+) => {
            Family {
                run: [$($isa)::+::<E, Ptrs, false, false, true>, $($isa)::+::<E, Ptrs, true, false, true>],
                bags: [
                    [$($isa)::+::<E, Ptrs, false, true, false>, $($isa)::+::<E, Ptrs, false, true, true>],
                    [$($isa)::+::<E, Ptrs, true, true, false>, $($isa)::+::<E, Ptrs, true, true, true>],
                ],
                bags_indexed: [
                    [$($isa)::+::<E, Indexed, false, true, false>, $($isa)::+::<E, Indexed, false, true, true>],
                    [$($isa)::+::<E, Indexed, true, true, false>, $($isa)::+::<E, Indexed, true, true, true>],
                ],
            }
        };
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => of!(x86::avx512),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => of!(x86::avx2),
        _ => of!(portable),
    }
}

/// The vector operations a kernel is written in. Implementations are `#[inline(always)]`, and
/// are only called from functions compiled for their instruction set.
trait Simd {
    type V: Copy;
    const LANES: usize;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn load_f16(p: *const u16) -> Self::V;
    unsafe fn load_bf16(p: *const u16) -> Self::V;
    /// `2 * LANES` bfloat16 from `p`, widened to float32 as two vectors in an order of this
    /// set's own choosing, which [`Simd::unpair`] undoes (AVX2, AVX-512: the even columns, then
    /// the odd ones, from one load, a shift and an AND: no shuffle a row).
    #[inline(always)]
    unsafe fn load_bf16_pair(p: *const u16) -> (Self::V, Self::V) {
        // SAFETY: the caller's p holds 2 * LANES bfloat16.
        unsafe { (Self::load_bf16(p), Self::load_bf16(p.add(Self::LANES))) }
    }
    /// Two vectors in the order of [`Simd::load_bf16_pair`] (or sums of such vectors, lane by
    /// lane), back in column order.
    #[inline(always)]
    unsafe fn unpair(a: Self::V, b: Self::V) -> (Self::V, Self::V) {
        (a, b)
    }
    /// `LANES` bytes, each widened to float32.
    unsafe fn load_u8(p: *const u8) -> Self::V;
    /// `LANES / 2` bytes of 4-bit values (low nibble first), each widened to float32.
    unsafe fn load_u4(p: *const u8) -> Self::V;
    /// `LANES` float8 e4m3fn values, widened to float32 (exact; as `format::e4m3_to_f32`).
    unsafe fn load_e4m3(p: *const u8) -> Self::V;
    /// `a * b + c`, rounded once.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    /// Stores as float16, rounded to nearest even.
    unsafe fn store_f16(p: *mut u16, v: Self::V);
    /// Stores as bfloat16, rounded to nearest even (NaN stays a quiet NaN).
    unsafe fn store_bf16(p: *mut u16, v: Self::V);
}

/// A stored row format: how a vector of its values becomes float32. Quantized formats read
/// their row's scale and bias once per row ([`Elem::params`]) and dequantize with one fused
/// multiply-add per value, as [`super::format::value`] does.
trait Elem {
    /// The format.
    const FORMAT: RowFormat;
    /// Whether rows are float32 (a missing row is then one more row of the same type: the
    /// default row).
    const F32: bool = false;
    /// Bytes of `n` values (`n` a multiple of the lanes).
    fn bytes(n: usize) -> usize;
    /// The row's scale and bias, splat (unused by float formats).
    #[inline(always)]
    unsafe fn params<S: Simd>(_row: *const u8, _dim: usize) -> (S::V, S::V) {
        // SAFETY: no memory is touched.
        unsafe { (S::zero(), S::zero()) }
    }
    /// `S::LANES` values from value `col` of the row at `row`, whose [`Elem::params`] are `p`.
    unsafe fn load<S: Simd>(row: *const u8, col: usize, p: (S::V, S::V)) -> S::V;
    /// `2 * S::LANES` values from value `col`, as two vectors in an order [`Elem::unpair`]
    /// undoes (column order unless the format overrides both).
    #[inline(always)]
    unsafe fn load_pair<S: Simd>(row: *const u8, col: usize, p: (S::V, S::V)) -> (S::V, S::V) {
        // SAFETY: the caller's row holds 2 * LANES values from col.
        unsafe { (Self::load::<S>(row, col, p), Self::load::<S>(row, col + S::LANES, p)) }
    }
    /// Two vectors (or lane-by-lane sums of them) in [`Elem::load_pair`]'s order, in column order.
    #[inline(always)]
    unsafe fn unpair<S: Simd>(a: S::V, b: S::V) -> (S::V, S::V) {
        (a, b)
    }
    /// Pools the bags of a whole-bag call whose rows are one pass of `R` vectors, none missing,
    /// with vectors loaded in pairs ([`bags_paired`]), and says true; false (nothing done) for
    /// formats whose pairs have no order of their own, which need no such kernel.
    ///
    /// # Safety
    /// As for [`bags_one_pass`] with `M` false.
    #[inline(always)]
    unsafe fn pool_paired<S: Simd, Src: Source, const R: usize, const W: bool, const HOW: u8>(_a: &Args<Src>) -> bool {
        false
    }
    /// Value `col` of the row of `dim` values at `row`.
    #[inline(always)]
    unsafe fn scalar(row: *const u8, dim: usize, col: usize) -> f32 {
        // SAFETY: the caller's row holds the format's row of dim values, col < dim.
        unsafe { super::format::value(Self::FORMAT, row, dim, col) }
    }
}

struct F32;
struct F16;
struct BF16;
struct Int8;
struct Int4;
struct Fp8;

impl Elem for F32 {
    const FORMAT: RowFormat = RowFormat::Float(FloatDtype::F32);
    const F32: bool = true;
    #[inline(always)]
    fn bytes(n: usize) -> usize {
        n * 4
    }
    #[inline(always)]
    unsafe fn load<S: Simd>(row: *const u8, col: usize, _: (S::V, S::V)) -> S::V {
        // SAFETY: the caller's row holds LANES float32 from col.
        unsafe { S::load((row as *const f32).add(col)) }
    }
    #[inline(always)]
    unsafe fn scalar(row: *const u8, _: usize, col: usize) -> f32 {
        // SAFETY: the caller's row holds element col.
        unsafe { (row as *const f32).add(col).read_unaligned() }
    }
}

impl Elem for F16 {
    const FORMAT: RowFormat = RowFormat::Float(FloatDtype::F16);
    #[inline(always)]
    fn bytes(n: usize) -> usize {
        n * 2
    }
    #[inline(always)]
    unsafe fn load<S: Simd>(row: *const u8, col: usize, _: (S::V, S::V)) -> S::V {
        // SAFETY: as for F32, with 16-bit elements.
        unsafe { S::load_f16((row as *const u16).add(col)) }
    }
    #[inline(always)]
    unsafe fn scalar(row: *const u8, _: usize, col: usize) -> f32 {
        // SAFETY: as for F32.
        half::f16::from_bits(unsafe { (row as *const u16).add(col).read_unaligned() }).to_f32()
    }
}

impl Elem for BF16 {
    const FORMAT: RowFormat = RowFormat::Float(FloatDtype::BF16);
    #[inline(always)]
    fn bytes(n: usize) -> usize {
        n * 2
    }
    #[inline(always)]
    unsafe fn load<S: Simd>(row: *const u8, col: usize, _: (S::V, S::V)) -> S::V {
        // SAFETY: as for F32, with 16-bit elements.
        unsafe { S::load_bf16((row as *const u16).add(col)) }
    }
    #[inline(always)]
    unsafe fn load_pair<S: Simd>(row: *const u8, col: usize, _: (S::V, S::V)) -> (S::V, S::V) {
        // SAFETY: the caller's row holds 2 * LANES bfloat16 from col.
        unsafe { S::load_bf16_pair((row as *const u16).add(col)) }
    }
    #[inline(always)]
    unsafe fn unpair<S: Simd>(a: S::V, b: S::V) -> (S::V, S::V) {
        // SAFETY: register operations of the set the caller is compiled for.
        unsafe { S::unpair(a, b) }
    }
    #[inline(always)]
    unsafe fn pool_paired<S: Simd, Src: Source, const R: usize, const W: bool, const HOW: u8>(a: &Args<Src>) -> bool {
        if !R.is_multiple_of(2) {
            return false;
        }
        // SAFETY: forwarded: the caller's promise.
        unsafe { bags_paired::<S, Self, Src, R, W, HOW>(a) };
        true
    }
    #[inline(always)]
    unsafe fn scalar(row: *const u8, _: usize, col: usize) -> f32 {
        // SAFETY: as for F32.
        bf16_to_f32(unsafe { (row as *const u16).add(col).read_unaligned() })
    }
}

impl Elem for Int8 {
    const FORMAT: RowFormat = RowFormat::Int8;
    #[inline(always)]
    fn bytes(n: usize) -> usize {
        n
    }
    #[inline(always)]
    unsafe fn params<S: Simd>(row: *const u8, dim: usize) -> (S::V, S::V) {
        // SAFETY: the caller's row is an int8 row of dim values (dim + 8 bytes).
        unsafe {
            let (s, b) = int8_params(row, dim);
            (S::splat(s), S::splat(b))
        }
    }
    #[inline(always)]
    unsafe fn load<S: Simd>(row: *const u8, col: usize, p: (S::V, S::V)) -> S::V {
        // SAFETY: the caller's row holds LANES bytes from col.
        unsafe { S::fma(S::load_u8(row.add(col)), p.0, p.1) }
    }
}

impl Elem for Fp8 {
    const FORMAT: RowFormat = RowFormat::Fp8;
    #[inline(always)]
    fn bytes(n: usize) -> usize {
        n
    }
    #[inline(always)]
    unsafe fn params<S: Simd>(row: *const u8, dim: usize) -> (S::V, S::V) {
        // SAFETY: the caller's row is an fp8 row of dim values (dim + 4 bytes).
        unsafe { (S::splat(fp8_scale(row, dim)), S::zero()) }
    }
    #[inline(always)]
    unsafe fn load<S: Simd>(row: *const u8, col: usize, p: (S::V, S::V)) -> S::V {
        // SAFETY: the caller's row holds LANES bytes from col.
        unsafe { S::mul(S::load_e4m3(row.add(col)), p.0) }
    }
}

impl Elem for Int4 {
    const FORMAT: RowFormat = RowFormat::Int4;
    #[inline(always)]
    fn bytes(n: usize) -> usize {
        n.div_ceil(2)
    }
    #[inline(always)]
    unsafe fn params<S: Simd>(row: *const u8, dim: usize) -> (S::V, S::V) {
        // SAFETY: the caller's row is an int4 row of dim values (dim / 2 + 4 bytes).
        unsafe {
            let (s, b) = int4_params(row, dim);
            (S::splat(s), S::splat(b))
        }
    }
    #[inline(always)]
    unsafe fn load<S: Simd>(row: *const u8, col: usize, p: (S::V, S::V)) -> S::V {
        // SAFETY: col is a multiple of LANES (even), and the caller's row holds LANES / 2 bytes
        // from byte col / 2.
        unsafe { S::fma(S::load_u4(row.add(col / 2)), p.0, p.1) }
    }
}

/// float32 rounded to bfloat16 bits, to nearest even; a NaN stays a quiet NaN (as the `half`
/// crate rounds, which the copy kernels use).
#[inline(always)]
fn f32_to_bf16(v: f32) -> u16 {
    let x = v.to_bits();
    if x & 0x7FFF_FFFF > 0x7F80_0000 {
        return ((x >> 16) | 0x0040) as u16;
    }
    ((x + 0x7FFF + ((x >> 16) & 1)) >> 16) as u16
}

/// bfloat16 bits widened to float32: the same 16 high bits (exact).
#[inline(always)]
fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Adds rows `lo..hi` into the `R` accumulator vectors `acc` (elements `col ..` of each row),
/// prefetching the row [`Args::ahead`] further when `PF`; `M`: rows may be missing (NULL or a
/// key past a dense store: the default row). The loop every kernel runs.
#[inline(always)]
unsafe fn accumulate<S: Simd, E: Elem, Src: Source, const R: usize, const W: bool, const PF: bool, const M: bool>(
    a: &Args<Src>,
    acc: [S::V; R],
    lo: usize,
    hi: usize,
    col: usize,
) -> [S::V; R] {
    // A row this pass covers whole (the common case) is prefetched by unrolled hints, one per
    // line it spans (and the line of its last byte, unless rows start on lines); others by the
    // general loop. The loop is specialised (unswitched by hand) on how the row is prefetched,
    // so no row pays for the choice.
    let whole = col == 0 && a.dim == R * S::LANES;
    // SAFETY: forwarded: the caller's split and rows, as `accumulate_as` states.
    unsafe {
        match (whole, a.last_line()) {
            (true, true) => accumulate_as::<S, E, Src, R, W, PF, M, 1, false>(a, acc, lo, hi, col),
            (true, false) => accumulate_as::<S, E, Src, R, W, PF, M, 0, false>(a, acc, lo, hi, col),
            (false, _) => accumulate_as::<S, E, Src, R, W, PF, M, 2, false>(a, acc, lo, hi, col),
        }
    }
}

/// [`accumulate`] with the way rows are prefetched chosen by the caller (`HOW` as in
/// [`prefetching`]; 0 and 1 only where the pass covers the row whole). `P`: vectors are loaded
/// in pairs ([`Elem::load_pair`]), so `acc` holds each pair in the format's own order, which
/// the caller undoes ([`Elem::unpair`]); only without missing rows (`!M`) and for even `R`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate_as<
    S: Simd,
    E: Elem,
    Src: Source,
    const R: usize,
    const W: bool,
    const PF: bool,
    const M: bool,
    const HOW: u8,
    const P: bool,
>(
    a: &Args<Src>,
    mut acc: [S::V; R],
    lo: usize,
    hi: usize,
    col: usize,
) -> [S::V; R] {
    let pf_end = a.len.saturating_sub(a.ahead);
    // SAFETY: col + R * LANES <= dim (the caller's split), so every access stays in
    // the default row and the rows the caller vouched for; the source's entry i for i < len and
    // weights[i] for i < hi are in their slices; a prefetch is a hint.
    unsafe {
        // Rows with a row `ahead` further to prefetch, then the rest.
        let split = if PF { hi.min(pf_end).max(lo) } else { lo };
        acc = prefetching::<S, E, Src, R, W, M, HOW, P>(a, acc, lo, split, col);
        for i in split..hi {
            acc = add_row::<S, E, Src, R, W, M, P>(a, acc, i, col);
        }
    }
    acc
}

/// Rows `lo..hi` of [`accumulate`], each with the row [`Args::ahead`] further prefetched:
/// `HOW` 0, one hint per line of a row the pass covers whole; 1, the same and the line of its
/// last byte (rows not starting on lines); 2, every line of the row (other passes).
#[inline(always)]
unsafe fn prefetching<S: Simd, E: Elem, Src: Source, const R: usize, const W: bool, const M: bool, const HOW: u8, const P: bool>(
    a: &Args<Src>,
    mut acc: [S::V; R],
    lo: usize,
    hi: usize,
    col: usize,
) -> [S::V; R] {
    let (src, ahead, row_bytes) = (&a.src, a.ahead, a.row_bytes);
    let lines = E::bytes(R * S::LANES).div_ceil(64);
    // SAFETY: as in `accumulate` (i + ahead < len for i < hi, the caller's split); a prefetch is
    // a hint.
    unsafe {
        for i in lo..hi {
            let q = if M { src.row(i + ahead) } else { src.hint(i + ahead) };
            if HOW == 2 {
                super::prefetch_row(q, row_bytes);
            } else if !M || !q.is_null() {
                for l in 0..lines {
                    crate::util::prefetch(q.wrapping_add(l * 64));
                }
                if HOW == 1 {
                    crate::util::prefetch(q.wrapping_add(row_bytes - 1));
                }
            }
            acc = add_row::<S, E, Src, R, W, M, P>(a, acc, i, col);
        }
    }
    acc
}

/// Adds row `i` (elements `col ..`, `R` vectors), times its weight when `W`, into `acc`; with
/// `M`, a missing row adds the default row; with `P`, as [`accumulate_as`] says.
#[inline(always)]
unsafe fn add_row<S: Simd, E: Elem, Src: Source, const R: usize, const W: bool, const M: bool, const P: bool>(
    a: &Args<Src>,
    mut acc: [S::V; R],
    i: usize,
    col: usize,
) -> [S::V; R] {
    // SAFETY: as in `accumulate`, which this is the body of.
    unsafe {
        let mut p = if M { a.src.row(i) } else { a.src.present(i) };
        let w = if W { S::splat(*a.weights.add(i)) } else { S::zero() };
        if M && E::F32 && p.is_null() {
            // float32 rows: the default row is one more row of the same type, so a missing row
            // only swaps the address and the adds below stay one loop (two loops here made LLVM
            // load every vector first, then add: 16 live vectors, spilled).
            p = a.default as *const u8;
        }
        if M && !E::F32 && p.is_null() {
            let d = a.default.add(col);
            for (r, v) in acc.iter_mut().enumerate() {
                let x = S::load(d.add(r * S::LANES));
                *v = S::add(*v, if W { S::mul(w, x) } else { x });
            }
        } else if P {
            debug_assert!(!M && R.is_multiple_of(2));
            let prm = E::params::<S>(p, a.dim);
            for k in 0..R / 2 {
                let (x, y) = E::load_pair::<S>(p, col + 2 * k * S::LANES, prm);
                acc[2 * k] = S::add(acc[2 * k], if W { S::mul(w, x) } else { x });
                acc[2 * k + 1] = S::add(acc[2 * k + 1], if W { S::mul(w, y) } else { y });
            }
        } else {
            let prm = E::params::<S>(p, a.dim);
            for (r, v) in acc.iter_mut().enumerate() {
                let x = E::load::<S>(p, col + r * S::LANES, prm);
                *v = S::add(*v, if W { S::mul(w, x) } else { x });
            }
        }
    }
    acc
}

/// One pass over rows `lo..hi`: `R` vectors of the row from element `col`, accumulated in
/// registers, loaded from `acc` first unless the run starts from zero, stored back at the end.
#[inline(always)]
unsafe fn pass<S: Simd, E: Elem, Src: Source, const R: usize, const W: bool>(a: &Args<Src>, col: usize, prefetch: bool) {
    // SAFETY: col + R * LANES <= dim (run's split), so the accumulator accesses
    // stay in acc (dim values, checked by Pooler::add); the rows as `accumulate` says.
    unsafe {
        let mut acc = [S::zero(); R];
        if !a.zero {
            for (r, v) in acc.iter_mut().enumerate() {
                *v = S::load(a.acc.add(col + r * S::LANES));
            }
        }
        if prefetch {
            acc = accumulate::<S, E, Src, R, W, true, true>(a, acc, a.lo, a.hi, col);
        } else {
            acc = accumulate::<S, E, Src, R, W, false, true>(a, acc, a.lo, a.hi, col);
        }
        for (r, v) in acc.iter().enumerate() {
            S::store(a.acc.add(col + r * S::LANES), *v);
        }
    }
}

/// The elements `col..dim` (fewer than a vector) one at a time.
#[inline(always)]
unsafe fn tail<E: Elem, Src: Source, const W: bool>(a: &Args<Src>, col: usize, prefetch: bool) {
    // SAFETY: col..dim is inside acc, default and every row, as in `pass`.
    unsafe {
        let acc = std::slice::from_raw_parts_mut(a.acc.add(col), a.dim - col);
        if a.zero {
            acc.fill(0.0);
        }
        for i in a.lo..a.hi {
            if prefetch && i + a.ahead < a.len {
                super::prefetch_row(a.src.row(i + a.ahead), a.row_bytes);
            }
            let p = a.src.row(i);
            let w = if W { *a.weights.add(i) } else { 1.0 };
            for (c, v) in acc.iter_mut().enumerate() {
                let x = if p.is_null() { *a.default.add(col + c) } else { E::scalar(p, a.dim, col + c) };
                *v += if W { w * x } else { x };
            }
        }
    }
}

/// A whole row in passes of at most `RMAX` vectors (then 8, 4, 2, 1), then the tail; only the
/// first pass prefetches.
#[inline(always)]
unsafe fn run<S: Simd, E: Elem, Src: Source, const W: bool, const RMAX: usize>(a: &Args<Src>) {
    let vecs = a.dim / S::LANES;
    let mut v = 0;
    let mut first = true;
    // SAFETY: every pass covers vectors v .. v + R <= vecs of the row; the tail the rest.
    unsafe {
        while vecs - v >= RMAX {
            pass::<S, E, Src, RMAX, W>(a, v * S::LANES, first);
            v += RMAX;
            first = false;
        }
        if RMAX > 8 && vecs - v >= 8 {
            pass::<S, E, Src, 8, W>(a, v * S::LANES, first);
            v += 8;
            first = false;
        }
        if RMAX > 4 && vecs - v >= 4 {
            pass::<S, E, Src, 4, W>(a, v * S::LANES, first);
            v += 4;
            first = false;
        }
        if vecs - v >= 2 {
            pass::<S, E, Src, 2, W>(a, v * S::LANES, first);
            v += 2;
            first = false;
        }
        if vecs - v >= 1 {
            pass::<S, E, Src, 1, W>(a, v * S::LANES, first);
            v += 1;
            first = false;
        }
        if v * S::LANES < a.dim {
            tail::<E, Src, W>(a, v * S::LANES, first);
        }
    }
}

/// One pass over bag rows `lo..hi` of a whole-bag call: `R` vectors from element `col`,
/// accumulated from zero in registers, divided by `div` (zeros for 0), stored at `dst + col`.
#[inline(always)]
unsafe fn bag_pass<S: Simd, E: Elem, Src: Source, const R: usize, const W: bool, const M: bool>(
    a: &Args<Src>,
    lo: usize,
    hi: usize,
    col: usize,
    prefetch: bool,
    div: Option<f32>,
    dst: *mut u8,
) {
    // SAFETY: as in `pass`, with dst + col + R * LANES <= dst + dim, the bag's
    // output row, writable by the caller's contract.
    unsafe {
        let acc = if prefetch {
            accumulate::<S, E, Src, R, W, true, M>(a, [S::zero(); R], lo, hi, col)
        } else {
            accumulate::<S, E, Src, R, W, false, M>(a, [S::zero(); R], lo, hi, col)
        };
        finish::<S, R>(a, acc, div, dst, col);
    }
}

/// Divides a bag's `R` pooled vectors by `div` (zeros for 0) and stores them at `dst + col` as
/// [`Args::out_dtype`].
#[inline(always)]
unsafe fn finish<S: Simd, const R: usize>(a: &Args<impl Source>, mut acc: [S::V; R], div: Option<f32>, dst: *mut u8, col: usize) {
    // SAFETY: dst + col + R * LANES <= dst + dim, the bag's output row (the callers' split),
    // writable by the caller's contract.
    unsafe {
        match div {
            None => {}
            Some(0.0) => acc = [S::zero(); R],
            Some(d) => {
                let d = S::splat(d);
                for v in acc.iter_mut() {
                    *v = S::div(*v, d);
                }
            }
        }
        match a.out_dtype {
            FloatDtype::F32 => {
                for (r, v) in acc.iter().enumerate() {
                    S::store((dst as *mut f32).add(col + r * S::LANES), *v);
                }
            }
            FloatDtype::F16 => {
                for (r, v) in acc.iter().enumerate() {
                    S::store_f16((dst as *mut u16).add(col + r * S::LANES), *v);
                }
            }
            FloatDtype::BF16 => {
                for (r, v) in acc.iter().enumerate() {
                    S::store_bf16((dst as *mut u16).add(col + r * S::LANES), *v);
                }
            }
        }
    }
}

/// The elements `col..dim` of one bag (fewer than a vector), one at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn bag_tail<E: Elem, Src: Source, const W: bool>(
    a: &Args<Src>,
    lo: usize,
    hi: usize,
    col: usize,
    prefetch: bool,
    div: Option<f32>,
    dst: *mut u8,
) {
    // SAFETY: as in `bag_pass`.
    unsafe {
        let mut tail = [0f32; 16];
        let out = &mut tail[..a.dim - col];
        for i in lo..hi {
            if prefetch && i + a.ahead < a.len {
                super::prefetch_row(a.src.row(i + a.ahead), a.row_bytes);
            }
            let p = a.src.row(i);
            let w = if W { *a.weights.add(i) } else { 1.0 };
            for (c, v) in out.iter_mut().enumerate() {
                let x = if p.is_null() { *a.default.add(col + c) } else { E::scalar(p, a.dim, col + c) };
                *v += if W { w * x } else { x };
            }
        }
        match div {
            None => {}
            Some(0.0) => out.fill(0.0),
            Some(d) => out.iter_mut().for_each(|v| *v /= d),
        }
        for (c, &v) in out.iter().enumerate() {
            match a.out_dtype {
                FloatDtype::F32 => (dst as *mut f32).add(col + c).write_unaligned(v),
                FloatDtype::F16 => (dst as *mut u16).add(col + c).write_unaligned(half::f16::from_f32(v).to_bits()),
                FloatDtype::BF16 => (dst as *mut u16).add(col + c).write_unaligned(f32_to_bf16(v)),
            }
        }
    }
}

/// What bag rows `lo..hi` are divided by ([`Args::divide`]): None for a sum.
///
/// # Safety
/// `lo..hi` inside the call's rows (and its weights, with `W`).
#[inline(always)]
unsafe fn divisor<const W: bool>(a: &Args<impl Source>, lo: usize, hi: usize) -> Option<f32> {
    // Without weights, the float32 sum of hi - lo ones: the count, which stops growing at 2^24.
    let ones = (hi - lo).min(1 << 24) as f32;
    // SAFETY: weights[i] for i in lo..hi, the caller's promise.
    unsafe {
        match a.divide {
            Divide::Nothing => None,
            Divide::WeightSum => Some(if W { (lo..hi).fold(0f32, |t, i| t + *a.weights.add(i)) } else { ones }),
            Divide::RootSquareSum => Some(
                if W {
                    (lo..hi).fold(0f32, |t, i| {
                        let w = *a.weights.add(i);
                        t + w * w
                    })
                } else {
                    ones
                }
                .sqrt(),
            ),
        }
    }
}

/// Whole bags whose rows are exactly one pass of `R` vectors (1, 2, 4, 8 or 16: dim 16 to 256 on
/// AVX-512, 8 to 128 on AVX2), each bag pooled in one pass, with the choices a pass
/// makes per bag in [`bags_run`] (which pass, how rows are prefetched) made once per call;
/// `HOW` as in [`prefetching`] (0 or 1: rows covered whole).
#[inline(always)]
unsafe fn bags_one_pass<S: Simd, E: Elem, Src: Source, const R: usize, const W: bool, const M: bool, const HOW: u8>(a: &Args<Src>) {
    let out_row = a.out_stride * a.out_dtype.size();
    // SAFETY: j < nbags indexes starts[j + 1] (nbags + 1 entries); the pass covers the whole
    // row (dim = R * LANES, the caller's check); the output rows are the caller's.
    unsafe {
        // Pairs where the format has an order of its own (bfloat16) and no row is missing.
        if !M && E::pool_paired::<S, Src, R, W, HOW>(a) {
            return;
        }
        for j in 0..a.nbags {
            let (lo, hi) = a.bag(j);
            let div = divisor::<W>(a, lo, hi);
            let acc = accumulate_as::<S, E, Src, R, W, true, M, HOW, false>(a, [S::zero(); R], lo, hi, 0);
            finish::<S, R>(a, acc, div, a.out.add(j * out_row), 0);
        }
    }
}

/// [`bags_one_pass`] with no row missing and the vectors of each row loaded in pairs
/// ([`Elem::load_pair`]: bfloat16's even and odd columns from one load), put back in column
/// order once a bag ([`Elem::unpair`]); `R` even. Each column is still summed in key order.
#[inline(always)]
unsafe fn bags_paired<S: Simd, E: Elem, Src: Source, const R: usize, const W: bool, const HOW: u8>(a: &Args<Src>) {
    let out_row = a.out_stride * a.out_dtype.size();
    // SAFETY: as in `bags_one_pass`, every key naming a row (or, for a dense store, clamped to
    // one: `Indexed::present`).
    unsafe {
        for j in 0..a.nbags {
            let (lo, hi) = a.bag(j);
            let div = divisor::<W>(a, lo, hi);
            let mut acc = accumulate_as::<S, E, Src, R, W, true, false, HOW, true>(a, [S::zero(); R], lo, hi, 0);
            for k in 0..R / 2 {
                (acc[2 * k], acc[2 * k + 1]) = E::unpair::<S>(acc[2 * k], acc[2 * k + 1]);
            }
            finish::<S, R>(a, acc, div, a.out.add(j * out_row), 0);
        }
    }
}

/// Whole bags, one after another, each in passes as [`run`] splits a row ([`bags_one_pass`]
/// where one pass covers a row).
#[inline(always)]
unsafe fn bags_run<S: Simd, E: Elem, Src: Source, const W: bool, const M: bool, const RMAX: usize>(a: &Args<Src>) {
    let vecs = a.dim / S::LANES;
    // SAFETY: j < nbags indexes starts[j + 1] (nbags + 1 entries); every pass covers vectors
    // inside the row; the output rows are the caller's.
    unsafe {
        if vecs * S::LANES == a.dim {
            let last_line = a.last_line();
            macro_rules! one_pass {
                ($r:expr) => {
                    if last_line {
                        return bags_one_pass::<S, E, Src, { $r }, W, M, 1>(a);
                    } else {
                        return bags_one_pass::<S, E, Src, { $r }, W, M, 0>(a);
                    }
                };
            }
            match vecs {
                v if v == RMAX => one_pass!(RMAX),
                8 if RMAX > 8 => one_pass!(8),
                4 => one_pass!(4),
                2 => one_pass!(2),
                1 => one_pass!(1),
                _ => {}
            }
        }
        for j in 0..a.nbags {
            let (lo, hi) = a.bag(j);
            let div = divisor::<W>(a, lo, hi);
            let dst = a.out.add(j * a.out_stride * a.out_dtype.size());
            let mut v = 0;
            let mut first = true;
            while vecs - v >= RMAX {
                bag_pass::<S, E, Src, RMAX, W, M>(a, lo, hi, v * S::LANES, first, div, dst);
                v += RMAX;
                first = false;
            }
            if RMAX > 8 && vecs - v >= 8 {
                bag_pass::<S, E, Src, 8, W, M>(a, lo, hi, v * S::LANES, first, div, dst);
                v += 8;
                first = false;
            }
            if RMAX > 4 && vecs - v >= 4 {
                bag_pass::<S, E, Src, 4, W, M>(a, lo, hi, v * S::LANES, first, div, dst);
                v += 4;
                first = false;
            }
            if vecs - v >= 2 {
                bag_pass::<S, E, Src, 2, W, M>(a, lo, hi, v * S::LANES, first, div, dst);
                v += 2;
                first = false;
            }
            if vecs - v >= 1 {
                bag_pass::<S, E, Src, 1, W, M>(a, lo, hi, v * S::LANES, first, div, dst);
                v += 1;
                first = false;
            }
            if v * S::LANES < a.dim {
                bag_tail::<E, Src, W>(a, lo, hi, v * S::LANES, first, div, dst);
            }
        }
    }
}

/// A run ([`run`]) or whole bags ([`bags_run`]) on instruction set `S`.
#[inline(always)]
unsafe fn entry<S: Simd, E: Elem, Src: Source, const W: bool, const BAGS: bool, const M: bool, const RMAX: usize>(a: &Args<Src>) {
    // SAFETY: forwarded from the caller.
    unsafe { if BAGS { bags_run::<S, E, Src, W, M, RMAX>(a) } else { run::<S, E, Src, W, RMAX>(a) } }
}

/// Writes float32 `v` as element `i` of a row of `OUT` (0 float32, 1 float16, 2 bfloat16) at
/// `dst`, `cs` elements apart.
#[inline(always)]
unsafe fn put<const OUT: u8>(dst: *mut u8, i: usize, v: f32) {
    // SAFETY: the caller's dst holds element i of the out dtype; written unaligned.
    unsafe {
        match OUT {
            0 => (dst as *mut f32).add(i).write_unaligned(v),
            1 => (dst as *mut u16).add(i).write_unaligned(half::f16::from_f32(v).to_bits()),
            _ => (dst as *mut u16).add(i).write_unaligned(f32_to_bf16(v)),
        }
    }
}

/// Dequantizes (or widens) one row of `dim` values of `E` at `src` into `dst` as `OUT` (see
/// [`put`]), `cs` elements apart; contiguous rows are stored a vector at a time. The
/// [`super::RowFn`] of a quantized table's plain lookups.
#[inline(always)]
unsafe fn convert_row<S: Simd, E: Elem, const OUT: u8>(src: *const u8, dst: *mut u8, dim: usize, cs: usize) {
    // SAFETY: the RowFn contract: src holds one row of E (dim values), dst dim elements of the
    // out dtype cs apart; every vector covers values col..col + LANES <= dim.
    unsafe {
        let prm = E::params::<S>(src, dim);
        let mut col = 0;
        while col + S::LANES <= dim {
            let v = E::load::<S>(src, col, prm);
            if cs == 1 {
                match OUT {
                    0 => S::store((dst as *mut f32).add(col), v),
                    1 => S::store_f16((dst as *mut u16).add(col), v),
                    _ => S::store_bf16((dst as *mut u16).add(col), v),
                }
            } else {
                let mut t = [0f32; 16];
                S::store(t.as_mut_ptr(), v);
                for (l, &x) in t[..S::LANES].iter().enumerate() {
                    put::<OUT>(dst, (col + l) * cs, x);
                }
            }
            col += S::LANES;
        }
        for c in col..dim {
            put::<OUT>(dst, c * cs, E::scalar(src, dim, c));
        }
    }
}

/// The row kernel that writes rows stored as `format` as `out` values, on instruction set
/// `isa` (lowered to what the CPU has): what [`super::row_fn`] picks for quantized rows.
pub fn convert_fn(isa: Isa, format: RowFormat, out: FloatDtype) -> super::RowFn {
    macro_rules! pick {
        ($f:ident) => {
            match out {
                FloatDtype::F32 => $f::<0>,
                FloatDtype::F16 => $f::<1>,
                FloatDtype::BF16 => $f::<2>,
            }
        };
    }
    macro_rules! of {
        ($e:ty) => {{
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512<const OUT: u8>(src: *const u8, dst: *mut u8, dim: usize, cs: usize) {
                    // SAFETY: the RowFn contract, forwarded; picked only where the CPU has AVX512F.
                    unsafe { convert_row::<x86::Avx512, $e, OUT>(src, dst, dim, cs) }
                }
                #[target_feature(enable = "avx2,f16c,fma")]
                unsafe fn avx2<const OUT: u8>(src: *const u8, dst: *mut u8, dim: usize, cs: usize) {
                    // SAFETY: the RowFn contract, forwarded; picked only where the CPU has these.
                    unsafe { convert_row::<x86::Avx2, $e, OUT>(src, dst, dim, cs) }
                }
                match isa.min(Isa::detected()) {
                    Isa::Avx512 => return pick!(avx512),
                    Isa::Avx2 => return pick!(avx2),
                    Isa::Portable => {}
                }
            }
            unsafe fn portable<const OUT: u8>(src: *const u8, dst: *mut u8, dim: usize, cs: usize) {
                // SAFETY: the RowFn contract, forwarded.
                unsafe { convert_row::<Portable, $e, OUT>(src, dst, dim, cs) }
            }
            pick!(portable)
        }};
    }
    match format {
        RowFormat::Float(FloatDtype::F32) => of!(F32),
        RowFormat::Float(FloatDtype::F16) => of!(F16),
        RowFormat::Float(FloatDtype::BF16) => of!(BF16),
        RowFormat::Int8 => of!(Int8),
        RowFormat::Int4 => of!(Int4),
        RowFormat::Fp8 => of!(Fp8),
    }
}

/// Replaces `row` by the values `format` would hold for it (quantized, then dequantized: what a
/// lookup of a table stored as `format` returns for these values); `scratch` is reused. Float32
/// rows stay as they are. Fails, leaving `row` alone, where [`super::quantize_row`] would.
pub fn round_trip(format: RowFormat, row: &mut [f32], scratch: &mut Vec<u8>) -> Result<(), String> {
    if format == RowFormat::Float(FloatDtype::F32) {
        return Ok(());
    }
    let dim = row.len();
    scratch.resize(format.row_bytes(dim), 0);
    super::format::quantize_row(format, row, scratch)?;
    let f = convert_fn(super::isa(), format, FloatDtype::F32);
    // SAFETY: scratch holds one row of `format` (row_bytes(dim) bytes; convert_fn's kernels
    // read at any alignment), and `row` dim writable float32 that do not overlap it.
    unsafe { f(scratch.as_ptr(), row.as_mut_ptr().cast(), dim, 1) };
    Ok(())
}

/// Plain Rust: 8-lane arrays the compiler vectorises for the baseline.
#[derive(Clone, Copy)]
struct Portable;

impl Simd for Portable {
    type V = [f32; 8];
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        [0.0; 8]
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        [x; 8]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        // SAFETY: the caller's p holds 8 float32.
        unsafe { (p as *const [f32; 8]).read_unaligned() }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> Self::V {
        // SAFETY: the caller's p holds 8 float16.
        let h = unsafe { (p as *const [u16; 8]).read_unaligned() };
        h.map(|b| half::f16::from_bits(b).to_f32())
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> Self::V {
        // SAFETY: the caller's p holds 8 bfloat16.
        let h = unsafe { (p as *const [u16; 8]).read_unaligned() };
        h.map(bf16_to_f32)
    }
    #[inline(always)]
    unsafe fn load_u8(p: *const u8) -> Self::V {
        // SAFETY: the caller's p holds 8 bytes.
        unsafe { (p as *const [u8; 8]).read_unaligned() }.map(|b| b as f32)
    }
    #[inline(always)]
    unsafe fn load_u4(p: *const u8) -> Self::V {
        // SAFETY: the caller's p holds 4 bytes.
        let b = unsafe { (p as *const [u8; 4]).read_unaligned() };
        std::array::from_fn(|i| ((b[i / 2] >> ((i & 1) * 4)) & 15) as f32)
    }
    #[inline(always)]
    unsafe fn load_e4m3(p: *const u8) -> Self::V {
        // SAFETY: the caller's p holds 8 bytes.
        unsafe { (p as *const [u8; 8]).read_unaligned() }.map(super::format::e4m3_to_f32)
    }
    #[inline(always)]
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i].mul_add(b[i], c[i]))
    }
    #[inline(always)]
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] + b[i])
    }
    #[inline(always)]
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] * b[i])
    }
    #[inline(always)]
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] / b[i])
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        // SAFETY: the caller's p holds 8 float32.
        unsafe { (p as *mut [f32; 8]).write_unaligned(v) }
    }
    #[inline(always)]
    unsafe fn store_f16(p: *mut u16, v: Self::V) {
        // SAFETY: the caller's p holds 8 float16.
        unsafe { (p as *mut [u16; 8]).write_unaligned(v.map(|x| half::f16::from_f32(x).to_bits())) }
    }
    #[inline(always)]
    unsafe fn store_bf16(p: *mut u16, v: Self::V) {
        // SAFETY: the caller's p holds 8 bfloat16.
        unsafe { (p as *mut [u16; 8]).write_unaligned(v.map(f32_to_bf16)) }
    }
}

/// # Safety
/// As for [`Pooler::add`].
unsafe fn portable<E: Elem, Src: Source, const W: bool, const BAGS: bool, const M: bool>(a: &Args<Src>) {
    // SAFETY: forwarded.
    unsafe { entry::<Portable, E, Src, W, BAGS, M, 8>(a) }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Args, Elem, Simd, Source, entry};
    use std::arch::x86_64::*;

    /// 2^120: an e4m3fn code's magnitude bits at float32's exponent and mantissa positions,
    /// times this, is its value (`format::e4m3_to_f32`).
    const E4M3_SCALE: f32 = f32::from_bits(0x7B80_0000);

    /// The 4-bit values of the low 8 bytes of `x`, low nibble first, one a byte (16 bytes).
    #[inline(always)]
    unsafe fn nibbles(x: __m128i) -> __m128i {
        // SAFETY: SSE2 only, part of the x86-64 baseline.
        unsafe {
            let m = _mm_set1_epi8(15);
            _mm_unpacklo_epi8(_mm_and_si128(x, m), _mm_and_si128(_mm_srli_epi16::<4>(x), m))
        }
    }

    #[derive(Clone, Copy)]
    pub(super) struct Avx2;

    impl Simd for Avx2 {
        type V = __m256;
        const LANES: usize = 8;
        // Safety of every method: called only from functions compiled with AVX2 and F16C, which
        // the CPU has (Pooler::with_isa); pointers hold LANES elements by the caller's contract.
        #[inline(always)]
        unsafe fn zero() -> __m256 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm256_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> __m256 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm256_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const u16) -> __m256 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> __m256 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i)))) }
        }
        #[inline(always)]
        unsafe fn load_bf16_pair(p: *const u16) -> (__m256, __m256) {
            // SAFETY: as above; p holds 16 bfloat16. A bfloat16 is the high half of its float32:
            // shifting each 32-bit lane left by 16 gives the even columns, clearing its low half
            // the odd ones.
            unsafe {
                let x = _mm256_loadu_si256(p as *const __m256i);
                let odd = _mm256_and_si256(x, _mm256_set1_epi32(0xFFFF_0000u32 as i32));
                (_mm256_castsi256_ps(_mm256_slli_epi32::<16>(x)), _mm256_castsi256_ps(odd))
            }
        }
        #[inline(always)]
        unsafe fn unpair(even: __m256, odd: __m256) -> (__m256, __m256) {
            // SAFETY: register operations of this set. Within each 128-bit half the unpacks
            // interleave even and odd columns: (0-3, 8-11) and (4-7, 12-15); the permutes put
            // the halves in order.
            unsafe {
                let lo = _mm256_unpacklo_ps(even, odd);
                let hi = _mm256_unpackhi_ps(even, odd);
                (_mm256_permute2f128_ps::<0x20>(lo, hi), _mm256_permute2f128_ps::<0x31>(lo, hi))
            }
        }
        #[inline(always)]
        unsafe fn load_u8(p: *const u8) -> __m256 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds 8 bytes.
            unsafe { _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))) }
        }
        #[inline(always)]
        unsafe fn load_u4(p: *const u8) -> __m256 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds 4 bytes.
            unsafe { _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(nibbles(_mm_cvtsi32_si128((p as *const i32).read_unaligned())))) }
        }
        #[inline(always)]
        unsafe fn load_e4m3(p: *const u8) -> __m256 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds 8 bytes.
            unsafe {
                let x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
                let mag = _mm256_slli_epi32::<20>(_mm256_and_si256(x, _mm256_set1_epi32(0x7F)));
                let sign = _mm256_slli_epi32::<24>(_mm256_and_si256(x, _mm256_set1_epi32(0x80)));
                _mm256_mul_ps(_mm256_castsi256_ps(_mm256_or_si256(mag, sign)), _mm256_set1_ps(E4M3_SCALE))
            }
        }
        #[inline(always)]
        unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
            // SAFETY: only called from kernels compiled with FMA, which the CPU has.
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn add(a: __m256, b: __m256) -> __m256 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm256_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn mul(a: __m256, b: __m256) -> __m256 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm256_mul_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn div(a: __m256, b: __m256) -> __m256 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm256_div_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m256) {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm256_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn store_f16(p: *mut u16, v: __m256) {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm_storeu_si128(p as *mut __m128i, _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v)) }
        }
        #[inline(always)]
        unsafe fn store_bf16(p: *mut u16, v: __m256) {
            // SAFETY: only called from kernels compiled with AVX2, which the CPU has; p holds
            // LANES elements.
            unsafe {
                let x = _mm256_castps_si256(v);
                let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
                let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb));
                let quiet = _mm256_or_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(0x40));
                let abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFF_FFFF));
                let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F80_0000));
                let r = _mm256_blendv_epi8(rounded, quiet, nan);
                // 8 x u32 (each below 2^16) to 8 x u16: pack within lanes, then put the halves together.
                let packed = _mm256_packus_epi32(r, r);
                let lo = _mm256_permute4x64_epi64::<0b1000>(packed);
                _mm_storeu_si128(p as *mut __m128i, _mm256_castsi256_si128(lo));
            }
        }
    }

    #[derive(Clone, Copy)]
    pub(super) struct Avx512;

    impl Simd for Avx512 {
        type V = __m512;
        const LANES: usize = 16;
        // Safety of every method: called only from functions compiled with AVX512F, which the
        // CPU has (Pooler::with_isa); pointers hold LANES elements by the caller's contract.
        #[inline(always)]
        unsafe fn zero() -> __m512 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm512_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> __m512 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm512_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m512 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const u16) -> __m512 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> __m512 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i)))) }
        }
        #[inline(always)]
        unsafe fn load_bf16_pair(p: *const u16) -> (__m512, __m512) {
            // SAFETY: as above; p holds 32 bfloat16. As for AVX2: the even columns by a shift,
            // the odd ones by an AND.
            unsafe {
                let x = _mm512_loadu_si512(p as *const __m512i);
                let odd = _mm512_and_si512(x, _mm512_set1_epi32(0xFFFF_0000u32 as i32));
                (_mm512_castsi512_ps(_mm512_slli_epi32::<16>(x)), _mm512_castsi512_ps(odd))
            }
        }
        #[inline(always)]
        unsafe fn unpair(even: __m512, odd: __m512) -> (__m512, __m512) {
            // SAFETY: register operations of this set. Index i < 16 takes even lane i, 16 + i
            // odd lane i: columns 0-15 are even 0, odd 0, ... even 7, odd 7; 16-31 the rest.
            unsafe {
                let lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
                let hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
                (_mm512_permutex2var_ps(even, lo, odd), _mm512_permutex2var_ps(even, hi, odd))
            }
        }
        #[inline(always)]
        unsafe fn load_u8(p: *const u8) -> __m512 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds 16 bytes.
            unsafe { _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i))) }
        }
        #[inline(always)]
        unsafe fn load_u4(p: *const u8) -> __m512 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds 8 bytes.
            unsafe { _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(nibbles(_mm_loadl_epi64(p as *const __m128i)))) }
        }
        #[inline(always)]
        unsafe fn load_e4m3(p: *const u8) -> __m512 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds 16 bytes.
            unsafe {
                let x = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
                let mag = _mm512_slli_epi32::<20>(_mm512_and_si512(x, _mm512_set1_epi32(0x7F)));
                let sign = _mm512_slli_epi32::<24>(_mm512_and_si512(x, _mm512_set1_epi32(0x80)));
                _mm512_mul_ps(_mm512_castsi512_ps(_mm512_or_si512(mag, sign)), _mm512_set1_ps(E4M3_SCALE))
            }
        }
        #[inline(always)]
        unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
            // SAFETY: only called from kernels compiled with AVX512F, which the CPU has.
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn add(a: __m512, b: __m512) -> __m512 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm512_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn mul(a: __m512, b: __m512) -> __m512 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm512_mul_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn div(a: __m512, b: __m512) -> __m512 {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm512_div_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m512) {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm512_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn store_f16(p: *mut u16, v: __m512) {
            // SAFETY: only called from kernels compiled with this set's features, which the CPU has; p holds LANES elements.
            unsafe { _mm256_storeu_si256(p as *mut __m256i, _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v)) }
        }
        #[inline(always)]
        unsafe fn store_bf16(p: *mut u16, v: __m512) {
            // SAFETY: only called from kernels compiled with AVX512F, which the CPU has; p holds
            // LANES elements.
            unsafe {
                let x = _mm512_castps_si512(v);
                let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(1));
                let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), lsb));
                let quiet = _mm512_or_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(0x40));
                let abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFF_FFFF));
                let nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7F80_0000));
                let r = _mm512_mask_blend_epi32(nan, rounded, quiet);
                _mm256_storeu_si256(p as *mut __m256i, _mm512_cvtepi32_epi16(r));
            }
        }
    }

    /// # Safety
    /// As for [`super::Pooler::add`], on a CPU with AVX2, F16C and FMA.
    #[target_feature(enable = "avx2,f16c,fma")]
    pub(super) unsafe fn avx2<E: Elem, Src: Source, const W: bool, const BAGS: bool, const M: bool>(a: &Args<Src>) {
        // SAFETY: forwarded; this function has the features Avx2's methods need.
        // float32 rows without weights need no register besides the accumulators (the adds
        // take the row from memory), so a row of up to 128 values is one pass of all 16 ymm
        // registers, as FBGEMM's AVX2 kernel does; widening or weighting needs a scratch
        // register, so those take passes of 8.
        unsafe { if E::F32 && !W { entry::<Avx2, E, Src, W, BAGS, M, 16>(a) } else { entry::<Avx2, E, Src, W, BAGS, M, 8>(a) } }
    }

    /// # Safety
    /// As for [`super::Pooler::add`], on a CPU with AVX512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avx512<E: Elem, Src: Source, const W: bool, const BAGS: bool, const M: bool>(a: &Args<Src>) {
        // SAFETY: forwarded; this function has the features Avx512's methods need.
        unsafe { entry::<Avx512, E, Src, W, BAGS, M, 16>(a) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A xorshift64 stream from `seed` (non-zero): the tests' random data.
    fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        }
    }

    /// The contract's reference: float32, key order, a multiply then an add.
    fn reference(dtype: FloatDtype, rows: &[Vec<u8>], present: &[bool], w: Option<&[f32]>, default: &[f32], start: &[f32]) -> Vec<f32> {
        let dim = default.len();
        let mut acc = start.to_vec();
        for (i, row) in rows.iter().enumerate() {
            let wi = w.map_or(1.0, |w| w[i]);
            for (c, a) in acc.iter_mut().enumerate() {
                let x = if !present[i] {
                    default[c]
                } else {
                    match dtype {
                        FloatDtype::F32 => f32::from_le_bytes(row[c * 4..c * 4 + 4].try_into().unwrap()),
                        FloatDtype::F16 => half::f16::from_le_bytes([row[c * 2], row[c * 2 + 1]]).to_f32(),
                        FloatDtype::BF16 => half::bf16::from_le_bytes([row[c * 2], row[c * 2 + 1]]).to_f32(),
                    }
                };
                *a += wi * x;
            }
            let _ = dim;
        }
        acc
    }

    /// Every instruction set, dtype, width from 1 to 300, with and without weights, from zero and
    /// from a running accumulator, with missing rows and rows at odd addresses: bit for bit the
    /// reference.
    #[test]
    fn every_kernel_matches_the_reference() {
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15u64);
        for isa in Isa::available() {
            for dtype in [FloatDtype::F32, FloatDtype::F16, FloatDtype::BF16] {
                for dim in (1..=40).chain([63, 64, 65, 127, 128, 129, 192, 255, 256, 257, 300]) {
                    let k = Pooler::with_isa(isa, dtype, dim);
                    let n = (next() % 30) as usize;
                    let size = dtype.size();
                    // One buffer holding every row at an element-aligned but otherwise odd offset.
                    let mut buf = vec![0u8; n * dim * size + 64];
                    let base = (64 - buf.as_ptr() as usize % 64) % 64 + size;
                    let mut rows = Vec::new();
                    for i in 0..n {
                        let row: Vec<u8> = (0..dim)
                            .flat_map(|_| {
                                let v = ((next() % 2001) as f32 - 1000.0) / 37.0;
                                match dtype {
                                    FloatDtype::F32 => v.to_le_bytes().to_vec(),
                                    FloatDtype::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
                                    FloatDtype::BF16 => half::bf16::from_f32(v).to_le_bytes().to_vec(),
                                }
                            })
                            .collect();
                        let at = base + i * dim * size;
                        if at + row.len() > buf.len() {
                            buf.resize(at + row.len(), 0);
                        }
                        buf[at..at + row.len()].copy_from_slice(&row);
                        rows.push(row);
                    }
                    let present: Vec<bool> = (0..n).map(|_| !next().is_multiple_of(7)).collect();
                    let ptrs: Vec<*const u8> =
                        (0..n).map(|i| if present[i] { buf[base + i * dim * size..].as_ptr() } else { std::ptr::null() }).collect();
                    let w: Vec<f32> = (0..n).map(|_| ((next() % 1000) as f32 - 300.0) / 97.0).collect();
                    let default: Vec<f32> = (0..dim).map(|c| c as f32 * 0.25 - 3.0).collect();
                    let start: Vec<f32> = (0..dim).map(|c| (c % 5) as f32 - 1.5).collect();
                    for weighted in [false, true] {
                        for zero in [true, false] {
                            let wv = weighted.then_some(&w[..]);
                            let from = if zero { vec![0.0; dim] } else { start.clone() };
                            let want = reference(dtype, &rows, &present, wv, &default, &from);
                            let mut acc = if zero { vec![f32::NAN; dim] } else { start.clone() };
                            // SAFETY: every non-NULL pointer is a whole row inside buf.
                            unsafe { k.add(&mut acc, zero, &ptrs, 0, n, wv, &default) };
                            let same = acc.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                            assert!(same, "{isa:?} {dtype:?} dim {dim} n {n} weighted {weighted} zero {zero}: {acc:?} != {want:?}");
                        }
                    }
                }
            }
        }
    }

    /// A run inside a longer list adds only its own rows.
    #[test]
    fn a_run_adds_only_its_rows() {
        for isa in Isa::available() {
            let k = Pooler::with_isa(isa, FloatDtype::F32, 16);
            let rows: Vec<Vec<f32>> = (0..10).map(|i| vec![i as f32; 16]).collect();
            let ptrs: Vec<*const u8> = rows.iter().map(|r| r.as_ptr() as *const u8).collect();
            let mut acc = vec![0.0; 16];
            // SAFETY: every pointer is a whole row.
            unsafe { k.add(&mut acc, true, &ptrs, 3, 6, None, &[0.0; 16]) };
            assert_eq!(acc, vec![12.0; 16], "{isa:?}");
        }
    }

    /// Whole bags, every instruction set, stored dtype, out dtype, pooling and width, with and
    /// without weights, missing rows and empty bags, from addresses and from a dense store:
    /// bit for bit the reference (the sum, divided as the contract says, rounded once to the
    /// out dtype as the `half` crate rounds), and nothing written outside the output rows.
    #[test]
    fn whole_bags_match_the_reference() {
        let mut next = xorshift(0x2545_F491_4F6C_DD1Du64);
        for isa in Isa::available() {
            for dtype in [FloatDtype::F32, FloatDtype::F16, FloatDtype::BF16] {
                for dim in [1, 3, 8, 15, 16, 17, 31, 32, 64, 100, 128, 200, 256, 272] {
                    let k = Pooler::with_isa(isa, dtype, dim);
                    let size = dtype.size();
                    let table_rows = 40usize;
                    let stride = dim * size + if next().is_multiple_of(2) { 0 } else { size * 3 };
                    let mut store = vec![0u8; table_rows * stride];
                    let mut values = vec![vec![0f32; dim]; table_rows];
                    for (r, row) in values.iter_mut().enumerate() {
                        for (c, v) in row.iter_mut().enumerate() {
                            let x = ((next() % 4001) as f32 - 2000.0) / 61.0;
                            let bytes = match dtype {
                                FloatDtype::F32 => x.to_le_bytes().to_vec(),
                                FloatDtype::F16 => half::f16::from_f32(x).to_le_bytes().to_vec(),
                                FloatDtype::BF16 => half::bf16::from_f32(x).to_le_bytes().to_vec(),
                            };
                            store[r * stride + c * size..r * stride + (c + 1) * size].copy_from_slice(&bytes);
                            *v = match dtype {
                                FloatDtype::F32 => x,
                                FloatDtype::F16 => half::f16::from_f32(x).to_f32(),
                                FloatDtype::BF16 => half::bf16::from_f32(x).to_f32(),
                            };
                        }
                    }
                    let nbags = (next() % 9) as usize;
                    let mut starts = vec![0usize];
                    for _ in 0..nbags {
                        let len = [0, 1, 2, 5, 17, 40][(next() % 6) as usize];
                        starts.push(starts.last().unwrap() + len);
                    }
                    let n = *starts.last().unwrap();
                    let with_misses = next().is_multiple_of(2);
                    let keys: Vec<u64> = (0..n)
                        .map(|_| {
                            if with_misses && next().is_multiple_of(5) {
                                table_rows as u64 + next() % 3
                            } else {
                                next() % table_rows as u64
                            }
                        })
                        .collect();
                    let ptrs: Vec<*const u8> = keys
                        .iter()
                        .map(|&q| if q < table_rows as u64 { store[q as usize * stride..].as_ptr() } else { std::ptr::null() })
                        .collect();
                    let w: Vec<f32> =
                        (0..n).map(|_| if next().is_multiple_of(11) { 0.0 } else { ((next() % 1000) as f32 - 400.0) / 89.0 }).collect();
                    let default: Vec<f32> = (0..dim).map(|c| c as f32 * 0.5 - 7.0).collect();
                    for weighted in [false, true] {
                        for divide in [Divide::Nothing, Divide::WeightSum, Divide::RootSquareSum] {
                            for out_dtype in [FloatDtype::F32, FloatDtype::F16, FloatDtype::BF16] {
                                for dense in [false, true] {
                                    let wv = weighted.then_some(&w[..]);
                                    let out_stride = dim + 5;
                                    let osize = out_dtype.size();
                                    let mut out = vec![0xA5u8; (nbags.max(1) * out_stride + 8) * osize];
                                    let rows = if dense {
                                        RowsOf::Dense { base: store.as_ptr(), stride, rows: table_rows, keys: &keys }
                                    } else {
                                        RowsOf::Ptrs(&ptrs)
                                    };
                                    // SAFETY: every row named is inside `store`; out holds nbags rows
                                    // of out_stride elements.
                                    unsafe {
                                        k.pool_bags(
                                            rows,
                                            with_misses,
                                            &starts,
                                            0,
                                            wv,
                                            &default,
                                            divide,
                                            out.as_mut_ptr(),
                                            out_dtype,
                                            out_stride,
                                        )
                                    };
                                    for j in 0..nbags {
                                        let mut acc = vec![0f32; dim];
                                        let (mut ws, mut w2) = (0f32, 0f32);
                                        for i in starts[j]..starts[j + 1] {
                                            let wi = if weighted { w[i] } else { 1.0 };
                                            let row = if keys[i] < table_rows as u64 { &values[keys[i] as usize] } else { &default };
                                            for (a, x) in acc.iter_mut().zip(row) {
                                                *a += wi * x;
                                            }
                                            ws += wi;
                                            w2 += wi * wi;
                                        }
                                        let d = match divide {
                                            Divide::Nothing => None,
                                            Divide::WeightSum => Some(ws),
                                            Divide::RootSquareSum => Some(w2.sqrt()),
                                        };
                                        match d {
                                            None => {}
                                            Some(0.0) => acc.fill(0.0),
                                            Some(d) => acc.iter_mut().for_each(|a| *a /= d),
                                        }
                                        for (c, &sum) in acc.iter().enumerate() {
                                            let at = (j * out_stride + c) * osize;
                                            let got = &out[at..at + osize];
                                            let want = match out_dtype {
                                                FloatDtype::F32 => sum.to_le_bytes().to_vec(),
                                                FloatDtype::F16 => half::f16::from_f32(sum).to_le_bytes().to_vec(),
                                                FloatDtype::BF16 => half::bf16::from_f32(sum).to_le_bytes().to_vec(),
                                            };
                                            assert_eq!(
                                                got,
                                                &want[..],
                                                "{isa:?} {dtype:?} -> {out_dtype:?} dim {dim} bag {j} col {c} weighted {weighted} {divide:?} dense {dense}"
                                            );
                                        }
                                        let gap = &out[(j * out_stride + dim) * osize..(j * out_stride + out_stride) * osize];
                                        assert!(gap.iter().all(|&b| b == 0xA5), "{isa:?}: written between rows");
                                    }
                                    assert!(out[nbags * out_stride * osize..].iter().all(|&b| b == 0xA5), "{isa:?}: written past the rows");
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// bfloat16 rounding of the kernels agrees with the `half` crate's, NaN and infinities
    /// included, on every instruction set.
    #[test]
    fn bfloat16_and_float16_stores_round_as_half_does() {
        let specials = [
            0.0f32,
            -0.0,
            1.0,
            f32::MAX,
            f32::MIN_POSITIVE,
            f32::from_bits(0x0001_1234),
            -f32::from_bits(0x0001_1234),
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            65504.0,
            65520.0,
            f32::from_bits(0x3F80_8000),
            f32::from_bits(0x3F81_8000),
        ];
        let mut vals: Vec<f32> = specials.to_vec();
        let mut x = 0x1234_5678u32;
        while vals.len() < 4096 {
            x = x.wrapping_mul(1664525).wrapping_add(1013904223);
            vals.push(f32::from_bits(x));
        }
        for isa in Isa::available() {
            let k = Pooler::with_isa(isa, FloatDtype::F32, 16);
            for chunk in vals.chunks(16) {
                let row: Vec<f32> = chunk.iter().copied().chain(std::iter::repeat(0.0)).take(16).collect();
                let ptrs = [row.as_ptr() as *const u8];
                for out_dtype in [FloatDtype::F16, FloatDtype::BF16] {
                    let mut out = [0u16; 16];
                    // SAFETY: one row of 16 float32; out holds 16 values.
                    unsafe {
                        k.pool_bags(
                            RowsOf::Ptrs(&ptrs),
                            false,
                            &[0, 1],
                            0,
                            None,
                            &[0.0; 16],
                            Divide::Nothing,
                            out.as_mut_ptr() as *mut u8,
                            out_dtype,
                            16,
                        )
                    };
                    for (c, (&got, &v)) in out.iter().zip(&row).enumerate() {
                        let sum = 0.0 + v; // the bag's sum, from zero (-0.0 becomes 0.0)
                        let want = match out_dtype {
                            FloatDtype::F16 => half::f16::from_f32(sum).to_bits(),
                            _ => half::bf16::from_f32(sum).to_bits(),
                        };
                        let both_nan = v.is_nan() && (got & 0x7FFF) > 0x7C00 && out_dtype == FloatDtype::F16;
                        assert!(got == want || both_nan, "{isa:?} {out_dtype:?} {v:e} (col {c}): {got:#x} != {want:#x}");
                    }
                }
            }
        }
    }

    /// A dense store's key past it, pooled with `missing` false (the pooled executor counts the
    /// misses after the call), reads the store's last row in its place (the default row for
    /// the elements past the last whole vector) and nothing past the store: with the default
    /// row equal to the last row, the same output, bit for bit, as the keys clamped by hand, on
    /// every instruction set.
    #[test]
    fn keys_past_a_dense_store_read_its_last_row_when_not_checked() {
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
        for isa in Isa::available() {
            for dtype in [FloatDtype::F32, FloatDtype::F16, FloatDtype::BF16] {
                for dim in [16, 64, 100, 128] {
                    let k = Pooler::with_isa(isa, dtype, dim);
                    let rows = 7usize;
                    let stride = dim * dtype.size();
                    let store: Vec<u8> = (0..rows * stride).map(|_| (next() % 61) as u8).collect();
                    let keys: Vec<u64> = (0..60)
                        .map(|i| match i % 5 {
                            0 => rows as u64 + next() % 3,
                            1 => u64::MAX - next() % 2,
                            _ => next() % rows as u64,
                        })
                        .collect();
                    let clamped: Vec<u64> = keys.iter().map(|&q| q.min(rows as u64 - 1)).collect();
                    // SAFETY: the last row of store holds dim values of dtype.
                    let last: Vec<f32> = (0..dim)
                        .map(|c| unsafe { super::super::format::value(dtype.into(), store[(rows - 1) * stride..].as_ptr(), dim, c) })
                        .collect();
                    let starts = [0, 1, 20, 20, 45, 60];
                    let mut outs = Vec::new();
                    for ks in [&keys, &clamped] {
                        let mut out = vec![f32::NAN; 5 * dim];
                        // SAFETY: every clamped key names a row of store; a key past it reads the
                        // last row (pool_bags with missing false); out holds 5 rows of dim.
                        unsafe {
                            k.pool_bags(
                                RowsOf::Dense { base: store.as_ptr(), stride, rows, keys: ks },
                                false,
                                &starts,
                                0,
                                None,
                                &last,
                                Divide::Nothing,
                                out.as_mut_ptr() as *mut u8,
                                FloatDtype::F32,
                                dim,
                            )
                        };
                        outs.push(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                    }
                    assert_eq!(outs[0], outs[1], "{isa:?} {dtype:?} dim {dim}");
                }
            }
        }
    }

    /// Quantized rows (int8, int4) on every instruction set: whole bags from addresses and from
    /// a dense store, with and without weights and missing rows, and the dequantizing row copy
    /// into every out dtype, contiguous and strided, bit for bit the scalar reference
    /// (`format::value`, then the contract's float32 sum in key order).
    #[test]
    fn quantized_rows_match_the_reference() {
        use crate::kernels::format::{quantize_row, value};
        let mut next = xorshift(0x51AB_77D1_0C3E_9F25u64);
        for isa in Isa::available() {
            for format in [RowFormat::Int8, RowFormat::Int4, RowFormat::Fp8] {
                for dim in [2, 6, 8, 16, 18, 32, 34, 64, 100, 128, 256, 258, 512] {
                    let rb = format.row_bytes(dim);
                    let stride = rb + (next() % 3) as usize;
                    let table_rows = 30usize;
                    let mut store = vec![0u8; table_rows * stride + 1];
                    for r in 0..table_rows {
                        let row: Vec<f32> = (0..dim).map(|_| ((next() % 4001) as f32 - 2000.0) / 53.0).collect();
                        quantize_row(format, &row, &mut store[1 + r * stride..1 + r * stride + rb]).unwrap();
                    }
                    let base = store[1..].as_ptr();
                    let val = |r: usize, c: usize| {
                        // SAFETY: r < table_rows, c < dim: inside `store`.
                        unsafe { value(format, base.add(r * stride), dim, c) }
                    };
                    let starts = [0usize, 3, 3, 20, 21];
                    let n = 21;
                    let keys: Vec<u64> = (0..n).map(|_| if next().is_multiple_of(6) { 99 } else { next() % table_rows as u64 }).collect();
                    let ptrs: Vec<*const u8> = keys
                        .iter()
                        .map(|&k| if k < table_rows as u64 { base.wrapping_add(k as usize * stride) } else { std::ptr::null() })
                        .collect();
                    let w: Vec<f32> = (0..n).map(|_| ((next() % 1000) as f32 - 400.0) / 89.0).collect();
                    let default: Vec<f32> = (0..dim).map(|c| c as f32 * 0.5 - 7.0).collect();
                    let k = Pooler::with_isa(isa, format, dim);
                    for weighted in [false, true] {
                        for dense in [false, true] {
                            let mut out = vec![f32::NAN; 4 * dim];
                            let rows =
                                if dense { RowsOf::Dense { base, stride, rows: table_rows, keys: &keys } } else { RowsOf::Ptrs(&ptrs) };
                            let wv = weighted.then_some(&w[..]);
                            // SAFETY: every row named is inside `store`; out holds 4 rows.
                            unsafe {
                                k.pool_bags(
                                    rows,
                                    true,
                                    &starts,
                                    0,
                                    wv,
                                    &default,
                                    Divide::Nothing,
                                    out.as_mut_ptr() as *mut u8,
                                    FloatDtype::F32,
                                    dim,
                                )
                            };
                            for j in 0..4 {
                                for c in 0..dim {
                                    let mut acc = 0f32;
                                    for i in starts[j]..starts[j + 1] {
                                        let x = if keys[i] < table_rows as u64 { val(keys[i] as usize, c) } else { default[c] };
                                        acc += if weighted { w[i] * x } else { x };
                                    }
                                    assert_eq!(
                                        out[j * dim + c].to_bits(),
                                        acc.to_bits(),
                                        "{isa:?} {format:?} dim {dim} bag {j} col {c} weighted {weighted} dense {dense}"
                                    );
                                }
                            }
                        }
                    }
                    for out_dtype in [FloatDtype::F32, FloatDtype::F16, FloatDtype::BF16] {
                        let f = convert_fn(isa, format, out_dtype);
                        for cs in [1usize, 3] {
                            let osize = out_dtype.size();
                            let mut out = vec![0xA5u8; (dim * cs + 4) * osize];
                            // SAFETY: row 7 is inside `store`; out holds dim elements cs apart.
                            unsafe { f(base.add(7 * stride), out.as_mut_ptr(), dim, cs) };
                            for c in 0..dim {
                                let v = val(7, c);
                                let want = match out_dtype {
                                    FloatDtype::F32 => v.to_le_bytes().to_vec(),
                                    FloatDtype::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
                                    FloatDtype::BF16 => half::bf16::from_f32(v).to_le_bytes().to_vec(),
                                };
                                assert_eq!(
                                    &out[c * cs * osize..c * cs * osize + osize],
                                    &want[..],
                                    "{isa:?} {format:?} -> {out_dtype:?} dim {dim} cs {cs} col {c}"
                                );
                            }
                            assert!(out[((dim - 1) * cs + 1) * osize..].iter().all(|&b| b == 0xA5), "{isa:?}: written past the row");
                        }
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "pooling kernel arguments")]
    fn a_short_accumulator_is_refused() {
        let k = Pooler::new(FloatDtype::F32, 16);
        let mut acc = vec![0.0; 8];
        // SAFETY: no row is read: the call panics on its checks.
        unsafe { k.add(&mut acc, true, &[], 0, 0, None, &[0.0; 16]) };
    }
}
