//! Validated views of borrowed DLPack tensors.
//!
//! [`TensorView::new`] checks a caller's `DLTensor` once (through dlpark's structural
//! validation, then strata's own rules: non-negative strides, no address overflow,
//! element alignment) and keeps what the gather loops need. A view borrows the caller's
//! memory: it holds raw pointers and must not outlive the call it was made for.

use crate::error::{Error, Result};
use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLTensor};

/// Integer dtypes accepted for keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyDtype {
    I32,
    I64,
    U32,
    U64,
}

impl KeyDtype {
    /// The key dtype of `dt`, or an error naming `arg`.
    #[inline]
    pub fn of(dt: DLDataType, arg: &'static str) -> Result<Self> {
        let k = match (dt.code, dt.bits, dt.lanes) {
            (DLDataTypeCode::INT, 32, 1) => KeyDtype::I32,
            (DLDataTypeCode::INT, 64, 1) => KeyDtype::I64,
            (DLDataTypeCode::UINT, 32, 1) => KeyDtype::U32,
            (DLDataTypeCode::UINT, 64, 1) => KeyDtype::U64,
            _ => {
                return Err(Error::Dtype { arg, got: dtype_name(dt), expected: "int32, int64, uint32 or uint64" });
            }
        };
        Ok(k)
    }

    /// Whether values of this dtype are signed.
    pub fn signed(self) -> bool {
        matches!(self, KeyDtype::I32 | KeyDtype::I64)
    }

    /// Reads the key at `p` as its 64-bit two's-complement pattern (sign-extended for signed
    /// dtypes), the canonical form strata indexes by.
    ///
    /// # Safety
    /// `p` must be valid for reads of one element of this dtype and aligned for it.
    #[inline(always)]
    pub unsafe fn read(self, p: *const u8) -> u64 {
        // SAFETY: the caller guarantees one readable, aligned element of this dtype at p, and
        // each arm reads exactly the type the dtype names.
        unsafe {
            match self {
                KeyDtype::I32 => *(p as *const i32) as i64 as u64,
                KeyDtype::I64 => *(p as *const i64) as u64,
                KeyDtype::U32 => *(p as *const u32) as u64,
                KeyDtype::U64 => *(p as *const u64),
            }
        }
    }

    /// The canonical key of one little-endian element of this dtype in `bytes` (its size:
    /// 4 or 8 bytes), read at any alignment. `None` when `bytes` is not one element long.
    pub fn decode(self, bytes: &[u8]) -> Option<u64> {
        Some(match self {
            KeyDtype::I32 => i32::from_le_bytes(bytes.try_into().ok()?) as i64 as u64,
            KeyDtype::I64 => i64::from_le_bytes(bytes.try_into().ok()?) as u64,
            KeyDtype::U32 => u32::from_le_bytes(bytes.try_into().ok()?) as u64,
            KeyDtype::U64 => u64::from_le_bytes(bytes.try_into().ok()?),
        })
    }

    /// The value a canonical key stands for, for messages.
    pub fn value(self, canonical: u64) -> i128 {
        if self.signed() { canonical as i64 as i128 } else { canonical as i128 }
    }
}

/// Floating-point dtypes accepted for vectors and outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatDtype {
    F32,
    F16,
    BF16,
}

impl FloatDtype {
    /// The float dtype of `dt`, or an error naming `arg`.
    #[inline]
    pub fn of(dt: DLDataType, arg: &'static str) -> Result<Self> {
        match (dt.code, dt.bits, dt.lanes) {
            (DLDataTypeCode::FLOAT, 32, 1) => Ok(FloatDtype::F32),
            (DLDataTypeCode::FLOAT, 16, 1) => Ok(FloatDtype::F16),
            (DLDataTypeCode::BFLOAT, 16, 1) => Ok(FloatDtype::BF16),
            _ => Err(Error::Dtype { arg, got: dtype_name(dt), expected: "float32, float16 or bfloat16" }),
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            FloatDtype::F32 => 4,
            FloatDtype::F16 | FloatDtype::BF16 => 2,
        }
    }

    /// The DLPack dtype.
    pub fn dl(self) -> DLDataType {
        match self {
            FloatDtype::F32 => DLDataType { code: DLDataTypeCode::FLOAT, bits: 32, lanes: 1 },
            FloatDtype::F16 => DLDataType { code: DLDataTypeCode::FLOAT, bits: 16, lanes: 1 },
            FloatDtype::BF16 => DLDataType { code: DLDataTypeCode::BFLOAT, bits: 16, lanes: 1 },
        }
    }

    /// Reads the element at `p` as float32 (exactly: every float16 and bfloat16 value is one).
    ///
    /// # Safety
    /// `p` must be valid for reading one aligned element of this dtype.
    #[inline(always)]
    pub unsafe fn load_f32(self, p: *const u8) -> f32 {
        // SAFETY: the caller guarantees one readable, aligned element of this dtype at p.
        unsafe {
            match self {
                FloatDtype::F32 => *(p as *const f32),
                FloatDtype::F16 => (*(p as *const half::f16)).to_f32(),
                FloatDtype::BF16 => (*(p as *const half::bf16)).to_f32(),
            }
        }
    }
}

/// A human name for a DLPack dtype: `float32`, `int64`, `bfloat16`, `float32x4`,
/// `float8_e4m3fn`, or `code200:8x1` for a code this DLPack (1.3) does not define.
pub fn dtype_name(dt: DLDataType) -> String {
    // The fp8/fp6/fp4 codes of DLPack 1.1+ name their width; other widths or lanes are spelled out.
    let small_float = match dt.code {
        DLDataTypeCode::FLOAT8_E3M4 => Some(("float8_e3m4", 8)),
        DLDataTypeCode::FLOAT8_E4M3 => Some(("float8_e4m3", 8)),
        DLDataTypeCode::FLOAT8_E4M3B11FNUZ => Some(("float8_e4m3b11fnuz", 8)),
        DLDataTypeCode::FLOAT8_E4M3FN => Some(("float8_e4m3fn", 8)),
        DLDataTypeCode::FLOAT8_E4M3FNUZ => Some(("float8_e4m3fnuz", 8)),
        DLDataTypeCode::FLOAT8_E5M2 => Some(("float8_e5m2", 8)),
        DLDataTypeCode::FLOAT8_E5M2FNUZ => Some(("float8_e5m2fnuz", 8)),
        DLDataTypeCode::FLOAT8_E8M0FNU => Some(("float8_e8m0fnu", 8)),
        DLDataTypeCode::FLOAT6_E2M3FN => Some(("float6_e2m3fn", 6)),
        DLDataTypeCode::FLOAT6_E3M2FN => Some(("float6_e3m2fn", 6)),
        DLDataTypeCode::FLOAT4_E2M1FN => Some(("float4_e2m1fn", 4)),
        _ => None,
    };
    if let Some((name, bits)) = small_float {
        return if dt.bits == bits && dt.lanes == 1 { name.into() } else { format!("{name}:{}x{}", dt.bits, dt.lanes) };
    }
    let base = match dt.code {
        DLDataTypeCode::INT => "int",
        DLDataTypeCode::UINT => "uint",
        DLDataTypeCode::FLOAT => "float",
        DLDataTypeCode::BFLOAT => "bfloat",
        DLDataTypeCode::COMPLEX => "complex",
        DLDataTypeCode::BOOL => "bool",
        DLDataTypeCode::OPAQUEHANDLE => "opaque",
        c => return format!("code{}:{}x{}", c.0, dt.bits, dt.lanes),
    };
    if dt.lanes == 1 { format!("{base}{}", dt.bits) } else { format!("{base}{}x{}", dt.bits, dt.lanes) }
}

/// A human name for a DLPack device.
pub fn device_name(d: DLDevice) -> String {
    let name = match d.device_type {
        DLDeviceType::CPU => "kDLCPU",
        DLDeviceType::CUDA => "kDLCUDA",
        DLDeviceType::CUDAHOST => "kDLCUDAHost",
        DLDeviceType::CUDAMANAGED => "kDLCUDAManaged",
        DLDeviceType::OPENCL => "kDLOpenCL",
        DLDeviceType::VULKAN => "kDLVulkan",
        DLDeviceType::METAL => "kDLMetal",
        DLDeviceType::ROCM => "kDLROCM",
        DLDeviceType::ROCMHOST => "kDLROCMHost",
        DLDeviceType::ONEAPI => "kDLOneAPI",
        DLDeviceType::VPI => "kDLVPI",
        DLDeviceType::EXTDEV => "kDLExtDev",
        DLDeviceType::WEBGPU => "kDLWebGPU",
        DLDeviceType::HEXAGON => "kDLHexagon",
        DLDeviceType::MAIA => "kDLMAIA",
        DLDeviceType::TRN => "kDLTrn",
        _ => return format!("device_type {}:{}", d.device_type.0, d.device_id),
    };
    format!("{name}:{}", d.device_id)
}

#[cfg(feature = "cuda")]
use crate::util::cuda::unsupported_reason;
#[cfg(not(feature = "cuda"))]
fn unsupported_reason() -> &'static str {
    "it was built without CUDA support (cargo feature `cuda`)"
}

/// Fails unless `d` is memory the CPU path can read and write directly.
#[inline]
pub fn require_host(d: DLDevice, arg: &'static str) -> Result<()> {
    match d.device_type {
        DLDeviceType::CPU | DLDeviceType::CUDAHOST => Ok(()),
        _ => Err(not_host(d, arg)),
    }
}

#[cold]
fn not_host(d: DLDevice, arg: &'static str) -> Error {
    Error::Device {
        arg,
        msg: format!(
            "device {}; this build of strata serves host memory only (kDLCPU, kDLCUDAHost): {}",
            device_name(d),
            unsupported_reason()
        ),
    }
}

/// How many values a [`Dims`] holds without allocating by default: the rank of nearly every
/// tensor a lookup sees (keys up to 3-D, their rows 4-D).
const INLINE_DIMS: usize = 4;

/// A short list of sizes, strides or (size, stride) pairs: up to `N` values inline, more on the
/// heap, so validating and planning a lookup of ordinary rank allocates nothing. Reads as a
/// slice (and prints as one, `[2, 3]`).
#[derive(Clone)]
pub enum Dims<T: Copy + Default, const N: usize = INLINE_DIMS> {
    /// The first `len` values of the array.
    Inline(u8, [T; N]),
    /// More than `N` values.
    Heap(Vec<T>),
}

impl<T: Copy + Default, const N: usize> Dims<T, N> {
    /// An empty list.
    #[inline]
    pub fn new() -> Self {
        Dims::Inline(0, [T::default(); N])
    }

    /// An empty list with room for `n` values (allocated only beyond `N`).
    #[inline]
    pub fn with_capacity(n: usize) -> Self {
        if n > N { Dims::Heap(Vec::with_capacity(n)) } else { Self::new() }
    }

    /// The list `f(0), .., f(n - 1)`.
    #[inline]
    pub fn from_fn(n: usize, mut f: impl FnMut(usize) -> T) -> Self {
        if n <= N {
            let mut a = [T::default(); N];
            for (i, x) in a[..n].iter_mut().enumerate() {
                *x = f(i);
            }
            Dims::Inline(n as u8, a)
        } else {
            Dims::Heap((0..n).map(f).collect())
        }
    }

    /// Appends `v`.
    #[inline]
    pub fn push(&mut self, v: T) {
        match self {
            Dims::Inline(len, a) if (*len as usize) < N => {
                a[*len as usize] = v;
                *len += 1;
            }
            Dims::Inline(_, a) => {
                let mut h = Vec::with_capacity(2 * N);
                h.extend_from_slice(a);
                h.push(v);
                *self = Dims::Heap(h);
            }
            Dims::Heap(h) => h.push(v),
        }
    }
}

impl<T: Copy + Default, const N: usize> Default for Dims<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Copy + Default, const N: usize> std::ops::Deref for Dims<T, N> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        match self {
            Dims::Inline(len, a) => &a[..*len as usize],
            Dims::Heap(h) => h,
        }
    }
}

impl<T: Copy + Default, const N: usize> std::ops::DerefMut for Dims<T, N> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Dims::Inline(len, a) => &mut a[..*len as usize],
            Dims::Heap(h) => h,
        }
    }
}

impl<T: Copy + Default, const N: usize> FromIterator<T> for Dims<T, N> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let iter = iter.into_iter();
        if iter.size_hint().0 > N {
            // Vec's collect sizes once and copies in a plain loop (offsets of a batch's bags).
            return Dims::Heap(iter.collect());
        }
        let mut d = Dims::new();
        for v in iter {
            d.push(v);
        }
        d
    }
}

impl<T: Copy + Default + std::fmt::Debug, const N: usize> std::fmt::Debug for Dims<T, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

impl<T: Copy + Default + PartialEq, const N: usize> PartialEq for Dims<T, N> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Copy + Default + PartialEq, const N: usize, const M: usize> PartialEq<[T; M]> for Dims<T, N> {
    fn eq(&self, other: &[T; M]) -> bool {
        **self == other[..]
    }
}

impl<T: Copy + Default + PartialEq, const N: usize> PartialEq<Vec<T>> for Dims<T, N> {
    fn eq(&self, other: &Vec<T>) -> bool {
        **self == other[..]
    }
}

/// A caller's DLPack tensor whose memory its maker vouched for: valid as DLPack requires
/// (readable, and writable where it is an output, for every element its shape and strides
/// reach) for `'a`, and for a CUDA tensor until the stream of the call it is given to has run
/// it. Made once, at the C boundary, by [`Vouched::new`] (the one unsafe step); the core's
/// functions that take one (`Table::upsert`, `erase`, `lookup`) are safe.
#[derive(Debug, Clone, Copy)]
pub struct Vouched<'a> {
    tensor: &'a DLTensor,
}

impl<'a> Vouched<'a> {
    /// Vouches for `tensor`.
    ///
    /// # Safety
    /// Its memory is valid as the type's docs say, for `'a`.
    pub unsafe fn new(tensor: &'a DLTensor) -> Self {
        Vouched { tensor }
    }

    /// The tensor.
    pub fn get(self) -> &'a DLTensor {
        self.tensor
    }
}

/// A structurally validated, borrowed tensor: shape, element strides (possibly negative), and
/// the byte-offset-adjusted base pointer, checked so that every element address is computed
/// without overflow and is aligned for the dtype.
#[derive(Debug, Clone)]
pub struct TensorView {
    /// The argument name used in messages.
    pub arg: &'static str,
    /// Address of element `[0, ..., 0]` (data + byte_offset). Dangling for empty tensors.
    pub ptr: *mut u8,
    pub dtype: DLDataType,
    pub device: DLDevice,
    pub shape: Dims<usize>,
    /// Strides in elements (DLPack convention).
    pub strides: Dims<isize>,
    pub numel: usize,
    /// Bytes per element.
    pub elem: usize,
    /// The bytes `[start, end)` the elements occupy; empty for empty tensors.
    range: (usize, usize),
}

impl TensorView {
    /// Validates `t`, naming `arg` in every error. Negative strides are accepted here;
    /// outputs refuse them with [`TensorView::require_non_negative_strides`].
    ///
    /// # Safety
    /// `t.shape` and `t.strides` must be readable for `t.ndim` elements (or NULL).
    #[inline]
    pub unsafe fn new(t: &DLTensor, arg: &'static str) -> Result<Self> {
        // SAFETY: the caller guarantees t.shape and t.strides are readable for t.ndim elements;
        // `r` lives only in this function, while `t` is borrowed and not modified.
        let r = unsafe { dlpark::TensorRef::from_raw(t) }.map_err(|e| dlpark_error(e, arg))?;
        let elem_bits = t.dtype.bits as usize * t.dtype.lanes as usize;
        if !elem_bits.is_multiple_of(8) {
            return Err(partial_byte(t.dtype, arg));
        }
        let elem = elem_bits / 8;
        let dims = r.shape();
        // dlpark checked every size non-negative and their product.
        let shape: Dims<usize> = Dims::from_fn(dims.len(), |d| dims[d] as usize);
        let strides: Dims<isize> = match r.strides() {
            None => {
                let mut s: Dims<isize> = Dims::from_fn(dims.len(), |_| 0);
                let mut acc = 1isize;
                for d in (0..shape.len()).rev() {
                    s[d] = acc;
                    acc = acc.saturating_mul(shape[d].max(1) as isize);
                }
                s
            }
            // isize is i64 on the 64-bit targets strata builds for.
            Some(st) => Dims::from_fn(st.len(), |d| st[d] as isize),
        };
        let numel = r.num_elements();
        let (ptr, range) = if numel == 0 {
            (std::ptr::NonNull::<u8>::dangling().as_ptr(), (0, 0))
        } else {
            if t.data.is_null() {
                return Err(null_data(numel, arg));
            }
            // Offsets of the lowest and highest element, in elements, exactly (i128 cannot
            // overflow for 64-bit sizes and strides summed over fewer than 2^60 dimensions).
            let (mut lo, mut hi) = (0i128, 0i128);
            for (&n, &s) in shape.iter().zip(strides.iter()) {
                let step = (n as i128 - 1) * s as i128;
                if step < 0 { lo += step } else { hi += step }
            }
            let base = t.data as usize as i128 + t.byte_offset as i128;
            let start = base + lo * elem as i128;
            let end = base + (hi + 1) * elem as i128;
            if start < 0 || end > usize::MAX as i128 || end - start > isize::MAX as i128 {
                return Err(beyond_address_space(&shape, &strides, t.byte_offset, arg));
            }
            let align = elem.clamp(1, 8);
            if elem.is_power_of_two() && base % align as i128 != 0 {
                return Err(misaligned(base, align, t.dtype, arg));
            }
            ((t.data as *mut u8).wrapping_add(t.byte_offset as usize), (start as usize, end as usize))
        };
        Ok(TensorView { arg, ptr, dtype: t.dtype, device: t.device, shape, strides, numel, elem, range })
    }

    /// Fails unless every stride is non-negative (outputs, adopted vectors).
    #[inline]
    pub fn require_non_negative_strides(&self) -> Result<()> {
        match self.strides.iter().position(|&s| s < 0) {
            None => Ok(()),
            Some(d) => {
                Err(Error::layout(self.arg, format!("strides[{d}] = {} is negative; expected non-negative strides", self.strides[d])))
            }
        }
    }

    /// The byte range `[start, end)` this view can touch (empty for empty tensors).
    pub fn byte_range(&self) -> (usize, usize) {
        self.range
    }

    /// Address of the element at element offset `off` from element `[0, ..., 0]`.
    #[inline(always)]
    pub fn at(&self, off: isize) -> *mut u8 {
        self.ptr.wrapping_offset(off * self.elem as isize)
    }

    /// Whether the elements of this view occupy distinct addresses, by the usual sufficient
    /// rule: sorted by |stride|, each stride steps past everything the smaller ones reach.
    /// (Some exotic interleavings with distinct elements are refused too.)
    #[inline]
    pub fn is_non_overlapping(&self) -> bool {
        if self.numel == 0 {
            return true;
        }
        // The common cases, one or two dimensions of more than one element (rows of an `out`),
        // by the same rule without collecting and sorting.
        let mut few = [(0usize, 0usize); 2];
        let mut count = 0;
        for (&n, &s) in self.shape.iter().zip(self.strides.iter()) {
            if n > 1 {
                if count < 2 {
                    few[count] = (n, s.unsigned_abs());
                }
                count += 1;
            }
        }
        match count {
            0 => return true,
            1 => return few[0].1 > 0,
            2 => {
                let [(n, s), (_, t)] = if few[0].1 <= few[1].1 { few } else { [few[1], few[0]] };
                return s > 0 && t > (n - 1) * s;
            }
            _ => {}
        }
        non_overlapping_sorted(&self.shape, &self.strides)
    }
}

/// [`TensorView::is_non_overlapping`]'s rule in general: the dimensions of more than one element
/// sorted by |stride|, each stride stepping past everything the smaller ones reach.
fn non_overlapping_sorted(shape: &[usize], strides: &[isize]) -> bool {
    let mut dims: Dims<(usize, usize)> =
        shape.iter().zip(strides.iter()).filter(|(n, _)| **n > 1).map(|(&n, &s)| (n, s.unsigned_abs())).collect();
    dims.sort_unstable_by_key(|&(_, s)| s);
    let mut reach = 0usize; // largest element offset reached by the dims so far
    for &(n, s) in dims.iter() {
        if s <= reach {
            return false;
        }
        reach += (n - 1) * s;
    }
    true
}

#[cold]
fn partial_byte(dtype: DLDataType, arg: &'static str) -> Error {
    Error::Dtype { arg, got: dtype_name(dtype), expected: "a whole-byte dtype" }
}

#[cold]
fn null_data(numel: usize, arg: &'static str) -> Error {
    Error::layout(arg, format!("data is NULL but the tensor has {numel} elements"))
}

#[cold]
fn beyond_address_space(shape: &[usize], strides: &[isize], byte_offset: u64, arg: &'static str) -> Error {
    Error::layout(arg, format!("shape {shape:?} with strides {strides:?} and byte_offset {byte_offset} reaches beyond the address space"))
}

#[cold]
fn misaligned(base: i128, align: usize, dtype: DLDataType, arg: &'static str) -> Error {
    Error::layout(
        arg,
        format!("data + byte_offset = {base:#x} is not aligned to {align} bytes ({}); expected aligned elements", dtype_name(dtype)),
    )
}

#[cold]
fn dlpark_error(e: dlpark::tensor::Error, arg: &'static str) -> Error {
    use dlpark::tensor::Error as E;
    match e {
        E::NullShapePtr { ndim } => Error::Null { arg: null_shape_arg(arg, ndim) },
        E::NegativeNdim { ndim } => Error::invalid(arg, format!("ndim = {ndim}; expected ndim >= 0")),
        E::NegativeDimension { axis, value } => Error::invalid(arg, format!("shape[{axis}] = {value}; expected non-negative sizes")),
        E::ZeroDtypeBits | E::ZeroDtypeLanes => {
            Error::Dtype { arg, got: "with zero bits or lanes".into(), expected: "a dtype with bits > 0 and lanes > 0" }
        }
        E::NumElementsOverflow | E::NumBytesOverflow => Error::layout(arg, "the number of elements or bytes overflows the address space"),
        other => Error::invalid(arg, other.to_string()),
    }
}

fn null_shape_arg(arg: &'static str, _ndim: i32) -> &'static str {
    match arg {
        "keys" => "keys->shape",
        "out" => "out->shape",
        "vectors" => "vectors->shape",
        _ => "shape",
    }
}

/// Maps flat (row-major logical) indices of a shape to element offsets under its strides.
///
/// Dimensions of size 1 are dropped and dimensions that are contiguous with each other are
/// merged, so the common cases (contiguous, or one strided axis) need no index arithmetic.
#[derive(Debug, Clone)]
pub struct Walk {
    /// (size, stride) pairs, outermost first, after merging.
    dims: Dims<(usize, isize), 2>,
}

impl Walk {
    /// A walk over `shape` with element `strides`.
    #[inline]
    pub fn new(shape: &[usize], strides: &[isize]) -> Self {
        let mut dims: Dims<(usize, isize), 2> = Dims::new();
        for (&n, &s) in shape.iter().zip(strides) {
            if n == 1 {
                continue;
            }
            // Checked: an empty tensor may carry any strides and sizes whose products overflow;
            // such dimensions are simply not merged (its walk never yields an offset).
            if let Some(last) = dims.last_mut()
                && let (Some(outer), Some(size)) = (s.checked_mul(n as isize), last.0.checked_mul(n))
                && last.1 == outer
            {
                *last = (size, s);
                continue;
            }
            dims.push((n, s));
        }
        Walk { dims }
    }

    /// The uniform stride when the walk is one-dimensional (or trivial).
    #[inline]
    pub fn linear_stride(&self) -> Option<isize> {
        match &self.dims[..] {
            [] => Some(0),
            [(_, s)] => Some(*s),
            _ => None,
        }
    }

    /// Writes the element offsets of flat indices `start .. start + out.len()` into `out`.
    #[inline]
    pub fn fill(&self, start: usize, out: &mut [isize]) {
        if out.is_empty() {
            return; // nothing to place (and a shape with a 0 dimension has no index to start at)
        }
        if let Some(s) = self.linear_stride() {
            for (i, o) in out.iter_mut().enumerate() {
                *o = (start + i) as isize * s;
            }
            return;
        }
        let nd = self.dims.len();
        let mut small = [0usize; 16];
        let mut heap;
        let idx: &mut [usize] = if nd <= 16 {
            &mut small[..nd]
        } else {
            heap = vec![0usize; nd];
            &mut heap
        };
        let mut rem = start;
        let mut off = 0isize;
        for d in (0..nd).rev() {
            let (n, s) = self.dims[d];
            idx[d] = rem % n;
            rem /= n;
            off += idx[d] as isize * s;
        }
        let (inner_n, inner_s) = self.dims[nd - 1];
        for o in out.iter_mut() {
            *o = off;
            idx[nd - 1] += 1;
            off += inner_s;
            if idx[nd - 1] == inner_n {
                // carry into the outer dimensions
                let mut d = nd - 1;
                loop {
                    off -= idx[d] as isize * self.dims[d].1;
                    idx[d] = 0;
                    if d == 0 {
                        break;
                    }
                    d -= 1;
                    idx[d] += 1;
                    off += self.dims[d].1;
                    if idx[d] < self.dims[d].0 {
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_reads_any_alignment_as_read_does() {
        // Elements at every offset of a byte buffer, decoded, equal the aligned read.
        let vals: [i64; 3] = [-5, 1 << 40, -(1 << 33)];
        for dtype in [KeyDtype::I32, KeyDtype::I64, KeyDtype::U32, KeyDtype::U64] {
            let elem = if matches!(dtype, KeyDtype::I32 | KeyDtype::U32) { 4 } else { 8 };
            for v in vals {
                let aligned: u64 = v as u64;
                let bytes = &aligned.to_le_bytes()[..elem];
                // SAFETY: `aligned` is an 8-byte aligned u64 holding the element little-endian.
                let want = unsafe { dtype.read((&aligned as *const u64).cast()) };
                for at in 0..8 {
                    let mut buf = [0u8; 16];
                    buf[at..at + elem].copy_from_slice(bytes);
                    assert_eq!(dtype.decode(&buf[at..at + elem]), Some(want), "{dtype:?} {v} at {at}");
                }
            }
            assert_eq!(dtype.decode(&[0u8; 3]), None);
        }
    }

    fn reference_offsets(shape: &[usize], strides: &[isize]) -> Vec<isize> {
        let n: usize = shape.iter().product();
        (0..n)
            .map(|mut i| {
                let mut off = 0;
                for d in (0..shape.len()).rev() {
                    off += (i % shape[d]) as isize * strides[d];
                    i /= shape[d];
                }
                off
            })
            .collect()
    }

    #[test]
    fn walk_of_an_empty_tensor_with_overflowing_strides_does_not_panic() {
        // Found by tests/fuzz.rs: out of shape [0, 2, 1] with strides [2, isize::MIN, 1].
        for (shape, strides) in [
            (&[0usize, 2, 1][..], &[2isize, isize::MIN, 1][..]),
            (&[2, 0], &[isize::MIN, isize::MAX]),
            (&[0, usize::MAX / 2, 4], &[1, 4, 1]),
        ] {
            // (No offsets are asked of an empty tensor's walk: callers stop at zero elements.)
            let _ = Walk::new(shape, strides).linear_stride();
        }
    }

    #[test]
    fn walk_matches_reference_for_every_start() {
        let cases: &[(&[usize], &[isize])] = &[
            (&[5], &[-1]),
            (&[3, 4], &[-4, 1]),
            (&[3, 4], &[4, -1]),
            (&[2, 3, 2], &[-1, 2, -6]),
            (&[5], &[1]),
            (&[5], &[3]),
            (&[2, 3], &[3, 1]),
            (&[2, 3], &[1, 2]),
            (&[3, 1, 4], &[10, 99, 2]),
            (&[2, 2, 2, 3], &[50, 20, 7, 2]),
            (&[4, 3], &[0, 1]),
            (&[1, 1], &[5, 5]),
        ];
        for (shape, strides) in cases {
            let want = reference_offsets(shape, strides);
            let w = Walk::new(shape, strides);
            for start in 0..want.len() {
                for len in 0..=(want.len() - start) {
                    let mut got = vec![isize::MAX; len];
                    w.fill(start, &mut got);
                    assert_eq!(got, want[start..start + len], "shape {shape:?} strides {strides:?} start {start}");
                }
            }
        }
    }

    #[test]
    fn the_overlap_rule_of_one_or_two_dimensions_is_the_general_one() {
        // Every shape of rank 1 to 3 with sizes 0..4 and strides -7..7: the fast path for one or
        // two dimensions of more than one element answers as the sorted rule does.
        let mut views = 0;
        for rank in 1..=3usize {
            let cases = 4usize.pow(rank as u32) * 15usize.pow(rank as u32);
            for mut c in 0..cases {
                let mut shape: Vec<usize> = Vec::new();
                let mut strides: Vec<isize> = Vec::new();
                for _ in 0..rank {
                    shape.push(c % 4);
                    c /= 4;
                    strides.push((c % 15) as isize - 7);
                    c /= 15;
                }
                let numel: usize = shape.iter().product();
                let mut shape64: Vec<i64> = shape.iter().map(|&n| n as i64).collect();
                let mut strides64: Vec<i64> = strides.iter().map(|&s| s as i64).collect();
                let t = DLTensor {
                    data: 64 as *mut std::ffi::c_void,
                    device: DLDevice { device_type: DLDeviceType::CPU, device_id: 0 },
                    ndim: rank as i32,
                    dtype: FloatDtype::F32.dl(),
                    shape: shape64.as_mut_ptr(),
                    strides: strides64.as_mut_ptr(),
                    byte_offset: 4096,
                };
                // SAFETY: shape and strides point to rank live values; no element is read.
                let v = unsafe { TensorView::new(&t, "out") }.unwrap();
                let want = numel == 0 || non_overlapping_sorted(&shape, &strides);
                assert_eq!(v.is_non_overlapping(), want, "shape {shape:?} strides {strides:?}");
                views += 1;
            }
        }
        assert!(views > 50_000);
    }

    #[test]
    fn dims_hold_any_rank_inline_or_not() {
        for len in 0..10usize {
            let d: Dims<usize> = (0..len).collect();
            let want: Vec<usize> = (0..len).collect();
            assert_eq!(&d[..], &want[..]);
            assert!(d == want);
            assert_eq!(format!("{d:?}"), format!("{want:?}"));
            let mut e = d.clone();
            e.push(99);
            assert_eq!(e.len(), len + 1);
            assert_eq!(e[len], 99);
            assert!(e != d);
        }
        let mut d: Dims<isize> = [3, 1, 2].into_iter().collect();
        d.sort_unstable();
        assert!(d == [1, 2, 3]);
    }

    #[test]
    fn dtype_names() {
        assert_eq!(dtype_name(FloatDtype::BF16.dl()), "bfloat16");
        assert_eq!(dtype_name(DLDataType { code: DLDataTypeCode::FLOAT, bits: 32, lanes: 4 }), "float32x4");
        // SAFETY: the pointer is to a live, aligned i32 (a promoted constant), the dtype read() is told.
        assert_eq!(KeyDtype::I32.value(unsafe { KeyDtype::I32.read((&-5i32 as *const i32).cast()) }), -5);
        assert_eq!(dtype_name(DLDataType { code: DLDataTypeCode::FLOAT8_E4M3FN, bits: 8, lanes: 1 }), "float8_e4m3fn");
        let padded = DLDataType { code: DLDataTypeCode::FLOAT4_E2M1FN, bits: 8, lanes: 2 };
        assert_eq!(dtype_name(padded), "float4_e2m1fn:8x2");
        assert_eq!(dtype_name(DLDataType { code: DLDataTypeCode(200), bits: 8, lanes: 1 }), "code200:8x1");
    }

    /// Every code DLPack 1.3 defines, and codes it does not, is refused with a message naming
    /// the argument and the dtype; none panics.
    #[test]
    fn codes_beyond_the_accepted_dtypes_are_refused_by_name() {
        for code in (7..=17).chain([18, 99, 255]) {
            for bits in [4, 6, 8, 16, 32, 64] {
                let dt = DLDataType { code: DLDataTypeCode(code), bits, lanes: 1 };
                let k = KeyDtype::of(dt, "keys").unwrap_err().to_string();
                assert!(k.starts_with("keys: dtype ") && k.ends_with("expected int32, int64, uint32 or uint64"), "{k}");
                let f = FloatDtype::of(dt, "out").unwrap_err().to_string();
                assert!(f.starts_with("out: dtype ") && f.contains(&dtype_name(dt)), "{f}");
            }
        }
    }

    #[test]
    fn device_names_cover_dlpack_1_3() {
        assert_eq!(device_name(DLDevice { device_type: DLDeviceType::TRN, device_id: 1 }), "kDLTrn:1");
        assert_eq!(device_name(DLDevice { device_type: DLDeviceType(99), device_id: 0 }), "device_type 99:0");
        let trn = DLDevice { device_type: DLDeviceType::TRN, device_id: 0 };
        let e = require_host(trn, "keys").unwrap_err().to_string();
        assert!(e.starts_with("keys: device kDLTrn:0; "), "{e}");
    }
}
